//! Prometheus text exposition (format 0.0.4) of the per-Service, per-backend aggregates
//! and the capture counters, for `observer serve`. Pure: data in, text out.

use std::fmt::Write as _;

use crate::model::update::CaptureStats;
use crate::stats::{BackendStats, ServiceStats};

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
    samples: Vec<(String, f64)>,
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
        self.samples.push((labels, value));
    }
}

/// Renders every metric. Counters are cumulative since observer started.
pub fn render(services: &[ServiceStats], capture: &CaptureStats) -> String {
    let mut per_service = ServiceFamilies::new();
    for service in services {
        per_service.add(service);
    }
    let mut out = String::new();
    for family in per_service
        .into_families()
        .iter()
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
        for (labels, value) in &self.samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{} {value}", self.name);
            } else {
                let _ = writeln!(out, "{}{{{labels}}} {value}", self.name);
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
    doors: Family,
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
            doors: Family::new(
                "observer_frontend_connections_total",
                "counter",
                "Connections per Service by the door they came through (cluster_ip, node_port, external_ip, load_balancer).",
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
        for (door, count) in &service.doors {
            let door = serde_json::to_value(door).unwrap_or_default();
            let door = door.as_str().unwrap_or_default();
            self.doors.add(
                format!("{service_labels},frontend=\"{door}\""),
                *count as f64,
            );
        }
        for backend in &service.backends {
            let mut labels = format!("{service_labels},backend=\"{}\"", backend.backend);
            // Only where the pod is known: Prometheus reads an empty label as absent.
            if let Some(pod) = &backend.pod {
                labels.push_str(&format!(",backend_pod=\"{}\"", escape(pod)));
            }
            self.add_backend(labels, backend);
        }
    }

    fn add_backend(&mut self, labels: String, backend: &BackendStats) {
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
        self.stale.add(labels, backend.stale_pins as f64);
    }

    /// In exposition order.
    fn into_families(self) -> [Family; 10] {
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
            self.doors,
        ]
    }
}

/// The capture counters, one unlabelled sample each.
fn capture_families(capture: &CaptureStats) -> [Family; 8] {
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
        capture.hooks_attached as f64,
        capture.live_connections as f64,
    ];
    for (family, value) in counters.iter_mut().zip(values) {
        family.add(String::new(), value);
    }
    counters
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
    fn backend_pods_and_doors_are_labels() {
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
