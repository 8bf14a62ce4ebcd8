//! `cargo xtask bench`: new TCP connections per second through the lab's DNAT
//! (kube-proxy iptables rules, bridged node) with observer attached vs not, and the
//! highest offered rate at which observer still loses nothing; then observer's CPU and
//! RSS on a node with 5,000 Services (`bench_scale`). Prints tables and ratios; medians
//! of several runs. A benchmark, not a test: it asserts nothing.
//!
//! Each connection is a fresh DNAT decision: the client (in the lab's client pod)
//! connects to a `bench/sink:tcp` ClusterIP backed by the three checkout pods, where a
//! sink accepts and drops it; the client resets it (no TIME_WAIT), so observer sees an
//! open and an RST close for every connection.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use anyhow::{Context as _, bail};
use observer_lab::{self as lab, Lab, LabConfig, Observer, Proto, RuleMode, Service, Topology};

use crate::load::{EchoReport, LoadReport};

mod compare;
mod cost;
mod cputime;
mod hooks;
mod keepalive;
mod progstats;
mod rounds;
mod subscriber;

const PREFIX: &str = "bench";
const SINK_PORT: u16 = 9090;
/// The sinks echo on this port, behind the `bench/echo:tcp` Service.
const ECHO_PORT: u16 = 9091;
/// Connections the echo rounds keep open (one client thread each).
const ECHO_CONNECTIONS: usize = 2;
/// The scale figure a full run ends with: Services x 3 endpoints, seconds measured per
/// rule format.
const SCALE_SERVICES: usize = 5000;
const SCALE_SECONDS: f64 = 30.0;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Interleaved rounds per configuration (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Offered rates (connections/s) for the loss ramp.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,2000,4000,8000,12000,16000,20000"
    )]
    rates: Vec<u64>,
    /// Only the scale figure, with this many Services: observer's CPU (children included)
    /// and RSS on a node with N Services x 3 endpoints under light traffic, in both rule
    /// formats. Without it, a full run ends with that figure for 5,000 Services.
    #[arg(long)]
    services: Option<usize>,
    /// Set up the lab and the sink, print how to drive load at it (e.g. to watch the live
    /// view under load), and wait for Enter instead of measuring.
    #[arg(long)]
    hold: bool,
    /// Benchmark this observer binary instead of building one (e.g. to compare builds).
    #[arg(long)]
    observer: Option<std::path::PathBuf>,
    /// Only one part of the run (`subscriber`: the bound split into empty programs and
    /// conntrack's destroy subscriber, through the DNAT and pod-to-pod; `keepalive`: a
    /// fixed keep-alive load, latency and observer's CPU, and an idle observer; `hooks`:
    /// the floor of an empty net_dev_queue program against an empty netfilter one).
    #[arg(long, value_enum)]
    only: Option<Part>,
    /// Compare this observer binary (e.g. an older build) with the one benchmarked, in
    /// interleaved rounds on one lab: rates, CPU per connection, kernel programs' cost
    /// per new connection and per exchange on kept connections. Only that is run. With
    /// `--only keepalive`, the keep-alive figures of both builds in the same rounds.
    #[arg(long, value_name = "BINARY")]
    compare: Option<std::path::PathBuf>,
}

/// A part of the benchmark that `--only` runs alone.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Part {
    /// What conntrack's destroy subscriber costs, beside the empty programs and alone.
    Subscriber,
    /// The seed's case at a fixed load: 10,000 exchanges/s over 100 kept connections,
    /// client latency with and without observer, observer's CPU; and an idle observer.
    Keepalive,
    /// Empty programs on net_dev_queue and on netfilter's POSTROUTING and LOCAL_IN
    /// (Linux 6.4+): runs and ns per new connection and per kept exchange, and the rate.
    Hooks,
}

/// Kills child processes when the benchmark ends, however it ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    crate::setup::setup()?;
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the benchmark builds network namespaces and loads eBPF programs; run it as root: sudo -E cargo xtask bench"
        );
    }
    let observer = match &args.observer {
        Some(path) => path.clone(),
        None => crate::demo::build_observer(true)?,
    };
    if let Some(services) = args.services {
        return crate::bench_scale::scale(&observer, services, SCALE_SECONDS);
    }
    let xtask = std::env::current_exe()?;
    let (lab, targets, children) = sink_lab(&xtask)?;
    let Targets {
        sink: target,
        pod,
        echo,
    } = targets;
    if args.hold {
        println!("lab ready; drive load with:");
        println!(
            "  ip netns exec {} {} bench-client --target {target} --rate 8000 --seconds 10",
            lab.client_ns(),
            xtask.display()
        );
        println!(
            "  (or messages on kept connections: --target {echo} --rate 0 --echo-connections {ECHO_CONNECTIONS})"
        );
        println!("press Enter to tear it down");
        std::io::stdin().read_line(&mut String::new())?;
        return Ok(());
    }
    let load_to = |target: SocketAddr, rate: u64| -> anyhow::Result<LoadReport> {
        bench_client(&lab, &xtask, target, rate, args.seconds, &[])
    };
    let load = |rate: u64| load_to(target, rate);
    let exchange = || -> anyhow::Result<EchoReport> {
        let connections = ECHO_CONNECTIONS.to_string();
        bench_client(
            &lab,
            &xtask,
            echo,
            0,
            args.seconds,
            &["--echo-connections", &connections],
        )
    };
    let keepalive = || -> anyhow::Result<crate::load::PacedReport> {
        let (connections, rate) = (
            keepalive::CONNECTIONS.to_string(),
            keepalive::RATE.to_string(),
        );
        bench_client(
            &lab,
            &xtask,
            echo,
            0,
            args.seconds,
            &["--echo-connections", &connections, "--paced-rate", &rate],
        )
    };

    println!(
        "observer benchmark: new TCP connections/s through kube-proxy iptables DNAT (lab, bridged node)"
    );
    println!(
        "{} s per run, median of {} interleaved rounds; machine: {} CPUs",
        args.seconds,
        args.runs,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    let setup = cost::Setup {
        lab: &lab,
        observer: &observer,
        xtask: &xtask,
        rounds: args.runs,
        dnat: &|| load(0),
        pod_to_pod: &|| load_to(pod, 0),
        established: &exchange,
        keepalive: &keepalive,
    };
    if let Some(other) = &args.compare
        && !matches!(args.only, Some(Part::Keepalive))
    {
        return compare::report(&setup, other);
    }
    match args.only {
        Some(Part::Subscriber) => return subscriber::report(&setup),
        Some(Part::Keepalive) => return keepalive::report(&setup, args.compare.as_deref()),
        Some(Part::Hooks) => return hooks::report(&setup),
        None => {}
    }
    cost::report(&setup)?;
    println!();
    loss_ramp(&observer, &args.rates, &load)?;
    drop(children);
    drop(lab);
    println!();
    crate::bench_scale::scale(&observer, SCALE_SERVICES, SCALE_SECONDS)
}

/// One run of `xtask bench-client` in the lab's client namespace, and its JSON report.
fn bench_client<T: serde::de::DeserializeOwned>(
    lab: &Lab,
    xtask: &Path,
    target: SocketAddr,
    rate: u64,
    seconds: f64,
    extra: &[&str],
) -> anyhow::Result<T> {
    let (target, rate, seconds) = (target.to_string(), rate.to_string(), seconds.to_string());
    let mut client_args = vec![
        "bench-client",
        "--target",
        &target,
        "--rate",
        &rate,
        "--seconds",
        &seconds,
    ];
    client_args.extend_from_slice(extra);
    let out = lab.run_in(lab.client_ns(), &xtask.to_string_lossy(), &client_args)?;
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "bench client said: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Where the benchmark's clients connect.
struct Targets {
    /// The `bench/sink:tcp` Service.
    sink: SocketAddr,
    /// One pod's sink, straight (pod-to-pod rounds).
    pod: SocketAddr,
    /// The `bench/echo:tcp` Service.
    echo: SocketAddr,
}

/// The lab with `bench/sink:tcp` and `bench/echo:tcp` Services on the checkout pods, a
/// sink in each; returns it, where to connect, and the sinks.
fn sink_lab(xtask: &Path) -> anyhow::Result<(Lab, Targets, Children)> {
    lab::down(PREFIX)?;
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: PREFIX.to_owned(),
    })?;
    let checkout = lab.service("checkout")?.clone();
    let sink = Service {
        namespace: "bench".into(),
        name: "sink".into(),
        port_name: "tcp".into(),
        proto: Proto::Tcp,
        cluster_ip: Ipv4Addr::new(10, 96, 99, 99),
        port: SINK_PORT,
        target_port: SINK_PORT,
        node_port: None,
        traffic: Default::default(),
        endpoints: checkout.endpoints.clone(),
    };
    let echo = Service {
        name: "echo".into(),
        cluster_ip: Ipv4Addr::new(10, 96, 99, 98),
        port: ECHO_PORT,
        target_port: ECHO_PORT,
        ..sink.clone()
    };
    let target = SocketAddr::from(sink.cluster_addr());
    let echo_target = SocketAddr::from(echo.cluster_addr());
    lab.add_service(sink)?;
    lab.add_service(echo)?;
    let mut children = Children(Vec::new());
    for pod in &checkout.endpoints {
        children.0.push(
            Command::new("ip")
                .args(["netns", "exec", &pod.ns])
                .arg(xtask)
                .args(["bench-sink", "--port", &SINK_PORT.to_string()])
                .args(["--echo-port", &ECHO_PORT.to_string()])
                .spawn()?,
        );
    }
    // Room for many connections a second without reusing ports too soon.
    lab.run_in(
        lab.client_ns(),
        "sysctl",
        &["-qw", "net.ipv4.ip_local_port_range=1024 65000"],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let pod = SocketAddr::from((checkout.endpoints[0].ip, SINK_PORT));
    let targets = Targets {
        sink: target,
        pod,
        echo: echo_target,
    };
    Ok((lab, targets, children))
}

/// observer attached at each offered rate in turn: what it recorded and lost, and the
/// highest rate with nothing lost.
fn loss_ramp(
    observer: &Path,
    rates: &[u64],
    load: &dyn Fn(u64) -> anyhow::Result<LoadReport>,
) -> anyhow::Result<()> {
    println!("loss ramp (observer attached)");
    println!(
        "  offered/s  achieved/s  connections  dnat_events  recorded  lost_connections  lost_events  observer CPU µs/conn"
    );
    let mut highest_lossless = None;
    for &rate in rates {
        let dir = tempfile_dir()?;
        let recorder = Recorder::start(observer, &dir)?;
        let report = load(rate)?;
        let summary = recorder.stop()?;
        println!(
            "  {rate:>9}  {:>10.0}  {:>11}  {:>11}  {:>8}  {:>16}  {:>11}  {:>20.1}",
            report.rate(),
            report.connected,
            summary.dnat_events,
            summary.connections,
            summary.lost_connections,
            summary.lost_events,
            summary.cpu_seconds * 1e6 / summary.connections.max(1) as f64
        );
        if summary.lost_connections == 0 && summary.connections >= report.connected {
            highest_lossless = Some(report.rate());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    match highest_lossless {
        Some(rate) => println!("  highest rate with nothing lost: {rate:.0} connections/s"),
        None => println!("  observer lost connections at every offered rate"),
    }
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("observer-bench-{}-{}", std::process::id(), nanos()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn list(values: &[f64]) -> String {
    list_decimals(values, 0)
}

fn list_decimals(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn list_u64(values: &[u64]) -> String {
    values
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The summary line's counts, and the CPU time observer used.
#[derive(serde::Deserialize)]
struct Summary {
    connections: u64,
    dnat_events: u64,
    lost_connections: u64,
    lost_events: u64,
    #[serde(skip)]
    cpu_seconds: f64,
}

/// User + system CPU seconds of every child reaped so far.
fn children_cpu_seconds() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage cannot fail for RUSAGE_CHILDREN");
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    seconds(usage.user_time()) + seconds(usage.system_time())
}

/// `observer record` writing into `dir`, started and attached.
struct Recorder {
    observer: Observer,
    log: std::path::PathBuf,
}

impl Recorder {
    fn start(observer: &Path, dir: &Path) -> anyhow::Result<Recorder> {
        let log = dir.join("conns.jsonl");
        let mut command = Command::new(observer);
        // `--output`: the name older builds know (`--write`'s alias now), so that
        // `--compare` can run them.
        command.args(["record", "--output"]).arg(&log);
        // With the netfilter hook (`OBSERVER_HOOK=netfilter`), only the node's namespace
        // is linked, as on a real node (the lab's pods are named namespaces too). Builds
        // that do not know the variable ignore it.
        command.env("OBSERVER_NODE_NETNS", format!("/run/netns/{PREFIX}-node"));
        let observer = Observer::start(command, false)?;
        Ok(Recorder { observer, log })
    }

    fn stop(mut self) -> anyhow::Result<Summary> {
        // observer's CPU time counts once it is reaped, in `terminate`.
        let before = children_cpu_seconds();
        self.observer.terminate()?;
        let cpu_seconds = children_cpu_seconds() - before;
        let text = std::fs::read_to_string(&self.log)?;
        let last = text.lines().last().context("empty connection log")?;
        let summary: Summary =
            serde_json::from_str(last).context("the log's last line is not a summary")?;
        Ok(Summary {
            cpu_seconds,
            ..summary
        })
    }
}
