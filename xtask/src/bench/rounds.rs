//! Interleaved rounds of several configurations of the node (no observer, an observer
//! build, empty programs, a destroy subscriber...) under one load, and their medians
//! and ratios against the rounds without anything attached.

use std::path::Path;

use anyhow::Context as _;

use super::{Recorder, cost, cputime::CpuTime, list, median, progstats, tempfile_dir};

/// What is attached to the node during a round.
#[derive(Clone, Copy)]
pub enum Attached<'a> {
    Nothing,
    /// `observer record` of this binary.
    Observer(&'a Path),
    /// Programs that return at once on observer's three hooks.
    EmptyPrograms,
    /// A never-read subscriber to conntrack's destroy events in the node.
    Subscriber,
    /// Both of the above: the bound of the full bench.
    EmptyProgramsAndSubscriber,
    /// Empty programs on these hooks only (`--only hooks`).
    EmptyOn(progstats::FloorHooks<'a>),
}

/// One configuration's rounds: its label and what it attaches.
pub struct Variant<'a> {
    pub label: &'a str,
    pub attached: Attached<'a>,
}

/// One round's result: units per second, and observer's CPU per unit when it ran.
#[derive(Clone, Copy)]
pub struct Round {
    pub rate: f64,
    pub cpu_us_per_unit: Option<f64>,
}

/// `rounds` rounds of `load` under each variant, the variants' order rotated by one each
/// round so that none always runs first or last; returns each variant's rounds in the
/// order of `variants`.
pub fn interleaved(
    setup: &cost::Setup<'_>,
    variants: &[Variant<'_>],
    load: &dyn Fn() -> anyhow::Result<(f64, u64)>,
) -> anyhow::Result<Vec<Vec<Round>>> {
    let mut results = vec![Vec::new(); variants.len()];
    for round in 0..setup.rounds {
        for offset in 0..variants.len() {
            let index = (round + offset) % variants.len();
            results[index].push(one_round(setup, variants[index].attached, load)?);
        }
    }
    Ok(results)
}

/// One run of `load` (which returns units per second and units done) with `attached`.
fn one_round(
    setup: &cost::Setup<'_>,
    attached: Attached<'_>,
    load: &dyn Fn() -> anyhow::Result<(f64, u64)>,
) -> anyhow::Result<Round> {
    let plain = |rate: f64| Round {
        rate,
        cpu_us_per_unit: None,
    };
    Ok(match attached {
        Attached::Nothing => plain(load()?.0),
        Attached::Observer(binary) => {
            let dir = tempfile_dir()?;
            let recorder = Recorder::start(binary, &dir)?;
            let pid = recorder.observer.pid();
            let before = CpuTime::of(pid)?;
            let (rate, units) = load()?;
            // Let it drain what the run produced.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let cpu = CpuTime::of(pid)?.seconds_since(&before);
            recorder.stop().context("observer record")?;
            let _ = std::fs::remove_dir_all(&dir);
            Round {
                rate,
                cpu_us_per_unit: Some(cpu * 1e6 / units.max(1) as f64),
            }
        }
        Attached::EmptyPrograms => {
            let programs = progstats::FloorPrograms::attach()?;
            let round = plain(load()?.0);
            drop(programs);
            round
        }
        Attached::EmptyOn(hooks) => {
            let programs = progstats::FloorPrograms::attach_on(hooks)?;
            let round = plain(load()?.0);
            drop(programs);
            round
        }
        Attached::Subscriber => {
            let listener = cost::destroy_listener(setup)?;
            let round = plain(load()?.0);
            drop(listener);
            round
        }
        Attached::EmptyProgramsAndSubscriber => {
            let programs = progstats::FloorPrograms::attach()?;
            let listener = cost::destroy_listener(setup)?;
            let round = plain(load()?.0);
            drop((listener, programs));
            round
        }
    })
}

/// Each variant's median, its ratio to the first variant's median, the median of the
/// per-round ratios (each round against the same round's first variant, which the VM's
/// drift between rounds moves less), and its rounds; observer's CPU per unit where it
/// ran.
pub fn print(variants: &[Variant<'_>], results: &[Vec<Round>], unit: &str) {
    let rates = |rounds: &[Round]| rounds.iter().map(|r| r.rate).collect::<Vec<_>>();
    let base_rounds = rates(&results[0]);
    let base = median(&mut base_rounds.clone());
    println!(
        "  {:<26}  {:>8}   ratio   paired   rounds ({unit}/s)",
        "", "median"
    );
    for (variant, rounds) in variants.iter().zip(results) {
        let own = rates(rounds);
        let rate = median(&mut own.clone());
        let mut paired: Vec<f64> = own.iter().zip(&base_rounds).map(|(r, b)| r / b).collect();
        println!(
            "  {:<26}  {rate:>8.0}   {:.3}   {:.3}    {}",
            variant.label,
            rate / base,
            median(&mut paired),
            list(&own)
        );
    }
    for (variant, rounds) in variants.iter().zip(results) {
        let mut cpu: Vec<f64> = rounds.iter().filter_map(|r| r.cpu_us_per_unit).collect();
        if cpu.is_empty() {
            continue;
        }
        let text = cpu
            .iter()
            .map(|v| format!("{v:.2}"))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "  {} CPU per {unit} (user + sys): {:.2} µs median; rounds {text}",
            variant.label,
            median(&mut cpu)
        );
    }
}

/// The load average line every figure is printed with.
pub fn load_average() -> anyhow::Result<String> {
    Ok(std::fs::read_to_string("/proc/loadavg")?.trim().to_owned())
}
