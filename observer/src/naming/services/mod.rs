//! Names connections: maps a conntrack entry's network namespace (inode) to that
//! namespace's kube-proxy rules, read by running `iptables-save` / `nft -j` inside that namespace.
//! On a kind host every node is a namespace reachable through its processes; inside a
//! node, the node's own namespace is the one to read.
//!
//! Reading rules costs a few processes, so re-reads are rate-limited per namespace: one
//! when the rules are older than `max_age`, and one when a lookup misses (unknown
//! address or a backend not in the rules) at most every `min_interval`. A namespace
//! whose changes are seen as they happen ([`watch`]: nf_tables announces them, legacy
//! tables are fingerprinted) is re-read when they change instead, and on the timer
//! only every `watched_max_age` (a safety net); a miss there (a stale pin) re-reads
//! nothing, it waits for the re-read of a change seen since the last read, or, for a
//! connection decided after that read, of one announced but not read yet.
//! Rules that cannot be read never stop capture: the connection gets `service: null`
//! and the namer emits one warning per namespace and cause.
//!
//! In a session the reads run on a worker thread ([`Namer::spawn`]): a lookup names
//! from the rules published so far and never waits. A lookup that asked for a re-read
//! says which snapshot its name depends on ([`Lookup::wait_for`]), so that a finished
//! connection can be held back briefly ([`held_connections`]) instead of being written unnamed.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::model::record::{ConnRecord, EndpointsRecord, FrontendKind, Name, Proto, ServiceRecord};
use reader::{Request, RuleReader};
use rules::ServiceMap;

pub mod error;
pub mod held_connections;
pub mod legacy_fingerprint;
pub mod locality;
pub mod nft_changes;
mod parsed;
mod reader;
pub mod rules;
pub mod source;
pub mod survey;
pub mod watch;

pub use error::{RulesPatchError, RulesReadError, WatchError, WatchFailure};
pub use source::{NetnsInfo, SystemSource, list_namespaces, netns_inode};

/// How a connection is named in the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    /// `ns/name:port`, or `None` when no rule in the namespace matches.
    pub service: Option<Name>,
    /// Whether the backend is still an endpoint in the rules; `None` with no service.
    pub endpoint_in_rules: Option<bool>,
    /// Which kind of Service address the client dialed; `None` with no service.
    pub frontend: Option<FrontendKind>,
}

impl Naming {
    /// Writes this naming into a connection record's name fields.
    pub fn apply_to(self, record: &mut ConnRecord) {
        record.service = self.service;
        record.endpoint_in_rules = self.endpoint_in_rules;
        record.frontend = self.frontend;
    }

    /// A connection named `service`; `endpoint_in_rules` says whether its backend is
    /// still an endpoint there.
    pub fn named(service: impl Into<Name>, endpoint_in_rules: bool) -> Naming {
        Naming {
            service: Some(service.into()),
            endpoint_in_rules: Some(endpoint_in_rules),
            frontend: None,
        }
    }

    /// The same naming, entered through `frontend`.
    pub fn via(self, frontend: impl Into<Option<FrontendKind>>) -> Naming {
        Naming {
            frontend: frontend.into(),
            ..self
        }
    }
}

/// What the rules say of a connection they turned away before any DNAT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The Service port dialed, when the address was one of its frontends.
    pub service: Option<Name>,
    pub frontend: Option<FrontendKind>,
    pub reason: crate::model::record::RejectReason,
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
    fn dump(&mut self, netns: u32) -> Result<Dumps, RulesReadError>;

    /// One sentence on what the node's Service datapath hides from observer (no
    /// kube-proxy rules anywhere, IPVS, a kube-proxy-free BPF datapath), looked at once
    /// at start; `None` (fixtures, a node where kube-proxy's rules are all there is).
    fn survey(&mut self) -> Option<String> {
        None
    }

    /// A path that opens network namespace `netns`, to watch its rules' changes;
    /// `None` (fixtures) keeps its rules on the re-read timer.
    fn netns_path(&mut self, _netns: u32) -> Option<PathBuf> {
        None
    }

    /// What `iptables -t TABLE -S CHAIN` prints for one iptables-nft chain of `netns`;
    /// `Err` (fixtures) says why not, and the namespace is read whole instead.
    fn chain(
        &mut self,
        _netns: u32,
        _chain: &nft_changes::ChainRef,
    ) -> Result<String, RulesReadError> {
        Err(RulesReadError::NoSingleChains)
    }

    /// What `nft -j list VERB ip|ip6 kube-proxy NAME` prints for one chain, map or set
    /// (`verb`) of kube-proxy's nftables table in `netns`; `None` when it does not exist.
    fn nft_object(
        &mut self,
        _netns: u32,
        _family: nft_changes::Family,
        _verb: &str,
        _name: &str,
    ) -> Result<Option<String>, RulesReadError> {
        Err(RulesReadError::NoSingleObjects)
    }
}

/// Parses and merges every dump. Parse errors are returned as messages naming the
/// command; the other dumps still count.
pub fn parse_dumps(dumps: &Dumps) -> (ServiceMap, Vec<String>) {
    let (parsed, errors) = parsed::ParsedRules::parse(dumps);
    (parsed.map(), errors)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamerConfig {
    /// Rules older than this are re-read on the next lookup, to see endpoint changes.
    pub max_age: Duration,
    /// A lookup miss re-reads the rules at most this often per namespace.
    pub min_interval: Duration,
    /// Rules whose changes are announced are re-read after this long anyway: a safety
    /// net only (a lost announcement shows as a socket overflow, which re-reads), kept
    /// slow because one read of 5,000 Services costs seconds of CPU.
    pub watched_max_age: Duration,
}

impl Default for NamerConfig {
    fn default() -> Self {
        NamerConfig {
            max_age: Duration::from_secs(10),
            min_interval: Duration::from_secs(2),
            watched_max_age: Duration::from_secs(15 * 60),
        }
    }
}

struct Space {
    map: ServiceMap,
    read_at: Instant,
    /// How long the last read took.
    took: Duration,
    /// How many snapshots of this namespace were taken in: a name that waits for a
    /// re-read waits for the next one.
    generation: u64,
    /// Whether its changes are seen as they happen (then `watched_max_age` applies).
    watched: bool,
    /// How many changes the watcher had seen when these rules were read.
    seen: u64,
}

/// Rules are re-read no sooner than this many times the last read's duration.
const READ_SHARE: u32 = 4;

/// Where reads happen: inline (tests, and when no thread can be started) or on a worker.
enum Reads {
    Inline(RuleReader),
    Worker(reader::Worker),
}

/// What a name depends on: namespace, protocol, original destination, backend.
type NameKey = (u32, Proto, SocketAddr, SocketAddr);

/// Names remembered at most (then forgotten all at once): a bound on memory when
/// backends churn.
const NAMES_MAX: usize = 65_536;

/// The generation a name waits for when its namespace's rules were never read.
pub const FIRST_READ: u64 = 1;

/// A connection's name, and whether it should wait for a re-read of its rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub naming: Naming,
    /// Set when the rules were missing, older than `max_age`, or missed the connection
    /// and a re-read is under way: the name is final once the namespace's generation
    /// reaches this.
    pub wait_for: Option<u64>,
}

pub struct Namer {
    config: NamerConfig,
    reads: Reads,
    spaces: FxHashMap<u32, Space>,
    /// Names already looked up in the rules taken in last: a lookup is then one hash
    /// of plain data. A namespace's are forgotten when its rules are taken in again.
    names: FxHashMap<NameKey, Naming>,
    /// Namespaces whose re-read the worker has not answered yet.
    in_flight: HashSet<u32>,
    updates: Vec<ServiceRecord>,
    changes: Vec<EndpointsRecord>,
    warnings: Vec<String>,
    /// Sentences on what observer cannot see or follow, for the summary line.
    blind_spots: Vec<String>,
}

impl Namer {
    /// A namer that reads rules inline, on the caller's thread.
    pub fn new(config: NamerConfig, source: Box<dyn DumpSource>) -> Self {
        Namer::with_reads(config, Reads::Inline(RuleReader::new(source)))
    }

    /// A namer whose reads run on a worker thread: lookups never wait for them. (If
    /// no thread can be started, it reads inline.)
    pub fn spawn(config: NamerConfig, source: Box<dyn DumpSource>) -> Self {
        let reads = match reader::spawn(RuleReader::new(source)) {
            Ok(worker) => Reads::Worker(worker),
            Err(reader) => Reads::Inline(*reader),
        };
        Namer::with_reads(config, reads)
    }

    fn with_reads(config: NamerConfig, reads: Reads) -> Self {
        Namer {
            config,
            reads,
            spaces: FxHashMap::default(),
            names: FxHashMap::default(),
            in_flight: HashSet::new(),
            updates: Vec::new(),
            changes: Vec::new(),
            warnings: Vec::new(),
            blind_spots: Vec::new(),
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
        self.lookup(netns, proto, original_dst, backend, None, now)
            .naming
    }

    /// Names one connection from the rules known now, asking for a re-read when they
    /// are missing or older than `max_age`, or (at most every `min_interval`) when they
    /// do not have the address or the backend. `started`: when the connection's DNAT
    /// was decided, where known. Never blocks on a worker.
    pub fn lookup(
        &mut self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
        started: Option<Instant>,
        now: Instant,
    ) -> Lookup {
        self.poll();
        let mut wants = self.outdated(netns, false, now);
        if wants {
            self.request(netns, now);
        }
        let key = (netns, proto, original_dst, backend);
        let mut naming = self.remembered(key);
        let missed = naming.endpoint_in_rules != Some(true);
        // A change was seen since the rules were read: its re-read is on the way. And
        // where changes are watched, a backend the kernel picked after these rules were
        // read, which they lack, was put in by a change not read yet (announced, but a
        // busy node has not taken it in): wait for it too (at most the hold's limit).
        if missed && (self.changed_since_read(netns) || self.decided_since_read(netns, started)) {
            let wait_for = Some(self.generation(netns) + 1);
            return Lookup { naming, wait_for };
        }
        if missed && self.outdated(netns, true, now) {
            wants = true;
            self.request(netns, now);
            naming = self.remembered(key);
        }
        let wait_for =
            (wants && self.in_flight.contains(&netns)).then(|| self.generation(netns) + 1);
        Lookup { naming, wait_for }
    }

    /// Whether the rules of `netns` are missing or too old (for a miss, `min_interval`).
    /// Rules that take long to read are re-read less often: reading keeps the worker
    /// busy at most a quarter of the time (a node with thousands of Services). Rules
    /// whose changes are seen as they happen are current: a miss there (a stale pin)
    /// re-reads nothing.
    fn outdated(&self, netns: u32, missed: bool, now: Instant) -> bool {
        self.spaces.get(&netns).is_none_or(|space| {
            let age = now.saturating_duration_since(space.read_at);
            let floor = space.took * READ_SHARE;
            if space.watched {
                return age >= self.config.watched_max_age.max(floor);
            }
            age >= self.config.max_age.max(floor)
                || (missed && age >= self.config.min_interval.max(floor))
        })
    }

    /// Whether a connection that `started` then was decided by rules newer than the
    /// watched rules of `netns` known now.
    fn decided_since_read(&self, netns: u32, started: Option<Instant>) -> bool {
        let (Reads::Worker(_), Some(space), Some(started)) =
            (&self.reads, self.spaces.get(&netns), started)
        else {
            return false;
        };
        space.watched && started > space.read_at
    }

    /// Whether the watcher saw `netns` change after its rules were last read.
    fn changed_since_read(&self, netns: u32) -> bool {
        let (Reads::Worker(worker), Some(space)) = (&self.reads, self.spaces.get(&netns)) else {
            return false;
        };
        space.watched
            && worker
                .seen
                .lock()
                .is_ok_and(|seen| seen.get(&netns).is_some_and(|n| *n > space.seen))
    }

    /// Why a connection from `client` to `dialed` that was never DNATed was turned
    /// away, and the Service port and frontend kind it dialed, from the rules known
    /// now; asks for a re-read when they are missing or older than `max_age`. `None`
    /// when the rules explain no such refusal of Service traffic.
    pub fn lookup_refusal(
        &mut self,
        netns: u32,
        proto: Proto,
        dialed: SocketAddr,
        client: SocketAddr,
        now: Instant,
    ) -> Option<Refusal> {
        self.poll();
        if self.outdated(netns, false, now) {
            self.request(netns, now);
        }
        let map = &self.spaces.get(&netns)?.map;
        let (reason, port, frontend) = map.refusal(proto, dialed, client)?;
        Some(Refusal {
            service: port.map(|port| port.name.as_str().into()),
            frontend,
            reason,
        })
    }

    /// What the rules known now expected of a connection from `client` (the node
    /// itself, when known) to `original_dst`: the endpoint set its client's case picks
    /// from. `None` when the namespace's rules name no such frontend.
    pub fn expect(
        &self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        client: SocketAddr,
        client_is_node: Option<bool>,
    ) -> Option<rules::Expectation> {
        let space = self.spaces.get(&netns)?;
        space
            .map
            .expect(proto, original_dst, client, client_is_node)
    }

    /// The policy of [`Namer::expect`]'s case, without copying its endpoints.
    pub fn policy(
        &self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        client: SocketAddr,
        client_is_node: Option<bool>,
    ) -> Option<rules::Policy> {
        let space = self.spaces.get(&netns)?;
        space
            .map
            .policy(proto, original_dst, client, client_is_node)
    }

    /// The name from the rules known now, without asking for anything.
    pub fn cached(
        &self,
        netns: u32,
        proto: Proto,
        original_dst: SocketAddr,
        backend: SocketAddr,
    ) -> Naming {
        let map = self.spaces.get(&netns).map(|space| &space.map);
        match map.and_then(|map| map.lookup(proto, original_dst, backend)) {
            Some((port, current)) => Naming {
                service: Some(port.name.as_str().into()),
                endpoint_in_rules: current,
                frontend: map.and_then(|map| map.frontend_kind(proto, original_dst)),
            },
            None => Naming::default(),
        }
    }

    /// [`Namer::cached`], remembered until the namespace's rules are taken in again.
    fn remembered(&mut self, key: NameKey) -> Naming {
        if let Some(naming) = self.names.get(&key) {
            return naming.clone();
        }
        let (netns, proto, original_dst, backend) = key;
        let naming = self.cached(netns, proto, original_dst, backend);
        if self.names.len() >= NAMES_MAX {
            self.names.clear();
        }
        self.names.insert(key, naming.clone());
        naming
    }

    /// How many snapshots of `netns` were taken in (0: its rules were never read).
    pub fn generation(&self, netns: u32) -> u64 {
        self.spaces.get(&netns).map_or(0, |space| space.generation)
    }

    fn request(&mut self, netns: u32, now: Instant) {
        match &mut self.reads {
            Reads::Inline(reader) => {
                let snapshot = reader.read(netns, now, &nft_changes::Changes::everything());
                self.absorb(snapshot);
            }
            Reads::Worker(worker) => {
                if self.in_flight.insert(netns)
                    && worker
                        .requests
                        .send(Request::Read(netns, nft_changes::Changes::everything()))
                        .is_err()
                {
                    // The worker is gone (it cannot end on its own): keep what is known.
                    self.in_flight.remove(&netns);
                }
            }
        }
    }

    /// Takes in every snapshot the worker has published, without waiting.
    pub fn poll(&mut self) {
        while let Some(snapshot) = self.worker_snapshot(None) {
            self.absorb(snapshot);
        }
        let notes: Vec<String> = match &self.reads {
            Reads::Worker(worker) => worker.notes.try_iter().collect(),
            Reads::Inline(_) => Vec::new(),
        };
        for note in notes {
            self.note_blind_spot(note.clone());
            self.warnings.push(note);
        }
    }

    /// Waits until the worker publishes a snapshot or `deadline` passes (only for the
    /// end of a session, when nothing else is left to do). Returns whether one came.
    pub fn wait(&mut self, deadline: Instant) -> bool {
        match self.worker_snapshot(Some(deadline)) {
            Some(snapshot) => {
                self.absorb(snapshot);
                self.poll();
                true
            }
            None => false,
        }
    }

    fn worker_snapshot(&self, deadline: Option<Instant>) -> Option<reader::Snapshot> {
        let Reads::Worker(worker) = &self.reads else {
            return None;
        };
        match deadline {
            None => worker.snapshots.try_recv().ok(),
            Some(deadline) => worker
                .snapshots
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .ok(),
        }
    }

    fn absorb(&mut self, snapshot: reader::Snapshot) {
        let netns = snapshot.netns;
        self.in_flight.remove(&netns);
        self.names.retain(|key, _| key.0 != netns);
        let previous = self.spaces.remove(&netns);
        let generation = previous.as_ref().map_or(0, |space| space.generation) + 1;
        // A failed read keeps what was known: a transient failure should not un-name.
        let map = snapshot
            .map
            .or(previous.map(|space| space.map))
            .unwrap_or_default();
        self.spaces.insert(
            netns,
            Space {
                map,
                read_at: snapshot.read_at,
                took: snapshot.took,
                generation,
                watched: snapshot.watched,
                seen: snapshot.seen,
            },
        );
        self.updates.extend(snapshot.updates);
        self.changes.extend(snapshot.changes);
        for warning in &snapshot.warnings {
            if warning.starts_with("rules of netns ") {
                self.note_blind_spot(warning.clone());
            }
        }
        self.warnings.extend(snapshot.warnings);
    }

    /// Keeps a sentence on what observer cannot see or follow, once.
    fn note_blind_spot(&mut self, sentence: String) {
        if self.blind_spots.len() < 100 && !self.blind_spots.contains(&sentence) {
            self.blind_spots.push(sentence);
        }
    }

    /// What observer could not see or follow of the node's Service datapath so far.
    pub fn blind_spots(&self) -> &[String] {
        &self.blind_spots
    }

    /// Services first seen, or whose frontends or endpoints changed, since the last call.
    pub fn take_service_updates(&mut self) -> Vec<ServiceRecord> {
        std::mem::take(&mut self.updates)
    }

    /// Endpoints that joined or left Services already known, since the last call.
    pub fn take_endpoint_changes(&mut self) -> Vec<EndpointsRecord> {
        std::mem::take(&mut self.changes)
    }

    /// Asks for the first read of `netns` (and so, where possible, for watching it)
    /// when a connection is first seen there, before any lookup: changes to its rules
    /// are then seen as they happen.
    pub fn prime(&mut self, netns: u32, now: Instant) {
        self.poll();
        if !self.spaces.contains_key(&netns) {
            self.request(netns, now);
        }
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
#[cfg(test)]
mod worker_tests;
