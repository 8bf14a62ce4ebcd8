//! The session's reject side: new connections to a Service that netfilter dropped
//! before any DNAT (no endpoints, no local endpoint, a source range, a ClusterIP's
//! wrong port or an unallocated one). Reports and counts come from the kernel's
//! `skb:kfree_skb` program; a record is written only when the rules of the namespace
//! that dropped it explain the drop as Service traffic, with the reason (other netfilter
//! drops, such as a network policy's, are not).

use std::time::Instant;

use observer_common::reject::RejectEvent;

use super::output::Emitted;
use super::{FIRST_NAME_WAIT, Session};
use crate::model::record::RejectRecord;
use crate::model::rejects::RejectTracker;

pub(super) struct RejectSide {
    pub tracker: RejectTracker,
    /// Reports drained, reused from drain to drain.
    drained: Vec<RejectEvent>,
    /// Records waiting for their namespace's rules to be read (in order).
    waiting: std::collections::VecDeque<Waiting>,
    /// `reject` lines written.
    pub written: u64,
    /// Reports that could not be decoded.
    pub malformed: u64,
}

struct Waiting {
    record: RejectRecord,
    /// The generation of the namespace's rules the name waits for.
    wait_for: u64,
    until: Instant,
}

impl RejectSide {
    pub fn new(tracker: RejectTracker) -> RejectSide {
        RejectSide {
            tracker,
            drained: Vec::new(),
            waiting: Default::default(),
            written: 0,
            malformed: 0,
        }
    }
}

impl RejectSide {
    /// Nothing drained at the last drain, followed or waiting for names.
    pub fn is_quiet(&self) -> bool {
        self.drained.is_empty() && self.waiting.is_empty() && self.tracker.is_idle()
    }
}

impl Session {
    /// Reads the kernel's rejected-flow reports; writes new TCP attempts.
    pub(super) fn drain_rejects(&mut self) -> anyhow::Result<()> {
        let mut drained = std::mem::take(&mut self.rejects.drained);
        drained.clear();
        self.rejects.malformed += self.capture.drain_rejects(&mut drained);
        let mut result = Ok(());
        for event in &drained {
            match self.rejects.tracker.on_event(event) {
                Ok(Some(record)) => result = result.and(self.rejected(record)),
                Ok(None) => self.prime(event.key.netns),
                Err(_) => self.rejects.malformed += 1,
            }
        }
        self.rejects.drained = drained;
        result
    }

    /// Writes the UDP sockets that went quiet; lets the kernel forget finished flows.
    pub(super) fn sweep_rejects(&mut self, now_ns: u64) -> anyhow::Result<()> {
        let capture = &self.capture;
        let sweep = match self
            .rejects
            .tracker
            .sweep(now_ns, |key| capture.rejected(key))
        {
            Ok(sweep) => sweep,
            Err(_) => {
                self.rejects.malformed += 1;
                return Ok(());
            }
        };
        for key in &sweep.forget {
            self.capture.forget_rejected(key);
        }
        for record in sweep.records {
            self.rejected(record)?;
        }
        self.release_rejects(false)
    }

    /// At the end of a session: every UDP socket still rejected, and every record
    /// waiting for rules (named from what is known by then).
    pub(super) fn finish_rejects(&mut self) -> anyhow::Result<()> {
        let capture = &self.capture;
        match self.rejects.tracker.finish(|key| capture.rejected(key)) {
            Ok(records) => {
                for record in records {
                    self.rejected(record)?;
                }
            }
            Err(_) => self.rejects.malformed += 1,
        }
        self.release_rejects(true)
    }

    /// Names a record, then writes it, or holds it while its namespace's rules are
    /// read for the first time.
    fn rejected(&mut self, record: RejectRecord) -> anyhow::Result<()> {
        self.prime(record.netns);
        let generation = self
            .namer
            .as_ref()
            .map_or(1, |n| n.generation(record.netns));
        if generation == 0 || !self.rejects.waiting.is_empty() {
            self.rejects.waiting.push_back(Waiting {
                record,
                wait_for: crate::naming::services::FIRST_READ,
                until: Instant::now() + FIRST_NAME_WAIT,
            });
            return Ok(());
        }
        self.write_reject(record)
    }

    /// Writes the held records whose rules were read, or whose wait is over (`all`: every one).
    pub(super) fn release_rejects(&mut self, all: bool) -> anyhow::Result<()> {
        let now = Instant::now();
        while let Some(first) = self.rejects.waiting.front() {
            let read = self
                .namer
                .as_ref()
                .is_none_or(|namer| namer.generation(first.record.netns) >= first.wait_for);
            if !(all || read || now >= first.until) {
                break;
            }
            let waiting = self.rejects.waiting.pop_front().expect("a front element");
            self.write_reject(waiting.record)?;
        }
        Ok(())
    }

    /// Names the Service and client pod; writes the line if a Service was dialed.
    fn write_reject(&mut self, mut record: RejectRecord) -> anyhow::Result<()> {
        let now = Instant::now();
        if let Some(pods) = self.pods.as_mut() {
            record.client_pod = pods.name(record.client.ip(), now);
        }
        let Some(namer) = self.namer.as_mut() else {
            return Ok(());
        };
        let refusal = namer.lookup_refusal(
            record.netns,
            record.proto,
            record.original_dst,
            record.client,
            now,
        );
        self.publish_naming()?;
        let Some(refusal) = refusal else {
            return Ok(());
        };
        record.service = refusal.service;
        record.frontend = refusal.frontend;
        record.reason = Some(refusal.reason);
        self.rejects.written += 1;
        Ok(self.output.emit(Emitted::Reject(record))?)
    }
}
