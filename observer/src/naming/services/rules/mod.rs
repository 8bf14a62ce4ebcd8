//! kube-proxy's own rules, followed as the kernel runs them: `iptables-save` text
//! (`iptables`) and `nft -j` JSON (`nft`) are decoded into one [`program::Program`]
//! each, and the evaluator ([`program::eval`]) runs every candidate Service frontend
//! through the hooks, so that each frontend gets the endpoints the rules pick and each
//! one's share, per kind of client (traffic policies), whichever layout kube-proxy
//! wrote. [`ServiceMap`] indexes the result per network namespace.

mod iptables;
mod nft;
pub mod program;

pub use iptables::Tables as IptablesTables;
pub use nft::Table as NftTable;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::model::NetMap;
use crate::model::record::{
    Affinity, EndpointShare, Frontend, FrontendKind, Proto, RejectReason, ServiceRecord,
};
use crate::naming::printable::{MESSAGE_BYTES, NAME_BYTES, printable};
use program::eval::{Client, Daddr, Packet};
use program::ports::{Case, FrontendRules, frontends};
use program::{Program, frontends::TCP, frontends::UDP};

/// A dump that is not what the parsers expect. Messages name the line (iptables) or the
/// JSON position or path (nft).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RulesError {
    #[error("iptables-save line {line}: {message}")]
    Iptables { line: usize, message: String },
    #[error("nft JSON at line {line} column {column}: {message}")]
    NftSyntax {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("nft JSON at {path}: {message}")]
    Nft { path: String, message: String },
}

/// One Service port as the rules define it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServicePort {
    /// `ns/name:port` (just `ns/name` for an unnamed port), as kube-proxy names it; the
    /// first frontend's address when no chain name or comment on its way names it.
    pub name: String,
    pub proto: Proto,
    /// Sorted, without duplicates.
    pub frontends: Vec<Frontend>,
    /// The endpoints the rules send most clients to (cluster-wide; with
    /// internalTrafficPolicy: Local, this node's), sorted, with the share of new
    /// connections each gets. Shares add up to 1 per address family.
    pub endpoints: Vec<EndpointShare>,
    /// Where the rules send external clients of the NodePort, load-balancer and
    /// external IPs when they are fewer (externalTrafficPolicy: Local): this node's
    /// endpoints; empty when the rules drop them for want of any. `None` without such
    /// a policy.
    pub local_endpoints: Option<Vec<EndpointShare>>,
    /// ClientIP session affinity, where the rules keep it.
    pub affinity: Option<Affinity>,
    /// Every address any case of any frontend DNATs to.
    reachable: BTreeSet<SocketAddr>,
    /// Whether some way through the rules to a frontend could not be followed: a
    /// backend missing from `reachable` may then still be an endpoint.
    unfollowed: bool,
    /// Whether a kube-proxy chain name or comment names it (not its address): DNAT
    /// rules of others, such as Docker's for its embedded DNS server, are followed but
    /// are no kube-proxy Service.
    named: bool,
}

impl ServicePort {
    /// Whether `backend` is an endpoint of any of the port's cases; `None` when the
    /// rules could not be followed all the way and do not have it.
    pub fn has_endpoint(&self, backend: SocketAddr) -> Option<bool> {
        match self.reachable.contains(&backend) {
            true => Some(true),
            false if self.unfollowed => None,
            false => Some(false),
        }
    }

    fn absorb(&mut self, other: ServicePort) {
        let mut frontends: BTreeSet<Frontend> = self.frontends.drain(..).collect();
        frontends.extend(other.frontends);
        self.frontends = frontends.into_iter().collect();
        append_new(&mut self.endpoints, other.endpoints);
        match (&mut self.local_endpoints, other.local_endpoints) {
            (Some(mine), Some(theirs)) => append_new(mine, theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
        self.affinity = self.affinity.or(other.affinity);
        self.reachable.extend(other.reachable);
        self.unfollowed |= other.unfollowed;
        self.named |= other.named;
    }
}

fn append_new(into: &mut Vec<EndpointShare>, from: Vec<EndpointShare>) {
    for endpoint in from {
        if !into.iter().any(|e| e.addr == endpoint.addr) {
            into.push(endpoint);
        }
    }
}

/// Which of a Service port's endpoint sets a connection's case picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The port's `endpoints`.
    Cluster,
    /// The port's `local_endpoints` (externalTrafficPolicy: Local).
    Local,
}

/// What the rules expected of one connection: the case its client falls in.
#[derive(Clone, Debug, PartialEq)]
pub struct Expectation {
    /// The endpoints this client's connections are spread over, with shares.
    pub endpoints: Vec<EndpointShare>,
    pub policy: Policy,
    /// Why connections of this case are turned away, when some are.
    pub turned_away: Option<RejectReason>,
}

/// One frontend's place in the map.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    key: (Proto, String),
    kind: FrontendKind,
    packet: Packet,
    cases: Arc<Vec<Case>>,
}

/// All Service ports of one network namespace, indexed by what clients dial.
#[derive(Clone, Default)]
pub struct ServiceMap {
    services: BTreeMap<(Proto, String), ServicePort>,
    /// Keyed by what clients dial: foldhash, not SipHash (every connection looks one up).
    by_addr: NetMap<(Proto, SocketAddr), Entry>,
    by_node_port: NetMap<(Proto, u16), Entry>,
    /// Rules observer could not follow, one sentence each.
    warnings: Vec<String>,
    /// The rules themselves, in the order a packet meets them (per dump), to tell why
    /// a connection to no frontend was turned away.
    programs: Vec<Vec<Arc<Program>>>,
}

/// Two maps are equal when they say the same of every frontend, however their rules
/// were written down (read whole or patched from announcements).
impl PartialEq for ServiceMap {
    fn eq(&self, other: &ServiceMap) -> bool {
        self.services == other.services
            && self.by_addr == other.by_addr
            && self.by_node_port == other.by_node_port
            && self.warnings == other.warnings
    }
}

impl std::fmt::Debug for ServiceMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceMap")
            .field("services", &self.services)
            .field("by_addr", &self.by_addr)
            .field("by_node_port", &self.by_node_port)
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

impl ServiceMap {
    /// Parses `iptables-save` (or `ip6tables-save`) text; the nat table is enough, the
    /// filter table adds Services that have no endpoints.
    pub fn from_iptables_save(text: &str) -> Result<ServiceMap, RulesError> {
        ServiceMap::from_iptables_tables(&IptablesTables::parse(text)?)
    }

    /// The Service ports of parsed `iptables-save` tables.
    pub fn from_iptables_tables(tables: &IptablesTables) -> Result<ServiceMap, RulesError> {
        let programs: Vec<Arc<Program>> = tables.programs().into_iter().cloned().collect();
        Ok(ServiceMap::from_programs(programs))
    }

    /// The Service ports of a parsed nftables table.
    pub fn from_nft_table(table: &NftTable) -> Result<ServiceMap, RulesError> {
        Ok(ServiceMap::from_programs(vec![table.program().clone()]))
    }

    /// Parses `nft -j list table ip kube-proxy` (or `ip6`) output.
    pub fn from_nft_json(text: &str) -> Result<ServiceMap, RulesError> {
        ServiceMap::from_nft_table(&NftTable::parse(text)?)
    }

    /// Runs every candidate frontend through `programs` (in the order a packet meets
    /// them). Where Service names (from rule comments and chain names) enter observer:
    /// as printable text.
    pub fn from_programs(programs: Vec<Arc<Program>>) -> ServiceMap {
        let borrowed: Vec<&Program> = programs.iter().map(|p| &**p).collect();
        let (found, mut warnings) = frontends(&borrowed);
        let mut map = ServiceMap::default();
        let mut unnamed = 0u32;
        let mut by_port: BTreeMap<(Proto, String), (bool, Vec<FrontendRules>)> = BTreeMap::new();
        for mut frontend in found {
            let (name, named) = match frontend.name.take() {
                Some(name) => (printable(name, NAME_BYTES), true),
                None => {
                    unnamed += 1;
                    (unnamed_name(&frontend.frontend), false)
                }
            };
            let port = by_port.entry((frontend.proto, name)).or_default();
            port.0 |= named;
            port.1.push(frontend);
        }
        if unnamed > 0 {
            warnings.push(
                "Service frontends that no kube-proxy chain name or comment names are named by their address"
                    .to_owned(),
            );
        }
        for ((proto, name), (named, frontends)) in by_port {
            let port = service_port(&name, proto, named, &frontends);
            for frontend in frontends {
                map.index((proto, name.clone()), frontend);
            }
            map.insert(port);
        }
        map.warnings = warnings.into_iter().map(error_text).collect();
        map.programs = vec![programs];
        map
    }

    fn index(&mut self, key: (Proto, String), frontend: FrontendRules) {
        let Some(packet) = packet_of(&frontend) else {
            return;
        };
        let entry = Entry {
            key,
            kind: frontend.frontend.kind,
            packet,
            cases: Arc::new(frontend.cases),
        };
        match frontend.frontend.ip {
            Some(ip) => {
                self.by_addr.insert(
                    (frontend.proto, SocketAddr::new(ip, frontend.frontend.port)),
                    entry,
                );
            }
            None => {
                self.by_node_port
                    .insert((frontend.proto, frontend.frontend.port), entry);
            }
        }
    }

    fn insert(&mut self, port: ServicePort) {
        let key = (port.proto, port.name.clone());
        match self.services.get_mut(&key) {
            Some(existing) => existing.absorb(port),
            None => {
                self.services.insert(key, port);
            }
        }
    }

    /// Adds another dump's Services (e.g. the IPv6 table, or legacy iptables next to
    /// nft); the same Service port gets the union of frontends and endpoints.
    pub fn merge(&mut self, other: ServiceMap) {
        for (_, port) in other.services {
            self.insert(port);
        }
        self.by_addr.extend(other.by_addr);
        self.by_node_port.extend(other.by_node_port);
        self.warnings.extend(other.warnings);
        self.programs.extend(other.programs);
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Whether kube-proxy's rules are here: a Service port that a kube-proxy chain name
    /// or comment names, not only DNAT rules named by their addresses.
    pub fn has_kube_proxy_services(&self) -> bool {
        self.services.values().any(|port| port.named)
    }

    /// Rules observer could not follow, one sentence each.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Service ports sorted by protocol, then name.
    pub fn services(&self) -> impl Iterator<Item = &ServicePort> {
        self.services.values()
    }

    /// The Service port a connection belongs to, by protocol and what the client dialed
    /// (ClusterIP/external/LB address exactly, NodePort by port on any address), and
    /// whether `backend` is still one of its endpoints (false = stale pin; `None`: the
    /// rules could not be followed to tell).
    pub fn lookup(
        &self,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
    ) -> Option<(&ServicePort, Option<bool>)> {
        let entry = self.entry(proto, original_dst)?;
        let port = self.services.get(&entry.key)?;
        Some((port, port.has_endpoint(backend)))
    }

    /// Which kind of frontend a connection entered through, by the same match as
    /// [`ServiceMap::lookup`]: an exact address first, then a NodePort by port.
    pub fn frontend_kind(&self, proto: Proto, original_dst: SocketAddr) -> Option<FrontendKind> {
        self.entry(proto, original_dst).map(|entry| entry.kind)
    }

    /// What the rules expected of a connection from `client` (whether it is the node
    /// itself, when known) to `original_dst`: the case its client falls in.
    pub fn expect(
        &self,
        proto: Proto,
        original_dst: SocketAddr,
        client: SocketAddr,
        client_is_node: Option<bool>,
    ) -> Option<Expectation> {
        let (case, policy) = self.case(proto, original_dst, client, client_is_node)?;
        Some(Expectation {
            endpoints: case.endpoints.clone(),
            policy,
            turned_away: case.turned_away,
        })
    }

    /// The policy of [`ServiceMap::expect`]'s case, without copying its endpoints: every
    /// connection to a Service asks.
    pub fn policy(
        &self,
        proto: Proto,
        original_dst: SocketAddr,
        client: SocketAddr,
        client_is_node: Option<bool>,
    ) -> Option<Policy> {
        self.case(proto, original_dst, client, client_is_node)
            .map(|(_, policy)| policy)
    }

    /// The case a connection from `client` to `original_dst` falls in, and its policy.
    fn case(
        &self,
        proto: Proto,
        original_dst: SocketAddr,
        client: SocketAddr,
        client_is_node: Option<bool>,
    ) -> Option<(&Case, Policy)> {
        let entry = self.entry(proto, original_dst)?;
        let port = self.services.get(&entry.key)?;
        let who = Client {
            saddr: client.ip(),
            daddr: original_dst.ip(),
            local: client_is_node,
        };
        let case = entry
            .cases
            .iter()
            .find(|case| case.admits(&who, &entry.packet))?;
        let policy = match &port.local_endpoints {
            Some(local) if !local.is_empty() && same_addrs(local, &case.endpoints) => Policy::Local,
            Some(local) if local.is_empty() && case.endpoints.is_empty() => Policy::Local,
            _ => Policy::Cluster,
        };
        Some((case, policy))
    }

    /// Why the rules turned away a connection from `client` to `dialed` that was never
    /// DNATed, with the Service port and frontend when `dialed` is one; `None` when no
    /// rule explains it as Service traffic (a network policy's drop, say).
    pub fn refusal(
        &self,
        proto: Proto,
        dialed: SocketAddr,
        client: SocketAddr,
    ) -> Option<(RejectReason, Option<&ServicePort>, Option<FrontendKind>)> {
        if let Some(entry) = self.entry(proto, dialed) {
            let port = self.services.get(&entry.key);
            let reason = self
                .expect(proto, dialed, client, None)
                .and_then(|e| e.turned_away)
                .unwrap_or(RejectReason::Other);
            return Some((reason, port, Some(entry.kind)));
        }
        let packet = Packet {
            daddr: Daddr::Addr(dialed.ip()),
            proto: match proto {
                Proto::Tcp => TCP,
                Proto::Udp => UDP,
            },
            dport: dialed.port(),
        };
        let who = Client {
            saddr: client.ip(),
            daddr: dialed.ip(),
            local: None,
        };
        self.programs.iter().find_map(|programs| {
            let borrowed: Vec<&Program> = programs.iter().map(|p| &**p).collect();
            program::frontends::Plan::new(&borrowed)
                .run(packet)
                .iter()
                .filter(|b| {
                    matches!(
                        b.target,
                        program::eval::Target::Drop | program::eval::Target::Reject
                    )
                })
                .filter(|b| {
                    b.guards
                        .iter()
                        .all(|g| g.check(&who, &packet).unwrap_or(true))
                })
                .map(program::ports::reason)
                .find(|reason| *reason != RejectReason::Other)
                .map(|reason| (reason, None, None))
        })
    }

    fn entry(&self, proto: Proto, original_dst: SocketAddr) -> Option<&Entry> {
        self.by_addr
            .get(&(proto, original_dst))
            .or_else(|| self.by_node_port.get(&(proto, original_dst.port())))
    }

    /// One record per Service port, for the connection log.
    pub fn service_records(&self, netns: u32, time: DateTime<Utc>) -> Vec<ServiceRecord> {
        self.services
            .values()
            .map(|port| ServiceRecord {
                service: port.name.clone(),
                proto: port.proto,
                netns,
                frontends: port.frontends.clone(),
                endpoints: port.endpoints.clone(),
                local_endpoints: port.local_endpoints.clone(),
                affinity: port.affinity,
                time,
            })
            .collect()
    }
}

fn same_addrs(a: &[EndpointShare], b: &[EndpointShare]) -> bool {
    a.len() == b.len() && a.iter().all(|e| b.iter().any(|f| f.addr == e.addr))
}

/// The name of a frontend no rule names: its address (`10.96.0.11:80`), or
/// `nodeport:30080`.
fn unnamed_name(frontend: &Frontend) -> String {
    match frontend.ip {
        Some(ip) => SocketAddr::new(ip, frontend.port).to_string(),
        None => format!("nodeport:{}", frontend.port),
    }
}

fn packet_of(frontend: &FrontendRules) -> Option<Packet> {
    Some(Packet {
        daddr: frontend.frontend.ip.map_or(Daddr::NodeLocal, Daddr::Addr),
        proto: match frontend.proto {
            Proto::Tcp => TCP,
            Proto::Udp => UDP,
        },
        dport: frontend.frontend.port,
    })
}

/// One Service port from its frontends' cases: the largest endpoint set is the
/// cluster's, a smaller one (or a case dropped for want of local endpoints) the local
/// policy's.
fn service_port(name: &str, proto: Proto, named: bool, frontends: &[FrontendRules]) -> ServicePort {
    let mut sets: Vec<Vec<EndpointShare>> = Vec::new();
    let mut reachable = BTreeSet::new();
    let mut no_local = false;
    let unfollowed = frontends.iter().any(|f| f.unfollowed);
    for case in frontends.iter().flat_map(|f| &f.cases) {
        reachable.extend(case.endpoints.iter().map(|e| e.addr));
        no_local |= case.turned_away == Some(RejectReason::NoLocalEndpoints);
        if case.endpoints.is_empty() {
            continue;
        }
        let normalized = normalized(&case.endpoints);
        if !sets.iter().any(|s| same_shares(s, &normalized)) {
            sets.push(normalized);
        }
    }
    sets.sort_by_key(|set| std::cmp::Reverse(set.len()));
    let mut sets = sets.into_iter();
    let endpoints = sets.next().unwrap_or_default();
    let local_endpoints = match sets.next() {
        Some(local) => Some(local),
        None if no_local => Some(Vec::new()),
        None => None,
    };
    let frontends_sorted: BTreeSet<Frontend> =
        frontends.iter().map(|f| f.frontend.clone()).collect();
    ServicePort {
        name: name.to_owned(),
        proto,
        frontends: frontends_sorted.into_iter().collect(),
        endpoints,
        local_endpoints,
        affinity: frontends.iter().find_map(|f| f.affinity),
        reachable,
        unfollowed,
        named,
    }
}

/// A case's endpoints as shares of its DNATed connections, sorted by address.
fn normalized(endpoints: &[EndpointShare]) -> Vec<EndpointShare> {
    let total: f64 = endpoints.iter().map(|e| e.expected_share).sum();
    let mut out: Vec<EndpointShare> = endpoints
        .iter()
        .map(|e| EndpointShare {
            expected_share: if total > 0.0 {
                e.expected_share / total
            } else {
                0.0
            },
            ..e.clone()
        })
        .collect();
    out.sort_by_key(|e| e.addr);
    out
}

fn same_shares(a: &[EndpointShare], b: &[EndpointShare]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.addr == y.addr && (x.expected_share - y.expected_share).abs() < 1e-9)
}

/// The message of an error that may quote the rules' text (a line, a word, a map's
/// name), as printable text.
fn error_text(message: String) -> String {
    printable(message, MESSAGE_BYTES)
}

#[cfg(test)]
mod tests;
