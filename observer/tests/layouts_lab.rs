//! Root tests (issue 28): the nftables layouts kube-proxy wrote since 1.35, loaded into a
//! lab node by the lab's own kube-proxy sync (`xtask/lab/src/nftables`): 1.36's squashed
//! `dnat ip addr . port to numgen ... map` (kubernetes commit 475f9622c8), 1.37's
//! one-endpoint `dnat to` (kubernetes PR 140723, kind v0.33's default node image), and
//! the `dispatch-N`/`@endpoints` layout proposed for 1.38 (kubernetes PR 140362). Real
//! clients make fresh connections through the ClusterIP and the NodePort while endpoints
//! leave and come back (through the one-endpoint shape); every connection must be named,
//! matched to the pod that answered (the client's own record), in the rules
//! (`endpoint_in_rules: true`), and the Service lines must give each endpoint its share.
//! The same in IPv6 (kind's `ipFamily: ipv6`): `table ip6 kube-proxy` in each layout,
//! as kube-proxy's IPv6 proxier writes it, the pods named by their IPv6 addresses too.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{FrontendKind, Proto};
use observer_lab::spec::NODE_IP;
use observer_lab::{Answer, Family, Lab, LabConfig, RuleMode, Topology, http_fresh};

const SERVICE: &str = "shop/checkout:http";

/// The layout of `rules` with Services of `family` only.
fn layout(rules: RuleMode, tag: &str, family: Family) {
    require_root();
    let config = LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    };
    let mut lab = Lab::up_with_families(config, &[family]).expect("lab up");
    let checkout = lab.service("checkout").unwrap().clone();
    let cluster = checkout.cluster_addr_in(family);
    let node_port = SocketAddr::new(family.ip(NODE_IP), checkout.node_port.expect("a NodePort"));
    let pods: Vec<_> = checkout.endpoints.iter().map(|p| p.ip).collect();
    let dir = tempfile::tempdir().unwrap();
    // Pods named by the lab's sandbox bundles, which name their netns (whose IPv6
    // addresses observer reads too).
    let runtime_root = lab.runtime_root();
    let recorder = Recorder::start(
        dir.path(),
        &["--runtime-root", runtime_root.to_str().unwrap()],
    );

    let mut answers: Vec<(SocketAddr, FrontendKind, Answer)> = Vec::new();
    let mut dial = |lab: &Lab, to: SocketAddr, kind, count| {
        for answer in http_fresh(lab, to, count).unwrap() {
            answers.push((to, kind, answer));
        }
    };
    dial(&lab, cluster, FrontendKind::ClusterIp, 12);
    dial(&lab, node_port, FrontendKind::NodePort, 4);
    // observer reads a node's rules when its first connection ends; what changes
    // before that read it cannot see as a change.
    wait_for_service_line(&recorder.output);
    // Down to one endpoint (1.37 and the dispatch layout DNAT it directly), and back.
    lab.remove_endpoint(SERVICE, pods[1]).unwrap();
    lab.remove_endpoint(SERVICE, pods[2]).unwrap();
    let one = SocketAddr::new(family.ip(pods[0]), checkout.target_port);
    assert_eq!(
        full_read(lab.node_ns()),
        [(one, 1.0)],
        "observer rules, one endpoint left"
    );
    dial(&lab, cluster, FrontendKind::ClusterIp, 5);
    lab.add_endpoint(SERVICE, pods[1]).unwrap();
    lab.add_endpoint(SERVICE, pods[2]).unwrap();
    dial(&lab, cluster, FrontendKind::ClusterIp, 6);
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());

    let by_port: HashMap<(u16, SocketAddr), _> = recording
        .conns
        .iter()
        .filter(|c| c.proto == Proto::Tcp)
        .map(|c| ((c.client.port(), c.original_dst), c))
        .collect();
    assert_eq!(
        recording.conns.len(),
        answers.len(),
        "{:#?}",
        recording.conns
    );
    // The lab's pod per address of `family`.
    let pod_ips: HashMap<std::net::IpAddr, String> = lab
        .pod_names()
        .into_iter()
        .map(|(ip, pod)| (family.ip(ip), pod))
        .collect();
    for (dialed, kind, answer) in &answers {
        let conn = by_port
            .get(&(answer.client_port, *dialed))
            .unwrap_or_else(|| panic!("no record of {answer:?} to {dialed}"));
        assert_eq!(conn.service.as_deref(), Some(SERVICE), "{conn:?}");
        assert_eq!(conn.frontend, Some(*kind), "{conn:?}");
        assert_eq!(
            conn.endpoint_in_rules,
            Some(true),
            "no false stale pin: {conn:?}"
        );
        let pod = format!("shop/{}", answer.pod);
        assert_eq!(
            pod_ips.get(&conn.backend.ip()),
            Some(&pod),
            "the record's backend is the pod that answered: {conn:?}"
        );
        assert_eq!(conn.backend_pod.as_deref(), Some(pod.as_str()), "{conn:?}");
        assert_eq!(
            conn.client_pod.as_deref(),
            Some("default/client"),
            "{conn:?}"
        );
    }
    // While one endpoint was left, the rules gave it every connection.
    let single: Vec<_> = answers[16..21]
        .iter()
        .map(|(_, _, a)| a.pod.clone())
        .collect();
    assert!(single.iter().all(|p| *p == single[0]), "{single:?}");

    let last = recording
        .services
        .iter()
        .rfind(|s| s.service == SERVICE)
        .expect("a Service line");
    assert_eq!(last.endpoints.len(), 3, "{last:?}");
    assert!(
        last.frontends.iter().any(|f| f.ip == Some(cluster.ip())),
        "{last:?}"
    );
    for endpoint in &last.endpoints {
        assert!(pod_ips.contains_key(&endpoint.addr.ip()), "{last:?}");
        assert!(
            (endpoint.expected_share - 1.0 / 3.0).abs() < 1e-9,
            "{last:?}"
        );
    }
    let removed: Vec<SocketAddr> = recording
        .endpoints
        .iter()
        .filter(|e| e.service == SERVICE)
        .flat_map(|e| e.removed.clone())
        .collect();
    let added: Vec<SocketAddr> = recording
        .endpoints
        .iter()
        .filter(|e| e.service == SERVICE)
        .flat_map(|e| e.added.clone())
        .collect();
    let expected: Vec<SocketAddr> = [pods[1], pods[2]]
        .iter()
        .map(|ip| SocketAddr::new(family.ip(*ip), checkout.target_port))
        .collect();
    let sorted = |mut v: Vec<SocketAddr>| {
        v.sort();
        v
    };
    assert_eq!(sorted(removed), expected, "{:#?}", recording.endpoints);
    assert_eq!(sorted(added), expected, "{:#?}", recording.endpoints);
}

fn wait_for_service_line(log: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while observer::model::record::Recording::read(log)
        .map_or(true, |r| !r.services.iter().any(|s| s.service == SERVICE))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no Service line in 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The checkout Service's endpoints and shares, as `observer rules` reads the node.
fn full_read(node_ns: &str) -> Vec<(SocketAddr, f64)> {
    common::rules_of(node_ns)
        .into_iter()
        .find(|s| s.service == SERVICE)
        .expect("the Service in `observer rules`")
        .endpoints
        .iter()
        .map(|e| (e.addr, e.expected_share))
        .collect()
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn kube_proxy_1_36_squashed_dnat_map() {
    layout(RuleMode::Nftables136, "ly36", Family::V4);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn kube_proxy_1_37_single_endpoint_dnat() {
    layout(RuleMode::Nftables137, "ly37", Family::V4);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn proposed_dispatch_chains_and_endpoints_map() {
    layout(RuleMode::NftablesDispatch, "lydp", Family::V4);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn ipv6_kube_proxy_1_35_endpoint_chains() {
    layout(RuleMode::Nftables, "ly6v35", Family::V6);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn ipv6_kube_proxy_1_36_squashed_dnat_map() {
    layout(RuleMode::Nftables136, "ly6v36", Family::V6);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn ipv6_kube_proxy_1_37_single_endpoint_dnat() {
    layout(RuleMode::Nftables137, "ly6v37", Family::V6);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn ipv6_proposed_dispatch_chains_and_endpoints_map() {
    layout(RuleMode::NftablesDispatch, "ly6vdp", Family::V6);
}
