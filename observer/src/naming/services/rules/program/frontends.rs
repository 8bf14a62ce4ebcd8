//! Which destinations the rules treat specially, and what they do with a connection to
//! each. Candidates come from the rules themselves: every key of a set or map that a
//! rule looks up by destination address, protocol and port (`service-ips`,
//! `service-nodeports`, kube-proxy's 1.38 `@endpoints`), and every rule that compares
//! the destination port with a constant (iptables' `-d IP -p tcp --dport N`). A key or
//! rule without an address is a NodePort: any address of the node. Each candidate is
//! then run through the hooks ([`evaluate`]); one that no rule DNATs, drops or rejects
//! is no Service.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use super::eval::{Branch, Compiled, Daddr, Packet, Stage, evaluate};
use super::{
    Base, Bytes, ChainType, CmpOp, Cond, Expr, Family, Field, Hook, Program, SetRef, Stmt, padded,
};

/// IP protocol numbers observer names connections of.
pub const TCP: u8 = 6;
pub const UDP: u8 = 17;

/// Every destination the rules may treat as a Service frontend.
pub fn candidates(program: &Program) -> BTreeSet<Packet> {
    let mut out = BTreeSet::new();
    for chain in program.chains.values() {
        for rule in &chain.rules {
            let constant = rule_constants(program.family, &rule.stmts);
            if let Some(dport) = constant.dport {
                for proto in protos(constant.proto) {
                    out.insert(Packet {
                        daddr: constant.daddr.map_or(Daddr::NodeLocal, Daddr::Addr),
                        proto,
                        dport,
                    });
                }
            }
            for (key, set) in lookups(&rule.stmts) {
                add_keys(program, key, set, constant.proto, &mut out);
            }
        }
    }
    out
}

fn protos(proto: Option<u8>) -> Vec<u8> {
    match proto {
        Some(proto) => vec![proto],
        None => vec![TCP, UDP],
    }
}

/// What one rule's exact comparisons say of the destination.
#[derive(Default)]
struct Constants {
    daddr: Option<IpAddr>,
    proto: Option<u8>,
    dport: Option<u16>,
}

fn rule_constants(family: Family, stmts: &[Stmt]) -> Constants {
    let mut out = Constants::default();
    for stmt in stmts {
        let Stmt::Match(Cond::Cmp {
            left,
            op: CmpOp::Eq,
            right,
        }) = stmt
        else {
            continue;
        };
        match left {
            Expr::Field(Field::Daddr) if right.len() == family.addr_len() => {
                out.daddr = ip(right);
            }
            Expr::Bitwise { of, mask, .. }
                if **of == Expr::Field(Field::Daddr) && mask.iter().all(|b| *b == 0xff) =>
            {
                out.daddr = ip(right);
            }
            Expr::Field(Field::L4Proto) if right.len() == 1 => out.proto = Some(right[0]),
            Expr::Field(Field::Dport) if right.len() == 2 => {
                out.dport = Some(u16::from_be_bytes([right[0], right[1]]));
            }
            _ => {}
        }
    }
    out
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// Every (key, set) a rule looks up: verdict maps, set matches, data maps.
fn lookups(stmts: &[Stmt]) -> Vec<(&Expr, &SetRef)> {
    let mut out = Vec::new();
    for stmt in stmts {
        match stmt {
            Stmt::Vmap { key, map } => out.push((key, map)),
            Stmt::Match(Cond::InSet { left, set, .. }) => out.push((left, set)),
            Stmt::Dnat { addr, port } => {
                data_lookups(addr, &mut out);
                if let Some(port) = port {
                    data_lookups(port, &mut out);
                }
            }
            Stmt::SetCtMark(value) => data_lookups(value, &mut out),
            _ => {}
        }
    }
    out
}

fn data_lookups<'a>(expr: &'a Expr, out: &mut Vec<(&'a Expr, &'a SetRef)>) {
    match expr {
        Expr::Lookup { key, map } => {
            out.push((key, map));
            data_lookups(key, out);
        }
        Expr::Slice { of, .. } | Expr::Bitwise { of, .. } => data_lookups(of, out),
        Expr::Concat(parts) => parts.iter().for_each(|p| data_lookups(p, out)),
        _ => {}
    }
}

/// The candidates in the keys of one looked-up set, where the key holds the
/// destination port.
fn add_keys(
    program: &Program,
    key: &Expr,
    set: &SetRef,
    rule_proto: Option<u8>,
    out: &mut BTreeSet<Packet>,
) {
    let parts: Vec<&Expr> = match key {
        Expr::Concat(parts) => parts.iter().collect(),
        single => vec![single],
    };
    let mut offsets: HashMap<Field, (usize, usize)> = HashMap::new();
    let mut offset = 0;
    for part in &parts {
        let Some(width) = part.width(program.family) else {
            return;
        };
        if let Expr::Field(field) = part {
            offsets.insert(*field, (offset, width));
        }
        offset += if parts.len() > 1 {
            padded(width)
        } else {
            width
        };
    }
    let Some(&(port_at, 2)) = offsets.get(&Field::Dport) else {
        return;
    };
    let Some(set) = program.set(set) else {
        return;
    };
    let slice = |key: &Bytes, (at, len): (usize, usize)| key.get(at..at + len).map(<[u8]>::to_vec);
    for element in set.elements().iter().filter(|e| e.key_end.is_none()) {
        let Some(port) = slice(&element.key, (port_at, 2)) else {
            continue;
        };
        let daddr = match offsets.get(&Field::Daddr) {
            Some(&at) => match slice(&element.key, at).as_deref().and_then(ip) {
                Some(ip) => Daddr::Addr(ip),
                None => continue,
            },
            None => Daddr::NodeLocal,
        };
        let proto = match offsets.get(&Field::L4Proto) {
            Some(&(at, _)) => element.key.get(at).copied(),
            None => rule_proto,
        };
        for proto in protos(proto) {
            out.insert(Packet {
                daddr,
                proto,
                dport: u16::from_be_bytes([port[0], port[1]]),
            });
        }
    }
}

/// The order in which a connection's first packet meets a table's chains, each table
/// prepared once for every packet it runs.
pub struct Plan<'p> {
    stages: Vec<(Compiled<'p>, Vec<usize>)>,
}

impl<'p> Plan<'p> {
    /// nf_tables: the base chains at prerouting (filter and nat, by priority), then
    /// forward and input (filters after routing); output's when nothing hooks
    /// prerouting. iptables: each table's built-in chains, or, where they jump nowhere
    /// (kube-proxy's own test dumps leave them out), the chains nothing jumps to.
    pub fn new(programs: &[&'p Program]) -> Plan<'p> {
        let stages = programs
            .iter()
            .map(|program| {
                let compiled = Compiled::new(program);
                let roots = roots(program)
                    .iter()
                    .filter_map(|name| compiled.id(name))
                    .collect();
                (compiled, roots)
            })
            .collect();
        Plan { stages }
    }

    /// What the rules do with a connection to `packet`.
    pub fn run(&self, packet: Packet) -> Vec<Branch> {
        let stages: Vec<Stage<'_, 'p>> = self
            .stages
            .iter()
            .map(|(compiled, roots)| Stage { compiled, roots })
            .collect();
        evaluate(&stages, packet)
    }
}

fn roots(program: &Program) -> Vec<String> {
    let mut hooked: Vec<(Hook, i32, &String)> = program
        .chains
        .iter()
        .filter_map(|(name, chain)| chain.base.map(|base| (base, name)))
        .filter(|(_, name)| !program.chains[name.as_str()].rules.is_empty())
        .map(|(Base { hook, priority, .. }, name)| (hook, priority, name))
        .collect();
    let has_prerouting_nat = program.chains.values().any(|c| {
        c.base
            .is_some_and(|b| b.hook == Hook::Prerouting && b.kind == ChainType::Nat)
            && !c.rules.is_empty()
    });
    hooked.retain(|(hook, _, _)| match hook {
        Hook::Prerouting | Hook::Forward | Hook::Input => true,
        Hook::Output => !has_prerouting_nat,
        Hook::Postrouting => false,
    });
    hooked.sort();
    if !hooked.is_empty() {
        return hooked
            .into_iter()
            .map(|(_, _, name)| name.clone())
            .collect();
    }
    // Nothing hooked: the chains nothing leads to, but the masquerading and SNAT ones
    // (kube-proxy's test dumps write no jumps from the built-in chains).
    let reached: BTreeSet<String> = program
        .chains
        .values()
        .flat_map(|chain| program.targets(chain))
        .collect();
    program
        .chains
        .iter()
        .filter(|(name, chain)| {
            chain.base.is_none() && !chain.rules.is_empty() && !reached.contains(*name)
        })
        .map(|(name, _)| name.clone())
        .collect()
}
