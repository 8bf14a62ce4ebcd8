//! The session's reject side: new connections to a Service that netfilter dropped
//! before any DNAT (no endpoints, no local endpoint, a source range, a ClusterIP's
//! wrong port or an unallocated one). Reports and counts come from the kernel's
//! `skb:kfree_skb` program; a record is written only when the rules of the namespace
//! that dropped it explain the drop as Service traffic, with the reason (other netfilter
//! drops, such as a network policy's, are not).

use observer_common::reject::RejectEvent;

use crate::kernel::capture::Capture;
use crate::model::record::RejectRecord;
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

    /// The rejected flows the kernel reported since the last drain that end now, and the
    /// namespaces of those that go on (their rules are read from the first on).
    pub fn drain(&mut self, capture: &mut Capture) -> (Vec<RejectRecord>, Vec<u32>) {
        let mut drained = std::mem::take(&mut self.drained);
        drained.clear();
        self.malformed += capture.drain_rejects(&mut drained);
        let (mut records, mut seen) = (Vec::new(), Vec::new());
        for event in &drained {
            match self.tracker.on_event(event) {
                Ok(Some(record)) => records.push(record),
                Ok(None) => seen.push(event.key.netns),
                Err(_) => self.malformed += 1,
            }
        }
        self.drained = drained;
        (records, seen)
    }

    /// The flows quiet long enough to be over; the kernel forgets them.
    pub fn sweep(&mut self, capture: &mut Capture, now_ns: u64) -> Vec<RejectRecord> {
        let reported = |key: &_| capture.rejected(key);
        let Ok(sweep) = self.tracker.sweep(now_ns, reported) else {
            self.malformed += 1;
            return Vec::new();
        };
        for key in &sweep.forget {
            capture.forget_rejected(key);
        }
        sweep.records
    }

    /// The flows still being rejected at the end.
    pub fn finish(&mut self, capture: &Capture) -> Vec<RejectRecord> {
        self.tracker
            .finish(|key| capture.rejected(key))
            .unwrap_or_else(|_| {
                self.malformed += 1;
                Vec::new()
            })
    }
}
