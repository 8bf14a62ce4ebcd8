//! Shared pieces of the root integration tests: a running `observer record` and the
//! root check. Each test builds its own lab (observer_lab), whose Drop removes every
//! namespace and process, also when an assertion fails.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use observer::model::record::{ConnRecord, Recording, ServiceRecord};
use observer_lab::{CtEvent, Observer};

pub mod command;
pub mod daemonset;
pub mod empty_root;
pub mod host_client;
pub mod image;
pub mod junit;
pub mod metrics;
pub mod pods;
pub mod synthetic;
pub mod tmux;
pub mod udp_flow;

// Each test binary compiles this module and uses only some of it.
#[allow(unused_imports)]
pub use observer_lab::testing::{prefix, require_root};

/// `observer record` running in the background; killed on drop.
pub struct Recorder {
    observer: Observer,
    pub output: PathBuf,
}

impl Recorder {
    /// Starts `observer record --write <dir>/conns.jsonl` with `extra` arguments and
    /// waits for its `attached` line.
    pub fn start(dir: &Path, extra: &[&str]) -> Recorder {
        let output = dir.join("conns.jsonl");
        let mut command = Command::new(env!("CARGO_BIN_EXE_observer"));
        command
            .arg("record")
            .arg("--write")
            .arg(&output)
            .args(extra);
        Recorder::spawn(command, output)
    }

    /// Starts `command` (an `observer record` writing to `output`) and waits for its
    /// `attached` line.
    pub fn spawn(command: Command, output: PathBuf) -> Recorder {
        Recorder::spawn_with(command, output, |command| Ok(command.spawn()?))
    }

    /// [`Recorder::spawn`], with `spawn` starting the command (e.g. inside a node
    /// container).
    pub fn spawn_with(
        mut command: Command,
        output: PathBuf,
        spawn: impl FnOnce(&mut Command) -> anyhow::Result<std::process::Child>,
    ) -> Recorder {
        command.stdout(Stdio::null());
        let observer =
            Observer::start_with(command, true, spawn).expect("observer record attaches");
        Recorder { observer, output }
    }

    /// The stderr lines observer wrote so far.
    pub fn stderr(&self) -> Vec<String> {
        self.observer.stderr()
    }

    /// observer's process id.
    pub fn pid(&self) -> u32 {
        self.observer.pid()
    }

    /// Sends `signal` to observer (e.g. SIGSTOP/SIGCONT to make it fall behind).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.observer.pid() as i32),
            signal,
        )
        .unwrap();
    }

    /// SIGTERM, wait for a clean exit, read the log.
    pub fn stop(mut self) -> Recording {
        let status = self.observer.terminate().unwrap();
        assert!(status.success(), "observer record exited with {status}");
        Recording::read(&self.output).expect("a readable connection log")
    }
}

/// Whether observer follows forwarded packets on the netfilter hooks in this run, as
/// `--hook` (which observer reads from `OBSERVER_HOOK`, set by `cargo xtask test`'s
/// second pass) chooses: `auto` (the default) on Linux 6.12 and later, or `netfilter`.
pub fn netfilter_hook() -> bool {
    match std::env::var("OBSERVER_HOOK").as_deref() {
        Ok("netfilter") => true,
        Ok("dev-queue") => false,
        _ => {
            let release = nix::sys::utsname::uname().expect("uname");
            let release = release.release().to_string_lossy();
            observer::kernel::host::parse_release(&release)
                .is_some_and(|version| version >= observer::kernel::attach::NETFILTER_SINCE)
        }
    }
}

/// How many kernel programs observer attaches here: the forwarding program and
/// skb:kfree_skb's, and on `net_dev_queue` the two socket-side `cgroup_skb` programs
/// (the netfilter program reads what they would itself).
pub fn hooks_attached() -> u32 {
    if netfilter_hook() { 2 } else { 4 }
}

/// The inode of a named network namespace (`/run/netns/NAME`): what the log's `netns`
/// field holds for decisions made there.
pub fn netns_inode(name: &str) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/run/netns/{name}"))
        .expect("the lab's namespace")
        .ino() as u32
}

/// Keeps only the connections the lab's node decided and the Services its rules define:
/// observer sees every namespace on the host, and other labs or demos may be running
/// beside the test (with the same Service names and addresses).
pub fn only_node(recording: &mut Recording, node_ns: &str) {
    let inode = netns_inode(node_ns);
    recording.conns.retain(|conn| conn.netns == inode);
    recording.services.retain(|service| service.netns == inode);
    recording.endpoints.retain(|change| change.netns == inode);
    recording.dns.retain(|query| query.netns == inode);
    recording.rejects.retain(|reject| reject.netns == inode);
}

/// `conns` are exactly the DNAT decisions conntrack announced in `events` (`conntrack -E`
/// NEW entries whose backend is not what the client dialed): none missing, none twice.
pub fn assert_same_decisions(conns: &[&ConnRecord], events: &[CtEvent], node: &str) {
    let mut from_log: Vec<String> = conns
        .iter()
        .map(|c| format!("{} {} {} {}", c.proto, c.client, c.original_dst, c.backend))
        .collect();
    let mut from_conntrack: Vec<String> = events
        .iter()
        .filter(|e| e.original_dst != e.backend)
        .map(|e| format!("{} {} {} {}", e.proto, e.client, e.original_dst, e.backend))
        .collect();
    from_log.sort();
    from_conntrack.sort();
    assert_eq!(from_log, from_conntrack, "{node}: log vs conntrack -E");
}

/// The `service` line of Service port `name` that the rules of netns `inode` define.
pub fn service_line<'a>(
    services: &'a [ServiceRecord],
    inode: u32,
    name: &str,
) -> &'a ServiceRecord {
    services
        .iter()
        .find(|s| s.netns == inode && s.service == name)
        .unwrap_or_else(|| panic!("no service line for {name} in netns {inode}: {services:?}"))
}

/// Every Service of the lab node `node_ns` as a full read says, through `observer rules`.
pub fn rules_of(node_ns: &str) -> Vec<ServiceRecord> {
    let out = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["rules", "--output", "json", "--netns"])
        .arg(format!("/run/netns/{node_ns}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<ServiceRecord>(line).unwrap())
        .collect()
}
