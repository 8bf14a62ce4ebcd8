//! Real pod sandboxes for the lab's pods: Debian's containerd with its CRI plugin, laid
//! out as on a kind node: bookworm's installed 1.6, or trixie's 1.7 or forky's 2.x that
//! `cargo xtask setup` unpacks ([`UNPACKED_CONTAINERDS`]). containerd runs in a network namespace of its own and in a
//! private mount namespace whose `/run` is a tmpfs of its own (holding its default state
//! `/run/containerd` and `/run/netns`), so nothing it mounts or writes there reaches the
//! host, and a system containerd is never touched; its root, socket, runc root and cgroup
//! parent are named by the lab's prefix, under `/var/lib/observer-lab/`. `RunPodSandbox` makes containerd create each pod's netns
//! (`/var/run/netns/cni-<uuid>`), start a pause container in it and lay out the sandbox's
//! OCI bundle (`config.json` with the `io.kubernetes.cri.*` annotations and that netns
//! path) under `/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/`: observer
//! finds it with its default runtime roots through `/proc/<pid>/root`, as it finds a kind
//! node's.
//!
//! What is not containerd's own: the CRI client (`scripts/cri.py`, hand-encoded protobuf
//! over Debian's python3-grpcio, as crictl is not packaged), the pause image (a static
//! busybox sleeping, imported with `ctr`), and the pod network: the CNI plugin
//! (`scripts/cni_lab_pod.py`) only reports the address the lab then gives the pod; the
//! lab binds the sandbox's netns at `/run/netns/<pod netns>` and wires it as usual.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::spec::Pod;
use crate::sys::{self, run};

const CRI_PY: &str = include_str!("../scripts/cri.py");
const CNI_PLUGIN_PY: &str = include_str!("../scripts/cni_lab_pod.py");
/// Debian's python3 (with python3-grpcio), not whatever `python3` is first on PATH.
const PYTHON: &str = "/usr/bin/python3";
const PAUSE_IMAGE: &str = "lab.local/pause:1";
/// containerd's default state directory, private to its mount namespace.
const STATE: &str = "/run/containerd";
/// Gives containerd a `/run` of its own, then runs it (`$0`, `$1`).
const PRIVATE_RUN: &str = "mount -t tmpfs -o mode=0755 containerd-run /run \
    && mkdir -m 0711 /run/containerd && mkdir /run/netns \
    && exec \"$0\" --config \"$1\"";
/// Where the private containerds keep what the host must see (socket, root, config).
const DIRS: &str = "/var/lib/observer-lab";
const LOOPBACK_PLUGIN: &str = "/usr/lib/cni/loopback";
/// The v2 runtime's task bundles of CRI's `k8s.io` namespace, under the state directory.
const TASKS: &str = "io.containerd.runtime.v2.task/k8s.io";

/// Debian's containerd packages the lab runs besides bookworm's installed 1.6, by suite,
/// and where `cargo xtask setup` unpacks each (`usr/bin/containerd`, `ctr`,
/// `containerd-shim-runc-v2`; bookworm's runc runs their sandboxes): trixie's 1.7 and
/// forky's 2.x. kind's node images ran 1.7 up to kind v0.26 and run 2.x since v0.27
/// (`CONTAINERD_VERSION` in kind's `images/base/Dockerfile`).
pub const UNPACKED_CONTAINERDS: [(&str, &str); 2] = [
    ("trixie", "/opt/observer-lab/containerd-trixie"),
    ("forky", "/opt/observer-lab/containerd-forky"),
];

/// The programs of one containerd release.
struct Binaries {
    containerd: PathBuf,
    ctr: PathBuf,
    /// Put first in the daemon's PATH, so that it starts this release's shim.
    bin_dir: Option<PathBuf>,
}

/// A private containerd; dropping it removes its sandboxes, processes, mounts, cgroups,
/// namespace and files, also when a test fails.
pub struct Containerd {
    prefix: String,
    dir: PathBuf,
    netns: String,
    cgroup_parent: String,
    ip: PathBuf,
    binaries: Binaries,
    daemon: Option<Child>,
    sandboxes: Vec<String>,
    /// `/run/netns/<pod netns>` bind mounts made here (the lab normally removes them).
    bound: Vec<PathBuf>,
}

impl Containerd {
    /// Starts the installed containerd (Debian's package) and imports the pause image;
    /// returns once the CRI plugin answers.
    pub fn start(prefix: &str) -> anyhow::Result<Containerd> {
        let binaries = Binaries {
            containerd: sys::find_tool("containerd", "containerd")?,
            ctr: sys::find_tool("ctr", "containerd")?,
            bin_dir: None,
        };
        Containerd::start_with(prefix, binaries)
    }

    /// As [`Containerd::start`], with the containerd of a Debian package unpacked at
    /// `root` (one of [`UNPACKED_CONTAINERDS`]).
    pub fn start_unpacked(prefix: &str, root: &Path) -> anyhow::Result<Containerd> {
        let bin_dir = root.join("usr/bin");
        let binaries = Binaries {
            containerd: bin_dir.join("containerd"),
            ctr: bin_dir.join("ctr"),
            bin_dir: Some(bin_dir),
        };
        for program in [&binaries.containerd, &binaries.ctr] {
            if !program.is_file() {
                bail!(
                    "{} is missing: `cargo xtask setup` unpacks Debian's containerd there",
                    program.display()
                );
            }
        }
        Containerd::start_with(prefix, binaries)
    }

    fn start_with(prefix: &str, binaries: Binaries) -> anyhow::Result<Containerd> {
        let dir = dir_of(prefix);
        if dir.exists() {
            bail!(
                "{} exists (a crashed run?): `cargo xtask lab down --prefix {prefix}` removes it",
                dir.display()
            );
        }
        let mut containerd = Containerd {
            prefix: prefix.to_owned(),
            dir,
            netns: netns_of(prefix),
            cgroup_parent: cgroup_parent_of(prefix),
            ip: sys::find_tool("ip", "iproute2")?,
            binaries,
            daemon: None,
            sandboxes: Vec::new(),
            bound: Vec::new(),
        };
        containerd.write_files()?;
        run(Command::new(&containerd.ip).args(["netns", "add", &containerd.netns]))?;
        run(Command::new(&containerd.ip).args([
            "-n",
            &containerd.netns,
            "link",
            "set",
            "lo",
            "up",
        ]))?;
        let log = std::fs::File::create(containerd.dir.join("containerd.log"))?;
        // nsenter and unshare exec, so the child is containerd itself.
        let mut daemon = Command::new(sys::find_tool("nsenter", "util-linux")?);
        if let Some(bin_dir) = &containerd.binaries.bin_dir {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let dirs = std::iter::once(bin_dir.clone()).chain(std::env::split_paths(&path));
            daemon.env("PATH", std::env::join_paths(dirs)?);
        }
        let daemon = daemon
            .arg(format!("--net=/run/netns/{}", containerd.netns))
            .arg(sys::find_tool("unshare", "util-linux")?)
            .args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
            .arg(PRIVATE_RUN)
            .arg(&containerd.binaries.containerd)
            .arg(containerd.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("could not start containerd")?;
        containerd.daemon = Some(daemon);
        containerd.wait_ready()?;
        containerd.import_pause_image()?;
        Ok(containerd)
    }

    /// `/` as containerd sees it (`/proc/<pid>/root`), like a kind node's root.
    pub fn node_root(&self) -> PathBuf {
        let pid = self.daemon.as_ref().map_or(0, Child::id);
        PathBuf::from(format!("/proc/{pid}/root"))
    }

    /// The CRI task directory whose `<id>/config.json` bundles name the pods, seen from
    /// here.
    pub fn runtime_root(&self) -> PathBuf {
        self.node_root()
            .join(STATE.trim_start_matches('/'))
            .join(TASKS)
    }

    /// The daemon's version, as `containerd --version` prints it (`2.1.9+unknown`).
    pub fn version(&self) -> anyhow::Result<String> {
        let out = run(Command::new(&self.binaries.containerd).arg("--version"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        // `containerd github.com/containerd/containerd/v2 2.1.9+unknown [revision]`
        text.split_whitespace()
            .nth(2)
            .map(|v| v.trim_start_matches('v').to_owned())
            .with_context(|| format!("unexpected `containerd --version`: {text}"))
    }

    /// The sandboxes run so far, by id.
    pub fn sandboxes(&self) -> &[String] {
        &self.sandboxes
    }

    /// Runs `pod`'s sandbox (Kubernetes namespace `namespace`) and binds the netns
    /// containerd made for it at `/run/netns/<pod.ns>`, where the lab wires it.
    pub fn run_sandbox(&mut self, pod: &Pod, namespace: &str) -> anyhow::Result<()> {
        let ips = self.dir.join("cni/ips");
        std::fs::write(ips.join(&pod.name), format!("{}/24", pod.ip))?;
        let uid = format!("{:0>32}", pod.name.replace('-', ""));
        let socket = self.socket();
        let out = self.cri(&[
            "run",
            &socket,
            namespace,
            &pod.name,
            &uid,
            &self.cgroup_parent,
        ])?;
        let id = String::from_utf8_lossy(&out).trim().to_owned();
        self.sandboxes.push(id.clone());
        // The pause process's netns is the one the bundle names (a path in containerd's
        // mount namespace).
        let pid_file = self.runtime_root().join(&id).join("init.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("could not read {}", pid_file.display()))?;
        let netns = format!("/proc/{}/ns/net", pid.trim());
        std::fs::create_dir_all("/run/netns")?;
        let target = PathBuf::from("/run/netns").join(&pod.ns);
        std::fs::File::create(&target)
            .with_context(|| format!("could not create {}", target.display()))?;
        self.bound.push(target.clone());
        run(Command::new(sys::find_tool("mount", "mount")?)
            .arg("--bind")
            .arg(&netns)
            .arg(&target))?;
        Ok(())
    }

    /// The netns path in sandbox `id`'s bundle, as containerd wrote it (in its own mount
    /// namespace: see [`Containerd::node_root`]).
    pub fn sandbox_netns(&self, id: &str) -> anyhow::Result<PathBuf> {
        let path = self.runtime_root().join(id).join("config.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("could not read {}", path.display()))?;
        let spec: serde_json::Value = serde_json::from_str(&text)?;
        spec["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|ns| ns["type"] == "network")
            .and_then(|ns| ns["path"].as_str())
            .map(PathBuf::from)
            .with_context(|| format!("{}: no network namespace path", path.display()))
    }

    fn socket(&self) -> String {
        socket_of(&self.dir)
    }

    fn cri(&self, args: &[&str]) -> anyhow::Result<Vec<u8>> {
        let out = run(Command::new(PYTHON).arg(self.dir.join("cri.py")).args(args))
            .context("the CRI call failed (needs Debian's python3-grpcio)")?;
        Ok(out.stdout)
    }

    fn write_files(&self) -> anyhow::Result<()> {
        let dir = &self.dir;
        for sub in ["cni/bin", "cni/conf", "cni/ips", "logs"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        std::fs::write(dir.join("cri.py"), CRI_PY)?;
        let plugin = dir.join("cni/bin/lab-pod");
        std::fs::write(&plugin, CNI_PLUGIN_PY)?;
        std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        // containerd adds a loopback network of its own: Debian's plugin brings lo up.
        let loopback = Path::new(LOOPBACK_PLUGIN);
        if !loopback.exists() {
            bail!("{LOOPBACK_PLUGIN} is missing: install containernetworking-plugins");
        }
        std::os::unix::fs::symlink(loopback, dir.join("cni/bin/loopback"))?;
        let conf = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "lab",
            "type": "lab-pod",
            "ipsDir": dir.join("cni/ips"),
        });
        std::fs::write(dir.join("cni/conf/10-lab.conf"), conf.to_string())?;
        std::fs::write(dir.join("config.toml"), config_toml(dir))?;
        Ok(())
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let socket = self.socket();
            match self.cri(&["version", &socket]) {
                Ok(_) => return Ok(()),
                Err(err) if Instant::now() > deadline => {
                    return Err(err.context(format!("containerd: {}", self.log_tail())));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
            if let Some(daemon) = &mut self.daemon
                && let Some(status) = daemon.try_wait()?
            {
                bail!("containerd exited ({status}): {}", self.log_tail());
            }
        }
    }

    fn import_pause_image(&self) -> anyhow::Result<()> {
        let archive = self.dir.join("pause.tar");
        let busybox = sys::find_tool("busybox", "busybox-static")?;
        self.cri(&[
            "image",
            &busybox.display().to_string(),
            &archive.display().to_string(),
            PAUSE_IMAGE,
        ])?;
        run(Command::new(&self.binaries.ctr)
            .args(["--address", &self.socket(), "--namespace", "k8s.io"])
            .args(["images", "import"])
            .arg(&archive))?;
        Ok(())
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.join("containerd.log")) {
            let _ = file.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// containerd's configuration: its state where a kind node has it (private to its mount
/// namespace), everything else under `dir`; CRI with our pause image and CNI.
/// `restrict_oom_score_adj`: in a container without CAP_SYS_RESOURCE, runc cannot give the
/// sandbox kubelet's -998 (`nsexec: failed to update /proc/self/oom_score_adj`).
fn config_toml(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{STATE}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/runc"
"#
    )
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let socket = self.socket();
        for id in self.sandboxes.clone() {
            let _ = self.cri(&["stop", &socket, &id]);
            let _ = self.cri(&["remove", &socket, &id]);
        }
        if let Some(mut daemon) = self.daemon.take() {
            if let Ok(pid) = i32::try_from(daemon.id()) {
                sys::end_process(pid);
            }
            let _ = daemon.wait();
        }
        for target in &self.bound {
            if is_mounted(target) {
                unmount(target);
            }
            let _ = std::fs::remove_file(target);
        }
        if let Err(err) = remove(&self.prefix, &self.ip) {
            eprintln!("containerd {}: cleanup incomplete: {err:#}", self.prefix);
        }
    }
}

/// Removes what the private containerd of the lab with this prefix left (also after a
/// crash, from `lab down`): its processes, mounts, cgroups, shim sockets, namespace and
/// directory. Returns what it removed.
pub(crate) fn remove(prefix: &str, ip: &Path) -> anyhow::Result<Vec<String>> {
    let dir = dir_of(prefix);
    let netns = netns_of(prefix);
    let mut removed = Vec::new();
    // containerd and its shims run in its namespaces (their mounts end with them); a
    // shim found by our socket too.
    let exists = sys::list_netns(ip)?.contains(&netns);
    let mut pids = if exists {
        sys::netns_pids(ip, &netns)?
    } else {
        Vec::new()
    };
    pids.extend(processes_with_arg(&socket_of(&dir)));
    for pid in pids {
        sys::end_process(pid);
    }
    remove_cgroups(&cgroup_parent_of(prefix));
    if exists {
        run(Command::new(ip).args(["netns", "delete", &netns]))?;
        removed.push(netns);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("could not remove {}", dir.display()))?;
        removed.push(dir.display().to_string());
    }
    Ok(removed)
}

fn dir_of(prefix: &str) -> PathBuf {
    Path::new(DIRS).join(format!("{prefix}-containerd"))
}

fn netns_of(prefix: &str) -> String {
    format!("{prefix}ctd")
}

fn cgroup_parent_of(prefix: &str) -> String {
    format!("/observer-lab-{prefix}")
}

fn socket_of(dir: &Path) -> String {
    dir.join("containerd.sock").display().to_string()
}

/// Processes one of whose arguments is exactly `arg`.
fn processes_with_arg(arg: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            cmdline
                .split(|&b| b == 0)
                .any(|a| a == arg.as_bytes())
                .then_some(pid)
        })
        .collect()
}

fn unmount(path: &Path) {
    let _ = Command::new("umount").arg("--lazy").arg(path).status();
}

/// Whether `path` is a mount point in our mount namespace.
fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| Path::new(point) == path)
}

/// The cgroup parent's directories in every hierarchy (runc removes the sandboxes' own).
fn remove_cgroups(parent: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let relative = parent.trim_start_matches('/');
    for hierarchy in hierarchies.flatten() {
        let dir = hierarchy.path().join(relative);
        if let Ok(children) = std::fs::read_dir(&dir) {
            for child in children.flatten().filter(|c| c.path().is_dir()) {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(&dir);
    }
    let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(relative));
}
