//! One Service's rules, totals and exact values, as read to build its [`ServiceStats`].

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use super::{BackendAcc, Counts, Exact, ServiceAcc, exact_connect_times};
use crate::stats::BackendStats;
use crate::stats::expectation::NodeRules;
use crate::stats::quantiles::{Group, connect_times, lifetime_percentiles};

/// One Service's rules, totals and exact values, read to build its [`ServiceStats`].
pub(super) struct ServiceView<'a> {
    pub(super) rules: Option<&'a NodeRules>,
    /// Where its totals are in `Aggregator::accs`; `None` for a Service only the rules name.
    pub(super) index: Option<usize>,
    pub(super) acc: Option<&'a ServiceAcc>,
    /// Its backends that had a connection.
    pub(super) seen: Vec<(&'a SocketAddr, &'a BackendAcc)>,
    pub(super) exact: &'a HashMap<(usize, SocketAddr), Exact>,
    /// The totals of a Service or backend without connections.
    pub(super) empty: Counts,
}

impl ServiceView<'_> {
    pub(super) fn counts(&self) -> &Counts {
        self.acc.map_or(&self.empty, |acc| &acc.counts)
    }

    /// The backends seen and the endpoints the rules list, in address order.
    pub(super) fn backend_addrs(&self) -> BTreeSet<SocketAddr> {
        let mut addrs: BTreeSet<SocketAddr> = self.seen.iter().map(|(addr, _)| **addr).collect();
        if let Some(rules) = self.rules {
            addrs.extend(rules.endpoint_addrs());
        }
        addrs
    }

    fn exact(&self, addr: SocketAddr) -> Option<&Exact> {
        self.index.and_then(|index| self.exact.get(&(index, addr)))
    }

    /// The backend's expected share (over each node's rules and endpoint set, by what
    /// their connections carried) and whether the rules list it; without rules, every
    /// backend seen is expected to get an even share.
    fn expected(&self, addr: SocketAddr) -> (Option<f64>, bool) {
        match self.rules {
            Some(rules) => rules.expected(&self.counts().groups, addr),
            None => (Some(1.0 / self.seen.len() as f64), true),
        }
    }

    pub(super) fn backend_stats(&self, addr: SocketAddr) -> BackendStats {
        let backend = self.seen.iter().find(|(a, _)| **a == addr).map(|(_, b)| *b);
        let (expected_share, in_rules) = self.expected(addr);
        let b = backend.map_or(&self.empty, |b| &b.counts);
        let exact = self.exact(addr);
        let exact_lifetimes = exact.map_or(&[][..], |e| e.lifetimes.as_slice());
        let lifetime_ms = backend.and_then(|b| lifetime_percentiles(&b.lifetimes, exact_lifetimes));
        let connect_ms = backend
            .and_then(|b| connect_times(&[b.connect_times.group(), exact_connect_times(exact)]));
        let service_requests = self.counts().requests;
        BackendStats {
            backend: addr,
            // From its connections, else from the rules' line for it.
            pod: backend
                .and_then(|b| b.pod.clone())
                .or_else(|| self.rules.and_then(|r| r.pod(addr))),
            connections: b.connections,
            active: b.active,
            requests: b.requests,
            request_share: if service_requests == 0 {
                0.0
            } else {
                b.requests as f64 / service_requests as f64
            },
            expected_share,
            in_rules,
            stale_pins: b.stale_pins,
            longest_pinned_ms: lifetime_ms.map_or(0.0, |p| p.max),
            lifetime_ms,
            bytes_to_backend: b.bytes_to_backend,
            bytes_from_backend: b.bytes_from_backend,
            outcomes: b.outcomes,
            connect_ms,
            connect_histogram: b.connect,
            request_mix: b.mix.clone(),
            resets: b.resets,
        }
    }

    /// Over every connect time of the Service: each backend's folded and exact ones.
    pub(super) fn connect_ms(&self) -> Option<crate::stats::ConnectTimes> {
        let groups: Vec<Group<'_>> = self
            .seen
            .iter()
            .flat_map(|(addr, b)| {
                [
                    b.connect_times.group(),
                    exact_connect_times(self.exact(**addr)),
                ]
            })
            .collect();
        connect_times(&groups)
    }
}
