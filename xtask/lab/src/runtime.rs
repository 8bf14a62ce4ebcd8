//! The container runtime state a kind node would have for the lab's pods, laid out as
//! containerd's CRI plugin and runc shim lay it out (containerd
//! `internal/cri/annotations/annotations.go` for the annotations; the v2 runtime's task
//! directory `io.containerd.runtime.v2.task/<namespace>/<id>/config.json` for the
//! bundle): per pod one sandbox bundle whose `linux.namespaces` network entry points at
//! the pod's netns under /run/netns, plus one application-container bundle that a reader
//! must ignore. Written under the lab's state directory, never the real /run/containerd;
//! observer reads it with `--runtime-root <Lab::runtime_root()>`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::Lab;
use crate::spec::{Family, Pod};

impl Lab {
    /// [`Lab::up`] without runtime bundles: [`Lab::runtime_root`] stays absent, so pods
    /// can only be named by their hostnames (each pod's pause process has its own UTS
    /// namespace with the pod's name as hostname, as kubelet sets it).
    pub fn up_without_runtime_bundles(config: crate::LabConfig) -> anyhow::Result<Lab> {
        Lab::up_with(config, false, None, false, &[Family::V4])
    }

    /// [`Lab::up`] in pod sandboxes a real runtime made (see [`crate::Containerd`]):
    /// `make_netns` is called per pod (the client too) before anything is wired and must
    /// leave the pod's netns at `/run/netns/<pod.ns>`; the lab writes no bundles of its
    /// own, so only the runtime's name the pods.
    pub fn up_in_sandboxes(
        config: crate::LabConfig,
        mut make_netns: impl FnMut(&Pod) -> anyhow::Result<()>,
    ) -> anyhow::Result<Lab> {
        Lab::up_with(config, false, Some(&mut make_netns), false, &[Family::V4])
    }

    /// The client pod (not a server).
    pub fn client_pod(&self) -> Pod {
        Pod {
            name: "client".into(),
            ns: self.client_ns.clone(),
            ip: crate::spec::CLIENT_IP,
            http_port: crate::spec::HTTP_PORT,
            udp_port: crate::spec::UDP_PORT,
        }
    }

    /// Every pod's address and `namespace/name` (the client's too), as the runtime
    /// state under [`Lab::runtime_root`] names them.
    pub fn pod_names(&self) -> std::collections::BTreeMap<std::net::Ipv4Addr, String> {
        self.members()
            .iter()
            .map(|pod| (pod.ip, pod_name(pod)))
            .collect()
    }

    /// The directory of containerd-style sandbox bundles for this lab's pods (observer's
    /// `--runtime-root`).
    pub fn runtime_root(&self) -> PathBuf {
        root(&self.state_dir)
    }
}

/// The Kubernetes namespace of a lab pod.
pub fn kube_namespace(pod: &str) -> &'static str {
    if pod.starts_with("checkout") {
        "shop"
    } else if pod.starts_with("dns") {
        "kube-system"
    } else {
        "default"
    }
}

/// `namespace/name` of a lab pod, as observer names it.
pub fn pod_name(pod: &Pod) -> String {
    format!("{}/{}", kube_namespace(&pod.name), pod.name)
}

/// The containerd state directory (a kind node's `/run/containerd`) under `state_dir`.
pub fn state(state_dir: &Path) -> PathBuf {
    state_dir.join("containerd")
}

/// The directory of bundles (containerd's `k8s.io` task namespace) under `state_dir`.
pub fn root(state_dir: &Path) -> PathBuf {
    state(state_dir).join("io.containerd.runtime.v2.task/k8s.io")
}

/// A container id as containerd makes them: 64 hex digits.
fn container_id(prefix: &str, pod: &str, container: &str) -> String {
    let digest = Sha256::digest(format!("{prefix}/{pod}/{container}"));
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The OCI spec of one container of `pod` (trimmed to what identifies it).
pub fn bundle(prefix: &str, pod: &Pod, sandbox: bool) -> serde_json::Value {
    let sandbox_id = container_id(prefix, &pod.name, "sandbox");
    let namespace = kube_namespace(&pod.name);
    let mut annotations = serde_json::json!({
        "io.kubernetes.cri.sandbox-id": sandbox_id,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-uid": container_id(prefix, &pod.name, "uid")[..32],
        "io.kubernetes.cri.sandbox-name": pod.name,
    });
    let (args, network) = if sandbox {
        annotations["io.kubernetes.cri.sandbox-log-directory"] =
            format!("/var/log/pods/{namespace}_{}_uid", pod.name).into();
        annotations["io.kubernetes.cri.podsandbox.image-name"] =
            "registry.k8s.io/pause:3.10".into();
        annotations["io.kubernetes.cri.container-type"] = "sandbox".into();
        (
            vec!["/pause"],
            serde_json::json!({"type": "network", "path": format!("/run/netns/{}", pod.ns)}),
        )
    } else {
        annotations["io.kubernetes.cri.container-name"] = "server".into();
        annotations["io.kubernetes.cri.image-name"] = "docker.io/library/python:3.11".into();
        annotations["io.kubernetes.cri.container-type"] = "container".into();
        (
            vec!["python3", "pod_server.py"],
            // An application container joins its sandbox's netns through the pause process.
            serde_json::json!({"type": "network", "path": "/proc/1/ns/net"}),
        )
    };
    serde_json::json!({
        "ociVersion": "1.2.0",
        "process": {"user": {"uid": 65535, "gid": 65535}, "args": args, "cwd": "/"},
        "root": {"path": "rootfs", "readonly": sandbox},
        "hostname": pod.name,
        "annotations": annotations,
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                network,
            ],
        },
    })
}

/// Writes every pod's sandbox and container bundle under `root(state_dir)`.
pub fn write(state_dir: &Path, prefix: &str, pods: &[Pod]) -> anyhow::Result<()> {
    let root = root(state_dir);
    for pod in pods {
        for (container, sandbox) in [("sandbox", true), ("server", false)] {
            let dir = root.join(container_id(prefix, &pod.name, container));
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("could not create {}", dir.display()))?;
            let path = dir.join("config.json");
            let text = serde_json::to_string_pretty(&bundle(prefix, pod, sandbox))?;
            std::fs::write(&path, text)
                .with_context(|| format!("could not write {}", path.display()))?;
        }
    }
    Ok(())
}
