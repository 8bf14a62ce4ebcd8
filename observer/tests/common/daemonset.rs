//! deploy/daemonset.yaml, parsed (never copied), and its pod translated into the OCI
//! runtime spec a container runtime makes for it (as containerd's CRI plugin does for
//! kubelet): the image's entrypoint with the manifest's `args`, `hostNetwork` and
//! `hostPID` as the node's network and PID namespaces (no namespace of the pod's own),
//! the capabilities `add`ed to an empty set, `readOnlyRootFilesystem`, `runAsUser`,
//! `allowPrivilegeEscalation`, every `hostPath` volume at its `mountPath`, and the
//! memory limit as the container's cgroup limit.
//!
//! Every field of the manifest is either translated or named here as not the runtime's
//! concern (scheduling, kubelet's probes): a field this does not know fails the parse, so
//! a manifest change cannot go untranslated. Only observer's container is translated:
//! the kube-rbac-proxy sidecar needs an API server (TokenReview) that no test here has;
//! kubernetes-validate and tests/deploy.rs check it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;

pub const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/daemonset.yaml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DaemonSet {
    pub kind: String,
    #[serde(rename = "apiVersion")]
    _api_version: IgnoredAny,
    /// Names and labels: the API server's, not the runtime's.
    #[serde(rename = "metadata")]
    _metadata: IgnoredAny,
    spec: DaemonSetSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DaemonSetSpec {
    /// Which pods the controller owns.
    #[serde(rename = "selector")]
    _selector: IgnoredAny,
    template: PodTemplate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodTemplate {
    #[serde(rename = "metadata")]
    _metadata: IgnoredAny,
    spec: PodSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub host_network: bool,
    #[serde(default, rename = "hostPID")]
    pub host_pid: bool,
    /// kubelet's choice of resolv.conf (the pod has no DNS traffic of its own to count).
    #[serde(rename = "dnsPolicy")]
    _dns_policy: IgnoredAny,
    /// Scheduling.
    #[serde(rename = "tolerations")]
    _tolerations: IgnoredAny,
    /// The API server's: the identity (and token) kube-rbac-proxy presents.
    #[serde(rename = "serviceAccountName")]
    _service_account_name: IgnoredAny,
    #[serde(rename = "automountServiceAccountToken")]
    _automount_service_account_token: IgnoredAny,
    /// Each one parsed strictly when asked for ([`DaemonSet::container`]).
    containers: Vec<serde_yaml_ng::Value>,
    #[serde(default)]
    pub volumes: Vec<Volume>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    pub image: String,
    /// kubelet's pull decision.
    #[serde(rename = "imagePullPolicy")]
    _image_pull_policy: IgnoredAny,
    #[serde(default)]
    pub args: Vec<String>,
    pub readiness_probe: Probe,
    pub resources: Resources,
    pub security_context: SecurityContext,
    #[serde(default)]
    pub volume_mounts: Vec<VolumeMount>,
}

/// kubelet's readiness probe: an HTTP GET (from the node's network namespace, which
/// is the pod's too).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Probe {
    pub http_get: HttpGet,
    #[serde(rename = "periodSeconds")]
    _period_seconds: IgnoredAny,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpGet {
    pub host: String,
    pub path: String,
    pub port: u16,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// The scheduler's share; only limits reach the runtime.
    #[serde(rename = "requests")]
    _requests: IgnoredAny,
    pub limits: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecurityContext {
    pub privileged: bool,
    pub allow_privilege_escalation: bool,
    pub read_only_root_filesystem: bool,
    pub run_as_user: u32,
    pub capabilities: Capabilities,
    pub app_armor_profile: Profile,
    pub seccomp_profile: Profile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    pub drop: Vec<String>,
    pub add: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    #[serde(default)]
    pub read_only: bool,
    pub mount_propagation: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    pub host_path: HostPath,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPath {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// The DaemonSet as deploy/daemonset.yaml defines it.
pub fn read() -> DaemonSet {
    let text = std::fs::read_to_string(PATH).unwrap();
    let daemonset: DaemonSet = serde_yaml_ng::from_str(&text)
        .unwrap_or_else(|e| panic!("{PATH}: {e} (a field the translation does not know?)"));
    assert_eq!(daemonset.kind, "DaemonSet");
    daemonset
}

impl DaemonSet {
    pub fn pod(&self) -> &PodSpec {
        &self.spec.template.spec
    }

    /// observer's container.
    pub fn container(&self) -> Container {
        let container = self
            .pod()
            .containers
            .iter()
            .find(|c| c["name"].as_str() == Some("observer"))
            .expect("the DaemonSet's pod has a container named observer");
        serde_yaml_ng::from_value(container.clone())
            .unwrap_or_else(|e| panic!("{PATH}: observer's container: {e}"))
    }
}

impl Container {
    /// The memory limit in bytes.
    pub fn memory_limit(&self) -> u64 {
        quantity_bytes(&self.resources.limits["memory"])
    }
}

/// A capability's number (linux/capability.h) by its Kubernetes name (`SYS_ADMIN`).
pub fn capability_number(name: &str) -> u32 {
    match name {
        "NET_ADMIN" => 12,
        "SYS_CHROOT" => 18,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "SYS_RESOURCE" => 24,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("unexpected capability {other}"),
    }
}

/// A Kubernetes memory quantity (`256Mi`, `1G`, `1048576`) in bytes.
pub fn quantity_bytes(quantity: &str) -> u64 {
    let split = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let number: u64 = number
        .parse()
        .unwrap_or_else(|_| panic!("memory quantity {quantity}"));
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => panic!("memory quantity suffix {other} in {quantity}"),
    };
    number * unit
}

/// What the runtime decides, not the manifest: the pod's hostname, its cgroup (relative
/// to the runtime's own), and which of the added capabilities it can grant.
pub struct Runtime<'a> {
    pub hostname: &'a str,
    pub cgroups_path: &'a str,
    pub grantable: &'a dyn Fn(&str) -> bool,
}

/// The OCI runtime spec (`config.json`) for the DaemonSet's container, from the image's
/// configuration (`skopeo inspect --config`) and the manifest.
pub fn runtime_spec(
    daemonset: &DaemonSet,
    image: &serde_json::Value,
    runtime: &Runtime<'_>,
) -> serde_json::Value {
    let pod = daemonset.pod();
    let container = daemonset.container();
    let security = &container.security_context;
    assert!(!security.privileged, "a privileged pod is not translated");
    assert_eq!(
        security.capabilities.drop,
        ["ALL"],
        "only `drop: [ALL]` is translated"
    );
    for profile in [&security.app_armor_profile, &security.seccomp_profile] {
        // Unconfined: the runtime applies no profile (this machine has no AppArmor).
        assert_eq!(profile.kind, "Unconfined", "only Unconfined is translated");
    }
    let capabilities: Vec<String> = security
        .capabilities
        .add
        .iter()
        .filter(|name| (runtime.grantable)(name))
        .map(|name| format!("CAP_{name}"))
        .collect();
    // Kubernetes' `args` replace the image's Cmd; with no `command`, its Entrypoint stays.
    let mut args: Vec<String> =
        serde_json::from_value(image["config"]["Entrypoint"].clone()).unwrap();
    args.extend(container.args.iter().cloned());
    let mut namespaces = vec![
        serde_json::json!({"type": "mount"}),
        serde_json::json!({"type": "uts"}),
        serde_json::json!({"type": "ipc"}),
    ];
    if !pod.host_pid {
        namespaces.push(serde_json::json!({"type": "pid"}));
    }
    if !pod.host_network {
        namespaces.push(serde_json::json!({"type": "network"}));
    }
    let mut mounts = vec![
        serde_json::json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        serde_json::json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        serde_json::json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        serde_json::json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        serde_json::json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    for mount in &container.volume_mounts {
        let volume = pod
            .volumes
            .iter()
            .find(|v| v.name == mount.name)
            .unwrap_or_else(|| panic!("no volume {}", mount.name));
        let propagation = match mount.mount_propagation.as_deref() {
            None | Some("None") => "rprivate",
            Some("HostToContainer") => "rslave",
            Some("Bidirectional") => "rshared",
            Some(other) => panic!("mountPropagation {other}"),
        };
        let access = if mount.read_only { "ro" } else { "rw" };
        mounts.push(serde_json::json!({
            "destination": mount.mount_path,
            "type": "bind",
            "source": volume.host_path.path,
            "options": ["rbind", access, propagation],
        }));
    }
    serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": security.run_as_user, "gid": 0},
            "args": args,
            "env": image["config"]["Env"],
            "cwd": "/",
            "capabilities": {
                "bounding": capabilities,
                "effective": capabilities,
                "permitted": capabilities,
            },
            "noNewPrivileges": !security.allow_privilege_escalation,
        },
        "root": {"path": "rootfs", "readonly": security.read_only_root_filesystem},
        "hostname": runtime.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": runtime.cgroups_path,
            "resources": {"memory": {"limit": container.memory_limit()}},
        },
    })
}
