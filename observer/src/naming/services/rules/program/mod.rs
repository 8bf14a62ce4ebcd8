//! One table's rules as the kernel runs them, whichever tool wrote them: chains of rules
//! made of matches and statements over byte values, as nf_tables holds them in its
//! registers (addresses and ports big-endian, marks and numgen numbers host-endian, each
//! part of a concatenation padded to 4 bytes). `nft -j` JSON, nf_tables' netlink
//! announcements and `iptables-save` text are all decoded into this, and
//! [`eval`] follows it from the hooks down, so a layout kube-proxy has not written yet
//! needs no new parser, only, at most, a new expression.

pub mod eval;
pub mod frontends;
pub mod ports;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// A value as nf_tables holds it in registers.
pub type Bytes = Vec<u8>;

/// A field of the packet the rules test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    Saddr,
    Daddr,
    /// `meta l4proto`, `ip protocol`, `ip6 nexthdr`, iptables `-p`.
    L4Proto,
    Sport,
    Dport,
}

/// Something a rule reads or computes: a value of some bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Field(Field),
    /// `ct mark`: 0 on a connection's first packet unless a rule set it.
    CtMark,
    /// `ct state` (bit 8: new, the first packet's state).
    CtState,
    /// `meta mark`: 0 on arrival; marks set for masquerading matter only after DNAT.
    Mark,
    /// `fib saddr|daddr type` (`local` is 2, RTN_LOCAL).
    FibType {
        source: bool,
    },
    /// `numgen random|inc mod N offset O`: N numbers equally often, over connections.
    Numgen {
        modulus: u32,
        offset: u32,
    },
    Const(Bytes),
    /// Each part padded to 4 bytes.
    Concat(Vec<Expr>),
    /// The data a map holds for `key` (a lookup that misses ends the rule).
    Lookup {
        key: Box<Expr>,
        map: SetRef,
    },
    /// Bytes `offset..offset + len` of a value (a register slice: a DNAT's address and
    /// port from one map lookup).
    Slice {
        of: Box<Expr>,
        offset: usize,
        len: usize,
    },
    /// `(value & mask) ^ xor`.
    Bitwise {
        of: Box<Expr>,
        mask: Bytes,
        xor: Bytes,
    },
    /// A value observer does not model (`iifname`, `meta skuid`, ...), by its text.
    Opaque(String),
}

impl Expr {
    /// How many bytes the value takes in a register (without padding).
    pub fn width(&self, family: Family) -> Option<usize> {
        Some(match self {
            Expr::Field(Field::Saddr | Field::Daddr) => family.addr_len(),
            Expr::Field(Field::L4Proto) => 1,
            Expr::Field(Field::Sport | Field::Dport) => 2,
            Expr::CtMark | Expr::CtState | Expr::Mark | Expr::FibType { .. } => 4,
            Expr::Numgen { .. } => 4,
            Expr::Const(bytes) => bytes.len(),
            Expr::Concat(parts) => parts
                .iter()
                .map(|p| p.width(family).map(padded))
                .sum::<Option<usize>>()?,
            Expr::Slice { len, .. } => *len,
            Expr::Bitwise { mask, .. } => mask.len(),
            Expr::Lookup { .. } | Expr::Opaque(_) => return None,
        })
    }
}

/// A length rounded up to whole 4-byte registers.
pub fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// Address family of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn addr_len(self) -> usize {
        match self {
            Family::V4 => 4,
            Family::V6 => 16,
        }
    }

    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// A set or map, by name (resolved when the rules run) or written into the rule.
#[derive(Clone, Debug, PartialEq)]
pub enum SetRef {
    Named(String),
    Inline(Arc<Set>),
}

/// A set or map's elements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Set {
    elements: Vec<Element>,
    /// Exact keys, for lookups without a walk; ranges are walked.
    exact: HashMap<Bytes, usize>,
    ranges: Vec<usize>,
    /// Filled by the packets themselves (`update @set`, `flags dynamic`): kube-proxy's
    /// session affinity. Empty for a connection's first packet from a new client.
    pub dynamic: bool,
    /// How long an element stays (seconds): the affinity timeout.
    pub timeout: Option<u64>,
    pub comment: Option<String>,
}

/// One element: a key (or an inclusive range of keys) and, in a map, its data.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    pub key: Bytes,
    /// The last key of a range (`{"range": ...}`, a prefix, an interval set).
    pub key_end: Option<Bytes>,
    pub data: Option<Data>,
    pub comment: Option<String>,
}

/// What a map element holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    Value(Bytes),
    Verdict(Verdict),
}

impl Set {
    pub fn new(elements: Vec<Element>) -> Set {
        let mut set = Set::default();
        for element in elements {
            set.push(element);
        }
        set
    }

    pub fn push(&mut self, element: Element) {
        let index = self.elements.len();
        match &element.key_end {
            None => {
                self.exact.insert(element.key.clone(), index);
            }
            Some(_) => self.ranges.push(index),
        }
        self.elements.push(element);
    }

    pub fn elements(&self) -> &[Element] {
        &self.elements
    }

    /// The element `key` falls in, as the kernel's lookup finds it.
    pub fn find(&self, key: &[u8]) -> Option<&Element> {
        if let Some(index) = self.exact.get(key) {
            return Some(&self.elements[*index]);
        }
        self.ranges.iter().map(|i| &self.elements[*i]).find(|e| {
            let end = e.key_end.as_deref().unwrap_or(&e.key);
            e.key.len() == key.len() && e.key.as_slice() <= key && key <= end
        })
    }
}

/// How a rule's comparison compares (bytes as big-endian numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

/// A match: the rule goes on only if it holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Cond {
    Cmp {
        left: Expr,
        op: CmpOp,
        right: Bytes,
    },
    /// An inclusive range.
    Range {
        left: Expr,
        low: Bytes,
        high: Bytes,
        negated: bool,
    },
    InSet {
        left: Expr,
        set: SetRef,
        negated: bool,
    },
    /// iptables `-m statistic --mode random --probability P`.
    Probability(f64),
    /// iptables `-m recent --rcheck`: the client was seen within `seconds` (ClientIP
    /// session affinity); never for a new client.
    Recent {
        seconds: Option<u64>,
    },
    /// A match observer cannot follow, by its text.
    Opaque(String),
}

/// Where a rule sends the packet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Reject,
    Return,
    Continue,
    Jump(String),
    Goto(String),
}

/// One part of a rule, run in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    Match(Cond),
    SetCtMark(Expr),
    /// DNAT to `addr` (and `port`, when given): the connection's pick, and the end of
    /// the NAT hook for it.
    Dnat {
        addr: Expr,
        port: Option<Expr>,
    },
    /// Changes nothing a DNAT decision depends on: counters, logs, `meta mark` for
    /// masquerading, `update @set` and `-m recent --set` (affinity bookkeeping), SNAT
    /// marks.
    Inert,
    Verdict(Verdict),
    /// A verdict map: the verdict of the element the key finds; none found: go on.
    Vmap {
        key: Expr,
        map: SetRef,
    },
    /// A statement observer cannot follow (its effect on the packet is unknown), by its
    /// text.
    Opaque(String),
}

/// One rule: its statements in order, and what names it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rule {
    pub stmts: Vec<Stmt>,
    pub comment: Option<String>,
    /// The kernel's handle (nftables), by which an announcement removes the rule.
    pub handle: Option<u64>,
    /// Where the rule was read: `iptables-save line 12`, `nftables[40]`.
    pub origin: String,
}

/// Which netfilter hook a base chain is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

/// Whether a base chain does NAT or filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainType {
    Nat,
    Filter,
}

/// A base chain's attachment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Base {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chain {
    pub rules: Vec<Rule>,
    /// `None` for a regular chain, reached only by jumps.
    pub base: Option<Base>,
}

/// One table's (or, for iptables, one tool's tables') rules and sets.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub family: Family,
    pub chains: BTreeMap<String, Chain>,
    pub sets: HashMap<String, Arc<Set>>,
}

impl Program {
    pub fn new(family: Family) -> Program {
        Program {
            family,
            chains: BTreeMap::new(),
            sets: HashMap::new(),
        }
    }

    pub fn set<'a>(&'a self, set: &'a SetRef) -> Option<&'a Set> {
        match set {
            SetRef::Named(name) => self.sets.get(name).map(Arc::as_ref),
            SetRef::Inline(set) => Some(set),
        }
    }

    /// The chains each chain's rules and verdict maps lead to.
    pub fn targets(&self, chain: &Chain) -> Vec<String> {
        let mut out = Vec::new();
        for rule in &chain.rules {
            for stmt in &rule.stmts {
                match stmt {
                    Stmt::Verdict(Verdict::Jump(to) | Verdict::Goto(to)) => out.push(to.clone()),
                    Stmt::Vmap { map, .. } => {
                        if let Some(set) = self.set(map) {
                            out.extend(set.elements().iter().filter_map(|e| match &e.data {
                                Some(Data::Verdict(Verdict::Jump(to) | Verdict::Goto(to))) => {
                                    Some(to.clone())
                                }
                                _ => None,
                            }));
                        }
                    }
                    _ => {}
                }
            }
        }
        out
    }
}

/// `ct state` bits (include/uapi/linux/netfilter/nf_conntrack_common.h
/// `NF_CT_STATE_BIT`): invalid 1, established 2, related 4, new 8, untracked 64.
pub const CT_STATE_NEW: u32 = 8;
/// `RTN_LOCAL`: what `fib ... type local` compares with.
pub const RTN_LOCAL: u32 = 2;
