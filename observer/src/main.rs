//! The `observer` command line: the live view (no subcommand), `record`, and the tools
//! that read recordings.

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use observer::{
    capture::{Capture, CaptureOptions},
    output::LogWriter,
    session::{self, SessionOptions},
};

#[derive(Parser)]
#[command(
    name = "observer",
    version,
    about = "Shows, live and per connection, how Kubernetes Service traffic is really spread across pods on this node",
    long_about = "Shows, live and per connection, how Kubernetes Service traffic is really spread across pods on this node.\n\n\
        kube-proxy's NAT rules pick a pod once, on a connection's first packet; conntrack then pins every later \
        packet of that connection to the same pod. observer catches each decision in the kernel and shows how \
        long connections stay pinned and how many requests each carries."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Record every DNATed connection on this node as JSON Lines (needs root).
    Record(RecordArgs),
}

/// Capture settings shared by the live view and `record`.
#[derive(Args, Clone)]
struct CaptureArgs {
    /// Seconds of silence after which a UDP connection (or a TCP one that never got an
    /// answer) counts as ended.
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = parse_seconds)]
    idle_timeout: Duration,
    /// Size of the kernel's connection table; connections beyond it are counted as lost.
    #[arg(long, value_name = "N", default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    max_connections: u32,
    /// The kernel's BTF, for kernels that keep it somewhere else.
    #[arg(long, value_name = "FILE", default_value = observer::btf::Btf::SYS_FS)]
    btf: std::path::PathBuf,
}

#[derive(Args)]
struct RecordArgs {
    /// Where to write the connection log (`-` for standard output).
    #[arg(short, long, value_name = "PATH")]
    output: String,
    /// Stop after this many seconds (otherwise at Ctrl-C or SIGTERM).
    #[arg(short, long, value_name = "SECONDS", value_parser = parse_seconds)]
    duration: Option<Duration>,
    #[command(flatten)]
    capture: CaptureArgs,
}

/// A positive number of seconds, e.g. `30` or `0.5`.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() && seconds < 1e9 => Ok(Duration::from_secs_f64(seconds)),
        _ => Err(format!("`{text}` is not a positive number of seconds")),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Record(args)) => record(args),
        None => {
            eprintln!("observer: the live view is not built yet; use `observer record --output FILE`");
            Ok(ExitCode::from(2))
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("observer: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn start_capture(args: &CaptureArgs) -> anyhow::Result<Capture> {
    Ok(Capture::start(&CaptureOptions { max_connections: args.max_connections, btf_path: args.btf.clone() })?)
}

/// Resolves when Ctrl-C or SIGTERM arrives, or after `duration`.
async fn stop_signal(duration: Option<Duration>) {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler cannot fail in a fresh runtime");
    let deadline = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
        () = deadline => {}
    }
}

fn record(args: RecordArgs) -> anyhow::Result<ExitCode> {
    observer::capture::check_privileges()?;
    let log = LogWriter::create(&args.output)?;
    let runtime = runtime()?;
    runtime.block_on(async {
        let capture = start_capture(&args.capture)?;
        eprintln!(
            "observer: attached {} kernel program(s); recording DNATed connections to {}",
            capture.hooks_attached(),
            log.name
        );
        let options = SessionOptions {
            idle_timeout: args.capture.idle_timeout,
            sweep_interval: Duration::from_secs(1),
            log: Some(log),
            updates: None,
        };
        let summary = session::run(capture, options, stop_signal(args.duration)).await?;
        eprintln!(
            "observer: wrote {} connections ({} DNAT decisions, {} lost events, {} failed kernel reads)",
            summary.connections, summary.dnat_events, summary.lost_events, summary.read_errors
        );
        Ok(ExitCode::SUCCESS)
    })
}
