//! Root tests of pod names from hostnames (issue 11, "Pods by name", the fallback): every
//! lab pod runs a pause process in a UTS namespace whose hostname is the pod's name. With
//! no runtime bundles, `client_pod` and `backend_pod` are those hostnames; with bundles,
//! the bundles' `namespace/pod` wins.

mod common;

use common::pods::{assert_named_by_bundles, record};
use common::{prefix, require_root};
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

fn lab_config(tag: &str) -> LabConfig {
    LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Nftables,
        prefix: prefix(tag),
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn without_bundles_pods_are_named_by_their_hostnames() {
    require_root();
    let lab = Lab::up_without_runtime_bundles(lab_config("hn")).expect("lab up");
    assert!(!lab.runtime_root().exists());
    let (conns, answered) = record(&lab, Some(&lab.runtime_root()));
    for conn in &conns {
        let pod = &answered[&(conn.proto, conn.client.port())];
        assert_eq!(conn.client_pod.as_deref(), Some("client"), "{conn:?}");
        assert_eq!(conn.backend_pod.as_deref(), Some(pod.as_str()), "{conn:?}");
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn bundles_win_over_hostnames() {
    require_root();
    let lab = Lab::up(lab_config("hb")).expect("lab up");
    let (conns, answered) = record(&lab, Some(&lab.runtime_root()));
    let pods = lab.pod_names();
    assert_named_by_bundles(&conns, &answered, &pods);
}
