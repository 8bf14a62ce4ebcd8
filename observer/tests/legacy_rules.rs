//! Root integration test (issue 11: rule changes as they happen): kube-proxy rules in
//! legacy iptables tables announce nothing, so observer fingerprints the tables every
//! second and re-reads them when the fingerprint changes. A namespace of the test's
//! own gets the fixture's rules through `iptables-legacy-restore`; an endpoint moves
//! (same rule count and size: only the fingerprint of the rules' content can tell);
//! observer reports it without any lookup asking for a re-read.

mod common;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{netns_inode, prefix, require_root};
use observer::model::record::Proto;
use observer::naming::services::{Namer, NamerConfig, SystemSource, legacy_fingerprint};

const RULES: &str = include_str!("data/rules/iptables/mixed-v4-nat.saved");

/// A network namespace of the test's own, removed on drop.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        let status = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(status.unwrap().success(), "ip netns add {name}");
        Netns(name)
    }

    fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.0)
    }

    /// `iptables-legacy-save -c`: the rules with their counters.
    fn saved_with_counters(&self) -> String {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.0,
                "iptables-legacy-save",
                "-c",
                "-t",
                "nat",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| !line.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Replaces the legacy nat table with `rules`.
    fn restore(&self, rules: &str) {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.0, "iptables-legacy-restore"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "iptables-legacy-restore");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn sa(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The metrics endpoint moves to another pod: an address of the same length.
fn moved() -> String {
    RULES.replace("10.244.1.13:9100", "10.244.1.31:9100")
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn legacy_tables_fingerprint_sees_content_not_counters() {
    require_root();
    let netns = Netns::new(prefix("lf"));
    netns.restore(RULES);
    let sockets = legacy_fingerprint::open(&netns.path()).unwrap();
    let first = sockets.fingerprint().expect("the nat table is readable");
    // Counters move with traffic: each new loopback flow passes nat's OUTPUT chain.
    let counted = netns.saved_with_counters();
    let lo = Command::new("ip")
        .args(["netns", "exec", &netns.0, "ip", "link", "set", "lo", "up"])
        .status();
    assert!(lo.unwrap().success());
    let send = "import socket\nfor _ in range(5): socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 9))";
    let sent = Command::new("ip")
        .args(["netns", "exec", &netns.0, "python3", "-c", send])
        .status();
    assert!(sent.unwrap().success());
    assert_ne!(netns.saved_with_counters(), counted, "the counters moved");
    assert_eq!(sockets.fingerprint(), Some(first));
    netns.restore(&moved());
    let second = sockets.fingerprint().unwrap();
    assert_ne!(second, first);
    netns.restore(RULES);
    assert_eq!(sockets.fingerprint(), Some(first));
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn legacy_rule_changes_are_reported_without_lookups() {
    require_root();
    let netns = Netns::new(prefix("lw"));
    netns.restore(RULES);
    let inode = netns_inode(&netns.0);
    let mut namer = Namer::spawn(NamerConfig::default(), Box::new(SystemSource::new()));
    let lookup = namer.lookup(
        inode,
        Proto::Tcp,
        sa("10.96.35.226:9090"),
        sa("10.244.1.13:9100"),
        None,
        Instant::now(),
    );
    assert_eq!(lookup.wait_for, Some(1));
    assert!(namer.wait(Instant::now() + Duration::from_secs(10)));
    assert_eq!(
        namer
            .cached(
                inode,
                Proto::Tcp,
                sa("10.96.35.226:9090"),
                sa("10.244.1.13:9100")
            )
            .service
            .as_deref(),
        Some("shop/checkout:metrics")
    );
    assert_eq!(namer.take_endpoint_changes(), vec![]);

    netns.restore(&moved());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut changes = Vec::new();
    while changes.is_empty() && Instant::now() < deadline {
        namer.wait(deadline);
        changes = namer.take_endpoint_changes();
    }
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        (
            changes[0].service.as_str(),
            changes[0].added.clone(),
            changes[0].removed.clone()
        ),
        (
            "shop/checkout:metrics",
            vec![sa("10.244.1.31:9100")],
            vec![sa("10.244.1.13:9100")]
        )
    );
}
