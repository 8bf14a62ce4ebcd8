//! Root tests (issue 28): Services whose rules depend on who the client is, exact against
//! the clients' own record and `conntrack -E`, in kube-proxy's iptables and nftables
//! modes (the lab writes the rules as kube-proxy's proxiers up to 1.35 do; the shapes match the ns2/svc2 and ns5/svc5 rules of upstream's TestOverall*Rules dumps in tests/data/rules).
//!
//! - `externalTrafficPolicy: Local` on a NodePort Service with an endpoint on another
//!   node (the lab's peer node, which also plays the external client): external
//!   connections through the NodePort go only to this node's endpoints and say
//!   `policy: local`; the Service line gives the local endpoints their own shares; the
//!   ClusterIP (and a pod dialing the NodePort, short-circuited by kube-proxy) still
//!   spreads over every endpoint, the remote one marked `same_node: false`.
//! - `internalTrafficPolicy: Local` on a Service with an endpoint on another node and a
//!   NodePort (Cluster policy): pod connections to the ClusterIP go only to this node's
//!   endpoints and say `policy: local`, against the local endpoints' shares; through the
//!   NodePort they may reach every endpoint.
//! - `sessionAffinity: ClientIP`: one client's fresh connections all land on one pod;
//!   observer names them all, reports the affinity, and `check --max-skew 1.5` judges the
//!   Service on stickiness rather than failing it as skewed.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Recorder, assert_same_decisions, only_node, prefix, require_root, service_line};
use observer::model::record::{
    Affinity, ConnRecord, EndpointShare, Proto, Recording, TrafficPolicy,
};
use observer_lab::spec::NODE_IP;
use observer_lab::{
    Answer, ConntrackWatch, Lab, LabConfig, NODE_NET_IP, PEER_POD_IP, RuleMode, Service, Topology,
    Traffic, http_fresh, http_fresh_from,
};

const LOCAL_SERVICE: &str = "shop/front:http";
const STICKY_SERVICE: &str = "shop/sticky:http";
const INNER_SERVICE: &str = "shop/inner:http";

fn lab(rules: RuleMode, tag: &str) -> Lab {
    require_root();
    Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up")
}

/// A Service on the checkout pods (and `extra`), named `name`, at `cluster_ip`.
fn service(lab: &Lab, name: &str, last: u8, node_port: Option<u16>, traffic: Traffic) -> Service {
    let checkout = lab.service("checkout").unwrap();
    Service {
        name: name.into(),
        cluster_ip: Ipv4Addr::new(10, 96, 35, last),
        node_port,
        traffic,
        ..checkout.clone()
    }
}

/// The records of `answers` (the client's own record) to `dialed`, by client port.
fn records_of<'a>(
    conns: &'a [ConnRecord],
    answers: &[Answer],
    dialed: SocketAddr,
) -> Vec<(&'a ConnRecord, String)> {
    let by_port: HashMap<(u16, SocketAddr), &ConnRecord> = conns
        .iter()
        .filter(|c| c.proto == Proto::Tcp)
        .map(|c| ((c.client.port(), c.original_dst), c))
        .collect();
    answers
        .iter()
        .map(|a| {
            let conn = by_port
                .get(&(a.client_port, dialed))
                .unwrap_or_else(|| panic!("no record of {a:?} to {dialed}"));
            (*conn, a.pod.clone())
        })
        .collect()
}

/// `observer record` on the lab's node while `drive` runs its clients; returns what
/// `drive` returned, the node's part of the log (its connections checked one by one
/// against `conntrack -E`), and where the log is (with the directory that holds it).
fn record<T>(lab: &Lab, drive: impl FnOnce() -> T) -> (T, Recording, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let watch = ConntrackWatch::start(lab.node_ns()).unwrap();
    let runtime_root = lab.runtime_root();
    let recorder = Recorder::start(
        dir.path(),
        &["--runtime-root", runtime_root.to_str().unwrap()],
    );
    let driven = drive();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = recorder.output.clone();
    let mut recording = recorder.stop();
    let events = watch.stop().unwrap();
    only_node(&mut recording, lab.node_ns());
    let conns: Vec<&ConnRecord> = recording.conns.iter().collect();
    assert_same_decisions(&conns, &events, lab.node_ns());
    (driven, recording, log, dir)
}

/// `set` is `want`, in order, with even shares (iptables writes its probabilities to 10
/// digits).
fn assert_even(set: &[EndpointShare], want: Vec<SocketAddrV4>) {
    let got: Vec<SocketAddr> = set.iter().map(|e| e.addr).collect();
    let want: Vec<SocketAddr> = want.into_iter().map(SocketAddr::V4).collect();
    assert_eq!(got, want, "{set:?}");
    let n = want.len() as f64;
    assert!(
        set.iter()
            .all(|e| (e.expected_share - 1.0 / n).abs() < 1e-9),
        "{set:?}"
    );
}

/// `observer ARGS --service SERVICE LOG`: its exit code and standard output.
fn observer(args: &[&str], service: &str, log: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(args)
        .args(["--service", service])
        .arg(log)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn local_policy(rules: RuleMode, tag: &str) {
    let mut lab = lab(rules, tag);
    let remote = lab.add_peer_node().expect("a peer node");
    let mut front = service(
        &lab,
        "front",
        230,
        Some(30090),
        Traffic {
            external_local: true,
            affinity_timeout_s: None,
            ..Traffic::default()
        },
    );
    front.endpoints.push(remote);
    lab.add_service(front.clone()).unwrap();
    let peer = lab.peer_ns().unwrap().to_owned();
    let cluster = SocketAddr::V4(front.cluster_addr());
    let external_node_port = SocketAddr::V4(SocketAddrV4::new(NODE_NET_IP, 30090));
    let pod_node_port = SocketAddr::V4(SocketAddrV4::new(NODE_IP, 30090));
    let ((external, via_cluster, pod_via_node_port), recording, log, _dir) = record(&lab, || {
        // The external client first: its connections are the first the node's rules name.
        (
            http_fresh_from(&lab, &peer, external_node_port, 12).unwrap(),
            http_fresh(&lab, cluster, 40).unwrap(),
            http_fresh(&lab, pod_node_port, 8).unwrap(),
        )
    });
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);
    assert_eq!(recording.conns.len(), 12 + 40 + 8, "{:#?}", recording.conns);

    let local_pods: BTreeSet<String> = ["checkout-a", "checkout-b", "checkout-c"]
        .map(String::from)
        .into();
    for (conn, pod) in records_of(&recording.conns, &external, external_node_port) {
        assert!(local_pods.contains(&pod), "external client reached {pod}");
        assert_eq!(
            (
                conn.service.as_deref(),
                conn.endpoint_in_rules,
                conn.policy,
                conn.same_node
            ),
            (
                Some(LOCAL_SERVICE),
                Some(true),
                Some(TrafficPolicy::Local),
                Some(true)
            ),
            "{conn:?}"
        );
        assert_eq!(
            conn.backend_pod.as_deref(),
            Some(format!("shop/{pod}").as_str())
        );
    }
    // Pod clients: kube-proxy short-circuits them to every endpoint, the remote one too.
    let mut reached = BTreeSet::new();
    for (answers, dialed) in [(&via_cluster, cluster), (&pod_via_node_port, pod_node_port)] {
        for (conn, pod) in records_of(&recording.conns, answers, dialed) {
            let remote = conn.backend.ip() == std::net::IpAddr::V4(PEER_POD_IP);
            assert_eq!(remote, pod == "checkout-remote", "{conn:?}");
            assert_eq!(
                (
                    conn.service.as_deref(),
                    conn.endpoint_in_rules,
                    conn.policy,
                    conn.same_node
                ),
                (Some(LOCAL_SERVICE), Some(true), None, Some(!remote)),
                "{conn:?}"
            );
            reached.insert(pod);
        }
    }
    assert!(reached.contains("checkout-remote"), "{reached:?}");

    let inode = common::netns_inode(lab.node_ns());
    let line = service_line(&recording.services, inode, LOCAL_SERVICE);
    assert_even(&line.endpoints, front.endpoint_addrs());
    assert_even(
        line.local_endpoints.as_deref().expect("local endpoints"),
        front.local_endpoint_addrs(),
    );
    // No false stale pins.
    let (code, stdout) = observer(&["check", "--max-stale", "0"], LOCAL_SERVICE, &log);
    assert_eq!(code, Some(0), "{stdout}");
}

fn internal_policy(rules: RuleMode, tag: &str) {
    let mut lab = lab(rules, tag);
    let remote = lab.add_peer_node().expect("a peer node");
    let mut inner = service(
        &lab,
        "inner",
        232,
        Some(30091),
        Traffic {
            internal_local: true,
            ..Traffic::default()
        },
    );
    inner.endpoints.push(remote);
    lab.add_service(inner.clone()).unwrap();
    let cluster = SocketAddr::V4(inner.cluster_addr());
    let node_port = SocketAddr::V4(SocketAddrV4::new(NODE_IP, 30091));
    let ((via_cluster, via_node_port), recording, log, _dir) = record(&lab, || {
        (
            http_fresh(&lab, cluster, 40).unwrap(),
            http_fresh(&lab, node_port, 8).unwrap(),
        )
    });
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);
    assert_eq!(recording.conns.len(), 40 + 8, "{:#?}", recording.conns);

    for (conn, pod) in records_of(&recording.conns, &via_cluster, cluster) {
        assert_ne!(
            pod, "checkout-remote",
            "the ClusterIP reached the other node"
        );
        assert_eq!(
            (
                conn.service.as_deref(),
                conn.endpoint_in_rules,
                conn.policy,
                conn.same_node,
                conn.backend_pod.as_deref()
            ),
            (
                Some(INNER_SERVICE),
                Some(true),
                Some(TrafficPolicy::Local),
                Some(true),
                Some(format!("shop/{pod}").as_str())
            ),
            "{conn:?}"
        );
    }
    for (conn, pod) in records_of(&recording.conns, &via_node_port, node_port) {
        let remote = conn.backend.ip() == std::net::IpAddr::V4(PEER_POD_IP);
        assert_eq!(remote, pod == "checkout-remote", "{conn:?}");
        assert_eq!(
            (conn.service.as_deref(), conn.endpoint_in_rules, conn.policy),
            (Some(INNER_SERVICE), Some(true), None),
            "{conn:?}"
        );
    }
    let inode = common::netns_inode(lab.node_ns());
    let line = service_line(&recording.services, inode, INNER_SERVICE);
    assert_even(&line.endpoints, inner.endpoint_addrs());
    assert_even(
        line.local_endpoints.as_deref().expect("local endpoints"),
        inner.local_endpoint_addrs(),
    );
    // Judged against the local endpoints: no false stale pins, no skew beyond chance.
    let (code, stdout) = observer(&["check", "--max-stale", "0"], INNER_SERVICE, &log);
    assert_eq!(code, Some(0), "{stdout}");
}

fn affinity(rules: RuleMode, tag: &str) {
    let mut lab = lab(rules, tag);
    let sticky = service(
        &lab,
        "sticky",
        231,
        None,
        Traffic {
            external_local: false,
            affinity_timeout_s: Some(10800),
            ..Traffic::default()
        },
    );
    lab.add_service(sticky.clone()).unwrap();
    let cluster = SocketAddr::V4(sticky.cluster_addr());
    let (answers, recording, log, _dir) = record(&lab, || http_fresh(&lab, cluster, 30).unwrap());
    assert_eq!(recording.conns.len(), 30, "{:#?}", recording.conns);
    // The client's own record: one pod for all 30.
    let pods: BTreeSet<&str> = answers.iter().map(|a| a.pod.as_str()).collect();
    assert_eq!(pods.len(), 1, "{answers:?}");
    let pod = format!("shop/{}", answers[0].pod);
    for (conn, _) in records_of(&recording.conns, &answers, cluster) {
        assert_eq!(
            (
                conn.service.as_deref(),
                conn.endpoint_in_rules,
                conn.backend_pod.as_deref()
            ),
            (Some(STICKY_SERVICE), Some(true), Some(pod.as_str())),
            "{conn:?}"
        );
    }
    let inode = common::netns_inode(lab.node_ns());
    let line = service_line(&recording.services, inode, STICKY_SERVICE);
    assert_eq!(
        line.affinity,
        Some(Affinity {
            timeout_s: Some(10800)
        }),
        "{line:?}"
    );
    assert_eq!(line.endpoints.len(), 3, "{line:?}");

    let observer = |args: &[&str]| observer(args, STICKY_SERVICE, &log);
    // Judged on stickiness: 30 of 30 on one pod is what affinity is for.
    let (code, stdout) = observer(&["check", "--max-skew", "1.5"]);
    assert_eq!(code, Some(0), "{stdout}");
    let (code, stdout) = observer(&["summary"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "session affinity (ClientIP, 10800 s): 1 client, 0 connections to another backend"
        ),
        "{stdout}"
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn external_traffic_policy_local_iptables() {
    local_policy(RuleMode::Iptables, "etpi");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn external_traffic_policy_local_nftables() {
    local_policy(RuleMode::Nftables, "etpn");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn client_ip_affinity_iptables() {
    affinity(RuleMode::Iptables, "affi");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn client_ip_affinity_nftables() {
    affinity(RuleMode::Nftables, "affn");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn internal_traffic_policy_local_iptables() {
    internal_policy(RuleMode::Iptables, "itpi");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn internal_traffic_policy_local_nftables() {
    internal_policy(RuleMode::Nftables, "itpn");
}
