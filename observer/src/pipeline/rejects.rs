//! The session's reject side: new connections to a Service that netfilter dropped
//! before any DNAT (no endpoints, no local endpoint, a source range, a ClusterIP's
//! wrong port or an unallocated one). Reports and counts come from the kernel's
//! `skb:kfree_skb` program; a record is written only when the rules of the namespace
//! that dropped it explain the drop as Service traffic, with the reason (other netfilter
//! drops, such as a network policy's, are not).

use observer_common::reject::RejectEvent;

use super::Session;
use crate::model::rejects::RejectTracker;

pub(super) struct RejectSide {
    pub tracker: RejectTracker,
    drained: Vec<RejectEvent>,
    pub malformed: u64,
}

impl RejectSide {
    pub fn new(tracker: RejectTracker) -> RejectSide {
        RejectSide {
            tracker,
            drained: Vec::new(),
            malformed: 0,
        }
    }

    pub fn is_quiet(&self) -> bool {
        self.drained.is_empty() && self.tracker.is_idle()
    }
}

impl Session {
    pub(super) fn drain_rejects(&mut self) -> anyhow::Result<()> {
        let mut drained = std::mem::take(&mut self.rejects.drained);
        drained.clear();
        self.rejects.malformed += self.capture.drain_rejects(&mut drained);
        let mut result = Ok(());
        for event in &drained {
            match self.rejects.tracker.on_event(event) {
                Ok(Some(record)) => {
                    result = result.and(self.naming.rejected(record, &mut self.output))
                }
                Ok(None) => self.naming.prime(event.key.netns),
                Err(_) => self.rejects.malformed += 1,
            }
        }
        self.rejects.drained = drained;
        result
    }

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
            self.naming.rejected(record, &mut self.output)?;
        }
        Ok(())
    }

    /// The flows still being rejected at the end, into the naming stage (written when it
    /// releases everything).
    pub(super) fn finish_rejects(&mut self) -> anyhow::Result<()> {
        let capture = &self.capture;
        match self.rejects.tracker.finish(|key| capture.rejected(key)) {
            Ok(records) => {
                for record in records {
                    self.naming.rejected(record, &mut self.output)?;
                }
            }
            Err(_) => self.rejects.malformed += 1,
        }
        Ok(())
    }
}
