//! `cargo xtask bench --only keepalive`: the seed's case at a fixed load, as peers
//! publish it (Coroot: about 200 mCPU for its agent at 10,000 requests/s over 100
//! keep-alive connections). 10,000 request-response exchanges per second (64 bytes each
//! way) over 100 kept connections through a Service, with and without observer, in
//! alternating rounds, `kernel.bpf_stats_enabled` on in all of them (so both pay the
//! accounting). Reports the client's p50 and p99 latency, measured from when each
//! exchange was due, and observer's CPU as % of a core: its programs (bpf_stats, gross:
//! the accounting's own clock reads included; and net of them, less what empty programs
//! on the same hooks measure under the same load) and its process (user + sys). Then an
//! idle `observer record` (no traffic). With `--compare OTHER`, the same for a second
//! build in the same alternating rounds, so that a VM whose speed drifts moves both.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::{
    Recorder, cost, cputime::CpuTime, list, list_decimals, median, progstats, rounds, tempfile_dir,
};
use crate::load::PacedReport;

/// Exchanges per second in all, and kept connections.
pub const RATE: u64 = 10_000;
pub const CONNECTIONS: usize = 100;
/// How long an idle observer is measured per round, after it settled.
const IDLE: Duration = Duration::from_secs(10);
const SETTLE: Duration = Duration::from_secs(2);

/// One round with observer attached.
struct Observed {
    load: PacedReport,
    /// Each program's ns and runs, and the process's CPU seconds, over `wall`.
    programs: BTreeMap<String, progstats::Runs>,
    process_seconds: f64,
    wall: f64,
}

impl Observed {
    fn programs_ns(&self) -> u64 {
        self.programs.values().map(|runs| runs.ns).sum()
    }

    fn program_runs(&self) -> u64 {
        self.programs.values().map(|runs| runs.count).sum()
    }

    fn programs_percent(&self) -> f64 {
        self.programs_ns() as f64 / 1e9 / self.wall * 100.0
    }

    /// The programs' CPU net of bpf_stats' own: each run less what an empty program
    /// on the same hook measured (`floor`).
    fn programs_net_percent(&self, floor: &Floor) -> f64 {
        let (own, floor_ns) = progstats::against_floor(&self.programs, &floor.0);
        (own - floor_ns).max(0.0) / 1e9 / self.wall * 100.0
    }

    fn process_percent(&self) -> f64 {
        self.process_seconds / self.wall * 100.0
    }
}

/// The empty programs' runs (`progstats::FloorPrograms`) in a round of the same load:
/// what bpf_stats measures for a program that does nothing, per hook.
struct Floor(BTreeMap<String, progstats::Runs>);

impl Floor {
    fn measure(setup: &cost::Setup<'_>) -> anyhow::Result<Floor> {
        let programs = progstats::FloorPrograms::attach()?;
        let before = progstats::snapshot(&programs.ids)?;
        (setup.keepalive)()?;
        let after = progstats::snapshot(&programs.ids)?;
        drop(programs);
        let runs = progstats::since(&after, &before);
        for name in ["floor_dev_queue", "floor_ingress", "floor_egress"] {
            anyhow::ensure!(
                runs.contains_key(name),
                "the empty program {name} is missing"
            );
        }
        Ok(Floor(runs))
    }

    fn per_run(&self, name: &str) -> f64 {
        progstats::floor_per_run(&self.0, name)
    }
}

/// `other`: a second build measured in the same rounds (`--compare`).
pub fn report(setup: &cost::Setup<'_>, other: Option<&Path>) -> anyhow::Result<()> {
    println!("load average before: {}", rounds::load_average()?);
    let stats = progstats::StatsEnabled::new()?;
    // None first, then each build; the order turns by one each round.
    let builds: Vec<&Path> = std::iter::once(setup.observer).chain(other).collect();
    let mut without = Vec::new();
    let mut with: Vec<Vec<Observed>> = builds.iter().map(|_| Vec::new()).collect();
    let slots = builds.len() + 1;
    for round in 0..setup.rounds {
        for turn in 0..slots {
            match (round + turn) % slots {
                0 => without.push((setup.keepalive)()?),
                build => with[build - 1]
                    .push(observed_round(builds[build - 1], |_| (setup.keepalive)())?),
            }
        }
    }
    let idle: Vec<Vec<Observed>> = builds
        .iter()
        .map(|build| {
            (0..3)
                .map(|_| {
                    observed_round(build, |_| {
                        std::thread::sleep(IDLE);
                        Ok(PacedReport::default())
                    })
                })
                .collect::<anyhow::Result<_>>()
        })
        .collect::<anyhow::Result<_>>()?;
    let floor = Floor::measure(setup)?;
    drop(stats);
    println!(
        "keep-alive: {RATE} exchanges/s over {CONNECTIONS} kept DNATed connections (64 bytes each way), {} alternating rounds, kernel.bpf_stats_enabled on in all",
        setup.rounds
    );
    let column = |reports: Vec<&PacedReport>| {
        let p50: Vec<f64> = reports.iter().map(|r| r.p50_us).collect();
        let p99: Vec<f64> = reports.iter().map(|r| r.p99_us).collect();
        let mut rate: Vec<f64> = reports
            .iter()
            .map(|r| r.exchanges as f64 / r.seconds.max(1e-9))
            .collect();
        let behind: u64 = reports.iter().map(|r| r.behind).sum();
        format!(
            "p50 {:.0} us (rounds {}), p99 {:.0} us (rounds {}), {:.0} exchanges/s, {behind} exchanges behind",
            median(&mut p50.clone()),
            list(&p50),
            median(&mut p99.clone()),
            list(&p99),
            median(&mut rate),
        )
    };
    println!("  no observer: {}", column(without.iter().collect()));
    for ((build, with), idle) in builds.iter().zip(&with).zip(&idle) {
        if other.is_some() {
            println!("  {}:", build.display());
        }
        println!(
            "  observer:    {}",
            column(with.iter().map(|o| &o.load).collect())
        );
        print_cpu("observer's CPU under that load", with, &floor, true);
        print_cpu(
            &format!(
                "an idle observer record (no traffic), 3 rounds of {} s",
                IDLE.as_secs()
            ),
            idle,
            &floor,
            false,
        );
    }
    println!("load average after: {}", rounds::load_average()?);
    Ok(())
}

fn print_cpu(title: &str, rounds: &[Observed], floor: &Floor, per_exchange: bool) {
    let figure = |of: &dyn Fn(&Observed) -> f64| {
        let values: Vec<f64> = rounds.iter().map(of).collect();
        format!(
            "{:.2}% ({})",
            median(&mut values.clone()),
            list_decimals(&values, 2)
        )
    };
    println!("  {title}, % of a core (medians; rounds):");
    println!(
        "    gross: total {}; programs {}; process {}",
        figure(&|o| o.programs_percent() + o.process_percent()),
        figure(&Observed::programs_percent),
        figure(&Observed::process_percent),
    );
    println!(
        "    net of bpf_stats (empty programs: {:.0} ns per run on net_dev_queue, {:.0} on cgroup ingress, {:.0} on egress): total {}; programs {}",
        floor.per_run("floor_dev_queue"),
        floor.per_run("floor_ingress"),
        floor.per_run("floor_egress"),
        figure(&|o| o.programs_net_percent(floor) + o.process_percent()),
        figure(&|o| o.programs_net_percent(floor)),
    );
    if per_exchange {
        let mut runs: Vec<f64> = rounds
            .iter()
            .map(|o| o.program_runs() as f64 / o.load.exchanges.max(1) as f64)
            .collect();
        let mut ns: Vec<f64> = rounds
            .iter()
            .map(|o| o.programs_ns() as f64 / o.program_runs().max(1) as f64)
            .collect();
        println!(
            "    program runs per exchange {:.2}, ns per run {:.0}; per program, ns per run and runs per exchange:",
            median(&mut runs),
            median(&mut ns)
        );
        for name in rounds
            .first()
            .map(|o| o.programs.keys())
            .into_iter()
            .flatten()
        {
            let mut ns: Vec<f64> = Vec::new();
            let mut runs: Vec<f64> = Vec::new();
            for round in rounds {
                if let Some(program) = round.programs.get(name) {
                    ns.push(program.per_run());
                    runs.push(program.count as f64 / round.load.exchanges.max(1) as f64);
                }
            }
            println!(
                "      {name:<16} {:>6.0} ns  {:>5.2} runs",
                median(&mut ns),
                median(&mut runs)
            );
        }
    }
}

/// `load` with `observer record` attached, its programs' and process's CPU measured
/// over the load.
fn observed_round(
    observer: &Path,
    load: impl FnOnce(()) -> anyhow::Result<PacedReport>,
) -> anyhow::Result<Observed> {
    let dir = tempfile_dir()?;
    let recorder = Recorder::start(observer, &dir)?;
    let pid = recorder.observer.pid();
    std::thread::sleep(SETTLE);
    let ids = progstats::program_ids(pid)?;
    let (programs_before, cpu_before, started) = (
        progstats::snapshot(&ids)?,
        CpuTime::of(pid)?,
        Instant::now(),
    );
    let report = load(())?;
    let (programs_after, cpu_after, wall) = (
        progstats::snapshot(&ids)?,
        CpuTime::of(pid)?,
        started.elapsed().as_secs_f64(),
    );
    recorder.stop().context("observer record")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Observed {
        load: report,
        programs: progstats::since(&programs_after, &programs_before),
        process_seconds: cpu_after.seconds_since(&cpu_before),
        wall,
    })
}
