//! kube-proxy's own rules, parsed into one [`ServiceMap`] per network namespace: which
//! Service port a DNATed connection belongs to, and whether its backend is still an
//! endpoint. Pure parsers: the text comes from `iptables-save -t nat` or
//! `nft -j list table ip kube-proxy`, read elsewhere (`crate::naming`).

mod iptables;
mod nft;

pub use iptables::Tables as IptablesTables;
pub use nft::Table as NftTable;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use chrono::{DateTime, Utc};

use crate::model::record::{EndpointShare, Frontend, FrontendKind, Proto, ServiceRecord};
use crate::naming::printable::{MESSAGE_BYTES, NAME_BYTES, printable};

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
    /// `ns/name:port` (just `ns/name` for an unnamed port), as kube-proxy names it.
    pub name: String,
    pub proto: Proto,
    /// Sorted, without duplicates.
    pub frontends: Vec<Frontend>,
    /// The cluster-wide endpoints (KUBE-SVC-* / `service-*` chain) in rule order, with
    /// the share of new connections the rules give each. When a Service has only a
    /// node-local chain (internalTrafficPolicy: Local), that chain's endpoints. Shares add
    /// up to 1 per address family.
    pub endpoints: Vec<EndpointShare>,
    /// Endpoints of the node-local chain (KUBE-SVL-* / `local-*`) that external traffic
    /// uses with externalTrafficPolicy: Local; `None` when there is no such chain.
    pub local_endpoints: Option<Vec<EndpointShare>>,
}

impl ServicePort {
    /// Whether `backend` is an endpoint of either chain.
    pub fn has_endpoint(&self, backend: SocketAddr) -> bool {
        self.endpoints.iter().any(|e| e.addr == backend)
            || self
                .local_endpoints
                .iter()
                .flatten()
                .any(|e| e.addr == backend)
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
    }
}

fn append_new(into: &mut Vec<EndpointShare>, from: Vec<EndpointShare>) {
    for endpoint in from {
        if !into.iter().any(|e| e.addr == endpoint.addr) {
            into.push(endpoint);
        }
    }
}

/// All Service ports of one network namespace, indexed by what clients dial.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceMap {
    services: BTreeMap<(Proto, String), ServicePort>,
    by_addr: HashMap<(Proto, SocketAddr), ((Proto, String), FrontendKind)>,
    by_node_port: HashMap<(Proto, u16), (Proto, String)>,
}

impl ServiceMap {
    /// Parses `iptables-save` (or `ip6tables-save`) text; the nat table is enough, the
    /// filter table adds Services that have no endpoints.
    pub fn from_iptables_save(text: &str) -> Result<ServiceMap, RulesError> {
        Ok(ServiceMap::from_ports(iptables::parse(text)?))
    }

    /// The Service ports of parsed `iptables-save` tables.
    pub fn from_iptables_tables(tables: &IptablesTables) -> Result<ServiceMap, RulesError> {
        Ok(ServiceMap::from_ports(tables.ports()?))
    }

    /// The Service ports of a parsed nftables table.
    pub fn from_nft_table(table: &NftTable) -> Result<ServiceMap, RulesError> {
        Ok(ServiceMap::from_ports(table.ports()?))
    }

    /// Parses `nft -j list table ip kube-proxy` (or `ip6`) output.
    pub fn from_nft_json(text: &str) -> Result<ServiceMap, RulesError> {
        Ok(ServiceMap::from_ports(nft::parse(text)?))
    }

    /// Where Service names (from rule comments and chain names) enter observer: as
    /// printable text.
    fn from_ports(ports: Vec<ServicePort>) -> ServiceMap {
        let mut map = ServiceMap::default();
        for mut port in ports {
            port.name = printable(std::mem::take(&mut port.name), NAME_BYTES);
            map.insert(port);
        }
        map.reindex();
        map
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

    fn reindex(&mut self) {
        self.by_addr.clear();
        self.by_node_port.clear();
        for (key, port) in &self.services {
            for frontend in &port.frontends {
                match frontend.ip {
                    Some(ip) => {
                        let addr = SocketAddr::new(ip, frontend.port);
                        self.by_addr
                            .insert((port.proto, addr), (key.clone(), frontend.kind));
                    }
                    None => {
                        self.by_node_port
                            .insert((port.proto, frontend.port), key.clone());
                    }
                }
            }
        }
    }

    /// Adds another dump's Services (e.g. the IPv6 table, or legacy iptables next to
    /// nft); the same Service port gets the union of frontends and endpoints.
    pub fn merge(&mut self, other: ServiceMap) {
        for (_, port) in other.services {
            self.insert(port);
        }
        self.reindex();
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Service ports sorted by protocol, then name.
    pub fn services(&self) -> impl Iterator<Item = &ServicePort> {
        self.services.values()
    }

    /// The Service port a connection belongs to, by protocol and what the client dialed
    /// (ClusterIP/external/LB address exactly, NodePort by port on any address), and
    /// whether `backend` is still one of its endpoints (false = stale pin).
    pub fn lookup(
        &self,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
    ) -> Option<(&ServicePort, bool)> {
        let (key, _) = self.frontend(proto, original_dst)?;
        let port = self.services.get(key)?;
        Some((port, port.has_endpoint(backend)))
    }

    /// Which kind of frontend a connection entered through, by the same match as
    /// [`ServiceMap::lookup`]: an exact address first, then a NodePort by port.
    pub fn frontend_kind(&self, proto: Proto, original_dst: SocketAddr) -> Option<FrontendKind> {
        self.frontend(proto, original_dst).map(|(_, kind)| kind)
    }

    fn frontend(
        &self,
        proto: Proto,
        original_dst: SocketAddr,
    ) -> Option<(&(Proto, String), FrontendKind)> {
        match self.by_addr.get(&(proto, original_dst)) {
            Some((key, kind)) => Some((key, *kind)),
            None => self
                .by_node_port
                .get(&(proto, original_dst.port()))
                .map(|key| (key, FrontendKind::NodePort)),
        }
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
                time,
            })
            .collect()
    }
}

/// The message of an error that may quote the rules' text (a line, a word, a map's
/// name), as printable text.
fn error_text(message: String) -> String {
    printable(message, MESSAGE_BYTES)
}

/// `ns/name:port` from kube-proxy's parts; an unnamed port has no `:`.
fn service_port_name(namespace: &str, name: &str, port: &str) -> String {
    if port.is_empty() {
        format!("{namespace}/{name}")
    } else {
        format!("{namespace}/{name}:{port}")
    }
}

fn parse_proto(text: &str) -> Option<Proto> {
    match text {
        "tcp" | "6" => Some(Proto::Tcp),
        "udp" | "17" => Some(Proto::Udp),
        _ => None,
    }
}

fn frontend(kind: FrontendKind, ip: Option<std::net::IpAddr>, port: u16) -> Frontend {
    Frontend { kind, ip, port }
}

#[cfg(test)]
mod tests;
