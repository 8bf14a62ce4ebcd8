//! Running the tools the lab needs, and finding and ending what a lab left behind.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Where each lab keeps its scripts, logs and pids: `/run/observer-lab/<prefix>/`.
pub const STATE_ROOT: &str = "/run/observer-lab";

pub fn state_dir(prefix: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(prefix)
}

/// Absolute paths of the programs the lab runs.
#[derive(Clone, Debug)]
pub struct Tools {
    pub ip: PathBuf,
    pub iptables: PathBuf,
    pub iptables_restore: PathBuf,
    pub iptables_save: PathBuf,
    pub nft: PathBuf,
    pub conntrack: PathBuf,
    pub python3: PathBuf,
}

impl Tools {
    /// Finds every tool, or names the Debian package that is missing.
    pub fn find() -> anyhow::Result<Tools> {
        Ok(Tools {
            ip: find_tool("ip", "iproute2")?,
            iptables: find_tool("iptables", "iptables")?,
            iptables_restore: find_tool("iptables-restore", "iptables")?,
            iptables_save: find_tool("iptables-save", "iptables")?,
            nft: find_tool("nft", "nftables")?,
            conntrack: find_tool("conntrack", "conntrack")?,
            // Debian's own interpreter first: it starts faster than a version-manager shim.
            python3: find_in(&["/usr/bin"], "python3")
                .map_or_else(|| find_tool("python3", "python3"), Ok)?,
        })
    }
}

/// Only what watching conntrack needs, so a watch works without the rest installed.
pub fn ip_and_conntrack() -> anyhow::Result<(PathBuf, PathBuf)> {
    Ok((
        find_tool("ip", "iproute2")?,
        find_tool("conntrack", "conntrack")?,
    ))
}

fn find_in(dirs: &[&str], name: &str) -> Option<PathBuf> {
    dirs.iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Looks in PATH, then in the sbin directories a non-login root shell may lack.
pub fn find_tool(name: &str, package: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut dirs: Vec<&str> = path.split(':').filter(|d| !d.is_empty()).collect();
    dirs.extend(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"]);
    find_in(&dirs, name).with_context(|| {
        format!("`{name}` is not installed: install the Debian package `{package}` (`cargo xtask setup` installs everything the lab needs)")
    })
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
pub fn run(cmd: &mut Command) -> anyhow::Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    succeeded(cmd, out)
}

/// `out` when the command exited 0; otherwise an error carrying its stderr.
fn succeeded(cmd: &Command, out: Output) -> anyhow::Result<Output> {
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Like [`run`], feeding `input` on stdin (rules for `iptables-restore` / `nft -f -`).
pub fn run_with_input(cmd: &mut Command, input: &str) -> anyhow::Result<Output> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    child
        .stdin
        .take()
        .context("child has no stdin")?
        .write_all(input.as_bytes())
        .with_context(|| format!("could not write to `{}`", describe(cmd)))?;
    let out = child.wait_with_output()?;
    succeeded(cmd, out)
}

/// `ip netns exec <ns> <program> ...` as a Command.
pub fn in_netns(ip: &Path, netns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(ip);
    cmd.arg("netns").arg("exec").arg(netns).arg(program);
    cmd
}

/// All network namespaces `ip netns` knows.
pub fn list_netns(ip: &Path) -> anyhow::Result<Vec<String>> {
    let out = run(Command::new(ip).args(["netns", "list"]))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Whether `name` is one of the namespaces a lab with this prefix makes.
pub fn is_lab_netns(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|rest| matches!(rest, "node" | "client" | "peer") || rest.starts_with("pod-"))
}

/// The pids of processes living in a namespace.
pub fn netns_pids(ip: &Path, netns: &str) -> anyhow::Result<Vec<i32>> {
    let out = run(Command::new(ip).args(["netns", "pids", netns]))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only its parent can reap it.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next())
                != Some("Z")
        }
        Err(_) => false,
    }
}

/// Ends one process by id: SIGTERM, then SIGKILL if it is still there after a second.
pub fn end_process(pid: i32) {
    if kill(Pid::from_raw(pid), Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Ends every process in a namespace, then deletes the namespace.
pub fn remove_netns(ip: &Path, netns: &str) -> anyhow::Result<()> {
    for pid in netns_pids(ip, netns)? {
        end_process(pid);
    }
    run(Command::new(ip).args(["netns", "delete", netns]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_namespaces_are_recognised_by_shape() {
        assert!(is_lab_netns("obs", "obs-node"));
        assert!(is_lab_netns("obs", "obs-client"));
        assert!(is_lab_netns("obs", "obs-pod-checkout-a"));
        assert!(!is_lab_netns("obs", "obs-other"));
        assert!(!is_lab_netns("obs", "obs2-node"));
        assert!(!is_lab_netns("obs", "obsnode"));
    }

    #[test]
    fn a_missing_tool_names_its_package() {
        let err = find_tool("surely-not-a-real-tool-xyz", "some-package").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`surely-not-a-real-tool-xyz` is not installed: install the Debian package `some-package` (`cargo xtask setup` installs everything the lab needs)"
        );
    }
}
