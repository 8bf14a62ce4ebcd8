//! `observer summary FILE`: per Service and per backend, how a recording's traffic was
//! spread, as plain text tables (or one JSON line).
//!
//! A skewed Service gets a marked line (`! skew 3.00x: ...`) once its skew reaches
//! [`SKEW_MARK`]; backends the rules no longer list and connections pinned to them are
//! flagged `STALE`.

use std::fmt::Write as _;

use serde::Serialize;

use crate::model::record::{SummaryRecord, format_time};
use crate::sinks::text::{Digits, bytes, door_text, duration, plural};
use crate::stats::{BackendStats, ServiceStats, SkewDetail};

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
    pub services: &'a [ServiceStats],
}

/// The whole text report.
pub fn render(file: &str, summary: Option<&SummaryRecord>, services: &[ServiceStats]) -> String {
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
                    crate::sinks::dns::skipped(s),
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
        out.push_str(&render_service(service));
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
            format!("{} {ip}:{}", door_text(f.kind), f.port)
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

/// "10.244.1.12:8080 got 100% of requests, expected 33%": why a Service is skewed.
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
        detail.backend.backend,
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

fn render_service(s: &ServiceStats) -> String {
    let mut out = heading(s);
    if !s.doors.is_empty() {
        let doors: Vec<String> = s
            .doors
            .iter()
            .map(|(door, n)| format!("{} {n}", door_text(*door)))
            .collect();
        let _ = writeln!(out, "  doors: {}", doors.join(", "));
    }
    out.push_str(&backend_table(s));
    if let Some(detail) = s.skew_detail()
        && detail.skew >= SKEW_MARK
    {
        let _ = writeln!(out, "  ! {}", skew_sentence(s, &detail));
    }
    for b in s.backends.iter().filter(|b| !b.in_rules) {
        let _ = writeln!(
            out,
            "  ! stale: {} is no longer an endpoint; {} pinned to it ({} still open)",
            b.backend,
            plural(b.connections, "connection"),
            b.active,
        );
    }
    out
}

/// The Service's line: name, frontends, totals and skew.
fn heading(s: &ServiceStats) -> String {
    let skew = s.skew.map_or("-".to_owned(), |k| format!("{k:.2}x"));
    format!(
        "{} ({}, {}): {}, {} active, {}{}, skew {skew}\n",
        s.service,
        s.proto,
        frontend_text(s),
        plural(s.connections, "connection"),
        s.active,
        plural(s.requests, "request"),
        if s.stale_pins > 0 {
            format!(", {}", plural(s.stale_pins, "stale pin"))
        } else {
            String::new()
        },
    )
}

/// One row per backend, indented under the Service's line; a `pod` column beside the
/// address when any backend's pod is known.
fn backend_table(s: &ServiceStats) -> String {
    let mut header = vec![
        "backend",
        "conns",
        "active",
        "requests",
        "share",
        "",
        "expected",
        "p50",
        "p90",
        "max",
        "to backend",
        "from backend",
        "",
    ];
    let mut rows: Vec<Vec<String>> = s.backends.iter().map(backend_row).collect();
    // Left-aligned: backend, bar, note; the rest are numbers.
    let mut left = vec![
        true, false, false, false, false, true, false, false, false, false, false, false, true,
    ];
    if s.backends.iter().any(|b| b.pod.is_some()) {
        header.insert(1, "pod");
        left.insert(1, true);
        for (row, b) in rows.iter_mut().zip(&s.backends) {
            row.insert(1, b.pod.clone().unwrap_or_else(|| "-".to_owned()));
        }
    }
    table(&header, &rows, &left, "  ")
}

fn backend_row(b: &BackendStats) -> Vec<String> {
    let lifetime = |pick: fn(&crate::stats::Percentiles) -> f64| {
        b.lifetime_ms
            .as_ref()
            .map_or("-".to_owned(), |p| duration(pick(p), Digits::Report))
    };
    vec![
        b.backend.to_string(),
        b.connections.to_string(),
        b.active.to_string(),
        b.requests.to_string(),
        percent(b.request_share),
        bar(b.request_share),
        b.expected_share.map_or("-".to_owned(), percent),
        lifetime(|p| p.p50),
        lifetime(|p| p.p90),
        lifetime(|p| p.max),
        bytes(b.bytes_to_backend),
        bytes(b.bytes_from_backend),
        backend_note(b),
    ]
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
";
        assert_eq!(
            render("keepalive.jsonl", recording.summary.as_ref(), &services),
            expected
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

    #[test]
    fn json_has_summary_and_services() {
        let (recording, services) = fixture("keepalive.jsonl");
        let json = SummaryJson {
            file: "keepalive.jsonl",
            summary: recording.summary.as_ref(),
            services: &services,
        };
        let value = serde_json::to_value(&json).unwrap();
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
    fn pods_and_doors_are_shown_beside_addresses() {
        let (recording, services) = fixture("pods.jsonl");
        let text = render("pods.jsonl", recording.summary.as_ref(), &services);
        let service: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(
            service.join("\n"),
            "\
shop/checkout:http (tcp, ClusterIP 10.96.35.226:80, NodePort :30080): 3 connections, 0 active, 4 requests, skew 1.50x
  doors: ClusterIP 2, NodePort 1
  backend           pod              conns  active  requests  share                          expected    p50    p90    max  to backend  from backend
  10.244.1.12:8080  shop/checkout-a      2       0         3    75%  [###############.....]       50%  1.00s  1.00s  1.00s       195 B         540 B
  10.244.1.13:8080  shop/checkout-b      1       0         1    25%  [#####...............]       50%  1.00s  1.00s  1.00s        65 B         180 B
  ! skew 1.50x: 10.244.1.12:8080 got 75% of requests, expected 50%"
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
        ] {
            let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
            for line in text.lines() {
                let parsed: LogLine = serde_json::from_str(line).unwrap();
                assert_eq!(serde_json::to_string(&parsed).unwrap(), line, "{name}");
            }
        }
    }
}
