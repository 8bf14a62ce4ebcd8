//! Per-Service and per-backend statistics over connection records, shared by
//! `observer summary`, `observer check` and the live view.
//!
//! Definitions:
//! - A connection belongs to the Service named by `record.service`; unnamed connections
//!   (the rules did not name a Service) are grouped by `original_dst` ("10.96.35.226:80").
//!   Services are keyed by (name, proto).
//! - Expected share: the backend's `expected_share` in the latest `ServiceRecord` of its
//!   Service (`None` when the backend is not listed there). When a Service has no
//!   `ServiceRecord` at all (unnamed, or an old recording), every backend seen gets 1/N,
//!   N = backends seen, and `in_rules` is `true` (nothing says the pin is stale).
//! - Percentiles are nearest-rank: the p-th percentile of N sorted values is the value
//!   at rank ceil(p/100 * N) (1-based), so it is always a value that occurred.
//! - Skew: max over backends of `share / expected_share`, over backends with a positive
//!   expected share, where `share` is the backend's part of the requests to those
//!   backends (equal to `request_share` unless backends outside the rules got requests:
//!   those are reported as stale pins instead of dragging skew below 1). 1.00 is a
//!   perfect spread, 3.00 is "one backend of three got everything". `None` when no such
//!   backend got a request.
//! - Lifetime percentiles are exact while a backend has at most `EXACT_LIFETIMES` (4096)
//!   closed connections, not counting the latest `RECENT_CLOSED` (1024) final records,
//!   which are always exact. Beyond that a backend's older closed connections are
//!   represented by a uniform sample of 4096 lifetimes (reservoir sampling, seeded per
//!   backend so results are reproducible), each standing for closed/4096 connections:
//!   p50/p90 are then estimates, `max` stays exact. Open connections count with their
//!   exact duration so far.
//!
//! [`Aggregator::apply`] keeps running totals, so an update costs a few hash look-ups;
//! percentiles are computed only when [`Aggregator::services`] is called. Memory stays
//! bounded in a long live session: per connection id only open connections and the latest
//! `RECENT_CLOSED` final records are kept (so a repeated final record replaces instead of
//! adding); older closed connections live on as per-backend totals and lifetime samples.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;

use serde::Serialize;

use crate::model::record::{ConnRecord, Frontend, Proto, Recording, ServiceRecord};
use crate::model::update::ConnId;

/// Nearest-rank percentiles of pinning lifetimes, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

/// One backend (pod IP:targetPort) of a Service.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendStats {
    pub backend: SocketAddr,
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
    /// Every endpoint of the latest `ServiceRecord` (even with no connections) and every
    /// backend seen, sorted by address.
    pub backends: Vec<BackendStats>,
    /// Max over backends of share / expected_share (see the module doc); `None` with no
    /// requests.
    pub skew: Option<f64>,
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

/// Nearest-rank percentile of ascending `sorted` values (non-empty), `p` in (0, 100].
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Nearest-rank p50/p90/max of `values`; `None` when empty.
pub fn percentiles(values: &mut [f64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    Some(Percentiles {
        p50: nearest_rank(values, 50.0),
        p90: nearest_rank(values, 90.0),
        max: values[values.len() - 1],
    })
}

type ServiceKey = (String, Proto);

fn service_key(record: &ConnRecord) -> (ServiceKey, bool) {
    match &record.service {
        Some(name) => ((name.clone(), record.proto), true),
        None => ((record.original_dst.to_string(), record.proto), false),
    }
}

#[derive(Default)]
struct Counts {
    connections: u64,
    active: u64,
    requests: u64,
    stale_pins: u64,
    bytes_to_backend: u64,
    bytes_from_backend: u64,
}

impl Counts {
    fn add(&mut self, c: &Contribution) {
        self.connections += 1;
        self.active += u64::from(c.open);
        self.requests += c.requests;
        self.stale_pins += u64::from(c.stale);
        self.bytes_to_backend += c.bytes_to_backend;
        self.bytes_from_backend += c.bytes_from_backend;
    }

    /// Undoes an earlier `add` of the same contribution, so never underflows.
    fn subtract(&mut self, c: &Contribution) {
        self.connections -= 1;
        self.active -= u64::from(c.open);
        self.requests -= c.requests;
        self.stale_pins -= u64::from(c.stale);
        self.bytes_to_backend -= c.bytes_to_backend;
        self.bytes_from_backend -= c.bytes_from_backend;
    }
}

/// Closed connections per backend whose lifetimes are kept exactly; beyond this many a
/// uniform sample of this size stands for them.
const EXACT_LIFETIMES: usize = 4096;

/// Final records kept by id so that a repeated one replaces instead of adding.
const RECENT_CLOSED: usize = 1024;

/// Lifetimes of a backend's closed connections (those older than the recent window).
struct Lifetimes {
    /// Every lifetime while `seen <= EXACT_LIFETIMES`, then a uniform sample of them.
    values: Vec<f64>,
    /// Lifetimes folded in.
    seen: u64,
    /// The longest lifetime folded in (exact even when sampled).
    max: f64,
    /// xorshift64 state; never 0.
    rng: u64,
}

impl Lifetimes {
    /// Seeded from the backend's address: reproducible, and backends sample independently.
    fn new(backend: SocketAddr) -> Lifetimes {
        let ip = match backend.ip() {
            std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(ip) => ip.octets(),
        };
        // FNV-1a: stable across Rust versions, unlike std's hashers.
        let mut seed: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in ip.iter().chain(&backend.port().to_be_bytes()) {
            seed = (seed ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        Lifetimes {
            values: Vec::new(),
            seen: 0,
            max: f64::NEG_INFINITY,
            rng: seed | 1,
        }
    }

    fn sampled(&self) -> bool {
        self.seen > self.values.len() as u64
    }

    /// Reservoir sampling (Algorithm R): the n-th lifetime replaces a random slot with
    /// probability EXACT_LIFETIMES/n, so every lifetime is equally likely to be kept.
    fn add(&mut self, duration: f64) {
        self.seen += 1;
        self.max = self.max.max(duration);
        if self.values.len() < EXACT_LIFETIMES {
            self.values.push(duration);
            return;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        // Uniform in 0..seen without the bias of `%`.
        let slot = ((u128::from(self.rng) * u128::from(self.seen)) >> 64) as usize;
        if let Some(value) = self.values.get_mut(slot) {
            *value = duration;
        }
    }
}

struct BackendAcc {
    counts: Counts,
    lifetimes: Lifetimes,
}

struct ServiceAcc {
    key: ServiceKey,
    named: bool,
    counts: Counts,
    backends: HashMap<SocketAddr, BackendAcc>,
}

/// What one connection record added to the totals, kept while the connection is open or
/// recently closed so that a newer record for the same id can replace it.
struct Contribution {
    /// Index into `Aggregator::accs` (not the key: this is kept per connection).
    service: usize,
    backend: SocketAddr,
    duration: f64,
    open: bool,
    stale: bool,
    requests: u64,
    bytes_to_backend: u64,
    bytes_from_backend: u64,
}

/// Running per-Service, per-backend totals; feed it records, read `services()`.
#[derive(Default)]
pub struct Aggregator {
    /// Latest `ServiceRecord` per Service.
    rules: HashMap<ServiceKey, ServiceRecord>,
    /// Where each Service's totals are in `accs`.
    index: HashMap<ServiceKey, usize>,
    accs: Vec<ServiceAcc>,
    /// Connections whose latest record is `close == Open`.
    open: HashMap<ConnId, Contribution>,
    /// The latest `RECENT_CLOSED` final records, with their arrival number; their
    /// lifetimes join the backend's `Lifetimes` when they leave this window.
    closed: HashMap<ConnId, (u64, Contribution)>,
    /// Arrival order of `closed`; an entry whose number no longer matches was replaced.
    closed_order: VecDeque<(u64, ConnId)>,
    closed_arrivals: u64,
}

impl Aggregator {
    /// Records a Service's definition; a later one for the same Service replaces it
    /// (whatever its netns: the latest rules seen win).
    pub fn add_service(&mut self, service: &ServiceRecord) {
        self.rules
            .insert((service.service.clone(), service.proto), service.clone());
    }

    /// Inserts the record with this id, or replaces the one applied earlier (live
    /// updates of an open connection, then its final record). A final record is
    /// replaceable only while it is among the latest `RECENT_CLOSED`; an open record
    /// arriving after its connection's final one is stale and ignored.
    pub fn apply(&mut self, id: ConnId, record: &ConnRecord) {
        let open = record.close == crate::model::record::Close::Open;
        if open && self.closed.contains_key(&id) {
            return;
        }
        let (key, named) = service_key(record);
        let index = match self.index.get(&key) {
            Some(&index) => index,
            None => {
                self.accs.push(ServiceAcc {
                    key: key.clone(),
                    named,
                    counts: Counts::default(),
                    backends: HashMap::new(),
                });
                self.index.insert(key, self.accs.len() - 1);
                self.accs.len() - 1
            }
        };
        let old = match self.open.remove(&id) {
            Some(old) => Some(old),
            None => self.closed.remove(&id).map(|(_, old)| old),
        };
        if let Some(old) = old {
            let service = &mut self.accs[old.service];
            service.counts.subtract(&old);
            if let Some(backend) = service.backends.get_mut(&old.backend) {
                backend.counts.subtract(&old);
            }
        }
        let contribution = Contribution {
            service: index,
            backend: record.backend,
            duration: record.duration_ms,
            open,
            stale: record.endpoint_in_rules == Some(false),
            requests: record.requests,
            bytes_to_backend: record.bytes_to_backend,
            bytes_from_backend: record.bytes_from_backend,
        };
        let service = &mut self.accs[index];
        service.counts.add(&contribution);
        backend_acc(service, record.backend)
            .counts
            .add(&contribution);
        if open {
            self.open.insert(id, contribution);
        } else {
            self.close(id, contribution);
        }
    }

    /// Puts a final record in the recent window, folding the oldest one out of it.
    fn close(&mut self, id: ConnId, contribution: Contribution) {
        let arrival = self.closed_arrivals;
        self.closed_arrivals += 1;
        self.closed.insert(id, (arrival, contribution));
        self.closed_order.push_back((arrival, id));
        while self.closed_order.len() > RECENT_CLOSED {
            let Some((arrival, id)) = self.closed_order.pop_front() else {
                break;
            };
            // A mismatch means the id was replaced since; its newer entry stays.
            if let Entry::Occupied(entry) = self.closed.entry(id)
                && entry.get().0 == arrival
            {
                let (_, old) = entry.remove();
                let service = &mut self.accs[old.service];
                backend_acc(service, old.backend)
                    .lifetimes
                    .add(old.duration);
            }
        }
    }

    /// Every Service with a `ServiceRecord` or a connection, sorted by name (then proto).
    pub fn services(&self) -> Vec<ServiceStats> {
        let keys: BTreeSet<&ServiceKey> = self
            .rules
            .keys()
            .chain(
                self.accs
                    .iter()
                    .filter(|s| s.counts.connections > 0)
                    .map(|s| &s.key),
            )
            .collect();
        // Exact lifetimes of open and recently closed connections per (Service, backend).
        let mut exact: HashMap<(usize, SocketAddr), Vec<f64>> = HashMap::new();
        for c in self
            .open
            .values()
            .chain(self.closed.values().map(|(_, c)| c))
        {
            exact
                .entry((c.service, c.backend))
                .or_default()
                .push(c.duration);
        }
        keys.into_iter()
            .map(|key| self.service_stats(key, &exact))
            .collect()
    }

    fn service_stats(
        &self,
        key: &ServiceKey,
        exact: &HashMap<(usize, SocketAddr), Vec<f64>>,
    ) -> ServiceStats {
        let rule = self.rules.get(key);
        let index = self.index.get(key).copied();
        let acc = index.map(|index| &self.accs[index]);
        let seen: Vec<(&SocketAddr, &BackendAcc)> = acc
            .map(|acc| {
                acc.backends
                    .iter()
                    .filter(|(_, b)| b.counts.connections > 0)
                    .collect()
            })
            .unwrap_or_default();
        let empty = Counts::default();
        let counts = acc.map_or(&empty, |acc| &acc.counts);

        let mut addrs: BTreeSet<SocketAddr> = seen.iter().map(|(addr, _)| **addr).collect();
        if let Some(rule) = rule {
            addrs.extend(rule.endpoints.iter().map(|e| e.addr));
        }
        let backends: Vec<BackendStats> = addrs
            .into_iter()
            .map(|addr| {
                let backend = seen.iter().find(|(a, _)| **a == addr).map(|(_, b)| *b);
                let (expected_share, in_rules) = match rule {
                    Some(rule) => {
                        let listed = rule.endpoints.iter().find(|e| e.addr == addr);
                        (listed.map(|e| e.expected_share), listed.is_some())
                    }
                    None => (Some(1.0 / seen.len() as f64), true),
                };
                let b = backend.map_or(&empty, |b| &b.counts);
                let exact = index
                    .and_then(|index| exact.get(&(index, addr)))
                    .map_or(&[][..], Vec::as_slice);
                let lifetime_ms = backend.and_then(|b| lifetime_percentiles(&b.lifetimes, exact));
                BackendStats {
                    backend: addr,
                    connections: b.connections,
                    active: b.active,
                    requests: b.requests,
                    request_share: if counts.requests == 0 {
                        0.0
                    } else {
                        b.requests as f64 / counts.requests as f64
                    },
                    expected_share,
                    in_rules,
                    stale_pins: b.stale_pins,
                    longest_pinned_ms: lifetime_ms.map_or(0.0, |p| p.max),
                    lifetime_ms,
                    bytes_to_backend: b.bytes_to_backend,
                    bytes_from_backend: b.bytes_from_backend,
                }
            })
            .collect();
        let mut stats = ServiceStats {
            service: key.0.clone(),
            named: acc.is_none_or(|acc| acc.named),
            proto: key.1,
            frontends: rule.map(|r| r.frontends.clone()).unwrap_or_default(),
            has_rules: rule.is_some(),
            connections: counts.connections,
            active: counts.active,
            requests: counts.requests,
            stale_pins: counts.stale_pins,
            backends,
            skew: None,
        };
        stats.skew = stats.skew_detail().map(|d| d.skew);
        stats
    }

    /// Aggregates a whole recording; connection ids are line order.
    pub fn from_recording(recording: &Recording) -> Aggregator {
        let mut aggregator = Aggregator::default();
        for service in &recording.services {
            aggregator.add_service(service);
        }
        for (index, conn) in recording.conns.iter().enumerate() {
            let id = ConnId {
                conntrack: index as u64,
                start_ns: 0,
            };
            aggregator.apply(id, conn);
        }
        aggregator
    }
}

fn backend_acc(service: &mut ServiceAcc, backend: SocketAddr) -> &mut BackendAcc {
    service
        .backends
        .entry(backend)
        .or_insert_with(|| BackendAcc {
            counts: Counts::default(),
            lifetimes: Lifetimes::new(backend),
        })
}

/// Percentiles over folded `lifetimes` plus `exact` durations (open and recently closed
/// connections); `None` when there are none. Nearest-rank over all values while nothing
/// was sampled; otherwise each sampled value weighs seen/sampled and the p-th percentile
/// is the first value whose cumulative weight reaches p% of the total.
fn lifetime_percentiles(lifetimes: &Lifetimes, exact: &[f64]) -> Option<Percentiles> {
    if !lifetimes.sampled() {
        let mut values: Vec<f64> = lifetimes.values.iter().chain(exact).copied().collect();
        return percentiles(&mut values);
    }
    let weight = lifetimes.seen as f64 / lifetimes.values.len() as f64;
    let mut weighted: Vec<(f64, f64)> = lifetimes
        .values
        .iter()
        .map(|v| (*v, weight))
        .chain(exact.iter().map(|v| (*v, 1.0)))
        .collect();
    weighted.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = weighted.iter().map(|(_, w)| w).sum();
    let rank = |p: f64| {
        let target = p / 100.0 * total;
        let mut cumulative = 0.0;
        weighted
            .iter()
            .find(|(_, w)| {
                cumulative += w;
                cumulative >= target
            })
            .or_else(|| weighted.last())
            .map_or(lifetimes.max, |(v, _)| *v)
    };
    Some(Percentiles {
        p50: rank(50.0),
        p90: rank(90.0),
        max: exact.iter().fold(lifetimes.max, |max, v| max.max(*v)),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::record::{Close, EndpointShare, FrontendKind};
    use chrono::{TimeZone, Utc};

    pub(crate) fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    pub(crate) fn conn(
        service: Option<&str>,
        backend: &str,
        requests: u64,
        duration_ms: f64,
    ) -> ConnRecord {
        ConnRecord {
            proto: Proto::Tcp,
            client: addr("10.244.1.9:45364"),
            original_dst: addr("10.96.35.226:80"),
            backend: addr(backend),
            service: service.map(str::to_owned),
            endpoint_in_rules: service.map(|_| true),
            netns: 4026532301,
            start: Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 36).unwrap(),
            end: Some(Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 40).unwrap()),
            duration_ms,
            requests,
            bytes_to_backend: requests * 93,
            bytes_from_backend: requests * 180,
            close: Close::Fin,
            start_seen: true,
        }
    }

    pub(crate) fn rules(service: &str, endpoints: &[(&str, f64)]) -> ServiceRecord {
        ServiceRecord {
            service: service.to_owned(),
            proto: Proto::Tcp,
            netns: 4026532301,
            frontends: vec![Frontend {
                kind: FrontendKind::ClusterIp,
                ip: Some("10.96.35.226".parse().unwrap()),
                port: 80,
            }],
            endpoints: endpoints
                .iter()
                .map(|(a, share)| EndpointShare {
                    addr: addr(a),
                    expected_share: *share,
                })
                .collect(),
            time: Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 30).unwrap(),
        }
    }

    fn id(n: u64) -> ConnId {
        ConnId {
            conntrack: n,
            start_ns: 7,
        }
    }

    const CHECKOUT: &str = "shop/checkout:http";
    const THIRD: f64 = 1.0 / 3.0;

    fn three_endpoints() -> ServiceRecord {
        rules(
            CHECKOUT,
            &[
                ("10.244.1.12:8080", THIRD),
                ("10.244.1.13:8080", THIRD),
                ("10.244.1.14:8080", THIRD),
            ],
        )
    }

    #[test]
    fn keep_alive_client_shows_30_0_0_with_skew_3() {
        let mut agg = Aggregator::default();
        agg.add_service(&three_endpoints());
        agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 30, 4087.5));
        let services = agg.services();
        assert_eq!(services.len(), 1);
        let s = &services[0];
        assert_eq!(
            (s.service.as_str(), s.named, s.has_rules),
            (CHECKOUT, true, true)
        );
        assert_eq!(
            (s.connections, s.active, s.requests, s.stale_pins),
            (1, 0, 30, 0)
        );
        let requests: Vec<u64> = s.backends.iter().map(|b| b.requests).collect();
        assert_eq!(requests, [30, 0, 0]);
        let shares: Vec<f64> = s.backends.iter().map(|b| b.request_share).collect();
        assert_eq!(shares, [1.0, 0.0, 0.0]);
        assert_eq!(s.backends[1].connections, 0);
        assert_eq!(s.backends[1].lifetime_ms, None);
        assert_eq!(s.backends[1].expected_share, Some(THIRD));
        assert_eq!(s.skew, Some(1.0 / THIRD));
        let detail = s.skew_detail().unwrap();
        assert_eq!(
            (detail.backend.backend, detail.share),
            (addr("10.244.1.12:8080"), 1.0)
        );
        assert_eq!(s.frontends.len(), 1);
        let b = &s.backends[0];
        assert_eq!((b.bytes_to_backend, b.bytes_from_backend), (2790, 5400));
        assert_eq!(b.longest_pinned_ms, 4087.5);
        assert_eq!(
            b.lifetime_ms,
            Some(Percentiles {
                p50: 4087.5,
                p90: 4087.5,
                max: 4087.5
            })
        );
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut values: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(
            percentiles(&mut values),
            Some(Percentiles {
                p50: 5.0,
                p90: 9.0,
                max: 10.0
            })
        );
        let mut values = vec![3.0, 1.0, 2.0];
        assert_eq!(
            percentiles(&mut values),
            Some(Percentiles {
                p50: 2.0,
                p90: 3.0,
                max: 3.0
            })
        );
        let mut values = vec![1.0, 2.0, 3.0, 4.0];
        // rank ceil(0.5 * 4) = 2, ceil(0.9 * 4) = 4
        assert_eq!(
            percentiles(&mut values),
            Some(Percentiles {
                p50: 2.0,
                p90: 4.0,
                max: 4.0
            })
        );
        assert_eq!(percentiles(&mut []), None);
    }

    #[test]
    fn percentiles_per_backend_through_the_aggregator() {
        let mut agg = Aggregator::default();
        for n in 1..=10 {
            agg.apply(
                id(n),
                &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, n as f64 * 100.0),
            );
        }
        agg.apply(id(11), &conn(Some(CHECKOUT), "10.244.1.13:8080", 1, 5.0));
        let s = &agg.services()[0];
        assert_eq!(
            s.backends[0].lifetime_ms,
            Some(Percentiles {
                p50: 500.0,
                p90: 900.0,
                max: 1000.0
            })
        );
        assert_eq!(s.backends[0].longest_pinned_ms, 1000.0);
        assert_eq!(
            s.backends[1].lifetime_ms,
            Some(Percentiles {
                p50: 5.0,
                p90: 5.0,
                max: 5.0
            })
        );
    }

    #[test]
    fn replacing_by_id_updates_totals_instead_of_adding() {
        let mut agg = Aggregator::default();
        let mut open = conn(Some(CHECKOUT), "10.244.1.12:8080", 3, 100.0);
        open.close = Close::Open;
        open.end = None;
        agg.apply(id(1), &open);
        agg.apply(id(2), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 50.0));
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.active, s.requests), (2, 1, 4));
        assert_eq!(s.backends[0].lifetime_ms.unwrap().max, 100.0);

        // The same connection progresses, then closes.
        open.requests = 10;
        open.bytes_to_backend = 930;
        open.duration_ms = 2500.0;
        agg.apply(id(1), &open);
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.active, s.requests), (2, 1, 11));
        assert_eq!(s.backends[0].bytes_to_backend, 930 + 93);
        assert_eq!(
            s.backends[0].lifetime_ms,
            Some(Percentiles {
                p50: 50.0,
                p90: 2500.0,
                max: 2500.0
            })
        );
        open.close = Close::Fin;
        agg.apply(id(1), &open);
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.active, s.requests), (2, 0, 11));
        assert_eq!(s.backends[0].active, 0);
    }

    #[test]
    fn replacing_with_another_backend_moves_the_connection() {
        let mut agg = Aggregator::default();
        agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 10.0));
        agg.apply(id(2), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 20.0));
        agg.apply(id(3), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 30.0));
        // id 1 moves: id 3's duration is swapped into its slot and must stay tracked.
        agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.13:8080", 2, 15.0));
        agg.apply(id(3), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 35.0));
        let s = &agg.services()[0];
        assert_eq!(s.backends.len(), 2);
        assert_eq!((s.backends[0].connections, s.backends[0].requests), (2, 2));
        assert_eq!(
            s.backends[0].lifetime_ms,
            Some(Percentiles {
                p50: 20.0,
                p90: 35.0,
                max: 35.0
            })
        );
        assert_eq!((s.backends[1].connections, s.backends[1].requests), (1, 2));
        assert_eq!(s.backends[1].lifetime_ms.unwrap().max, 15.0);
        // Moving the last connection away drops a backend that is not in any rules.
        agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 2, 15.0));
        let s = &agg.services()[0];
        assert_eq!(s.backends.len(), 1);
        assert_eq!((s.connections, s.requests), (3, 4));
    }

    #[test]
    fn unnamed_services_are_grouped_by_original_dst_with_1_over_n_expected() {
        let mut agg = Aggregator::default();
        agg.apply(id(1), &conn(None, "10.244.1.12:8080", 3, 1.0));
        agg.apply(id(2), &conn(None, "10.244.1.13:8080", 1, 1.0));
        let mut other = conn(None, "10.244.2.5:53", 1, 1.0);
        other.original_dst = addr("10.96.0.10:53");
        other.proto = Proto::Udp;
        agg.apply(id(3), &other);
        let services = agg.services();
        let names: Vec<(&str, Proto, bool)> = services
            .iter()
            .map(|s| (s.service.as_str(), s.proto, s.named))
            .collect();
        assert_eq!(
            names,
            [
                ("10.96.0.10:53", Proto::Udp, false),
                ("10.96.35.226:80", Proto::Tcp, false)
            ]
        );
        let s = &services[1];
        assert!(!s.has_rules);
        assert_eq!(s.backends[0].expected_share, Some(0.5));
        assert!(s.backends.iter().all(|b| b.in_rules));
        assert_eq!(s.backends[0].request_share, 0.75);
        assert_eq!(s.skew, Some(1.5));
        assert!(s.frontends.is_empty());
    }

    #[test]
    fn stale_pins_and_backends_missing_from_the_latest_rules() {
        let mut agg = Aggregator::default();
        agg.add_service(&rules(
            CHECKOUT,
            &[("10.244.1.12:8080", 0.5), ("10.244.1.99:8080", 0.5)],
        ));
        // The endpoint went away: a later ServiceRecord wins.
        agg.add_service(&rules(CHECKOUT, &[("10.244.1.12:8080", 1.0)]));
        let mut stale = conn(Some(CHECKOUT), "10.244.1.99:8080", 4, 9000.0);
        stale.endpoint_in_rules = Some(false);
        stale.close = Close::Open;
        agg.apply(id(1), &stale);
        agg.apply(id(2), &stale);
        agg.apply(id(3), &conn(Some(CHECKOUT), "10.244.1.12:8080", 8, 1.0));
        let s = &agg.services()[0];
        assert_eq!((s.stale_pins, s.active, s.requests), (2, 2, 16));
        let b: Vec<(SocketAddr, bool, Option<f64>, u64)> = s
            .backends
            .iter()
            .map(|b| (b.backend, b.in_rules, b.expected_share, b.stale_pins))
            .collect();
        assert_eq!(
            b,
            [
                (addr("10.244.1.12:8080"), true, Some(1.0), 0),
                (addr("10.244.1.99:8080"), false, None, 2),
            ]
        );
        // Requests to the stale backend do not count towards skew: the current
        // endpoint got all the others, as its share of 1.0 says.
        assert_eq!(s.skew, Some(1.0));
    }

    #[test]
    fn services_without_connections_list_every_endpoint() {
        let mut agg = Aggregator::default();
        agg.add_service(&three_endpoints());
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.requests, s.skew), (0, 0, None));
        let listed: Vec<(SocketAddr, u64, f64)> = s
            .backends
            .iter()
            .map(|b| (b.backend, b.connections, b.request_share))
            .collect();
        assert_eq!(
            listed,
            [
                (addr("10.244.1.12:8080"), 0, 0.0),
                (addr("10.244.1.13:8080"), 0, 0.0),
                (addr("10.244.1.14:8080"), 0, 0.0),
            ]
        );
    }

    #[test]
    fn connections_without_requests_have_no_skew() {
        let mut agg = Aggregator::default();
        agg.add_service(&three_endpoints());
        agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 0, 1.0));
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.requests, s.skew), (1, 0, None));
        assert_eq!(s.backends[0].request_share, 0.0);
    }

    #[test]
    fn from_recording_uses_line_order_ids() {
        let recording = Recording {
            conns: vec![
                conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 1.0),
                conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 1.0),
            ],
            services: vec![three_endpoints()],
            summary: None,
            cut: None,
        };
        let s = &Aggregator::from_recording(&recording).services()[0];
        // Identical records on different lines are different connections.
        assert_eq!((s.connections, s.requests, s.backends.len()), (2, 2, 3));
        assert_eq!(s.skew, Some(3.0));
    }

    fn open(backend: &str, requests: u64, duration_ms: f64) -> ConnRecord {
        let mut record = conn(Some(CHECKOUT), backend, requests, duration_ms);
        record.close = Close::Open;
        record.end = None;
        record
    }

    fn lifetimes<'a>(agg: &'a Aggregator, backend: &str) -> &'a Lifetimes {
        &agg.accs[0].backends[&addr(backend)].lifetimes
    }

    #[test]
    fn memory_stays_bounded_over_many_connections() {
        const PAIRS: u64 = 200_000;
        let mut agg = Aggregator::default();
        for n in 1..=PAIRS {
            let duration = n as f64;
            agg.apply(id(n), &open("10.244.1.12:8080", 0, duration / 2.0));
            agg.apply(
                id(n),
                &conn(Some(CHECKOUT), "10.244.1.12:8080", 2, duration),
            );
        }
        assert_eq!(agg.open.len(), 0);
        assert_eq!(
            (agg.closed.len(), agg.closed_order.len()),
            (RECENT_CLOSED, RECENT_CLOSED)
        );
        let folded = lifetimes(&agg, "10.244.1.12:8080");
        assert_eq!(folded.values.len(), EXACT_LIFETIMES);
        assert_eq!(folded.seen, PAIRS - RECENT_CLOSED as u64);

        // An open connection still counts, with its duration so far.
        agg.apply(id(0), &open("10.244.1.12:8080", 1, 1e9));
        let s = &agg.services()[0];
        assert_eq!(
            (s.connections, s.active, s.requests),
            (PAIRS + 1, 1, 2 * PAIRS + 1)
        );
        let b = &s.backends[0];
        assert_eq!(
            (b.bytes_to_backend, b.longest_pinned_ms),
            ((2 * PAIRS + 1) * 93, 1e9)
        );
        // Durations are uniform over 1..=200000: the sample's estimates land near the
        // true values (100000 and 180000); the seed is fixed, so this is reproducible.
        let p = b.lifetime_ms.unwrap();
        assert!((95_000.0..=105_000.0).contains(&p.p50), "{p:?}");
        assert!((175_000.0..=185_000.0).contains(&p.p90), "{p:?}");
        assert_eq!(p.max, 1e9);
    }

    #[test]
    fn open_connections_stay_replaceable_by_id_while_others_come_and_go() {
        let mut agg = Aggregator::default();
        agg.apply(id(0), &open("10.244.1.12:8080", 1, 100.0));
        for n in 1..=5000 {
            agg.apply(id(n), &conn(Some(CHECKOUT), "10.244.1.13:8080", 1, 1.0));
        }
        agg.apply(id(0), &open("10.244.1.12:8080", 7, 90_000.0));
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.active, s.requests), (5001, 1, 5007));
        let b = &s.backends[0];
        assert_eq!((b.connections, b.active, b.requests), (1, 1, 7));
        assert_eq!(
            b.lifetime_ms,
            Some(Percentiles {
                p50: 90_000.0,
                p90: 90_000.0,
                max: 90_000.0
            })
        );
        agg.apply(
            id(0),
            &conn(Some(CHECKOUT), "10.244.1.12:8080", 9, 95_000.0),
        );
        assert!(agg.open.is_empty());
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.active, s.requests), (5001, 0, 5009));
        assert_eq!(s.backends[0].lifetime_ms.unwrap().max, 95_000.0);
    }

    #[test]
    fn a_final_record_never_seen_open_is_counted_once() {
        let mut agg = Aggregator::default();
        agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 4, 250.0));
        // Repeated while recent: replaces. A late progress record changes nothing.
        agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 5, 300.0));
        agg.apply(id(1), &open("10.244.1.12:8080", 1, 10.0));
        let s = &agg.services()[0];
        assert_eq!((s.connections, s.active, s.requests), (1, 0, 5));
        assert_eq!(
            s.backends[0].lifetime_ms,
            Some(Percentiles {
                p50: 300.0,
                p90: 300.0,
                max: 300.0
            })
        );
        // Pushed out of the recent window, it is folded in exactly once.
        for n in 2..=RECENT_CLOSED as u64 + 1 {
            agg.apply(id(n), &conn(Some(CHECKOUT), "10.244.1.13:8080", 1, 1.0));
        }
        assert!(!agg.closed.contains_key(&id(1)));
        let folded = lifetimes(&agg, "10.244.1.12:8080");
        assert_eq!((folded.seen, folded.values.as_slice()), (1, &[300.0][..]));
        let s = &agg.services()[0];
        let b = &s.backends[0];
        assert_eq!((b.connections, b.active, b.requests), (1, 0, 5));
        assert_eq!(b.lifetime_ms.unwrap().p50, 300.0);
        assert_eq!(s.connections, RECENT_CLOSED as u64 + 1);
    }

    #[test]
    fn percentiles_are_exact_up_to_the_limit_then_keep_an_exact_max() {
        // Every closed lifetime is kept exactly: the folded ones and the recent window.
        let closed = (EXACT_LIFETIMES + RECENT_CLOSED) as u64;
        let mut agg = Aggregator::default();
        for n in 0..closed {
            // 1..=closed in a scrambled order (2029 is prime and is coprime with it).
            let duration = (n * 2029 % closed + 1) as f64;
            agg.apply(
                id(n),
                &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, duration),
            );
        }
        for (n, duration) in [
            (closed, 0.5),
            (closed + 1, 10_000.0),
            (closed + 2, 20_000.0),
        ] {
            agg.apply(id(n), &open("10.244.1.12:8080", 1, duration));
        }
        assert!(!lifetimes(&agg, "10.244.1.12:8080").sampled());
        // 5123 values: 0.5, 1..=5120, 10000, 20000; ranks ceil(2561.5) and ceil(4610.7).
        let exact = Percentiles {
            p50: 2561.0,
            p90: 4610.0,
            max: 20_000.0,
        };
        assert_eq!(agg.services()[0].backends[0].lifetime_ms, Some(exact));

        // One more closed connection starts sampling; the maximum stays exact.
        agg.apply(
            id(closed + 3),
            &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 30_000.0),
        );
        for n in closed + 4..closed + 4 + RECENT_CLOSED as u64 {
            agg.apply(id(n), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 2.0));
        }
        let folded = lifetimes(&agg, "10.244.1.12:8080");
        assert!(folded.sampled());
        assert_eq!(
            (folded.values.len(), folded.max),
            (EXACT_LIFETIMES, 30_000.0)
        );
        assert_eq!(agg.services()[0].backends[0].longest_pinned_ms, 30_000.0);
    }
}
