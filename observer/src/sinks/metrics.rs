//! Prometheus text exposition (format 0.0.4) of the per-Service, per-backend aggregates,
//! the capture counters and conntrack's own figures, for `observer serve`: a snapshot
//! ([`Exposition`]) written by prometheus-client's encoder. Pure: data in, text out.
//!
//! The figures are computed when scraped (percentiles, shares), so each family is a
//! prometheus-client [`Collector`] of constant samples rather than live metric handles.

use std::collections::BTreeMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::model::record::CtStats;
use crate::model::record::{FrontendKind, Outcome, Proto};
use crate::model::update::CaptureStats;
use crate::stats::story::Rollout;
use crate::stats::{BackendStats, CONNECT_BUCKETS_MS, ConnectHistogram, ServiceStats};

#[path = "metrics/spread.rs"]
mod spread;
use spread::SpreadFamilies;

/// The `Content-Type` of [`render`]'s text.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// What one scrape shows.
#[derive(Debug, Default)]
pub struct Exposition {
    pub services: Vec<ServiceStats>,
    /// Counters are cumulative since observer started.
    pub capture: CaptureStats,
    /// conntrack's latest figures per namespace (`netns`: its inode), from
    /// `Update::Conntrack`; cumulative since each namespace was created.
    pub conntrack: BTreeMap<u32, CtStats>,
    /// The rollout window behind each skewed Service's skew, where its connections
    /// opened in one (`Aggregator::rollout`).
    pub rollouts: BTreeMap<(String, Proto), Rollout>,
}

/// Renders every metric family, in a fixed order.
pub fn render(exposition: Exposition) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(exposition));
    let mut text = String::new();
    // Writing to a String cannot fail, and every family encodes by construction.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
    text
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut per_service = ServiceFamilies::new();
        let mut spread = SpreadFamilies::new();
        for service in &self.services {
            per_service.add(service);
            let key = (service.service.clone(), service.proto);
            spread.add(service, self.rollouts.get(&key));
        }
        let families = per_service.into_families();
        let spread = spread.into_families();
        let capture = capture_families(&self.capture);
        let conntrack = conntrack_families(&self.conntrack);
        for family in families
            .iter()
            .chain(&spread)
            .chain(&capture)
            .chain(&conntrack)
        {
            family.encode(&mut encoder)?;
        }
        Ok(())
    }
}

/// One sample's labels, in exposition order.
type Labels = Vec<(&'static str, String)>;

/// One sample's value, as its family's type encodes it.
enum Sample {
    Counter(u64),
    Gauge(u64),
    Ratio(f64),
    Histogram(ConnectHistogram),
}

/// A metric family: its descriptor and its samples.
struct Family {
    /// Counters without their `_total`, which the encoder appends.
    name: &'static str,
    kind: MetricType,
    help: &'static str,
    samples: Vec<(Labels, Sample)>,
}

impl Family {
    fn new(name: &'static str, kind: MetricType, help: &'static str) -> Family {
        Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, labels: Labels, sample: Sample) {
        self.samples.push((labels, sample));
    }

    /// HELP and TYPE lines, then the samples.
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (labels, sample) in &self.samples {
            let one = family.encode_family(labels)?;
            match sample {
                Sample::Counter(value) => ConstCounter::new(*value).encode(one)?,
                Sample::Gauge(value) => ConstGauge::new(*value).encode(one)?,
                Sample::Ratio(value) => ConstGauge::new(*value).encode(one)?,
                Sample::Histogram(histogram) => encode_connect_times(one, histogram)?,
            }
        }
        Ok(())
    }
}

/// The connect-time histogram: per bucket of `CONNECT_BUCKETS_MS` (seconds), the encoder
/// adding them up and writing `+Inf`, `_sum` and `_count`.
fn encode_connect_times(
    mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    histogram: &ConnectHistogram,
) -> std::fmt::Result {
    let mut below = 0;
    let buckets: Vec<(f64, u64)> = CONNECT_BUCKETS_MS
        .iter()
        .zip(histogram.cumulative())
        .map(|(ms, cumulative)| {
            let in_bucket = cumulative - below;
            below = cumulative;
            (ms / 1000.0, in_bucket)
        })
        .collect();
    encoder.encode_histogram::<NoLabelSet>(
        histogram.sum_us as f64 / 1e6,
        histogram.count,
        &buckets,
        None,
    )
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
        use MetricType::{Counter, Gauge, Histogram, Unknown};
        ServiceFamilies {
            connections: Family::new(
                "observer_connections",
                Counter,
                "Connections DNATed to the backend.",
            ),
            active: Family::new(
                "observer_active_connections",
                Gauge,
                "Connections to the backend still open.",
            ),
            requests: Family::new(
                "observer_requests",
                Counter,
                "Requests carried to the backend (client payload after backend payload).",
            ),
            bytes: Family::new(
                "observer_bytes",
                Counter,
                "Transport payload bytes, each byte once.",
            ),
            request_share: Family::new(
                "observer_request_share",
                Gauge,
                "The backend's share of the Service's requests.",
            ),
            expected_share: Family::new(
                "observer_expected_share",
                Gauge,
                "The share of new connections kube-proxy's rules give the backend.",
            ),
            // Quantiles only, untyped: prometheus-client has no summary type, and
            // Prometheus reserves the `quantile` label for summaries and untyped metrics
            // (promtool's lint says so). Prometheus stores a summary's quantiles as these
            // same series.
            lifetime: Family::new(
                "observer_pinning_seconds",
                Unknown,
                "How long connections stayed pinned to the backend (nearest-rank quantiles).",
            ),
            stale: Family::new(
                "observer_stale_pins",
                Counter,
                "Connections pinned to a backend that is no longer an endpoint.",
            ),
            skew: Family::new(
                "observer_service_skew",
                Gauge,
                "Largest backend request share over its expected share (1 is even).",
            ),
            by_frontend: Family::new(
                "observer_frontend_connections",
                Counter,
                "Connections per Service by the frontend they came through (cluster_ip, node_port, external_ip, load_balancer).",
            ),
            outcomes: Family::new(
                "observer_connection_outcomes",
                Counter,
                "Connections to the backend by outcome: answered, refused (an RST or ICMP port unreachable: nothing listens), unanswered (nothing came back).",
            ),
            connect: Family::new(
                "observer_connect_seconds",
                Histogram,
                "TCP connect times to the backend: the client's first SYN to the backend's SYN-ACK, as the node saw them.",
            ),
            rejected: Family::new(
                "observer_rejected",
                Counter,
                "Connections to the Service rejected before any DNAT because its port had no endpoints (TCP attempts, UDP client sockets), by the frontend dialed.",
            ),
        }
    }

    fn add(&mut self, service: &ServiceStats) {
        let service_labels: Labels = vec![
            ("service", service.service.clone()),
            ("proto", service.proto.to_string()),
        ];
        if let Some(value) = service.skew {
            self.skew.add(service_labels.clone(), Sample::Ratio(value));
        }
        for (frontend, count) in &service.by_frontend {
            self.by_frontend.add(
                with(&service_labels, "frontend", frontend_label(*frontend)),
                Sample::Counter(*count),
            );
        }
        self.add_rejected(&service_labels, service);
        for backend in &service.backends {
            let mut labels = with(&service_labels, "backend", backend.backend.to_string());
            // Only where the pod is known: Prometheus reads an empty label as absent.
            if let Some(pod) = &backend.pod {
                labels.push(("backend_pod", pod.clone()));
            }
            self.add_backend(labels, service.proto, backend);
        }
    }

    fn add_backend(&mut self, labels: Labels, proto: Proto, backend: &BackendStats) {
        use Sample::{Counter, Gauge, Ratio};
        self.connections
            .add(labels.clone(), Counter(backend.connections));
        self.active.add(labels.clone(), Gauge(backend.active));
        self.requests.add(labels.clone(), Counter(backend.requests));
        for (direction, bytes) in [
            ("to_backend", backend.bytes_to_backend),
            ("from_backend", backend.bytes_from_backend),
        ] {
            self.bytes
                .add(with(&labels, "direction", direction), Counter(bytes));
        }
        self.request_share
            .add(labels.clone(), Ratio(backend.request_share));
        if let Some(share) = backend.expected_share {
            self.expected_share.add(labels.clone(), Ratio(share));
        }
        if let Some(p) = &backend.lifetime_ms {
            for (quantile, ms) in [("0.5", p.p50), ("0.9", p.p90), ("1", p.max)] {
                self.lifetime
                    .add(with(&labels, "quantile", quantile), Ratio(ms / 1000.0));
            }
        }
        for outcome in [Outcome::Answered, Outcome::Refused, Outcome::Unanswered] {
            self.outcomes.add(
                with(&labels, "outcome", outcome.as_str()),
                Counter(backend.outcomes.get(outcome)),
            );
        }
        if proto == Proto::Tcp {
            self.connect
                .add(labels.clone(), Sample::Histogram(backend.connect_histogram));
        }
        self.stale.add(labels, Counter(backend.stale_pins));
    }

    /// Per frontend the rules list (so that a first reject is an increase from 0) and per
    /// frontend rejects came through; rejects whose frontend is unknown without a `frontend`.
    fn add_rejected(&mut self, service_labels: &Labels, service: &ServiceStats) {
        let mut frontends = service.rejected_by_frontend.clone();
        for frontend in &service.frontends {
            frontends.entry(frontend.kind).or_insert(0);
        }
        for (frontend, count) in &frontends {
            self.rejected.add(
                with(service_labels, "frontend", frontend_label(*frontend)),
                Sample::Counter(*count),
            );
        }
        let unknown = service.rejected - service.rejected_by_frontend.values().sum::<u64>();
        if unknown > 0 {
            self.rejected
                .add(service_labels.clone(), Sample::Counter(unknown));
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

/// `labels` and one more.
fn with(labels: &Labels, name: &'static str, value: impl Into<String>) -> Labels {
    let mut labels = labels.clone();
    labels.push((name, value.into()));
    labels
}

/// A frontend as the log spells it (`cluster_ip`, `node_port`, ...).
fn frontend_label(frontend: FrontendKind) -> String {
    let frontend = serde_json::to_value(frontend).unwrap_or_default();
    frontend.as_str().unwrap_or_default().to_owned()
}

/// The capture counters, one unlabelled sample each.
fn capture_families(capture: &CaptureStats) -> [Family; 10] {
    use MetricType::{Counter, Gauge};
    let families = [
        (
            "observer_dnat_events",
            Counter,
            "DNAT decisions the kernel programs saw: connections tracked plus connections lost.",
            capture.dnat_events,
        ),
        (
            "observer_lost_connections",
            Counter,
            "DNAT decisions that have no record (connection table full): counts are incomplete when non-zero.",
            capture.lost_connections,
        ),
        (
            "observer_lost_events",
            Counter,
            "Kernel events delayed because the ring buffer was full (no record is missing because of them).",
            capture.lost_events,
        ),
        (
            "observer_read_errors",
            Counter,
            "Kernel memory reads that failed.",
            capture.read_errors,
        ),
        (
            "observer_dns_malformed",
            Counter,
            "DNS messages to or from port-53 Services that were copied but could not be read (malformed, truncated).",
            capture.dns_malformed,
        ),
        (
            "observer_dns_lost",
            Counter,
            "DNS messages to or from port-53 Services the kernel could not copy (their ring buffer was full): dns lines are missing when non-zero.",
            capture.dns_lost,
        ),
        (
            "observer_lost_rejects",
            Counter,
            "Reports of rejected connections the kernel could not hand over (their ring buffer was full): observer_rejected_total is incomplete when non-zero.",
            capture.lost_rejects,
        ),
        (
            "observer_hooks_attached",
            Gauge,
            "Kernel programs attached.",
            u64::from(capture.hooks_attached),
        ),
        (
            "observer_live_connections",
            Gauge,
            "Connections the kernel programs are following.",
            capture.live_connections,
        ),
        (
            "observer_blind_spots",
            Gauge,
            "What observer cannot see or follow of the node's Service datapath (a rule it cannot follow, frontends named by address, no kube-proxy rules, IPVS, a kube-proxy-free datapath): one each, said in its warnings.",
            capture.blind_spots,
        ),
    ];
    families.map(|(name, kind, help, value)| {
        let mut family = Family::new(name, kind, help);
        let sample = match kind {
            Counter => Sample::Counter(value),
            _ => Sample::Gauge(value),
        };
        family.add(Vec::new(), sample);
        family
    })
}

/// conntrack's own figures, one sample per namespace (`netns`: its inode) in each family.
fn conntrack_families(readings: &BTreeMap<u32, CtStats>) -> [Family; 5] {
    use MetricType::{Counter, Gauge};
    let mut families = [
        Family::new(
            "observer_conntrack_entries",
            Gauge,
            "Entries in conntrack's table of the network namespace (conntrack -C).",
        ),
        Family::new(
            "observer_conntrack_max_entries",
            Gauge,
            "The most entries conntrack's table may hold (nf_conntrack_max; 0 is no limit).",
        ),
        Family::new(
            "observer_conntrack_insert_failed",
            Counter,
            "New conntrack entries that could not be inserted (insert_failed of conntrack -S, all CPUs).",
        ),
        Family::new(
            "observer_conntrack_drop",
            Counter,
            "Packets dropped because conntrack's table was full and no entry could be evicted (drop of conntrack -S, all CPUs).",
        ),
        Family::new(
            "observer_conntrack_early_drop",
            Counter,
            "Entries not yet assured that conntrack evicted to make room (early_drop of conntrack -S, all CPUs).",
        ),
    ];
    for (netns, stats) in readings {
        let samples = [
            Sample::Gauge(u64::from(stats.entries)),
            Sample::Gauge(u64::from(stats.max_entries)),
            Sample::Counter(stats.insert_failed),
            Sample::Counter(stats.drop),
            Sample::Counter(stats.early_drop),
        ];
        for (family, sample) in families.iter_mut().zip(samples) {
            family.add(vec![("netns", netns.to_string())], sample);
        }
    }
    families
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::record::Recording, stats::Aggregator};

    fn render_services(services: Vec<ServiceStats>, capture: CaptureStats) -> String {
        render(Exposition {
            services,
            capture,
            ..Exposition::default()
        })
    }

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
        let metrics = render_services(services, capture);
        let svc = r#"service="shop/checkout:http",proto="tcp""#;
        for line in [
            format!(r#"observer_requests_total{{{svc},backend="10.244.1.12:8080"}} 30"#),
            format!(r#"observer_requests_total{{{svc},backend="10.244.1.13:8080"}} 0"#),
            format!(r#"observer_connections_total{{{svc},backend="10.244.1.14:8080"}} 0"#),
            // Ratios are floats: prometheus-client writes `1.0`.
            format!(r#"observer_request_share{{{svc},backend="10.244.1.12:8080"}} 1.0"#),
            "observer_dnat_events_total 1".to_owned(),
            "observer_lost_events_total 0".to_owned(),
            "observer_lost_connections_total 0".to_owned(),
            "observer_dns_malformed_total 0".to_owned(),
            "observer_dns_lost_total 0".to_owned(),
            "# TYPE observer_requests_total counter".to_owned(),
            // Why it is skewed: one connection carried everything.
            format!("observer_service_effective_connections{{{svc}}} 1.0"),
            format!("observer_service_busiest_connection_requests{{{svc}}} 30.0"),
            format!("observer_service_skew_requests_per_connection_factor{{{svc}}} 1.0"),
            format!("observer_service_skew_chance{{{svc}}} 1.0"),
            format!(r#"observer_service_skew_cause{{{svc},cause="pinning"}} 1.0"#),
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
        let metrics = render_services(services, CaptureStats::default());
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
        let metrics = render_services(services, capture);
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
        let metrics = render_services(aggregator.services(), CaptureStats::default());
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
        let conntrack = |readings| {
            render(Exposition {
                conntrack: readings,
                ..Exposition::default()
            })
        };
        let only_conntrack = |text: String| -> Vec<String> {
            text.lines()
                .filter(|l| l.contains("observer_conntrack_"))
                .map(str::to_owned)
                .collect()
        };
        let metrics = only_conntrack(conntrack(readings)).join("\n");
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
        assert_eq!(only_conntrack(conntrack(BTreeMap::new())).len(), 10);
    }

    #[test]
    fn label_values_are_escaped() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/pods.jsonl"
        ))
        .unwrap();
        let recording = Recording::parse("pods.jsonl", &text).unwrap();
        let mut services = Aggregator::from_recording(&recording).services();
        services[0].backends[0].pod = Some("a\"b\\c\nd".to_owned());
        let metrics = render_services(services, CaptureStats::default());
        assert!(metrics.contains(r#"backend_pod="a\"b\\c\nd""#), "{metrics}");
    }

    #[test]
    fn every_family_has_help_and_type_once() {
        let metrics = render(Exposition::default());
        let types: Vec<&str> = metrics
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect();
        assert_eq!(types.len(), 13 + 9 + 10 + 5, "{metrics}");
        assert!(types.contains(&"observer_connections_total counter"));
        assert!(types.contains(&"observer_connect_seconds histogram"));
        assert!(types.contains(&"observer_pinning_seconds untyped"));
        assert_eq!(metrics.matches("# HELP ").count(), types.len());
        assert!(!metrics.contains(".."), "{metrics}");
    }

    /// A keep-alive connection to a opened 2 s before b joined the rules: the live
    /// aggregator finds the rollout window the recording's story finds, and the metrics
    /// say it explains the skew.
    #[test]
    fn the_rollout_window_behind_a_skew_is_exported() {
        use crate::model::record::{EndpointsRecord, Recording};
        use crate::stats::story::Story;
        use crate::stats::tests::{addr, conn, rules};
        use chrono::{TimeDelta, TimeZone, Utc};

        const CHECKOUT: &str = "shop/checkout:http";
        let at = |seconds: i64| {
            Utc.with_ymd_and_hms(2026, 8, 6, 12, 3, 0).unwrap() + TimeDelta::seconds(seconds)
        };
        let opened = |backend: &str, start: i64, requests: u64| {
            let mut record = conn(Some(CHECKOUT), backend, requests, 1000.0);
            record.start = at(start);
            record.end = Some(at(start + 20));
            record.client = format!("10.244.2.9:{}", 40_000 + start).parse().unwrap();
            record
        };
        let mut service = rules(
            CHECKOUT,
            &[("10.244.1.12:8080", 0.5), ("10.244.1.13:8080", 0.5)],
        );
        service.time = at(0);
        let recording = Recording {
            services: vec![service],
            endpoints: vec![EndpointsRecord {
                service: CHECKOUT.into(),
                proto: Proto::Tcp,
                netns: 4026532301,
                added: vec![addr("10.244.1.13:8080")],
                removed: vec![],
                time: at(6),
            }],
            conns: vec![
                opened("10.244.1.12:8080", 4, 30),
                opened("10.244.1.12:8080", 8, 1),
                opened("10.244.1.13:8080", 9, 1),
            ],
            ..Recording::default()
        };
        let aggregator = Aggregator::from_recording(&recording);
        let services = aggregator.services();
        let timeline = crate::stats::timeline::Timeline::from_recording(&recording);
        let story = Story::of(
            &services[0],
            recording.conns.iter(),
            &timeline.service(CHECKOUT, Proto::Tcp),
        );
        let live = aggregator.rollout(&services[0]);
        assert!(
            live.as_ref()
                .is_some_and(|r| r.explains && r.requests == 30)
        );
        assert_eq!(live, story.rollout);

        let rollouts = BTreeMap::from([((CHECKOUT.to_owned(), Proto::Tcp), live.unwrap())]);
        let metrics = render(Exposition {
            services,
            rollouts,
            ..Exposition::default()
        });
        let lines: Vec<&str> = metrics
            .lines()
            .filter(|l| l.contains("rollout") && !l.starts_with('#'))
            .collect();
        assert_eq!(
            lines,
            [
                r#"observer_service_rollout_window_requests{service="shop/checkout:http",proto="tcp",backend="10.244.1.12:8080",missing="10.244.1.13:8080"} 30.0"#,
                r#"observer_service_skew_explained_by_rollout{service="shop/checkout:http",proto="tcp"} 1.0"#,
            ]
        );
    }
}
