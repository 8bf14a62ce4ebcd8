//! `observer serve`: capture, and answer Prometheus scrapes until Ctrl-C or SIGTERM.

use super::Outcome;
use super::session::{CaptureArgs, runtime, stderr_warnings, stop_signal};
use crate::kernel::capture::check_host;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to serve `/metrics` on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
    #[command(flatten)]
    pub capture: CaptureArgs,
}

pub fn run(args: ServeArgs) -> anyhow::Result<Outcome> {
    check_host()?;
    let listener = std::net::TcpListener::bind(args.listen)
        .map_err(|err| anyhow::anyhow!("cannot listen on {}: {err}", args.listen))?;
    runtime()?.block_on(async {
        let capture = args.capture.start_capture()?;
        eprintln!(
            "observer: attached {} kernel program(s); serving metrics on http://{}/metrics",
            capture.hooks_attached(),
            args.listen
        );
        let options = args.capture.session_options(None, stderr_warnings());
        let summary =
            crate::sinks::serve::run(listener, capture, options, stop_signal(None)).await?;
        eprintln!(
            "observer: stopped ({} DNAT decisions, {} lost connections)",
            summary.dnat_events, summary.lost_connections
        );
        Ok(Outcome::Success)
    })
}
