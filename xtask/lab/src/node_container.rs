//! A kind-like node container around the lab's node ([`crate::Lab::up_in_node_container`]):
//! what `docker run` gives a kind node, built with unshare and pivot_root.
//!
//! - The node's network namespace: the lab's `{prefix}-node`.
//! - A PID namespace of its own whose PID 1 is the node's init; the lab's pod processes
//!   (servers, pause processes) are started inside it, as a kind node's pods run in the
//!   node's PID namespace.
//! - A mount namespace whose root is a directory of the lab's state
//!   ([`NodeContainer::root`], visible from the host as `docker cp` sees a container's
//!   root): the host's `/usr` and `/etc` read-only (so iptables, nft, runc and python3 are
//!   the node's tools), `/dev`, a `/proc` of its PID namespace, a `/sys` of its network
//!   namespace, the host's cgroup hierarchies mounted anew (so they show the node's
//!   cgroup as their root), a `/run` of its own holding `/run/netns/<pod netns>` and,
//!   where the lab writes them, the pods' sandbox bundles at
//!   `/run/containerd/io.containerd.runtime.v2.task/k8s.io`, as on a kind node.
//! - A cgroup (under the host's cgroup v2 root) and a cgroup namespace rooted there.
//! - A UTS namespace with the node's hostname, and an IPC namespace.
//!
//! [`NodeContainer::exec`] starts a process in all of them and in the node's cgroup, as
//! `docker exec` does. Dropping the container kills its init, and with it every process
//! in its PID namespace; its mounts end with its mount namespace.

use std::ffi::CString;
use std::io::{BufRead as _, BufReader};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sched::CloneFlags;

use crate::spec::Family;
use crate::{Lab, LabConfig, sys};

/// Where the host's cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The directories of the root that are links into `/usr` on a merged-/usr host, or
/// directories of their own (bound read-only) otherwise.
const TOP_LEVEL_SYSTEM_DIRS: [&str; 4] = ["bin", "sbin", "lib", "lib64"];

/// A running node container; dropping it ends every process in it.
pub struct NodeContainer {
    hostname: String,
    root: PathBuf,
    /// The node's cgroup in the host's cgroup v2 hierarchy.
    cgroup: PathBuf,
    /// `unshare`, the parent of the node's init (it forwards nothing; it only waits).
    unshare: Option<Child>,
    /// The node's init, by its pid on the host.
    init: u32,
}

/// One cgroup hierarchy of the host, mounted anew in the node.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    /// `cgroup` (v1) or `cgroup2`.
    fstype: String,
    /// The mount's super options without `rw` (`memory`, `none,name=systemd`).
    options: String,
    /// Relative to [`CGROUP_ROOT`]; empty when the hierarchy is mounted there itself.
    dir: String,
}

/// One of [`TOP_LEVEL_SYSTEM_DIRS`] as the host has it.
#[derive(Debug, PartialEq, Eq)]
enum SystemDir {
    /// A link (`bin -> usr/bin`), made the same in the node.
    Link(&'static str, PathBuf),
    /// A directory of its own, bound read-only.
    Dir(&'static str),
}

/// The host's [`TOP_LEVEL_SYSTEM_DIRS`] (those it has).
fn system_dirs() -> Vec<SystemDir> {
    TOP_LEVEL_SYSTEM_DIRS
        .into_iter()
        .filter_map(|name| {
            let host = Path::new("/").join(name);
            match std::fs::read_link(&host) {
                Ok(target) => Some(SystemDir::Link(name, target)),
                Err(_) if host.is_dir() => Some(SystemDir::Dir(name)),
                Err(_) => None,
            }
        })
        .collect()
}

/// The cgroup hierarchies mounted at or under [`CGROUP_ROOT`] in `mountinfo`.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // Fields: id parent major:minor root mount-point options ... - fstype source super-options
            let (before, after) = line.split_once(" - ")?;
            let point = before.split_whitespace().nth(4)?;
            let mut after = after.split_whitespace();
            let fstype = after.next()?;
            let options = after.nth(1).unwrap_or("");
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            let dir = Path::new(point).strip_prefix(CGROUP_ROOT).ok()?;
            let options: Vec<&str> = options.split(',').filter(|o| *o != "rw").collect();
            Some(CgroupMount {
                fstype: fstype.to_owned(),
                options: options.join(","),
                dir: dir.to_str()?.to_owned(),
            })
        })
        .collect()
}

/// The host's cgroup v2 mount point (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid host).
fn cgroup2_root(mounts: &[CgroupMount]) -> anyhow::Result<PathBuf> {
    mounts
        .iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| Path::new(CGROUP_ROOT).join(&m.dir))
        .context("no cgroup v2 hierarchy is mounted under /sys/fs/cgroup: the node container needs one for its cgroup")
}

/// The node's cgroup directory name (under the cgroup v2 root).
fn cgroup_name(prefix: &str) -> String {
    format!("observer-lab-{prefix}-node")
}

/// Single-quotes `text` for the init script.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The script the node's init runs (as PID 1 of its namespaces, in its new root's
/// directory `$1`, hostname `$2`): it builds the root, pivots into it and becomes the
/// init. Everything it mounts stays in its mount namespace.
fn init_script(
    system_dirs: &[SystemDir],
    cgroups: &[CgroupMount],
    pod_netns: &[String],
    runtime_state: Option<&Path>,
) -> String {
    let mut lines = vec![
        "set -e".to_owned(),
        "mount --make-rprivate /".to_owned(),
        r#"mount --bind "$1" "$1""#.to_owned(),
        r#"cd "$1""#.to_owned(),
        "mkdir -p usr etc dev proc sys run tmp var .old".to_owned(),
        "ln -sfn /run var/run".to_owned(),
        "mount --bind -o ro /usr usr".to_owned(),
        "mount --bind -o ro /etc etc".to_owned(),
    ];
    for dir in system_dirs {
        lines.push(match dir {
            SystemDir::Link(name, target) => {
                format!("ln -sfn {} {name}", quoted(&target.to_string_lossy()))
            }
            SystemDir::Dir(name) => format!("mkdir -p {name} && mount --bind -o ro /{name} {name}"),
        });
    }
    lines.extend([
        "mount --rbind /dev dev".to_owned(),
        "mount -t proc proc proc".to_owned(),
        "mount -t sysfs sysfs sys".to_owned(),
    ]);
    if !cgroups.iter().any(|m| m.dir.is_empty()) {
        lines.push("mount -t tmpfs -o mode=755 cgroup sys/fs/cgroup".to_owned());
    }
    for mount in cgroups {
        let point = if mount.dir.is_empty() {
            quoted("sys/fs/cgroup")
        } else {
            quoted(&format!("sys/fs/cgroup/{}", mount.dir))
        };
        let options = if mount.options.is_empty() {
            String::new()
        } else {
            format!("-o {} ", quoted(&mount.options))
        };
        lines.push(format!(
            "mkdir -p {point} && mount -t {} {options}cgroup {point}",
            mount.fstype
        ));
    }
    lines.extend([
        "mount -t tmpfs -o mode=755 run run".to_owned(),
        "mount -t tmpfs tmp tmp".to_owned(),
        "mkdir run/netns".to_owned(),
    ]);
    for netns in pod_netns {
        let inside = quoted(&format!("run/netns/{netns}"));
        let outside = quoted(&format!("/run/netns/{netns}"));
        lines.push(format!("touch {inside} && mount --bind {outside} {inside}"));
    }
    if let Some(state) = runtime_state {
        lines.push(format!(
            "mkdir run/containerd && mount --bind -o ro {} run/containerd",
            quoted(&state.to_string_lossy())
        ));
    }
    lines.extend([
        "pivot_root . .old".to_owned(),
        "umount -l /.old".to_owned(),
        "rmdir /.old".to_owned(),
        r#"hostname "$2""#.to_owned(),
        "echo ready".to_owned(),
        "exec sleep infinity </dev/null >/dev/null 2>&1".to_owned(),
    ]);
    lines.join("\n")
}

impl NodeContainer {
    /// Starts the node container of the lab with prefix `prefix` around the network
    /// namespace `netns`, with root directory `root` (created here), binding the pods'
    /// netns `pod_netns` into its `/run/netns` and `runtime_state` (a containerd state
    /// directory) at its `/run/containerd`. Returns once its init runs in its root.
    pub(crate) fn start(
        prefix: &str,
        netns: &str,
        root: PathBuf,
        pod_netns: &[String],
        runtime_state: Option<&Path>,
    ) -> anyhow::Result<NodeContainer> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("cannot read /proc/self/mountinfo")?;
        let cgroups = cgroup_mounts(&mountinfo);
        let cgroup = cgroup2_root(&cgroups)?.join(cgroup_name(prefix));
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create {}", root.display()))?;
        std::fs::create_dir(&cgroup)
            .with_context(|| format!("cannot create the node's cgroup {}", cgroup.display()))?;
        let mut container = NodeContainer {
            hostname: netns.to_owned(),
            root,
            cgroup,
            unshare: None,
            init: 0,
        };
        // From here on, dropping `container` on an error removes what was made.
        let procs = cstring(&container.cgroup.join("cgroup.procs"))?;
        let mut command = Command::new(sys::find_tool("nsenter", "util-linux")?);
        command
            .arg(format!("--net=/run/netns/{netns}"))
            .arg(sys::find_tool("unshare", "util-linux")?)
            .args(["--pid", "--mount", "--uts", "--ipc", "--cgroup"])
            .args(["--propagation", "private", "--kill-child", "--"])
            .args(["/bin/sh", "-c"])
            .arg(init_script(
                &system_dirs(),
                &cgroups,
                pod_netns,
                runtime_state,
            ))
            .arg("node-init")
            .arg(&container.root)
            .arg(&container.hostname)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: `join_cgroup` only makes async-signal-safe system calls (open, write,
        // close) on a path made before fork.
        unsafe {
            command.pre_exec(move || join_cgroup(&procs));
        }
        let mut unshare = command.spawn().context("cannot start the node container")?;
        let stdout = unshare.stdout.take().context("the node's stdout")?;
        let stderr = unshare.stderr.take().context("the node's stderr")?;
        let unshare_pid = unshare.id();
        container.unshare = Some(unshare);
        let mut ready = String::new();
        BufReader::new(stdout).read_line(&mut ready)?;
        if ready.trim() != "ready" {
            let mut error = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut error);
            bail!("the node container did not start: {}", error.trim());
        }
        container.init = child_of(unshare_pid)
            .with_context(|| format!("unshare ({unshare_pid}) has no child: no node init"))?;
        Ok(container)
    }

    /// The node's init, by its pid on the host (`/proc/<pid>/root` is the node's root).
    pub fn init_pid(&self) -> u32 {
        self.init
    }

    /// The node's hostname (that of its UTS namespace).
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// The node's root directory as the host sees it: what is written there (not into
    /// the mounts the node made) is in the node's `/`, as `docker cp` puts it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `docker cp`: copies the host file `from` to `/<name>` in the node's root and
    /// returns its path inside the node.
    pub fn copy_in(&self, from: &Path, name: &str) -> anyhow::Result<PathBuf> {
        std::fs::copy(from, self.root.join(name))
            .with_context(|| format!("cannot copy {} into the node", from.display()))?;
        Ok(Path::new("/").join(name))
    }

    /// `docker exec`: spawns `command` (an absolute path inside the node) in every
    /// namespace of the node (PID, mount, UTS, IPC, cgroup, network) and in its cgroup.
    /// Its pid ([`Child::id`]) is its pid on the host, so it can be signalled and waited
    /// for as any child.
    pub fn exec(&self, command: &mut Command) -> anyhow::Result<Child> {
        self.spawn_inside(
            command,
            CloneFlags::CLONE_NEWNS
                | CloneFlags::CLONE_NEWUTS
                | CloneFlags::CLONE_NEWIPC
                | CloneFlags::CLONE_NEWCGROUP
                | CloneFlags::CLONE_NEWNET,
        )
    }

    /// Spawns a pod's process (it enters its pod's netns itself): in the node's PID
    /// namespace, UTS namespace and cgroup, as a kind node's pods run; its files are
    /// the host's.
    pub(crate) fn spawn_pod_process(&self, command: &mut Command) -> anyhow::Result<Child> {
        self.spawn_inside(command, CloneFlags::CLONE_NEWUTS)
    }

    /// Spawns `command` in the node's PID namespace and cgroup, and in its namespaces
    /// `entered`.
    fn spawn_inside(&self, command: &mut Command, entered: CloneFlags) -> anyhow::Result<Child> {
        let ns = |name: &str| {
            let path = format!("/proc/{}/ns/{name}", self.init);
            std::fs::File::open(&path).with_context(|| format!("cannot open {path}"))
        };
        let pid_ns = ns("pid")?;
        let mut joined = Vec::new();
        // The mount namespace last: entering it changes the root the others' paths were
        // opened under (they are open already, so only for tidiness).
        for (flag, name) in [
            (CloneFlags::CLONE_NEWCGROUP, "cgroup"),
            (CloneFlags::CLONE_NEWIPC, "ipc"),
            (CloneFlags::CLONE_NEWUTS, "uts"),
            (CloneFlags::CLONE_NEWNET, "net"),
            (CloneFlags::CLONE_NEWNS, "mnt"),
        ] {
            if entered.contains(flag) {
                joined.push((ns(name)?, flag));
            }
        }
        let procs = cstring(&self.cgroup.join("cgroup.procs"))?;
        let enter = move || -> std::io::Result<()> {
            join_cgroup(&procs)?;
            for (file, flag) in &joined {
                nix::sched::setns(file, *flag)?;
            }
            Ok(())
        };
        // SAFETY: `enter` writes to a cgroup file and calls setns(2) on descriptors opened
        // before fork: async-signal-safe system calls only, nothing allocated.
        unsafe {
            command.pre_exec(enter);
        }
        // A process enters a PID namespace only at fork: the fork happens on a thread of
        // its own that entered the node's (children of a thread that setns'd to a PID
        // namespace are born in it; the thread then ends, and the child stays ours).
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::setns(&pid_ns, CloneFlags::CLONE_NEWPID)
                        .context("cannot enter the node's PID namespace")?;
                    command.spawn().with_context(|| {
                        format!("cannot start {:?} in the node", command.get_program())
                    })
                })
                .join()
                .unwrap_or_else(|_| bail!("the thread starting a process in the node panicked"))
        })
    }
}

impl Lab {
    /// [`Lab::up`] with the node in a kind-like [`NodeContainer`]: the lab's node
    /// namespace is its network namespace, the pods' processes run in its PID
    /// namespace, and the pods' sandbox bundles are in its root where containerd keeps
    /// them (`/run/containerd/io.containerd.runtime.v2.task/k8s.io`).
    pub fn up_in_node_container(config: LabConfig) -> anyhow::Result<Lab> {
        Lab::up_with(config, true, None, true, &[Family::V4])
    }

    /// [`Lab::up_in_node_container`] without sandbox bundles: pods are named only by
    /// their hostnames.
    pub fn up_in_node_container_without_runtime_bundles(config: LabConfig) -> anyhow::Result<Lab> {
        Lab::up_with(config, false, None, true, &[Family::V4])
    }

    /// The node container, for a lab built with [`Lab::up_in_node_container`].
    pub fn node_container(&self) -> Option<&NodeContainer> {
        self.node_container.as_ref()
    }

    pub(crate) fn start_node_container(&mut self) -> anyhow::Result<()> {
        let pod_netns: Vec<String> = self.members().into_iter().map(|pod| pod.ns).collect();
        let runtime_state = crate::runtime::state(&self.state_dir);
        self.node_container = Some(NodeContainer::start(
            &self.config.prefix,
            &self.node_ns,
            self.state_dir.join("node-root"),
            &pod_netns,
            self.runtime_bundles.then_some(runtime_state.as_path()),
        )?);
        Ok(())
    }

    /// Spawns a pod's process: in the node container's PID namespace when there is one.
    pub(crate) fn spawn_pod_process(&self, command: &mut Command) -> anyhow::Result<Child> {
        match &self.node_container {
            Some(node) => node.spawn_pod_process(command),
            None => Ok(command.spawn()?),
        }
    }

    /// Ends the node container (and every process in it) first, when there is one.
    pub(crate) fn stop_node_container(&mut self) {
        self.node_container = None;
    }
}

fn cstring(path: &Path) -> anyhow::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).context("a path with a NUL byte")
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs` (writing 0
/// moves the writer). Called between fork and exec: system calls only, nothing allocated.
fn join_cgroup(procs: &CString) -> std::io::Result<()> {
    use nix::fcntl::{OFlag, open};
    let file = open(
        procs.as_c_str(),
        OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    nix::unistd::write(&file, b"0")?;
    Ok(())
}

/// The one child of process `parent` (found through /proc: the node's init, whose
/// parent is `unshare`).
fn child_of(parent: u32) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .find_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
                let ppid: u32 = status
                    .lines()
                    .find_map(|line| line.strip_prefix("PPid:"))?
                    .trim()
                    .parse()
                    .ok()?;
                (ppid == parent).then_some(pid)
            });
        if found.is_some() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes the node cgroup of the lab with this prefix once its processes are gone
/// (also after a crash, from `lab down`); returns whether it existed.
pub(crate) fn remove_cgroup(prefix: &str) -> bool {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let Ok(root) = cgroup2_root(&cgroup_mounts(&mountinfo)) else {
        return false;
    };
    let dir = root.join(cgroup_name(prefix));
    if !dir.exists() {
        return false;
    }
    remove_cgroup_dir(&dir);
    true
}

/// Removes the (empty) cgroup `dir` and the child cgroups left in it, waiting a little
/// for the exited processes to leave it.
fn remove_cgroup_dir(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(children) = std::fs::read_dir(dir) {
            for child in children.flatten().filter(|c| c.path().is_dir()) {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for NodeContainer {
    fn drop(&mut self) {
        // SIGKILL to a PID namespace's init from outside ends every process in it.
        if let Ok(init) = i32::try_from(self.init)
            && init > 0
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(init),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Some(mut unshare) = self.unshare.take() {
            // It exits once its child (the init) did; kill it too if the init never ran.
            if self.init == 0 {
                let _ = unshare.kill();
            }
            let _ = unshare.wait();
        }
        remove_cgroup_dir(&self.cgroup);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
35 24 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
37 35 0:32 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
40 35 0:35 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
41 35 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,cpu,cpuacct
50 24 0:40 / /proc rw - proc proc rw";

    #[test]
    fn the_hosts_cgroup_hierarchies_are_found_with_their_options() {
        let mounts = cgroup_mounts(HYBRID);
        let described: Vec<(&str, &str, &str)> = mounts
            .iter()
            .map(|m| (m.fstype.as_str(), m.options.as_str(), m.dir.as_str()))
            .collect();
        assert_eq!(
            described,
            [
                ("cgroup2", "", "unified"),
                ("cgroup", "xattr,name=systemd", "systemd"),
                ("cgroup", "memory", "memory"),
                ("cgroup", "cpu,cpuacct", "cpu,cpuacct"),
            ]
        );
        assert_eq!(
            cgroup2_root(&mounts).unwrap(),
            Path::new("/sys/fs/cgroup/unified")
        );
    }

    #[test]
    fn a_pure_cgroup2_host_mounts_it_at_the_root_of_the_hierarchies() {
        let mounts =
            cgroup_mounts("30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate");
        assert_eq!(
            mounts,
            [CgroupMount {
                fstype: "cgroup2".into(),
                options: "nsdelegate".into(),
                dir: String::new(),
            }]
        );
        let script = init_script(&[], &mounts, &[], None);
        assert!(
            !script.contains("mount -t tmpfs -o mode=755 cgroup"),
            "{script}"
        );
        assert!(
            script.contains("mkdir -p 'sys/fs/cgroup' && mount -t cgroup2 -o 'nsdelegate' cgroup 'sys/fs/cgroup'"),
            "{script}"
        );
        assert_eq!(cgroup2_root(&mounts).unwrap(), Path::new("/sys/fs/cgroup"));
    }

    #[test]
    fn the_init_script_binds_the_pods_netns_and_the_runtime_state() {
        let script = init_script(
            &[
                SystemDir::Link("bin", "usr/bin".into()),
                SystemDir::Dir("lib64"),
            ],
            &cgroup_mounts(HYBRID),
            &["lab-pod-a".to_owned()],
            Some(Path::new("/run/observer-lab/lab/containerd")),
        );
        assert!(script.contains(
            "touch 'run/netns/lab-pod-a' && mount --bind '/run/netns/lab-pod-a' 'run/netns/lab-pod-a'"
        ));
        assert!(script.contains(
            "mkdir run/containerd && mount --bind -o ro '/run/observer-lab/lab/containerd' run/containerd"
        ));
        assert!(script.contains("mount -t tmpfs -o mode=755 cgroup sys/fs/cgroup"));
        assert!(script.contains("ln -sfn 'usr/bin' bin\n"));
        assert!(script.contains("mkdir -p lib64 && mount --bind -o ro /lib64 lib64\n"));
        assert!(script.ends_with("exec sleep infinity </dev/null >/dev/null 2>&1"));
    }
}
