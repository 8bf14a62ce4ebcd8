//! The session's ctnetlink side: at start, conntrack's DNATed entries of every namespace
//! (connections older than observer); while running, conntrack's destroy events, and
//! questions about entries found at start that no packet has reached yet.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::conntrack::listener::{Listener, Note};
use crate::conntrack::socket::{CtSocket, EVENT_BUFFER, GROUP_DESTROY};
use crate::model::ctview::{ConntrackView, CtKey};
use crate::model::record::ConnRecord;
use crate::model::update::ConnId;
use crate::naming::source::list_namespaces;

/// Entries found at start asked about per sweep (each question is one netlink round trip).
const CHECKS_PER_SWEEP: usize = 256;
/// Namespaces are listed again (for one seen in a kernel event that was not there at the
/// last listing) at most this often.
const RESCAN: Duration = Duration::from_secs(1);

pub struct Follower {
    listener: Listener,
    /// A request socket per followed namespace, for single-entry questions.
    requests: HashMap<u32, CtSocket>,
    pub view: ConntrackView,
    /// Every namespace at the last listing: inode -> a path that opens it.
    paths: HashMap<u32, PathBuf>,
    last_scan: Instant,
    /// Namespaces that could not be followed (warned about once).
    failed: std::collections::HashSet<u32>,
    warnings: Vec<String>,
    /// Times the kernel dropped destroy events for lack of buffer (`ENOBUFS`).
    pub overruns: u64,
}

impl Follower {
    /// Subscribes to destroy events in every namespace that has DNATed entries now, and
    /// returns those entries as open records (connections that began before observer).
    pub fn start(now: DateTime<Utc>) -> (Follower, Vec<(ConnId, ConnRecord)>) {
        let mut follower = Follower {
            listener: Listener::start(&[GROUP_DESTROY], EVENT_BUFFER),
            requests: HashMap::new(),
            view: ConntrackView::default(),
            paths: HashMap::new(),
            last_scan: Instant::now(),
            failed: Default::default(),
            warnings: Vec::new(),
            overruns: 0,
        };
        let mut found = Vec::new();
        for netns in list_namespaces() {
            found.extend(follower.follow(netns.inode, &netns.path, Some(now)));
            follower.paths.insert(netns.inode, netns.path);
        }
        (follower, found)
    }

    /// Follows `netns` (inode), seen in a kernel event, from now on.
    pub fn watch(&mut self, netns: u32) {
        if self.listener.watches(netns) || self.failed.contains(&netns) {
            return;
        }
        if !self.paths.contains_key(&netns) && self.last_scan.elapsed() >= RESCAN {
            self.last_scan = Instant::now();
            self.paths = list_namespaces()
                .into_iter()
                .map(|info| (info.inode, info.path))
                .collect();
        }
        if let Some(path) = self.paths.get(&netns).cloned() {
            // Followed only from now on: its entries are the kernel programs' to report.
            self.follow(netns, &path, None);
        }
    }

    /// Subscribes to destroy events in `netns`; with `found_at`, also reads its entries
    /// (then a namespace without DNATed entries is not followed: a socket would keep a
    /// deleted namespace alive).
    fn follow(
        &mut self,
        netns: u32,
        path: &Path,
        found_at: Option<DateTime<Utc>>,
    ) -> Vec<(ConnId, ConnRecord)> {
        let mut socket = match CtSocket::open_in(path, &[], 0) {
            Ok(socket) => socket,
            // A namespace deleted since it was listed has nothing left to follow.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                self.failed.insert(netns);
                return Vec::new();
            }
            Err(err) => {
                self.failed.insert(netns);
                let path = path.display();
                self.warnings
                    .push(format!("cannot read conntrack in {path}: {err}"));
                return Vec::new();
            }
        };
        // Subscribed before the dump: an entry destroyed in between is reported.
        if let Err(err) = self.listener.watch(netns, path) {
            self.failed.insert(netns);
            let path = path.display();
            self.warnings.push(format!(
                "cannot follow conntrack's destroy events in {path}: {err}"
            ));
        }
        let Some(now) = found_at else {
            self.requests.insert(netns, socket);
            return Vec::new();
        };
        let entries = match socket.dump() {
            Ok((entries, _)) => entries,
            Err(err) => {
                let path = path.display();
                self.warnings
                    .push(format!("cannot dump conntrack in {path}: {err}"));
                Vec::new()
            }
        };
        if !entries.iter().any(|entry| entry.dnat()) {
            self.listener.unwatch(netns);
            return Vec::new();
        }
        self.requests.insert(netns, socket);
        self.view.found_at_start(netns, entries, now)
    }

    /// The next note from the destroy-event listener.
    pub async fn next(&mut self) -> Note {
        self.listener.next().await
    }

    /// Notes already waiting.
    pub fn ready(&mut self) -> Vec<Note> {
        std::iter::from_fn(|| self.listener.try_next()).collect()
    }

    /// Asks conntrack about entries found at start that nothing has ended yet; returns
    /// those that ended.
    pub fn check(&mut self, now: DateTime<Utc>) -> Vec<(ConnId, ConnRecord)> {
        let mut ended = Vec::new();
        for key in self.view.to_check(CHECKS_PER_SWEEP) {
            let Some(socket) = self.requests.get_mut(&key.netns) else {
                continue;
            };
            let answer = match socket.get(&key.tuple()) {
                Ok(answer) => answer,
                Err(_) => continue,
            };
            ended.extend(self.view.checked(&key, answer.as_ref(), now));
        }
        ended
    }

    /// Whether conntrack has an entry for `key` now: a destroy event for that tuple was
    /// about an older entry (TCP reuses a port in TIME_WAIT). Unknown counts as gone.
    pub fn still_there(&mut self, key: &CtKey) -> bool {
        self.requests
            .get_mut(&key.netns)
            .is_some_and(|socket| matches!(socket.get(&key.tuple()), Ok(Some(_))))
    }

    /// Warnings not yet shown, once each.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

/// The key of a destroyed entry in a note, if it is one.
pub fn destroyed_key(note: &Note) -> Option<CtKey> {
    match note {
        Note::Event {
            netns,
            kind: crate::conntrack::CtKind::Destroy,
            entry,
        } => Some(CtKey::of_entry(*netns, entry)),
        _ => None,
    }
}
