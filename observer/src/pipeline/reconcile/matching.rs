//! Matching conntrack's entries to the kernel programs' connections: entries that
//! existed before observer started (found by a dump), and entries conntrack destroyed
//! (flush, delete, timeout) while the kernel programs saw no FIN or RST. Both are
//! matched to the kernel programs' connections by network namespace and original tuple.

use rustc_hash::FxHashMap;
use std::net::SocketAddr;

use chrono::{DateTime, Utc};
use observer_common::conn::{ConnEvent, ConnState, EVENT_OPEN, REPLY};

use crate::conntrack::{CtEntry, CtTuple, tcp_state};
use crate::model::NetMap;
use crate::model::record::{Close, ConnRecord, Proto};
use crate::model::tuple;
use crate::model::update::ConnId;

/// Identifies a connection across conntrack and the kernel programs: its namespace and
/// both tuples. The original tuple alone is not enough: when a UDP flow's first
/// datagrams on two CPUs were DNATed to two pods, conntrack keeps the loser as an entry
/// of its own until its first reply (`nf_ct_resolve_clash_harder`,
/// net/netfilter/nf_conntrack_core.c), with the winner's original tuple and another
/// reply tuple; a key without the reply made either end the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub netns: u32,
    pub protocol: u8,
    pub client: SocketAddr,
    pub dialed: SocketAddr,
    /// The reply tuple: the backend, and where its replies go (the client, or the
    /// address it was masqueraded to).
    pub backend: SocketAddr,
    pub reply_to: SocketAddr,
}

impl CtKey {
    pub fn of_state(state: &ConnState) -> CtKey {
        CtKey {
            netns: state.netns,
            protocol: state.original.protocol,
            client: tuple::socket_addr(state.original.family, &state.original.src),
            dialed: tuple::socket_addr(state.original.family, &state.original.dst),
            backend: tuple::socket_addr(state.reply.family, &state.reply.src),
            reply_to: tuple::socket_addr(state.reply.family, &state.reply.dst),
        }
    }

    pub fn of_entry(netns: u32, entry: &CtEntry) -> CtKey {
        CtKey {
            netns,
            protocol: entry.original.protocol,
            client: entry.original.src,
            dialed: entry.original.dst,
            backend: entry.reply.src,
            reply_to: entry.reply.dst,
        }
    }

    /// Whether conntrack's answer to a question about `self.tuple()` is this entry (and
    /// not another that now holds the original tuple).
    pub fn is(&self, entry: &CtEntry) -> bool {
        CtKey::of_entry(self.netns, entry) == *self
    }

    /// The original tuple, to ask conntrack about this entry.
    pub fn tuple(&self) -> CtTuple {
        CtTuple {
            protocol: self.protocol,
            src: self.client,
            dst: self.dialed,
        }
    }
}

/// An entry found at start that no kernel program has followed yet.
#[derive(Clone, Debug)]
struct Found {
    id: ConnId,
    proto: Proto,
    entry: CtEntry,
    start: DateTime<Utc>,
    /// How many times conntrack was asked about it again.
    checks: u64,
}

/// What a destroy event ends.
#[derive(Debug, PartialEq)]
pub enum Destroyed {
    /// A connection the kernel programs follow: remove it from their table and end it
    /// as expired (unless they ended it first).
    Kernel(ConnId),
    /// An entry found at start that never carried a packet since: its final record
    /// (boxed: a record is large next to the other variants).
    Found(ConnId, Box<ConnRecord>),
    /// Nothing observer follows.
    Unknown,
}

#[derive(Default)]
pub struct ConntrackMatcher {
    /// The kernel programs' connections, by key: `nf_conn` address and start. The start
    /// tells a connection from a newer one the kernel placed at the same address.
    kernel: NetMap<CtKey, ConnId>,
    /// Entries found at start, not (yet) followed by the kernel programs.
    found: NetMap<CtKey, Found>,
    /// Kernel connections that continue an entry found at start: its id and start.
    adopted: FxHashMap<ConnId, (ConnId, DateTime<Utc>)>,
    superseded: Vec<(ConnId, CtKey)>,
    next_id: u64,
}

/// Ids of entries found at start are `FOUND_ID | n` with `start_ns` 0: never a kernel
/// id (`nf_conn` addresses are upper-half kernel addresses, `start_ns` a boot time).
const FOUND_ID: u64 = 1 << 63;

impl ConntrackMatcher {
    /// Entries of namespace `netns` that existed at start (`now`): the DNATed TCP and UDP
    /// ones that are not already closing, as open records with `start_seen: false`.
    pub fn found_at_start(
        &mut self,
        netns: u32,
        entries: Vec<CtEntry>,
        now: DateTime<Utc>,
    ) -> Vec<(ConnId, ConnRecord)> {
        let mut out = Vec::new();
        for entry in entries {
            let closed = closed_tcp(&entry);
            let Ok(proto) = tuple::proto(entry.original.protocol) else {
                continue;
            };
            if !entry.dnat() || closed {
                continue;
            }
            let key = CtKey::of_entry(netns, &entry);
            if self.kernel.contains_key(&key) {
                continue;
            }
            self.next_id += 1;
            let start = entry
                .start_ns
                .map_or(now, |ns| DateTime::from_timestamp_nanos(ns as i64));
            let found = Found {
                id: ConnId {
                    conntrack: FOUND_ID | self.next_id,
                    start_ns: 0,
                },
                proto,
                entry,
                start,
                checks: 0,
            };
            out.push((found.id, record(netns, &found, Close::Open, now)));
            self.found.insert(key, found);
        }
        out
    }

    /// Every kernel event, before the tracker turns it into a record.
    pub fn on_kernel_event(&mut self, event: &ConnEvent) {
        let key = CtKey::of_state(&event.state);
        let id = ConnId::of(event.conntrack, &event.state);
        if event.kind != EVENT_OPEN {
            if self.kernel.get(&key) == Some(&id) {
                self.kernel.remove(&key);
            }
            return;
        }
        if event.state.unconfirmed == 0 {
            self.kernel_follows(key, id);
        }
        if let Some(found) = self.found.remove(&key)
            && event.state.start_seen == 0
        {
            self.adopted.insert(id, (found.id, found.start));
        }
        // With START_SEEN the dump listed a connection that began after attach: the
        // kernel programs saw all of it.
    }

    /// The kernel table as a sweep read it: the truth about which connections it has.
    pub fn on_sweep(&mut self, entries: &[(u64, ConnState)]) {
        let mut newest_last: Vec<&(u64, ConnState)> = entries.iter().collect();
        newest_last.sort_by_key(|(_, state)| state.start_ns);
        self.kernel.clear();
        for (conntrack, state) in newest_last {
            if state.unconfirmed != 0 {
                continue;
            }
            let id = ConnId::of(*conntrack, state);
            self.kernel_follows(CtKey::of_state(state), id);
        }
        for (conntrack, state) in entries {
            // An open event lost in the ring buffer: adopt from the table.
            if let Some(found) = self.found.remove(&CtKey::of_state(state))
                && state.start_seen == 0
            {
                let id = ConnId::of(*conntrack, state);
                self.adopted.insert(id, (found.id, found.start));
            }
        }
    }

    /// The kernel programs follow `key` at `current`, a confirmed entry. conntrack holds
    /// one entry per original tuple (in zone 0) in its table, and a clash's loser that
    /// lives on has another reply tuple (see `CtKey`): the one they followed before under
    /// both tuples is gone, its end unseen. An entry not confirmed yet (the netfilter hook sees every
    /// first packet before conntrack confirms it) supersedes nothing: two CPUs may each
    /// hold one for the same tuple, and the one that loses the clash is dropped, never
    /// confirmed, while the winner lives on. Superseding the winner with the loser ended
    /// it at once and adopted its replies as a second connection.
    fn kernel_follows(&mut self, key: CtKey, current: ConnId) {
        if let Some(previous) = self.kernel.insert(key, current)
            && previous != current
        {
            self.superseded.push((previous, key));
        }
    }

    /// Kernel connections that a newer entry with the same tuple replaced: remove each
    /// from the kernel table if it is still that connection, and end it as expired at
    /// its last packet.
    pub fn take_superseded(&mut self) -> Vec<(ConnId, CtKey)> {
        std::mem::take(&mut self.superseded)
    }

    /// Whether the kernel programs follow any connection.
    pub fn follows_kernel_connections(&self) -> bool {
        !self.kernel.is_empty()
    }

    /// Every connection the kernel programs follow.
    pub fn all_kernel_connections(&self) -> Vec<(ConnId, CtKey)> {
        self.kernel.iter().map(|(key, id)| (*id, *key)).collect()
    }

    /// The kernel programs' connections in `netns`.
    pub fn kernel_connections(&self, netns: u32) -> Vec<(ConnId, CtKey)> {
        self.kernel
            .iter()
            .filter(|(key, _)| key.netns == netns)
            .map(|(key, id)| (*id, *key))
            .collect()
    }

    /// Whether the destroy event of `entry` (key `key`) can end something observer
    /// follows (see `destroyed`).
    pub fn matters(&self, key: &CtKey, entry: &CtEntry) -> bool {
        self.found.contains_key(key) || (self.kernel.contains_key(key) && !closed_tcp(entry))
    }

    /// conntrack destroyed `entry` (of namespace `key.netns`) at `now`.
    ///
    /// A TCP entry destroyed after its close (TIME_WAIT, CLOSE) never ends a kernel
    /// connection: the kernel programs saw that close, and conntrack kills such an
    /// entry when a new SYN reuses its tuple, so the kernel connection under the key
    /// may be that newer one, even at the same `nf_conn` address (conntrack's slab
    /// hands a freed entry's memory straight to the next). A close they missed is
    /// ended by the new connection's first packet (`reused`/`supersede` in the kernel).
    pub fn destroyed(&mut self, key: &CtKey, entry: &CtEntry, now: DateTime<Utc>) -> Destroyed {
        if let Some(found) = self.found.remove(key) {
            let record = record(key.netns, &found, Close::Expired, now);
            return Destroyed::Found(found.id, Box::new(record));
        }
        if closed_tcp(entry) {
            return Destroyed::Unknown;
        }
        match self.kernel.remove(key) {
            Some(id) => Destroyed::Kernel(id),
            None => Destroyed::Unknown,
        }
    }

    /// Entries found at start to ask conntrack about again (TCP closes with no packet
    /// through the kernel programs' hooks after the first FIN); at most `limit`, the
    /// least recently asked first.
    pub fn to_check(&mut self, limit: usize) -> Vec<CtKey> {
        let mut keys: Vec<(u64, CtKey)> = self
            .found
            .iter()
            .filter(|(key, _)| key.protocol == observer_common::conn::PROTO_TCP)
            .map(|(key, found)| (found.checks, *key))
            .collect();
        keys.sort_by_key(|(checks, key)| (*checks, key.netns, key.client, key.dialed));
        keys.truncate(limit);
        for (_, key) in &keys {
            if let Some(found) = self.found.get_mut(key) {
                found.checks += 1;
            }
        }
        keys.into_iter().map(|(_, key)| key).collect()
    }

    /// What conntrack says now about a found entry (`None`, or another entry on its
    /// original tuple: gone). A closed TCP state ends it: TIME_WAIT after FIN, CLOSE
    /// after RST.
    pub fn checked(
        &mut self,
        key: &CtKey,
        now_entry: Option<&CtEntry>,
        now: DateTime<Utc>,
    ) -> Option<(ConnId, ConnRecord)> {
        let close = match now_entry.filter(|entry| key.is(entry)).map(|e| e.tcp_state) {
            None => Close::Expired,
            Some(Some(tcp_state::TIME_WAIT)) => Close::Fin,
            Some(Some(tcp_state::CLOSE)) => Close::Rst,
            Some(_) => return None,
        };
        let found = self.found.remove(key)?;
        Some((found.id, record(key.netns, &found, close, now)))
    }

    /// A record of the kernel programs' connection `id`, as the log and the view must see
    /// it: one that continues an entry found at start keeps that entry's id and start.
    pub fn rewrite(&mut self, id: &mut ConnId, record: &mut ConnRecord) {
        let adopted = if record.close == Close::Open {
            self.adopted.get(id).copied()
        } else {
            self.adopted.remove(id)
        };
        let Some((found_id, start)) = adopted else {
            return;
        };
        let earlier = (record.start - start).num_microseconds().unwrap_or(0);
        record.duration_ms += earlier.max(0) as f64 / 1e3;
        record.start = start.min(record.start);
        *id = found_id;
    }

    /// At the end: entries found at start that nothing ended, still open.
    pub fn finish(&mut self, now: DateTime<Utc>) -> Vec<(ConnId, ConnRecord)> {
        self.found
            .drain()
            .map(|(key, found)| (found.id, record(key.netns, &found, Close::Open, now)))
            .collect()
    }
}

/// Whether conntrack may remove the entry of the kernel connection `state` without a
/// destroy event: it began before observer (adopted), or before destroy events of its
/// namespace were subscribed to at `subscribed_at` (monotonic ns; never: `None`).
pub fn lacks_destroy_events(state: &ConnState, subscribed_at: Option<u64>) -> bool {
    state.start_seen == 0 || subscribed_at.is_none_or(|since| state.start_ns < since)
}

/// A TCP entry whose connection closed (FIN: TIME_WAIT; RST: CLOSE) as conntrack saw it.
fn closed_tcp(entry: &CtEntry) -> bool {
    matches!(
        entry.tcp_state,
        Some(tcp_state::TIME_WAIT | tcp_state::CLOSE)
    )
}

/// How a connection the kernel programs follow ends when conntrack destroys its entry at
/// `now_ns`: one observer would already end for silence (UDP, or TCP never answered,
/// silent for the idle timeout) is a `timeout` at its last packet, as if the sweep had
/// come first; any other is `expired`, now.
pub fn destroyed_close(state: &ConnState, now_ns: u64, idle_timeout_ns: u64) -> (Close, u64) {
    let silent = now_ns.saturating_sub(state.last_ns) >= idle_timeout_ns;
    let answered = state.seq_known[REPLY] != 0;
    let idles = state.original.protocol == observer_common::conn::PROTO_UDP || !answered;
    if silent && idles {
        (Close::Timeout, state.last_ns)
    } else {
        (Close::Expired, now_ns)
    }
}

/// The record of an entry found at start that no packet reached since.
fn record(netns: u32, found: &Found, close: Close, now: DateTime<Utc>) -> ConnRecord {
    let end = now.max(found.start);
    ConnRecord {
        proto: found.proto,
        client: found.entry.original.src,
        client_pod: None,
        original_dst: found.entry.original.dst,
        backend: found.entry.reply.src,
        backend_pod: None,
        service: None,
        frontend: None,
        endpoint_in_rules: None,
        policy: None,
        same_node: None,
        netns,
        start: found.start,
        end: (close != Close::Open).then_some(end),
        duration_ms: (end - found.start).num_microseconds().unwrap_or(0) as f64 / 1e3,
        requests: 0,
        bytes_to_backend: 0,
        bytes_from_backend: 0,
        connect_ms: None,
        close,
        start_seen: false,
    }
}

#[cfg(test)]
mod tests;
