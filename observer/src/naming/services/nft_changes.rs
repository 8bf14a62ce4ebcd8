//! What nf_tables' announcements say changed, so that a change is read chain by chain
//! instead of dumping every table again. Each announcement is a netlink message
//! (`struct nlmsghdr`, `struct nfgenmsg`, then attributes) of the nf_tables subsystem;
//! rule, chain, set and set element messages name their table and chain or set, which
//! is all that is kept here. Patched one by one: the chains of iptables-nft's `nat` and
//! `filter` tables, and the chains and named sets and maps of kube-proxy's nftables
//! table `kube-proxy` (families ip and ip6). Any other change of a table observer reads
//! asks for a full read; changes of tables observer does not read (`mangle`, `raw`,
//! other programs' tables, other families) are ignored.

use std::collections::BTreeMap;

use crate::netlink::{self, Messages, NFGENMSG_LEN};

mod bytecode;
mod nftables;

/// `NFNL_SUBSYS_NFTABLES`: the high byte of an nf_tables message type.
const SUBSYS_NFTABLES: u16 = 10;
/// `NFPROTO_IPV4`, `NFPROTO_IPV6`.
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// `enum nf_tables_msg_types` (include/uapi/linux/netfilter/nf_tables.h).
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_DESTROYCHAIN: u16 = 27;
const NFT_MSG_DESTROYRULE: u16 = 28;
const NFT_MSG_DESTROYSET: u16 = 29;
const NFT_MSG_DESTROYSETELEM: u16 = 30;

/// The first attribute of every nf_tables object message is its table's name
/// (`NFTA_TABLE_NAME`, `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`, ...).
const NFTA_TABLE: u16 = 1;
/// `NFTA_CHAIN_NAME`; `NFTA_RULE_CHAIN`; `NFTA_SET_NAME`, `NFTA_SET_ELEM_LIST_SET`.
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_SET_NAME: u16 = 2;

/// The address family of a table.
pub use crate::naming::services::rules::program::Family;

/// An iptables-nft table observer patches chain by chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Nat,
    Filter,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Nat => "nat",
            Table::Filter => "filter",
        }
    }
}

/// One chain of an iptables-nft table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChainRef {
    pub family: Family,
    pub table: Table,
    pub chain: String,
}

pub use nftables::{NftEvent, RawElement};

/// What a burst of announcements changed in one namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// Something that cannot be patched chain by chain changed (or announcements were
    /// lost): the namespace needs a full read.
    pub everything: bool,
    /// iptables-nft chains whose rules changed, and whether the last announcement left
    /// them in place (false: the chain was deleted).
    pub chains: BTreeMap<ChainRef, bool>,
    /// What changed in kube-proxy's nftables table, in the order announced: rules
    /// carry what the parser needs of them, so only named maps are read again.
    pub nft: Vec<(Family, NftEvent)>,
}

impl Changes {
    /// A full read.
    pub fn everything() -> Changes {
        Changes {
            everything: true,
            ..Changes::default()
        }
    }

    /// Whether anything observer reads changed.
    pub fn is_empty(&self) -> bool {
        !self.everything && self.chains.is_empty() && self.nft.is_empty()
    }

    /// How many objects a patch reads or removes.
    pub fn len(&self) -> usize {
        self.chains.len() + self.nft.len()
    }

    /// Adds later changes to these: a later announcement about a chain wins; nftables
    /// events queue up in order.
    pub fn merge(&mut self, later: Changes) {
        self.everything |= later.everything;
        self.chains.extend(later.chains);
        self.nft.extend(later.nft);
        self.forget_parts();
    }

    /// A full read needs no names.
    fn forget_parts(&mut self) {
        if self.everything {
            self.chains.clear();
            self.nft.clear();
        }
    }

    /// Reads every message of one datagram. A message that cannot be read makes the
    /// whole burst a full read: it may have been about anything.
    pub fn read_datagram(&mut self, datagram: &[u8]) {
        for message in Messages(datagram) {
            match message {
                Ok(message) => self.read_message(message.kind, message.body),
                Err(_) => self.everything = true,
            }
        }
        self.forget_parts();
    }

    fn read_message(&mut self, kind: u16, payload: &[u8]) {
        if kind >> 8 != SUBSYS_NFTABLES {
            // Not nf_tables (NLMSG_DONE, an error): nothing about rules.
            return;
        }
        let message = kind & 0xff;
        if message == NFT_MSG_NEWGEN {
            // Ends every transaction; says nothing about what changed.
            return;
        }
        let (Some(&family), Some(attributes)) = (payload.first(), payload.get(NFGENMSG_LEN..))
        else {
            self.everything = true;
            return;
        };
        let Ok(table) = string(attributes, NFTA_TABLE) else {
            self.everything = true;
            return;
        };
        let family = match family {
            NFPROTO_IPV4 => Family::V4,
            NFPROTO_IPV6 => Family::V6,
            // inet, bridge, arp, netdev: no table observer reads.
            _ => return,
        };
        let table = match table.as_str() {
            "nat" => Table::Nat,
            "filter" => Table::Filter,
            "kube-proxy" => return self.read_kube_proxy(family, message, attributes),
            _ => return,
        };
        let (name, present) = match message {
            NFT_MSG_NEWCHAIN => (string(attributes, NFTA_CHAIN_NAME), true),
            NFT_MSG_DELCHAIN | NFT_MSG_DESTROYCHAIN => (string(attributes, NFTA_CHAIN_NAME), false),
            NFT_MSG_NEWRULE | NFT_MSG_DELRULE | NFT_MSG_DESTROYRULE => {
                (string(attributes, NFTA_RULE_CHAIN), true)
            }
            // The table itself, a set, an object, a flowtable: read everything.
            _ => (Err(()), true),
        };
        match name {
            Ok(chain) => {
                let chain = ChainRef {
                    family,
                    table,
                    chain,
                };
                self.chains.insert(chain, present);
            }
            Err(()) => self.everything = true,
        }
    }
}

impl Changes {
    /// A message about kube-proxy's nftables table.
    fn read_kube_proxy(&mut self, family: Family, message: u16, attributes: &[u8]) {
        match nftables::event(message, family, attributes) {
            Ok(Some(event)) => self.nft.push((family, event)),
            Ok(None) => {}
            Err(()) => self.everything = true,
        }
    }
}

/// A NUL-terminated string attribute; `Err` when it is missing, not UTF-8, or the block
/// is malformed before it.
fn string(block: &[u8], wanted: u16) -> Result<String, ()> {
    let value = netlink::find(block, wanted).map_err(drop)?.ok_or(())?;
    let text = value.strip_suffix(&[0]).unwrap_or(value);
    std::str::from_utf8(text).map(str::to_owned).map_err(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::services::test_support::nat;

    /// One attribute, padded to 4 bytes.
    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(((4 + value.len()) as u16).to_ne_bytes());
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    fn string(kind: u16, value: &str) -> Vec<u8> {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        attr(kind, &bytes)
    }

    /// One nf_tables message: header, nfgenmsg, attributes.
    fn message(kind: u16, family: u8, attributes: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = attributes.concat();
        let length = netlink::HEADER_LEN + NFGENMSG_LEN + body.len();
        let mut out = Vec::new();
        out.extend((length as u32).to_ne_bytes());
        out.extend(((SUBSYS_NFTABLES << 8) | kind).to_ne_bytes());
        out.extend([0u8; 10]);
        out.extend([family, 0, 0, 0]);
        out.extend(body);
        out
    }

    fn rule(kind: u16, family: u8, table: &str, chain: &str) -> Vec<u8> {
        // A handle and an expression list between the names, as the kernel sends them.
        message(
            kind,
            family,
            &[
                string(NFTA_TABLE, table),
                string(NFTA_RULE_CHAIN, chain),
                attr(3, &7u64.to_be_bytes()),
                attr(4 | 0x8000, &attr(1, b"exprs")),
            ],
        )
    }

    fn chain(kind: u16, family: u8, table: &str, chain: &str) -> Vec<u8> {
        message(
            kind,
            family,
            &[
                string(NFTA_TABLE, table),
                attr(2, &9u64.to_be_bytes()),
                string(NFTA_CHAIN_NAME, chain),
            ],
        )
    }

    fn read(datagrams: &[Vec<u8>]) -> Changes {
        let mut changes = Changes::default();
        for datagram in datagrams {
            changes.read_datagram(datagram);
        }
        changes
    }

    #[test]
    fn a_partial_sync_names_its_chains_and_the_last_word_on_each_wins() {
        // iptables-restore --noflush: KUBE-SERVICES flushed and refilled, a Service
        // chain rewritten, a stale endpoint chain flushed and deleted; several messages
        // share a datagram, as the kernel batches them.
        let batch = [
            rule(NFT_MSG_DELRULE, NFPROTO_IPV4, "nat", "KUBE-SERVICES"),
            rule(NFT_MSG_NEWRULE, NFPROTO_IPV4, "nat", "KUBE-SERVICES"),
            chain(NFT_MSG_NEWCHAIN, NFPROTO_IPV4, "nat", "KUBE-SEP-NEW"),
            rule(NFT_MSG_NEWRULE, NFPROTO_IPV4, "nat", "KUBE-SVC-A"),
            rule(NFT_MSG_DELRULE, NFPROTO_IPV4, "nat", "KUBE-SEP-OLD"),
            chain(NFT_MSG_DELCHAIN, NFPROTO_IPV4, "nat", "KUBE-SEP-OLD"),
            rule(NFT_MSG_NEWRULE, NFPROTO_IPV6, "filter", "KUBE-SERVICES"),
        ]
        .concat();
        let changes = read(&[batch, message(NFT_MSG_NEWGEN, 0, &[attr(1, &[0; 4])])]);
        assert!(!changes.everything);
        let expected: BTreeMap<ChainRef, bool> = [
            (nat("KUBE-SERVICES"), true),
            (nat("KUBE-SEP-NEW"), true),
            (nat("KUBE-SVC-A"), true),
            (nat("KUBE-SEP-OLD"), false),
            (
                ChainRef {
                    family: Family::V6,
                    table: Table::Filter,
                    chain: "KUBE-SERVICES".to_owned(),
                },
                true,
            ),
        ]
        .into();
        assert_eq!(changes.chains, expected);
        // Deleted, then made again: it is there.
        let again = read(&[
            chain(NFT_MSG_DESTROYCHAIN, NFPROTO_IPV4, "nat", "KUBE-SEP-X"),
            chain(NFT_MSG_NEWCHAIN, NFPROTO_IPV4, "nat", "KUBE-SEP-X"),
        ]);
        assert_eq!(again.chains, [(nat("KUBE-SEP-X"), true)].into());
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        attr(kind | 0x8000, &parts.concat())
    }

    fn be32(kind: u16, value: u32) -> Vec<u8> {
        attr(kind, &value.to_be_bytes())
    }

    /// One expression of a rule: `NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA }`.
    fn expr(name: &str, data: &[Vec<u8>]) -> Vec<u8> {
        nested(1, &[string(1, name), nested(2, data)])
    }

    /// `immediate reg DREG VALUE`.
    fn immediate(dreg: u32, value: &[u8]) -> Vec<u8> {
        expr("immediate", &[be32(1, dreg), nested(2, &[attr(1, value)])])
    }

    fn new_rule(chain: &str, handle: u64, exprs: &[Vec<u8>]) -> Vec<u8> {
        message(
            NFT_MSG_NEWRULE,
            NFPROTO_IPV4,
            &[
                string(NFTA_TABLE, "kube-proxy"),
                string(NFTA_RULE_CHAIN, chain),
                attr(3, &handle.to_be_bytes()),
                nested(4, exprs),
            ],
        )
    }

    fn set_message(kind: u16, set: &str, elements: &[Vec<u8>]) -> Vec<u8> {
        let mut attributes = vec![string(NFTA_TABLE, "kube-proxy"), string(NFTA_SET_NAME, set)];
        if !elements.is_empty() {
            attributes.push(nested(3, elements));
        }
        message(kind, NFPROTO_IPV4, &attributes)
    }

    /// An anonymous map element: numgen number -> goto chain.
    fn goto_element(key: u32, chain: &str) -> Vec<u8> {
        let verdict = nested(2, &[be32(1, (-4i32) as u32), string(2, chain)]);
        nested(
            1,
            &[
                nested(1, &[attr(1, &key.to_ne_bytes())]),
                nested(2, &[verdict]),
            ],
        )
    }

    const SERVICE: &str = "service-2EUJKCR2-shop/checkout/tcp/http";
    const ENDPOINT: &str = "endpoint-OJUIMDOZ-shop/checkout/tcp/http__10.244.1.12/8080";

    /// `numgen random mod 2 vmap @__map12`, as nft sends it.
    fn numgen_vmap(numgen_type: u32) -> Vec<u8> {
        new_rule(
            SERVICE,
            90,
            &[
                expr(
                    "numgen",
                    &[be32(1, 8), be32(2, 2), be32(3, numgen_type), be32(4, 0)],
                ),
                expr(
                    "lookup",
                    &[string(1, "__map12"), be32(2, 8), be32(3, 0), be32(4, 12)],
                ),
            ],
        )
    }

    /// `meta l4proto tcp dnat to 10.244.1.12:8080`.
    fn dnat(addr_register: u32) -> Vec<u8> {
        new_rule(
            ENDPOINT,
            91,
            &[
                expr("meta", &[be32(2, 16), be32(1, 1)]),
                expr(
                    "cmp",
                    &[be32(1, 1), be32(2, 0), nested(3, &[attr(1, &[6])])],
                ),
                immediate(1, &[10, 244, 1, 12]),
                immediate(2, &8080u16.to_be_bytes()),
                expr(
                    "nat",
                    &[
                        be32(1, 1),
                        be32(2, 2),
                        be32(3, addr_register),
                        be32(5, 2),
                        be32(7, 0),
                    ],
                ),
            ],
        )
    }

    #[test]
    fn kube_proxys_nftables_changes_carry_their_rules() {
        use crate::naming::services::rules::program::{
            CmpOp, Cond, Data, Expr, Field, Rule as Program, SetRef, Stmt, Verdict,
        };
        use nftables::{NftEvent::*, RawElement};
        // One `nft -f` transaction, as the kernel announces it: a Service chain's vmap
        // rule replaced (its anonymous map first), an endpoint chain's dnat rule, a
        // ClusterIP's map element, a stale endpoint chain flushed and deleted.
        let old = "endpoint-XPEISVAJ-shop/checkout/tcp/http__10.244.1.13/8080";
        let changes = read(&[[
            rule(NFT_MSG_DELRULE, NFPROTO_IPV4, "kube-proxy", SERVICE),
            set_message(NFT_MSG_DELSET, "__map7", &[]),
            set_message(NFT_MSG_NEWSET, "__map12", &[]),
            set_message(
                NFT_MSG_NEWSETELEM,
                "__map12",
                &[goto_element(0, ENDPOINT), goto_element(1, "endpoint-B")],
            ),
            numgen_vmap(1),
            chain(NFT_MSG_NEWCHAIN, NFPROTO_IPV4, "kube-proxy", ENDPOINT),
            dnat(1),
            set_message(NFT_MSG_NEWSETELEM, "service-ips", &[attr(1, b"elem")]),
            rule(NFT_MSG_DELRULE, NFPROTO_IPV4, "kube-proxy", old),
            chain(NFT_MSG_DELCHAIN, NFPROTO_IPV4, "kube-proxy", old),
        ]
        .concat()]);
        assert!(!changes.everything && changes.chains.is_empty());
        let goto = |n: u32, chain: &str| RawElement {
            key: n.to_ne_bytes().to_vec(),
            data: Some(Data::Verdict(Verdict::Goto(chain.to_owned()))),
            interval_end: false,
        };
        let announced = |stmts| Program {
            stmts,
            comment: None,
            handle: None,
            origin: "an announced rule".to_owned(),
        };
        let expected = [
            RuleGone {
                chain: SERVICE.to_owned(),
                handle: 7,
            },
            AnonGone {
                set: "__map7".to_owned(),
            },
            AnonElements {
                set: "__map12".to_owned(),
                elements: vec![goto(0, ENDPOINT), goto(1, "endpoint-B")],
            },
            Rule {
                chain: SERVICE.to_owned(),
                handle: 90,
                rule: announced(vec![Stmt::Vmap {
                    key: Expr::Numgen {
                        modulus: 2,
                        offset: 0,
                    },
                    map: SetRef::Named("__map12".to_owned()),
                }]),
            },
            Rule {
                chain: ENDPOINT.to_owned(),
                handle: 91,
                rule: announced(vec![
                    Stmt::Match(Cond::Cmp {
                        left: Expr::Field(Field::L4Proto),
                        op: CmpOp::Eq,
                        right: vec![6],
                    }),
                    Stmt::Dnat {
                        addr: Expr::Const(vec![10, 244, 1, 12]),
                        port: Some(Expr::Const(8080u16.to_be_bytes().to_vec())),
                    },
                ]),
            },
            Set {
                name: "service-ips".to_owned(),
            },
            RuleGone {
                chain: old.to_owned(),
                handle: 7,
            },
            ChainGone {
                chain: old.to_owned(),
            },
        ];
        let events: Vec<&NftEvent> = changes.nft.iter().map(|(_, event)| event).collect();
        assert_eq!(events, expected.iter().collect::<Vec<_>>());
        assert!(changes.nft.iter().all(|(family, _)| *family == Family::V4));
        assert_eq!(changes.len(), expected.len());
    }

    #[test]
    fn nftables_rules_that_cannot_be_read_ask_for_a_full_read() {
        assert!(
            !read(&[numgen_vmap(0)]).everything,
            "numgen inc spreads as random does"
        );
        assert!(read(&[dnat(3)]).everything, "an address from no immediate");
        let mut cut = dnat(1);
        let length = cut.len();
        cut[0..4].copy_from_slice(&((length - 8) as u32).to_ne_bytes());
        cut.truncate(length - 8);
        assert!(read(&[cut]).everything, "a rule cut short");
        assert!(!read(&[dnat(1), numgen_vmap(1)]).everything);
        let ranges = set_message(
            NFT_MSG_NEWSETELEM,
            "__map3",
            &[nested(
                1,
                &[nested(1, &[attr(1, &0u32.to_ne_bytes())]), be32(3, 1)],
            )],
        );
        assert!(!read(&[ranges]).everything, "an interval set's elements");
    }

    #[test]
    fn tables_observer_does_not_read_are_ignored() {
        let changes = read(&[
            rule(
                NFT_MSG_NEWRULE,
                NFPROTO_IPV4,
                "mangle",
                "KUBE-KUBELET-CANARY",
            ),
            rule(NFT_MSG_NEWRULE, 1, "nat", "POSTROUTING"), // inet
            rule(NFT_MSG_NEWRULE, NFPROTO_IPV4, "cilium", "x"),
            message(NFT_MSG_NEWGEN, 0, &[]),
        ]);
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn what_cannot_be_patched_asks_for_a_full_read() {
        let object = read(&[message(
            18,
            NFPROTO_IPV4,
            &[string(NFTA_TABLE, "kube-proxy")],
        )]);
        assert!(object.everything, "a stateful object (NFT_MSG_NEWOBJ)");
        let table = read(&[message(
            0,
            NFPROTO_IPV4,
            &[string(NFTA_TABLE, "kube-proxy")],
        )]);
        assert!(table.everything);
        // A set element of the nat table (type 12, NFT_MSG_NEWSETELEM).
        let set = read(&[message(12, NFPROTO_IPV4, &[string(NFTA_TABLE, "nat")])]);
        assert!(set.everything);
        let table = read(&[message(0, NFPROTO_IPV6, &[string(NFTA_TABLE, "filter")])]);
        assert!(table.everything);
        let no_chain = read(&[message(
            NFT_MSG_NEWRULE,
            NFPROTO_IPV4,
            &[string(NFTA_TABLE, "nat")],
        )]);
        assert!(no_chain.everything);
        let mut cut = rule(NFT_MSG_NEWRULE, NFPROTO_IPV4, "nat", "KUBE-SVC-A");
        cut.truncate(30);
        let truncated = read(&[rule(NFT_MSG_NEWRULE, NFPROTO_IPV4, "nat", "A"), cut]);
        assert!(truncated.everything);
        assert!(truncated.chains.is_empty(), "a full read needs no chains");
    }

    #[test]
    fn merging_keeps_the_later_word_and_everything_absorbs() {
        let mut first = read(&[rule(NFT_MSG_NEWRULE, NFPROTO_IPV4, "nat", "A")]);
        first.merge(read(&[chain(NFT_MSG_DELCHAIN, NFPROTO_IPV4, "nat", "A")]));
        assert_eq!(first.chains, [(nat("A"), false)].into());
        first.merge(Changes::everything());
        assert_eq!(first, Changes::everything());
        first.merge(read(&[rule(NFT_MSG_NEWRULE, NFPROTO_IPV4, "nat", "B")]));
        assert_eq!(first, Changes::everything());
    }
}
