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
//! - CRI-O writes `io.kubernetes.cri-o.ContainerType: sandbox`, `io.kubernetes.pod.name`
//!   and `io.kubernetes.pod.namespace` into the same OCI spec, kept as
//!   `/run/containers/storage/overlay-containers/<id>/userdata/config.json`.
//!
//! Containers other than sandboxes carry the same pod annotations but share the
//! sandbox's netns, so only sandboxes are read. A sandbox without a netns path
//! (hostNetwork pods) has the node's addresses and is not named.

use std::collections::HashMap;
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
}
