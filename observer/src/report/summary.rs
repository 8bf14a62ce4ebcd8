//! `observer summary FILE`: per Service and per backend, how a recording's traffic was
//! spread, as plain text tables (or one JSON line).
//!
//! A skewed Service gets a marked line (`! skew 3.00x: ...`) once its skew reaches
//! [`SKEW_MARK`]; backends the rules no longer list and connections pinned to them are
//! flagged `STALE`.

use std::fmt::Write as _;

use serde::Serialize;

use crate::model::record::{SummaryRecord, format_time};
use crate::report::text::{Digits, bytes, duration, frontend_kind_text, latency, plural};
use crate::report::why::{self, Stories};
use crate::stats::spread::Spread;
use crate::stats::story::Story;
use crate::stats::{BackendStats, ConnectTimes, Percentiles, ServiceStats, SkewDetail};

/// Skew from which a Service gets a marked `! skew` line: one backend got at least 1.5
/// times its expected share of the requests.
pub const SKEW_MARK: f64 = 1.5;

/// Width of the share bar in characters (100%).
const BAR_WIDTH: usize = 20;

/// What `-o json` prints (one line).
#[derive(Debug, Serialize)]
pub struct SummaryJson<'a> {
    pub file: &'a str,
    /// The recording's last line; null when the recording did not end cleanly.
    pub summary: Option<&'a SummaryRecord>,
    pub services: Vec<ServiceJson<'a>>,
}

/// A Service in `-o json`: its figures, what its skew is made of (`spread`, null without
/// requests) and the connections behind it (`story`).
#[derive(Debug, Serialize)]
pub struct ServiceJson<'a> {
    #[serde(flatten)]
    pub stats: &'a ServiceStats,
    pub spread: Option<Spread>,
    pub story: Option<&'a Story>,
}

impl<'a> SummaryJson<'a> {
    pub fn new(
        file: &'a str,
        summary: Option<&'a SummaryRecord>,
        services: &'a [ServiceStats],
        stories: &'a Stories,
    ) -> SummaryJson<'a> {
        let services = services
            .iter()
            .map(|stats| ServiceJson {
                stats,
                spread: Spread::of(stats),
                story: stories.get(&(stats.service.clone(), stats.proto)),
            })
            .collect();
        SummaryJson {
            file,
            summary,
            services,
        }
    }
}

/// `summary --addresses`: the backends as IP addresses only, without the pod column.
pub fn without_pod_names(services: &mut [ServiceStats]) {
    for backend in services.iter_mut().flat_map(|s| s.backends.iter_mut()) {
        backend.pod = None;
    }
}

/// The whole text report.
pub fn render(file: &str, summary: Option<&SummaryRecord>, services: &[ServiceStats]) -> String {
    render_with(file, summary, services, &Stories::new())
}

/// The whole text report, with the connections behind each skew where `stories` has them.
pub fn render_with(
    file: &str,
    summary: Option<&SummaryRecord>,
    services: &[ServiceStats],
    stories: &Stories,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{file}");
    match summary {
        Some(s) => {
            let seconds = (s.ended - s.started).num_milliseconds() as f64 / 1000.0;
            let _ = writeln!(
                out,
                "recorded {} .. {} ({seconds:.1} s): {}, {}, {}, {}, {}",
                format_time(&s.started),
                format_time(&s.ended),
                plural(s.connections, "connection"),
                plural(s.dnat_events, "DNAT event"),
                plural(s.lost_connections, "lost connection"),
                plural(s.lost_events, "lost event"),
                plural(s.read_errors, "read error"),
            );
            if s.dns_queries > 0 || s.dns_malformed > 0 || s.dns_lost > 0 {
                let _ = writeln!(
                    out,
                    "DNS: {} to port-53 Services (`observer summary --dns` shows the lookups){}",
                    plural(s.dns_queries, "query").replace("querys", "queries"),
                    crate::report::dns::skipped(s),
                );
            }
            if s.lost_connections > 0 {
                let _ = writeln!(
                    out,
                    "WARNING: {} DNAT decisions have no record (connection table full): the counts below are incomplete",
                    s.lost_connections
                );
            }
            if s.read_errors > 0 {
                let _ = writeln!(
                    out,
                    "WARNING: {} kernel reads failed: some connections may be missing or lack details",
                    s.read_errors
                );
            }
            if s.lost_rejects > 0 {
                let _ = writeln!(
                    out,
                    "WARNING: {} of rejected connections lost (ring buffer full): the rejected counts below are incomplete",
                    plural(s.lost_rejects, "report")
                );
            }
            for blind_spot in &s.blind_spots {
                let _ = writeln!(out, "WARNING: {blind_spot}");
            }
        }
        None => {
            let _ = writeln!(
                out,
                "WARNING: no summary line: the recording did not end cleanly, lost connections are unknown"
            );
        }
    }
    if services.is_empty() {
        let _ = writeln!(out, "\nno Services and no connections in the recording");
    }
    for service in services {
        out.push('\n');
        let story = stories.get(&(service.service.clone(), service.proto));
        out.push_str(&render_service(service, story));
    }
    out
}

fn frontend_text(service: &ServiceStats) -> String {
    if !service.has_rules {
        return if service.named {
            "no Service line in the recording: expected share assumed 1/N".to_owned()
        } else {
            "not a Service the rules name: expected share assumed 1/N".to_owned()
        };
    }
    service
        .frontends
        .iter()
        .map(|f| {
            let ip = f.ip.map(|ip| match ip {
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            });
            let ip = ip.unwrap_or_default();
            format!("{} {ip}:{}", frontend_kind_text(f.kind), f.port)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

fn bar(share: f64) -> String {
    let filled = ((share * BAR_WIDTH as f64).round() as usize).min(BAR_WIDTH);
    format!("[{}{}]", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled))
}

fn backend_note(b: &BackendStats) -> String {
    match (b.in_rules, b.stale_pins) {
        (false, _) => "STALE: not an endpoint in the rules".to_owned(),
        (true, 0) => String::new(),
        (true, n) => format!("STALE: {} while not in the rules", plural(n, "pin")),
    }
}

/// "shop/checkout-a (10.244.1.12:8080) got 100% of requests, expected 33%": why a
/// Service is skewed (the pod named where known, see `BackendStats::label`).
pub fn skew_cause(detail: &SkewDetail<'_>) -> String {
    // Requests to backends outside the rules do not count (see `stats`); say so when
    // that makes the share differ from the table's.
    let of = if detail.share == detail.backend.request_share {
        "requests"
    } else {
        "the requests to current endpoints"
    };
    format!(
        "{} got {} of {of}, expected {}",
        detail.backend.label(true),
        percent(detail.share),
        detail
            .backend
            .expected_share
            .map_or("-".to_owned(), percent),
    )
}

/// "skew 3.00x: 10.244.1.12:8080 got 100% of requests, expected 33%".
fn skew_sentence(s: &ServiceStats, detail: &SkewDetail<'_>) -> String {
    let guess = if s.has_rules {
        ""
    } else {
        " (1/N: no rules known)"
    };
    format!("skew {:.2}x: {}{guess}", detail.skew, skew_cause(detail))
}

fn render_service(s: &ServiceStats, story: Option<&Story>) -> String {
    let mut out = heading(s);
    if !s.by_frontend.is_empty() {
        let frontends: Vec<String> = s
            .by_frontend
            .iter()
            .map(|(frontend, n)| format!("{} {n}", frontend_kind_text(*frontend)))
            .collect();
        let _ = writeln!(out, "  frontends: {}", frontends.join(", "));
    }
    if let Some(line) = placement_line(s) {
        let _ = writeln!(out, "  {line}");
    }
    if let Some(affinity) = s.affinity {
        let _ = writeln!(
            out,
            "  session affinity (ClientIP, {} s): {}, {} to another backend within the timeout",
            affinity.timeout_s.unwrap_or(10_800),
            plural(s.affinity_clients, "client"),
            plural(s.affinity_switches, "connection")
        );
    }
    if !s.backends.is_empty() {
        out.push_str(&backend_table(s));
    }
    if let Some(detail) = s.skew_detail()
        && detail.skew >= SKEW_MARK
    {
        let _ = writeln!(out, "  ! {}", skew_sentence(s, &detail));
        let names = s.backends.iter().any(|b| b.pod.is_some());
        for line in why::reason_lines(s, story, names) {
            let _ = writeln!(out, "    {line}");
        }
    }
    for b in s.backends.iter().filter(|b| !b.in_rules) {
        let _ = writeln!(
            out,
            "  ! stale: {} is no longer an endpoint; {} pinned to it ({} still open)",
            b.label(true),
            plural(b.connections, "connection"),
            b.active,
        );
    }
    for line in failure_lines(s, true) {
        let _ = writeln!(out, "  ! {line}");
    }
    out
}

/// "nodes: 2, each judged by its own rules; same node 12, other nodes 3": where the
/// Service's connections were decided and whether their backends ran there.
fn placement_line(s: &ServiceStats) -> Option<String> {
    let mut parts = Vec::new();
    if s.nodes > 1 {
        parts.push(format!("nodes: {}, each judged by its own rules", s.nodes));
    }
    if s.same_node + s.cross_node > 0 {
        parts.push(format!(
            "same node {}, other nodes {}",
            s.same_node, s.cross_node
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// "7 refused by 10.244.1.13:8080 (nothing listens)", "5 rejected: no endpoints": what
/// went wrong for the Service's connections, per backend (by pod where known and
/// `names`), then the rejected ones.
pub fn failure_lines(s: &ServiceStats, names: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for b in s.backends.iter().filter(|b| b.outcomes.refused > 0) {
        lines.push(format!(
            "{} refused by {} (nothing listens)",
            b.outcomes.refused,
            b.label(names)
        ));
    }
    for b in s.backends.iter().filter(|b| b.outcomes.unanswered > 0) {
        lines.push(format!(
            "{} unanswered by {} (nothing came back)",
            b.outcomes.unanswered,
            b.label(names)
        ));
    }
    if s.rejected > 0 {
        let datagrams = rejected_datagrams(s).map_or(String::new(), |d| format!(" ({d})"));
        lines.push(format!(
            "{} rejected: {}{datagrams}",
            s.rejected,
            reasons(s)
        ));
    }
    lines
}

/// "no endpoints", "3 no local endpoints, 2 source range": why the rules turned the
/// Service's connections away (logs without reasons: kube-proxy's usual one).
fn reasons(s: &ServiceStats) -> String {
    let known: u64 = s.rejected_by_reason.values().sum();
    match s.rejected_by_reason.len() {
        0 => "no endpoints".to_owned(),
        1 if known == s.rejected => s
            .rejected_by_reason
            .keys()
            .next()
            .map_or("", |r| r.text())
            .to_owned(),
        _ => s
            .rejected_by_reason
            .iter()
            .map(|(reason, n)| format!("{n} {}", reason.text()))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// "4 datagrams from 1 client socket": what a UDP Service's rejected sockets sent.
pub fn rejected_datagrams(s: &ServiceStats) -> Option<String> {
    (s.rejected_datagrams > 0).then(|| {
        format!(
            "{} from {}",
            plural(s.rejected_datagrams, "datagram"),
            plural(s.rejected, "client socket")
        )
    })
}

/// The Service's line: name, frontends, totals (stale pins and failures when there
/// were any) and skew.
fn heading(s: &ServiceStats) -> String {
    let skew = s.skew.map_or("-".to_owned(), |k| format!("{k:.2}x"));
    let mut totals = vec![
        plural(s.connections, "connection"),
        format!("{} active", s.active),
        plural(s.requests, "request"),
    ];
    let extras = [
        (s.stale_pins, plural(s.stale_pins, "stale pin")),
        (
            s.outcomes.refused,
            format!("{} refused", s.outcomes.refused),
        ),
        (
            s.outcomes.unanswered,
            format!("{} unanswered", s.outcomes.unanswered),
        ),
        (s.rejected, format!("{} rejected", s.rejected)),
    ];
    totals.extend(
        extras
            .into_iter()
            .filter(|(n, _)| *n > 0)
            .map(|(_, text)| text),
    );
    format!(
        "{} ({}, {}): {}, skew {skew}\n",
        s.service,
        s.proto,
        frontend_text(s),
        totals.join(", ")
    )
}

/// A column of the backend table: its title, whether it is left-aligned, and its cell.
type Column = (&'static str, bool, fn(&BackendStats) -> String);

/// One row per backend, indented under the Service's line. Columns that only some
/// recordings fill appear when any backend has something in them: `pod` beside the
/// address, the outcomes beside `conns` when a connection was refused or unanswered
/// (`pending` when one was still waiting for its answer at the end), connect times
/// after the lifetimes when any were measured.
fn backend_table(s: &ServiceStats) -> String {
    let any = |has: fn(&BackendStats) -> bool| s.backends.iter().any(has);
    let mut columns: Vec<Column> = vec![("backend", true, |b| b.backend.to_string())];
    if any(|b| b.pod.is_some()) {
        columns.push(("pod", true, |b| {
            b.pod.clone().unwrap_or_else(|| "-".to_owned())
        }));
    }
    columns.push(("conns", false, |b| b.connections.to_string()));
    if any(|b| b.outcomes.failed() > 0) {
        columns.extend::<[Column; 3]>([
            ("answered", false, |b| b.outcomes.answered.to_string()),
            ("refused", false, |b| b.outcomes.refused.to_string()),
            ("unanswered", false, |b| b.outcomes.unanswered.to_string()),
        ]);
        if any(|b| b.outcomes.pending > 0) {
            columns.push(("pending", false, |b| b.outcomes.pending.to_string()));
        }
    }
    columns.extend::<[Column; 8]>([
        ("active", false, |b| b.active.to_string()),
        ("requests", false, |b| b.requests.to_string()),
        ("share", false, |b| percent(b.request_share)),
        ("", true, |b| bar(b.request_share)),
        ("expected", false, |b| {
            b.expected_share.map_or("-".to_owned(), percent)
        }),
        ("p50", false, |b| lifetime(b, |p| p.p50)),
        ("p90", false, |b| lifetime(b, |p| p.p90)),
        ("max", false, |b| lifetime(b, |p| p.max)),
    ]);
    if any(|b| b.connect_ms.is_some()) {
        columns.extend::<[Column; 2]>([
            ("connect p50", false, |b| connect_time(b, |c| c.p50)),
            ("connect p99", false, |b| connect_time(b, |c| c.p99)),
        ]);
    }
    columns.extend::<[Column; 3]>([
        ("to backend", false, |b| bytes(b.bytes_to_backend)),
        ("from backend", false, |b| bytes(b.bytes_from_backend)),
        ("", true, backend_note),
    ]);
    let header: Vec<&str> = columns.iter().map(|(title, _, _)| *title).collect();
    let left: Vec<bool> = columns.iter().map(|(_, left, _)| *left).collect();
    let rows: Vec<Vec<String>> = s
        .backends
        .iter()
        .map(|b| columns.iter().map(|(_, _, cell)| cell(b)).collect())
        .collect();
    table(&header, &rows, &left, "  ")
}

fn lifetime(b: &BackendStats, pick: fn(&Percentiles) -> f64) -> String {
    b.lifetime_ms
        .as_ref()
        .map_or("-".to_owned(), |p| duration(pick(p), Digits::Report))
}

fn connect_time(b: &BackendStats, pick: fn(&ConnectTimes) -> f64) -> String {
    b.connect_ms
        .as_ref()
        .map_or("-".to_owned(), |c| latency(pick(c), Digits::Report))
}

/// Aligned columns separated by two spaces, each line indented by `indent`, trailing
/// blanks trimmed.
fn table(header: &[&str], rows: &[Vec<String>], left: &[bool], indent: &str) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = indent.to_owned();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            if left[i] {
                let _ = write!(text, "{cell:<w$}", w = widths[i]);
            } else {
                let _ = write!(text, "{cell:>w$}", w = widths[i]);
            }
        }
        format!("{}\n", text.trim_end())
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::Recording;
    use crate::stats::Aggregator;

    fn fixture(name: &str) -> (Recording, Vec<ServiceStats>) {
        let path = format!("{}/tests/data/logs/{name}", env!("CARGO_MANIFEST_DIR"));
        let recording = Recording::read(std::path::Path::new(&path)).unwrap();
        let services = Aggregator::from_recording(&recording).services();
        (recording, services)
    }

    #[test]
    fn keep_alive_client_report_is_exact() {
        let (recording, services) = fixture("keepalive.jsonl");
        let expected = "\
keepalive.jsonl
recorded 2026-08-06T13:46:30.000000Z .. 2026-08-06T13:47:30.000000Z (60.0 s): 1 connection, 1 DNAT event, 0 lost connections, 0 lost events, 0 read errors

shop/checkout:http (tcp, ClusterIP 10.96.35.226:80): 1 connection, 0 active, 30 requests, skew 3.00x
  backend           conns  active  requests  share                          expected    p50    p90    max  to backend  from backend
  10.244.1.12:8080      1       0        30   100%  [####################]       33%  4.09s  4.09s  4.09s     2.7 KiB       5.3 KiB
  10.244.1.13:8080      0       0         0     0%  [....................]       33%      -      -      -         0 B           0 B
  10.244.1.14:8080      0       0         0     0%  [....................]       33%      -      -      -         0 B           0 B
  ! skew 3.00x: 10.244.1.12:8080 got 100% of requests, expected 33%
    pinning: 1 connection carried 30 of 30 requests (a fair DNAT of 1 connection over 3 pods gives skew 3.00 or more half the time)
    spread: 30 requests on 1 connection (1.0 effective, the busiest carried 30); skew 3.00 = 3.00 from connection counts x 1.00 from requests per connection; a fair DNAT of these connections: median skew 3.00, p = 1.00
";
        assert_eq!(
            render("keepalive.jsonl", recording.summary.as_ref(), &services),
            expected
        );
    }

    #[test]
    fn sentences_name_the_pod_where_it_is_known_and_addresses_with_addresses() {
        let (recording, mut services) = fixture("keepalive.jsonl");
        services[0].backends[0].pod = Some("shop/checkout-a".into());
        services[0].backends[0].outcomes.refused = 2;
        let text = render("keepalive.jsonl", recording.summary.as_ref(), &services);
        assert!(
            text.contains(
                "  ! skew 3.00x: shop/checkout-a (10.244.1.12:8080) got 100% of requests, expected 33%\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  ! 2 refused by shop/checkout-a (10.244.1.12:8080) (nothing listens)\n"
            ),
            "{text}"
        );
        without_pod_names(&mut services);
        let text = render("keepalive.jsonl", recording.summary.as_ref(), &services);
        assert!(
            text.contains("  ! skew 3.00x: 10.244.1.12:8080 got 100% of requests, expected 33%\n"),
            "{text}"
        );
        assert!(
            text.contains("  ! 2 refused by 10.244.1.12:8080 (nothing listens)\n"),
            "{text}"
        );
    }

    #[test]
    fn lost_events_stale_pins_and_unnamed_services_are_flagged() {
        let (recording, services) = fixture("mixed.jsonl");
        let expected = "\
mixed.jsonl
recorded 2026-08-06T13:46:30.000000Z .. 2026-08-06T13:47:30.000000Z (60.0 s): 5 connections, 7 DNAT events, 2 lost connections, 2 lost events, 0 read errors
WARNING: 2 DNAT decisions have no record (connection table full): the counts below are incomplete

10.96.0.10:53 (udp, not a Service the rules name: expected share assumed 1/N): 1 connection, 0 active, 1 request, skew 1.00x
  backend        conns  active  requests  share                          expected     p50     p90     max  to backend  from backend
  10.244.0.5:53      1       0         1   100%  [####################]      100%  30.00s  30.00s  30.00s        40 B         120 B

shop/cart:http (tcp, ClusterIP 10.96.40.10:80): 4 connections, 2 active, 128 requests, 1 stale pin, skew 1.00x
  backend           conns  active  requests  share                          expected      p50      p90      max  to backend  from backend
  10.244.2.20:8080      1       0         2     2%  [....................]       50%  250.0ms  250.0ms  250.0ms       186 B         360 B
  10.244.2.21:8080      1       0         2     2%  [....................]       50%  750.0ms  750.0ms  750.0ms       186 B         360 B
  10.244.2.99:8080      2       2       124    97%  [###################.]         -   45.00s   59.00s   59.00s    11.3 KiB       1.5 MiB  STALE: not an endpoint in the rules
  ! stale: 10.244.2.99:8080 is no longer an endpoint; 2 connections pinned to it (2 still open)
";
        assert_eq!(
            render("mixed.jsonl", recording.summary.as_ref(), &services),
            expected
        );
    }

    #[test]
    fn refused_unanswered_and_rejected_connections_are_counted_and_flagged() {
        let (recording, services) = fixture("outcomes.jsonl");
        let text = render("outcomes.jsonl", recording.summary.as_ref(), &services);
        let expected = "\
shop/checkout:http (tcp, ClusterIP 10.96.35.226:80): 24 connections, 0 active, 11 requests, 7 refused, 6 unanswered, skew 3.00x
  frontends: ClusterIP 24
  backend           conns  answered  refused  unanswered  active  requests  share                          expected    p50     p90     max  connect p50  connect p99  to backend  from backend
  10.244.1.12:8080     11        11        0           0       0        11   100%  [####################]       33%  9.8ms  11.0ms  11.0ms        330µs       12.5ms       858 B       1.9 KiB
  10.244.1.13:8080      7         0        7           0       0         0     0%  [....................]       33%  0.1ms   0.1ms   0.1ms            -            -         0 B           0 B
  10.244.1.14:8080      6         0        0           6       0         0     0%  [....................]       33%  3.00s   3.00s   3.00s            -            -         0 B           0 B
  ! skew 3.00x: 10.244.1.12:8080 got 100% of requests, expected 33%
    busier connections: 10.244.1.12:8080 got 46% of the connections, expected 33%, but 100% of the requests (p = 0.000017); 13 connections to other pods failed (7 refused, 6 unanswered)
    spread: 11 requests on 11 connections (11.0 effective, the busiest carried 1); skew 3.00 = 1.37 from connection counts x 2.18 from requests per connection; a fair DNAT of these connections: median skew 1.36, p = 0.000017
  ! 7 refused by 10.244.1.13:8080 (nothing listens)
  ! 6 unanswered by 10.244.1.14:8080 (nothing came back)

shop/empty:dns (udp, ClusterIP 10.96.200.1:53): 0 connections, 0 active, 0 requests, 1 rejected, skew -
  ! 1 rejected: no endpoints (4 datagrams from 1 client socket)

shop/empty:http (tcp, ClusterIP 10.96.200.1:80): 0 connections, 0 active, 0 requests, 5 rejected, skew -
  ! 5 rejected: no endpoints
";
        let services_text: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(services_text.join("\n") + "\n", expected);

        let value = json_of("outcomes.jsonl");
        assert_eq!(value["summary"]["rejects"], 6);
        let checkout = &value["services"][0];
        assert_eq!(
            checkout["outcomes"],
            serde_json::json!({"answered": 11, "refused": 7, "unanswered": 6, "pending": 0})
        );
        assert_eq!(
            checkout["backends"][0]["connect_ms"],
            serde_json::json!({"p50": 0.33, "p99": 12.5})
        );
        assert_eq!(checkout["backends"][1]["outcomes"]["refused"], 7);
        assert_eq!(
            checkout["backends"][1]["connect_ms"],
            serde_json::Value::Null
        );
        let empty = &value["services"][2];
        assert_eq!(
            (
                &empty["service"],
                &empty["rejected"],
                &empty["rejected_by_frontend"]
            ),
            (
                &serde_json::json!("shop/empty:http"),
                &serde_json::json!(5),
                &serde_json::json!({"cluster_ip": 5})
            )
        );
        assert_eq!(value["services"][1]["rejected_datagrams"], 4);
    }

    #[test]
    fn connections_still_waiting_for_an_answer_get_a_pending_column() {
        let (_, mut services) = fixture("outcomes.jsonl");
        let checkout = &mut services[0];
        checkout.backends[2].outcomes.pending = 2;
        let table = backend_table(checkout);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with(
                "  backend           conns  answered  refused  unanswered  pending  active"
            ),
            "{table}"
        );
        assert!(
            lines[3]
                .starts_with("  10.244.1.14:8080      6         0        0           6        2"),
            "{table}"
        );
    }

    #[test]
    fn lost_reject_reports_are_a_warning() {
        let summary = SummaryRecord {
            lost_rejects: 3,
            ..SummaryRecord::default()
        };
        let text = render("x.jsonl", Some(&summary), &[]);
        assert!(
            text.contains("\nWARNING: 3 reports of rejected connections lost (ring buffer full): the rejected counts below are incomplete\n"),
            "{text}"
        );
    }

    #[test]
    fn missing_summary_line_and_empty_recordings_are_said() {
        let text = render("x.jsonl", None, &[]);
        assert_eq!(
            text,
            "x.jsonl\nWARNING: no summary line: the recording did not end cleanly, lost connections are unknown\n\nno Services and no connections in the recording\n"
        );
    }

    #[test]
    fn skew_against_current_endpoints_is_said_when_stale_backends_got_requests() {
        let (_, services) = fixture("mixed.jsonl");
        let cart = &services[1];
        let detail = cart.skew_detail().unwrap();
        assert_eq!(
            skew_sentence(cart, &detail),
            "skew 1.00x: 10.244.2.20:8080 got 50% of the requests to current endpoints, expected 50%"
        );
        let unnamed = &services[0];
        assert_eq!(
            skew_sentence(unnamed, &unnamed.skew_detail().unwrap()),
            "skew 1.00x: 10.244.0.5:53 got 100% of requests, expected 100% (1/N: no rules known)"
        );
    }

    #[test]
    fn units_read_at_a_glance() {
        let texts: Vec<String> = [0.25, 999.94, 4087.655, 59_999.0, 725_000.0, 3_725_000.0]
            .into_iter()
            .map(|ms| duration(ms, Digits::Report))
            .collect();
        assert_eq!(
            texts,
            ["0.2ms", "999.9ms", "4.09s", "60.00s", "12m05s", "1h02m"]
        );
        let texts: Vec<String> = [0, 1023, 1024, 2790, 1_536_000, 5 << 30]
            .into_iter()
            .map(bytes)
            .collect();
        assert_eq!(
            texts,
            ["0 B", "1023 B", "1.0 KiB", "2.7 KiB", "1.5 MiB", "5.0 GiB"]
        );
        assert_eq!(bar(0.0), "[....................]");
        assert_eq!(bar(0.5), "[##########..........]");
        assert_eq!(bar(1.0), "[####################]");
    }

    /// What `summary -o json` prints for a fixture.
    fn json_of(name: &str) -> serde_json::Value {
        let (recording, services) = fixture(name);
        let stories = Stories::new();
        let json = SummaryJson::new(name, recording.summary.as_ref(), &services, &stories);
        serde_json::to_value(&json).unwrap()
    }

    #[test]
    fn json_has_summary_and_services() {
        let value = json_of("keepalive.jsonl");
        assert_eq!(value["summary"]["lost_events"], 0);
        assert_eq!(value["summary"]["lost_connections"], 0);
        let service = &value["services"][0];
        assert_eq!(service["service"], "shop/checkout:http");
        assert_eq!(
            service["skew"].as_f64().unwrap().to_string(),
            (1.0 / 0.33333333349_f64).to_string()
        );
        assert_eq!(service["backends"][0]["backend"], "10.244.1.12:8080");
        assert_eq!(service["backends"][0]["requests"], 30);
        assert_eq!(service["backends"][0]["lifetime_ms"]["p90"], 4087.655);
        assert_eq!(
            service["backends"][1]["lifetime_ms"],
            serde_json::Value::Null
        );
        assert_eq!(service["frontends"][0]["kind"], "cluster_ip");
    }

    #[test]
    fn pods_and_frontends_are_shown_beside_addresses() {
        let (recording, services) = fixture("pods.jsonl");
        let text = render("pods.jsonl", recording.summary.as_ref(), &services);
        let service: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(
            service.join("\n"),
            "\
shop/checkout:http (tcp, ClusterIP 10.96.35.226:80, NodePort :30080): 3 connections, 0 active, 4 requests, skew 1.50x
  frontends: ClusterIP 2, NodePort 1
  backend           pod              conns  active  requests  share                          expected    p50    p90    max  to backend  from backend
  10.244.1.12:8080  shop/checkout-a      2       0         3    75%  [###############.....]       50%  1.00s  1.00s  1.00s       195 B         540 B
  10.244.1.13:8080  shop/checkout-b      1       0         1    25%  [#####...............]       50%  1.00s  1.00s  1.00s        65 B         180 B
  ! skew 1.50x: shop/checkout-a (10.244.1.12:8080) got 75% of requests, expected 50%
    spread: 4 requests on 3 connections (2.7 effective, the busiest carried 2); skew 1.50 = 1.33 from connection counts x 1.12 from requests per connection; a fair DNAT of these connections: median skew 1.50, p = 0.75"
        );
    }

    #[test]
    fn addresses_drop_the_pod_column_and_nothing_else() {
        let (recording, mut services) = fixture("pods.jsonl");
        let named = render("pods.jsonl", recording.summary.as_ref(), &services);
        without_pod_names(&mut services);
        let addresses = render("pods.jsonl", recording.summary.as_ref(), &services);
        assert!(named.contains("shop/checkout-a") && !addresses.contains("shop/checkout-a"));
        assert!(
            addresses.contains("\n  backend           conns  active  requests  share"),
            "{addresses}"
        );
        assert!(addresses.contains("\n  10.244.1.12:8080      2       0         3    75%"));
        assert_eq!(
            named
                .lines()
                .filter(|l| !l.starts_with("  "))
                .collect::<Vec<_>>(),
            addresses
                .lines()
                .filter(|l| !l.starts_with("  "))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn fixtures_are_in_the_exact_record_schema() {
        use crate::model::record::LogLine;
        let dir = format!("{}/tests/data/logs", env!("CARGO_MANIFEST_DIR"));
        for name in [
            "keepalive.jsonl",
            "mixed.jsonl",
            "balanced.jsonl",
            "nosummary.jsonl",
            "pods.jsonl",
            "outcomes.jsonl",
        ] {
            let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
            for line in text.lines() {
                let parsed: LogLine = serde_json::from_str(line).unwrap();
                assert_eq!(serde_json::to_string(&parsed).unwrap(), line, "{name}");
            }
        }
    }
}
