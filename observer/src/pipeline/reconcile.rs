//! Reconciling the kernel programs' connections with conntrack's own entries, all in one
//! place: connections older than observer (found by a dump at start), connections
//! conntrack destroyed while the kernel programs saw no FIN or RST (`expired`), and
//! connections a newer entry with the same tuple superseded.
//!
//! Destroyed entries are found one of two ways (`ConntrackEnds`): where the kernel takes
//! it, a kernel program checks every tracked connection's `nf_conn` at each sweep
//! (`end_revalidated`); elsewhere conntrack's destroy events are subscribed to, in
//! every namespace, which makes conntrack build a message at the end of every
//! connection of the node.
//!
//! - `matching`: which conntrack entry is which kernel connection, and how each ends.
//!   Pure (no aya, tokio or sockets): unit-tested without root.
//! - `follower`: the ctnetlink side: dumps, destroy events and single-entry questions,
//!   in every network namespace.
//! - here: the session's side, which ends the connections the two above find ended.

use std::time::{Duration, Instant};

use chrono::Utc;
use observer_common::conn::ConnState;

mod follower;
pub mod matching;

pub(super) use follower::Follower;

use super::{Session, monotonic_ns};
use crate::conntrack::listener::Note;
use crate::model::record::{Close, ConnRecord, ConntrackEnds};
use crate::model::tracker::NoRecord;
use crate::model::update::ConnId;
use matching::{CtKey, Destroyed, destroyed_close};

/// conntrack followed from before a session starts: its DNATed entries read, and its
/// destroy events subscribed to where `ends` says so.
pub struct ConntrackStart {
    follower: Follower,
    found: Vec<(ConnId, ConnRecord)>,
}

/// Reads conntrack's DNATed entries in every namespace and, with
/// `ConntrackEnds::DestroyEvents`, subscribes to its destroy events: call it before
/// saying that recording has started.
pub fn follow_conntrack(ends: ConntrackEnds) -> ConntrackStart {
    let (follower, found) = Follower::start(Utc::now(), ends);
    ConntrackStart { follower, found }
}

/// When the revalidation program runs: every `FASTEST` (so an entry conntrack removed
/// ends within about that of its removal), or less often with many connections to check,
/// `PER_CONNECTION` of wait per connection (at about 100 ns of kernel time per checked
/// connection, that keeps the program under 0.2% of a CPU); at least every `SLOWEST`.
/// The wait follows the count, not the run's measured time: a loaded machine (or a debug
/// build) stretched measured runs tenfold and let flushed entries go unnoticed for
/// half a second.
pub(super) struct Revalidation {
    next: Instant,
    /// A run failed (said once).
    failed: bool,
}

impl Revalidation {
    pub(super) const FASTEST: Duration = Duration::from_millis(100);
    const SLOWEST: Duration = Duration::from_secs(5);
    const PER_CONNECTION: Duration = Duration::from_micros(50);

    pub(super) fn new(now: Instant) -> Revalidation {
        Revalidation {
            next: now + Self::FASTEST,
            failed: false,
        }
    }

    fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// A run that started at `started` checked `checked` connections.
    fn ran(&mut self, started: Instant, checked: usize) {
        let wait = Self::PER_CONNECTION
            .saturating_mul(checked.min(u32::MAX as usize) as u32)
            .clamp(Self::FASTEST, Self::SLOWEST);
        self.next = started + wait;
    }
}

impl Session {
    /// Connections that began before observer, and conntrack's destroy events from now on.
    pub(super) fn start_following(&mut self, start: ConntrackStart) {
        let ConntrackStart {
            mut follower,
            found,
        } = start;
        for warning in follower.take_warnings() {
            self.output.warn(warning);
        }
        if self.capture.forwarding_hook() == crate::kernel::capture::ForwardingHook::NetDevQueue {
            follower.watch_flowtables();
        }
        // Revalidation checks the connections each sweep finds in the table: no destroy
        // event has to find a connection known first, so the programs skip open events.
        // Only where the netfilter program runs: its node namespaces' rules are read from
        // the start (`Session::sweep`), not from a namespace's first connection.
        let netfilter = matches!(
            self.capture.forwarding_hook(),
            crate::kernel::capture::ForwardingHook::Netfilter { .. }
        );
        if netfilter
            && follower.ends == ConntrackEnds::Revalidated
            && let Err(error) = self.capture.learn_opens_from_table()
        {
            self.output.warn(format!(
                "cannot tell the kernel programs to skip open events ({error}): they write one per connection"
            ));
        }
        self.follower = Some(follower);
        for (id, record) in found {
            self.progress(id, record);
        }
    }

    /// conntrack's notes: the first and any already waiting, after the ring buffer (an
    /// open event still in it must be known before a destroy is matched).
    pub(super) fn on_conntrack(&mut self, first: Note) -> anyhow::Result<()> {
        let mut notes = vec![first];
        if let Some(follower) = self.follower.as_mut() {
            notes.extend(follower.ready());
        }
        self.drain(super::DNS_DRAIN_MAX)?;
        for note in notes {
            self.conntrack_note(note)?;
        }
        Ok(())
    }

    /// Ends kernel connections a newer entry with the same tuple replaced (their close
    /// was missed): `expired` at their last packet.
    pub(super) fn end_superseded(&mut self) -> anyhow::Result<()> {
        let Some(follower) = self.follower.as_mut() else {
            return Ok(());
        };
        for (id, key) in follower.matcher.take_superseded() {
            self.end_kernel(id, &key, |state| (Close::Expired, state.last_ns))?;
        }
        Ok(())
    }

    /// Removes the kernel connection `id` if it is still in the kernel's table (and
    /// `key`'s), and records it with the close and end `how` gives; nothing when the
    /// kernel ended it first, even if a newer connection now has its address.
    pub(super) fn end_kernel(
        &mut self,
        id: ConnId,
        key: &CtKey,
        how: impl FnOnce(&ConnState) -> (Close, u64),
    ) -> anyhow::Result<()> {
        let conntrack = id.conntrack;
        if self
            .capture
            .connection(conntrack)
            .is_some_and(|state| state.unconfirmed != 0)
        {
            // Destroy events: the revalidation program may never have looked at it.
            let _ = self.capture.gone_connections(&[conntrack]);
        }
        if let Some(state) = self.capture.connection(conntrack)
            && state.start_ns == id.start_ns
            && CtKey::of_state(&state) == *key
            && self.capture.remove(conntrack, &state)
        {
            let (close, until) = how(&state);
            match self.tracker.ended(conntrack, &state, close, until) {
                Ok((id, record)) => self.finished(id, record)?,
                Err(NoRecord::NeverConfirmed) => self.never_confirmed += 1,
                Err(_) => self.malformed += 1,
            }
        }
        Ok(())
    }

    /// Ends the kernel connections of the table `entries` whose conntrack entry is gone
    /// though no destroy event can say so (see `Follower::unreported_gone`), where
    /// destroy events are followed.
    pub(super) fn end_unreported(&mut self, entries: &[(u64, ConnState)]) -> anyhow::Result<()> {
        let Some(follower) = self.follower.as_mut() else {
            return Ok(());
        };
        if follower.ends != ConntrackEnds::DestroyEvents {
            return Ok(());
        }
        let gone = follower.unreported_gone(entries);
        self.end_destroyed(gone)
    }

    /// Revalidates when it is due (see `Revalidation`); called on the drain timer, so it
    /// never wakes observer by itself.
    pub(super) fn revalidate_if_due(&mut self) -> anyhow::Result<()> {
        let revalidates = self
            .follower
            .as_ref()
            .is_some_and(|f| f.ends == ConntrackEnds::Revalidated);
        if !revalidates || !self.revalidation.due(Instant::now()) {
            return Ok(());
        }
        let started = Instant::now();
        let result = self.end_revalidated();
        self.revalidation
            .ran(started, result.as_ref().copied().unwrap_or(0));
        result.map(drop)
    }

    /// Runs the revalidation program (observer-ebpf's `hooks/revalidate.rs`) over the
    /// kernel connections the matcher knows (every sweep and every adoption's open event tell it)
    /// and ends those it finds gone, as their destroy events would. A failed run is said
    /// once and tried again next time.
    /// Returns how many connections it checked.
    pub(super) fn end_revalidated(&mut self) -> anyhow::Result<usize> {
        let Some(follower) = self.follower.as_ref() else {
            return Ok(0);
        };
        let known = follower.matcher.all_kernel_connections();
        let conntracks: Vec<u64> = known.iter().map(|(id, _)| id.conntrack).collect();
        let gone = match self.capture.gone_connections(&conntracks) {
            Ok(gone) => gone,
            Err(error) => {
                if !std::mem::replace(&mut self.revalidation.failed, true) {
                    self.output.warn(error.to_string());
                }
                return Ok(conntracks.len());
            }
        };
        let gone: std::collections::HashSet<u64> = gone.into_iter().collect();
        let ended = known
            .into_iter()
            .filter(|(id, _)| gone.contains(&id.conntrack))
            .collect();
        self.end_destroyed(ended)?;
        Ok(conntracks.len())
    }

    /// Ends the entries of the kernel table `entries` still unconfirmed whose conntrack
    /// entry is gone, never confirmed: a clash's loser (its datagram went on with the
    /// winner's entry) or a first packet dropped at confirmation. At every sweep, so
    /// that a loser ends within a second, before its winner (whose record then holds
    /// what the loser carried, `model::clash`) and before the recording's end (where it
    /// would be written as an open connection). The revalidation program marks those it
    /// finds confirmed since. Returns the others, as the kernel has them now.
    pub(super) fn end_never_confirmed(
        &mut self,
        mut entries: Vec<(u64, ConnState)>,
    ) -> anyhow::Result<Vec<(u64, ConnState)>> {
        let conntracks: Vec<u64> = entries
            .iter()
            .filter(|(_, state)| state.unconfirmed != 0)
            .map(|(conntrack, _)| *conntrack)
            .collect();
        if conntracks.is_empty() {
            return Ok(entries);
        }
        let Ok(gone) = self.capture.gone_connections(&conntracks) else {
            // Said by the revalidation that failed the same way; the idle timeout ends
            // them (`Session::confirmed_now`).
            return Ok(entries);
        };
        let gone: std::collections::HashSet<u64> = gone.into_iter().collect();
        let mut never_confirmed = Vec::new();
        for (conntrack, state) in entries.iter_mut().filter(|(_, s)| s.unconfirmed != 0) {
            match self.capture.connection(*conntrack) {
                Some(now) if now.start_ns == state.start_ns => *state = now,
                // Ended or replaced since the table was read: the next sweep sees it.
                _ => continue,
            }
            if state.unconfirmed != 0 && gone.contains(conntrack) {
                never_confirmed.push((*conntrack, *state));
            }
        }
        for (conntrack, state) in &never_confirmed {
            self.end(*conntrack, state, Close::Expired)?;
        }
        entries.retain(|(conntrack, _)| !never_confirmed.iter().any(|(c, _)| c == conntrack));
        Ok(entries)
    }

    /// Ends kernel connections whose conntrack entry is gone, as its destroy event would
    /// (`destroyed_close`, now), unless the kernel programs ended them first.
    fn end_destroyed(&mut self, gone: Vec<(ConnId, CtKey)>) -> anyhow::Result<()> {
        let (now, idle) = (monotonic_ns(), self.idle_timeout_ns);
        for (id, key) in gone {
            self.end_kernel(id, &key, |state| destroyed_close(state, now, idle))?;
        }
        Ok(())
    }

    /// After destroy events were lost: ends the kernel connections of `netns` whose
    /// conntrack entry is gone, as if their destroy event had come now.
    pub(super) fn revalidate(&mut self, netns: u32) -> anyhow::Result<()> {
        let Some(follower) = self.follower.as_mut() else {
            return Ok(());
        };
        let gone: Vec<(ConnId, CtKey)> = follower
            .matcher
            .kernel_connections(netns)
            .into_iter()
            .filter(|(_, key)| !follower.still_there(key))
            .collect();
        self.end_destroyed(gone)
    }

    pub(super) fn conntrack_note(&mut self, note: Note) -> anyhow::Result<()> {
        if let Note::Stats { netns, at, stats } = note {
            self.conntrack_stats(netns, at, stats);
            return Ok(());
        }
        let Some(follower) = self.follower.as_mut() else {
            return Ok(());
        };
        let (key, entry) = match &note {
            Note::Overrun { netns } => {
                follower.overruns += 1;
                let overruns = follower.overruns;
                self.output.warn(format!(
                    "conntrack's destroy events in netns {netns} overflowed observer's buffer ({overruns} time(s) so far): asking conntrack about each connection there instead"
                ));
                let netns = *netns;
                return self.revalidate(netns);
            }
            Note::Failed { netns, error } => {
                let warning = format!("stopped following conntrack in netns {netns}: {error}");
                self.output.warn(warning);
                return Ok(());
            }
            _ => match follower::destroyed(&note) {
                Some(destroyed) => destroyed,
                None => return Ok(()),
            },
        };
        if !follower.matcher.matters(&key, entry) || follower.still_there(&key) {
            return Ok(());
        }
        match follower.matcher.destroyed(&key, entry, Utc::now()) {
            Destroyed::Found(id, record) => self.finished(id, *record)?,
            // Unless the kernel programs ended it first (FIN/RST wins).
            Destroyed::Kernel(id) => self.end_destroyed(vec![(id, key)])?,
            Destroyed::Unknown => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revalidation_runs_every_tenth_of_a_second_unless_there_are_many_connections() {
        let start = Instant::now();
        let mut revalidation = Revalidation::new(start);
        assert!(!revalidation.due(start));
        assert!(revalidation.due(start + Duration::from_millis(100)));
        // Up to 2,000 connections: the next run a tenth of a second later.
        revalidation.ran(start, 2_000);
        assert!(!revalidation.due(start + Duration::from_millis(99)));
        assert!(revalidation.due(start + Duration::from_millis(100)));
        // 10,000 connections: 500 ms later.
        revalidation.ran(start, 10_000);
        assert!(!revalidation.due(start + Duration::from_millis(499)));
        assert!(revalidation.due(start + Duration::from_millis(500)));
        // Never less often than every 5 s.
        revalidation.ran(start, 10_000_000);
        assert!(!revalidation.due(start + Duration::from_millis(4_999)));
        assert!(revalidation.due(start + Duration::from_secs(5)));
    }
}
