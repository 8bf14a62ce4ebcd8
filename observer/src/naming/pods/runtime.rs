//! The edge of pod naming: finds sandbox bundles under the runtime state roots (on this
//! host and, for kind, inside every node container's root), and reads each pod's
//! addresses from inside its network namespace (`setns` + `getifaddrs` on a thread of
//! its own, no external tool). Netns that no bundle names are named by the hostname of
//! a process in them ([`super::hostnames`]).

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use super::PodSource;
use super::bundles::{BundleError, PodScan, parse_bundle};
use super::hostnames;
use crate::netns::{self, EnterError, Kind};

/// Where containerd (kind's runtime, 1.x and 2.x) and CRI-O keep their sandbox bundles.
pub const DEFAULT_RUNTIME_ROOTS: [&str; 2] = [
    "/run/containerd/io.containerd.runtime.v2.task/k8s.io",
    "/run/containers/storage/overlay-containers",
];

/// Reads the runtime state under `roots` (each a directory of `<id>/config.json` or
/// `<id>/userdata/config.json` bundles), on this host and through `/proc/<pid>/root` of
/// one process per other mount namespace (the nodes of kind).
pub struct RuntimeSource {
    roots: Vec<PathBuf>,
    /// Also name netns no bundle names by their processes' hostnames.
    hostnames: bool,
}

impl RuntimeSource {
    pub fn new(roots: Vec<PathBuf>) -> RuntimeSource {
        RuntimeSource {
            roots,
            hostnames: true,
        }
    }

    /// Only what the bundles say (the hostname fallback reads every process on the host).
    pub fn bundles_only(mut self) -> RuntimeSource {
        self.hostnames = false;
        self
    }
}

impl PodSource for RuntimeSource {
    fn scan(&mut self) -> PodScan {
        let mut scan = PodScan::default();
        let mut seen_dirs = HashSet::new();
        // Netns that bundles named, and processes of kind nodes whose state was read.
        let mut named = HashSet::new();
        let mut node_procs = Vec::new();
        for (node_root, proc) in node_roots() {
            for root in &self.roots {
                let dir = node_root.join(root.strip_prefix("/").unwrap_or(root));
                // The same directory reached through another process's root: read once.
                let Ok(meta) = std::fs::metadata(&dir) else {
                    continue;
                };
                if meta.is_dir() && seen_dirs.insert((meta.dev(), meta.ino())) {
                    scan_dir(&node_root, &dir, &mut scan, &mut named);
                    node_procs.extend(proc.clone());
                }
            }
        }
        if self.hostnames {
            hostnames::scan(&named, &node_procs, &mut scan);
        }
        scan
    }
}

/// `/` and, per mount namespace other than ours, `/proc/<pid>/root` of one process in it
/// (with that `/proc/<pid>`).
fn node_roots() -> Vec<(PathBuf, Option<PathBuf>)> {
    let mut roots = vec![(PathBuf::from("/"), None)];
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = HashSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return roots;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(mnt) = std::fs::read_link(entry.path().join("ns/mnt")) else {
            continue;
        };
        if Some(&mnt) != ours.as_ref() && seen.insert(mnt) {
            roots.push((entry.path().join("root"), Some(entry.path())));
        }
    }
    roots
}

fn scan_dir(
    node_root: &Path,
    dir: &Path,
    scan: &mut PodScan,
    named: &mut HashSet<hostnames::NsId>,
) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) => {
            scan.skipped.push(format!("{}: {err}", dir.display()));
            return;
        }
    };
    for entry in entries.flatten() {
        let bundle = entry.path();
        let Some(config) = ["config.json", "userdata/config.json"]
            .iter()
            .map(|name| bundle.join(name))
            .find(|path| path.exists())
        else {
            continue;
        };
        let sandbox = read_bundle(&config)
            .and_then(|text| parse_bundle(&text).map_err(BundleReadError::Invalid));
        match sandbox {
            Ok(Some(sandbox)) => {
                let Some(netns) = &sandbox.netns else {
                    continue;
                };
                let path = within(node_root, netns);
                match netns_addresses(&path) {
                    Ok(addresses) => {
                        scan.add(&sandbox, &addresses);
                        named.extend(hostnames::ns_id(&path).ok());
                    }
                    Err(err) => scan.skipped.push(format!("{}: {err}", path.display())),
                }
            }
            Ok(None) => {}
            Err(err) => scan.skipped.push(format!("{}: {err}", config.display())),
        }
    }
}

/// A runtime spec is a few KiB; anything far larger is not one (and is not read).
pub(super) const MAX_BUNDLE_BYTES: u64 = 4 << 20;

/// Why a bundle's `config.json` named no sandbox.
#[derive(Debug, thiserror::Error)]
pub(super) enum BundleReadError {
    #[error("{0}")]
    Unreadable(std::io::Error),
    #[error("{0} bytes: too large for a runtime spec")]
    TooLarge(u64),
    #[error("{0}")]
    Invalid(BundleError),
}

fn read_bundle(path: &Path) -> Result<String, BundleReadError> {
    let size = std::fs::metadata(path)
        .map_err(BundleReadError::Unreadable)?
        .len();
    if size > MAX_BUNDLE_BYTES {
        return Err(BundleReadError::TooLarge(size));
    }
    std::fs::read_to_string(path).map_err(BundleReadError::Unreadable)
}

/// Why the addresses of a network namespace could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsAddressesError {
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    #[error("cannot enter the network namespace: {0}")]
    Enter(nix::errno::Errno),
    #[error("cannot list addresses: {0}")]
    List(nix::errno::Errno),
    #[error("the address reader panicked")]
    Panicked,
    #[error("{0}")]
    Thread(EnterError),
}

impl NetnsAddressesError {
    /// Whether the namespace file is gone (its process ended meanwhile).
    pub(super) fn is_gone(&self) -> bool {
        match self {
            NetnsAddressesError::Open(err)
            | NetnsAddressesError::Thread(EnterError::Open(err) | EnterError::Spawn(err)) => {
                err.kind() == std::io::ErrorKind::NotFound
            }
            _ => false,
        }
    }
}

/// `path` as seen from `node_root`: absolute symlinks on the way (a node's `/var/run` is
/// usually a link to `/run`) resolve inside the node's root, not ours.
pub(super) fn within(node_root: &Path, path: &Path) -> PathBuf {
    // Components still to walk, last first; `..` stays a component.
    fn parts(path: &Path) -> impl Iterator<Item = std::ffi::OsString> + '_ {
        path.components().rev().filter_map(|c| match c {
            std::path::Component::Normal(name) => Some(name.to_owned()),
            std::path::Component::ParentDir => Some("..".into()),
            _ => None,
        })
    }
    let mut resolved = node_root.to_path_buf();
    let mut pending: Vec<std::ffi::OsString> = parts(path).collect();
    let mut hops = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            if resolved != node_root {
                resolved.pop();
            }
            continue;
        }
        let next = resolved.join(&name);
        match std::fs::read_link(&next) {
            // A loop ends as an unresolved path, which then fails to open.
            Ok(target) if hops < 40 => {
                hops += 1;
                if target.is_absolute() {
                    resolved = node_root.to_path_buf();
                }
                pending.extend(parts(&target));
            }
            _ => resolved = next,
        }
    }
    resolved
}

/// The addresses of the interfaces in the network namespace at `path`, read on a thread
/// that enters it (entering changes only the calling thread's namespace).
pub fn netns_addresses(path: &Path) -> Result<Vec<IpAddr>, NetnsAddressesError> {
    // Non-blocking: a path that names a FIFO must not stall the scan.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(NetnsAddressesError::Open)?;
    let read = netns::run_in(&file, Kind::Network, || {
        let addresses = nix::ifaddrs::getifaddrs().map_err(NetnsAddressesError::List)?;
        Ok(addresses
            .filter_map(|a| a.address)
            .filter_map(|a| {
                a.as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
            })
            .collect())
    });
    match read {
        Ok(addresses) => addresses,
        Err(EnterError::Enter(errno)) => Err(NetnsAddressesError::Enter(errno)),
        Err(EnterError::Panicked) => Err(NetnsAddressesError::Panicked),
        Err(err) => Err(NetnsAddressesError::Thread(err)),
    }
}
