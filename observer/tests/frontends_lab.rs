//! Root tests for "which frontend" and pods by name: the same Service reached through its
//! ClusterIP and through its NodePort (30080 on the node's address), in both rule
//! formats. Every record must say `frontend` exactly (`cluster_ip` / `node_port`), name
//! the client and backend pods from the runtime state the lab writes as containerd does,
//! and the summary must count the connections per frontend.

mod common;

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4};

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{FrontendKind, Proto};
use observer_lab::spec::NODE_IP;
use observer_lab::{Lab, LabConfig, RuleMode, Topology, http_fresh};

fn frontends(topology: Topology, rules: RuleMode, tag: &str) {
    require_root();
    let lab = Lab::up(LabConfig {
        topology,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    let checkout = lab.service("checkout").unwrap();
    let cluster = checkout.cluster_addr();
    let node_port = SocketAddrV4::new(NODE_IP, checkout.node_port.expect("a NodePort"));
    let dir = tempfile::tempdir().unwrap();
    let runtime_root = lab.runtime_root();
    let recorder = Recorder::start(
        dir.path(),
        &["--runtime-root", runtime_root.to_str().unwrap()],
    );
    let via_cluster = http_fresh(&lab, cluster, 6).unwrap();
    let via_node_port = http_fresh(&lab, node_port, 4).unwrap();
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());

    // By client port and dialed address: the kernel may give a client port of the
    // ClusterIP batch to the NodePort batch again.
    let by_port: HashMap<(u16, SocketAddr), _> = recording
        .conns
        .iter()
        .filter(|c| c.proto == Proto::Tcp)
        .map(|c| ((c.client.port(), c.original_dst), c))
        .collect();
    assert_eq!(recording.conns.len(), 10, "{:#?}", recording.conns);
    for (answers, dialed, frontend) in [
        (&via_cluster, cluster, FrontendKind::ClusterIp),
        (&via_node_port, node_port, FrontendKind::NodePort),
    ] {
        for answer in answers {
            let conn = by_port[&(answer.client_port, SocketAddr::V4(dialed))];
            assert_eq!(conn.original_dst, SocketAddr::V4(dialed), "{conn:?}");
            assert_eq!(conn.service.as_deref(), Some("shop/checkout:http"));
            assert_eq!(conn.frontend, Some(frontend), "{conn:?}");
            assert_eq!(conn.client_pod.as_deref(), Some("default/client"));
            assert_eq!(
                conn.backend_pod.as_deref(),
                Some(format!("shop/{}", answer.pod).as_str())
            );
        }
    }

    // The Service line names every endpoint's pod, also those that got nothing.
    let pods = lab.pod_names();
    let line = recording
        .services
        .iter()
        .rfind(|s| s.service == "shop/checkout:http")
        .expect("a service line");
    for endpoint in &line.endpoints {
        let SocketAddr::V4(addr) = endpoint.addr else {
            panic!("{endpoint:?}");
        };
        assert_eq!(endpoint.pod.as_ref(), pods.get(addr.ip()), "{endpoint:?}");
    }
    assert_eq!(line.endpoints.len(), 3);

    // What `observer summary` prints, for this lab's node only (other labs may run).
    let services = observer::stats::Aggregator::from_recording(&recording).services();
    let text =
        observer::report::summary::render("conns.jsonl", recording.summary.as_ref(), &services);
    assert!(
        text.contains("  frontends: ClusterIP 6, NodePort 4\n"),
        "{text}"
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn iptables_bridged_cluster_ip_and_node_port() {
    frontends(Topology::Bridged, RuleMode::Iptables, "di");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_routed_cluster_ip_and_node_port() {
    frontends(Topology::Routed, RuleMode::Nftables, "dn");
}
