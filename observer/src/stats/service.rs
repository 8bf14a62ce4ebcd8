//! What the aggregator reports: per-Service and per-backend totals, and skew.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Serialize;

use super::mix::RequestMix;
use super::outcomes::{ConnectHistogram, OutcomeCounts};
use super::{ConnectTimes, Percentiles};
use crate::model::record::{Frontend, FrontendKind, Proto};

/// One backend (pod IP:targetPort) of a Service.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendStats {
    pub backend: SocketAddr,
    /// `namespace/pod` from the latest record that named it; `None` when none did.
    pub pod: Option<String>,
    /// Connections pinned to it, in total.
    pub connections: u64,
    /// Connections still open (`close == Open`).
    pub active: u64,
    pub requests: u64,
    /// requests / the Service's requests (0 when the Service has none).
    pub request_share: f64,
    /// From the latest `ServiceRecord`; `None` if the backend is not listed there.
    pub expected_share: Option<f64>,
    /// Listed in the latest `ServiceRecord` (`false`: connections pinned to a backend the
    /// rules no longer send to). `true` when the Service has no `ServiceRecord`.
    pub in_rules: bool,
    /// Connections whose record says `endpoint_in_rules == false`.
    pub stale_pins: u64,
    /// Over `duration_ms` of its connections (open ones count so far); `None` with none.
    pub lifetime_ms: Option<Percentiles>,
    /// The longest `duration_ms` among its connections (0 with none).
    pub longest_pinned_ms: f64,
    pub bytes_to_backend: u64,
    pub bytes_from_backend: u64,
    /// Its connections by outcome (answered, refused, unanswered, pending).
    pub outcomes: OutcomeCounts,
    /// Over the `connect_ms` of its connections that have one; `None` with none.
    pub connect_ms: Option<ConnectTimes>,
    /// The same connect times in histogram buckets (for metrics).
    #[serde(skip)]
    pub connect_histogram: ConnectHistogram,
    /// Its connections by request count (what `stats::spread` judges).
    #[serde(skip)]
    pub request_mix: RequestMix,
    /// Its connections that ended with an RST after an answer (`close: rst`; not refused).
    pub resets: u64,
}

/// One Service port and how its traffic was spread.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServiceStats {
    /// `record.service`, or for unnamed connections their `original_dst`.
    pub service: String,
    /// Whether the rules named the Service (false: grouped by `original_dst`).
    pub named: bool,
    pub proto: Proto,
    /// From the latest `ServiceRecord` (empty without one).
    pub frontends: Vec<Frontend>,
    /// Whether a `ServiceRecord` defines the Service's endpoints (false: expected shares
    /// are assumed 1/N over the backends seen).
    pub has_rules: bool,
    pub connections: u64,
    pub active: u64,
    pub requests: u64,
    pub stale_pins: u64,
    /// Connections per kind of frontend they came through (the kind their rule matched);
    /// connections without a known frontend are not counted here.
    pub by_frontend: BTreeMap<FrontendKind, u64>,
    /// Its connections by outcome, over every backend.
    pub outcomes: OutcomeCounts,
    /// Over the `connect_ms` of all its connections that have one; `None` with none.
    pub connect_ms: Option<ConnectTimes>,
    /// Connections rejected before any DNAT (`reject` lines: TCP attempts, UDP client
    /// sockets), because the Service port had no endpoints.
    pub rejected: u64,
    /// The datagrams of the rejected UDP sockets.
    pub rejected_datagrams: u64,
    /// Rejected connections per kind of frontend they were dialed at; those without a
    /// known frontend are not counted here.
    pub rejected_by_frontend: BTreeMap<FrontendKind, u64>,
    /// Rejected connections per reason the rules gave (none in logs written before
    /// reasons existed).
    pub rejected_by_reason: BTreeMap<crate::model::record::RejectReason, u64>,
    /// Every endpoint of the latest `ServiceRecord` (even with no connections) and every
    /// backend seen, sorted by address.
    pub backends: Vec<BackendStats>,
    /// Max over backends of share / expected_share (see the module doc); `None` with no
    /// requests.
    pub skew: Option<f64>,
    /// Its connections that ended with an RST after an answer (`close: rst`; not refused).
    pub resets: u64,
    /// How many nodes' rules define it (each node's connections are judged against its
    /// own rules).
    pub nodes: usize,
    /// Connections whose backend was on the node that decided them, and elsewhere
    /// (`same_node`; connections where it is unknown count in neither).
    pub same_node: u64,
    pub cross_node: u64,
    /// ClientIP session affinity, from the rules: judged on stickiness, not skew.
    pub affinity: Option<crate::model::record::Affinity>,
    /// Clients seen, and connections that went to another backend than the same
    /// client's previous one within the affinity timeout.
    pub affinity_clients: u64,
    pub affinity_switches: u64,
}

/// The backend that determines a Service's skew.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SkewDetail<'a> {
    pub backend: &'a BackendStats,
    /// Its share of the requests to backends that have an expected share.
    pub share: f64,
    /// `share / expected_share`.
    pub skew: f64,
}

impl BackendStats {
    /// How a sentence names it: `namespace/pod (ip:port)` when its pod is known and
    /// `names` (not `--addresses`, or the view's `n`), else `ip:port`.
    pub fn label(&self, names: bool) -> String {
        match self.pod.as_deref() {
            Some(pod) if names => format!("{pod} ({})", self.backend),
            _ => self.backend.to_string(),
        }
    }
}

impl ServiceStats {
    /// The backend with the highest share / expected share (the first one on ties);
    /// `None` when no backend with a positive expected share got a request.
    pub fn skew_detail(&self) -> Option<SkewDetail<'_>> {
        let expected = |b: &BackendStats| b.expected_share.filter(|e| *e > 0.0);
        let total: u64 = self
            .backends
            .iter()
            .filter(|b| expected(b).is_some())
            .map(|b| b.requests)
            .sum();
        if total == 0 {
            return None;
        }
        self.backends
            .iter()
            .filter_map(|backend| {
                let share = backend.requests as f64 / total as f64;
                let skew = share / expected(backend)?;
                Some(SkewDetail {
                    backend,
                    share,
                    skew,
                })
            })
            .reduce(|best, next| if next.skew > best.skew { next } else { best })
    }
}
