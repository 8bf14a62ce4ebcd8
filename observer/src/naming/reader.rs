//! Reads one namespace's rules into a [`Snapshot`]: the parsed map, the Service
//! definitions that are new or changed since the last snapshot, and warnings (once per
//! namespace and cause). Runs inline (tests) or on a worker thread of its own, so that
//! the loop draining the kernel's ring buffer never waits for `nsenter` and its tools.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chrono::Utc;

use super::rules::ServiceMap;
use super::{DumpSource, parse_dumps};
use crate::model::record::{EndpointShare, Frontend, Proto, ServiceRecord};

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
    pub warnings: Vec<String>,
}

type Published = (Vec<Frontend>, Vec<EndpointShare>);

pub struct RuleReader {
    source: Box<dyn DumpSource>,
    published: HashMap<(u32, Proto, String), Published>,
    warned: HashSet<(u32, String)>,
}

impl RuleReader {
    pub fn new(source: Box<dyn DumpSource>) -> Self {
        RuleReader {
            source,
            published: HashMap::new(),
            warned: HashSet::new(),
        }
    }

    /// Reads and parses the rules of `netns`; `read_at` stamps the snapshot.
    pub fn read(&mut self, netns: u32, read_at: Instant) -> Snapshot {
        let started = Instant::now();
        let mut warnings = Vec::new();
        let map = match self.source.dump(netns) {
            Ok(dumps) => {
                let (map, errors) = parse_dumps(&dumps);
                warnings.extend(errors);
                if map.is_empty() {
                    warnings.extend(dumps.problems);
                }
                Some(map)
            }
            Err(cause) => {
                warnings.push(cause);
                None
            }
        };
        let warnings = warnings
            .into_iter()
            .filter(|cause| self.warned.insert((netns, cause.clone())))
            .map(|cause| {
                format!(
                    "cannot name connections in netns {netns}: {cause}; records get service null"
                )
            })
            .collect();
        let mut updates = Vec::new();
        for record in map
            .iter()
            .flat_map(|map| map.service_records(netns, Utc::now()))
        {
            let key = (netns, record.proto, record.service.clone());
            let content = (record.frontends.clone(), record.endpoints.clone());
            if self.published.get(&key) != Some(&content) {
                self.published.insert(key, content);
                updates.push(record);
            }
        }
        Snapshot {
            netns,
            map,
            read_at,
            took: started.elapsed(),
            updates,
            warnings,
        }
    }
}

/// The drain side's ends of a worker thread that reads rules on request.
pub struct Worker {
    pub requests: mpsc::Sender<u32>,
    pub snapshots: mpsc::Receiver<Snapshot>,
}

/// Starts a thread that reads each requested namespace and sends back its snapshot.
/// It ends when the requests' sender is dropped. If no thread can be started, the
/// reader is handed back to be used inline.
pub fn spawn(reader: RuleReader) -> Result<Worker, RuleReader> {
    let (requests, requested) = mpsc::channel::<u32>();
    let (publish, snapshots) = mpsc::channel();
    let (hand_over, handed) = mpsc::channel::<RuleReader>();
    let started = std::thread::Builder::new()
        .name("observer-rules".to_owned())
        .spawn(move || {
            let Ok(mut reader) = handed.recv() else {
                return;
            };
            for netns in requested {
                let snapshot = reader.read(netns, Instant::now());
                log::debug!("read the rules of netns {netns} in {:?}", snapshot.took);
                if publish.send(snapshot).is_err() {
                    return;
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
            })
        }
        Err(_) => Err(reader),
    }
}
