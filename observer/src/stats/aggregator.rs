//! The running totals: per connection id, per Service, per backend.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;

use super::mix::RequestMix;
use super::outcomes::{ConnectHistogram, FrontendCounts, OutcomeCounts};
use super::quantiles::{Group, Reservoir};
use super::{BackendStats, ServiceStats};
mod rollouts;
mod view;

use super::expectation::{Groups, NodeRules};
use super::stickiness::Stickiness;
use crate::model::record::{
    ConnRecord, FrontendKind, Outcome, Proto, Recording, RejectRecord, ServiceRecord, TrafficPolicy,
};
use crate::model::update::ConnId;
use view::ServiceView;

type ServiceKey = (String, Proto);

/// The Service a connection or reject line belongs to, and whether the rules named it
/// (unnamed ones are keyed by what the client dialed).
fn service_key(
    service: Option<&str>,
    original_dst: SocketAddr,
    proto: Proto,
) -> (ServiceKey, bool) {
    match service {
        Some(name) => ((name.to_owned(), proto), true),
        None => ((original_dst.to_string(), proto), false),
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
    by_frontend: FrontendCounts,
    outcomes: OutcomeCounts,
    connect: ConnectHistogram,
    /// Connections by request count (for chance or cause, `stats::spread`).
    mix: RequestMix,
    /// Connections that ended with an RST (`close: rst`).
    resets: u64,
    /// Connections and requests by deciding node and endpoint set.
    groups: Groups,
    /// Connections whose backend was on the deciding node, and those elsewhere.
    same_node: u64,
    cross_node: u64,
}

impl Counts {
    fn add(&mut self, c: &Contribution) {
        self.connections += 1;
        self.active += u64::from(c.open);
        self.requests += c.requests;
        self.stale_pins += u64::from(c.stale);
        self.bytes_to_backend += c.bytes_to_backend;
        self.bytes_from_backend += c.bytes_from_backend;
        self.by_frontend.add(c.frontend);
        self.outcomes.add(c.outcome);
        if let Some(ms) = c.connect_ms {
            self.connect.add(ms);
        }
        self.mix.add(c.requests);
        self.resets += u64::from(c.reset);
        self.groups
            .add(c.netns, c.policy, c.backend.is_ipv6(), c.requests);
        self.same_node += u64::from(c.same_node == Some(true));
        self.cross_node += u64::from(c.same_node == Some(false));
    }

    /// Undoes an earlier `add` of the same contribution, so never underflows.
    fn subtract(&mut self, c: &Contribution) {
        self.connections -= 1;
        self.active -= u64::from(c.open);
        self.requests -= c.requests;
        self.stale_pins -= u64::from(c.stale);
        self.bytes_to_backend -= c.bytes_to_backend;
        self.bytes_from_backend -= c.bytes_from_backend;
        self.by_frontend.subtract(c.frontend);
        self.outcomes.subtract(c.outcome);
        if let Some(ms) = c.connect_ms {
            self.connect.subtract(ms);
        }
        self.mix.subtract(c.requests);
        self.resets -= u64::from(c.reset);
        self.groups
            .subtract(c.netns, c.policy, c.backend.is_ipv6(), c.requests);
        self.same_node -= u64::from(c.same_node == Some(true));
        self.cross_node -= u64::from(c.same_node == Some(false));
    }
}

/// Connections to a Service that netfilter rejected before any DNAT (`reject` lines).
#[derive(Default)]
struct Rejects {
    /// TCP attempts and UDP client sockets.
    count: u64,
    /// The UDP sockets' datagrams.
    datagrams: u64,
    by_frontend: FrontendCounts,
    by_reason: std::collections::BTreeMap<crate::model::record::RejectReason, u64>,
}

/// Final records kept by id so that a repeated one replaces instead of adding.
pub(super) const RECENT_CLOSED: usize = 1024;

pub(super) struct BackendAcc {
    counts: Counts,
    /// The pod the latest record named for this backend.
    pod: Option<String>,
    pub(super) lifetimes: Reservoir,
    /// Connect times of its closed connections older than the recent window.
    pub(super) connect_times: Reservoir,
}

pub(super) struct ServiceAcc {
    key: ServiceKey,
    named: bool,
    counts: Counts,
    rejects: Rejects,
    pub(super) backends: HashMap<SocketAddr, BackendAcc>,
    /// Which backend each client stayed on (ClientIP session affinity).
    sticky: Stickiness,
}

/// What one connection record added to the totals, kept while the connection is open or
/// recently closed so that a newer record for the same id can replace it.
pub(super) struct Contribution {
    /// Index into `Aggregator::accs` (not the key: this is kept per connection).
    service: usize,
    backend: SocketAddr,
    duration: f64,
    open: bool,
    stale: bool,
    requests: u64,
    bytes_to_backend: u64,
    bytes_from_backend: u64,
    frontend: Option<FrontendKind>,
    outcome: Outcome,
    connect_ms: Option<f64>,
    reset: bool,
    /// The deciding node and the endpoint set its rules picked from.
    netns: u32,
    policy: TrafficPolicy,
    same_node: Option<bool>,
    /// When it opened (the rollout window it may have opened in).
    start: chrono::DateTime<chrono::Utc>,
}

/// Exact values of a backend's open and recently closed connections.
#[derive(Default)]
struct Exact {
    lifetimes: Vec<f64>,
    connect_times: Vec<f64>,
}

/// Running per-Service, per-backend totals; feed it records, read `services()`.
#[derive(Default)]
pub struct Aggregator {
    /// Each node's latest `ServiceRecord` per Service.
    rules: HashMap<ServiceKey, NodeRules>,
    /// Where each Service's totals are in `accs`.
    index: HashMap<ServiceKey, usize>,
    pub(super) accs: Vec<ServiceAcc>,
    /// Connections whose latest record is `close == Open`.
    pub(super) open: HashMap<ConnId, Contribution>,
    /// The latest `RECENT_CLOSED` final records, with their arrival number; their
    /// lifetimes join the backend's `Lifetimes` when they leave this window.
    pub(super) closed: HashMap<ConnId, (u64, Contribution)>,
    /// Arrival order of `closed`; an entry whose number no longer matches was replaced.
    pub(super) closed_order: VecDeque<(u64, ConnId)>,
    closed_arrivals: u64,
    /// Endpoint changes: the windows in which an endpoint was out of the rules.
    pub(super) timeline: super::timeline::Timeline,
}

impl Aggregator {
    /// Records a Service's definition on one node; a later one for the same Service and
    /// node replaces it.
    pub fn add_service(&mut self, service: &ServiceRecord) {
        self.rules
            .entry((service.service.clone(), service.proto))
            .or_default()
            .insert(service);
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
        let index = self.acc_index(service_key(
            record.service.as_deref(),
            record.original_dst,
            record.proto,
        ));
        let (old, was_final) = match self.open.remove(&id) {
            Some(old) => (Some(old), false),
            None => (self.closed.remove(&id).map(|(_, old)| old), true),
        };
        if !(open || was_final && old.is_some()) {
            self.accs[index].sticky.observe(
                record.netns,
                record.client.ip(),
                record.backend,
                record.start,
            );
        }
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
            frontend: record.frontend,
            outcome: record.outcome(),
            connect_ms: record.connect_ms,
            reset: record.close == crate::model::record::Close::Rst,
            netns: record.netns,
            policy: record.policy.unwrap_or(TrafficPolicy::Cluster),
            same_node: record.same_node,
            start: record.start,
        };
        let service = &mut self.accs[index];
        service.counts.add(&contribution);
        let backend = backend_acc(service, record.backend);
        backend.counts.add(&contribution);
        if record.backend_pod.is_some() {
            backend.pod = record.backend_pod.as_deref().map(str::to_owned);
        }
        if open {
            self.open.insert(id, contribution);
        } else {
            self.close(id, contribution);
        }
    }

    /// Counts a connection that netfilter rejected before any DNAT.
    pub fn add_reject(&mut self, reject: &RejectRecord) {
        let index = self.acc_index(service_key(
            reject.service.as_deref(),
            reject.original_dst,
            reject.proto,
        ));
        let rejects = &mut self.accs[index].rejects;
        rejects.count += 1;
        rejects.datagrams += reject.packets.unwrap_or(0);
        rejects.by_frontend.add(reject.frontend);
        if let Some(reason) = reject.reason {
            *rejects.by_reason.entry(reason).or_default() += 1;
        }
    }

    /// Where a Service's totals are, created empty on first sight.
    fn acc_index(&mut self, (key, named): (ServiceKey, bool)) -> usize {
        if let Some(&index) = self.index.get(&key) {
            return index;
        }
        self.accs.push(ServiceAcc {
            key: key.clone(),
            named,
            counts: Counts::default(),
            rejects: Rejects::default(),
            backends: HashMap::new(),
            sticky: Stickiness::default(),
        });
        self.index.insert(key, self.accs.len() - 1);
        self.accs.len() - 1
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
                let backend = backend_acc(service, old.backend);
                backend.lifetimes.add(old.duration);
                if let Some(ms) = old.connect_ms {
                    backend.connect_times.add(ms);
                }
            }
        }
    }

    /// Every Service with a `ServiceRecord`, a connection or a rejected connection,
    /// sorted by name (then proto).
    pub fn services(&self) -> Vec<ServiceStats> {
        let keys: BTreeSet<&ServiceKey> = self
            .rules
            .keys()
            .chain(
                self.accs
                    .iter()
                    .filter(|s| s.counts.connections > 0 || s.rejects.count > 0)
                    .map(|s| &s.key),
            )
            .collect();
        // Exact values of open and recently closed connections per (Service, backend).
        let mut exact: HashMap<(usize, SocketAddr), Exact> = HashMap::new();
        for c in self
            .open
            .values()
            .chain(self.closed.values().map(|(_, c)| c))
        {
            let values = exact.entry((c.service, c.backend)).or_default();
            values.lifetimes.push(c.duration);
            values.connect_times.extend(c.connect_ms);
        }
        keys.into_iter()
            .map(|key| self.service_stats(key, &exact))
            .collect()
    }

    /// One Service's figures: its backends (seen or in the rules), its totals, its
    /// rejects and its skew.
    fn service_stats(
        &self,
        key: &ServiceKey,
        exact: &HashMap<(usize, SocketAddr), Exact>,
    ) -> ServiceStats {
        let view = self.service_view(key, exact);
        let backends: Vec<BackendStats> = view
            .backend_addrs()
            .into_iter()
            .map(|addr| view.backend_stats(addr))
            .collect();
        let counts = view.counts();
        let no_rejects = Rejects::default();
        let rejects = view.acc.map_or(&no_rejects, |acc| &acc.rejects);
        let rule = view.rules.and_then(NodeRules::latest);
        let sticky = view.acc.map(|acc| &acc.sticky);
        let affinity = view.rules.and_then(NodeRules::affinity);
        let mut stats = ServiceStats {
            service: key.0.clone(),
            named: view.acc.is_none_or(|acc| acc.named),
            proto: key.1,
            frontends: rule.map(|r| r.frontends.clone()).unwrap_or_default(),
            has_rules: rule.is_some(),
            connections: counts.connections,
            active: counts.active,
            requests: counts.requests,
            stale_pins: counts.stale_pins,
            by_frontend: counts.by_frontend.to_map(),
            outcomes: counts.outcomes,
            connect_ms: view.connect_ms(),
            rejected: rejects.count,
            rejected_datagrams: rejects.datagrams,
            rejected_by_frontend: rejects.by_frontend.to_map(),
            rejected_by_reason: rejects.by_reason.clone(),
            backends,
            skew: None,
            resets: counts.resets,
            nodes: view.rules.map_or(0, NodeRules::nodes),
            same_node: counts.same_node,
            cross_node: counts.cross_node,
            affinity,
            affinity_clients: sticky.map_or(0, Stickiness::clients),
            affinity_switches: sticky
                .map_or(0, |s| s.switches_within(affinity.and_then(|a| a.timeout_s))),
        };
        stats.skew = stats.skew_detail().map(|d| d.skew);
        stats
    }

    /// What [`Aggregator::service_stats`] reads for one Service.
    fn service_view<'a>(
        &'a self,
        key: &ServiceKey,
        exact: &'a HashMap<(usize, SocketAddr), Exact>,
    ) -> ServiceView<'a> {
        let index = self.index.get(key).copied();
        let acc = index.map(|index| &self.accs[index]);
        let seen = acc
            .map(|acc| {
                acc.backends
                    .iter()
                    .filter(|(_, b)| b.counts.connections > 0)
                    .collect()
            })
            .unwrap_or_default();
        ServiceView {
            rules: self.rules.get(key),
            index,
            acc,
            seen,
            exact,
            empty: Counts::default(),
        }
    }

    /// Aggregates a whole recording; connection ids are line order.
    pub fn from_recording(recording: &Recording) -> Aggregator {
        let mut aggregator = Aggregator::default();
        for service in &recording.services {
            aggregator.add_service(service);
        }
        for reject in &recording.rejects {
            aggregator.add_reject(reject);
        }
        for change in &recording.endpoints {
            aggregator.add_endpoints(change);
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
            pod: None,
            lifetimes: Reservoir::new("lifetime", backend),
            connect_times: Reservoir::new("connect", backend),
        })
}

/// A backend's exact connect times as a group of weight 1 (none without any).
fn exact_connect_times(exact: Option<&Exact>) -> Group<'_> {
    (exact.map_or(&[][..], |e| e.connect_times.as_slice()), 1.0)
}
