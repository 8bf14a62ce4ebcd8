//! Reconciling the kernel programs' connections with conntrack's own entries, all in one
//! place: connections older than observer (found by a dump at start), connections
//! conntrack destroyed while the kernel programs saw no FIN or RST (`expired`), and
//! connections a newer entry with the same tuple superseded.
//!
//! - `matching`: which conntrack entry is which kernel connection, and how each ends.
//!   Pure (no aya, tokio or sockets): unit-tested without root.
//! - `follower`: the ctnetlink side: dumps, destroy events and single-entry questions,
//!   in every network namespace.
//! - here: the session's side, which ends the connections the two above find ended.

use chrono::Utc;
use observer_common::conn::ConnState;

mod follower;
pub mod matching;

pub(super) use follower::Follower;

use super::{Session, monotonic_ns};
use crate::conntrack::listener::Note;
use crate::model::record::{Close, ConnRecord};
use crate::model::update::ConnId;
use matching::{CtKey, Destroyed, destroyed_close};

/// conntrack followed from before a session starts: its destroy events are subscribed
/// to and its DNATed entries read.
pub struct ConntrackStart {
    follower: Follower,
    found: Vec<(ConnId, ConnRecord)>,
}

/// Subscribes to conntrack's destroy events and reads its DNATed entries in every
/// namespace: call it before saying that recording has started.
pub fn follow_conntrack() -> ConntrackStart {
    let (follower, found) = Follower::start(Utc::now());
    ConntrackStart { follower, found }
}

impl Session {
    /// Connections that began before observer, and conntrack's destroy events from now on.
    pub(super) fn start_following(&mut self, start: ConntrackStart) {
        let ConntrackStart {
            mut follower,
            found,
        } = start;
        for warning in follower.take_warnings() {
            (self.warn)(warning);
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
        if let Some(state) = self.capture.connection(conntrack)
            && state.start_ns == id.start_ns
            && CtKey::of_state(&state) == *key
            && self.capture.remove(conntrack, &state)
        {
            let (close, until) = how(&state);
            match self.tracker.ended(conntrack, &state, close, until) {
                Ok((id, record)) => self.finished(id, record)?,
                Err(_) => self.malformed += 1,
            }
        }
        Ok(())
    }

    /// Ends the kernel connections of the table `entries` whose conntrack entry is gone
    /// with no destroy event to say so (see `Follower::unreported_gone`).
    pub(super) fn end_unreported(&mut self, entries: &[(u64, ConnState)]) -> anyhow::Result<()> {
        let Some(follower) = self.follower.as_mut() else {
            return Ok(());
        };
        let gone = follower.unreported_gone(entries);
        self.end_destroyed(gone)
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
                (self.warn)(format!(
                    "conntrack's destroy events in netns {netns} overflowed observer's buffer ({overruns} time(s) so far): asking conntrack about each connection there instead"
                ));
                let netns = *netns;
                return self.revalidate(netns);
            }
            Note::Failed { netns, error } => {
                let warning = format!("stopped following conntrack in netns {netns}: {error}");
                (self.warn)(warning);
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
