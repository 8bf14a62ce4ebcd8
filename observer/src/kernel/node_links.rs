//! Which network namespaces get the netfilter program, and linking it in each: at
//! start, and in namespaces that appear later (checked at every sweep).
//!
//! A node namespace is where kube-proxy's DNAT happens. By default: observer's own (a
//! DaemonSet pod on the host network, or observer inside a kind node), the namespaces of
//! `kube-proxy` processes (kind nodes seen from their host), and every namespace named
//! in `/run/netns` except CNI's pod namespaces, which containerd names `cni-<uuid>`
//! (a lab's nodes; pods' own namespaces hold no Service DNAT). `--node-netns` names
//! them instead. A namespace that cannot be linked is said once, in a warning; one
//! whose file is gone is unlinked, so that its link does not keep it alive. A linked
//! namespace with an nftables flowtable is said in a warning (see `flowtables`),
//! checked when linked and every ten seconds after.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::kernel::flowtables::{self, watch::Watch};
use crate::kernel::netfilter::{Links, NetfilterProgram};
use crate::netns;

/// How often the process table is read for new `kube-proxy` processes: reading every
/// process's name costs milliseconds on a busy node, `/run/netns` one directory read.
const PROCESS_SCAN: Duration = Duration::from_secs(10);

/// The program and where it is linked.
#[derive(Debug)]
pub struct NodeLinks {
    program: NetfilterProgram,
    /// `--node-netns`: only these, when given.
    explicit: Vec<PathBuf>,
    /// By namespace inode.
    linked: HashMap<u64, (PathBuf, Links)>,
    /// Namespaces that refused, said once.
    refused: HashSet<u64>,
    /// The namespaces of `kube-proxy` processes, as last read, and when.
    processes: (Vec<PathBuf>, Option<Instant>),
    /// The linked namespaces' flowtables.
    flowtables: Watch,
}

impl NodeLinks {
    pub fn new(program: NetfilterProgram, explicit: Vec<PathBuf>) -> NodeLinks {
        NodeLinks {
            program,
            explicit,
            linked: HashMap::new(),
            refused: HashSet::new(),
            processes: (Vec::new(), None),
            flowtables: Watch::default(),
        }
    }

    /// Links the program in every node namespace not linked yet; one sentence per
    /// namespace that refused (said once).
    pub fn link_new(&mut self) -> Vec<String> {
        // A link holds its namespace (Linux 6.12+): one whose file went (`ip netns
        // delete`, a process that exited) is let go, or it would live on unused.
        self.linked.retain(|inode, (path, _)| {
            std::fs::metadata(path.as_path()).is_ok_and(|m| m.ino() == *inode)
        });
        let mut warnings = Vec::new();
        for path in self.candidates() {
            let Ok(inode) = std::fs::metadata(&path).map(|m| m.ino()) else {
                continue;
            };
            if self.linked.contains_key(&inode) || self.refused.contains(&inode) {
                continue;
            }
            let program = &self.program;
            let linked = netns::run_in_file(&path, netns::Kind::Network, || {
                (program.link_here(), flowtables::in_current_namespace())
            });
            match linked {
                Ok((Ok(links), flowtables)) => {
                    log::debug!(
                        "netfilter program linked in {} ({})",
                        path.display(),
                        links.families.join(", ")
                    );
                    self.flowtables.say(inode, &path, flowtables, &mut warnings);
                    self.linked.insert(inode, (path, links));
                }
                Ok((Err(err), _)) => {
                    self.refused.insert(inode);
                    warnings.push(format!(
                        "network namespace {} ({}) is not watched: {err}",
                        inode,
                        path.display()
                    ));
                }
                // Gone between the listing and the link: nothing to watch.
                Err(netns::EnterError::Open(err)) if err.kind() == std::io::ErrorKind::NotFound => {
                }
                Err(err) => {
                    self.refused.insert(inode);
                    warnings.push(format!(
                        "{} is not watched: cannot enter it as a network namespace ({err})",
                        path.display()
                    ));
                }
            }
        }
        self.read_flowtables(&mut warnings);
        warnings
    }

    /// Reads the linked namespaces' flowtables again, every `flowtables::watch::EVERY`.
    fn read_flowtables(&mut self, warnings: &mut Vec<String>) {
        if !self.flowtables.due(Instant::now()) {
            return;
        }
        for (inode, (path, _)) in &self.linked {
            // Deleted since it was linked: nothing said, the next call lets its link go.
            self.flowtables.read(*inode, path, warnings);
        }
    }

    /// How many namespaces the program is linked in.
    pub fn namespaces(&self) -> usize {
        self.linked.len()
    }

    /// The inodes of the namespaces the program is linked in.
    pub fn inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.linked.keys().copied()
    }

    /// Unhooks the program everywhere.
    pub fn unlink(&mut self) {
        self.linked.clear();
    }

    fn candidates(&mut self) -> Vec<PathBuf> {
        if !self.explicit.is_empty() {
            return self.explicit.clone();
        }
        let due = self
            .processes
            .1
            .is_none_or(|at| at.elapsed() >= PROCESS_SCAN);
        if due {
            self.processes = (kube_proxy_namespaces(), Some(Instant::now()));
        }
        let mut out = vec![PathBuf::from("/proc/self/ns/net")];
        out.extend(self.processes.0.iter().cloned());
        out.extend(named_node_namespaces(Path::new("/run/netns")));
        out
    }
}

/// The namespaces of `kube-proxy` processes.
fn kube_proxy_namespaces() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("comm"))
                .is_ok_and(|comm| comm.trim() == "kube-proxy")
        })
        .map(|entry| entry.path().join("ns/net"))
        .collect()
}

/// The namespaces named in `dir` (`/run/netns`) but CNI's pod namespaces, sorted.
fn named_node_namespaces(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| is_node_name(&entry.file_name().to_string_lossy()))
        .map(|entry| entry.path())
        .collect();
    out.sort();
    out
}

/// Whether a `/run/netns` name may be a node's: containerd names a pod's namespace
/// `cni-` and a UUID (internal/cri/server/sandbox_run.go, `netns.NewNetNS`).
fn is_node_name(name: &str) -> bool {
    !name.starts_with("cni-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_namespaces_named_by_containerd_are_no_nodes() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "lab-node",
            "cni-5f3c2d1e-aaaa-bbbb-cccc-0123456789ab",
            "a-pod",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let found = named_node_namespaces(dir.path());
        assert_eq!(
            found,
            vec![dir.path().join("a-pod"), dir.path().join("lab-node")]
        );
        assert!(named_node_namespaces(&dir.path().join("missing")).is_empty());
    }
}
