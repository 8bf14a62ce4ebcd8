//! Patching parsed iptables-nft dumps chain by chain gives what a full read gives.

use super::*;
use crate::naming::announce::{ChainRef, Table};
use crate::naming::test_support::{FULL_V4, listing, without_third_checkout_endpoint};
use crate::naming::{Dump, Dumps};

/// Serves single chains of an iptables-save text; full reads are not expected.
struct Chains {
    text: String,
    read: Vec<String>,
}

impl DumpSource for Chains {
    fn dump(&mut self, _netns: u32) -> Result<Dumps, String> {
        panic!("a patch must not read every table");
    }

    fn chain(&mut self, _netns: u32, chain: &ChainRef) -> Result<String, String> {
        self.read.push(chain.chain.clone());
        listing(&self.text, chain.table.name(), &chain.chain)
            .ok_or_else(|| format!("no chain {}", chain.chain))
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

fn nat(chain: &str) -> ChainRef {
    ChainRef {
        family: Family::V4,
        table: Table::Nat,
        chain: chain.to_owned(),
    }
}

fn changes(chains: &[(ChainRef, bool)]) -> Changes {
    Changes {
        everything: false,
        chains: chains.iter().cloned().collect(),
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
    assert_eq!(parsed.patch(&announced, &mut source, 1), Ok(2));
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
        parsed.patch(changes, source, 1).unwrap_err()
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
        fn dump(&mut self, _: u32) -> Result<Dumps, String> {
            unreachable!()
        }
        fn chain(&mut self, _: u32, _: &ChainRef) -> Result<String, String> {
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
        err,
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
            parsed.patch(&announced, &mut source, 1),
            Err("no V4 iptables-nft tables were read".to_owned()),
            "{command}"
        );
    }
}
