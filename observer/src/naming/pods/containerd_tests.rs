//! Pod sandboxes as containerd 1.6, 1.7 and 2.x lay them out (issue 28: kind's node
//! images run containerd 2.x since kind v0.27).
//!
//! Read in containerd's source, v1.7.24 against v2.1.9 and v2.3.4 (kind's base image
//! builds v2.3.x):
//! - The task bundle is still `<state>/io.containerd.runtime.v2.task/<namespace>/<id>/` with
//!   the spec as `config.json` (2.x: `core/runtime/v2/task_manager.go`, plugin
//!   `io.containerd.runtime.v2` id `task`, and `core/runtime/v2/bundle.go` `NewBundle`;
//!   1.7: `runtime/v2/manager.go`, `runtime/v2/bundle.go`).
//! - CRI's default sandboxer `podsandbox` (`internal/cri/config/config.go`
//!   `ModePodSandbox`) still runs the pause container as such a task, with the spec
//!   `sandboxContainerSpec` builds (`internal/cri/server/podsandbox/sandbox_run_linux.go`).
//!   Its annotations are those of `DefaultCRIAnnotations`
//!   (`internal/cri/annotations/annotations.go`, `pkg/cri/annotations` in 1.7), to which
//!   2.0 added `io.kubernetes.cri.podsandbox.image-name` on sandboxes.
//! - The CRI plugin became `io.containerd.cri.v1.runtime` and `.images`, but keeps its
//!   state in `io.containerd.grpc.v1.cri` "for backward compatibility"
//!   (`plugins/cri/runtime/plugin.go`); the netns is still `/var/run/netns/cni-<uuid>`
//!   (`pkg/netns/netns_linux.go`), or under that state dir with
//!   `netns_mounts_under_state_dir` (the bundle names it either way).
//! - New in 2.x and not read: the opt-in `shim` sandboxer keeps its bundles under
//!   `io.containerd.sandbox.controller.v1.shim/` (`plugins/sandbox/controller.go`), where
//!   CRI writes no spec before the sandbox starts (`core/runtime/v2/bundle.go` v2.3.4).

use std::path::PathBuf;

use super::DEFAULT_RUNTIME_ROOTS;
use super::PodSource as _;
use super::bundles::{Sandbox, parse_bundle};
use super::runtime::RuntimeSource;

/// A sandbox's `config.json` as Debian's containerd wrote it in the lab (its CRI plugin
/// running the lab's pod `shop/checkout-a`; `observer/tests/pod_names_containerd.rs`).
fn written_by(release: &str) -> String {
    let path = format!(
        "{}/tests/data/bundles/containerd-{release}-sandbox.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn bundles_as_debians_containerd_1_6_1_7_and_2_1_wrote_them() {
    for (release, image_name) in [("1.6.20", false), ("1.7.24", false), ("2.1.9", true)] {
        let text = written_by(release);
        let sandbox = parse_bundle(&text).unwrap().unwrap();
        assert_eq!(sandbox.pod(), "shop/checkout-a", "{release}");
        let netns = sandbox.netns.unwrap().display().to_string();
        assert!(
            netns.starts_with("/var/run/netns/cni-"),
            "{release}: {netns}"
        );
        let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
        let annotations = spec["annotations"].as_object().unwrap();
        assert_eq!(
            annotations.contains_key("io.kubernetes.cri.podsandbox.image-name"),
            image_name,
            "{release}"
        );
    }
}

/// `annotations` in a spec with `namespaces` (each `(type, path)`), as
/// `sandboxContainerSpec` and `DefaultCRIAnnotations` of v2.3.4 build it.
fn spec(annotations: serde_json::Value, namespaces: &[(&str, Option<&str>)]) -> String {
    let namespaces: Vec<serde_json::Value> = namespaces
        .iter()
        .map(|(kind, path)| match path {
            Some(path) => serde_json::json!({"type": kind, "path": path}),
            None => serde_json::json!({"type": kind}),
        })
        .collect();
    serde_json::json!({
        "ociVersion": "1.2.1",
        "hostname": "web-5d7c9-abcde",
        "annotations": annotations,
        "linux": {"namespaces": namespaces},
    })
    .to_string()
}

const SANDBOX_ID: &str = "4f1c7e3a9b2d";
const NETNS: &str = "/var/run/netns/cni-6f2a0c1e-93b4-5d7e-8a1f-0b2c3d4e5f60";

/// A kind node's pause sandbox under containerd 2.3 (pause 3.10, kubelet's log dir).
fn kind_sandbox(name: &str, namespace: &str) -> serde_json::Value {
    serde_json::json!({
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.podsandbox.image-name": "registry.k8s.io/pause:3.10",
        "io.kubernetes.cri.sandbox-cpu-period": "100000",
        "io.kubernetes.cri.sandbox-cpu-quota": "0",
        "io.kubernetes.cri.sandbox-cpu-shares": "2",
        "io.kubernetes.cri.sandbox-id": SANDBOX_ID,
        "io.kubernetes.cri.sandbox-log-directory":
            format!("/var/log/pods/{namespace}_{name}_0e8c2f4a-1b3d-4c5e-9f70-a1b2c3d4e5f6"),
        "io.kubernetes.cri.sandbox-memory": "0",
        "io.kubernetes.cri.sandbox-name": name,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-uid": "0e8c2f4a-1b3d-4c5e-9f70-a1b2c3d4e5f6",
    })
}

#[test]
fn a_kind_node_on_containerd_2_3() {
    let pod = spec(
        kind_sandbox("web-5d7c9-abcde", "shop"),
        &[
            ("pid", None),
            ("ipc", None),
            ("uts", None),
            ("mount", None),
            ("network", Some(NETNS)),
        ],
    );
    assert_eq!(
        parse_bundle(&pod).unwrap(),
        Some(Sandbox {
            namespace: "shop".into(),
            name: "web-5d7c9-abcde".into(),
            netns: Some(PathBuf::from(NETNS)),
        })
    );
    // hostNetwork: no network and no uts namespace at all.
    let host = spec(
        kind_sandbox("kube-proxy-x7k2p", "kube-system"),
        &[("pid", None), ("ipc", None), ("mount", None)],
    );
    assert_eq!(parse_bundle(&host).unwrap().unwrap().netns, None);
    // A container of the pod: the pod's annotations, but it joins the sandbox's netns
    // through the pause process (`internal/cri/server/container_create.go`).
    let container = spec(
        serde_json::json!({
            "io.kubernetes.cri.container-name": "web",
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.image-name": "registry.k8s.io/e2e-test-images/agnhost:2.53",
            "io.kubernetes.cri.sandbox-id": SANDBOX_ID,
            "io.kubernetes.cri.sandbox-name": "web-5d7c9-abcde",
            "io.kubernetes.cri.sandbox-namespace": "shop",
            "io.kubernetes.cri.sandbox-uid": "0e8c2f4a-1b3d-4c5e-9f70-a1b2c3d4e5f6",
        }),
        &[("network", Some("/proc/4242/ns/net"))],
    );
    assert_eq!(parse_bundle(&container), Ok(None));
}

/// containerd 2.x's state directory on a kind node: the task bundles (with the `rootfs`
/// directory and the `work` link `NewBundle` makes), the CRI plugin's state and a
/// `shim` sandboxer bundle without a spec. Only the sandbox's task bundle is read: its
/// netns, which does not exist here, is the one thing skipped.
#[test]
fn only_the_pause_tasks_bundle_is_read_from_a_containerd_2_state_dir() {
    let node = tempfile::tempdir().unwrap();
    let state = node.path().join("run/containerd");
    let tasks = node
        .path()
        .join(DEFAULT_RUNTIME_ROOTS[0].trim_start_matches('/'));
    let write = |dir: &PathBuf, text: &str| {
        std::fs::create_dir_all(dir.join("rootfs")).unwrap();
        std::fs::write(dir.join("config.json"), text).unwrap();
        std::fs::write(dir.join("init.pid"), "4242").unwrap();
        std::os::unix::fs::symlink(
            "/var/lib/containerd/io.containerd.runtime.v2.task/k8s.io/x",
            dir.join("work"),
        )
        .unwrap();
    };
    let netns = format!("{}/run/netns/cni-1", node.path().display());
    let sandbox = spec(kind_sandbox("web", "shop"), &[("network", Some(&netns))]);
    write(&tasks.join(SANDBOX_ID), &sandbox);
    let host = spec(kind_sandbox("kube-proxy-x7k2p", "kube-system"), &[]);
    write(&tasks.join("5a6b7c8d"), &host);
    let container = sandbox.replace(r#""sandbox","#, r#""container","#);
    write(&tasks.join("9e0f1a2b"), &container);
    std::fs::create_dir_all(state.join("io.containerd.sandbox.controller.v1.shim/k8s.io/77aa"))
        .unwrap();
    std::fs::create_dir_all(state.join("io.containerd.grpc.v1.cri/sandboxes")).unwrap();

    let mut source = RuntimeSource::new(vec![tasks]).bundles_only();
    let scan = source.scan();
    assert!(scan.pods.is_empty());
    assert_eq!(scan.skipped.len(), 1, "{:#?}", scan.skipped);
    assert!(
        scan.skipped[0].starts_with(&format!("{netns}: cannot open: ")),
        "{:#?}",
        scan.skipped
    );
}
