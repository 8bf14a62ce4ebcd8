//! Prints docs/statistics.md's tables (`cargo xtask skew-table`): how often `check
//! --max-skew 1.5` fails on a fair random DNAT, by size and request mix, and how many
//! connections it takes to catch a given unevenness. Synthetic recordings, fixed seeds: the
//! same numbers on every run.

#[path = "../tests/common/synthetic.rs"]
mod synthetic;

use observer::report::check::Conditions;
use observer::stats::chance::FairDnat;
use observer::stats::mix::RequestMix;
use synthetic::{Mix, Rng, Verdict, draw, service_template, violation_of};

/// Recordings per cell of the false-alarm table.
const FAIR_LOGS: usize = 10_000;
/// Recordings per cell of the detection table.
const UNEVEN_LOGS: usize = 1_000;
/// Detected: `--max-skew` fails this often.
const DETECTED: f64 = 0.95;
const CONNECTIONS: [usize; 10] = [30, 50, 100, 200, 300, 500, 1000, 2000, 5000, 10_000];

fn limit(max_skew: f64) -> Conditions {
    Conditions {
        max_skew: Some(max_skew),
        ..Conditions::default()
    }
}

/// The share of `logs` recordings with each verdict.
fn rates(
    pods: usize,
    connections: usize,
    mix: Mix,
    dnat: &[f64],
    max_skew: f64,
    logs: usize,
    seed: u64,
) -> [f64; 3] {
    let template = service_template(pods);
    let conditions = limit(max_skew);
    let mut rng = Rng(seed);
    let mut counts = [0usize; 3];
    for _ in 0..logs {
        let draw = draw(&mut rng, pods, connections, mix, dnat);
        let index = match Verdict::of(violation_of(&template, &draw, &conditions).as_deref()) {
            Verdict::Passed => 0,
            Verdict::BeyondChance => 1,
            Verdict::UsuallyAbove => 2,
        };
        counts[index] += 1;
    }
    counts.map(|n| n as f64 / logs as f64)
}

/// The median skew of a fair DNAT of `connections` one-request connections over `pods`.
fn fair_median(pods: usize, connections: usize) -> f64 {
    let dnat = FairDnat::new(
        &vec![1.0 / pods as f64; pods],
        &RequestMix::uniform(connections as u64),
    );
    dnat.map_or(f64::NAN, |d| d.median())
}

fn percent(rate: f64) -> String {
    format!("{:.2}%", rate * 100.0)
}

fn false_alarms() {
    println!("### A fair DNAT against `--max-skew 1.5` ({FAIR_LOGS} recordings each)\n");
    println!(
        "| pods | connections | requests | fair median skew (light) | fails beyond chance | fails as too few / pinning | passes |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|");
    let mut seed = 1;
    for pods in [3, 10] {
        for connections in [30, 100, 300, 1000] {
            for mix in [Mix::Light, Mix::KeepAlive] {
                seed += 1;
                let [passed, beyond, usually] =
                    rates(pods, connections, mix, &[], 1.5, FAIR_LOGS, seed);
                println!(
                    "| {pods} | {connections} | {} | {:.2} | {} | {} | {} |",
                    mix.name(),
                    fair_median(pods, connections),
                    percent(beyond),
                    percent(usually),
                    percent(passed)
                );
            }
        }
    }
    println!();
}

/// The DNAT that gives the first pod `unevenness` times its fair share, the rest evenly.
fn uneven(pods: usize, unevenness: f64) -> Vec<f64> {
    let first = unevenness / pods as f64;
    let rest = (1.0 - first) / (pods - 1) as f64;
    std::iter::once(first)
        .chain(std::iter::repeat_n(rest, pods - 1))
        .collect()
}

fn detection() {
    println!(
        "### Connections it takes to catch an uneven DNAT ({UNEVEN_LOGS} recordings each, one request per connection)\n"
    );
    println!(
        "The fewest connections (of {CONNECTIONS:?}) at which `--max-skew R` fails at least {:.0}% of the time when the rules pick one pod `u` times as often as its share.\n",
        DETECTED * 100.0
    );
    println!("| pods | `--max-skew` | u = 1.25 | u = 1.5 | u = 1.75 | u = 2 | u = 2.5 |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut seed = 100;
    for pods in [3, 10] {
        for max_skew in [1.1, 1.2, 1.5] {
            let mut cells = Vec::new();
            for unevenness in [1.25, 1.5, 1.75, 2.0, 2.5] {
                let dnat = uneven(pods, unevenness);
                let found = CONNECTIONS.iter().find(|&&connections| {
                    seed += 1;
                    let [_, beyond, _] = rates(
                        pods,
                        connections,
                        Mix::Light,
                        &dnat,
                        max_skew,
                        UNEVEN_LOGS,
                        seed,
                    );
                    beyond >= DETECTED
                });
                cells.push(found.map_or("-".to_owned(), |n| n.to_string()));
            }
            println!("| {pods} | {max_skew} | {} |", cells.join(" | "));
        }
    }
    println!();
    println!(
        "`-`: not within {} connections (an unevenness at or under the limit is not a failure).",
        CONNECTIONS[CONNECTIONS.len() - 1]
    );
}

fn main() {
    false_alarms();
    detection();
}
