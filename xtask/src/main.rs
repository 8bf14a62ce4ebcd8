use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod bench_scale;
mod demo;
mod dist;
mod kernels;
mod load;
mod oci;
mod setup;
mod test;

/// Developer tasks for observer.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what building and testing needs (Debian packages, rust-src, bpf-linker).
    Setup,
    /// Set up, then run every test, root integration tests included.
    Test {
        /// Leave out `cargo xtask kernels` (Debian's x86_64 and arm64 kernels under qemu,
        /// 5-7 minutes with downloads).
        #[arg(long)]
        no_kernels: bool,
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Static (musl) binaries for x86_64 and aarch64, a scratch OCI image archive for
    /// both, and SHA256SUMS, in target/dist/.
    Dist,
    /// A simulated kind node with pinning traffic, and observer's live view on it.
    Demo(demo::DemoArgs),
    /// New connections per second through the lab's DNAT with and without observer.
    Bench(bench::BenchArgs),
    /// Boot Debian's 5.10, 6.1 and 6.12 kernels, x86_64 and arm64, under qemu and prove
    /// observer on each.
    Kernels(kernels::KernelsArgs),
    /// A simulated kind node (network namespaces, kube-proxy rules, pods, a client).
    Lab(observer_lab::cli::LabArgs),
    /// Print docs/statistics.md's tables: `check --max-skew`'s false alarms on a fair DNAT
    /// and the connections it takes to catch an uneven one (synthetic recordings, fixed
    /// seeds; a few minutes).
    SkewTable,
    /// (benchmark internals) Accept and drop connections.
    #[command(hide = true)]
    BenchSink {
        #[arg(long)]
        port: u16,
        /// Also echo what arrives on this port.
        #[arg(long)]
        echo_port: Option<u16>,
    },
    /// (benchmark internals) Subscribe to conntrack's destroy events and never read them.
    #[command(hide = true)]
    BenchDestroyListener,
    /// (benchmark internals) Open connections at a rate and print a JSON report.
    #[command(hide = true)]
    BenchClient {
        #[arg(long)]
        target: std::net::SocketAddr,
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        seconds: f64,
        /// Keep this many connections and exchange messages on them (to an echo port)
        /// instead of opening new ones.
        #[arg(long)]
        echo_connections: Option<usize>,
        /// With `--echo-connections`: this many exchanges per second in all, paced, with
        /// the client's latency percentiles in the report.
        #[arg(long)]
        paced_rate: Option<u64>,
    },
}

/// Writes `value` as JSON to standard output (a bench client's report).
fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    serde_json::to_writer(std::io::stdout(), value).map_err(Into::into)
}

/// The workspace's top directory.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Setup => setup::setup(),
        Task::Test { args, no_kernels } => test::test(&args, !no_kernels),
        Task::Dist => setup::setup().and_then(|()| dist::dist()).map(drop),
        Task::Demo(args) => demo::demo(args),
        Task::Bench(args) => bench::bench(args),
        Task::Kernels(args) => kernels::kernels(args),
        Task::Lab(args) => observer_lab::cli::run(args),
        Task::SkewTable => setup::run(
            std::process::Command::new("cargo")
                .args([
                    "run",
                    "--release",
                    "--quiet",
                    "-p",
                    "observer",
                    "--example",
                    "skew_table",
                ])
                .current_dir(workspace_root()),
        ),
        Task::BenchSink { port, echo_port } => load::sink(port, echo_port, 2),
        Task::BenchDestroyListener => load::destroy_listener(),
        Task::BenchClient {
            target,
            rate,
            seconds,
            echo_connections,
            paced_rate,
        } => {
            let duration = std::time::Duration::from_secs_f64(seconds);
            match (echo_connections, paced_rate) {
                (Some(connections), Some(paced)) => {
                    load::paced_echo_client(target, duration, connections, paced)
                        .and_then(|r| print_json(&r))
                }
                (Some(connections), None) => {
                    load::echo_client(target, duration, connections).and_then(|r| print_json(&r))
                }
                (None, _) => print_json(&load::client(target, rate, duration, 2)),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
