//! Prometheus text exposition (format 0.0.4) of the per-Service, per-backend aggregates
//! and the capture counters, for `observer serve`. Pure: data in, text out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::conntrack::CtStats;
use crate::model::record::{FrontendKind, Outcome, Proto};
use crate::model::update::CaptureStats;
use crate::stats::{BackendStats, CONNECT_BUCKETS_MS, ServiceStats};

#[path = "metrics/spread.rs"]
mod spread;
use spread::SpreadFamilies;

/// Escapes a label value: backslash, double quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    /// Suffix of the sample's name (`_bucket`, `_sum`, `_count` of a histogram; empty
    /// otherwise), labels and value.
    samples: Vec<(&'static str, String, f64)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, labels: String, value: f64) {
        self.samples.push(("", labels, value));
    }

    /// A histogram's sample: `suffix` is `_bucket`, `_sum` or `_count`.
    fn add_part(&mut self, suffix: &'static str, labels: String, value: f64) {
        self.samples.push((suffix, labels, value));
    }
}

/// Renders every metric. Counters are cumulative since observer started.
pub fn render(services: &[ServiceStats], capture: &CaptureStats) -> String {
    let mut per_service = ServiceFamilies::new();
    let mut spread = SpreadFamilies::new();
    for service in services {
        per_service.add(service);
        spread.add(service);
    }
    let mut out = String::new();
    for family in per_service
        .into_families()
        .iter()
        .chain(&spread.into_families())
        .chain(&capture_families(capture))
    {
        family.write(&mut out);
    }
    out
}

impl Family {
    /// HELP and TYPE lines, then one line per sample.
    fn write(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (suffix, labels, value) in &self.samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{}{suffix} {value}", self.name);
            } else {
                let _ = writeln!(out, "{}{suffix}{{{labels}}} {value}", self.name);
            }
        }
    }
}

/// The families with a sample per Service or per backend.
struct ServiceFamilies {
    connections: Family,
    active: Family,
    requests: Family,
    bytes: Family,
    request_share: Family,
    expected_share: Family,
    lifetime: Family,
    stale: Family,
    skew: Family,
    by_frontend: Family,
    outcomes: Family,
    connect: Family,
    rejected: Family,
}

impl ServiceFamilies {
    fn new() -> ServiceFamilies {
        ServiceFamilies {
            connections: Family::new(
                "observer_connections_total",
                "counter",
                "Connections DNATed to the backend.",
            ),
            active: Family::new(
                "observer_active_connections",
                "gauge",
                "Connections to the backend still open.",
            ),
            requests: Family::new(
                "observer_requests_total",
                "counter",
                "Requests carried to the backend (client payload after backend payload).",
            ),
            bytes: Family::new(
                "observer_bytes_total",
                "counter",
                "Transport payload bytes, each byte once.",
            ),
            request_share: Family::new(
                "observer_request_share",
                "gauge",
                "The backend's share of the Service's requests.",
            ),
            expected_share: Family::new(
                "observer_expected_share",
                "gauge",
                "The share of new connections kube-proxy's rules give the backend.",
            ),
            // A summary of quantiles only: Prometheus reserves the `quantile` label for
            // summaries (promtool's lint says so), and no sum or count is kept.
            lifetime: Family::new(
                "observer_pinning_seconds",
                "summary",
                "How long connections stayed pinned to the backend (nearest-rank quantiles).",
            ),
            stale: Family::new(
                "observer_stale_pins_total",
                "counter",
                "Connections pinned to a backend that is no longer an endpoint.",
            ),
            skew: Family::new(
                "observer_service_skew",
                "gauge",
                "Largest backend request share over its expected share (1 is even).",
            ),
            by_frontend: Family::new(
                "observer_frontend_connections_total",
                "counter",
                "Connections per Service by the frontend they came through (cluster_ip, node_port, external_ip, load_balancer).",
            ),
            outcomes: Family::new(
                "observer_connection_outcomes_total",
                "counter",
                "Connections to the backend by outcome: answered, refused (an RST or ICMP port unreachable: nothing listens), unanswered (nothing came back).",
            ),
            connect: Family::new(
                "observer_connect_seconds",
                "histogram",
                "TCP connect times to the backend: the client's first SYN to the backend's SYN-ACK, as the node saw them.",
            ),
            rejected: Family::new(
                "observer_rejected_total",
                "counter",
                "Connections to the Service rejected before any DNAT because its port had no endpoints (TCP attempts, UDP client sockets), by the frontend dialed.",
            ),
        }
    }

    fn add(&mut self, service: &ServiceStats) {
        let service_labels = format!(
            "service=\"{}\",proto=\"{}\"",
            escape(&service.service),
            service.proto
        );
        if let Some(value) = service.skew {
            self.skew.add(service_labels.clone(), value);
        }
        for (frontend, count) in &service.by_frontend {
            self.by_frontend.add(
                format!(
                    "{service_labels},frontend=\"{}\"",
                    frontend_label(*frontend)
                ),
                *count as f64,
            );
        }
        self.add_rejected(&service_labels, service);
        for backend in &service.backends {
            let mut labels = format!("{service_labels},backend=\"{}\"", backend.backend);
            // Only where the pod is known: Prometheus reads an empty label as absent.
            if let Some(pod) = &backend.pod {
                labels.push_str(&format!(",backend_pod=\"{}\"", escape(pod)));
            }
            self.add_backend(labels, service.proto, backend);
        }
    }

    fn add_backend(&mut self, labels: String, proto: Proto, backend: &BackendStats) {
        self.connections
            .add(labels.clone(), backend.connections as f64);
        self.active.add(labels.clone(), backend.active as f64);
        self.requests.add(labels.clone(), backend.requests as f64);
        self.bytes.add(
            format!("{labels},direction=\"to_backend\""),
            backend.bytes_to_backend as f64,
        );
        self.bytes.add(
            format!("{labels},direction=\"from_backend\""),
            backend.bytes_from_backend as f64,
        );
        self.request_share
            .add(labels.clone(), backend.request_share);
        if let Some(share) = backend.expected_share {
            self.expected_share.add(labels.clone(), share);
        }
        if let Some(p) = &backend.lifetime_ms {
            for (quantile, ms) in [("0.5", p.p50), ("0.9", p.p90), ("1", p.max)] {
                self.lifetime
                    .add(format!("{labels},quantile=\"{quantile}\""), ms / 1000.0);
            }
        }
        for outcome in [Outcome::Answered, Outcome::Refused, Outcome::Unanswered] {
            self.outcomes.add(
                format!("{labels},outcome=\"{}\"", outcome.as_str()),
                backend.outcomes.get(outcome) as f64,
            );
        }
        if proto == Proto::Tcp {
            let histogram = &backend.connect_histogram;
            let bounds = CONNECT_BUCKETS_MS
                .iter()
                .map(|ms| (ms / 1000.0).to_string());
            let cumulative = histogram.cumulative().into_iter();
            let inf = std::iter::once(("+Inf".to_owned(), histogram.count));
            for (le, count) in bounds.zip(cumulative).chain(inf) {
                self.connect
                    .add_part("_bucket", format!("{labels},le=\"{le}\""), count as f64);
            }
            self.connect
                .add_part("_sum", labels.clone(), histogram.sum_us as f64 / 1e6);
            self.connect
                .add_part("_count", labels.clone(), histogram.count as f64);
        }
        self.stale.add(labels, backend.stale_pins as f64);
    }

    /// Per frontend the rules list (so that a first reject is an increase from 0) and per
    /// frontend rejects came through; rejects whose frontend is unknown without a `frontend`.
    fn add_rejected(&mut self, service_labels: &str, service: &ServiceStats) {
        let mut frontends = service.rejected_by_frontend.clone();
        for frontend in &service.frontends {
            frontends.entry(frontend.kind).or_insert(0);
        }
        for (frontend, count) in &frontends {
            self.rejected.add(
                format!(
                    "{service_labels},frontend=\"{}\"",
                    frontend_label(*frontend)
                ),
                *count as f64,
            );
        }
        let unknown = service.rejected - service.rejected_by_frontend.values().sum::<u64>();
        if unknown > 0 {
            self.rejected.add(service_labels.to_owned(), unknown as f64);
        }
    }

    /// In exposition order.
    fn into_families(self) -> [Family; 13] {
        [
            self.connections,
            self.active,
            self.requests,
            self.bytes,
            self.request_share,
            self.expected_share,
            self.lifetime,
            self.stale,
            self.skew,
            self.by_frontend,
            self.outcomes,
            self.connect,
            self.rejected,
        ]
    }
}

/// A frontend as the log spells it (`cluster_ip`, `node_port`, ...).
fn frontend_label(frontend: FrontendKind) -> String {
    let frontend = serde_json::to_value(frontend).unwrap_or_default();
    frontend.as_str().unwrap_or_default().to_owned()
}

/// The capture counters, one unlabelled sample each.
fn capture_families(capture: &CaptureStats) -> [Family; 9] {
    let mut counters = [
        Family::new(
            "observer_dnat_events_total",
            "counter",
            "DNAT decisions the kernel programs saw: connections tracked plus connections lost.",
        ),
        Family::new(
            "observer_lost_connections_total",
            "counter",
            "DNAT decisions that have no record (connection table full): counts are incomplete when non-zero.",
        ),
        Family::new(
            "observer_lost_events_total",
            "counter",
            "Kernel events delayed because the ring buffer was full (no record is missing because of them).",
        ),
        Family::new(
            "observer_read_errors_total",
            "counter",
            "Kernel memory reads that failed.",
        ),
        Family::new(
            "observer_dns_malformed_total",
            "counter",
            "DNS messages to or from port-53 Services that were copied but could not be read (malformed, truncated).",
        ),
        Family::new(
            "observer_dns_lost_total",
            "counter",
            "DNS messages to or from port-53 Services the kernel could not copy (their ring buffer was full): dns lines are missing when non-zero.",
        ),
        Family::new(
            "observer_lost_rejects_total",
            "counter",
            "Reports of rejected connections the kernel could not hand over (their ring buffer was full): observer_rejected_total is incomplete when non-zero.",
        ),
        Family::new(
            "observer_hooks_attached",
            "gauge",
            "Kernel programs attached.",
        ),
        Family::new(
            "observer_live_connections",
            "gauge",
            "Connections the kernel programs are following.",
        ),
    ];
    let values = [
        capture.dnat_events as f64,
        capture.lost_connections as f64,
        capture.lost_events as f64,
        capture.read_errors as f64,
        capture.dns_malformed as f64,
        capture.dns_lost as f64,
        capture.lost_rejects as f64,
        capture.hooks_attached as f64,
        capture.live_connections as f64,
    ];
    for (family, value) in counters.iter_mut().zip(values) {
        family.add(String::new(), value);
    }
    counters
}

/// conntrack's own figures, one sample per namespace (`netns`: its inode) in each family:
/// the latest reading of every namespace conntrack is used in (`Update::Conntrack`).
/// Counters are conntrack's own, cumulative since the namespace was created.
pub fn render_conntrack(readings: &BTreeMap<u32, CtStats>) -> String {
    let mut families = [
        Family::new(
            "observer_conntrack_entries",
            "gauge",
            "Entries in conntrack's table of the network namespace (conntrack -C).",
        ),
        Family::new(
            "observer_conntrack_max_entries",
            "gauge",
            "The most entries conntrack's table may hold (nf_conntrack_max; 0 is no limit).",
        ),
        Family::new(
            "observer_conntrack_insert_failed_total",
            "counter",
            "New conntrack entries that could not be inserted (insert_failed of conntrack -S, all CPUs).",
        ),
        Family::new(
            "observer_conntrack_drop_total",
            "counter",
            "Packets dropped because conntrack's table was full and no entry could be evicted (drop of conntrack -S, all CPUs).",
        ),
        Family::new(
            "observer_conntrack_early_drop_total",
            "counter",
            "Entries not yet assured that conntrack evicted to make room (early_drop of conntrack -S, all CPUs).",
        ),
    ];
    for (netns, stats) in readings {
        let values = [
            u64::from(stats.entries),
            u64::from(stats.max_entries),
            stats.insert_failed,
            stats.drop,
            stats.early_drop,
        ];
        for (family, value) in families.iter_mut().zip(values) {
            family.add(format!("netns=\"{netns}\""), value as f64);
        }
    }
    let mut out = String::new();
    for family in &families {
        family.write(&mut out);
    }
    out
}

/// The response to one HTTP request head: `/metrics` gets `metrics`, anything else 404.
pub fn respond(request_head: &str, metrics: impl FnOnce() -> String) -> String {
    let mut words = request_head.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "observer serves /metrics\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_owned(),
        ),
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::record::Recording, stats::Aggregator};

    #[test]
    fn keep_alive_fixture_as_metrics() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/keepalive.jsonl"
        ))
        .unwrap();
        let recording = Recording::parse("keepalive.jsonl", &text).unwrap();
        let services = Aggregator::from_recording(&recording).services();
        let capture = CaptureStats {
            dnat_events: 1,
            hooks_attached: 1,
            ..Default::default()
        };
        let metrics = render(&services, &capture);
        let svc = r#"service="shop/checkout:http",proto="tcp""#;
        for line in [
            format!(r#"observer_requests_total{{{svc},backend="10.244.1.12:8080"}} 30"#),
            format!(r#"observer_requests_total{{{svc},backend="10.244.1.13:8080"}} 0"#),
            format!(r#"observer_connections_total{{{svc},backend="10.244.1.14:8080"}} 0"#),
            format!(r#"observer_request_share{{{svc},backend="10.244.1.12:8080"}} 1"#),
            "observer_dnat_events_total 1".to_owned(),
            "observer_lost_events_total 0".to_owned(),
            "observer_lost_connections_total 0".to_owned(),
            "observer_dns_malformed_total 0".to_owned(),
            "observer_dns_lost_total 0".to_owned(),
            "# TYPE observer_requests_total counter".to_owned(),
            // Why it is skewed: one connection carried everything.
            format!("observer_service_effective_connections{{{svc}}} 1"),
            format!("observer_service_busiest_connection_requests{{{svc}}} 30"),
            format!("observer_service_skew_requests_per_connection_factor{{{svc}}} 1"),
            format!("observer_service_skew_chance{{{svc}}} 1"),
            format!(r#"observer_service_skew_cause{{{svc},cause="pinning"}} 1"#),
            "# TYPE observer_service_skew_cause gauge".to_owned(),
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "missing {line:?} in\n{metrics}"
            );
        }
        // kube-proxy writes probabilities with 10 decimals: 1 / 0.3333333334 is not quite 3.
        let skew = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("observer_service_skew{{{svc}}} ")))
            .unwrap();
        assert!((skew.parse::<f64>().unwrap() - 3.0).abs() < 1e-6, "{skew}");
        // Every sample line is `name{labels} value` or `name value`.
        for line in metrics.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn backend_pods_and_frontends_are_labels() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/pods.jsonl"
        ))
        .unwrap();
        let recording = Recording::parse("pods.jsonl", &text).unwrap();
        let services = Aggregator::from_recording(&recording).services();
        let metrics = render(&services, &CaptureStats::default());
        let svc = r#"service="shop/checkout:http",proto="tcp""#;
        for line in [
            format!(
                r#"observer_requests_total{{{svc},backend="10.244.1.12:8080",backend_pod="shop/checkout-a"}} 3"#
            ),
            format!(
                r#"observer_connections_total{{{svc},backend="10.244.1.13:8080",backend_pod="shop/checkout-b"}} 1"#
            ),
            format!(r#"observer_frontend_connections_total{{{svc},frontend="cluster_ip"}} 2"#),
            format!(r#"observer_frontend_connections_total{{{svc},frontend="node_port"}} 1"#),
            "# TYPE observer_frontend_connections_total counter".to_owned(),
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "missing {line:?} in\n{metrics}"
            );
        }
    }

    #[test]
    fn outcomes_connect_times_and_rejects_per_backend_and_frontend() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/outcomes.jsonl"
        ))
        .unwrap();
        let recording = Recording::parse("outcomes.jsonl", &text).unwrap();
        let services = Aggregator::from_recording(&recording).services();
        let capture = CaptureStats {
            lost_rejects: 2,
            ..CaptureStats::default()
        };
        let metrics = render(&services, &capture);
        let svc = r#"service="shop/checkout:http",proto="tcp""#;
        let a = r#"backend="10.244.1.12:8080""#;
        let b = r#"backend="10.244.1.13:8080""#;
        let c = r#"backend="10.244.1.14:8080""#;
        for line in [
            format!(r#"observer_connection_outcomes_total{{{svc},{a},outcome="answered"}} 11"#),
            format!(r#"observer_connection_outcomes_total{{{svc},{a},outcome="refused"}} 0"#),
            format!(r#"observer_connection_outcomes_total{{{svc},{b},outcome="refused"}} 7"#),
            format!(r#"observer_connection_outcomes_total{{{svc},{c},outcome="unanswered"}} 6"#),
            "# TYPE observer_connect_seconds histogram".to_owned(),
            // Ten connect times of 0.276-0.415 ms, one of 12.5 ms.
            format!(r#"observer_connect_seconds_bucket{{{svc},{a},le="0.001"}} 10"#),
            format!(r#"observer_connect_seconds_bucket{{{svc},{a},le="0.01"}} 10"#),
            format!(r#"observer_connect_seconds_bucket{{{svc},{a},le="0.025"}} 11"#),
            format!(r#"observer_connect_seconds_bucket{{{svc},{a},le="5"}} 11"#),
            format!(r#"observer_connect_seconds_bucket{{{svc},{a},le="+Inf"}} 11"#),
            format!(r#"observer_connect_seconds_sum{{{svc},{a}}} 0.015837"#),
            format!(r#"observer_connect_seconds_count{{{svc},{a}}} 11"#),
            format!(r#"observer_connect_seconds_count{{{svc},{b}}} 0"#),
            r#"observer_rejected_total{service="shop/empty:http",proto="tcp",frontend="cluster_ip"} 5"#.to_owned(),
            r#"observer_rejected_total{service="shop/empty:dns",proto="udp",frontend="cluster_ip"} 1"#.to_owned(),
            // A Service with endpoints starts at 0 at each of its frontends.
            format!(r#"observer_rejected_total{{{svc},frontend="cluster_ip"}} 0"#),
            "observer_lost_rejects_total 2".to_owned(),
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "missing {line:?} in\n{metrics}"
            );
        }
        // UDP has no connect: no histogram for it.
        assert!(!metrics.contains(r#"observer_connect_seconds_count{service="shop/empty:dns""#));
    }

    #[test]
    fn rejects_without_a_known_frontend_have_no_frontend_label() {
        let mut aggregator = Aggregator::default();
        let reject = crate::model::record::RejectRecord {
            frontend: None,
            ..crate::model::record::RejectRecord::example()
        };
        aggregator.add_reject(&reject);
        aggregator.add_reject(&crate::model::record::RejectRecord::example());
        let metrics = render(&aggregator.services(), &CaptureStats::default());
        let svc = r#"service="shop/empty:http",proto="tcp""#;
        for line in [
            format!(r#"observer_rejected_total{{{svc},frontend="cluster_ip"}} 1"#),
            format!(r#"observer_rejected_total{{{svc}}} 1"#),
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "missing {line:?} in\n{metrics}"
            );
        }
    }

    #[test]
    fn conntrack_figures_per_namespace() {
        let readings = BTreeMap::from([
            (
                4026532301,
                CtStats {
                    entries: 52301,
                    max_entries: 65536,
                    insert_failed: 1,
                    drop: 2,
                    early_drop: 12,
                },
            ),
            (
                4026532999,
                CtStats {
                    entries: 3,
                    max_entries: 65536,
                    ..Default::default()
                },
            ),
        ]);
        let metrics = render_conntrack(&readings);
        for line in [
            "# TYPE observer_conntrack_entries gauge",
            r#"observer_conntrack_entries{netns="4026532301"} 52301"#,
            r#"observer_conntrack_entries{netns="4026532999"} 3"#,
            r#"observer_conntrack_max_entries{netns="4026532301"} 65536"#,
            "# TYPE observer_conntrack_insert_failed_total counter",
            r#"observer_conntrack_insert_failed_total{netns="4026532301"} 1"#,
            r#"observer_conntrack_drop_total{netns="4026532301"} 2"#,
            r#"observer_conntrack_early_drop_total{netns="4026532301"} 12"#,
            r#"observer_conntrack_early_drop_total{netns="4026532999"} 0"#,
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "missing {line:?} in\n{metrics}"
            );
        }
        assert_eq!(metrics.lines().count(), 5 * 2 + 5 * 2);
        // No namespace read yet: the families, without samples.
        assert_eq!(render_conntrack(&BTreeMap::new()).lines().count(), 10);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn only_get_metrics_is_served() {
        let ok = respond("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", || {
            "m 1\n".to_owned()
        });
        assert!(
            ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nm 1\n"),
            "{ok}"
        );
        assert!(ok.contains("Content-Length: 4\r\n"));
        assert!(respond("GET / HTTP/1.1", String::new).starts_with("HTTP/1.1 404"));
        assert!(respond("POST /metrics HTTP/1.1", String::new).starts_with("HTTP/1.1 405"));
        assert!(respond("", String::new).starts_with("HTTP/1.1 405"));
    }
}
