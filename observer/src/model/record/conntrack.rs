//! The summary line's `conntrack` figures: what conntrack's own readings said of one
//! network namespace over a recording.

use serde::{Deserialize, Serialize};

/// conntrack's own figures for one namespace: its table's entries against the maximum
/// (`IPCTNL_MSG_CT_GET_STATS`: what `conntrack -C` counts, and `nf_conntrack_max`), and its
/// statistics summed over CPUs (`conntrack -S`), cumulative since the namespace was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtStats {
    pub entries: u32,
    /// 0: no limit.
    pub max_entries: u32,
    /// New entries that could not be inserted (a clash with an entry made meanwhile).
    pub insert_failed: u64,
    /// Packets dropped because the table was full and no entry could be evicted.
    pub drop: u64,
    /// Entries not yet assured that were evicted to make room for new ones.
    pub early_drop: u64,
}

impl CtStats {
    /// Whether conntrack was ever used in the namespace: an entry now, or anything counted.
    /// Most pods' namespaces have no rules that track connections, and never are.
    pub fn used(&self) -> bool {
        self.entries > 0 || self.insert_failed > 0 || self.drop > 0 || self.early_drop > 0
    }
}

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
