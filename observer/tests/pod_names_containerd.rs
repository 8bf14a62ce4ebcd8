//! Root tests of pod names from a real container runtime (issue 11, "Pods by name"; issue
//! 28, containerd 2.x as kind's node image runs it): Debian's containerd (bookworm's 1.6,
//! trixie's 1.7 and forky's 2.x), through its CRI plugin, runs a real sandbox for every
//! lab pod and lays out the sandbox bundles itself, as on a kind node: in its own mount namespace,
//! `/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/config.json` naming the
//! netns `/var/run/netns/cni-<uuid>`. observer runs with its defaults (no
//! `--runtime-root`) and reaches them through `/proc/<pid>/root`. The lab writes no
//! bundles, so `client_pod` and `backend_pod` can only come from containerd's.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use common::pods::{assert_named_by_bundles, record};
use common::{prefix, require_root};
use observer_lab::runtime::kube_namespace;
use observer_lab::{Containerd, Lab, LabConfig, RuleMode, Topology, UNPACKED_CONTAINERDS};

/// Bookworm's containerd, installed by `cargo xtask setup`.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn containerd_sandboxes_name_the_pods() {
    sandboxes_name_the_pods("ctd", None, "1.6.");
}

/// containerd 1.7 (kind's node images up to kind v0.26): Debian trixie's package.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn containerd_1_7_sandboxes_name_the_pods() {
    sandboxes_name_the_pods("ctd17", Some("trixie"), "1.7.");
}

/// containerd 2.x (kind's node images since kind v0.27; v0.32's base image builds
/// v2.3.1): Debian forky's package. Its CRI plugin is split into `io.containerd.cri.v1.
/// runtime` and `.images`, yet the default `podsandbox` sandboxer still runs a pause task
/// whose bundle is where 1.x put it.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn containerd_2_sandboxes_name_the_pods() {
    sandboxes_name_the_pods("ctd2", Some("forky"), "2.");
}

/// The containerd installed (`suite` None) or unpacked from Debian's `suite` (by `cargo
/// xtask setup`), whose version starts with `release`, runs every pod's sandbox; its
/// bundles alone name them.
fn sandboxes_name_the_pods(name: &str, suite: Option<&str>, release: &str) {
    require_root();
    let prefix = &prefix(name);
    let mut containerd = match suite {
        None => Containerd::start(prefix),
        Some(suite) => {
            let (_, root) = UNPACKED_CONTAINERDS
                .iter()
                .find(|(s, _)| *s == suite)
                .unwrap();
            Containerd::start_unpacked(prefix, Path::new(root))
        }
    }
    .expect("containerd starts");
    let version = containerd.version().unwrap();
    assert!(version.starts_with(release), "{version}, not {release}x");
    eprintln!("containerd {version}");
    // Declared after `containerd`, so dropped first: the lab ends before its runtime.
    let lab = Lab::up_in_sandboxes(
        LabConfig {
            topology: Topology::Bridged,
            rules: RuleMode::Nftables,
            prefix: prefix.to_owned(),
        },
        |pod| containerd.run_sandbox(pod, kube_namespace(&pod.name)),
    )
    .expect("lab up in containerd's sandboxes");
    assert!(!lab.runtime_root().exists());

    // containerd's own bundles: one sandbox per pod, the client too, each naming the pod
    // and a netns that is the one the lab wired.
    let pods = lab.pod_names();
    let runtime_root = containerd.runtime_root();
    let mut named = BTreeSet::new();
    for id in containerd.sandboxes() {
        let text = std::fs::read_to_string(runtime_root.join(id).join("config.json")).unwrap();
        let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
        let annotations = &spec["annotations"];
        assert_eq!(annotations["io.kubernetes.cri.container-type"], "sandbox");
        assert_eq!(annotations["io.kubernetes.cri.sandbox-id"], id.as_str());
        // New in 2.0 (internal/cri/annotations/annotations.go): a 2.x daemon wrote it.
        let image = &annotations["io.kubernetes.cri.podsandbox.image-name"];
        assert_eq!(image.is_string(), release == "2.", "{annotations}");
        let name = annotations["io.kubernetes.cri.sandbox-name"]
            .as_str()
            .unwrap();
        let namespace = annotations["io.kubernetes.cri.sandbox-namespace"]
            .as_str()
            .unwrap();
        named.insert(format!("{namespace}/{name}"));
        // kind's layout: /var/run/netns/cni-<uuid>, /var/run being a link to /run that
        // resolves inside the node's root (as observer resolves it).
        let netns = containerd.sandbox_netns(id).unwrap();
        let file = netns.strip_prefix("/var/run/netns").unwrap();
        assert!(file.to_str().unwrap().starts_with("cni-"), "{netns:?}");
        let node_root = containerd.node_root();
        let var_run = std::fs::read_link(node_root.join("var/run")).unwrap();
        assert_eq!(var_run, Path::new("/run"));
        let pod_ns = if name == "client" {
            lab.client_ns().to_owned()
        } else {
            format!("{prefix}-pod-{name}")
        };
        let ino = |path: &Path| std::fs::metadata(path).unwrap().ino();
        let in_node = node_root.join("run/netns").join(file);
        assert_eq!(ino(&in_node), ino(&Path::new("/run/netns").join(&pod_ns)));
    }
    assert_eq!(named, pods.values().cloned().collect::<BTreeSet<_>>());

    let (conns, answered) = record(&lab, None);
    assert_named_by_bundles(&conns, &answered, &pods);
}
