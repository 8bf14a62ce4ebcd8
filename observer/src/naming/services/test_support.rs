//! Helpers shared by naming's unit tests: the namer's (`naming::tests`) and the rule
//! parsers' (`naming::rules::tests`).

use std::net::SocketAddr;

/// The text of a kube-proxy rules fixture under `observer/tests/data/rules/`, included
/// at compile time (the same files the root test `rules_netns` loads into namespaces).
macro_rules! fixture {
    ($path:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/rules/",
            $path
        ))
    };
}
pub(crate) use fixture;

pub(crate) fn sa(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// What `iptables -t TABLE -S CHAIN` prints for `chain` of the iptables-save `text`.
pub(crate) fn listing(text: &str, table: &str, chain: &str) -> Option<String> {
    let mut in_table = false;
    let mut declaration = None;
    let mut rules = String::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            in_table = name == table;
        } else if !in_table {
        } else if let Some(declared) = line.strip_prefix(':') {
            let mut words = declared.split_whitespace();
            if words.next() == Some(chain) {
                declaration = Some(match words.next() {
                    Some("-") | None => format!("-N {chain}\n"),
                    Some(policy) => format!("-P {chain} {policy}\n"),
                });
            }
        } else if line.starts_with(&format!("-A {chain} ")) {
            rules.push_str(line);
            rules.push('\n');
        }
    }
    declaration.map(|declaration| declaration + &rules)
}

/// An iptables-nft dump of nat and filter (`iptables-save` of Debian's iptables 1.8.9).
pub(crate) const FULL_V4: &str = fixture!("iptables/mixed-v4-full.saved");

/// The fixture after kube-proxy's partial sync for 10.244.2.7 leaving shop/checkout:http:
/// the waterfall rewritten for two endpoints, the endpoint's chain deleted.
pub(crate) fn without_third_checkout_endpoint() -> String {
    FULL_V4
        .lines()
        .filter(|line| !line.contains("KUBE-SEP-CHK3"))
        .map(|line| {
            line.replace(
                "--probability 0.33333333349 -j KUBE-SEP-CHK1",
                "--probability 0.50000000000 -j KUBE-SEP-CHK1",
            )
            .replace(
                "-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-CHK2",
                "-j KUBE-SEP-CHK2",
            )
        })
        .map(|line| line + "\n")
        .collect()
}

/// An IPv4 iptables-nft `nat` chain.
pub(crate) fn nat(chain: &str) -> super::nft_changes::ChainRef {
    super::nft_changes::ChainRef {
        family: super::nft_changes::Family::V4,
        table: super::nft_changes::Table::Nat,
        chain: chain.to_owned(),
    }
}

/// Announced changes of iptables-nft chains: (chain, still there).
pub(crate) fn chain_changes(
    chains: &[(super::nft_changes::ChainRef, bool)],
) -> super::nft_changes::Changes {
    super::nft_changes::Changes {
        chains: chains.iter().cloned().collect(),
        ..super::nft_changes::Changes::default()
    }
}
