//! Root test (issue 28): two kind-like nodes on one host whose rules give the same
//! Service different endpoint sets (node A three checkout pods, node B two, as while a
//! node's kube-proxy lags behind a rollout). One observer sees both: each node's
//! connections match its own `conntrack -E` and its clients' own record, are named with
//! `endpoint_in_rules: true`, and each node's Service line carries that node's shares
//! (1/3 on A, 1/2 on B). A ClientIP-affinity Service whose nodes pick different pods for
//! the same client address (each node's client pod is 10.244.1.9) is no switch: each
//! node keeps its own affinity, and `check` judges it so.

mod common;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;

use common::{Recorder, assert_same_decisions, netns_inode, prefix, require_root, service_line};
use observer_lab::{
    ConntrackWatch, Lab, LabConfig, RuleMode, Service, Topology, Traffic, http_fresh,
};

const CHECKOUT: &str = "shop/checkout:http";
const STICKY: &str = "shop/sticky:http";

/// `shop/sticky:http` at 10.96.35.232 on the lab's pods called `pods`.
fn sticky(lab: &Lab, pods: &[&str]) -> Service {
    let checkout = lab.service("checkout").unwrap();
    Service {
        name: "sticky".into(),
        cluster_ip: Ipv4Addr::new(10, 96, 35, 232),
        node_port: None,
        endpoints: lab
            .pods()
            .iter()
            .filter(|p| pods.contains(&p.name.as_str()))
            .cloned()
            .collect(),
        traffic: Traffic {
            external_local: false,
            affinity_timeout_s: Some(10800),
            ..Traffic::default()
        },
        ..checkout.clone()
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn each_node_is_judged_against_its_own_endpoints() {
    require_root();
    let mut a = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: prefix("nea"),
    })
    .expect("lab up");
    let mut b = Lab::up(LabConfig {
        topology: Topology::Routed,
        rules: RuleMode::Nftables,
        prefix: prefix("neb"),
    })
    .expect("lab up");
    let gone = b.service("checkout").unwrap().endpoints[2].clone();
    b.remove_endpoint(CHECKOUT, gone.ip).unwrap();
    a.add_service(sticky(&a, &["checkout-a", "checkout-b"]))
        .unwrap();
    b.add_service(sticky(&b, &["checkout-c"])).unwrap();
    let nodes = [a, b];

    let dir = tempfile::tempdir().unwrap();
    let watches: Vec<ConntrackWatch> = nodes
        .iter()
        .map(|lab| ConntrackWatch::start(lab.node_ns()).unwrap())
        .collect();
    let recorder = Recorder::start(dir.path(), &[]);
    let mut answers = Vec::new();
    for lab in &nodes {
        let checkout = lab.service("checkout").unwrap().cluster_addr();
        answers.push(http_fresh(lab, checkout, 12).unwrap());
    }
    // The same client address on both nodes, alternating: each stays on its node's pick.
    let mut sticky_answers = [Vec::new(), Vec::new()];
    for _ in 0..5 {
        for (lab, got) in nodes.iter().zip(&mut sticky_answers) {
            let to = lab.service("sticky").unwrap().cluster_addr();
            got.extend(http_fresh(lab, to, 1).unwrap());
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let log = recorder.output.clone();
    let recording = recorder.stop();
    let events: Vec<_> = watches.into_iter().map(|w| w.stop().unwrap()).collect();
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);

    for (((lab, conntrack), answers), sticky_answers) in
        nodes.iter().zip(&events).zip(&answers).zip(&sticky_answers)
    {
        let node = lab.node_ns();
        let inode = netns_inode(node);
        let conns: Vec<_> = recording
            .conns
            .iter()
            .filter(|c| c.netns == inode)
            .collect();
        assert_same_decisions(&conns, conntrack, node);
        assert_eq!(conns.len(), 12 + 5, "{node}: {conns:#?}");
        let checkout = lab.service("checkout").unwrap();
        let endpoints: Vec<SocketAddr> = checkout
            .endpoint_addrs()
            .into_iter()
            .map(SocketAddr::V4)
            .collect();
        let serving: BTreeSet<&str> = checkout.endpoints.iter().map(|p| p.name.as_str()).collect();
        for answer in answers {
            assert!(serving.contains(answer.pod.as_str()), "{node}: {answer:?}");
            let conn = conns
                .iter()
                .find(|c| {
                    c.client.port() == answer.client_port
                        && c.original_dst == SocketAddr::V4(checkout.cluster_addr())
                })
                .unwrap_or_else(|| panic!("{node}: no record of {answer:?}"));
            assert_eq!(
                (conn.service.as_deref(), conn.endpoint_in_rules),
                (Some(CHECKOUT), Some(true)),
                "{conn:?}"
            );
            assert!(endpoints.contains(&conn.backend), "{conn:?}");
        }
        let pods: BTreeSet<&str> = sticky_answers.iter().map(|a| a.pod.as_str()).collect();
        assert_eq!(pods.len(), 1, "{node}: {sticky_answers:?}");
        for conn in conns
            .iter()
            .filter(|c| c.service.as_deref() == Some(STICKY))
        {
            assert_eq!(conn.endpoint_in_rules, Some(true), "{conn:?}");
        }
        // The node's own rules, with its own endpoint count.
        let line = service_line(&recording.services, inode, CHECKOUT);
        let got: Vec<SocketAddr> = line.endpoints.iter().map(|e| e.addr).collect();
        assert_eq!(got, endpoints, "{node}: {line:?}");
        let share = 1.0 / endpoints.len() as f64;
        for endpoint in &line.endpoints {
            assert!(
                (endpoint.expected_share - share).abs() < 1e-9,
                "{node}: {line:?}"
            );
        }
    }
    // The two nodes' shares differ: 3 endpoints on A, 2 on B.
    assert_eq!(
        nodes
            .iter()
            .map(|lab| lab.service("checkout").unwrap().endpoints.len())
            .collect::<Vec<_>>(),
        [3, 2]
    );

    let observer = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_observer"))
            .args(args)
            .arg(&log)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, stdout) = observer(&[
        "check",
        "--max-stale",
        "0",
        "--max-skew",
        "1.5",
        "--service",
        STICKY,
    ]);
    assert_eq!(code, Some(0), "{stdout}");
    let (code, stdout) = observer(&["summary", "--service", STICKY]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "session affinity (ClientIP, 10800 s): 2 clients, 0 connections to another backend"
        ),
        "{stdout}"
    );
    let (code, stdout) = observer(&["check", "--max-stale", "0", "--service", CHECKOUT]);
    assert_eq!(code, Some(0), "{stdout}");
}
