//! What the live view, `record` and `serve` share: the capture flags, and starting the
//! kernel side and a pipeline session from them.

use std::time::Duration;

use anyhow::Context as _;

use super::args::idle_seconds;
use crate::kernel::attach::HookChoice;
use crate::kernel::capture::{Capture, CaptureOptions};
use crate::model::record::ConntrackEnds;
use crate::naming::pods::{DEFAULT_RUNTIME_ROOTS, PodNamer, PodNamerConfig, RuntimeSource};
use crate::naming::services::{Namer, NamerConfig, SystemSource};
use crate::pipeline::{ConntrackStart, SessionOptions};
use crate::sinks::log::LogWriter;

/// Capture settings shared by the live view, `record` and `serve`.
#[derive(clap::Args, Clone)]
pub struct CaptureArgs {
    /// Seconds of silence after which a UDP connection (or a TCP one that never got an
    /// answer) counts as ended (0.1 to 86400).
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = idle_seconds)]
    pub idle_timeout: Duration,
    /// Size of the kernel's connection table (conntrack's default maximum); connections
    /// beyond it are counted as lost.
    #[arg(long, value_name = "N", default_value_t = 262_144, value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    pub max_connections: u32,
    /// Size of the first level of the table on the netfilter hooks (at most
    /// `--max-connections`); for tests that make connections spill past it.
    #[arg(long, value_name = "N", hide = true, env = "OBSERVER_NEAR_CONNECTIONS",
          default_value_t = crate::kernel::conn_table::NEAR_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    pub near_connections: u32,
    /// Size of the kernel's ring buffer of connection events in bytes (a power of two,
    /// at least 4096); for tests that force it to fill.
    #[arg(long, value_name = "BYTES", hide = true, value_parser = ring_buffer_bytes)]
    pub ring_buffer_bytes: Option<u32>,
    /// The same for the ring buffer of DNS messages.
    #[arg(long, value_name = "BYTES", hide = true, value_parser = ring_buffer_bytes)]
    pub dns_ring_buffer_bytes: Option<u32>,
    /// The kernel's BTF, for kernels that keep it somewhere else.
    #[arg(long, value_name = "FILE", default_value = crate::kernel::btf::Btf::SYS_FS)]
    pub btf: std::path::PathBuf,
    /// Do not read kube-proxy's rules: connections keep `service: null`.
    #[arg(long)]
    pub no_names: bool,
    /// Where the container runtime keeps its pod sandbox bundles (`<id>/config.json`),
    /// for pod names; repeatable. Default: containerd's and CRI-O's state directories.
    #[arg(long, value_name = "DIR", hide = true)]
    pub runtime_root: Vec<std::path::PathBuf>,
    /// Do not name addresses by pod: `client_pod` and `backend_pod` stay null.
    #[arg(long)]
    pub no_pod_names: bool,
    /// How to learn that a connection's conntrack entry went without a FIN or RST
    /// (flushed, deleted, timed out): `revalidate` checks the entries observer tracks
    /// from the kernel at most every 100 ms (Linux 5.17 and later); `events` subscribes to
    /// conntrack's destroy events, which costs every connection of the node a message;
    /// `auto` revalidates where the kernel can and subscribes elsewhere.
    #[arg(long, value_enum, value_name = "HOW", default_value = "auto")]
    pub conntrack_ends: EndsChoice,
    /// Where the program that follows forwarded packets runs: `netfilter` links it at
    /// the netfilter hooks of each node network namespace, once per packet (Linux 6.4 and
    /// later); `dev-queue` attaches it to tracepoint net_dev_queue, once per device a
    /// packet crosses, in every namespace; `auto` is `netfilter` where the kernel has it.
    #[arg(
        long,
        value_enum,
        value_name = "HOOK",
        default_value = "auto",
        env = "OBSERVER_HOOK"
    )]
    pub hook: HookArg,
    /// A node network namespace for `--hook netfilter` (a file such as /run/netns/NAME
    /// or /proc/PID/ns/net); repeatable. Default: observer's own, kube-proxy's, and
    /// those in /run/netns except pods' (cni-*), also when they appear later.
    #[arg(
        long,
        value_name = "FILE",
        env = "OBSERVER_NODE_NETNS",
        value_delimiter = ':'
    )]
    pub node_netns: Vec<std::path::PathBuf>,
}

/// `--hook`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookArg {
    Auto,
    Netfilter,
    DevQueue,
}

impl From<HookArg> for HookChoice {
    fn from(arg: HookArg) -> HookChoice {
        match arg {
            HookArg::Auto => HookChoice::Auto,
            HookArg::Netfilter => HookChoice::Netfilter,
            HookArg::DevQueue => HookChoice::DevQueue,
        }
    }
}

/// `--conntrack-ends`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndsChoice {
    Auto,
    Revalidate,
    Events,
}

impl CaptureArgs {
    /// Session settings from the flags: no live updates unless the caller adds them.
    pub fn session_options(
        &self,
        log: Option<LogWriter>,
        warn: Box<dyn FnMut(String) + Send>,
    ) -> SessionOptions {
        SessionOptions {
            idle_timeout: self.idle_timeout,
            sweep_interval: Duration::from_secs(1),
            log,
            updates: None,
            namer: self.namer(),
            pods: self.pods(),
            warn,
            conntrack: None,
        }
    }

    /// Starts following conntrack (see `pipeline::follow_conntrack`) the way
    /// `--conntrack-ends` says and `capture`'s kernel allows. Call it before saying
    /// `attached`: connections older than observer are read here.
    pub fn follow_conntrack(&self, capture: &Capture) -> anyhow::Result<ConntrackStart> {
        let ends = match (self.conntrack_ends, capture.revalidation_refused()) {
            (EndsChoice::Events, _) | (EndsChoice::Auto, Some(_)) => ConntrackEnds::DestroyEvents,
            (EndsChoice::Revalidate, Some(reason)) => anyhow::bail!(
                "--conntrack-ends revalidate cannot work on this kernel: it refused the revalidation program ({reason}); use --conntrack-ends events"
            ),
            (_, None) => ConntrackEnds::Revalidated,
        };
        Ok(crate::pipeline::follow_conntrack(ends))
    }

    fn namer(&self) -> Option<Namer> {
        // kube-proxy rewrites rules on every endpoint change. They are re-read when
        // they change (nf_tables announces it; legacy tables are fingerprinted every
        // second); where neither works, every 2 s while there are connections to name.
        let config = NamerConfig {
            max_age: Duration::from_secs(2),
            ..NamerConfig::default()
        };
        // Reads run on a thread of their own: never on the loop that drains the kernel.
        (!self.no_names).then(|| Namer::spawn(config, Box::new(SystemSource::new())))
    }

    fn pods(&self) -> Option<PodNamer> {
        if self.no_pod_names {
            return None;
        }
        let roots = if self.runtime_root.is_empty() {
            DEFAULT_RUNTIME_ROOTS.iter().map(Into::into).collect()
        } else {
            self.runtime_root.clone()
        };
        Some(PodNamer::start(
            PodNamerConfig::default(),
            Box::new(RuntimeSource::new(roots)),
        ))
    }

    /// Loads and attaches the kernel programs; says what works less well on this machine.
    pub fn start_capture(&self) -> anyhow::Result<Capture> {
        let capture = Capture::start(&CaptureOptions {
            max_connections: self.max_connections,
            near_connections: self.near_connections,
            btf_path: self.btf.clone(),
            ring_buffer_bytes: self.ring_buffer_bytes,
            dns_ring_buffer_bytes: self.dns_ring_buffer_bytes,
            hook: self.hook.into(),
            node_netns: self.node_netns.clone(),
        })?;
        for warning in &capture.warnings {
            eprintln!("observer: warning: {warning}");
        }
        Ok(capture)
    }
}

fn ring_buffer_bytes(text: &str) -> Result<u32, String> {
    let bytes: u32 = text.parse().map_err(|err| format!("{err}"))?;
    if bytes >= 4096 && bytes.is_power_of_two() {
        Ok(bytes)
    } else {
        Err("the ring buffer's size must be a power of two of at least 4096 bytes".to_owned())
    }
}

/// Warnings straight to stderr (no screen to keep clean).
pub fn stderr_warnings() -> Box<dyn FnMut(String) + Send> {
    Box::new(|warning| eprintln!("observer: warning: {warning}"))
}

/// One thread per runtime: `record` needs no more, and the live view runs capture and
/// the view on two threads of their own.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Resolves when Ctrl-C (SIGINT) or SIGTERM arrives, or after `duration`. Both signals
/// are handled from this call on, not from the future's first poll: call it before saying
/// `attached`. A script that starts observer in the background (where SIGINT is ignored
/// until observer handles it) and signals it once it says `attached` must stop it.
pub fn stop_signal(duration: Option<Duration>) -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handle =
        |kind| signal(kind).expect("installing a signal handler cannot fail in a fresh runtime");
    let mut interrupt = handle(SignalKind::interrupt());
    let mut terminate = handle(SignalKind::terminate());
    async move {
        let deadline = async {
            match duration {
                Some(duration) => tokio::time::sleep(duration).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
            () = deadline => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::{SigHandler, Signal, raise, signal};

    #[test]
    fn a_sigint_between_the_call_and_the_first_wait_stops() {
        // As in a script's background job: SIGINT ignored until observer handles it.
        // SAFETY: SIG_IGN is no handler; nothing else in this test binary handles SIGINT
        // (tokio's handler, installed below, stays for the rest of the run).
        unsafe { signal(Signal::SIGINT, SigHandler::SigIgn) }.unwrap();
        let runtime = super::runtime().unwrap();
        runtime.block_on(async {
            let stop = super::stop_signal(None);
            // Said `attached`, signalled at once: before the session waits.
            raise(Signal::SIGINT).unwrap();
            tokio::time::timeout(Duration::from_secs(10), stop)
                .await
                .expect("a SIGINT before the first wait stops the session");
        });
    }
}
