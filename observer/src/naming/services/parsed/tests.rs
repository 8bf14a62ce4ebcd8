//! Patching parsed iptables-nft dumps chain by chain gives what a full read gives.

use super::*;
use crate::naming::services::nft_changes::{ChainRef, RawElement, Table};
use crate::naming::services::rules::program::{
    CmpOp, Cond, Data, Expr, Field, Rule, SetRef, Stmt, Verdict,
};
use crate::naming::services::test_support::{
    FULL_V4, chain_changes as changes, listing, nat, without_third_checkout_endpoint,
};
use crate::naming::services::{Dump, Dumps, RulesReadError};

/// Serves single chains of an iptables-save text; full reads are not expected.
struct Chains {
    text: String,
    read: Vec<String>,
}

impl DumpSource for Chains {
    fn dump(&mut self, _netns: u32) -> Result<Dumps, RulesReadError> {
        panic!("a patch must not read every table");
    }

    fn chain(&mut self, _netns: u32, chain: &ChainRef) -> Result<String, RulesReadError> {
        self.read.push(chain.chain.clone());
        listing(&self.text, chain.table.name(), &chain.chain)
            .ok_or_else(|| RulesReadError::Source(format!("no chain {}", chain.chain)))
    }
}

fn dumps(command: &str, text: &str) -> Dumps {
    Dumps {
        dumps: vec![Dump {
            command: command.to_owned(),
            format: DumpFormat::IptablesSave,
            text: text.to_owned(),
        }],
        problems: Vec::new(),
    }
}

#[test]
fn patched_chains_give_what_a_full_read_of_the_new_rules_gives() {
    let after = without_third_checkout_endpoint();
    let expected = ServiceMap::from_iptables_save(&after).unwrap();
    let (mut parsed, errors) = ParsedRules::parse(&dumps("iptables-save", FULL_V4));
    assert!(errors.is_empty(), "{errors:?}");
    assert_ne!(parsed.map(), expected, "the edit changes the Services");
    let mut source = Chains {
        text: after.clone(),
        read: Vec::new(),
    };
    let announced = changes(&[
        (nat("KUBE-SVC-CHKHTTP0000000000"), true),
        (nat("KUBE-SEP-CHK3"), false),
    ]);
    assert_eq!(
        parsed
            .patch(&announced, &mut source, 1)
            .map_err(|e| e.to_string()),
        Ok(2)
    );
    assert_eq!(parsed.map(), expected);
    assert_eq!(
        source.read,
        ["KUBE-SVC-CHKHTTP0000000000"],
        "deleted chains are not read"
    );

    // Every chain of both tables named at once: the same.
    let (mut parsed, _) = ParsedRules::parse(&dumps("iptables-save", FULL_V4));
    let mut every: Vec<(ChainRef, bool)> = ["nat", "filter"]
        .iter()
        .flat_map(|table| {
            let section = after.split(&format!("*{table}\n")).nth(1).unwrap();
            section
                .lines()
                .take_while(|line| *line != "COMMIT")
                .filter_map(|line| line.strip_prefix(':'))
                .map(|declared| declared.split_whitespace().next().unwrap().to_owned())
                .map(|chain| {
                    let table = if *table == "nat" {
                        Table::Nat
                    } else {
                        Table::Filter
                    };
                    let chain = ChainRef {
                        family: Family::V4,
                        table,
                        chain,
                    };
                    (chain, true)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    every.push((nat("KUBE-SEP-CHK3"), false));
    assert!(every.len() > 20);
    parsed.patch(&changes(&every), &mut source, 1).unwrap();
    assert_eq!(parsed.map(), expected);
}

#[test]
fn what_cannot_be_patched_says_why() {
    let mut source = Chains {
        text: FULL_V4.to_owned(),
        read: Vec::new(),
    };
    let (mut parsed, _) = ParsedRules::parse(&dumps("iptables-save", FULL_V4));
    let why = |parsed: &mut ParsedRules, source: &mut Chains, changes: &Changes| {
        parsed.patch(changes, source, 1).unwrap_err().to_string()
    };
    assert_eq!(
        why(&mut parsed, &mut source, &Changes::everything()),
        "a change that is not a chain's"
    );
    let v6 = ChainRef {
        family: Family::V6,
        ..nat("KUBE-SERVICES")
    };
    assert_eq!(
        why(&mut parsed, &mut source, &changes(&[(v6, true)])),
        "no V6 iptables-nft tables were read"
    );
    assert_eq!(
        why(
            &mut parsed,
            &mut source,
            &changes(&[(nat("KUBE-SEP-GONE"), true)])
        ),
        "no chain KUBE-SEP-GONE"
    );
    let many: Vec<(ChainRef, bool)> = (0..=MAX_PATCHED_CHAINS)
        .map(|i| (nat(&format!("KUBE-SEP-{i}")), false))
        .collect();
    assert_eq!(
        why(&mut parsed, &mut source, &changes(&many)),
        format!("{} chains changed", MAX_PATCHED_CHAINS + 1)
    );
    // A listing with another chain's rules in it is not taken.
    let broken = "-N KUBE-SEP-CHK1\n-A KUBE-SEP-CHK2 -j ACCEPT\n";
    struct Fixed(&'static str);
    impl DumpSource for Fixed {
        fn dump(&mut self, _: u32) -> Result<Dumps, RulesReadError> {
            unreachable!()
        }
        fn chain(&mut self, _: u32, _: &ChainRef) -> Result<String, RulesReadError> {
            Ok(self.0.to_owned())
        }
    }
    let err = parsed
        .patch(
            &changes(&[(nat("KUBE-SEP-CHK1"), true)]),
            &mut Fixed(broken),
            1,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "iptables-save -t nat -S KUBE-SEP-CHK1: iptables-save line 2: not a line of chain KUBE-SEP-CHK1: -A KUBE-SEP-CHK2 -j ACCEPT"
    );
}

#[test]
fn only_iptables_nft_dumps_are_patched() {
    let legacy = FULL_V4.replace(" (nf_tables)", "");
    for (command, text) in [
        ("iptables-save", legacy.as_str()),
        ("iptables-legacy-save", FULL_V4),
    ] {
        let (mut parsed, _) = ParsedRules::parse(&dumps(command, text));
        let mut source = Chains {
            text: FULL_V4.to_owned(),
            read: Vec::new(),
        };
        let announced = changes(&[(nat("KUBE-SERVICES"), true)]);
        assert_eq!(
            parsed
                .patch(&announced, &mut source, 1)
                .map_err(|e| e.to_string()),
            Err("no V4 iptables-nft tables were read".to_owned()),
            "{command}"
        );
    }
}

const NFT_V4: &str = crate::naming::services::test_support::fixture!("nftables/mixed-v4.json");
const CHECKOUT: &str = "service-AAAAAAA1-shop/checkout/tcp/http";
const THIRD: &str = "endpoint-E0000003-shop/checkout/tcp/http__10.244.2.7/3000";

fn nft_dumps(text: &str) -> Dumps {
    Dumps {
        dumps: vec![Dump {
            command: "nft -j list table ip kube-proxy".to_owned(),
            format: DumpFormat::NftJson,
            text: text.to_owned(),
        }],
        problems: Vec::new(),
    }
}

/// The fixture edited with serde_json: `edit` gets the `nftables` array.
fn edited(edit: impl FnOnce(&mut Vec<serde_json::Value>)) -> String {
    let mut dump: serde_json::Value = serde_json::from_str(NFT_V4).unwrap();
    edit(dump["nftables"].as_array_mut().unwrap());
    dump.to_string()
}

/// Serves `nft -j list map` of one map of a dump; chains and full reads are not
/// expected.
struct Maps {
    text: String,
    listed: Vec<String>,
}

impl DumpSource for Maps {
    fn dump(&mut self, _netns: u32) -> Result<Dumps, RulesReadError> {
        panic!("a patch must not read every table");
    }

    fn nft_object(
        &mut self,
        _netns: u32,
        _family: Family,
        verb: &str,
        name: &str,
    ) -> Result<Option<String>, RulesReadError> {
        self.listed.push(format!("{verb} {name}"));
        let dump: serde_json::Value = serde_json::from_str(&self.text).unwrap();
        let found: Vec<serde_json::Value> = dump["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o.get(verb).and_then(|m| m.get("name")) == Some(&name.into()))
            .cloned()
            .collect();
        Ok((!found.is_empty()).then(|| serde_json::json!({ "nftables": found }).to_string()))
    }
}

fn nft_changes(events: Vec<NftEvent>) -> Changes {
    Changes {
        nft: events.into_iter().map(|e| (Family::V4, e)).collect(),
        ..Changes::default()
    }
}

#[test]
fn announced_nftables_rules_give_what_a_full_read_of_the_new_table_gives() {
    // kube-proxy's partial sync for 10.244.2.7 leaving shop/checkout:http: the vmap rule
    // replaced by one over two endpoints, the endpoint chain deleted.
    let after = edited(|objects| {
        objects.retain(|o| o["rule"]["chain"] != THIRD);
        let rule = objects
            .iter_mut()
            .find(|o| o["rule"]["chain"] == CHECKOUT)
            .unwrap();
        let vmap = &mut rule["rule"]["expr"][0]["vmap"];
        vmap["key"]["numgen"]["mod"] = 2.into();
        vmap["data"]["set"].as_array_mut().unwrap().truncate(2);
    });
    let expected = ServiceMap::from_nft_json(&after).unwrap();
    let (mut parsed, errors) = ParsedRules::parse(&nft_dumps(NFT_V4));
    assert!(errors.is_empty(), "{errors:?}");
    assert_ne!(parsed.map(), expected);
    let events = vec![
        NftEvent::RuleGone {
            chain: CHECKOUT.to_owned(),
            handle: 58,
        },
        // Listed out of order: nft lists them by key, as the fixture has them.
        NftEvent::AnonElements {
            set: "__map9".to_owned(),
            elements: vec![
                goto(
                    1,
                    "endpoint-E0000002-shop/checkout/tcp/http__10.244.1.14/3000",
                ),
                goto(
                    0,
                    "endpoint-E0000001-shop/checkout/tcp/http__10.244.1.13/3000",
                ),
            ],
        },
        vmap_rule(CHECKOUT, 200, 2, "__map9"),
        NftEvent::ChainGone {
            chain: THIRD.to_owned(),
        },
    ];
    let mut source = Maps {
        text: after.clone(),
        listed: Vec::new(),
    };
    assert_eq!(
        parsed
            .patch(&nft_changes(events), &mut source, 1)
            .map_err(|e| e.to_string()),
        Ok(4)
    );
    assert_eq!(parsed.map(), expected);
    assert!(
        source.listed.is_empty(),
        "rules come with their announcements"
    );

    // A new dnat rule for the third endpoint, and its return to the vmap.
    let (mut parsed, _) = ParsedRules::parse(&nft_dumps(&after));
    let back = vec![
        dnat_rule(THIRD, 300, [10, 244, 2, 7], 3000),
        NftEvent::AnonElements {
            set: "__map10".to_owned(),
            elements: vec![
                goto(
                    0,
                    "endpoint-E0000001-shop/checkout/tcp/http__10.244.1.13/3000",
                ),
                goto(
                    1,
                    "endpoint-E0000002-shop/checkout/tcp/http__10.244.1.14/3000",
                ),
                goto(2, THIRD),
            ],
        },
        NftEvent::RuleGone {
            chain: CHECKOUT.to_owned(),
            handle: 200,
        },
        NftEvent::RuleGone {
            chain: CHECKOUT.to_owned(),
            handle: 58,
        },
        vmap_rule(CHECKOUT, 201, 3, "__map10"),
    ];
    parsed.patch(&nft_changes(back), &mut source, 1).unwrap();
    assert_eq!(
        parsed.map(),
        ServiceMap::from_nft_json(NFT_V4).unwrap(),
        "back to the start"
    );
}

#[test]
fn a_changed_nftables_map_is_read_again_and_nothing_else() {
    // A Service port's ClusterIP leaves service-ips (its chains stay for a while).
    let after = edited(|objects| {
        let map = objects
            .iter_mut()
            .find(|o| o["map"]["name"] == "service-ips")
            .unwrap();
        map["map"]["elem"]
            .as_array_mut()
            .unwrap()
            .retain(|e| e[1]["goto"]["target"] != "service-AAAAAAA2-shop/checkout/tcp/metrics");
    });
    let (mut parsed, _) = ParsedRules::parse(&nft_dumps(NFT_V4));
    let mut source = Maps {
        text: after.clone(),
        listed: Vec::new(),
    };
    let changed = nft_changes(vec![
        NftEvent::Set {
            name: "service-ips".to_owned(),
        };
        3
    ]);
    parsed.patch(&changed, &mut source, 1).unwrap();
    assert_eq!(parsed.map(), ServiceMap::from_nft_json(&after).unwrap());
    assert_eq!(
        source.listed,
        ["map service-ips"],
        "once, however often announced"
    );
}

#[test]
fn nftables_changes_that_cannot_be_applied_say_why() {
    let (mut parsed, _) = ParsedRules::parse(&nft_dumps(NFT_V4));
    let mut source = Maps {
        text: NFT_V4.to_owned(),
        listed: Vec::new(),
    };
    let unknown_map = nft_changes(vec![vmap_rule(CHECKOUT, 9, 2, "__map77")]);
    assert_eq!(
        parsed
            .patch(&unknown_map, &mut source, 1)
            .map_err(|e| e.to_string()),
        Err("the elements of __map77 were not announced".to_owned())
    );
    let sets: Vec<NftEvent> = (0..=MAX_NFT_SETS)
        .map(|i| NftEvent::Set {
            name: format!("set-{i}"),
        })
        .collect();
    assert_eq!(
        parsed
            .patch(&nft_changes(sets), &mut source, 1)
            .map_err(|e| e.to_string()),
        Err(format!(
            "{} nftables sets or maps changed",
            MAX_NFT_SETS + 1
        ))
    );
    let v6 = Changes {
        nft: vec![(
            Family::V6,
            NftEvent::ChainGone {
                chain: "x".to_owned(),
            },
        )],
        ..Changes::default()
    };
    assert_eq!(
        parsed.patch(&v6, &mut source, 1).map_err(|e| e.to_string()),
        Err("no V6 nftables table kube-proxy was read".to_owned())
    );
}

/// One anonymous map element: numgen number `n` -> goto `chain`.
fn goto(n: u32, chain: &str) -> RawElement {
    RawElement {
        key: n.to_ne_bytes().to_vec(),
        data: Some(Data::Verdict(Verdict::Goto(chain.to_owned()))),
        interval_end: false,
    }
}

/// `numgen random mod MODULUS vmap @SET`, as announced.
fn vmap_rule(chain: &str, handle: u64, modulus: u32, set: &str) -> NftEvent {
    NftEvent::Rule {
        chain: chain.to_owned(),
        handle,
        rule: Rule {
            stmts: vec![Stmt::Vmap {
                key: Expr::Numgen { modulus, offset: 0 },
                map: SetRef::Named(set.to_owned()),
            }],
            ..Rule::default()
        },
    }
}

/// `meta l4proto tcp dnat to ADDR:PORT`, as announced.
fn dnat_rule(chain: &str, handle: u64, addr: [u8; 4], port: u16) -> NftEvent {
    NftEvent::Rule {
        chain: chain.to_owned(),
        handle,
        rule: Rule {
            stmts: vec![
                Stmt::Match(Cond::Cmp {
                    left: Expr::Field(Field::L4Proto),
                    op: CmpOp::Eq,
                    right: vec![6],
                }),
                Stmt::Dnat {
                    addr: Expr::Const(addr.to_vec()),
                    port: Some(Expr::Const(port.to_be_bytes().to_vec())),
                },
            ],
            ..Rule::default()
        },
    }
}
