//! The fallback for network namespaces no runtime bundle names: the UTS hostname of a
//! process in them (kubelet sets a sandbox's hostname to the pod's name). Namespaces
//! are found through `/proc/<pid>/ns/{net,uts}`; one process per (netns, UTS namespace)
//! pair is entered, on a thread of its own, to read the hostname. The node's own
//! namespaces (ours, and those of the kind nodes whose runtime state was read) name no pod.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::bundles::{PodScan, pod_from_hostnames};
use super::runtime::netns_addresses;
use crate::netns::{self, EnterError, Kind};

/// A namespace's identity: (device, inode) of its nsfs file.
pub(super) type NsId = (u64, u64);

pub(super) fn ns_id(path: &Path) -> std::io::Result<NsId> {
    std::fs::metadata(path).map(|meta| (meta.dev(), meta.ino()))
}

/// The namespaces and hostnames that are the node's and so name no pod: those of the
/// node's init (PID 1, or `OBSERVER_HOST_PID`), of this process, and of the processes
/// of kind nodes whose runtime state was read. The init's, not only ours: in a
/// container with a UTS namespace of its own, every process in the node's UTS
/// namespace would otherwise look like a pod named after the node.
#[derive(Debug, Default)]
struct NodeNamespaces {
    net: HashSet<NsId>,
    uts: HashSet<NsId>,
    hostnames: HashSet<String>,
}

impl NodeNamespaces {
    /// `(net, uts, hostname)` of each process that is the node's; what could not be
    /// read (an init this process may not look into) is `None`.
    fn new(
        processes: impl IntoIterator<Item = (Option<NsId>, Option<NsId>, Option<String>)>,
    ) -> NodeNamespaces {
        let mut node = NodeNamespaces::default();
        for (net, uts, hostname) in processes {
            node.net.extend(net);
            node.uts.extend(uts);
            node.hostnames.extend(hostname);
        }
        node
    }

    /// Whether a process in `net` and `uts` may be a pod's: its netns was not named by a
    /// bundle already (`named`) and neither namespace is the node's.
    fn may_be_pod(&self, named: &HashSet<NsId>, net: NsId, uts: NsId) -> bool {
        !named.contains(&net) && !self.net.contains(&net) && !self.uts.contains(&uts)
    }
}

/// Adds by hostname the addresses of every netns on this host that is not in `named`
/// (read from bundles already) and holds a process outside the node's UTS namespaces.
/// `node_procs` are `/proc/<pid>` of processes on nodes whose runtime state was read.
pub(super) fn scan(named: &HashSet<NsId>, node_procs: &[PathBuf], scan: &mut PodScan) {
    let own_hostname = nix::sys::utsname::uname()
        .ok()
        .and_then(|uts| uts.nodename().to_str().map(str::to_owned));
    let own = Path::new("/proc/self");
    let init = PathBuf::from(format!(
        "/proc/{}",
        crate::naming::services::source::host_pid()
    ));
    // The init's hostname is read by entering its UTS namespace (ours may differ).
    let init_hostname = hostname(&init.join("ns/uts")).ok();
    let node = NodeNamespaces::new(
        [(own, own_hostname), (init.as_path(), init_hostname)]
            .into_iter()
            .chain(node_procs.iter().map(|proc| (proc.as_path(), None)))
            .map(|(proc, hostname)| {
                (
                    ns_id(&proc.join("ns/net")).ok(),
                    ns_id(&proc.join("ns/uts")).ok(),
                    hostname,
                )
            }),
    );
    for (netns, utses) in candidates(scan, |net, uts| node.may_be_pod(named, net, uts)) {
        let Some(first) = utses.values().next() else {
            continue;
        };
        let mut hostnames = Vec::new();
        for proc in utses.values() {
            match hostname(&proc.join("ns/uts")) {
                Ok(name) => hostnames.push(name),
                Err(err) if vanished(&err) || exiting(proc) => {}
                Err(err) => scan
                    .skipped
                    .push(format!("{}: {err}", proc.join("ns/uts").display())),
            }
        }
        let name = match pod_from_hostnames(&hostnames, &node.hostnames) {
            Ok(Some(name)) => name,
            Ok(None) => continue,
            Err(err) => {
                scan.skipped
                    .push(format!("network namespace {}: {err}", netns.1));
                continue;
            }
        };
        let path = first.join("ns/net");
        match netns_addresses(&path) {
            Ok(addresses) => scan.add_by_hostname(&name, &addresses),
            Err(err) if err.is_gone() => {}
            Err(err) => scan.skipped.push(format!("{}: {err}", path.display())),
        }
    }
}

/// Per netns that `keep` accepts, one `/proc/<pid>` per UTS namespace in it (lowest pid).
fn candidates(
    scan: &mut PodScan,
    keep: impl Fn(NsId, NsId) -> bool,
) -> BTreeMap<NsId, BTreeMap<NsId, PathBuf>> {
    let mut found: BTreeMap<NsId, BTreeMap<NsId, (u32, PathBuf)>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        scan.skipped.push("/proc: cannot list processes".to_owned());
        return BTreeMap::new();
    };
    let mut unreadable = None;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let proc = entry.path();
        let ids =
            ns_id(&proc.join("ns/net")).and_then(|net| Ok((net, ns_id(&proc.join("ns/uts"))?)));
        match ids {
            Ok((net, uts)) if keep(net, uts) => {
                let slot = found
                    .entry(net)
                    .or_default()
                    .entry(uts)
                    .or_insert((pid, proc.clone()));
                if pid < slot.0 {
                    *slot = (pid, proc);
                }
            }
            Ok(_) => {}
            Err(err) if vanished(&err) || exiting(&proc) => {}
            Err(err) => unreadable = Some(err),
        }
    }
    // One stable cause (not one per pid), so it is warned once.
    if let Some(err) = unreadable {
        scan.skipped
            .push(format!("/proc/<pid>/ns of some processes: {err}"));
    }
    found
        .into_iter()
        .map(|(net, utses)| {
            (
                net,
                utses.into_iter().map(|(uts, (_, p))| (uts, p)).collect(),
            )
        })
        .collect()
}

/// A process that ended while it was being looked at: not worth a warning.
fn vanished(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH))
}

/// Whether the process at `proc` (`/proc/<pid>`) is gone or on its way out: a process
/// that is exiting can refuse its namespaces' links for a moment (seen as `EACCES` on
/// Debian's 6.12 arm64 and on 6.18), which is no reason to warn.
fn exiting(proc: &Path) -> bool {
    /// `PF_EXITING` in the flags of `/proc/<pid>/stat`.
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = std::fs::read_to_string(proc.join("stat")) else {
        return true;
    };
    // After the command name in parentheses: state, ppid, pgrp, session, tty, tpgid, flags.
    let Some((_, fields)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = fields.split_whitespace();
    let state = fields.next().unwrap_or("");
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

/// The hostname of the UTS namespace at `path`, read on a thread that enters it.
fn hostname(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let read = netns::run_in(&file, Kind::Uts, || {
        nix::sys::utsname::uname().map(|uts| uts.nodename().to_string_lossy().into_owned())
    });
    match read {
        Ok(hostname) => Ok(hostname?),
        Err(EnterError::Panicked) => Err(std::io::Error::other("the hostname reader panicked")),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_running_process_is_not_exiting_and_a_gone_one_is() {
        assert!(!super::exiting(std::path::Path::new("/proc/self")));
        assert!(super::exiting(std::path::Path::new("/proc/4294967295")));
    }

    use super::*;

    const NODE_NET: NsId = (4, 100);
    const NODE_UTS: NsId = (4, 101);
    const OWN_UTS: NsId = (4, 102);
    const POD_NET: NsId = (4, 200);
    const POD_UTS: NsId = (4, 201);

    #[test]
    fn in_a_container_with_its_own_uts_namespace_the_inits_is_the_nodes() {
        // observer: the node's network, a UTS namespace of its own; the node's init.
        let node = NodeNamespaces::new([
            (
                Some(NODE_NET),
                Some(OWN_UTS),
                Some("observer-x7k2p".to_owned()),
            ),
            (
                Some(NODE_NET),
                Some(NODE_UTS),
                Some("kind-worker".to_owned()),
            ),
        ]);
        let named = HashSet::new();
        // A pod's process in the node's UTS namespace (the lab's servers are) names no
        // pod after the node; the pod's pause process in the pod's names it.
        assert!(!node.may_be_pod(&named, POD_NET, NODE_UTS));
        assert!(node.may_be_pod(&named, POD_NET, POD_UTS));
        assert!(!node.may_be_pod(&named, NODE_NET, POD_UTS));
        assert!(!node.may_be_pod(&HashSet::from([POD_NET]), POD_NET, POD_UTS));
        assert!(node.hostnames.contains("kind-worker"));
    }

    #[test]
    fn an_init_that_cannot_be_read_leaves_our_own_namespaces() {
        let node = NodeNamespaces::new([
            (Some(NODE_NET), Some(NODE_UTS), Some("vm".to_owned())),
            (None, None, None),
        ]);
        assert!(!node.may_be_pod(&HashSet::new(), POD_NET, NODE_UTS));
        assert!(node.may_be_pod(&HashSet::new(), POD_NET, POD_UTS));
        assert_eq!(node.hostnames, HashSet::from(["vm".to_owned()]));
    }
}
