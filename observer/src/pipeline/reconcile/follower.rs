//! The session's ctnetlink side: at start, conntrack's DNATed entries of every namespace
//! (connections older than observer); while running, conntrack's destroy events, and
//! questions about entries found at start that no packet has reached yet.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::conntrack::listener::{Listener, Note};
use crate::conntrack::socket::{CtSocket, EVENT_BUFFER, GROUP_DESTROY};
use crate::conntrack::{CtEntry, NETLINK_MISSING, netlink_missing};
use crate::kernel::flowtables::watch::Watch;
use observer_common::conn::ConnState;

use super::matching::{ConntrackMatcher, CtKey, lacks_destroy_events};
use crate::model::record::{ConnRecord, ConntrackEnds};
use crate::model::update::ConnId;
use crate::naming::services::source::list_namespaces;

/// Entries found at start asked about per sweep (each question is one netlink round trip).
const CHECKS_PER_SWEEP: usize = 256;
/// Namespaces are listed again (to follow new ones and let go of deleted ones) at most
/// this often.
const RESCAN: Duration = Duration::from_secs(5);
/// conntrack's statistics are read in each followed namespace this often.
const STATS_EVERY: Duration = Duration::from_secs(5);

pub struct Follower {
    /// How destroyed entries are found: with `DestroyEvents`, the listener subscribes
    /// to them in every namespace; otherwise it only reads conntrack's statistics.
    pub ends: ConntrackEnds,
    listener: Listener,
    /// A request socket per followed namespace, for single-entry questions.
    requests: HashMap<u32, CtSocket>,
    pub matcher: ConntrackMatcher,
    /// Every namespace at the last listing: inode -> a path that opens it.
    paths: HashMap<u32, PathBuf>,
    last_scan: Instant,
    /// Namespaces that could not be followed (warned about once).
    failed: std::collections::HashSet<u32>,
    warnings: Vec<String>,
    /// The kernel has no conntrack netlink interface (said once, for every namespace).
    netlink_missing: bool,
    /// Times the kernel dropped destroy events for lack of buffer (`ENOBUFS`).
    pub overruns: u64,
    /// When the destroy events of each namespace were subscribed to (monotonic ns).
    subscribed_at: HashMap<u32, u64>,
    /// Kernel connections without destroy events, by how often they were asked about.
    unreported: HashMap<CtKey, u64>,
    /// Under `net_dev_queue`: the flowtables of the namespaces connections were seen in
    /// (the netfilter hook reads those of the namespaces it links itself).
    flowtables: Option<(Watch, HashSet<u32>)>,
}

impl Follower {
    /// Reads every namespace's DNATed entries, returned as open records (connections that
    /// began before observer); with `ConntrackEnds::DestroyEvents`, subscribes to destroy
    /// events in every namespace first.
    ///
    /// Every namespace, not only those with DNATed entries yet: with conntrack's default
    /// `nf_conntrack_events=2`, the kernel keeps events only for entries created while
    /// someone listens in their namespace, so a subscription made after a connection
    /// began would never hear of its end.
    pub fn start(now: DateTime<Utc>, ends: ConntrackEnds) -> (Follower, Vec<(ConnId, ConnRecord)>) {
        let groups: &[u32] = match ends {
            ConntrackEnds::DestroyEvents => &[GROUP_DESTROY],
            ConntrackEnds::Revalidated => &[],
        };
        let mut follower = Follower {
            ends,
            listener: Listener::start(groups, EVENT_BUFFER, Some(STATS_EVERY)),
            requests: HashMap::new(),
            matcher: ConntrackMatcher::default(),
            paths: HashMap::new(),
            last_scan: Instant::now(),
            failed: Default::default(),
            warnings: Vec::new(),
            netlink_missing: false,
            overruns: 0,
            subscribed_at: HashMap::new(),
            unreported: HashMap::new(),
            flowtables: None,
        };
        let mut found = Vec::new();
        for netns in list_namespaces() {
            found.extend(follower.follow(netns.inode, &netns.path, Some(now)));
            follower.paths.insert(netns.inode, netns.path);
        }
        (follower, found)
    }

    /// Follows `netns` (inode), seen in a kernel event, from now on (when it was created
    /// after the last listing).
    pub fn watch(&mut self, netns: u32) {
        if self.listener.watches(netns) || self.failed.contains(&netns) {
            return;
        }
        if !self.paths.contains_key(&netns) {
            self.rescan();
        }
    }

    /// Lists the namespaces again, at most every `RESCAN`: follows new ones from now on
    /// (their entries are the kernel programs' to report) and lets go of deleted ones (a
    /// socket would keep a deleted namespace alive), which it returns.
    pub fn rescan(&mut self) -> Vec<u32> {
        if self.last_scan.elapsed() < RESCAN {
            return Vec::new();
        }
        self.last_scan = Instant::now();
        self.paths = list_namespaces()
            .into_iter()
            .map(|info| (info.inode, info.path))
            .collect();
        let gone: Vec<u32> = self
            .requests
            .keys()
            .filter(|netns| !self.paths.contains_key(netns))
            .copied()
            .collect();
        for &netns in &gone {
            self.requests.remove(&netns);
            self.subscribed_at.remove(&netns);
            self.listener.unwatch(netns);
        }
        self.failed.retain(|netns| self.paths.contains_key(netns));
        let new: Vec<(u32, PathBuf)> = self
            .paths
            .iter()
            .filter(|(netns, _)| !self.listener.watches(**netns) && !self.failed.contains(netns))
            .map(|(netns, path)| (*netns, path.clone()))
            .collect();
        for (netns, path) in new {
            self.follow(netns, &path, None);
        }
        gone
    }

    /// Subscribes to destroy events in `netns`; with `found_at`, also reads its entries.
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
                if netlink_missing(&err) {
                    self.say_netlink_missing();
                } else {
                    let path = path.display();
                    self.warnings
                        .push(format!("cannot read conntrack in {path}: {err}"));
                }
                return Vec::new();
            }
        };
        // Subscribed before the dump: an entry destroyed in between is reported.
        match self.listener.watch(netns, path) {
            Ok(()) => {
                self.subscribed_at
                    .insert(netns, crate::pipeline::monotonic_ns());
            }
            Err(err) => {
                self.failed.insert(netns);
                let path = path.display();
                self.warnings.push(format!(
                    "cannot follow conntrack's destroy events in {path}: {err}"
                ));
            }
        }
        let Some(now) = found_at else {
            self.requests.insert(netns, socket);
            return Vec::new();
        };
        let entries = match socket.dump() {
            Ok((entries, _)) => entries,
            Err(err) if netlink_missing(&err) => {
                self.say_netlink_missing();
                Vec::new()
            }
            Err(err) => {
                let path = path.display();
                self.warnings
                    .push(format!("cannot dump conntrack in {path}: {err}"));
                Vec::new()
            }
        };
        self.requests.insert(netns, socket);
        self.matcher.found_at_start(netns, entries, now)
    }

    /// Warns that conntrack's netlink interface is missing, once: it is missing for
    /// every namespace at once (one module serves them all).
    fn say_netlink_missing(&mut self) {
        if !std::mem::replace(&mut self.netlink_missing, true) {
            self.warnings.push(NETLINK_MISSING.to_owned());
        }
    }

    /// The next note from the destroy-event listener.
    pub async fn next(&mut self) -> Note {
        self.listener.next().await
    }

    /// Notes already waiting.
    pub fn ready(&mut self) -> Vec<Note> {
        std::iter::from_fn(|| self.listener.try_next()).collect()
    }

    /// Stops the listener: the notes not yet taken, with a last reading of statistics.
    pub fn stop(self) -> Vec<Note> {
        self.listener.stop()
    }

    /// Asks conntrack about entries found at start that nothing has ended yet; returns
    /// those that ended.
    pub fn check(&mut self, now: DateTime<Utc>) -> Vec<(ConnId, ConnRecord)> {
        let mut ended = Vec::new();
        for key in self.matcher.to_check(CHECKS_PER_SWEEP) {
            let Some(socket) = self.requests.get_mut(&key.netns) else {
                continue;
            };
            let answer = match socket.get(&key.tuple()) {
                Ok(answer) => answer,
                Err(_) => continue,
            };
            ended.extend(self.matcher.checked(&key, answer.as_ref(), now));
        }
        ended
    }

    /// Kernel connections (of the table `entries`) whose conntrack entry is gone though
    /// no destroy event can say so: conntrack keeps events only for entries created
    /// while someone listened in their namespace (`nf_conntrack_events=2`), so those
    /// that began before observer (adopted, `start_seen: false`) or before their
    /// namespace was followed are asked about, at most `CHECKS_PER_SWEEP` per sweep, the
    /// least recently asked first. A question that fails asks again at the next sweep.
    pub fn unreported_gone(&mut self, entries: &[(u64, ConnState)]) -> Vec<(ConnId, CtKey)> {
        let mut candidates: Vec<(u64, CtKey, ConnId)> = entries
            .iter()
            .filter(|(_, state)| {
                lacks_destroy_events(state, self.subscribed_at.get(&state.netns).copied())
            })
            .map(|(conntrack, state)| {
                let key = CtKey::of_state(state);
                let id = ConnId::of(*conntrack, state);
                (self.unreported.get(&key).copied().unwrap_or(0), key, id)
            })
            .collect();
        let live: std::collections::HashSet<CtKey> =
            candidates.iter().map(|(_, key, _)| *key).collect();
        self.unreported.retain(|key, _| live.contains(key));
        candidates.sort_by_key(|(asked, key, _)| (*asked, key.netns, key.client, key.dialed));
        candidates.truncate(CHECKS_PER_SWEEP);
        let mut gone = Vec::new();
        for (asked, key, id) in candidates {
            self.unreported.insert(key, asked + 1);
            let Some(socket) = self.requests.get_mut(&key.netns) else {
                continue;
            };
            match socket.get(&key.tuple()) {
                Ok(Some(entry)) if key.is(&entry) => {}
                Ok(_) => gone.push((id, key)),
                Err(_) => {}
            }
        }
        gone
    }

    /// Whether conntrack has the entry `key` now: a destroy event with its tuples was
    /// about an older entry (TCP reuses a port in TIME_WAIT). Unknown counts as gone.
    pub fn still_there(&mut self, key: &CtKey) -> bool {
        self.requests.get_mut(&key.netns).is_some_and(
            |socket| matches!(socket.get(&key.tuple()), Ok(Some(entry)) if key.is(&entry)),
        )
    }

    /// Reads the flowtables of the namespaces connections were seen in from now on (see
    /// `flowtables`): the forwarding program runs on `net_dev_queue`.
    pub fn watch_flowtables(&mut self) {
        self.flowtables = Some(Default::default());
    }

    /// Reads the flowtables of each namespace that a connection of the kernel table
    /// `entries` is in: when first seen, and every `flowtables::watch::EVERY` after (all
    /// seen so far). Each new one is a warning. Offloading takes established flows,
    /// which a sweep finds in the table.
    pub fn check_flowtables(&mut self, entries: &[(u64, ConnState)], now: Instant) {
        let Some((watch, seen)) = self.flowtables.as_mut() else {
            return;
        };
        let mut to_read: Vec<u32> = entries
            .iter()
            .map(|(_, state)| state.netns)
            .filter(|netns| seen.insert(*netns))
            .collect();
        if watch.due(now) {
            to_read = seen.iter().copied().collect();
        }
        for netns in to_read {
            if let Some(path) = self.paths.get(&netns) {
                watch.read(u64::from(netns), path, &mut self.warnings);
            }
        }
    }

    /// Warnings not yet shown, once each.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

/// The key and entry of a destroyed entry in a note, if it is one.
pub fn destroyed(note: &Note) -> Option<(CtKey, &CtEntry)> {
    match note {
        Note::Event {
            netns,
            kind: crate::conntrack::CtKind::Destroy,
            entry,
        } => Some((CtKey::of_entry(*netns, entry), entry)),
        _ => None,
    }
}
