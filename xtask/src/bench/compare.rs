//! `cargo xtask bench --compare OTHER`: two observer builds on one lab in interleaved
//! rounds, instead of runs hours apart on a VM whose speed drifts. Rates (connect + RST
//! through the DNAT, pod-to-pod, and 64-byte exchanges on kept DNATed connections)
//! without observer, with this build and with the other; then, with
//! `kernel.bpf_stats_enabled`, every kernel program's ns per run and runs per unit for
//! each build, in alternating rounds, and their sums: the kernel CPU per new connection
//! and per exchange on established connections. With observer's user + sys CPU per
//! connection from the rate rounds, that is its whole cost per new connection.

use std::{collections::BTreeMap, path::Path};

use super::{
    Recorder, cost, median, progstats,
    rounds::{self, Attached, Variant},
    tempfile_dir,
};

/// One run of a load: units per second and units done.
type Load<'a> = &'a dyn Fn() -> anyhow::Result<(f64, u64)>;

/// One build's kernel programs over one DNAT phase and one established phase.
struct KernelRound {
    /// Program name -> (ns, runs) over the DNAT phase, then over the established phase.
    programs: BTreeMap<String, [progstats::Runs; 2]>,
    connections: u64,
    exchanges: u64,
}

impl KernelRound {
    /// All programs' ns per unit of `phase` (0: per new connection, 1: per exchange).
    fn total_ns_per_unit(&self, phase: usize) -> f64 {
        let ns: u64 = self.programs.values().map(|runs| runs[phase].ns).sum();
        ns as f64 / self.units(phase).max(1) as f64
    }

    fn units(&self, phase: usize) -> u64 {
        [self.connections, self.exchanges][phase]
    }
}

pub fn report(setup: &cost::Setup<'_>, other: &Path) -> anyhow::Result<()> {
    let variants = [
        Variant {
            label: "no observer",
            attached: Attached::Nothing,
        },
        Variant {
            label: "this build",
            attached: Attached::Observer(setup.observer),
        },
        Variant {
            label: "other build",
            attached: Attached::Observer(other),
        },
    ];
    println!("this build: {}", setup.observer.display());
    println!("other build: {}", other.display());
    let connections = |load: &dyn Fn() -> anyhow::Result<crate::load::LoadReport>| {
        let report = load()?;
        Ok((report.rate(), report.connected))
    };
    let loads: [(&str, &str, Load<'_>); 3] = [
        (
            "new connections/s through the DNAT (connect + RST)",
            "connection",
            &|| connections(setup.dnat),
        ),
        (
            "pod-to-pod connections/s (no Service)",
            "connection",
            &|| connections(setup.pod_to_pod),
        ),
        (
            "exchanges/s on kept DNATed connections (64 bytes each way)",
            "exchange",
            &|| {
                let report = (setup.established)()?;
                Ok((report.exchanges as f64 / report.seconds, report.exchanges))
            },
        ),
    ];
    for (title, unit, load) in loads {
        println!("load average before: {}", rounds::load_average()?);
        let results = rounds::interleaved(setup, &variants, load)?;
        println!("{title}, {} interleaved rounds", setup.rounds);
        rounds::print(&variants, &results, unit);
        println!("load average after: {}", rounds::load_average()?);
        println!();
    }
    kernel_costs(
        setup,
        &[("this build", setup.observer), ("other build", other)],
    )
}

/// Each build's kernel programs in alternating rounds of a DNAT phase and an
/// established phase, `kernel.bpf_stats_enabled` on throughout.
fn kernel_costs(setup: &cost::Setup<'_>, builds: &[(&str, &Path)]) -> anyhow::Result<()> {
    println!("load average before: {}", rounds::load_average()?);
    let stats = progstats::StatsEnabled::new()?;
    let mut results: Vec<Vec<KernelRound>> = builds.iter().map(|_| Vec::new()).collect();
    for round in 0..setup.rounds {
        for offset in 0..builds.len() {
            let index = (round + offset) % builds.len();
            results[index].push(kernel_round(setup, builds[index].1)?);
        }
    }
    drop(stats);
    println!(
        "kernel programs (kernel.bpf_stats_enabled, gross: the accounting's own cost included), {} alternating rounds",
        setup.rounds
    );
    println!("  other traffic on the machine (other labs) runs the programs too");
    for ((label, _), rounds) in builds.iter().zip(&results) {
        let per = |phase: usize| {
            let values: Vec<f64> = rounds.iter().map(|r| r.total_ns_per_unit(phase)).collect();
            (median(&mut values.clone()), super::list(&values))
        };
        let (conn, conn_rounds) = per(0);
        let (exchange, exchange_rounds) = per(1);
        println!(
            "  {label}: all programs {conn:.0} ns per new connection (rounds {conn_rounds}), {exchange:.0} ns per exchange on kept connections (rounds {exchange_rounds})"
        );
        println!(
            "    program              DNAT ns/run  runs/conn   established ns/run  runs/exchange"
        );
        let names: std::collections::BTreeSet<&String> =
            rounds.iter().flat_map(|r| r.programs.keys()).collect();
        for name in names {
            let column = |phase: usize, per_run: bool| {
                let mut values: Vec<f64> = rounds
                    .iter()
                    .filter_map(|r| {
                        let runs = r.programs.get(name)?[phase];
                        Some(if per_run {
                            runs.per_run()
                        } else {
                            runs.count as f64 / r.units(phase).max(1) as f64
                        })
                    })
                    .collect();
                median(&mut values)
            };
            println!(
                "    {name:<20} {:>11.1}  {:>9.2}   {:>18.1}  {:>13.2}",
                column(0, true),
                column(0, false),
                column(1, true),
                column(1, false)
            );
        }
    }
    println!("load average after: {}", rounds::load_average()?);
    Ok(())
}

/// One build's programs over a DNAT phase, then an established phase.
fn kernel_round(setup: &cost::Setup<'_>, binary: &Path) -> anyhow::Result<KernelRound> {
    let dir = tempfile_dir()?;
    let recorder = Recorder::start(binary, &dir)?;
    let ids = progstats::program_ids(recorder.observer.pid())?;
    let start = progstats::snapshot(&ids)?;
    let dnat = (setup.dnat)()?;
    let middle = progstats::snapshot(&ids)?;
    let echo = (setup.established)()?;
    let end = progstats::snapshot(&ids)?;
    recorder.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    let (dnat_runs, echo_runs) = (
        progstats::since(&middle, &start),
        progstats::since(&end, &middle),
    );
    let programs = echo_runs
        .into_iter()
        .filter_map(|(name, echo)| {
            let dnat = *dnat_runs.get(&name)?;
            Some((name, [dnat, echo]))
        })
        .collect();
    Ok(KernelRound {
        programs,
        connections: dnat.connected,
        exchanges: echo.exchanges,
    })
}
