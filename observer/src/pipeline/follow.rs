//! The session's ctnetlink side: at start, conntrack's DNATed entries of every namespace
//! (connections older than observer); while running, conntrack's destroy events, and
//! questions about entries found at start that no packet has reached yet.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::conntrack::listener::{Listener, Note};
use crate::conntrack::socket::{CtSocket, GROUP_DESTROY};
use crate::model::ctview::{ConntrackView, CtKey};
use crate::model::record::ConnRecord;
use crate::model::update::ConnId;
use crate::naming::source::list_namespaces;

/// Entries found at start asked about per sweep (each question is one netlink round trip).
const CHECKS_PER_SWEEP: usize = 256;
/// An unknown namespace (seen in a kernel event) is looked up at most this often.
const RESCAN: Duration = Duration::from_secs(5);

pub struct Follower {
    listener: Listener,
    /// A request socket per followed namespace, for single-entry questions.
    requests: HashMap<u32, CtSocket>,
    pub view: ConntrackView,
    last_scan: Option<Instant>,
    warnings: Vec<String>,
    /// Times the kernel dropped destroy events for lack of buffer (`ENOBUFS`).
    pub overruns: u64,
}

impl Follower {
    /// Subscribes to destroy events in every namespace that has DNATed entries now, and
    /// returns those entries as open records (connections that began before observer).
    pub fn start(now: DateTime<Utc>) -> (Follower, Vec<(ConnId, ConnRecord)>) {
        let mut follower = Follower {
            listener: Listener::start(&[GROUP_DESTROY]),
            requests: HashMap::new(),
            view: ConntrackView::default(),
            last_scan: None,
            warnings: Vec::new(),
            overruns: 0,
        };
        let mut found = Vec::new();
        for netns in list_namespaces() {
            found.extend(follower.follow(netns.inode, &netns.path, Some(now)));
        }
        (follower, found)
    }

    /// Follows `netns` (inode), seen in a kernel event, from now on.
    pub fn watch(&mut self, netns: u32) {
        if self.listener.watches(netns) {
            return;
        }
        if self.last_scan.is_some_and(|last| last.elapsed() < RESCAN) {
            return;
        }
        self.last_scan = Some(Instant::now());
        if let Some(info) = list_namespaces().into_iter().find(|n| n.inode == netns) {
            // Followed only from now on: its entries are the kernel programs' to report.
            self.follow(netns, &info.path, None);
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
        let mut socket = match CtSocket::open_in(path, &[]) {
            Ok(socket) => socket,
            Err(err) => {
                let path = path.display();
                self.warnings
                    .push(format!("cannot read conntrack in {path}: {err}"));
                return Vec::new();
            }
        };
        // Subscribed before the dump: an entry destroyed in between is reported.
        if let Err(err) = self.listener.watch(netns, path) {
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
