//! conntrack's fill and refusals per namespace, from its readings (`Update::Conntrack`):
//! what the warning line above the tables says when a table is over 80% full, or when
//! conntrack dropped, failed to insert or evicted entries since the previous reading.

use std::collections::BTreeMap;

use crate::model::update::ConntrackReading;
use crate::report::text::{plural, thousands};

/// A table fuller than this share of its maximum (in percent) is warned about.
const FULL_PERCENT: u64 = 80;

#[derive(Debug, Default)]
pub struct Pressure {
    /// Per namespace: its latest reading, and the one before.
    readings: BTreeMap<u32, (ConntrackReading, Option<ConntrackReading>)>,
}

impl Pressure {
    /// A namespace's new reading, or `None`: no longer read.
    pub fn apply(&mut self, netns: u32, reading: Option<ConntrackReading>) {
        match reading {
            Some(reading) => {
                let previous = self.readings.get(&netns).map(|(latest, _)| *latest);
                self.readings.insert(netns, (reading, previous));
            }
            None => {
                self.readings.remove(&netns);
            }
        }
    }

    /// The warning line: the namespace in the worst state, then how many more need one.
    pub fn warning(&self) -> Option<String> {
        let mut alerts: Vec<Alert> = self
            .readings
            .iter()
            .filter_map(|(netns, (latest, previous))| Alert::of(*netns, latest, previous.as_ref()))
            .collect();
        alerts.sort_by_key(|alert| std::cmp::Reverse(alert.severity()));
        let mut line = alerts.first()?.text();
        if alerts.len() > 1 {
            let others = plural(alerts.len() as u64 - 1, "other namespace");
            line.push_str(&format!(" (and {others})"));
        }
        Some(line)
    }
}

/// What is wrong in one namespace.
struct Alert {
    netns: u32,
    /// The fill in percent, when over `FULL_PERCENT`, with the entries and maximum.
    full: Option<(u64, u32, u32)>,
    /// Counters that rose since the previous reading: drops, failed inserts, early drops.
    rose: [u64; 3],
    /// Seconds between the two readings.
    seconds: i64,
}

impl Alert {
    fn of(
        netns: u32,
        latest: &ConntrackReading,
        previous: Option<&ConntrackReading>,
    ) -> Option<Alert> {
        let stats = &latest.stats;
        let percent = u64::from(stats.entries) * 100 / u64::from(stats.max_entries).max(1);
        let over = stats.max_entries > 0
            && u64::from(stats.entries) * 100 > u64::from(stats.max_entries) * FULL_PERCENT;
        let full = over.then_some((percent, stats.entries, stats.max_entries));
        let (rose, seconds) = match previous {
            Some(previous) => {
                let before = &previous.stats;
                let rose = [
                    stats.drop.saturating_sub(before.drop),
                    stats.insert_failed.saturating_sub(before.insert_failed),
                    stats.early_drop.saturating_sub(before.early_drop),
                ];
                let ms = (latest.time - previous.time).num_milliseconds();
                (rose, ((ms + 500) / 1000).max(1))
            }
            None => ([0; 3], 0),
        };
        (full.is_some() || rose.iter().any(|&n| n > 0)).then_some(Alert {
            netns,
            full,
            rose,
            seconds,
        })
    }

    /// Refusals (drops and failed inserts) first, then the fullest table, then evictions.
    fn severity(&self) -> (u64, u64, u64) {
        let percent = self.full.map_or(0, |(percent, _, _)| percent);
        (self.rose[0] + self.rose[1], percent, self.rose[2])
    }

    /// `! conntrack in netns 4026532301: 83% full (54,395/65,536), 12 early drops in 5 s`:
    /// 80 columns for a usual case, the fill before the refusals.
    fn text(&self) -> String {
        let mut parts = Vec::new();
        if let Some((percent, entries, max)) = self.full {
            parts.push(format!(
                "{percent}% full ({}/{})",
                thousands(entries.into()),
                thousands(max.into())
            ));
        }
        let rose: Vec<String> = self
            .rose
            .iter()
            .zip(["drop", "failed insert", "early drop"])
            .filter(|(n, _)| **n > 0)
            .map(|(n, word)| plural(*n, word))
            .collect();
        if !rose.is_empty() {
            parts.push(format!("{} in {} s", rose.join(", "), self.seconds));
        }
        format!("! conntrack in netns {}: {}", self.netns, parts.join(", "))
    }
}
