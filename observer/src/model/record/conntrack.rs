//! The summary line's `conntrack` figures: what conntrack's own readings said of one
//! network namespace over a recording.

use serde::{Deserialize, Serialize};

use crate::conntrack::CtStats;

/// conntrack's table and refusals in one namespace over a recording, from its readings
/// (every 5 s, and one when the recording ends).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackSummary {
    /// The most entries one reading found; over `max_entries`, the peak fill ratio.
    pub peak_entries: u32,
    /// conntrack's maximum (`nf_conntrack_max`; 0: no limit).
    pub max_entries: u32,
    /// How much conntrack's own counters (`conntrack -S`, summed over CPUs) rose from the
    /// first reading to the last.
    pub insert_failed: u64,
    pub drop: u64,
    pub early_drop: u64,
}

impl ConntrackSummary {
    /// Takes in the reading `now` of a namespace first read as `first`.
    pub fn reading(&mut self, first: &CtStats, now: &CtStats) {
        self.peak_entries = self.peak_entries.max(now.entries);
        self.max_entries = now.max_entries;
        self.insert_failed = now.insert_failed.saturating_sub(first.insert_failed);
        self.drop = now.drop.saturating_sub(first.drop);
        self.early_drop = now.early_drop.saturating_sub(first.early_drop);
    }
}
