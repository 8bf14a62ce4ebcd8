//! Root tests of pod names from hostnames (issue 11, "Pods by name", the fallback): every
//! lab pod runs a pause process in a UTS namespace whose hostname is the pod's name. With
//! no runtime bundles, `client_pod` and `backend_pod` are those hostnames; with bundles,
//! the bundles' `namespace/pod` wins.

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{ConnRecord, Proto};
use observer_lab::{Lab, LabConfig, RuleMode, Topology, http_fresh, udp_queries};

/// Records 6 fresh HTTP connections and 4 UDP queries through the Services; returns the
/// connections and, per answer, the pod that answered (by client port).
fn record(lab: &Lab) -> (Vec<ConnRecord>, BTreeMap<(Proto, u16), String>) {
    let dir = tempfile::tempdir().unwrap();
    let runtime_root = lab.runtime_root();
    let recorder = Recorder::start(
        dir.path(),
        &[
            "--idle-timeout",
            "1",
            "--runtime-root",
            runtime_root.to_str().unwrap(),
        ],
    );
    let checkout = lab.service("checkout").unwrap().cluster_addr();
    let dns = lab.service("kube-dns").unwrap().cluster_addr();
    let mut answered = BTreeMap::new();
    for answer in http_fresh(lab, checkout, 6).unwrap() {
        answered.insert((Proto::Tcp, answer.client_port), answer.pod);
    }
    for answer in udp_queries(lab, dns, 4).unwrap() {
        answered.insert((Proto::Udp, answer.client_port), answer.pod);
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());
    assert_eq!(recording.conns.len(), 10, "{:?}", recording.conns);
    (recording.conns, answered)
}

fn lab_config(tag: &str) -> LabConfig {
    LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Nftables,
        prefix: prefix(tag),
    }
}

#[test]
fn without_bundles_pods_are_named_by_their_hostnames() {
    require_root();
    let lab = Lab::up_without_runtime_bundles(lab_config("hn")).expect("lab up");
    assert!(!lab.runtime_root().exists());
    let (conns, answered) = record(&lab);
    for conn in &conns {
        let pod = &answered[&(conn.proto, conn.client.port())];
        assert_eq!(conn.client_pod.as_deref(), Some("client"), "{conn:?}");
        assert_eq!(conn.backend_pod.as_deref(), Some(pod.as_str()), "{conn:?}");
    }
}

#[test]
fn bundles_win_over_hostnames() {
    require_root();
    let lab = Lab::up(lab_config("hb")).expect("lab up");
    let (conns, answered) = record(&lab);
    let pods = lab.pod_names();
    let pod_of = |addr: SocketAddr| match addr.ip() {
        IpAddr::V4(ip) => pods.get(&ip).cloned(),
        IpAddr::V6(_) => None,
    };
    for conn in &conns {
        let pod = &answered[&(conn.proto, conn.client.port())];
        let namespace = match conn.proto {
            Proto::Tcp => "shop",
            Proto::Udp => "kube-system",
        };
        assert_eq!(
            conn.client_pod.as_deref(),
            Some("default/client"),
            "{conn:?}"
        );
        assert_eq!(
            conn.backend_pod,
            Some(format!("{namespace}/{pod}")),
            "{conn:?}"
        );
        assert_eq!(conn.backend_pod, pod_of(conn.backend), "{conn:?}");
    }
}
