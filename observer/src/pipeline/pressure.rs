//! The session's side of conntrack's own figures: each namespace's readings go to the
//! live view and `serve` as they come, and into the summary line's `conntrack` figures.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::Session;
use crate::conntrack::listener::Note;
use crate::model::record::ConntrackSummary;
use crate::model::record::CtStats;
use crate::model::update::{ConntrackReading, Update};

/// Per namespace: its first reading, and what the summary line says of it so far.
#[derive(Default)]
pub(super) struct Pressure(BTreeMap<u32, (CtStats, ConntrackSummary)>);

impl Pressure {
    fn reading(&mut self, netns: u32, stats: &CtStats) {
        let (first, summary) = self.0.entry(netns).or_insert((*stats, Default::default()));
        summary.reading(first, stats);
    }

    /// The summary line's `conntrack` object: keyed by inode, as a string.
    pub(super) fn summary(&self) -> BTreeMap<String, ConntrackSummary> {
        self.0
            .iter()
            .map(|(netns, (_, summary))| (netns.to_string(), summary.clone()))
            .collect()
    }
}

impl Session {
    /// A reading of conntrack's figures in `netns`, or why there is none.
    pub(super) fn conntrack_stats(
        &mut self,
        netns: u32,
        at: DateTime<Utc>,
        stats: Result<CtStats, String>,
    ) {
        let reading = match stats {
            Ok(stats) => {
                self.pressure.reading(netns, &stats);
                Some(ConntrackReading { time: at, stats })
            }
            Err(error) => {
                self.output.warn(format!(
                    "cannot read conntrack's statistics in netns {netns}: {error}"
                ));
                None
            }
        };
        self.output.show(Update::Conntrack { netns, reading });
    }

    /// Namespaces no longer followed (deleted): their figures are no longer read.
    pub(super) fn conntrack_gone(&mut self, gone: Vec<u32>) {
        for netns in gone {
            self.output.show(Update::Conntrack {
                netns,
                reading: None,
            });
        }
    }

    /// Stops following conntrack; the listener reads each namespace's figures once more,
    /// so that the summary covers the recording to its end.
    pub(super) fn stop_following(&mut self) {
        let Some(follower) = self.follower.take() else {
            return;
        };
        for note in follower.stop() {
            if let Note::Stats {
                netns,
                stats: Ok(stats),
                ..
            } = note
            {
                self.pressure.reading(netns, &stats);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(entries: u32, drop: u64, early_drop: u64) -> CtStats {
        CtStats {
            entries,
            max_entries: 1000,
            insert_failed: 7,
            drop,
            early_drop,
        }
    }

    #[test]
    fn the_summary_has_the_peak_and_what_rose_since_the_first_reading() {
        let mut pressure = Pressure::default();
        pressure.reading(4026532301, &stats(100, 3, 10));
        pressure.reading(4026532301, &stats(950, 3, 40));
        pressure.reading(4026532301, &stats(700, 5, 41));
        pressure.reading(4026532999, &stats(0, 0, 0));
        let summary = pressure.summary();
        assert_eq!(
            summary["4026532301"],
            ConntrackSummary {
                peak_entries: 950,
                max_entries: 1000,
                insert_failed: 0,
                drop: 2,
                early_drop: 31,
            }
        );
        assert_eq!(summary["4026532999"].max_entries, 1000);
        assert_eq!(summary.len(), 2);
        let line = serde_json::to_string(&summary["4026532301"]).unwrap();
        assert_eq!(
            line,
            r#"{"peak_entries":950,"max_entries":1000,"insert_failed":0,"drop":2,"early_drop":31}"#
        );
    }
}
