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
