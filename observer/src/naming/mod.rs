//! Names connections: maps a conntrack entry's network namespace (inode) to that
//! namespace's kube-proxy rules, read with `nsenter --net=<path> iptables-save` / `nft -j`.
//! On a kind host every node is a namespace reachable through its processes; inside a
//! node, the node's own namespace is the one to read.
//!
//! Reading rules costs a few processes, so re-reads are rate-limited per namespace: one
//! when the rules are older than `max_age`, and one when a lookup misses (unknown
//! address or a backend not in the rules) at most every `min_interval`. Rules that
//! cannot be read never stop capture: the connection gets `service: null` and the
//! namer emits one warning per namespace and cause.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chrono::Utc;

use crate::model::record::{EndpointShare, Frontend, FrontendKind, Proto, ServiceRecord};
use rules::ServiceMap;

pub mod pod_source;
pub mod pods;
pub mod rules;
pub mod source;

pub use source::{NetnsInfo, SystemSource, list_namespaces, netns_inode};

/// How a connection is named in the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    /// `ns/name:port`, or `None` when no rule in the namespace matches.
    pub service: Option<String>,
    /// Whether the backend is still an endpoint in the rules; `None` with no service.
    pub endpoint_in_rules: Option<bool>,
    /// Which kind of Service address the client dialed; `None` with no service.
    pub frontend: Option<FrontendKind>,
}

impl Naming {
    /// A connection named `service`; `endpoint_in_rules` says whether its backend is
    /// still an endpoint there.
    pub fn named(service: impl Into<String>, endpoint_in_rules: bool) -> Naming {
        Naming {
            service: Some(service.into()),
            endpoint_in_rules: Some(endpoint_in_rules),
            frontend: None,
        }
    }

    /// The same naming, entered through `door`.
    pub fn via(self, door: impl Into<Option<FrontendKind>>) -> Naming {
        Naming {
            frontend: door.into(),
            ..self
        }
    }
}

/// Which parser a dump needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpFormat {
    IptablesSave,
    NftJson,
}

/// One command's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dump {
    /// The command, for messages (`iptables-save`, `nft -j list table ip kube-proxy`).
    pub command: String,
    pub format: DumpFormat,
    pub text: String,
}

/// What reading one namespace's rules produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dumps {
    pub dumps: Vec<Dump>,
    /// Non-fatal causes (a tool missing, one command failing); they become warnings when
    /// the namespace ends up with no Services.
    pub problems: Vec<String>,
}

/// Where rules come from; tests inject fixture text, production runs commands.
pub trait DumpSource: Send {
    /// Dumps of kube-proxy's rules in network namespace `netns` (an inode). `Err` names
    /// why nothing could be read at all.
    fn dump(&mut self, netns: u32) -> Result<Dumps, String>;
}

/// Parses and merges every dump. Parse errors are returned as messages naming the
/// command; the other dumps still count.
pub fn parse_dumps(dumps: &Dumps) -> (ServiceMap, Vec<String>) {
    let mut map = ServiceMap::default();
    let mut errors = Vec::new();
    for dump in &dumps.dumps {
        let parsed = match dump.format {
            DumpFormat::IptablesSave => ServiceMap::from_iptables_save(&dump.text),
            DumpFormat::NftJson => ServiceMap::from_nft_json(&dump.text),
        };
        match parsed {
            Ok(parsed) => map.merge(parsed),
            Err(err) => errors.push(format!("{}: {err}", dump.command)),
        }
    }
    (map, errors)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamerConfig {
    /// Rules older than this are re-read on the next lookup, to see endpoint changes.
    pub max_age: Duration,
    /// A lookup miss re-reads the rules at most this often per namespace.
    pub min_interval: Duration,
}

impl Default for NamerConfig {
    fn default() -> Self {
        NamerConfig {
            max_age: Duration::from_secs(10),
            min_interval: Duration::from_secs(2),
        }
    }
}

struct Space {
    map: ServiceMap,
    read_at: Instant,
}

type Published = (Vec<Frontend>, Vec<EndpointShare>);

pub struct Namer {
    config: NamerConfig,
    source: Box<dyn DumpSource>,
    spaces: HashMap<u32, Space>,
    published: HashMap<(u32, Proto, String), Published>,
    updates: Vec<ServiceRecord>,
    warnings: Vec<String>,
    warned: HashSet<(u32, String)>,
}

impl Namer {
    pub fn new(config: NamerConfig, source: Box<dyn DumpSource>) -> Self {
        Namer {
            config,
            source,
            spaces: HashMap::new(),
            published: HashMap::new(),
            updates: Vec::new(),
            warnings: Vec::new(),
            warned: HashSet::new(),
        }
    }

    /// Names one connection by what its client dialed and the backend conntrack chose.
    pub fn name(
        &mut self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
        now: Instant,
    ) -> Naming {
        let expired = self.spaces.get(&netns).is_none_or(|space| {
            now.saturating_duration_since(space.read_at) >= self.config.max_age
        });
        if expired {
            self.refresh(netns, now);
        }
        let mut naming = self.lookup(netns, proto, original_dst, backend);
        let missed = naming.endpoint_in_rules != Some(true);
        let may_reread = self.spaces.get(&netns).is_some_and(|space| {
            now.saturating_duration_since(space.read_at) >= self.config.min_interval
        });
        if missed && may_reread {
            self.refresh(netns, now);
            naming = self.lookup(netns, proto, original_dst, backend);
        }
        naming
    }

    fn lookup(
        &self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
    ) -> Naming {
        let map = self.spaces.get(&netns).map(|space| &space.map);
        match map.and_then(|map| map.lookup(proto, original_dst, backend)) {
            Some((port, current)) => Naming::named(port.name.as_str(), current)
                .via(map.and_then(|map| map.frontend_kind(proto, original_dst))),
            None => Naming::default(),
        }
    }

    fn refresh(&mut self, netns: u32, now: Instant) {
        let map = match self.source.dump(netns) {
            Ok(dumps) => {
                let (map, errors) = parse_dumps(&dumps);
                for error in errors {
                    self.warn(netns, error);
                }
                if map.is_empty() {
                    for problem in dumps.problems {
                        self.warn(netns, problem);
                    }
                }
                map
            }
            Err(cause) => {
                self.warn(netns, cause);
                // Keep what was known: a transient failure should not un-name connections.
                match self.spaces.remove(&netns) {
                    Some(space) => space.map,
                    None => ServiceMap::default(),
                }
            }
        };
        for record in map.service_records(netns, Utc::now()) {
            let key = (netns, record.proto, record.service.clone());
            let content = (record.frontends.clone(), record.endpoints.clone());
            if self.published.get(&key) != Some(&content) {
                self.published.insert(key, content);
                self.updates.push(record);
            }
        }
        self.spaces.insert(netns, Space { map, read_at: now });
    }

    fn warn(&mut self, netns: u32, cause: String) {
        if self.warned.insert((netns, cause.clone())) {
            self.warnings.push(format!(
                "cannot name connections in netns {netns}: {cause}; records get service null"
            ));
        }
    }

    /// Services first seen, or whose frontends or endpoints changed, since the last call.
    pub fn take_service_updates(&mut self) -> Vec<ServiceRecord> {
        std::mem::take(&mut self.updates)
    }

    /// New warnings since the last call; each namespace and cause is reported once.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
