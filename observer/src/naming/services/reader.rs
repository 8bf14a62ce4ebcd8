//! Reads one namespace's rules into a [`Snapshot`]: the parsed map, the Service
//! definitions that are new or changed since the last snapshot, and warnings (once per
//! namespace and cause). Runs inline (tests) or on a worker thread of its own, so that
//! the loop draining the kernel's ring buffer never waits for `nsenter` and its tools.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::nft_changes::Changes;
use super::parsed::ParsedRules;
use super::rules::ServiceMap;
use super::watch::{Seen, Watches};
use super::{DumpSource, Dumps};
use crate::model::record::{EndpointShare, EndpointsRecord, Frontend, Proto, ServiceRecord};

/// What one read of a namespace's rules produced.
pub struct Snapshot {
    pub netns: u32,
    /// `None` when nothing could be read: the last good rules stay in use.
    pub map: Option<ServiceMap>,
    /// When the read started: the rules are at least this fresh.
    pub read_at: Instant,
    /// How long the read took (a node with thousands of Services takes seconds).
    pub took: Duration,
    /// Services first seen, or whose frontends or endpoints changed.
    pub updates: Vec<ServiceRecord>,
    /// Endpoints added to or removed from Services already known.
    pub changes: Vec<EndpointsRecord>,
    pub warnings: Vec<String>,
    /// Whether kube-proxy's rules are (also) in legacy iptables tables.
    pub legacy: bool,
    /// Whether the namespace's rule changes are seen as they happen (nf_tables'
    /// announcements, legacy tables polled) so that it needs no re-reads on a timer:
    /// set by the worker that watches it.
    pub watched: bool,
    /// How many changes the watcher had seen when the read began.
    pub seen: u64,
    /// How many announced changes were applied instead of reading every table (0: a
    /// full read).
    pub patched: usize,
}

type Published = (Vec<Frontend>, Vec<EndpointShare>);

pub struct RuleReader {
    source: Box<dyn DumpSource>,
    published: HashMap<(u32, Proto, String), Published>,
    warned: HashSet<(u32, String)>,
    /// Each namespace's rules as last read whole (and patched since), with whether
    /// they are (also) in legacy tables.
    parsed: HashMap<u32, (ParsedRules, bool)>,
}

impl RuleReader {
    pub fn new(source: Box<dyn DumpSource>) -> Self {
        RuleReader {
            source,
            published: HashMap::new(),
            warned: HashSet::new(),
            parsed: HashMap::new(),
        }
    }

    /// Reads and parses the rules of `netns`; `read_at` stamps the snapshot. When only
    /// iptables-nft chains changed since the last read, only they are read.
    pub fn read(&mut self, netns: u32, read_at: Instant, changes: &Changes) -> Snapshot {
        let started = Instant::now();
        // Endpoint changes are dated by when the read began: the rules had changed by then.
        let wall = Utc::now();
        let mut warnings = Vec::new();
        let mut legacy = false;
        let mut patched = 0;
        let map = match self.patch(netns, changes) {
            Some((chains, map, in_legacy)) => {
                patched = chains;
                legacy = in_legacy;
                Some(map)
            }
            None => match self.source.dump(netns) {
                Ok(dumps) => {
                    legacy = uses_legacy(&dumps);
                    let (parsed, errors) = ParsedRules::parse(&dumps);
                    let map = parsed.map();
                    self.parsed.insert(netns, (parsed, legacy));
                    warnings.extend(errors);
                    if map.is_empty() {
                        warnings.extend(dumps.problems);
                    }
                    Some(map)
                }
                Err(cause) => {
                    self.parsed.remove(&netns);
                    warnings.push(cause.to_string());
                    None
                }
            },
        };
        let mut warnings: Vec<String> = warnings
            .into_iter()
            .filter(|cause| self.warned.insert((netns, cause.clone())))
            .map(|cause| {
                format!(
                    "cannot name connections in netns {netns}: {cause}; records get service null"
                )
            })
            .collect();
        // Rules the evaluator could not follow: once per namespace and rule.
        for warning in map.iter().flat_map(|map| map.warnings()) {
            if self.warned.insert((netns, warning.clone())) {
                warnings.push(format!("rules of netns {netns}: {warning}"));
            }
        }
        let (updates, changes) = match &map {
            Some(map) => self.compare(netns, map, wall),
            None => Default::default(),
        };
        Snapshot {
            netns,
            map,
            read_at,
            took: started.elapsed(),
            updates,
            changes,
            warnings,
            legacy,
            watched: false,
            seen: 0,
            patched,
        }
    }

    /// Patches the last read of `netns` with the chains `changes` names: (chains read,
    /// the map, legacy). `None` when it needs a full read (no earlier read, a change
    /// that is not a chain's, a chain that cannot be read).
    fn patch(&mut self, netns: u32, changes: &Changes) -> Option<(usize, ServiceMap, bool)> {
        if changes.everything {
            return None;
        }
        let (parsed, legacy) = self.parsed.get_mut(&netns)?;
        match parsed.patch(changes, self.source.as_mut(), netns) {
            Ok(chains) => Some((chains, parsed.map(), *legacy)),
            Err(why) => {
                log::debug!("reading all rules of netns {netns}: {why}");
                self.parsed.remove(&netns);
                None
            }
        }
    }

    /// The Services of `map` that are new or changed since the last read, and the
    /// endpoints that came and went in Services seen before (all of a vanished
    /// Service's endpoints leave).
    fn compare(
        &mut self,
        netns: u32,
        map: &ServiceMap,
        time: DateTime<Utc>,
    ) -> (Vec<ServiceRecord>, Vec<EndpointsRecord>) {
        let mut updates = Vec::new();
        let mut changes = Vec::new();
        let records = map.service_records(netns, Utc::now());
        let present: HashSet<(Proto, &str)> = records
            .iter()
            .map(|r| (r.proto, r.service.as_str()))
            .collect();
        let vanished: Vec<(u32, Proto, String)> = self
            .published
            .keys()
            .filter(|(ns, proto, name)| *ns == netns && !present.contains(&(*proto, name)))
            .cloned()
            .collect();
        for key in vanished {
            if let Some((_, before)) = self.published.remove(&key) {
                changes.extend(change(&key, &before, &[], time));
            }
        }
        for record in records {
            let key = (netns, record.proto, record.service.clone());
            let content = (record.frontends.clone(), record.endpoints.clone());
            match self.published.get(&key) {
                Some(before) if *before == content => continue,
                Some((_, before)) => changes.extend(change(&key, before, &record.endpoints, time)),
                None => {}
            }
            self.published.insert(key, content);
            updates.push(record);
        }
        (updates, changes)
    }
}

/// What changed between two endpoint lists of one Service, if anything.
fn change(
    (netns, proto, service): &(u32, Proto, String),
    before: &[EndpointShare],
    after: &[EndpointShare],
    time: DateTime<Utc>,
) -> Option<EndpointsRecord> {
    let before: BTreeSet<SocketAddr> = before.iter().map(|e| e.addr).collect();
    let after: BTreeSet<SocketAddr> = after.iter().map(|e| e.addr).collect();
    let added: Vec<SocketAddr> = after.difference(&before).copied().collect();
    let removed: Vec<SocketAddr> = before.difference(&after).copied().collect();
    (!added.is_empty() || !removed.is_empty()).then(|| EndpointsRecord {
        service: service.clone(),
        proto: *proto,
        netns: *netns,
        added,
        removed,
        time,
    })
}

/// Whether kube-proxy's rules are (also) in legacy iptables tables, whose changes
/// nothing announces.
fn uses_legacy(dumps: &Dumps) -> bool {
    dumps
        .dumps
        .iter()
        .any(|dump| dump.command.contains("-legacy-") && dump.text.contains("KUBE-SERVICES"))
}

/// What the worker is asked for.
pub enum Request {
    /// Read a namespace's rules: on a lookup (everything), or because the changes
    /// announced changed.
    Read(u32, Changes),
    /// The namer is gone.
    Stop,
}

/// The drain side's ends of a worker thread that reads rules on request.
pub struct Worker {
    pub requests: mpsc::Sender<Request>,
    pub snapshots: mpsc::Receiver<Snapshot>,
    /// What the node's Service datapath hides from observer, said once at start.
    pub notes: mpsc::Receiver<String>,
    /// Changes the watcher has seen per namespace.
    pub seen: Seen,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The watcher holds a sender too: the channel alone would never close.
        let _ = self.requests.send(Request::Stop);
    }
}

/// Starts a thread that reads each requested namespace and sends back its snapshot,
/// and watches each namespace it read for announced changes (which it then re-reads
/// unasked). It ends on [`Request::Stop`]. If no thread can be started, the reader is
/// handed back to be used inline.
///
/// A thread, not a tokio task: a read enters the namespace (setns applies to the calling
/// thread, see `netns::run_in`) and may run `iptables-save` or `nft -j` for seconds on a
/// big rule set, blocking work kept off the loop that drains the kernel; and `observer
/// rules` and replays use the same worker with no runtime at all.
pub fn spawn(reader: RuleReader) -> Result<Worker, Box<RuleReader>> {
    // Unbounded, and none can grow without bound: a request is sent once per namespace
    // first seen or per burst of announced changes (which the worker merges per
    // namespace, `next_batch`), and a snapshot or note once per read; dropping one would
    // leave a namespace unnamed, so none is ever refused.
    let (requests, requested) = mpsc::channel::<Request>();
    let (publish, snapshots) = mpsc::channel();
    let (hand_over, handed) = mpsc::channel::<RuleReader>();
    let (note, notes) = mpsc::channel::<String>();
    let again = requests.clone();
    let seen = Seen::default();
    let shared = seen.clone();
    let started = std::thread::Builder::new()
        .name("observer-rules".to_owned())
        .spawn(move || {
            let Ok(mut reader) = handed.recv() else {
                return;
            };
            if let Some(sentence) = reader.source.survey() {
                let _ = note.send(sentence);
            }
            let mut watches = Watches::new(shared);
            while let Some(batch) = next_batch(&requested) {
                for (netns, changes) in batch {
                    // Watch before reading: a change during the read is then announced.
                    let path = reader.source.netns_path(netns);
                    let announced = watches.ensure(netns, path.clone(), changed(&again));
                    let seen = watches.seen(netns);
                    let mut snapshot = reader.read(netns, Instant::now(), &changes);
                    snapshot.seen = seen;
                    // Legacy tables are polled from their first read on (the first poll
                    // re-reads once: they may have changed since this read began).
                    snapshot.watched = if snapshot.legacy {
                        watches.ensure_polled(netns, path, changed(&again))
                    } else {
                        announced
                    };
                    match snapshot.patched {
                        0 => log::debug!("read the rules of netns {netns} in {:?}", snapshot.took),
                        changes => log::debug!(
                            "patched the rules of netns {netns} with {changes} announced changes in {:?}",
                            snapshot.took
                        ),
                    }
                    if publish.send(snapshot).is_err() {
                        return;
                    }
                }
            }
        });
    match started {
        Ok(_) => {
            // The thread holds the receiver until it has the reader: this cannot fail.
            let _ = hand_over.send(reader);
            Ok(Worker {
                requests,
                snapshots,
                notes,
                seen,
            })
        }
        Err(_) => Err(Box::new(reader)),
    }
}

/// What the watcher calls when a namespace's rules changed: a request to re-read it
/// (false once the worker is gone).
fn changed(
    requests: &mpsc::Sender<Request>,
) -> impl FnOnce() -> Box<dyn FnMut(u32, Changes) -> bool + Send> + use<> {
    let requests = requests.clone();
    move || Box::new(move |netns, changes| requests.send(Request::Read(netns, changes)).is_ok())
}

/// The next namespaces to read, each once however often it was asked for (with
/// everything each request named); `None` when the worker should end.
fn next_batch(requested: &mpsc::Receiver<Request>) -> Option<Vec<(u32, Changes)>> {
    let mut batch: Vec<(u32, Changes)> = match requested.recv().ok()? {
        Request::Read(netns, changes) => vec![(netns, changes)],
        Request::Stop => return None,
    };
    while let Ok(request) = requested.try_recv() {
        match request {
            Request::Read(netns, changes) => {
                match batch.iter_mut().find(|(asked, _)| *asked == netns) {
                    Some((_, pending)) => pending.merge(changes),
                    None => batch.push((netns, changes)),
                }
            }
            Request::Stop => return None,
        }
    }
    Some(batch)
}
