//! Why a Service is skewed, in words a person acts on: `check --max-skew`'s violations,
//! `summary`'s reason lines and the live view's.

use std::net::SocketAddr;

use chrono::{DateTime, Utc};

use crate::model::record::{Proto, Recording};
use crate::report::summary::skew_cause;
use crate::report::text::{Digits, duration, plural};
use crate::stats::ServiceStats;
use crate::stats::spread::{Carried, ConnectionSkew, Finding, Spread, judge};
use crate::stats::story::{Story, TopConnection};
use crate::stats::timeline::Timeline;

fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// The backend at `addr` as sentences name it (its pod where known).
fn label(s: &ServiceStats, addr: SocketAddr) -> String {
    s.backends
        .iter()
        .find(|b| b.backend == addr)
        .map_or_else(|| addr.to_string(), |b| b.label(true))
}

/// The connections behind each Service's skew, by Service (name, proto).
pub type Stories = std::collections::BTreeMap<(String, Proto), Story>;

/// Every Service's story from a recording (its connections and endpoints timeline).
pub fn stories(services: &[ServiceStats], recording: &Recording) -> Stories {
    let timeline = Timeline::from_recording(recording);
    services
        .iter()
        .map(|s| {
            let changes = timeline.service(&s.service, s.proto);
            (
                (s.service.clone(), s.proto),
                Story::of(s, recording.conns.iter(), &changes),
            )
        })
        .collect()
}

/// Under a skewed Service's skew line: why (as `check --max-skew 1.5` would judge it, or
/// the rollout window that carried the excess), the keep-alive story, what the skew is
/// made of and the busiest connections (pods where known and `names`).
pub fn reason_lines(s: &ServiceStats, story: Option<&Story>, names: bool) -> Vec<String> {
    let alpha = 1.0 - crate::report::check::DEFAULT_CONFIDENCE;
    let mut lines = Vec::new();
    let finding = judge(s, crate::report::summary::SKEW_MARK, alpha);
    let rollout = story.and_then(|story| rollout_cause(s, story));
    match (&finding, rollout) {
        (Some(Finding::RulesUneven(_) | Finding::BusierConnections { .. }), Some(rollout)) => {
            lines.push(rollout);
        }
        (Some(finding), rollout) if finding.fails() => {
            lines.extend(cause(s, finding));
            lines.extend(rollout.or_else(|| story_line(s, story?)));
        }
        _ => {}
    }
    lines.extend(Spread::of(s).map(|spread| spread_line(&spread)));
    // One-request connections are all alike: only busier ones are worth a line.
    let top = story.map_or(&[][..], |story| &story.top);
    for c in top.iter().filter(|c| c.requests > 1) {
        lines.push(format!("busiest: {}", top_line(c, names)));
    }
    lines
}

/// The live view's lines (narrow screens): the cause with the keep-alive story where
/// there is one ("pinning: 30 of shop/checkout-a's 30 requests rode 1 keep-alive
/// connection opened 13:46:36"), then what the skew is made of, briefly ("3.00 = 3.00
/// conns x 1.00 req/conn; 1.0 effective conns; fair median 3.00, p = 1.00").
pub fn screen_lines(s: &ServiceStats, story: Option<&Story>) -> Vec<String> {
    let alpha = 1.0 - crate::report::check::DEFAULT_CONFIDENCE;
    let mut lines = Vec::new();
    let finding = judge(s, crate::report::summary::SKEW_MARK, alpha);
    let rollout = story.and_then(|story| rollout_cause(s, story));
    let told = story.and_then(|story| story_line(s, story));
    match finding {
        Some(finding) if finding.fails() => {
            let headline = match (&finding, rollout, told) {
                (_, Some(rollout), _) => rollout,
                (Finding::Pinning { .. }, None, Some(told)) => format!("pinning: {told}"),
                (finding, _, _) => cause(s, finding).unwrap_or_default(),
            };
            lines.push(headline);
        }
        Some(Finding::WithinChance(p)) => lines.push(format!("within chance ({p})")),
        _ => {}
    }
    if let Some(spread) = Spread::of(s) {
        lines.push(format!(
            "{:.2} = {:.2} conns x {:.2} req/conn; {:.1} effective conns; fair median {:.2}, {}",
            spread.skew,
            spread.connection_factor,
            spread.requests_per_connection_factor,
            spread.effective_connections,
            spread.fair_median,
            spread.chance
        ));
    }
    lines
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
pub fn skew_violation(
    s: &ServiceStats,
    limit: f64,
    finding: &Finding,
    story: Option<&Story>,
) -> Option<String> {
    let detail = s.skew_detail()?;
    let mut cause = cause(s, finding)?;
    if let Some(story) = story {
        match finding {
            // Beyond chance, and a rollout window carried the excess: that is the cause.
            Finding::RulesUneven(_) | Finding::BusierConnections { .. } => {
                if let Some(rollout) = rollout_cause(s, story) {
                    cause = rollout;
                }
            }
            _ => {
                if let Some(line) = rollout_cause(s, story).or_else(|| story_line(s, story)) {
                    cause = format!("{cause}; {line}");
                }
            }
        }
    }
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

/// A pod as sentences name it: `namespace/pod` where known, else its address.
fn pod_name(addr: SocketAddr, pod: Option<&String>) -> String {
    pod.cloned().unwrap_or_else(|| addr.to_string())
}

fn clock(time: DateTime<Utc>) -> String {
    time.format("%H:%M:%S").to_string()
}

fn between(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    let ms = (to - from).num_microseconds().unwrap_or(0) as f64 / 1000.0;
    duration(ms.max(0.0), Digits::Report)
}

/// "1 keep-alive connection", "3 connections": keep-alive when they carried more than one
/// request each on average.
fn connections_noun(connections: u64, requests: u64) -> String {
    let noun = if requests > connections {
        "keep-alive connection"
    } else {
        "connection"
    };
    plural(connections, noun)
}

/// The keep-alive story in one line: "30 requests on 1 keep-alive connection to
/// shop/checkout-a, opened 12:03:04, 2.00s before shop/checkout-b became ready" (a
/// rollout window that explains the skew), or "30 requests on 1 keep-alive connection to
/// shop/checkout-a, opened 12:03:04" (the busiest connections carrying most of the skewed
/// backend's requests). `None` when neither tells it.
pub fn story_line(s: &ServiceStats, story: &Story) -> Option<String> {
    if let Some(r) = story.rollout.as_ref().filter(|r| r.explains) {
        let opened = if r.connections == 1 {
            format!("opened {}", clock(r.first_opened))
        } else {
            format!(
                "opened {} .. {}",
                clock(r.first_opened),
                clock(r.last_opened)
            )
        };
        let missing = pod_name(r.missing, r.missing_pod.as_ref());
        let when = match (r.left, r.joined) {
            (_, Some(joined)) => {
                let last = if r.connections == 1 { "" } else { "the last " };
                format!(
                    "{last}{} before {missing} became ready",
                    between(r.last_opened, joined)
                )
            }
            (Some(left), None) => format!(
                "{} after {missing} left the rules",
                between(left, r.first_opened)
            ),
            (None, None) => format!("while {missing} was out of the rules"),
        };
        return Some(format!(
            "{} on {} to {}, {opened}, {when}",
            plural(r.requests, "request"),
            connections_noun(r.connections, r.requests),
            pod_name(r.backend, r.backend_pod.as_ref()),
        ));
    }
    let backend = s.skew_detail()?.backend;
    let busiest: Vec<&TopConnection> = story
        .top
        .iter()
        .filter(|c| c.backend == backend.backend)
        .collect();
    let carried: u64 = busiest.iter().map(|c| c.requests).sum();
    // Only when a few connections carried most of the backend's requests.
    if busiest.is_empty() || 2 * carried < backend.requests {
        return None;
    }
    let first = busiest.iter().map(|c| c.start).min()?;
    let count = busiest.len() as u64;
    let pod = pod_name(backend.backend, backend.pod.as_ref());
    let connections = connections_noun(count, carried);
    let carried_text = if carried == backend.requests {
        format!("{} on {connections} to {pod}", plural(carried, "request"))
    } else {
        let all = plural(backend.requests, "request");
        format!("{carried} of {pod}'s {all} on {connections}")
    };
    Some(format!(
        "{carried_text}, opened {}{}",
        clock(first),
        if count > 1 { " and later" } else { "" }
    ))
}

/// "rollout window: 30 requests on ..." when connections opened while another endpoint
/// was out of the rules carried the skewed backend's excess.
pub fn rollout_cause(s: &ServiceStats, story: &Story) -> Option<String> {
    story.rollout.as_ref().filter(|r| r.explains)?;
    Some(format!("rollout window: {}", story_line(s, story)?))
}

/// "spread: 30 requests on 1 connection (1.0 effective, the busiest carried 30); skew
/// 3.00 = 3.00 from connection counts x 1.00 from requests per connection; a fair DNAT of
/// these connections: median skew 3.00, p = 1.00": what the skew is made of.
pub fn spread_line(spread: &Spread) -> String {
    format!(
        "spread: {} on {} ({:.1} effective, the busiest carried {}); skew {:.2} = {:.2} from connection counts x {:.2} from requests per connection; a fair DNAT of these connections: median skew {:.2}, {}",
        plural(spread.requests, "request"),
        plural(spread.busy_connections, "connection"),
        spread.effective_connections,
        spread.busiest_connection,
        spread.skew,
        spread.connection_factor,
        spread.requests_per_connection_factor,
        spread.fair_median,
        spread.chance,
    )
}

/// "10.244.1.9:45364 -> 10.244.1.12:8080 30 requests since 13:46:36 (open)": one of the
/// busiest connections (pods where known and `names`).
pub fn top_line(c: &TopConnection, names: bool) -> String {
    let side = |addr: SocketAddr, pod: &Option<String>| match pod {
        Some(pod) if names => pod.clone(),
        _ => addr.to_string(),
    };
    format!(
        "{} -> {} {} since {}{}",
        side(c.client, &c.client_pod),
        side(c.backend, &c.backend_pod),
        plural(c.requests, "request"),
        clock(c.start),
        if c.open { " (open)" } else { "" }
    )
}

#[cfg(test)]
mod tests;
