//! `observer verify`: records for a while and, side by side, listens to conntrack's own
//! NEW events for DNATed entries (its destroy events are the recording's concern); then says how many of conntrack's decisions observer
//! recorded. Exit 0 at 100%, 1 below, 2 when it could not tell.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::args::OutputFormat;
use super::args::duration_seconds;
use super::session::{CaptureArgs, runtime, stderr_warnings, stop_signal};
use super::{Outcome, emit};
use crate::conntrack::CtKind;
use crate::conntrack::listener::{Listener, Note};
use crate::conntrack::socket::{EVENT_BUFFER, GROUP_NEW};
use crate::kernel::capture::check_host;
use crate::model::record::Recording;
use crate::model::tuple;
use crate::naming::services::source::{NetnsInfo, list_namespaces, netns_inode};
use crate::pipeline;
use crate::report::coverage::{Decision, coverage, render, render_json};
use crate::sinks::log::LogWriter;

/// Recording continues this long after the listener stops, so that the first packet of
/// every decision it heard reaches the kernel programs.
const GRACE: Duration = Duration::from_millis(500);

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// How long to listen, in seconds (drive traffic meanwhile; Ctrl-C ends it early).
    #[arg(short, long, value_name = "SECONDS", default_value = "10", value_parser = duration_seconds)]
    pub duration: Duration,
    /// Network namespaces to check, as a path (`/run/netns/X`, `/proc/PID/ns/net`) or an
    /// inode; repeatable. Default: every namespace on this host.
    #[arg(long, value_name = "PATH|INODE")]
    pub netns: Vec<String>,
    /// Also write the connection log that was compared (JSON Lines) to this file.
    #[arg(short = 'w', long = "write", value_name = "PATH")]
    pub write: Option<std::path::PathBuf>,
    /// `table`: the verdict for people; `json`: one line per Service and one for the
    /// whole node (`"service": null`), then one per lost decision.
    #[command(flatten)]
    pub output: super::args::FormatArg,
    /// Receive buffer of each conntrack event socket, in bytes (tests make it tiny to
    /// see a listener that cannot keep up).
    #[arg(long, value_name = "BYTES", default_value_t = EVENT_BUFFER, hide = true)]
    pub conntrack_buffer: i32,
    #[command(flatten)]
    pub capture: CaptureArgs,
}

/// The connection log, kept in memory.
#[derive(Clone, Default)]
struct Memory(Arc<Mutex<Vec<u8>>>);

impl Write for Memory {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn run(args: VerifyArgs) -> anyhow::Result<Outcome> {
    check_host()?;
    let namespaces = namespaces(&args.netns)?;
    let memory = Memory::default();
    let notes = runtime()?.block_on(async {
        let capture = args.capture.start_capture()?;
        let mut listener = Listener::start(&[GROUP_NEW], args.conntrack_buffer, None);
        for netns in &namespaces {
            listener.watch(netns.inode, &netns.path).with_context(|| {
                format!(
                    "cannot verify: cannot listen to conntrack in {}",
                    netns.path.display()
                )
            })?;
        }
        let log = LogWriter::new(Box::new(memory.clone()), "memory");
        let mut options = args.capture.session_options(Some(log), stderr_warnings());
        options.conntrack = Some(args.capture.follow_conntrack(&capture)?);
        let stop_verifying = stop_signal(Some(args.duration));
        eprintln!(
            "observer: attached {} kernel program(s); verifying against conntrack in {} namespace(s) for {:?}",
            capture.hooks_attached(),
            namespaces.len(),
            args.duration
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listen = async move {
            stop_verifying.await;
            let notes = listener.stop();
            tokio::time::sleep(GRACE).await;
            let _ = stop.send(());
            notes
        };
        let record = pipeline::run(capture, options, async {
            let _ = stopped.await;
        });
        let (summary, notes) = tokio::join!(record, listen);
        summary?;
        anyhow::Ok(notes)
    })?;
    let text =
        String::from_utf8_lossy(&memory.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    if let Some(path) = &args.write {
        std::fs::write(path, &text)
            .with_context(|| format!("cannot write the connection log to {}", path.display()))?;
    }
    let recording = Recording::parse("memory", &text)?;
    let ends = recording.summary.as_ref().and_then(|s| s.conntrack_ends);
    let hook = recording.summary.as_ref().and_then(|s| s.forwarding_hook);
    let decisions = decisions(notes)?;
    if decisions.is_empty() {
        bail!(
            "cannot verify: conntrack made no DNAT decision in {:?}; drive traffic at your Services while verifying",
            args.duration
        );
    }
    // Only the namespaces verified: observer records every namespace on the host.
    let inodes: Vec<u32> = namespaces.iter().map(|n| n.inode).collect();
    let conns: Vec<_> = recording
        .conns
        .into_iter()
        .filter(|c| inodes.contains(&c.netns))
        .collect();
    let mut coverage = coverage(&decisions, &conns);
    coverage.conntrack_ends = ends;
    coverage.forwarding_hook = hook;
    emit(&match args.output.format {
        OutputFormat::Table => render(&coverage),
        OutputFormat::Json => render_json(&coverage),
    })?;
    Ok(if coverage.total.complete() {
        Outcome::Success
    } else {
        Outcome::ConditionFailed
    })
}

/// The decisions conntrack reported; an error when the listener itself lost events.
fn decisions(notes: Vec<Note>) -> anyhow::Result<Vec<Decision>> {
    let mut decisions = Vec::new();
    let (mut overruns, mut malformed) = (0, 0);
    for note in notes {
        match note {
            Note::Event {
                netns,
                kind: CtKind::New,
                entry,
            } => {
                let Ok(proto) = tuple::proto(entry.original.protocol) else {
                    continue;
                };
                decisions.push(Decision {
                    netns,
                    proto,
                    client: entry.original.src,
                    dialed: entry.original.dst,
                    backend: entry.reply.src,
                });
            }
            // Not asked for here.
            Note::Event { .. } | Note::Stats { .. } => {}
            Note::Overrun { .. } => overruns += 1,
            Note::Malformed { .. } => malformed += 1,
            Note::Failed { netns, error } => {
                bail!(
                    "cannot verify: conntrack's events in netns {netns} could not be read: {error}"
                )
            }
        }
    }
    if overruns > 0 {
        bail!(
            "cannot verify: the conntrack event listener itself dropped events (ENOBUFS, {overruns} time(s)); try a shorter --duration or a lower load"
        );
    }
    if malformed > 0 {
        bail!("cannot verify: {malformed} conntrack event(s) could not be read");
    }
    Ok(decisions)
}

/// `--netns` values as namespaces; every namespace on the host without any.
fn namespaces(given: &[String]) -> anyhow::Result<Vec<NetnsInfo>> {
    let all = list_namespaces();
    if given.is_empty() {
        return Ok(all);
    }
    given
        .iter()
        .map(|value| match value.parse::<u32>() {
            Ok(inode) => all
                .iter()
                .find(|n| n.inode == inode)
                .cloned()
                .with_context(|| format!("no network namespace with inode {inode} on this host")),
            Err(_) => {
                let path = std::path::PathBuf::from(value);
                let inode = netns_inode(&path)
                    .with_context(|| format!("cannot open network namespace {value}"))?;
                Ok(NetnsInfo { inode, path })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::{CtEntry, CtTuple, IPS_DST_NAT};

    fn new_event(protocol: u8) -> Note {
        let tuple = |src: &str, dst: &str| CtTuple {
            protocol,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
        };
        Note::Event {
            netns: 7,
            kind: CtKind::New,
            entry: CtEntry {
                original: tuple("10.244.1.9:4000", "10.96.35.226:80"),
                reply: tuple("10.244.1.13:8080", "10.244.1.9:4000"),
                status: IPS_DST_NAT,
                id: None,
                start_ns: None,
                tcp_state: None,
            },
        }
    }

    #[test]
    fn decisions_are_new_tcp_and_udp_events() {
        let notes = vec![new_event(6), new_event(1), new_event(17)];
        let decisions = decisions(notes).unwrap();
        assert_eq!(decisions.len(), 2);
        assert_eq!(decisions[0].backend.to_string(), "10.244.1.13:8080");
    }

    #[test]
    fn a_listener_that_lost_events_cannot_verify() {
        let err = decisions(vec![new_event(6), Note::Overrun { netns: 7 }]).unwrap_err();
        assert!(err.to_string().contains("ENOBUFS"), "{err}");
        let err = decisions(vec![Note::Failed {
            netns: 7,
            error: "gone".into(),
        }])
        .unwrap_err();
        assert!(err.to_string().starts_with("cannot verify"), "{err}");
    }
}
