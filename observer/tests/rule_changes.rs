//! Root integration test (issue 9: parse only what changed): kube-proxy's partial syncs
//! are read chain by chain. observer reads the node's rules whole once, then only the
//! chains (and nftables maps) nf_tables announces as changed: endpoints leave and come
//! back, a Service appears. What it ends up with must be exactly what a full read
//! (`observer rules`) and the lab's own definition say, and its debug log must show
//! patches and no second full read: iptables-nft chains are read with `iptables -S`,
//! nftables rules come with their announcements (a changed map is read with `nft`).

mod common;

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    process::Command,
    time::{Duration, Instant},
};

use common::{Recorder, netns_inode, prefix, require_root};
use observer::model::record::{EndpointShare, Frontend, Recording, ServiceRecord};
use observer_lab::{Lab, LabConfig, Proto, RuleMode, Service, Topology, http_fresh};

const EXTRA: usize = 20;
/// How long observer may take to log a change (the log is flushed every second).
const LOGGED: Duration = Duration::from_secs(20);

type Definition = (Vec<Frontend>, Vec<(SocketAddr, String)>);
/// A named change to the lab's rules.
type Step<'a> = (&'static str, Box<dyn Fn(&mut Lab) + 'a>);

fn extra_service(lab: &Lab, i: usize) -> Service {
    let checkout = lab.service("checkout").unwrap();
    Service {
        namespace: "load".into(),
        name: format!("svc-{i}"),
        port_name: "http".into(),
        proto: Proto::Tcp,
        cluster_ip: Ipv4Addr::new(10, 97, 0, i as u8 + 1),
        port: 80,
        target_port: checkout.target_port,
        node_port: None,
        traffic: Default::default(),
        endpoints: checkout.endpoints.clone(),
    }
}

/// Frontends and endpoints (with their share, printed exactly) of a Service record.
fn definition(record: &ServiceRecord) -> Definition {
    let endpoint = |e: &EndpointShare| (e.addr, format!("{:.9}", e.expected_share));
    (
        record.frontends.clone(),
        record.endpoints.iter().map(endpoint).collect(),
    )
}

/// The latest definition of every Service port of `netns` in the log.
fn logged(log: &std::path::Path, netns: u32) -> BTreeMap<String, Definition> {
    let recording = Recording::read(log).unwrap_or_default();
    recording
        .services
        .iter()
        .filter(|s| s.netns == netns)
        .map(|s| (s.service.clone(), definition(s)))
        .collect()
}

/// What a full read of the node's rules says, through `observer rules`.
fn full_read(node_ns: &str) -> BTreeMap<String, Definition> {
    common::rules_of(node_ns)
        .iter()
        .map(|s| (s.service.clone(), definition(s)))
        .collect()
}

/// The endpoints the lab defines for each Service port.
fn lab_endpoints(lab: &Lab) -> BTreeMap<String, Vec<SocketAddr>> {
    lab.services()
        .iter()
        .map(|s| {
            let addrs = s
                .endpoints
                .iter()
                .map(|p| SocketAddr::new(p.ip.into(), s.target_port))
                .collect();
            (s.port_name_string(), addrs)
        })
        .collect()
}

/// Waits until the log's definitions equal `expected` (endpoint addresses only).
fn wait_for_log(
    log: &std::path::Path,
    netns: u32,
    expected: &BTreeMap<String, Vec<SocketAddr>>,
) -> BTreeMap<String, Definition> {
    let deadline = Instant::now() + LOGGED;
    loop {
        let seen = logged(log, netns);
        let addrs: BTreeMap<String, Vec<SocketAddr>> = seen
            .iter()
            .map(|(name, (_, endpoints))| (name.clone(), endpoints.iter().map(|e| e.0).collect()))
            .collect();
        if addrs == *expected {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "the log's Services did not become the lab's within {LOGGED:?}: log {addrs:#?}, lab {expected:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn changes_are_read(rules: RuleMode, tag: &str) {
    require_root();
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    let extra: Vec<Service> = (0..EXTRA).map(|i| extra_service(&lab, i)).collect();
    lab.add_services(extra).expect("extra Services");
    let node = netns_inode(lab.node_ns());
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_observer"));
    let log = dir.path().join("conns.jsonl");
    command
        .args(["record", "--write"])
        .arg(&log)
        .env("RUST_LOG", "observer::naming=debug");
    let recorder = Recorder::spawn(command, log.clone());

    // One connection makes observer read the node's rules.
    let checkout = lab.service("checkout").unwrap().clone();
    http_fresh(&lab, checkout.cluster_addr(), 1).unwrap();
    wait_for_log(&log, node, &lab_endpoints(&lab));

    let pods: Vec<Ipv4Addr> = checkout.endpoints.iter().map(|p| p.ip).collect();
    let steps: [Step<'_>; 4] = [
        (
            "an endpoint leaves",
            Box::new(|lab| lab.remove_endpoint("load/svc-3:http", pods[0]).unwrap()),
        ),
        (
            "another leaves a second Service",
            Box::new(|lab| lab.remove_endpoint("shop/checkout:http", pods[1]).unwrap()),
        ),
        (
            "a Service appears",
            Box::new(|lab| {
                let new = extra_service(lab, EXTRA);
                lab.add_service(new).unwrap()
            }),
        ),
        (
            "the first comes back",
            Box::new(|lab| lab.add_endpoint("load/svc-3:http", pods[0]).unwrap()),
        ),
    ];
    for (step, change) in steps {
        eprintln!("step: {step}");
        change(&mut lab);
        let seen = wait_for_log(&log, node, &lab_endpoints(&lab));
        assert_eq!(seen, full_read(lab.node_ns()), "after `{step}`");
    }

    let stderr = recorder.stderr();
    let full_reads = stderr
        .iter()
        .filter(|l| l.contains(&format!("read the rules of netns {node} ")))
        .count();
    let patches = stderr
        .iter()
        .filter(|l| l.contains(&format!("patched the rules of netns {node} ")))
        .count();
    assert_eq!(full_reads, 1, "one full read, then patches: {stderr:#?}");
    assert!(patches >= 4, "each change patched in: {stderr:#?}");
    recorder.stop();
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn iptables_changes_are_read_chain_by_chain() {
    changes_are_read(RuleMode::Iptables, "rc");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_changes_are_patched_from_their_announcements() {
    changes_are_read(RuleMode::Nftables, "rn");
}

/// kube-proxy 1.37's layout (the Service chain DNATs through a numgen map, or directly
/// for one endpoint): rules decoded from their announcements' bytecode.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_1_37_changes_are_patched_from_their_announcements() {
    changes_are_read(RuleMode::Nftables137, "r37");
}

/// The dispatch-N/@endpoints layout proposed for 1.38: endpoint changes are changes of
/// the named `endpoints` map, read again alone.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_dispatch_changes_are_patched() {
    changes_are_read(RuleMode::NftablesDispatch, "rdp");
}
