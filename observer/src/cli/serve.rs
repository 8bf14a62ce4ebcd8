//! `observer serve`: capture, and answer Prometheus scrapes until Ctrl-C or SIGTERM.

use super::Outcome;
use super::session::{CaptureArgs, runtime, stderr_warnings, stop_signal};
use crate::kernel::capture::check_host;
use crate::sinks::log::LogTarget;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to serve `/metrics` on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,
    /// Also write the connection log (JSON Lines, as `record --write` writes it) to
    /// PATH; `-` for standard output, where a cluster's log pipeline collects it.
    /// (`--log` is an older name for it.)
    #[arg(short = 'w', long = "write", alias = "log", value_name = "PATH")]
    pub write: Option<String>,
    #[command(flatten)]
    pub capture: CaptureArgs,
}

pub fn run(args: ServeArgs) -> anyhow::Result<Outcome> {
    check_host()?;
    // Checked before attaching, replaced only after, as `record` does.
    let log = args.write.as_deref().map(LogTarget::check).transpose()?;
    let listener = std::net::TcpListener::bind(args.listen)
        .map_err(|err| anyhow::anyhow!("cannot listen on {}: {err}", args.listen))?;
    runtime()?.block_on(async {
        let capture = args.capture.start_capture()?;
        let log = log.map(LogTarget::open).transpose()?;
        let logging = log
            .as_ref()
            .map(|log| match log.name.as_str() {
                "-" => "; writing the connection log to standard output".to_owned(),
                path => format!("; writing the connection log to {path}"),
            })
            .unwrap_or_default();
        let stop = stop_signal(None);
        eprintln!(
            "observer: attached {} kernel program(s); serving metrics on http://{}/metrics{logging}",
            capture.hooks_attached(),
            args.listen
        );
        let mut options = args.capture.session_options(log, stderr_warnings());
        options.conntrack = Some(args.capture.follow_conntrack(&capture)?);
        let summary = crate::pipeline::serve::run(listener, capture, options, stop).await?;
        eprintln!(
            "observer: stopped ({} DNAT decisions, {} lost connections)",
            summary.dnat_events, summary.lost_connections
        );
        Ok(Outcome::Success)
    })
}
