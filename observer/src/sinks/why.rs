//! Why a Service is skewed, in words a person acts on: `check --max-skew`'s violations,
//! `summary`'s reason lines and the live view's.

use crate::sinks::summary::skew_cause;
use crate::sinks::text::plural;
use crate::stats::ServiceStats;
use crate::stats::spread::{Carried, ConnectionSkew, Finding};

fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// The backend at `addr` as sentences name it (its pod where known).
fn label(s: &ServiceStats, addr: std::net::SocketAddr) -> String {
    s.backends
        .iter()
        .find(|b| b.backend == addr)
        .map_or_else(|| addr.to_string(), |b| b.label(true))
}

/// "pinning: 1 connection carried 30 of 30 requests"
pub fn pinning(half: &Carried, requests: u64) -> String {
    format!(
        "pinning: {} carried {} of {requests} requests",
        plural(half.connections, "connection"),
        half.requests
    )
}

/// "rules pick unevenly: 10.244.1.12:8080 got 60% of 600 connections, expected 33% (p < 1e-6)"
pub fn rules_uneven(s: &ServiceStats, picks: &ConnectionSkew) -> String {
    format!(
        "rules pick unevenly: {} got {} of {}, expected {} ({})",
        label(s, picks.backend),
        percent(picks.share),
        plural(picks.connections, "connection"),
        percent(picks.expected),
        picks.chance
    )
}

/// The cause of a finding that fails or is within chance; `None` when the limit holds.
pub fn cause(s: &ServiceStats, finding: &Finding) -> Option<String> {
    let spread = |connections: u64, median: f64| {
        format!(
            "a fair DNAT of {} over {} gives skew {median:.2} or more half the time",
            plural(connections, "connection"),
            plural(endpoints(s), "pod"),
        )
    };
    let busy = s.skew_detail().map(|d| d.backend);
    Some(match finding {
        Finding::Holds => return None,
        Finding::WithinChance(p) => {
            format!("within chance: a fair DNAT of these connections gives as much or more ({p})")
        }
        Finding::Pinning { half, median } => format!(
            "{} ({})",
            pinning(half, busy_requests(s)),
            spread(busy_connections(s), *median)
        ),
        Finding::TooFewConnections {
            connections,
            median,
            ..
        } => format!("too few connections: {}", spread(*connections, *median)),
        Finding::RulesUneven(picks) => rules_uneven(s, picks),
        Finding::BusierConnections { chance } => {
            let backend = busy?;
            let share = backend.connections as f64 / connections(s) as f64;
            // Connections that failed carried nothing: they make the others busier.
            let failed: u64 = with_share(s)
                .filter(|b| b.backend != backend.backend)
                .map(|b| b.outcomes.failed())
                .sum();
            let failures = if failed > 0 {
                format!(
                    "; {} to other pods failed ({} refused, {} unanswered)",
                    plural(failed, "connection"),
                    s.outcomes.refused,
                    s.outcomes.unanswered
                )
            } else {
                String::new()
            };
            format!(
                "busier connections: {} got {} of the connections, expected {}, but {} of the requests ({chance}){failures}",
                backend.label(true),
                percent(share),
                percent(backend.expected_share.unwrap_or(0.0)),
                percent(s.skew_detail()?.share),
            )
        }
    })
}

/// `check --max-skew`'s violation: "skew 3.00 > --max-skew 1.5 (10.244.1.12:8080 got
/// 100% of requests, expected 33%): pinning: ...", or for a skew under the limit that a
/// fair DNAT would usually exceed, "skew 1.20 is under --max-skew 1.5 only by luck (...):
/// too few connections: ...".
pub fn skew_violation(s: &ServiceStats, limit: f64, finding: &Finding) -> Option<String> {
    let detail = s.skew_detail()?;
    let cause = cause(s, finding)?;
    let (skew, what) = (detail.skew, skew_cause(&detail));
    Some(if skew > limit {
        format!("skew {skew:.2} > --max-skew {limit} ({what}): {cause}")
    } else {
        format!("skew {skew:.2} is under --max-skew {limit} only by luck ({what}): {cause}")
    })
}

fn endpoints(s: &ServiceStats) -> u64 {
    with_share(s).count() as u64
}

/// The backends skew is judged on: those with a positive expected share.
fn with_share(s: &ServiceStats) -> impl Iterator<Item = &crate::stats::BackendStats> {
    s.backends
        .iter()
        .filter(|b| b.expected_share.is_some_and(|e| e > 0.0))
}

fn connections(s: &ServiceStats) -> u64 {
    with_share(s).map(|b| b.connections).sum()
}

fn busy_connections(s: &ServiceStats) -> u64 {
    with_share(s)
        .map(|b| b.request_mix.busy().connections())
        .sum()
}

fn busy_requests(s: &ServiceStats) -> u64 {
    with_share(s).map(|b| b.requests).sum()
}
