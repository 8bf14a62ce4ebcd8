//! `cargo xtask bench --only hooks`: the floor of each hook observer's per-packet program
//! can run on (issue 31, step 1), before any of observer's code moves there. An empty
//! program on `net_dev_queue` (today's hook: every device a packet is queued on, so a
//! forwarded packet runs it on the pod's veth and again on the bridge or uplink) against
//! an empty `BPF_PROG_TYPE_NETFILTER` program linked at POSTROUTING and LOCAL_IN of the
//! node's namespace (Linux 6.4+: once per packet). For each, through the DNAT: program
//! runs and nanoseconds per new connection (connect + RST) and per exchange on kept
//! connections, from `kernel.bpf_stats_enabled`; and the connection rate against no
//! program at all, in interleaved rounds.

use super::{
    cost,
    progstats::{self, FloorHooks, FloorPrograms},
    rounds::{self, Attached, Variant},
};

pub fn report(setup: &cost::Setup<'_>) -> anyhow::Result<()> {
    let node = setup.lab.node_ns();
    let hooks = [
        ("empty net_dev_queue", FloorHooks::DevQueue),
        ("empty netfilter", FloorHooks::Netfilter(node)),
    ];
    let _stats = progstats::StatsEnabled::new()?;
    println!("hook floors: empty programs, per unit of traffic through the DNAT");
    println!(
        "  {:<22} {:>9} {:>9} {:>10} {:>11} {:>9} {:>10}",
        "", "runs/conn", "ns/run", "ns/conn", "runs/exch", "ns/run", "ns/exch"
    );
    for (label, on) in hooks {
        let per_conn = phase(on, &|| {
            let report = (setup.dnat)()?;
            Ok(report.connected)
        })?;
        let per_exchange = phase(on, &|| Ok((setup.established)()?.exchanges))?;
        println!(
            "  {label:<22} {:>9.2} {:>9.1} {:>10.1} {:>11.2} {:>9.1} {:>10.1}",
            per_conn.runs,
            per_conn.ns_per_run,
            per_conn.runs * per_conn.ns_per_run,
            per_exchange.runs,
            per_exchange.ns_per_run,
            per_exchange.runs * per_exchange.ns_per_run,
        );
    }
    println!("load average before: {}", rounds::load_average()?);
    let variants = [
        Variant {
            label: "no programs",
            attached: Attached::Nothing,
        },
        Variant {
            label: hooks[0].0,
            attached: Attached::EmptyOn(hooks[0].1),
        },
        Variant {
            label: hooks[1].0,
            attached: Attached::EmptyOn(hooks[1].1),
        },
    ];
    let results = rounds::interleaved(setup, &variants, &|| {
        let report = (setup.dnat)()?;
        Ok((report.rate(), report.connected))
    })?;
    println!(
        "new connections/s through the DNAT, {} interleaved rounds",
        setup.rounds
    );
    rounds::print(&variants, &results, "connection");
    Ok(())
}

/// One hook's program runs per unit of a load and its ns per run.
struct PerUnit {
    runs: f64,
    ns_per_run: f64,
}

/// Attaches the empty programs `on`, runs `load` (which returns the units it did) and
/// reads what their runs cost.
fn phase(on: FloorHooks<'_>, load: &dyn Fn() -> anyhow::Result<u64>) -> anyhow::Result<PerUnit> {
    let programs = FloorPrograms::attach_on(on)?;
    let before = progstats::snapshot(&programs.ids)?;
    let units = load()?;
    let after = progstats::snapshot(&programs.ids)?;
    drop(programs);
    let runs = progstats::since(&after, &before);
    let (count, ns) = runs
        .values()
        .fold((0, 0), |(count, ns), r| (count + r.count, ns + r.ns));
    Ok(PerUnit {
        runs: count as f64 / units.max(1) as f64,
        ns_per_run: ns as f64 / count.max(1) as f64,
    })
}
