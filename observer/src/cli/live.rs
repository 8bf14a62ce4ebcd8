//! The live view (`observer` with no subcommand): capture (and optionally record) while
//! showing, or replay a recorded log.

use std::sync::{Arc, Mutex};

use anyhow::Context as _;

use super::Outcome;
use super::session::{CaptureArgs, runtime};
use crate::kernel::capture::check_host;
use crate::model::record::{Recording, SummaryRecord};
use crate::pipeline;
use crate::sinks::log::LogTarget;
use crate::tui::{self, TuiOptions};

/// The live view (no subcommand).
#[derive(clap::Args)]
pub struct LiveArgs {
    /// Also write the connection log to FILE while showing it (an existing FILE is
    /// replaced only once the kernel programs are attached).
    /// (`--record` is an older name for it.)
    #[arg(
        short = 'w',
        long = "write",
        alias = "record",
        value_name = "FILE",
        conflicts_with = "replay"
    )]
    pub write: Option<String>,
    /// Show a recorded log instead of live traffic (no root needed).
    #[arg(long, value_name = "FILE")]
    pub replay: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub capture: CaptureArgs,
}

pub fn run(args: LiveArgs) -> anyhow::Result<Outcome> {
    match &args.replay {
        Some(path) => replay(path),
        None => live(args),
    }
}

/// Shows a recorded log; every check that can fail comes before the screen is taken.
fn replay(path: &std::path::Path) -> anyhow::Result<Outcome> {
    let recording = Recording::read(path)?;
    let cut = recording.cut_warning(&path.display().to_string());
    if let Some(warning) = &cut {
        eprintln!("observer: warning: {warning}");
    }
    tui::check_terminal()?;
    let updates = tui::replay_updates(&recording);
    let (send, receive) = tokio::sync::mpsc::channel(updates.len() + 1);
    for update in updates {
        // Capacity covers every update: this cannot fail.
        let _ = send.try_send(update);
    }
    let options = TuiOptions {
        title: format!("replay of {}", path.display()),
        recording: Some(path.display().to_string()),
        replay: true,
    };
    runtime()?.block_on(tui::run(receive, options))?;
    // The view took the screen: repeat the warning where it stays visible.
    if let Some(warning) = cut {
        eprintln!("observer: warning: {warning}");
    }
    Ok(Outcome::Success)
}

fn live(args: LiveArgs) -> anyhow::Result<Outcome> {
    check_host()?;
    tui::check_terminal()?;
    // Checked now, replaced only once the programs are attached.
    let target = args.write.as_deref().map(LogTarget::check).transpose()?;
    let warnings = Arc::new(Mutex::new(Vec::<String>::new()));
    let (send, receive) = tokio::sync::mpsc::channel(65536);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let collected = warnings.clone();
    // The screen belongs to the view: warnings are printed after it closes.
    let mut options = args.capture.session_options(
        None,
        Box::new(move |warning| {
            if let Ok(mut list) = collected.lock() {
                list.push(warning);
            }
        }),
    );
    options.updates = Some(send);
    // Capture runs on a thread of its own (with its own current-thread runtime), so
    // that a busy view, drawing on this thread, never keeps it from draining the
    // kernel's ring buffer (updates the view is slow to take wait in the session, not in
    // the kernel). It reports whether it attached before the
    // view takes the screen.
    let (attached, attach_result) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let capture_args = args.capture.clone();
    let capture_thread = std::thread::spawn(move || -> anyhow::Result<SummaryRecord> {
        runtime()?.block_on(async move {
            let started = capture_args.start_capture().and_then(|capture| {
                options.log = target.map(LogTarget::open).transpose()?;
                // Before `attached`: connections older than observer are read here.
                options.conntrack = Some(capture_args.follow_conntrack(&capture)?);
                Ok(capture)
            });
            let capture = match started {
                Ok(capture) => capture,
                Err(err) => {
                    let _ = attached.send(Err(err));
                    anyhow::bail!("capture did not start");
                }
            };
            let _ = attached.send(Ok(()));
            pipeline::run(capture, options, async {
                let _ = stopped.await;
            })
            .await
        })
    });
    attach_result
        .recv()
        .context("the capture thread ended before attaching")??;

    // The node's hostname: any process in the node's UTS namespace with CAP_SYS_ADMIN
    // sets it.
    let title = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| {
            crate::naming::printable::printable(
                name.trim().to_owned(),
                crate::naming::printable::NAME_BYTES,
            )
        })
        .unwrap_or_else(|_| "this node".to_owned());
    let options = TuiOptions {
        title,
        recording: args.write.clone(),
        replay: false,
    };
    let shown = runtime()?.block_on(tui::run(receive, options));
    let _ = stop.send(());
    let summary = capture_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
    shown?;
    if let Some(path) = &args.write {
        eprintln!(
            "observer: wrote {} connections to {path} ({} lost connections)",
            summary.connections, summary.lost_connections
        );
    }
    for warning in warnings.lock().map(|list| list.clone()).unwrap_or_default() {
        eprintln!("observer: warning: {warning}");
    }
    Ok(Outcome::Success)
}
