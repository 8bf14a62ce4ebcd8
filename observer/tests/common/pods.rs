//! Traffic for the pod-name tests: fresh HTTP connections and UDP queries through the
//! lab's Services, recorded by observer reading sandbox bundles under a runtime root.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use observer::model::record::{ConnRecord, Proto};
use observer_lab::{Lab, http_fresh, udp_queries};

use super::{Recorder, only_node};

/// Records 6 fresh HTTP connections and 4 UDP queries through the Services with
/// `--runtime-root runtime_root` (None: observer's default roots); returns the
/// connections and, per answer, the pod that answered (by protocol and client port).
pub fn record(
    lab: &Lab,
    runtime_root: Option<&Path>,
) -> (Vec<ConnRecord>, BTreeMap<(Proto, u16), String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--idle-timeout", "1"];
    if let Some(root) = runtime_root {
        args.extend(["--runtime-root", root.to_str().unwrap()]);
    }
    let recorder = Recorder::start(dir.path(), &args);
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

/// Every connection names its client `default/client` and its backend
/// `<namespace>/<pod>`, the pod that answered it and the one `pods` (the lab's pod per
/// address) names: what the lab's sandbox bundles say.
pub fn assert_named_by_bundles(
    conns: &[ConnRecord],
    answered: &BTreeMap<(Proto, u16), String>,
    pods: &BTreeMap<Ipv4Addr, String>,
) {
    let pod_of = |ip: IpAddr| match ip {
        IpAddr::V4(ip) => pods.get(&ip).cloned(),
        IpAddr::V6(_) => None,
    };
    for conn in conns {
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
            conn.backend_pod.as_deref(),
            Some(format!("{namespace}/{pod}").as_str()),
            "{conn:?}"
        );
        assert_eq!(
            conn.backend_pod.as_deref(),
            pod_of(conn.backend.ip()).as_deref(),
            "{conn:?}"
        );
    }
}
