//! What observer costs: connection rates through the DNAT with no observer, with
//! `observer record`, with `conntrack -E -e NEW` (the anchor), and with empty programs
//! on observer's hooks plus a destroy-event subscriber (the bound) in interleaved
//! rounds; pod-to-pod rates (no Service) with and without observer; each kernel
//! program's ns per run on DNATed and on pod-to-pod packets; observer's CPU per
//! connection; lost connections.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::Context as _;
use observer_lab::Lab;

use super::{
    Children, Recorder, cputime::CpuTime, list, list_u64, median, progstats, tempfile_dir,
};
use crate::load::{EchoReport, LoadReport};

/// What the measurements need from the benchmark's lab.
pub struct Setup<'a> {
    pub lab: &'a Lab,
    pub observer: &'a Path,
    /// This program (`xtask bench-destroy-listener`).
    pub xtask: &'a Path,
    pub rounds: usize,
    /// One unthrottled run through the Service's DNAT.
    pub dnat: &'a dyn Fn() -> anyhow::Result<LoadReport>,
    /// One unthrottled run straight to a pod IP.
    pub pod_to_pod: &'a dyn Fn() -> anyhow::Result<LoadReport>,
    /// One run of messages on a few kept connections through the DNAT.
    pub established: &'a dyn Fn() -> anyhow::Result<EchoReport>,
    /// One run of paced messages on 100 kept connections through the DNAT
    /// (`keepalive::RATE` per second).
    pub keepalive: &'a dyn Fn() -> anyhow::Result<crate::load::PacedReport>,
}

/// One run with `observer record` attached.
struct Recorded {
    rate: f64,
    cpu_us_per_conn: f64,
    lost: u64,
}

pub fn report(setup: &Setup<'_>) -> anyhow::Result<()> {
    println!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")?.trim()
    );
    dnat_rates(setup)?;
    pod_rates(setup)?;
    program_costs(setup)?;
    println!(
        "load average: {}",
        std::fs::read_to_string("/proc/loadavg")?.trim()
    );
    Ok(())
}

fn dnat_rates(setup: &Setup<'_>) -> anyhow::Result<()> {
    let (mut none, mut with, mut anchor) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu, mut lost, mut bare_rates) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..setup.rounds {
        none.push((setup.dnat)()?.rate());
        let recorded = recorded(setup, setup.dnat)?;
        with.push(recorded.rate);
        cpu.push(recorded.cpu_us_per_conn);
        lost.push(recorded.lost);
        let watch = conntrack_events(setup.lab)?;
        anchor.push((setup.dnat)()?.rate());
        drop(watch);
        let bare = bare_hooks(setup)?;
        bare_rates.push((setup.dnat)()?.rate());
        drop(bare);
    }
    println!(
        "new connections/s through the DNAT (rounds interleaved: none, observer, conntrack -E, empty hooks)"
    );
    println!("                          median   ratio   rounds");
    print_rates(
        &none,
        &[
            ("observer record", &with),
            ("conntrack -E -e NEW", &anchor),
            (BARE_HOOKS, &bare_rates),
        ],
    );
    println!(
        "  observer CPU per connection: {:.2} µs (median; rounds: {})",
        median(&mut cpu.clone()),
        cpu.iter()
            .map(|v| format!("{v:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("  lost connections per round: {}", list_u64(&lost));
    Ok(())
}

/// Pod-to-pod rates without observer, with it, and with only a subscriber to
/// conntrack's destroy events that never reads them: the part of observer's cost on
/// traffic without a Service that comes with following conntrack at all.
fn pod_rates(setup: &Setup<'_>) -> anyhow::Result<()> {
    let (mut none, mut with, mut destroy) = (Vec::new(), Vec::new(), Vec::new());
    let mut bare_rates = Vec::new();
    for _ in 0..setup.rounds {
        none.push((setup.pod_to_pod)()?.rate());
        with.push(recorded(setup, setup.pod_to_pod)?.rate);
        let listener = destroy_listener(setup)?;
        destroy.push((setup.pod_to_pod)()?.rate());
        drop(listener);
        let bare = bare_hooks(setup)?;
        bare_rates.push((setup.pod_to_pod)()?.rate());
        drop(bare);
    }
    println!(
        "pod-to-pod connections/s (no Service; rounds interleaved: none, observer, destroy subscriber, empty hooks)"
    );
    print_rates(
        &none,
        &[
            ("observer record", &with),
            ("destroy subscriber", &destroy),
            (BARE_HOOKS, &bare_rates),
        ],
    );
    println!(
        "  (destroy subscriber: a netlink socket on conntrack's destroy events in the node, never read;"
    );
    println!(
        "   {BARE_HOOKS}: that and programs that return at once on observer's three hooks, the bound"
    );
    println!("   any tool hooked and following conntrack as observer does stays under)");
    Ok(())
}

/// One run of `load` with `observer record` attached, and observer's CPU time over it
/// (`cputime`, start-up excluded).
fn recorded(
    setup: &Setup<'_>,
    load: &dyn Fn() -> anyhow::Result<LoadReport>,
) -> anyhow::Result<Recorded> {
    let dir = tempfile_dir()?;
    let recorder = Recorder::start(setup.observer, &dir)?;
    let pid = recorder.observer.pid();
    let before = CpuTime::of(pid)?;
    let report = load()?;
    // Let it drain and write what the run produced.
    std::thread::sleep(Duration::from_millis(300));
    let cpu = CpuTime::of(pid)?.seconds_since(&before);
    let summary = recorder.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Recorded {
        rate: report.rate(),
        cpu_us_per_conn: cpu * 1e6 / report.connected.max(1) as f64,
        lost: summary.lost_connections,
    })
}

/// `conntrack -E -e NEW` in the node's namespace, its output thrown away.
fn conntrack_events(lab: &Lab) -> anyhow::Result<Children> {
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.node_ns(),
            "conntrack",
            "-E",
            "-e",
            "NEW",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("conntrack -E")?;
    std::thread::sleep(Duration::from_millis(200));
    Ok(Children(vec![child]))
}

/// The rounds without observer, then each variant's median, its ratio to theirs, and
/// its rounds: one line each.
fn print_rates(none: &[f64], variants: &[(&str, &Vec<f64>)]) {
    let base = median(&mut none.to_vec());
    println!(
        "  {:<20}  {base:>8.0}   1.000   {}",
        "no observer",
        list(none)
    );
    for (name, rates) in variants {
        let rate = median(&mut rates.to_vec());
        println!(
            "  {name:<20}  {rate:>8.0}   {:.3}   {}",
            rate / base,
            list(rates)
        );
    }
}

/// The label of the rounds with `bare_hooks`.
const BARE_HOOKS: &str = "empty hooks+destroy";

/// Programs that return at once on observer's three hooks (`empty_programs.py`) and a
/// never-read subscriber to conntrack's destroy events: what a tool hooked where
/// observer is and following conntrack as it does costs before it does any work. Its
/// rate ratio bounds what observer's can reach.
fn bare_hooks(setup: &Setup<'_>) -> anyhow::Result<(progstats::FloorPrograms, Children)> {
    let programs = progstats::FloorPrograms::attach()?;
    Ok((programs, destroy_listener(setup)?))
}

/// `xtask bench-destroy-listener` in the lab's node namespace.
pub(super) fn destroy_listener(setup: &Setup<'_>) -> anyhow::Result<Children> {
    let child = Command::new("ip")
        .args(["netns", "exec", setup.lab.node_ns()])
        .arg(setup.xtask)
        .arg("bench-destroy-listener")
        .stdout(Stdio::null())
        .spawn()
        .context("xtask bench-destroy-listener")?;
    std::thread::sleep(Duration::from_millis(200));
    Ok(Children(vec![child]))
}

/// ns per run of each observer program over a DNAT-only phase, a pod-to-pod-only
/// phase, and a phase of messages on kept DNATed connections (their packets without any
/// open or close work); other traffic on the machine, e.g. other labs, runs them too.
fn program_costs(setup: &Setup<'_>) -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let recorder = Recorder::start(setup.observer, &dir)?;
    let floor = progstats::FloorPrograms::attach()?;
    let mut ids = progstats::program_ids(recorder.observer.pid())?;
    ids.extend(&floor.ids);
    let stats = progstats::StatsEnabled::new()?;
    let start = progstats::snapshot(&ids)?;
    let dnat = (setup.dnat)()?;
    let middle = progstats::snapshot(&ids)?;
    let pods = (setup.pod_to_pod)()?;
    let after_pods = progstats::snapshot(&ids)?;
    let echo = (setup.established)()?;
    let end = progstats::snapshot(&ids)?;
    drop(stats);
    drop(floor);
    recorder.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("kernel programs (kernel.bpf_stats_enabled), ns per run and runs per connection;");
    println!("  floor_* do nothing: their ns per run is what running any program costs here");
    println!(
        "  established: {} exchanges of 64 bytes each way on {} kept DNATed connections",
        echo.exchanges,
        super::ECHO_CONNECTIONS
    );
    println!(
        "  program            DNAT ns/run  runs/conn   pod-to-pod ns/run  runs/conn   established ns/run  runs/exchange"
    );
    for (name, end_runs) in &end {
        let (Some(first), Some(mid), Some(pods_end)) =
            (start.get(name), middle.get(name), after_pods.get(name))
        else {
            continue;
        };
        println!(
            "  {name:<18} {:>11.1}  {:>9.1}   {:>17.1}  {:>9.1}   {:>18.1}  {:>13.1}",
            mid.per_run_since(first),
            mid.count_since(first) as f64 / dnat.connected.max(1) as f64,
            pods_end.per_run_since(mid),
            pods_end.count_since(mid) as f64 / pods.connected.max(1) as f64,
            end_runs.per_run_since(pods_end),
            end_runs.count_since(pods_end) as f64 / echo.exchanges.max(1) as f64,
        );
    }
    let phases = [
        (
            "per new DNAT connection",
            progstats::since(&middle, &start),
            dnat.connected,
        ),
        (
            "per pod-to-pod connection",
            progstats::since(&after_pods, &middle),
            pods.connected,
        ),
        (
            "per exchange on kept connections",
            progstats::since(&end, &after_pods),
            echo.exchanges,
        ),
    ];
    println!(
        "  observer's programs against empty programs making the same runs on the same hooks (the floor: what running anything there costs), ns:"
    );
    for (phase, runs, units) in phases {
        let (own, floor) = progstats::against_floor(&runs, &runs);
        let units = units.max(1) as f64;
        println!(
            "    {phase}: observer {:.0}, floor {:.0}, observer's own work {:.0}",
            own / units,
            floor / units,
            (own - floor) / units
        );
    }
    Ok(())
}
