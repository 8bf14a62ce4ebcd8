//! Runs the node's own tools (`iptables-save`, `nft -j`) inside a network namespace to
//! dump its kube-proxy rules, and lists the namespaces reachable on this host. A tool
//! missing from this process's root (a scratch image, a static binary copied alone into
//! a node) is run from PID 1's root, inside PID 1's mount namespace.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::nft_changes::{ChainRef, Family};
use super::{Dump, DumpFormat, DumpSource, Dumps, RulesReadError};
use crate::kernel::host::{Cap, Caps};

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

/// Where the sbin directories are, which root's PATH may lack.
const TOOL_DIRS: [&str; 5] = ["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The node's init: its root and mount namespace hold the node's own tools, its UTS
/// namespace is the node's. PID 1, seen from a scratch container (hostPID) or from a
/// binary copied alone into a kind node. `OBSERVER_HOST_PID` names another one (tests
/// do: a sandbox's PID 1 may be a supervisor no process may look into).
pub(crate) fn host_pid() -> u32 {
    std::env::var("OBSERVER_HOST_PID")
        .ok()
        .and_then(|pid| pid.parse().ok())
        .unwrap_or(1)
}

/// Finds a program on PATH or in the sbin directories, in this process's own root.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(TOOL_DIRS.map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Finds a program in the host process's root (`/proc/1/root`); the path it returns is
/// the path inside that process's mount namespace.
fn find_host_program(name: &str) -> Option<PathBuf> {
    TOOL_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| {
            // Not `is_file`: tools are often absolute symlinks (/etc/alternatives/...),
            // which resolve against this root from here, against the node's after setns.
            let seen = Path::new(&format!("/proc/{}/root", host_pid()))
                .join(path.strip_prefix("/").unwrap_or(path));
            std::fs::symlink_metadata(seen).is_ok_and(|meta| !meta.is_dir())
        })
}

/// How to start one of the node's tools: the program, and the namespaces it must enter.
enum Tool {
    /// In this process's root.
    Own(PathBuf),
    /// In PID 1's root: run in PID 1's mount namespace.
    Host(PathBuf),
}

impl Tool {
    fn find(name: &str) -> Option<Tool> {
        find_program(name)
            .map(Tool::Own)
            .or_else(|| find_host_program(name).map(Tool::Host))
    }

    /// A command that runs the tool inside `netns` (when given), and inside PID 1's mount
    /// namespace for a host tool. The namespaces are opened here, entered in the child
    /// between fork and exec (single-threaded, so setns into a mount namespace works):
    /// nothing like nsenter is needed in this process's root.
    fn command(&self, netns: Option<&Path>) -> Result<Command, RulesReadError> {
        let open = |path: &Path| {
            std::fs::File::open(path).map_err(|err| RulesReadError::CannotOpen {
                path: path.to_owned(),
                err,
            })
        };
        let net = netns.map(open).transpose()?;
        let (program, mnt) = match self {
            Tool::Own(program) => (program, None),
            Tool::Host(program) => (
                program,
                Some(open(Path::new(&format!("/proc/{}/ns/mnt", host_pid())))?),
            ),
        };
        let mut command = Command::new(program);
        if net.is_some() || mnt.is_some() {
            let enter = move || -> std::io::Result<()> {
                use nix::sched::{CloneFlags, setns};
                if let Some(mnt) = &mnt {
                    setns(mnt, CloneFlags::CLONE_NEWNS)?;
                    nix::unistd::chdir("/")?;
                }
                if let Some(net) = &net {
                    setns(net, CloneFlags::CLONE_NEWNET)?;
                }
                Ok(())
            };
            // SAFETY: the closure only calls setns(2) and chdir(2), which are
            // async-signal-safe, and allocates nothing (the files were opened before fork).
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, enter);
            }
        }
        Ok(command)
    }

    /// Runs the tool with `args` inside `netns` (see [`Tool::command`]) and waits for
    /// its output; `shown` names the command in messages.
    fn output(
        &self,
        netns: Option<&Path>,
        args: &[&str],
        shown: &str,
    ) -> Result<std::process::Output, RulesReadError> {
        self.command(netns)?
            .args(args)
            // A pipe, not /dev/null: a scratch root may have no /dev.
            .stdin(std::process::Stdio::piped())
            .output()
            .map_err(|err| RulesReadError::CannotRun {
                command: shown.to_owned(),
                err,
            })
    }
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
    pub fn dump_path(&self, path: &Path) -> Result<Dumps, RulesReadError> {
        let own = netns_inode(Path::new("/proc/self/ns/net")).ok();
        let target = netns_inode(path).map_err(|err| RulesReadError::NamespaceUnknown {
            path: path.to_owned(),
            err,
        })?;
        let netns = (own != Some(target)).then_some(path);
        let tools: Vec<Option<Tool>> = COMMANDS
            .iter()
            .map(|(program, ..)| Tool::find(program))
            .collect();
        let mut missing: Vec<&str> = COMMANDS
            .iter()
            .zip(&tools)
            .filter(|((_, _, _, report), tool)| *report && tool.is_none())
            .map(|((program, ..), _)| *program)
            .collect();
        missing.dedup();
        if tools.iter().all(Option::is_none) {
            return Err(RulesReadError::NoTools(no_tools()));
        }
        if let Some(problem) = missing_capability(netns, &tools) {
            return Err(problem);
        }
        let mut result = Dumps::default();
        for ((program, args, format, report), tool) in COMMANDS.into_iter().zip(&tools) {
            let Some(tool) = tool else { continue };
            let command_text = std::iter::once(program)
                .chain(args.iter().copied())
                .collect::<Vec<_>>()
                .join(" ");
            let output = match tool.output(netns, args, &command_text) {
                Ok(output) => output,
                Err(e) => {
                    if report {
                        result.problems.push(e.to_string());
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
                result
                    .problems
                    .push(failed(&command_text, &output).to_string());
            }
        }
        result.problems.extend(
            missing
                .into_iter()
                .map(|program| format!("{program} not found")),
        );
        Ok(result)
    }
}

/// `COMMAND failed (STATUS): FIRST LINE OF STDERR`.
fn failed(shown: &str, output: &std::process::Output) -> RulesReadError {
    let stderr = String::from_utf8_lossy(&output.stderr);
    RulesReadError::Failed {
        command: shown.to_owned(),
        status: output.status,
        stderr: stderr.lines().next().unwrap_or("").trim().to_owned(),
    }
}

impl SystemSource {
    /// Fails with [`no_tools`]'s sentence when neither this root nor the node's init's
    /// holds `iptables-save` or `nft`: then no namespace's rules can be read.
    pub fn check_tools() -> Result<(), RulesReadError> {
        let any = COMMANDS
            .iter()
            .any(|(program, ..)| Tool::find(program).is_some());
        if any {
            Ok(())
        } else {
            Err(RulesReadError::NoTools(no_tools()))
        }
    }
}

/// Why no tool was found anywhere, with what to do about it: in this root there is
/// none, and the node's init's root (where the node's tools are) is unreadable, is this
/// very root, or has none either.
fn no_tools() -> String {
    let pid = host_pid();
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let readable = std::fs::read_dir(&root).map(|_| ());
    let shares_ours = match (std::fs::metadata(&root), std::fs::metadata("/")) {
        (Ok(theirs), Ok(ours)) => (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()),
        _ => false,
    };
    no_tools_sentence(
        pid,
        readable,
        Caps::effective().has(Cap::SysPtrace),
        shares_ours,
    )
}

/// [`no_tools`]'s sentence from what it found: whether `/proc/<pid>/root` could be
/// read, whether this process has CAP_SYS_PTRACE, whether that root is this one.
fn no_tools_sentence(
    pid: u32,
    readable: std::io::Result<()>,
    has_ptrace: bool,
    shares_ours: bool,
) -> String {
    const HINT: &str = "run observer with hostPID and CAP_SYS_PTRACE, or on the node itself";
    let root = format!("/proc/{pid}/root");
    match readable {
        Err(err) => {
            let why = err.raw_os_error().map_or_else(
                || err.to_string(),
                |code| nix::errno::Errno::from_raw(code).desc().to_owned(),
            );
            let lacking = if err.kind() == std::io::ErrorKind::PermissionDenied && !has_ptrace {
                ": this process lacks CAP_SYS_PTRACE"
            } else {
                ""
            };
            format!(
                "no iptables-save or nft in this root and {root} is not readable ({why}{lacking}); {HINT}"
            )
        }
        Ok(()) if shares_ours => format!(
            "no iptables-save or nft in this root, which is PID {pid}'s root too (no hostPID?); {HINT}"
        ),
        Ok(()) => format!(
            "no iptables-save or nft in this root nor in the node's ({root}); run observer where kube-proxy's iptables or nftables tools are installed"
        ),
    }
}

/// The first capability running these tools in `netns` needs that this process lacks,
/// as one sentence: checked up front, because the tools' own errors do not name it.
fn missing_capability(netns: Option<&Path>, tools: &[Option<Tool>]) -> Option<RulesReadError> {
    let mut needed = vec![(Cap::NetAdmin, "to read kube-proxy's rules")];
    if netns.is_some() {
        needed.push((Cap::SysAdmin, "to enter the node's network namespace"));
    }
    if tools.iter().any(|tool| matches!(tool, Some(Tool::Host(_)))) {
        let why = "to run the node's own iptables-save and nft in PID 1's mount namespace";
        needed.extend([(Cap::SysAdmin, why), (Cap::SysChroot, why)]);
    }
    let caps = Caps::effective();
    needed
        .into_iter()
        .find(|(cap, _)| !caps.has(*cap))
        .map(|(cap, why)| RulesReadError::MissingCapability {
            cap: cap.name(),
            why,
        })
}

impl DumpSource for SystemSource {
    fn survey(&mut self) -> Option<String> {
        super::survey::look(self).sentence()
    }

    fn dump(&mut self, netns: u32) -> Result<Dumps, RulesReadError> {
        let path = self
            .path_of(netns)
            .ok_or(RulesReadError::NamespaceUnreachable)?;
        self.dump_path(&path)
    }

    fn netns_path(&mut self, netns: u32) -> Option<PathBuf> {
        self.path_of(netns)
    }

    fn chain(&mut self, netns: u32, chain: &ChainRef) -> Result<String, RulesReadError> {
        let path = self.entered_path(netns)?;
        let netns = path.as_deref();
        // The nf_tables variant by name: plain `iptables` may be the legacy one.
        let program = match chain.family {
            Family::V4 => "iptables-nft",
            Family::V6 => "ip6tables-nft",
        };
        let tool = Tool::find(program).ok_or(RulesReadError::ToolMissing { program })?;
        let table = chain.table.name();
        let shown = format!("{program} -t {table} -S {}", chain.chain);
        let output = tool.output(netns, &["-t", table, "-S", &chain.chain], &shown)?;
        if !output.status.success() {
            return Err(failed(&shown, &output));
        }
        String::from_utf8(output.stdout).map_err(|_| RulesReadError::NotUtf8 { command: shown })
    }

    fn nft_object(
        &mut self,
        netns: u32,
        family: Family,
        verb: &str,
        name: &str,
    ) -> Result<Option<String>, RulesReadError> {
        let path = self.entered_path(netns)?;
        let tool = Tool::find("nft").ok_or(RulesReadError::ToolMissing { program: "nft" })?;
        let family = match family {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        };
        let args = ["-j", "list", verb, family, "kube-proxy", name];
        let shown = format!("nft {}", args.join(" "));
        let output = tool.output(path.as_deref(), &args, &shown)?;
        if output.status.success() {
            String::from_utf8(output.stdout)
                .map(Some)
                .map_err(|_| RulesReadError::NotUtf8 { command: shown })
        } else if String::from_utf8_lossy(&output.stderr).contains("No such file or directory") {
            Ok(None)
        } else {
            Err(failed(&shown, &output))
        }
    }
}

impl SystemSource {
    /// The path to enter to run a tool in `netns`; `None` when that is this process's
    /// own namespace.
    fn entered_path(&mut self, netns: u32) -> Result<Option<PathBuf>, RulesReadError> {
        let path = self
            .path_of(netns)
            .ok_or(RulesReadError::NamespaceUnreachable)?;
        let own = netns_inode(Path::new("/proc/self/ns/net")).ok();
        Ok((own != Some(netns)).then_some(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied() -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EACCES))
    }

    #[test]
    fn an_unreadable_init_root_is_named_with_its_cause_and_a_hint() {
        assert_eq!(
            no_tools_sentence(1, denied(), true, false),
            "no iptables-save or nft in this root and /proc/1/root is not readable (Permission denied); run observer with hostPID and CAP_SYS_PTRACE, or on the node itself"
        );
        assert_eq!(
            no_tools_sentence(7, denied(), false, false),
            "no iptables-save or nft in this root and /proc/7/root is not readable (Permission denied: this process lacks CAP_SYS_PTRACE); run observer with hostPID and CAP_SYS_PTRACE, or on the node itself"
        );
        let gone = Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            no_tools_sentence(1, gone, false, false),
            "no iptables-save or nft in this root and /proc/1/root is not readable (No such file or directory); run observer with hostPID and CAP_SYS_PTRACE, or on the node itself"
        );
    }

    #[test]
    fn a_readable_init_root_says_whether_it_is_ours() {
        assert_eq!(
            no_tools_sentence(1, Ok(()), true, true),
            "no iptables-save or nft in this root, which is PID 1's root too (no hostPID?); run observer with hostPID and CAP_SYS_PTRACE, or on the node itself"
        );
        assert_eq!(
            no_tools_sentence(1, Ok(()), true, false),
            "no iptables-save or nft in this root nor in the node's (/proc/1/root); run observer where kube-proxy's iptables or nftables tools are installed"
        );
    }
}
