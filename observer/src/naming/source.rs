//! Runs the node's own tools (`iptables-save`, `nft -j`) inside a network namespace to
//! dump its kube-proxy rules, and lists the namespaces reachable on this host.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Dump, DumpFormat, DumpSource, Dumps};

/// A network namespace and a path that opens it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsInfo {
    pub inode: u32,
    pub path: PathBuf,
}

/// The inode that identifies the network namespace `path` refers to.
pub fn netns_inode(path: &Path) -> std::io::Result<u32> {
    let inode = std::fs::metadata(path)?.ino();
    u32::try_from(inode).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("inode {inode} does not fit 32 bits"),
        )
    })
}

/// Every network namespace reachable through `/run/netns/*` (named, listed first) or a
/// process's `/proc/PID/ns/net`, one path per namespace.
pub fn list_namespaces() -> Vec<NetnsInfo> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let mut consider = |path: PathBuf| {
        if let Ok(inode) = netns_inode(&path)
            && seen.insert(inode)
        {
            found.push(NetnsInfo { inode, path });
        }
    };
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        paths.into_iter().for_each(&mut consider);
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        let mut pids: Vec<u32> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort_unstable();
        for pid in pids {
            consider(PathBuf::from(format!("/proc/{pid}/ns/net")));
        }
    }
    found
}

/// Finds a program on PATH or in the sbin directories, which root's PATH may lack.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Reads rules by running the host's tools inside each namespace.
#[derive(Default)]
pub struct SystemSource {
    paths: HashMap<u32, PathBuf>,
}

/// (program, arguments, format, whether a failure is worth reporting).
const COMMANDS: [(&str, &[&str], DumpFormat, bool); 6] = [
    ("iptables-save", &[], DumpFormat::IptablesSave, true),
    ("ip6tables-save", &[], DumpFormat::IptablesSave, true),
    // Legacy tables exist only where a node still uses them; most kernels refuse them.
    ("iptables-legacy-save", &[], DumpFormat::IptablesSave, false),
    (
        "ip6tables-legacy-save",
        &[],
        DumpFormat::IptablesSave,
        false,
    ),
    (
        "nft",
        &["-j", "list", "table", "ip", "kube-proxy"],
        DumpFormat::NftJson,
        true,
    ),
    (
        "nft",
        &["-j", "list", "table", "ip6", "kube-proxy"],
        DumpFormat::NftJson,
        true,
    ),
];

impl SystemSource {
    pub fn new() -> Self {
        SystemSource::default()
    }

    fn path_of(&mut self, netns: u32) -> Option<PathBuf> {
        if !self.paths.contains_key(&netns) {
            self.paths = list_namespaces()
                .into_iter()
                .map(|info| (info.inode, info.path))
                .collect();
        }
        self.paths.get(&netns).cloned()
    }

    /// Dumps the rules of the namespace `path` opens.
    pub fn dump_path(&self, path: &Path) -> Result<Dumps, String> {
        let own = netns_inode(Path::new("/proc/self/ns/net")).ok();
        let target = netns_inode(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let nsenter = if own == Some(target) {
            None
        } else {
            Some(find_program("nsenter").ok_or("nsenter not found")?)
        };
        let mut result = Dumps::default();
        let mut missing = Vec::new();
        let mut any_tool = false;
        for (program, args, format, report) in COMMANDS {
            let command_text = std::iter::once(program)
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" ");
            let Some(binary) = find_program(program) else {
                if report && !missing.contains(&program) {
                    missing.push(program);
                }
                continue;
            };
            any_tool = true;
            let mut command = match &nsenter {
                Some(nsenter) => {
                    let mut command = Command::new(nsenter);
                    command
                        .arg(format!("--net={}", path.display()))
                        .arg(&binary);
                    command
                }
                None => Command::new(&binary),
            };
            let output = match command.args(args).output() {
                Ok(output) => output,
                Err(e) => {
                    if report {
                        result.problems.push(format!("{command_text}: {e}"));
                    }
                    continue;
                }
            };
            let stderr = String::from_utf8_lossy(&output.stderr);
            if output.status.success() {
                result.dumps.push(Dump {
                    command: command_text,
                    format,
                    text: String::from_utf8_lossy(&output.stdout).into_owned(),
                });
            } else if format == DumpFormat::NftJson && stderr.contains("No such file or directory")
            {
                // No kube-proxy table in this family: not an error.
            } else if report {
                let first = stderr.lines().next().unwrap_or("").trim();
                result.problems.push(format!(
                    "{command_text} failed ({}): {first}",
                    output.status
                ));
            }
        }
        if !any_tool {
            return Err(format!("{} not found", missing.join(", ")));
        }
        result.problems.extend(
            missing
                .into_iter()
                .map(|program| format!("{program} not found")),
        );
        Ok(result)
    }
}

impl DumpSource for SystemSource {
    fn dump(&mut self, netns: u32) -> Result<Dumps, String> {
        let path = self
            .path_of(netns)
            .ok_or_else(|| "no process or /run/netns entry is in this namespace".to_owned())?;
        self.dump_path(&path)
    }

    fn netns_path(&mut self, netns: u32) -> Option<PathBuf> {
        self.path_of(netns)
    }
}
