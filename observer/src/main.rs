//! The `observer` command line: the live view (no subcommand), `record`, and the tools
//! that read recordings.

use std::{process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use observer::{
    capture::{Capture, CaptureOptions},
    naming::{Namer, NamerConfig, SystemSource},
    output::LogWriter,
    record::{Recording, SummaryRecord},
    session::{self, SessionOptions},
    tui::{self, TuiOptions},
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
    #[command(flatten)]
    live: LiveArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Record every DNATed connection on this node as JSON Lines (needs root).
    Record(RecordArgs),
    /// Print the Services, frontends and endpoints (with expected shares) that the node's
    /// kube-proxy rules define, per network namespace (needs root).
    Rules(observer::rules_cmd::RulesArgs),
    /// Per Service and backend: connections, requests, share vs expected, pinning
    /// lifetimes and skew, from a recorded log.
    Summary(observer::stats::summary::SummaryArgs),
    /// Exit 0 when a recorded log meets every condition, 1 with one line per violation.
    Check(observer::stats::check::CheckArgs),
    /// Serve Prometheus metrics per Service and backend at http://ADDR/metrics (needs
    /// root; for a DaemonSet).
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Address to serve `/metrics` on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    listen: std::net::SocketAddr,
    #[command(flatten)]
    capture: CaptureArgs,
}

/// The live view (no subcommand).
#[derive(Args)]
struct LiveArgs {
    /// Also write the connection log to FILE while showing it.
    #[arg(long, value_name = "FILE", conflicts_with = "replay")]
    record: Option<String>,
    /// Show a recorded log instead of live traffic (no root needed).
    #[arg(long, value_name = "FILE")]
    replay: Option<std::path::PathBuf>,
    #[command(flatten)]
    capture: CaptureArgs,
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
    /// Do not read kube-proxy's rules: connections keep `service: null`.
    #[arg(long)]
    no_names: bool,
}

impl CaptureArgs {
    /// Session settings from the flags: no live updates unless the caller adds them.
    fn session_options(
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
            warn,
        }
    }

    /// Warnings straight to stderr (no screen to keep clean).
    fn stderr_warnings() -> Box<dyn FnMut(String) + Send> {
        Box::new(|warning| eprintln!("observer: warning: {warning}"))
    }

    fn namer(&self) -> Option<Namer> {
        // kube-proxy rewrites rules on every endpoint change: re-read them every 2 s
        // (only while there are connections to name) so stale pins show promptly.
        let config = NamerConfig {
            max_age: Duration::from_secs(2),
            ..NamerConfig::default()
        };
        (!self.no_names).then(|| Namer::new(config, Box::new(SystemSource::new())))
    }
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
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() && seconds < 1e9 => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(format!("`{text}` is not a positive number of seconds")),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Record(args)) => record(args),
        Some(Command::Rules(args)) => observer::rules_cmd::run(&args).map(|()| ExitCode::SUCCESS),
        Some(Command::Summary(args)) => {
            observer::stats::summary::run(&args).map(|()| ExitCode::SUCCESS)
        }
        Some(Command::Check(args)) => observer::stats::check::run(&args),
        Some(Command::Serve(args)) => serve(args),
        None => live(cli.live),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("observer: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// One thread per runtime: `record` needs no more, and the live view runs capture and
/// the view on two threads of their own.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Loads and attaches the kernel programs; says what works less well on this machine.
fn start_capture(args: &CaptureArgs) -> anyhow::Result<Capture> {
    let capture = Capture::start(&CaptureOptions {
        max_connections: args.max_connections,
        btf_path: args.btf.clone(),
    })?;
    for warning in &capture.warnings {
        eprintln!("observer: warning: {warning}");
    }
    Ok(capture)
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
        let options = args.capture.session_options(Some(log), CaptureArgs::stderr_warnings());
        let summary = session::run(capture, options, stop_signal(args.duration)).await?;
        eprintln!(
            "observer: wrote {} connections ({} DNAT decisions, {} lost events, {} failed kernel reads)",
            summary.connections, summary.dnat_events, summary.lost_events, summary.read_errors
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// The live view: capture (and optionally record) while showing, or replay a log.
fn live(args: LiveArgs) -> anyhow::Result<ExitCode> {
    // Every check that can fail comes before the screen is taken over.
    if let Some(path) = &args.replay {
        let recording = Recording::read(path)?;
        tui::check_terminal()?;
        let runtime = runtime()?;
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
        runtime.block_on(tui::run(receive, options))?;
        return Ok(ExitCode::SUCCESS);
    }

    observer::capture::check_privileges()?;
    tui::check_terminal()?;
    let log = args.record.as_deref().map(LogWriter::create).transpose()?;
    let warnings = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (send, receive) = tokio::sync::mpsc::channel(65536);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let collected = warnings.clone();
    // The screen belongs to the view: warnings are printed after it closes.
    let mut options = args.capture.session_options(
        log,
        Box::new(move |warning| {
            if let Ok(mut list) = collected.lock() {
                list.push(warning);
            }
        }),
    );
    options.updates = Some(send);
    // Capture runs on a thread of its own, so that a busy view never keeps it from
    // draining the kernel's ring buffer. It reports whether it attached before the
    // view takes the screen.
    let (attached, attach_result) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let capture_args = args.capture.clone();
    let capture_thread = std::thread::spawn(move || -> anyhow::Result<SummaryRecord> {
        let runtime = runtime()?;
        runtime.block_on(async move {
            let capture = match start_capture(&capture_args) {
                Ok(capture) => capture,
                Err(err) => {
                    let _ = attached.send(Err(err));
                    anyhow::bail!("capture did not start");
                }
            };
            let _ = attached.send(Ok(()));
            session::run(capture, options, async {
                let _ = stopped.await;
            })
            .await
        })
    });
    attach_result
        .recv()
        .context("the capture thread ended before attaching")??;

    let title = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "this node".to_owned());
    let options = TuiOptions {
        title,
        recording: args.record.clone(),
        replay: false,
    };
    let shown = runtime()?.block_on(tui::run(receive, options));
    let _ = stop.send(());
    let summary = capture_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
    shown?;
    if let Some(path) = &args.record {
        eprintln!(
            "observer: wrote {} connections to {path} ({} lost events)",
            summary.connections, summary.lost_events
        );
    }
    for warning in warnings.lock().map(|list| list.clone()).unwrap_or_default() {
        eprintln!("observer: warning: {warning}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `observer serve`: capture, and answer Prometheus scrapes until Ctrl-C or SIGTERM.
fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    observer::capture::check_privileges()?;
    let listener = std::net::TcpListener::bind(args.listen)
        .map_err(|err| anyhow::anyhow!("cannot listen on {}: {err}", args.listen))?;
    let runtime = runtime()?;
    runtime.block_on(async {
        let capture = start_capture(&args.capture)?;
        eprintln!(
            "observer: attached {} kernel program(s); serving metrics on http://{}/metrics",
            capture.hooks_attached(),
            args.listen
        );
        let options = args
            .capture
            .session_options(None, CaptureArgs::stderr_warnings());
        let summary = observer::serve::run(listener, capture, options, stop_signal(None)).await?;
        eprintln!(
            "observer: stopped ({} DNAT decisions, {} lost events)",
            summary.dnat_events, summary.lost_events
        );
        Ok(ExitCode::SUCCESS)
    })
}
