//! Pods by name, from the node's container runtime state (no API server): which pod
//! (`namespace/name`) owns an address. Pure parsing and bookkeeping; `pod_source` walks
//! the runtime's directories and reads addresses inside each pod's network namespace.
//!
//! Where the names come from (followed from the runtimes' sources):
//! - containerd's CRI plugin (`internal/cri/annotations/annotations.go`,
//!   `DefaultCRIAnnotations`) writes into every sandbox's OCI spec the annotations
//!   `io.kubernetes.cri.container-type: sandbox`, `io.kubernetes.cri.sandbox-name` and
//!   `io.kubernetes.cri.sandbox-namespace`; its runc shim keeps that spec as the bundle's
//!   `config.json` under `/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/`.
//!   The spec's `linux.namespaces` entry of type `network` carries the path of the netns
//!   that the CNI plugin configured (`/var/run/netns/cni-<uuid>`).
//!   containerd 1.6, 1.7 and 2.x lay it out alike (`containerd_tests`).
//! - CRI-O writes `io.kubernetes.cri-o.ContainerType: sandbox`, `io.kubernetes.pod.name`
//!   and `io.kubernetes.pod.namespace` into the same OCI spec, kept as
//!   `/run/containers/storage/overlay-containers/<id>/userdata/config.json`.
//!
//! Containers other than sandboxes carry the same pod annotations but share the
//! sandbox's netns, so only sandboxes are read. A sandbox without a netns path
//! (hostNetwork pods) has the node's addresses and is not named.
//!
//! Fallback where no bundle names a netns: the UTS hostname of a process in it. Kubelet
//! gives every pod sandbox a UTS namespace whose hostname is the pod's name, but the
//! hostname does not say the pod's Kubernetes namespace, so such a pod is named by the
//! hostname alone (`checkout-a`). A bundle's `namespace/name` wins over a hostname for
//! the same address. The node's own hostname (host-network processes) names no pod.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// One pod sandbox as its bundle describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    pub namespace: String,
    pub name: String,
    /// The network namespace's path as the runtime sees it (inside the node's root).
    pub netns: Option<PathBuf>,
}

impl Sandbox {
    /// `namespace/name`, as records show it.
    pub fn pod(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A bundle that names no pod although it should.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BundleError {
    #[error("not an OCI runtime spec: {0}")]
    Json(String),
    #[error("a pod sandbox without the annotation {0}")]
    MissingAnnotation(&'static str),
}

/// The processes of one netns disagree on its pod: their hostnames (sorted, distinct).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("processes with different hostnames ({}) share it: not named", .0.join(", "))]
pub struct AmbiguousHostnames(pub Vec<String>);

#[derive(Deserialize)]
struct Spec {
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    linux: Option<Linux>,
}

#[derive(Deserialize)]
struct Linux {
    #[serde(default)]
    namespaces: Vec<Namespace>,
}

#[derive(Deserialize)]
struct Namespace {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: Option<String>,
}

/// (container-type key, pod name key, pod namespace key) per runtime.
const RUNTIMES: [(&str, &str, &str); 2] = [
    (
        "io.kubernetes.cri.container-type",
        "io.kubernetes.cri.sandbox-name",
        "io.kubernetes.cri.sandbox-namespace",
    ),
    (
        "io.kubernetes.cri-o.ContainerType",
        "io.kubernetes.pod.name",
        "io.kubernetes.pod.namespace",
    ),
];

/// Parses one bundle's `config.json`: `Ok(None)` for anything but a pod sandbox.
pub fn parse_bundle(text: &str) -> Result<Option<Sandbox>, BundleError> {
    let spec: Spec = serde_json::from_str(text).map_err(|e| BundleError::Json(e.to_string()))?;
    let Some((_, name_key, namespace_key)) = RUNTIMES
        .iter()
        .find(|(kind, _, _)| spec.annotations.get(*kind).map(String::as_str) == Some("sandbox"))
    else {
        return Ok(None);
    };
    let annotation = |key: &'static str| {
        spec.annotations
            .get(key)
            .filter(|value| !value.is_empty())
            .cloned()
            .ok_or(BundleError::MissingAnnotation(key))
    };
    let netns = spec
        .linux
        .iter()
        .flat_map(|linux| &linux.namespaces)
        .find(|ns| ns.kind == "network")
        .and_then(|ns| ns.path.as_deref())
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    let name = annotation(name_key)?;
    Ok(Some(Sandbox {
        namespace: annotation(namespace_key)?,
        name,
        netns,
    }))
}

/// Whether an address can identify a pod: not loopback, unspecified or IPv6 link-local
/// (every netns has those).
pub fn is_pod_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_unspecified() && !v4.is_link_local(),
        IpAddr::V6(v6) => {
            !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

/// What one pass over the runtime state found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodScan {
    /// Address -> `namespace/name`.
    pub pods: HashMap<IpAddr, String>,
    /// Bundles or namespaces that could not be read or parsed, with why (path: cause).
    pub skipped: Vec<String>,
}

impl PodScan {
    /// Adds a sandbox's addresses; the link-local and loopback ones are left out.
    pub fn add(&mut self, sandbox: &Sandbox, addresses: &[IpAddr]) {
        for ip in addresses.iter().copied().filter(|ip| is_pod_address(*ip)) {
            self.pods.insert(ip, sandbox.pod());
        }
    }

    /// Adds the addresses of a netns that no bundle names, by the hostname of its pod.
    /// Never replaces a name already there ([`PodScan::add`] replaces this one), so a
    /// bundle's `namespace/name` wins whichever is added first.
    pub fn add_by_hostname(&mut self, hostname: &str, addresses: &[IpAddr]) {
        for ip in addresses.iter().copied().filter(|ip| is_pod_address(*ip)) {
            self.pods.entry(ip).or_insert_with(|| hostname.to_owned());
        }
    }
}

/// The pod name that the hostnames of the processes in one netns give (`candidates`, one
/// per UTS namespace seen there): the one hostname that is neither empty nor one of the
/// node's own. `Ok(None)` when there is none; an error when several differ (no guess).
pub fn pod_from_hostnames(
    candidates: &[String],
    node_hostnames: &HashSet<String>,
) -> Result<Option<String>, AmbiguousHostnames> {
    let mut names: Vec<&String> = candidates
        .iter()
        .filter(|name| !name.is_empty() && !node_hostnames.contains(*name))
        .collect();
    names.sort();
    names.dedup();
    match names.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((*one).clone())),
        several => Err(AmbiguousHostnames(
            several.iter().map(|s| (*s).clone()).collect(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox bundle as containerd's CRI plugin writes it (trimmed).
    fn containerd_sandbox(namespace: &str, name: &str, netns: &str) -> String {
        serde_json::json!({
            "ociVersion": "1.1.0",
            "process": {"args": ["/pause"]},
            "annotations": {
                "io.kubernetes.cri.container-type": "sandbox",
                "io.kubernetes.cri.sandbox-id": "0123456789abcdef",
                "io.kubernetes.cri.sandbox-name": name,
                "io.kubernetes.cri.sandbox-namespace": namespace,
                "io.kubernetes.cri.sandbox-uid": "c0ffee",
            },
            "linux": {"namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "network", "path": netns},
            ]},
        })
        .to_string()
    }

    #[test]
    fn containerd_sandbox_names_the_pod_and_its_netns() {
        let text = containerd_sandbox("shop", "checkout-7d4b9c-x2x4k", "/var/run/netns/cni-1a2b");
        let sandbox = parse_bundle(&text).unwrap().unwrap();
        assert_eq!(sandbox.pod(), "shop/checkout-7d4b9c-x2x4k");
        assert_eq!(
            sandbox.netns,
            Some(PathBuf::from("/var/run/netns/cni-1a2b"))
        );
    }

    #[test]
    fn crio_sandbox_names_the_pod() {
        let text = r#"{"annotations":{"io.kubernetes.cri-o.ContainerType":"sandbox",
            "io.kubernetes.pod.name":"coredns-5d78c9869d-abcde","io.kubernetes.pod.namespace":"kube-system"},
            "linux":{"namespaces":[{"type":"network","path":"/var/run/netns/2f1e"}]}}"#;
        let sandbox = parse_bundle(text).unwrap().unwrap();
        assert_eq!(sandbox.pod(), "kube-system/coredns-5d78c9869d-abcde");
        assert_eq!(sandbox.netns, Some(PathBuf::from("/var/run/netns/2f1e")));
    }

    #[test]
    fn containers_and_foreign_bundles_are_not_sandboxes() {
        let container = containerd_sandbox("shop", "checkout", "/x").replace(
            r#""io.kubernetes.cri.container-type":"sandbox""#,
            r#""io.kubernetes.cri.container-type":"container""#,
        );
        assert_eq!(parse_bundle(&container), Ok(None));
        assert_eq!(parse_bundle(r#"{"ociVersion":"1.0.2"}"#), Ok(None));
        assert_eq!(parse_bundle(r#"{"annotations":{}}"#), Ok(None));
        assert_eq!(parse_bundle("[]"), Ok(None));
    }

    #[test]
    fn host_network_sandbox_has_no_netns() {
        let text = r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox",
            "io.kubernetes.cri.sandbox-name":"kube-proxy-abc","io.kubernetes.cri.sandbox-namespace":"kube-system"},
            "linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#;
        assert_eq!(parse_bundle(text).unwrap().unwrap().netns, None);
        let new_netns = text.replace(r#"{"type":"pid"}"#, r#"{"type":"network"}"#);
        assert_eq!(parse_bundle(&new_netns).unwrap().unwrap().netns, None);
    }

    #[test]
    fn malformed_bundles_are_errors_never_panics() {
        let good = containerd_sandbox("shop", "checkout", "/var/run/netns/cni-1");
        for bad in [
            "",
            "{",
            "null",
            "\u{0}\u{1}",
            r#"{"annotations":[]}"#,
            r#"{"annotations":{"io.kubernetes.cri.container-type":7}}"#,
            r#"{"annotations":{},"linux":{"namespaces":{"type":"network"}}}"#,
            r#"{"annotations":{},"linux":{"namespaces":[{"path":"/x"}]}}"#,
            &good[..good.len() / 2],
        ] {
            assert!(
                matches!(parse_bundle(bad), Err(BundleError::Json(_))),
                "{bad:?}: {:?}",
                parse_bundle(bad)
            );
        }
        let nameless = good.replace("io.kubernetes.cri.sandbox-name", "other");
        assert_eq!(
            parse_bundle(&nameless),
            Err(BundleError::MissingAnnotation(
                "io.kubernetes.cri.sandbox-name"
            ))
        );
        let empty = good.replace(
            r#""io.kubernetes.cri.sandbox-namespace":"shop""#,
            r#""io.kubernetes.cri.sandbox-namespace":"""#,
        );
        assert_eq!(
            parse_bundle(&empty),
            Err(BundleError::MissingAnnotation(
                "io.kubernetes.cri.sandbox-namespace"
            ))
        );
    }

    #[test]
    fn the_labs_bundles_read_as_containerd_sandboxes() {
        let pod = observer_lab::Pod {
            name: "checkout-a".into(),
            ns: "lab1-pod-checkout-a".into(),
            ip: std::net::Ipv4Addr::new(10, 244, 1, 12),
            http_port: 8080,
            udp_port: 5353,
        };
        let sandbox = observer_lab::runtime::bundle("lab1", &pod, true).to_string();
        let sandbox = parse_bundle(&sandbox).unwrap().unwrap();
        assert_eq!(sandbox.pod(), "shop/checkout-a");
        assert_eq!(
            sandbox.netns,
            Some(PathBuf::from("/run/netns/lab1-pod-checkout-a"))
        );
        let container = observer_lab::runtime::bundle("lab1", &pod, false).to_string();
        assert_eq!(parse_bundle(&container), Ok(None));
    }

    #[test]
    fn only_addresses_that_identify_a_pod_are_kept() {
        let sandbox = Sandbox {
            namespace: "shop".into(),
            name: "checkout-a".into(),
            netns: None,
        };
        let mut scan = PodScan::default();
        let addrs: Vec<IpAddr> = [
            "127.0.0.1",
            "::1",
            "fe80::1",
            "169.254.1.1",
            "10.244.1.12",
            "fd00:10:244:1::c",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        scan.add(&sandbox, &addrs);
        let mut kept: Vec<String> = scan.pods.keys().map(IpAddr::to_string).collect();
        kept.sort();
        assert_eq!(kept, ["10.244.1.12", "fd00:10:244:1::c"]);
        assert!(scan.pods.values().all(|pod| pod == "shop/checkout-a"));
    }

    fn set(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_one_hostname_that_is_not_the_nodes_names_the_pod() {
        let node = set(&["kind-worker", "build-host"]);
        let pick = |c: &[&str]| pod_from_hostnames(&strings(c), &node).map_err(|e| e.to_string());
        assert_eq!(pick(&["checkout-a"]), Ok(Some("checkout-a".into())));
        // The pod's server runs in the node's UTS namespace beside the pod's pause.
        assert_eq!(
            pick(&["build-host", "checkout-a", "checkout-a"]),
            Ok(Some("checkout-a".into()))
        );
        assert_eq!(pick(&[]), Ok(None));
        assert_eq!(pick(&["build-host"]), Ok(None));
        assert_eq!(pick(&["kind-worker", ""]), Ok(None));
        assert_eq!(
            pick(&["dns-a", "build-host", "checkout-a"]),
            Err(
                "processes with different hostnames (checkout-a, dns-a) share it: not named".into()
            )
        );
    }

    #[test]
    fn a_bundles_name_wins_over_a_hostname_in_either_order() {
        let sandbox = Sandbox {
            namespace: "shop".into(),
            name: "checkout-a".into(),
            netns: None,
        };
        let pod: IpAddr = "10.244.1.12".parse().unwrap();
        let other: IpAddr = "10.244.1.13".parse().unwrap();
        let mut hostname_first = PodScan::default();
        hostname_first.add_by_hostname("checkout-a", &[pod, other, "127.0.0.1".parse().unwrap()]);
        hostname_first.add(&sandbox, &[pod]);
        let mut bundle_first = PodScan::default();
        bundle_first.add(&sandbox, &[pod]);
        bundle_first.add_by_hostname("checkout-a", &[pod, other, "127.0.0.1".parse().unwrap()]);
        for scan in [hostname_first, bundle_first] {
            assert_eq!(scan.pods.len(), 2, "{scan:?}");
            assert_eq!(scan.pods[&pod], "shop/checkout-a");
            assert_eq!(scan.pods[&other], "checkout-a");
        }
    }
}
