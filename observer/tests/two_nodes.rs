//! Root integration test: two simulated nodes on one host, as kind runs them, one in
//! iptables mode and one in nftables mode, with the same Service addresses. One
//! observer sees both: each connection is attributed to the namespace whose conntrack
//! decided it, matches that node's `conntrack -E` exactly, and is named from that
//! node's own rules, for ClusterIP and NodePort traffic alike.

mod common;

use std::net::{SocketAddr, SocketAddrV4};

use common::{Recorder, assert_same_decisions, netns_inode, prefix, require_root, service_line};
use observer::model::record::Proto;
use observer_lab::{ConntrackWatch, Lab, LabConfig, RuleMode, Topology, http_fresh};

#[test]
#[ignore = "root: run by cargo xtask test"]
fn each_node_decides_and_names_its_own_connections() {
    require_root();
    let nodes = [
        Lab::up(LabConfig {
            topology: Topology::Bridged,
            rules: RuleMode::Iptables,
            prefix: prefix("tna"),
        })
        .expect("lab up"),
        Lab::up(LabConfig {
            topology: Topology::Routed,
            rules: RuleMode::Nftables,
            prefix: prefix("tnb"),
        })
        .expect("lab up"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let watches: Vec<ConntrackWatch> = nodes
        .iter()
        .map(|lab| ConntrackWatch::start(lab.node_ns()).unwrap())
        .collect();
    let recorder = Recorder::start(dir.path(), &[]);
    let mut made = Vec::new();
    for lab in &nodes {
        let service = lab.service("checkout").unwrap();
        let node_port =
            SocketAddrV4::new("10.244.1.1".parse().unwrap(), service.node_port.unwrap());
        let cluster = http_fresh(lab, service.cluster_addr(), 4).unwrap();
        let via_node_port = http_fresh(lab, node_port, 4).unwrap();
        made.push((cluster.len(), via_node_port.len(), node_port));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let recording = recorder.stop();
    let events: Vec<_> = watches
        .into_iter()
        .map(|watch| watch.stop().unwrap())
        .collect();
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);

    for ((lab, conntrack), (cluster, via_node_port, node_port)) in
        nodes.iter().zip(&events).zip(&made)
    {
        let inode = netns_inode(lab.node_ns());
        let conns: Vec<_> = recording
            .conns
            .iter()
            .filter(|c| c.netns == inode)
            .collect();
        assert_same_decisions(&conns, conntrack, lab.node_ns());
        assert_eq!(conns.len(), cluster + via_node_port);
        let to_node_port = conns
            .iter()
            .filter(|c| c.original_dst == SocketAddr::V4(*node_port))
            .count();
        assert_eq!(to_node_port, *via_node_port, "{}", lab.node_ns());
        for conn in &conns {
            assert_eq!(
                (
                    conn.proto,
                    conn.service.as_deref(),
                    conn.endpoint_in_rules,
                    conn.requests
                ),
                (Proto::Tcp, Some("shop/checkout:http"), Some(true), 1),
                "{conn:?}"
            );
        }
        // The node's own rules define the Service, with the NodePort among its frontends.
        let service = service_line(&recording.services, inode, "shop/checkout:http");
        assert!(
            service.frontends.iter().any(|f| f.port == node_port.port()),
            "{service:?}"
        );
    }
}
