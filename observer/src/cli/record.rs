//! `observer record`: every DNATed connection on this node as JSON Lines.

use std::time::Duration;

use super::Outcome;
use super::args::duration_seconds;
use super::session::{CaptureArgs, runtime, stderr_warnings, stop_signal};
use crate::kernel::capture::check_host;
use crate::pipeline;
use crate::sinks::log::LogTarget;

#[derive(clap::Args)]
pub struct RecordArgs {
    /// Where to write the connection log (`-` for standard output). An existing file is
    /// replaced only once the kernel programs are attached; a killed run leaves the lines
    /// written so far.
    /// (`--output` is an older name for it.)
    #[arg(short = 'w', long = "write", alias = "output", value_name = "PATH")]
    pub write: String,
    /// Stop after this many seconds (otherwise at Ctrl-C or SIGTERM).
    #[arg(short, long, value_name = "SECONDS", value_parser = duration_seconds)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub capture: CaptureArgs,
}

pub fn run(args: RecordArgs) -> anyhow::Result<Outcome> {
    check_host()?;
    // Checked before attaching, replaced only after: a failed start keeps the old file.
    let target = LogTarget::check(&args.write)?;
    runtime()?.block_on(async {
        let capture = args.capture.start_capture()?;
        let log = target.open()?;
        // conntrack's entries are read before `attached` is said: they are there from it on.
        let mut options = args.capture.session_options(Some(log), stderr_warnings());
        options.conntrack = Some(args.capture.follow_conntrack(&capture)?);
        let stop = stop_signal(args.duration);
        eprintln!(
            "observer: attached {} kernel program(s); recording DNATed connections to {}",
            capture.hooks_attached(),
            options.log.as_ref().map_or("-", |log| log.name.as_str())
        );
        let summary = pipeline::run(capture, options, stop).await?;
        eprintln!(
            "observer: wrote {} connections ({} DNAT decisions, {} lost connections, {} lost events, {} failed kernel reads)",
            summary.connections,
            summary.dnat_events,
            summary.lost_connections,
            summary.lost_events,
            summary.read_errors
        );
        Ok(Outcome::Success)
    })
}
