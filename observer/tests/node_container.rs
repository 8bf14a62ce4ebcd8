//! Root tests of observer in and around kind-like node containers (issue 22, item 3;
//! README "On a kind cluster", paths 1 and 2). Each node is the lab's node namespace in a
//! [`NodeContainer`]: a PID namespace whose PID 1 is the node's init with the pods'
//! processes in it, a root holding the node's iptables and nft and the pods' sandbox
//! bundles where containerd keeps them, a cgroup namespace, and a UTS namespace with the
//! node's hostname.
//!
//! - The static binary copied into one node (`docker cp`) and run there through setns
//!   into all of its namespaces and its cgroup (`docker exec`): `rules` lists the node's
//!   rules, and `record` records every connection exactly (against `conntrack -E`), names
//!   each by Service and both ends by `namespace/pod`, and counts host-network clients
//!   of the node both ways.
//! - One static binary on the "docker host" outside two such nodes: each node's
//!   connections are exact, named from that node's own rules (the nodes' rules differ),
//!   and their pods named from that node's bundles, read through `/proc/<init>/root`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output, Stdio};

use common::empty_root::static_binary;
use common::host_client::{HostClientRun, python_args, route_service_range};
use common::pods::assert_named_by_bundles;
use common::{
    Recorder, assert_same_decisions, netns_inode, only_node, prefix, require_root, service_line,
};
use observer::model::record::{Close, ConnRecord, Proto, Recording, ServiceRecord};
use observer_lab::{
    ConntrackWatch, Lab, LabConfig, NodeContainer, RuleMode, Topology, http_fresh, http_keepalive,
    udp_queries,
};

/// Runs `command` in the node (`docker exec`) and waits for its output.
fn exec(node: &NodeContainer, command: &mut Command) -> Output {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    node.exec(command).unwrap().wait_with_output().unwrap()
}

/// The `service` lines `observer rules -o json` printed.
fn rules_lines(out: &Output) -> Vec<ServiceRecord> {
    assert!(
        out.status.success(),
        "observer rules: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Recording::parse("observer rules", &String::from_utf8_lossy(&out.stdout))
        .unwrap()
        .services
}

/// What the pod client's connections must be named: by the client's port, the pod
/// that answered it.
type Answered = BTreeMap<(Proto, u16), String>;

/// Fresh HTTP connections, one keep-alive connection and UDP queries from the lab's
/// client pod through its Services; returns who answered each, and how many
/// connections that made.
fn pod_traffic(lab: &Lab) -> (Answered, usize) {
    let checkout = lab.service("checkout").unwrap().cluster_addr();
    let dns = lab.service("kube-dns").unwrap().cluster_addr();
    let mut answered = Answered::new();
    let fresh = http_fresh(lab, checkout, 6).unwrap();
    let keepalive = http_keepalive(lab, checkout, 10).unwrap();
    let udp = udp_queries(lab, dns, 4).unwrap();
    for answer in fresh.iter().chain(&keepalive) {
        answered.insert((Proto::Tcp, answer.client_port), answer.pod.clone());
    }
    for answer in &udp {
        answered.insert((Proto::Udp, answer.client_port), answer.pod.clone());
    }
    (answered, fresh.len() + 1 + udp.len())
}

/// The pod client's connections among `conns` (its address is the lab's client pod's).
fn from_client_pod(lab: &Lab, conns: &[ConnRecord]) -> Vec<ConnRecord> {
    let client = std::net::IpAddr::V4(lab.client_pod().ip);
    conns
        .iter()
        .filter(|c| c.client.ip() == client)
        .cloned()
        .collect()
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn exec_into_a_node_container_it_reads_the_rules_and_records_and_names_every_connection() {
    require_root();
    let lab = Lab::up_in_node_container(LabConfig {
        topology: Topology::Routed,
        rules: RuleMode::Iptables,
        prefix: prefix("nci"),
    })
    .expect("lab up in a node container");
    let node = lab.node_container().unwrap();
    route_service_range(&lab);
    let observer = node.copy_in(&static_binary(), "observer").unwrap();
    let inode = netns_inode(lab.node_ns());

    // The node's init is PID 1 inside, the pods' processes are in its PID namespace, and
    // the node's hostname is its own.
    let inside = exec(
        node,
        Command::new("/bin/sh").args(["-c", "cat /proc/1/cmdline; echo; ls /proc; hostname"]),
    );
    let inside = String::from_utf8_lossy(&inside.stdout).into_owned();
    assert!(inside.starts_with("sleep\0infinity\0\n"), "{inside:?}");
    let pids = inside
        .split_whitespace()
        .filter(|e| e.parse::<u32>().is_ok())
        .count();
    assert!(pids > 2 * lab.pods().len(), "{inside}");
    assert_eq!(inside.lines().last(), Some(node.hostname()));

    // `rules`: the node's own, and only its (no other namespace is visible inside).
    let services = rules_lines(&exec(
        node,
        Command::new(&observer).args(["rules", "-o", "json"]),
    ));
    let named: BTreeSet<(u32, &str)> = services
        .iter()
        .map(|s| (s.netns, s.service.as_str()))
        .collect();
    let expected: BTreeSet<(u32, String)> = lab
        .services()
        .iter()
        .map(|s| (inode, s.port_name_string()))
        .collect();
    assert_eq!(
        named,
        expected.iter().map(|(i, s)| (*i, s.as_str())).collect()
    );

    // `record`, exec'd into the node: pod clients and a host-network client of the node.
    let watch = ConntrackWatch::start(lab.node_ns()).unwrap();
    let mut command = Command::new(&observer);
    command.args(["record", "--write", "/conns.jsonl", "--idle-timeout", "1"]);
    let recorder = Recorder::spawn_with(command, node.root().join("conns.jsonl"), |command| {
        node.exec(command)
    });
    let (answered, made) = pod_traffic(&lab);
    let host_client = HostClientRun::parse(&exec(
        node,
        Command::new("/usr/bin/python3").args(python_args(&lab)),
    ));
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let mut recording = recorder.stop();
    let events = watch.stop().unwrap();
    let summary = recording.summary.clone().unwrap();
    assert_eq!((summary.lost_events, summary.lost_connections), (0, 0));
    only_node(&mut recording, lab.node_ns());

    let conns: Vec<&ConnRecord> = recording.conns.iter().collect();
    assert_same_decisions(&conns, &events, lab.node_ns());
    assert_eq!(conns.len(), made + 2, "{conns:?}");
    let pods = lab.pod_names();
    let pod_conns = from_client_pod(&lab, &recording.conns);
    assert_eq!(pod_conns.len(), made);
    assert_named_by_bundles(&pod_conns, &answered, &pods);
    host_client.assert_recorded(&lab, &conns, Close::Timeout);
    for conn in &conns {
        let backend = match conn.backend.ip() {
            std::net::IpAddr::V4(ip) => pods.get(&ip).map(String::as_str),
            std::net::IpAddr::V6(_) => None,
        };
        assert_eq!(conn.backend_pod.as_deref(), backend, "{conn:?}");
        assert!(conn.service.is_some(), "{conn:?}");
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn one_observer_on_the_host_names_each_nodes_connections_from_that_node() {
    require_root();
    let mut nodes = [
        Lab::up_in_node_container(LabConfig {
            topology: Topology::Bridged,
            rules: RuleMode::Iptables,
            prefix: prefix("nca"),
        })
        .expect("lab up in a node container"),
        Lab::up_in_node_container(LabConfig {
            topology: Topology::Routed,
            rules: RuleMode::Nftables,
            prefix: prefix("ncb"),
        })
        .expect("lab up in a node container"),
    ];
    // The nodes' rules differ: the second node's checkout has lost a pod.
    let removed = nodes[1].pods()[2].ip;
    nodes[1]
        .remove_endpoint("shop/checkout:http", removed)
        .unwrap();

    // `rules` on the host: each node's namespace with its own endpoints.
    let out = Command::new(static_binary())
        .args(["rules", "-o", "json"])
        .output()
        .unwrap();
    let services = rules_lines(&out);
    for lab in &nodes {
        let expected = lab.service("checkout").unwrap().endpoint_addrs();
        let listed: Vec<std::net::SocketAddr> =
            service_line(&services, netns_inode(lab.node_ns()), "shop/checkout:http")
                .endpoints
                .iter()
                .map(|e| e.addr)
                .collect();
        assert_eq!(
            listed,
            expected
                .into_iter()
                .map(std::net::SocketAddr::V4)
                .collect::<Vec<_>>()
        );
    }

    // `record` on the host, with no runtime root given: pods are named only from the
    // bundles in each node's root.
    let dir = tempfile::tempdir().unwrap();
    let watches: Vec<ConntrackWatch> = nodes
        .iter()
        .map(|lab| ConntrackWatch::start(lab.node_ns()).unwrap())
        .collect();
    let output = dir.path().join("conns.jsonl");
    let mut command = Command::new(static_binary());
    command
        .args(["record", "--idle-timeout", "1", "--write"])
        .arg(&output);
    let recorder = Recorder::spawn(command, output);
    let traffic: Vec<(Answered, usize)> = nodes.iter().map(pod_traffic).collect();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let recording = recorder.stop();
    let summary = recording.summary.clone().unwrap();
    assert_eq!((summary.lost_events, summary.lost_connections), (0, 0));

    for ((lab, watch), (answered, made)) in nodes.iter().zip(watches).zip(&traffic) {
        let inode = netns_inode(lab.node_ns());
        let events = watch.stop().unwrap();
        let conns: Vec<&ConnRecord> = recording
            .conns
            .iter()
            .filter(|c| c.netns == inode)
            .collect();
        assert_same_decisions(&conns, &events, lab.node_ns());
        assert_eq!(conns.len(), *made, "{}: {conns:?}", lab.node_ns());
        let owned: Vec<ConnRecord> = conns.iter().map(|c| (*c).clone()).collect();
        assert_named_by_bundles(&owned, answered, &lab.pod_names());
        // Named from this node's rules: every backend is one of its endpoints.
        let endpoints = lab.service("checkout").unwrap().endpoint_addrs();
        for conn in conns.iter().filter(|c| c.proto == Proto::Tcp) {
            assert_eq!(conn.service.as_deref(), Some("shop/checkout:http"));
            assert_eq!(conn.endpoint_in_rules, Some(true), "{conn:?}");
            assert!(
                endpoints
                    .iter()
                    .any(|e| std::net::SocketAddr::V4(*e) == conn.backend),
                "{conn:?}"
            );
        }
        let service = service_line(&recording.services, inode, "shop/checkout:http");
        let pods = lab.pod_names();
        let listed: Vec<(std::net::SocketAddr, Option<&str>)> = service
            .endpoints
            .iter()
            .map(|e| (e.addr, e.pod.as_deref()))
            .collect();
        let expected: Vec<(std::net::SocketAddr, Option<&str>)> = endpoints
            .iter()
            .map(|e| {
                (
                    std::net::SocketAddr::V4(*e),
                    pods.get(e.ip()).map(String::as_str),
                )
            })
            .collect();
        assert_eq!(listed, expected, "{}", lab.node_ns());
    }
}
