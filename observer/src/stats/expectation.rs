//! What a Service's connections were expected to do, per node: each connection is judged
//! against the rules of the node that made its DNAT decision (`netns`) and the endpoint
//! set its client's case picked from (`policy`: the cluster's, or with a Local traffic
//! policy the node's own). A backend's expected share is the mixture of those sets'
//! shares, weighted by the requests (or, before any request, the connections) each
//! (node, set) carried; before any connection, the latest rules seen.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use crate::model::record::{Affinity, EndpointShare, ServiceRecord, TrafficPolicy};

/// A Service port's rules on each node that defines it.
#[derive(Clone, Debug, Default)]
pub struct NodeRules {
    by_netns: BTreeMap<u32, ServiceRecord>,
}

/// Which of a dual-stack Service's families a connection used: each family's endpoints
/// share its connections (shares add up to 1 per family).
pub type V6 = bool;

/// Connections and their requests per deciding node, endpoint set and address family.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Groups(BTreeMap<(u32, TrafficPolicy, V6), (u64, u64)>);

impl Groups {
    pub fn add(&mut self, netns: u32, policy: TrafficPolicy, v6: V6, requests: u64) {
        let entry = self.0.entry((netns, policy, v6)).or_default();
        entry.0 += 1;
        entry.1 += requests;
    }

    /// Undoes an earlier `add`.
    pub fn subtract(&mut self, netns: u32, policy: TrafficPolicy, v6: V6, requests: u64) {
        let key = (netns, policy, v6);
        if let Some(entry) = self.0.get_mut(&key) {
            entry.0 -= 1;
            entry.1 -= requests;
            if entry.0 == 0 {
                self.0.remove(&key);
            }
        }
    }
}

impl NodeRules {
    /// A node's definition; a later one for the same node replaces it.
    pub fn insert(&mut self, record: &ServiceRecord) {
        self.by_netns.insert(record.netns, record.clone());
    }

    /// The most recently written definition, whichever node's.
    pub fn latest(&self) -> Option<&ServiceRecord> {
        self.by_netns.values().max_by_key(|r| r.time)
    }

    /// How many nodes define the Service.
    pub fn nodes(&self) -> usize {
        self.by_netns.len()
    }

    pub fn affinity(&self) -> Option<Affinity> {
        self.by_netns.values().find_map(|r| r.affinity)
    }

    fn sets(record: &ServiceRecord) -> impl Iterator<Item = &EndpointShare> {
        record
            .endpoints
            .iter()
            .chain(record.local_endpoints.iter().flatten())
    }

    /// Every endpoint on any node, either set.
    pub fn endpoint_addrs(&self) -> BTreeSet<SocketAddr> {
        self.by_netns
            .values()
            .flat_map(NodeRules::sets)
            .map(|e| e.addr)
            .collect()
    }

    /// An endpoint's pod, as any node's rules line names it.
    pub fn pod(&self, addr: SocketAddr) -> Option<String> {
        self.by_netns
            .values()
            .flat_map(NodeRules::sets)
            .find(|e| e.addr == addr)
            .and_then(|e| e.pod.clone())
    }

    /// The backend's expected share and whether any node's rules list it.
    pub fn expected(&self, groups: &Groups, addr: SocketAddr) -> (Option<f64>, bool) {
        if !self.endpoint_addrs().contains(&addr) {
            return (None, false);
        }
        let share_in = |record: &ServiceRecord, policy: TrafficPolicy| {
            let set = match (policy, &record.local_endpoints) {
                (TrafficPolicy::Local, Some(local)) => local,
                _ => &record.endpoints,
            };
            set.iter()
                .find(|e| e.addr == addr)
                .map_or(0.0, |e| e.expected_share)
        };
        // Groups of the other family carry none of this backend's share.
        let usable: Vec<(&ServiceRecord, TrafficPolicy, bool, (u64, u64))> = groups
            .0
            .iter()
            .filter_map(|((netns, policy, v6), weights)| {
                self.by_netns
                    .get(netns)
                    .map(|r| (r, *policy, *v6 == addr.is_ipv6(), *weights))
            })
            .collect();
        let by_requests = usable.iter().any(|(_, _, _, (_, requests))| *requests > 0);
        let weight = |(connections, requests): (u64, u64)| {
            (if by_requests { requests } else { connections }) as f64
        };
        let total: f64 = usable.iter().map(|(_, _, _, w)| weight(*w)).sum();
        if total == 0.0 {
            // Before any connection: the latest rules, each family an equal part.
            let share = self.latest().map_or(0.0, |latest| {
                let families = latest.endpoints.iter().any(|e| e.addr.is_ipv4()) as u8
                    + latest.endpoints.iter().any(|e| e.addr.is_ipv6()) as u8;
                share_in(latest, TrafficPolicy::Cluster) / f64::from(families.max(1))
            });
            return (Some(share), true);
        }
        let mixed: f64 = usable
            .iter()
            .filter(|(_, _, same_family, _)| *same_family)
            .map(|(record, policy, _, w)| weight(*w) * share_in(record, *policy))
            .sum();
        (Some(mixed / total), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::{Frontend, FrontendKind, Proto};

    fn record(
        netns: u32,
        endpoints: &[(&str, f64)],
        local: Option<&[(&str, f64)]>,
    ) -> ServiceRecord {
        let shares = |list: &[(&str, f64)]| {
            list.iter()
                .map(|(addr, share)| EndpointShare {
                    addr: addr.parse().unwrap(),
                    expected_share: *share,
                    pod: None,
                })
                .collect()
        };
        ServiceRecord {
            service: "shop/checkout:http".to_owned(),
            proto: Proto::Tcp,
            netns,
            frontends: vec![Frontend {
                kind: FrontendKind::ClusterIp,
                ip: Some("10.96.0.1".parse().unwrap()),
                port: 80,
            }],
            endpoints: shares(endpoints),
            local_endpoints: local.map(shares),
            affinity: None,
            time: chrono::DateTime::from_timestamp(netns.into(), 0).unwrap(),
        }
    }

    /// Two nodes with different endpoint sets: each node's connections count against its
    /// own rules, in proportion to their requests.
    #[test]
    fn each_nodes_traffic_is_judged_against_its_own_rules() {
        let mut rules = NodeRules::default();
        rules.insert(&record(
            1,
            &[("10.0.0.1:80", 0.5), ("10.0.0.2:80", 0.5)],
            None,
        ));
        rules.insert(&record(2, &[("10.0.0.2:80", 1.0)], None));
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let mut groups = Groups::default();
        // Before any connection: the latest rules (node 2's).
        assert_eq!(rules.expected(&groups, a), (Some(0.0), true));
        groups.add(1, TrafficPolicy::Cluster, false, 30);
        groups.add(2, TrafficPolicy::Cluster, false, 10);
        assert_eq!(rules.expected(&groups, a), (Some(0.375), true));
        assert_eq!(rules.expected(&groups, b), (Some(0.625), true));
        groups.subtract(2, TrafficPolicy::Cluster, false, 10);
        assert_eq!(rules.expected(&groups, b), (Some(0.5), true));
        assert_eq!(
            rules.expected(&groups, "10.0.0.9:80".parse().unwrap()),
            (None, false)
        );
    }

    #[test]
    fn a_local_policys_connections_count_against_the_local_set() {
        let mut rules = NodeRules::default();
        rules.insert(&record(
            1,
            &[("10.0.0.1:80", 0.5), ("10.0.0.2:80", 0.5)],
            Some(&[("10.0.0.1:80", 1.0)]),
        ));
        let mut groups = Groups::default();
        groups.add(1, TrafficPolicy::Local, false, 4);
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert_eq!(rules.expected(&groups, a), (Some(1.0), true));
        groups.add(1, TrafficPolicy::Cluster, false, 4);
        assert_eq!(rules.expected(&groups, a), (Some(0.75), true));
    }

    /// A dual-stack Service: each family's endpoints share that family's connections.
    #[test]
    fn each_family_shares_its_own_connections() {
        let mut rules = NodeRules::default();
        rules.insert(&record(
            1,
            &[
                ("10.0.0.1:80", 0.5),
                ("10.0.0.2:80", 0.5),
                ("[fd00::1]:80", 1.0),
            ],
            None,
        ));
        let v4: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let v6: SocketAddr = "[fd00::1]:80".parse().unwrap();
        let mut groups = Groups::default();
        assert_eq!(
            rules.expected(&groups, v4),
            (Some(0.25), true),
            "half the Service's share"
        );
        groups.add(1, TrafficPolicy::Cluster, false, 30);
        groups.add(1, TrafficPolicy::Cluster, true, 10);
        assert_eq!(rules.expected(&groups, v4), (Some(0.375), true));
        assert_eq!(rules.expected(&groups, v6), (Some(0.25), true));
    }
}
