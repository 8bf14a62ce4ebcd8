//! The Service screen's detail: its connections, lifetime histogram and longest pin.

use std::net::SocketAddr;

use chrono::{DateTime, Utc};

use super::{App, CONN_ROWS, ServiceKey, millis};
use crate::model::record::{Close, ConnRecord};
use crate::report::summary::SKEW_MARK;
use crate::report::timeline::{arrival_marker, marker};
use crate::report::why::screen_lines;
use crate::stats::story::Story;

/// Endpoint changes marked on the Service screen (the latest).
pub const CHANGE_MARKS: usize = 3;

/// Upper bounds (ms) and labels of the lifetime histogram's buckets.
pub const LIFETIME_BUCKETS: [(f64, &str); 6] = [
    (10.0, "<10ms"),
    (100.0, "<100ms"),
    (1_000.0, "<1s"),
    (10_000.0, "<10s"),
    (60_000.0, "<1m"),
    (f64::INFINITY, ">=1m"),
];

pub type Histogram = [u64; LIFETIME_BUCKETS.len()];

pub(super) fn bucket(duration_ms: f64) -> usize {
    LIFETIME_BUCKETS
        .iter()
        .position(|(limit, _)| duration_ms < *limit)
        .unwrap_or(LIFETIME_BUCKETS.len() - 1)
}

/// One live-connection row of the Service screen.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnRow {
    pub client: SocketAddr,
    pub backend: SocketAddr,
    /// `namespace/pod` of each side where known.
    pub client_pod: Option<String>,
    pub backend_pod: Option<String>,
    /// Open: time since the first packet; closed: how long it stayed pinned.
    pub age_ms: f64,
    pub requests: u64,
    /// Open: time since the last packet seen; `None` when closed.
    pub idle_ms: Option<f64>,
    pub close: Close,
}

impl ConnRow {
    fn open(record: &ConnRecord, clock: DateTime<Utc>) -> ConnRow {
        let age_ms = age(record, clock);
        ConnRow {
            client: record.client,
            backend: record.backend,
            client_pod: record.client_pod.as_deref().map(str::to_owned),
            backend_pod: record.backend_pod.as_deref().map(str::to_owned),
            age_ms,
            requests: record.requests,
            idle_ms: Some((age_ms - record.duration_ms).max(0.0)),
            close: record.close,
        }
    }

    fn closed(record: &ConnRecord) -> ConnRow {
        ConnRow {
            client: record.client,
            backend: record.backend,
            client_pod: record.client_pod.as_deref().map(str::to_owned),
            backend_pod: record.backend_pod.as_deref().map(str::to_owned),
            age_ms: record.duration_ms,
            requests: record.requests,
            idle_ms: None,
            close: record.close,
        }
    }
}

/// How long an open connection has been pinned as of `clock`.
fn age(record: &ConnRecord, clock: DateTime<Utc>) -> f64 {
    millis(clock - record.start).max(record.duration_ms)
}

/// What the Service screen shows besides the aggregator's backend rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Detail {
    /// Open connections oldest first, then closed ones newest first; at most `CONN_ROWS`.
    pub conns: Vec<ConnRow>,
    pub open: usize,
    pub closed: usize,
    /// Closed lifetimes since start (or reset) plus the open connections' so far.
    pub histogram: Histogram,
    /// The connection kept for display that stayed pinned longest.
    pub longest: Option<ConnRow>,
    /// The latest endpoint changes, newest first ("10.244.1.13 left 12 s ago, 2
    /// connections still pinned").
    pub changes: Vec<String>,
    /// Why the Service is skewed, when it is ([`REASON_LINES`] at most): the cause, the
    /// keep-alive story, what the skew is made of.
    pub reasons: Vec<String>,
}

/// Reason lines shown at most on the Service screen.
pub const REASON_LINES: usize = 2;

impl App {
    /// Bounded work even with many thousands of connections: one pass to filter and
    /// count, then only the rows shown are sorted and built.
    pub(super) fn detail(&self, key: &ServiceKey) -> Detail {
        let clock = self.clock();
        let unnamed: Option<SocketAddr> = key.0.parse().ok();
        let belongs = |record: &&ConnRecord| {
            record.proto == key.1
                && match &record.service {
                    Some(name) => **name == *key.0,
                    None => Some(record.original_dst) == unnamed,
                }
        };

        let mut histogram = self.histograms.get(key).copied().unwrap_or_default();
        let mut open: Vec<&ConnRecord> =
            self.conns.open().map(|(_, r)| r).filter(belongs).collect();
        let mut longest: Option<&ConnRecord> = None;
        for record in &open {
            histogram[bucket(record.duration_ms)] += 1;
            if longest.is_none_or(|l| age(record, clock) > age(l, clock)) {
                longest = Some(record);
            }
        }
        let mut longest = longest.map(|r| ConnRow::open(r, clock));
        let order = |a: &&ConnRecord, b: &&ConnRecord| {
            (a.start, a.client, a.backend).cmp(&(b.start, b.client, b.backend))
        };
        let open_count = open.len();
        if open.len() > CONN_ROWS {
            open.select_nth_unstable_by(CONN_ROWS, order);
            open.truncate(CONN_ROWS);
        }
        open.sort_by(order);
        let mut conns: Vec<ConnRow> = open.iter().map(|r| ConnRow::open(r, clock)).collect();

        let mut closed_count = 0;
        for record in self.conns.closed().map(|(_, r)| r).filter(belongs) {
            closed_count += 1;
            if longest
                .as_ref()
                .is_none_or(|l| record.duration_ms > l.age_ms)
            {
                longest = Some(ConnRow::closed(record));
            }
            if conns.len() < CONN_ROWS {
                conns.push(ConnRow::closed(record));
            }
        }
        Detail {
            conns,
            open: open_count,
            closed: closed_count,
            histogram,
            longest,
            changes: self.changes(key, clock),
            reasons: self.reasons(key),
        }
    }

    /// Why Service `key` is skewed, from its figures and the connections kept.
    fn reasons(&self, key: &ServiceKey) -> Vec<String> {
        let Some(row) = self.shown.row(key) else {
            return Vec::new();
        };
        let skewed = row.stats.skew.is_some_and(|skew| skew >= SKEW_MARK);
        if !skewed {
            return Vec::new();
        }
        let conns = self
            .conns
            .open()
            .chain(self.conns.closed())
            .map(|(_, record)| record);
        let story = Story::of(&row.stats, conns, &self.timeline.service(&key.0, key.1));
        let mut reasons = screen_lines(&row.stats, Some(&story));
        reasons.truncate(REASON_LINES);
        reasons
    }

    /// The latest endpoint changes of Service `key`, newest first.
    fn changes(&self, key: &ServiceKey, clock: DateTime<Utc>) -> Vec<String> {
        let timeline = self.timeline.service(&key.0, key.1);
        let mut marks: Vec<(DateTime<Utc>, String)> = timeline
            .departures
            .iter()
            .map(|d| (d.left, marker(d, clock)))
            .chain(
                timeline
                    .arrivals
                    .iter()
                    .map(|a| (a.joined, arrival_marker(a, clock))),
            )
            .collect();
        marks.sort_by_key(|(time, _)| std::cmp::Reverse(*time));
        marks.truncate(CHANGE_MARKS);
        marks.into_iter().map(|(_, text)| text).collect()
    }
}
