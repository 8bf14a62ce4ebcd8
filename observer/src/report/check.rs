//! `observer check FILE`: asserts how a recording's traffic was spread, for CI.
//!
//! Exit status: 0 when every condition holds; 1 with one line per violated condition;
//! 2 when the file cannot be read (missing, empty, or a line that is not a log line:
//! the message names the line) or the arguments are wrong. A last line cut short
//! (observer killed, disk full) is not an error: the lines before it are checked, and
//! the cut is a violation, as a missing summary line is.
//!
//! ```text
//! $ observer check --max-skew 1.5 --min-backends 3 observer/tests/data/logs/keepalive.jsonl
//! shop/checkout:http: 1 backend got requests < --min-backends 3 (none to 10.244.1.13:8080, 10.244.1.14:8080)
//! shop/checkout:http: skew 3.00 > --max-skew 1.5 (10.244.1.12:8080 got 100% of requests, expected 33%): pinning: 1 connection carried 30 of 30 requests (a fair DNAT of 1 connection over 3 pods gives skew 3.00 or more half the time); 30 requests on 1 keep-alive connection to 10.244.1.12:8080, opened 13:46:36
//! $ echo $?
//! 1
//! $ observer check --max-skew 1.5 --min-backends 3 observer/tests/data/logs/balanced.jsonl
//! ok: observer/tests/data/logs/balanced.jsonl: 1 Service, 6 connections, every condition holds
//! $ echo $?
//! 0
//! $ observer check --service shop/cart:http observer/tests/data/logs/mixed.jsonl
//! recording: 2 lost connections > --max-lost 0 (DNAT decisions without a record: counts are incomplete)
//! $ observer check observer/tests/data/logs/cut.jsonl
//! recording: the log was cut at line 3 (observer did not exit cleanly): counts are incomplete
//! $ observer check observer/tests/data/logs/corrupt.jsonl
//! observer: observer/tests/data/logs/corrupt.jsonl:3: not a connection log line: EOF while parsing an object at line 1 column 52
//! $ echo $?
//! 2
//! ```
//!
//! `--max-skew R` judges a skew against what a fair DNAT of the same connections would give
//! ([`crate::stats::spread::judge`]): it fails when the skew is above R beyond chance (at
//! `--confidence`, 0.99 by default: a fair DNAT fails at most 1% of the time), saying
//! whether the rules picked unevenly or busier connections went to one pod; and when even
//! a fair DNAT of these connections would exceed R at least half the time, saying whether
//! requests ride too few connections (pinning) or there are too few of them. A skew above R
//! within chance passes.
//!
//! Conditions on Services apply to each Service selected with `--service` (all of them
//! by default); a `--service` the recording does not have is a violation. Skew, stale
//! pins, outcomes, connect times and rejects are defined in [`crate::stats`].
//!
//! ```text
//! $ observer check --max-refused 0 --max-unanswered 0 --max-rejected 0 --max-connect-p99 10 observer/tests/data/logs/outcomes.jsonl
//! shop/checkout:http: 7 refused > --max-refused 0 (10.244.1.13:8080: 7)
//! shop/checkout:http: 6 unanswered > --max-unanswered 0 (10.244.1.14:8080: 6)
//! shop/checkout:http: connect p99 12.5ms > --max-connect-p99 10 (10.244.1.12:8080: 12.5ms)
//! shop/empty:dns: 1 rejected > --max-rejected 0 (no endpoints; 4 datagrams from 1 client socket)
//! shop/empty:http: 5 rejected > --max-rejected 0 (no endpoints)
//! ```
//!
//! A Service without connect times (UDP, nothing answered) passes `--max-connect-p99`;
//! `--max-unanswered` is what catches a backend that never answers.

use std::fmt;

use crate::model::record::{Outcome, Recording, SummaryRecord};
use crate::report::summary::rejected_datagrams;
use crate::report::text::{Digits, latency, plural};
use crate::report::why::skew_violation;
use crate::stats::spread::{judge, judged_on_stickiness};
use crate::stats::story::Story;
use crate::stats::timeline::Timeline;
use crate::stats::{Aggregator, BackendStats, ServiceStats};

/// `--confidence`'s default: a fair DNAT fails `--max-skew` at most 1% of the time.
pub const DEFAULT_CONFIDENCE: f64 = 0.99;

/// What `observer check` asserts; `None` leaves a condition out.
#[derive(Debug, Clone, Default)]
pub struct Conditions {
    /// Only these Services (all when empty); a name the recording lacks is a violation.
    pub service: Vec<String>,
    pub max_skew: Option<f64>,
    /// How sure `--max-skew` must be that a skew is not chance (default
    /// [`DEFAULT_CONFIDENCE`]).
    pub confidence: Option<f64>,
    pub min_backends: Option<u64>,
    pub max_stale: Option<u64>,
    pub min_connections: Option<u64>,
    pub max_lost: u64,
    pub min_requests: Option<u64>,
    pub max_refused: Option<u64>,
    pub max_unanswered: Option<u64>,
    /// Answered connections that ended with an RST.
    pub max_resets: Option<u64>,
    /// At most this many connections to a backend on another node than the deciding one
    /// (`trafficDistribution: PreferSameNode`, Local traffic policies).
    pub max_cross_node: Option<u64>,
    pub max_rejected: Option<u64>,
    /// Milliseconds.
    pub max_connect_p99: Option<f64>,
}

/// One violated condition: `subject: text`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The Service, or `recording` for whole-file conditions.
    pub subject: String,
    pub text: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.text)
    }
}

/// Evaluates the conditions on a recording: the Services checked and the violations.
pub fn check_recording(
    recording: &Recording,
    args: &Conditions,
) -> (Vec<ServiceStats>, Vec<Violation>) {
    let (services, verdicts) = judge_recording(recording, args);
    let found = verdicts
        .into_iter()
        .filter_map(Verdict::into_violation)
        .collect();
    (services, found)
}

/// Evaluates the conditions on a recording: the Services checked and every verdict.
pub fn judge_recording(
    recording: &Recording,
    args: &Conditions,
) -> (Vec<ServiceStats>, Vec<Verdict>) {
    let mut services = Aggregator::from_recording(recording).services();
    let timeline = Timeline::from_recording(recording);
    let found = verdicts_in(
        args,
        recording.cut,
        recording.summary.as_ref(),
        &services,
        Some((recording, &timeline)),
    );
    if !args.service.is_empty() {
        services.retain(|s| args.service.contains(&s.service));
    }
    (services, found)
}

fn label(service: &ServiceStats) -> String {
    if service.named {
        service.service.clone()
    } else {
        format!("{}/{}", service.service, service.proto)
    }
}

/// Every violated condition, whole-file ones first, then per Service in name order.
/// `cut` is the line where a log that did not end cleanly was cut.
pub fn violations(
    args: &Conditions,
    cut: Option<usize>,
    summary: Option<&SummaryRecord>,
    services: &[ServiceStats],
) -> Vec<Violation> {
    verdicts(args, cut, summary, services)
        .into_iter()
        .filter_map(Verdict::into_violation)
        .collect()
}

/// One condition checked on one subject (a Service, or `recording`), held or not.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub subject: String,
    /// The flag's name without dashes and with `_` (`max_skew`), or `complete_log`,
    /// `service` (a `--service` the recording must have) and `services` (any at all).
    pub condition: &'static str,
    /// The flag's value; `null` for conditions without one.
    pub limit: serde_json::Value,
    /// Why the condition does not hold; `None` when it holds.
    pub violation: Option<String>,
}

impl Verdict {
    fn new(
        subject: &str,
        condition: &'static str,
        limit: impl Into<serde_json::Value>,
        violation: Option<String>,
    ) -> Verdict {
        Verdict {
            subject: subject.to_owned(),
            condition,
            limit: limit.into(),
            violation,
        }
    }

    fn into_violation(self) -> Option<Violation> {
        let text = self.violation?;
        Some(Violation {
            subject: self.subject,
            text,
        })
    }
}

/// Every condition checked, in the order of [`violations`]: the whole-file ones, the
/// `--service` names, then per Service in name order.
pub fn verdicts(
    args: &Conditions,
    cut: Option<usize>,
    summary: Option<&SummaryRecord>,
    services: &[ServiceStats],
) -> Vec<Verdict> {
    verdicts_in(args, cut, summary, services, None)
}

/// The recording the Services come from and its endpoints timeline: what tells the
/// connections behind a skew.
type Connections<'a> = Option<(&'a Recording, &'a Timeline)>;

fn verdicts_in(
    args: &Conditions,
    cut: Option<usize>,
    summary: Option<&SummaryRecord>,
    services: &[ServiceStats],
    connections: Connections<'_>,
) -> Vec<Verdict> {
    let mut found = vec![Verdict::new(
        RECORDING,
        "complete_log",
        serde_json::Value::Null,
        cut_log(cut),
    )];
    // A cut log has no summary line: the cut already says so.
    if cut.is_none() || summary.is_some() {
        found.push(Verdict::new(
            RECORDING,
            "max_lost",
            args.max_lost,
            lost_connections(args.max_lost, summary),
        ));
    }
    found.extend(args.service.iter().map(|name| {
        Verdict::new(
            name,
            "service",
            serde_json::Value::Null,
            unknown_service(name, services),
        )
    }));
    if args.per_service() && args.service.is_empty() {
        let none = services
            .is_empty()
            .then(|| "no Services or connections to check".to_owned());
        found.push(Verdict::new(
            RECORDING,
            "services",
            serde_json::Value::Null,
            none,
        ));
    }
    let selected = services
        .iter()
        .filter(|s| args.service.is_empty() || args.service.contains(&s.service));
    for s in selected {
        found.extend(service_verdicts(args, s, connections));
    }
    found
}

/// `check -o json`: one `{"type":"condition",...}` line per [`Verdict`] (`subject`,
/// `condition`, `limit`, `holds`, and `violation` when it does not hold), then one
/// `{"type":"verdict","file":...,"holds":...,"services":N,"connections":N,"violations":N}`.
pub fn render_json(file: &str, verdicts: &[Verdict], services: &[ServiceStats]) -> String {
    let conditions = verdicts.iter().map(|v| JsonLine::Condition {
        subject: &v.subject,
        condition: v.condition,
        limit: &v.limit,
        holds: v.violation.is_none(),
        violation: v.violation.as_deref(),
    });
    let violations = verdicts.iter().filter(|v| v.violation.is_some()).count();
    let verdict = JsonLine::Verdict {
        file,
        holds: violations == 0,
        services: services.len(),
        connections: services.iter().map(|s| s.connections).sum(),
        violations,
    };
    conditions
        .chain([verdict])
        .map(|line| serde_json::to_string(&line).expect("plain data serializes") + "\n")
        .collect()
}

/// One line of `check -o json`.
#[derive(serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum JsonLine<'a> {
    Condition {
        subject: &'a str,
        condition: &'a str,
        limit: &'a serde_json::Value,
        holds: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        violation: Option<&'a str>,
    },
    Verdict {
        file: &'a str,
        holds: bool,
        services: usize,
        connections: u64,
        violations: usize,
    },
}

impl Conditions {
    /// Whether any condition applies per Service.
    fn per_service(&self) -> bool {
        self.max_skew.is_some()
            || self.min_backends.is_some()
            || self.max_stale.is_some()
            || self.min_connections.is_some()
            || self.min_requests.is_some()
            || self.max_refused.is_some()
            || self.max_unanswered.is_some()
            || self.max_resets.is_some()
            || self.max_cross_node.is_some()
            || self.max_rejected.is_some()
            || self.max_connect_p99.is_some()
    }
}

/// The subject of the whole-file conditions.
const RECORDING: &str = "recording";

/// A log cut short (observer killed, disk full): its counts are incomplete.
fn cut_log(cut: Option<usize>) -> Option<String> {
    cut.map(|line| {
        format!(
            "the log was cut at line {line} (observer did not exit cleanly): counts are incomplete"
        )
    })
}

/// `--max-lost`, which also fails when the summary line that counts lost connections is missing.
fn lost_connections(max_lost: u64, summary: Option<&SummaryRecord>) -> Option<String> {
    match summary {
        None => Some(format!(
            "no summary line, so lost connections are unknown (the recording did not end cleanly) and --max-lost {max_lost} cannot hold"
        )),
        Some(s) if s.lost_connections > max_lost => Some(format!(
            "{} > --max-lost {max_lost} (DNAT decisions without a record: counts are incomplete)",
            plural(s.lost_connections, "lost connection"),
        )),
        Some(_) => None,
    }
}

/// Why `name` (a `--service`) is not checked: the recording does not have it.
fn unknown_service(name: &str, services: &[ServiceStats]) -> Option<String> {
    if services.iter().any(|s| s.service == name) {
        return None;
    }
    let known: Vec<&str> = services.iter().map(|s| s.service.as_str()).collect();
    let known = if known.is_empty() {
        "none".to_owned()
    } else {
        known.join(", ")
    };
    Some(format!("not in the recording (it has: {known})"))
}

/// The per-Service conditions asked for, checked on `s` in a fixed order.
fn service_verdicts(
    args: &Conditions,
    s: &ServiceStats,
    connections: Connections<'_>,
) -> Vec<Verdict> {
    let subject = label(s);
    let verdict = |condition, limit: serde_json::Value, violation| {
        Verdict::new(&subject, condition, limit, violation)
    };
    let checked = [
        args.min_connections
            .map(|min| verdict("min_connections", min.into(), min_connections(s, min))),
        args.min_requests
            .map(|min| verdict("min_requests", min.into(), min_requests(s, min))),
        args.min_backends
            .map(|min| verdict("min_backends", min.into(), min_backends(s, min))),
        args.max_skew.map(|max| {
            let alpha = 1.0 - args.confidence.unwrap_or(DEFAULT_CONFIDENCE);
            verdict("max_skew", max.into(), max_skew(s, max, alpha, connections))
        }),
        args.max_stale
            .map(|max| verdict("max_stale", max.into(), max_stale(s, max))),
        args.max_refused
            .map(|max| verdict("max_refused", max.into(), max_refused(s, max))),
        args.max_unanswered
            .map(|max| verdict("max_unanswered", max.into(), max_unanswered(s, max))),
        args.max_resets
            .map(|max| verdict("max_resets", max.into(), max_resets(s, max))),
        args.max_cross_node
            .map(|max| verdict("max_cross_node", max.into(), max_cross_node(s, max))),
        args.max_rejected
            .map(|max| verdict("max_rejected", max.into(), max_rejected(s, max))),
        args.max_connect_p99
            .map(|max| verdict("max_connect_p99", max.into(), max_connect_p99(s, max))),
    ];
    checked.into_iter().flatten().collect()
}

fn min_connections(s: &ServiceStats, min: u64) -> Option<String> {
    (s.connections < min).then(|| {
        format!(
            "{} < --min-connections {min}",
            plural(s.connections, "connection")
        )
    })
}

fn min_requests(s: &ServiceStats, min: u64) -> Option<String> {
    (s.requests < min).then(|| format!("{} < --min-requests {min}", plural(s.requests, "request")))
}

fn min_backends(s: &ServiceStats, min: u64) -> Option<String> {
    let served = s.backends.iter().filter(|b| b.requests > 0).count() as u64;
    if served >= min {
        return None;
    }
    let idle: Vec<String> = s
        .backends
        .iter()
        .filter(|b| b.requests == 0 && b.in_rules)
        .map(|b| b.backend.to_string())
        .collect();
    Some(format!(
        "{} got requests < --min-backends {min}{}",
        plural(served, "backend"),
        listed("none to ", &idle)
    ))
}

/// " (none to a, b)": `items` after `before`, in parentheses; nothing without items.
fn listed(before: &str, items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!(" ({before}{})", items.join(", "))
    }
}

/// Fails when the skew is above `max` beyond chance (at confidence `1 - alpha`), or when
/// a fair DNAT of the same connections would usually exceed `max` ([`judge`]).
fn max_skew(
    s: &ServiceStats,
    max: f64,
    alpha: f64,
    connections: Connections<'_>,
) -> Option<String> {
    if judged_on_stickiness(s) {
        return stickiness(s);
    }
    let finding = judge(s, max, alpha).filter(|f| f.fails())?;
    let story = connections.map(|(recording, timeline)| {
        Story::of(
            s,
            recording.conns.iter(),
            &timeline.service(&s.service, s.proto),
        )
    });
    skew_violation(s, max, &finding, story.as_ref())
}

/// A Service with ClientIP session affinity: each client must stay on one backend
/// while it keeps connecting within the timeout.
fn stickiness(s: &ServiceStats) -> Option<String> {
    let timeout = s.affinity.and_then(|a| a.timeout_s).unwrap_or(10_800);
    (s.affinity_switches > 0).then(|| {
        format!(
            "session affinity broken: {} of {} went to another backend within the {timeout} s timeout",
            plural(s.affinity_switches, "connection"),
            plural(s.affinity_clients, "client")
        )
    })
}

fn max_cross_node(s: &ServiceStats, max: u64) -> Option<String> {
    (s.cross_node > max).then(|| {
        format!(
            "{} to a backend on another node > --max-cross-node {max} ({} on the deciding node)",
            plural(s.cross_node, "connection"),
            s.same_node
        )
    })
}

/// "10.244.1.13:8080: 7, 10.244.1.14:8080: 2": the backends whose `count` is not 0.
fn by_backend(s: &ServiceStats, count: impl Fn(&BackendStats) -> u64) -> String {
    let counts: Vec<String> = s
        .backends
        .iter()
        .filter(|b| count(b) > 0)
        .map(|b| format!("{}: {}", b.backend, count(b)))
        .collect();
    counts.join(", ")
}

fn max_stale(s: &ServiceStats, max: u64) -> Option<String> {
    (s.stale_pins > max).then(|| {
        format!(
            "{} > --max-stale {max} ({})",
            plural(s.stale_pins, "stale pin"),
            by_backend(s, |b| b.stale_pins)
        )
    })
}

/// "7 refused > --max-refused 0 (10.244.1.13:8080: 7)": a count of `outcome` over the
/// Service's backends above `max`, with the backends that have any.
fn max_outcome(s: &ServiceStats, outcome: Outcome, flag: &str, max: u64) -> Option<String> {
    let total = s.outcomes.get(outcome);
    (total > max).then(|| {
        format!(
            "{total} {} > {flag} {max} ({})",
            outcome.as_str(),
            by_backend(s, |b| b.outcomes.get(outcome))
        )
    })
}

fn max_refused(s: &ServiceStats, max: u64) -> Option<String> {
    max_outcome(s, Outcome::Refused, "--max-refused", max)
}

fn max_unanswered(s: &ServiceStats, max: u64) -> Option<String> {
    max_outcome(s, Outcome::Unanswered, "--max-unanswered", max)
}

/// "3 answered connections ended with an RST > --max-resets 0 (10.244.1.13:8080: 3)": a
/// backend that crashed or reset mid-exchange (not one that refused).
fn max_resets(s: &ServiceStats, max: u64) -> Option<String> {
    (s.resets > max).then(|| {
        format!(
            "{} ended with an RST > --max-resets {max} ({})",
            plural(s.resets, "answered connection"),
            by_backend(s, |b| b.resets)
        )
    })
}

fn max_rejected(s: &ServiceStats, max: u64) -> Option<String> {
    if s.rejected <= max {
        return None;
    }
    let datagrams = rejected_datagrams(s).map_or(String::new(), |d| format!("; {d}"));
    Some(format!(
        "{} rejected > --max-rejected {max} (no endpoints{datagrams})",
        s.rejected
    ))
}

/// Over all the Service's connect times; the backends whose own p99 is above `max` are
/// named. A Service without connect times (UDP, nothing answered) has nothing to fail.
fn max_connect_p99(s: &ServiceStats, max: f64) -> Option<String> {
    let p99 = s.connect_ms.filter(|c| c.p99 > max)?.p99;
    let slow: Vec<String> = s
        .backends
        .iter()
        .filter_map(|b| {
            let p99 = b.connect_ms.filter(|c| c.p99 > max)?.p99;
            Some(format!("{}: {}", b.backend, latency(p99, Digits::Report)))
        })
        .collect();
    Some(format!(
        "connect p99 {} > --max-connect-p99 {max}{}",
        latency(p99, Digits::Report),
        listed("", &slow)
    ))
}

#[cfg(test)]
mod tests;
