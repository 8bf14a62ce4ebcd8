//! The live view's state and its pure `update`: keys, ticks and capture updates in,
//! state (and at most one side effect for `run` to perform) out. No I/O here.
//!
//! `rows` builds the Services screen's rows, `detail` the Service screen's, `keys`
//! maps keys to actions; `conns` keeps the connections shown.

pub(super) mod conns;
mod detail;
mod keys;
mod pressure;
mod rows;

use std::collections::{BTreeMap, HashMap, VecDeque};

use chrono::{DateTime, TimeDelta, Utc};
use crossterm::event::KeyEvent;

use self::conns::{Change, ConnTable};
use self::detail::bucket;
use self::rows::Sample;
use crate::model::record::{ConnRecord, DnsRecord, Proto, ServiceRecord};
use crate::model::update::{CaptureStats, Update};
use crate::stats::Aggregator;
use crate::stats::timeline::Timeline;

pub use self::detail::{ConnRow, Detail, Histogram, LIFETIME_BUCKETS};
pub use self::rows::{ServiceRow, SortKey};

/// Closed connections kept for display (all open ones are kept).
pub const CLOSED_KEPT: usize = 10_000;
/// Connection rows built for the Service screen (oldest open first).
pub const CONN_ROWS: usize = 2_000;
/// Aggregates (percentiles over every connection) are recomputed at most this often.
const STATS_EVERY: TimeDelta = TimeDelta::seconds(1);

/// A Service as the aggregator keys it: name (or original_dst when unnamed) and proto.
pub type ServiceKey = (String, Proto);

fn conn_key(record: &ConnRecord) -> ServiceKey {
    let name = match &record.service {
        Some(name) => name.to_string(),
        None => record.original_dst.to_string(),
    };
    (name, record.proto)
}

fn millis(delta: TimeDelta) -> f64 {
    delta
        .num_microseconds()
        .map_or(f64::MAX, |us| us as f64 / 1000.0)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Screen {
    Services,
    Service(ServiceKey),
    /// DNS lookups per client (`d`).
    Dns,
}

/// Everything the view reacts to.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Key(KeyEvent),
    /// Time to refresh what is shown; `now` is injected so tests are deterministic.
    Tick(DateTime<Utc>),
    /// Boxed: a connection record is large next to a key or a tick.
    Live(Box<Update>),
    /// The capture side stopped sending (capture ended, or a replay was fully loaded).
    UpdatesClosed,
    /// `run` finished writing an export.
    Exported {
        path: String,
        result: Result<usize, String>,
    },
}

/// What `update` asks `run` to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    Quit,
    /// Write the rows of `screen` in `shown` to `path` (as `export::file` lays them out).
    Export {
        path: String,
        screen: Screen,
        /// Boxed: a copy of everything shown, while `Quit` is nothing.
        shown: Box<Shown>,
    },
}

/// What is drawn: refreshed on ticks (not per update), frozen while paused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shown {
    /// The clock ages are measured against (the data's own clock in a replay).
    pub at: Option<DateTime<Utc>>,
    pub rows: Vec<ServiceRow>,
    /// Indexes into `rows` after filter and sort.
    pub visible: Vec<usize>,
    pub events_per_s: Option<f64>,
    pub detail: Option<Detail>,
}

impl Shown {
    /// The row of Service `key`, filtered out or not.
    pub fn row(&self, key: &ServiceKey) -> Option<&ServiceRow> {
        self.rows
            .iter()
            .find(|row| row.stats.service == key.0 && row.stats.proto == key.1)
    }
}

pub struct App {
    pub(crate) title: String,
    pub(crate) recording: Option<String>,
    pub(crate) replay: bool,
    aggregator: Aggregator,
    /// Latest definition per Service and netns, to rebuild the aggregator on reset.
    service_records: BTreeMap<(String, Proto, u32), ServiceRecord>,
    conns: ConnTable,
    /// Closed-connection lifetimes per Service, counted as they close.
    histograms: HashMap<ServiceKey, Histogram>,
    /// Endpoints that left or joined the rules, with their pins and first connections.
    timeline: Timeline,
    pub(crate) capture: CaptureStats,
    /// Lost events at the last reset.
    lost_baseline: u64,
    samples: VecDeque<Sample>,
    stats_at: Option<DateTime<Utc>>,
    /// Latest time found in the data (replay measures ages against it).
    data_clock: Option<DateTime<Utc>>,
    first_seen: Option<DateTime<Utc>>,
    /// Wall time of the last tick.
    pub(crate) now: DateTime<Utc>,
    pub(crate) shown: Shown,
    pub(crate) screen: Screen,
    pub(crate) selected: usize,
    pub(crate) conn_selected: usize,
    pub(crate) filter: String,
    pub(crate) editing_filter: bool,
    pub(crate) sort: SortKey,
    pub(crate) paused: bool,
    pub(crate) help: bool,
    /// Addresses shown as `namespace/pod` where the pod is known, the default (`n`
    /// toggles to IP addresses).
    pub(crate) pod_names: bool,
    pub(crate) ended: bool,
    /// A one-line notice (export written, counters reset...).
    pub(crate) message: Option<String>,
    /// The latest DNS queries (at most `DNS_KEPT`), for the DNS screen.
    pub(crate) dns: VecDeque<DnsRecord>,
    /// conntrack's readings per namespace: the warning line above the tables.
    pub(crate) pressure: pressure::Pressure,
}

/// DNS queries the live view keeps: enough for the walks of the last minutes.
const DNS_KEPT: usize = 5_000;

impl App {
    pub fn new(title: &str, recording: Option<String>, replay: bool, now: DateTime<Utc>) -> App {
        App {
            title: title.to_owned(),
            recording,
            replay,
            aggregator: Aggregator::default(),
            service_records: BTreeMap::new(),
            conns: ConnTable::new(CLOSED_KEPT),
            histograms: HashMap::new(),
            timeline: Timeline::default(),
            capture: CaptureStats::default(),
            lost_baseline: 0,
            samples: VecDeque::new(),
            stats_at: None,
            data_clock: None,
            first_seen: None,
            now,
            shown: Shown::default(),
            screen: Screen::Services,
            selected: 0,
            conn_selected: 0,
            filter: String::new(),
            editing_filter: false,
            sort: SortKey::Name,
            paused: false,
            help: false,
            pod_names: true,
            ended: false,
            message: None,
            dns: VecDeque::new(),
            pressure: Default::default(),
        }
    }

    /// Lost connections (DNAT decisions without a record) since start or the last reset.
    pub fn lost_connections(&self) -> u64 {
        self.capture
            .lost_connections
            .saturating_sub(self.lost_baseline)
    }

    /// The Services-screen row under the cursor.
    pub fn selected_row(&self) -> Option<&ServiceRow> {
        let index = *self.shown.visible.get(self.selected)?;
        self.shown.rows.get(index)
    }

    /// The row of the Service the Service screen shows.
    pub fn shown_service(&self) -> Option<&ServiceRow> {
        let Screen::Service(key) = &self.screen else {
            return None;
        };
        self.shown.row(key)
    }

    fn clock(&self) -> DateTime<Utc> {
        if self.replay {
            self.data_clock.unwrap_or(self.now)
        } else {
            self.now
        }
    }

    fn see_time(&mut self, time: DateTime<Utc>) {
        self.data_clock = Some(self.data_clock.map_or(time, |t| t.max(time)));
    }

    fn apply(&mut self, update: Update) {
        match update {
            Update::Conn { id, record } => {
                self.first_seen = Some(
                    self.first_seen
                        .map_or(record.start, |t| t.min(record.start)),
                );
                let last = record.end.unwrap_or_else(|| {
                    record.start + TimeDelta::microseconds((record.duration_ms * 1000.0) as i64)
                });
                self.see_time(last);
                self.aggregator.apply(id, &record);
                self.timeline.conn(id, &record);
                let key = conn_key(&record);
                let duration = record.duration_ms;
                if self.conns.apply(id, record) == Change::Closed {
                    self.histograms.entry(key).or_default()[bucket(duration)] += 1;
                }
            }
            Update::Service(service) => {
                self.see_time(service.time);
                self.aggregator.add_service(&service);
                self.service_records.insert(
                    (service.service.clone(), service.proto, service.netns),
                    service,
                );
            }
            Update::Stats(stats) => self.capture = stats,
            Update::Endpoints(change) => {
                self.see_time(change.time);
                self.timeline.change(&change);
            }
            Update::Dns(record) => {
                self.see_time(record.time);
                if self.dns.len() == DNS_KEPT {
                    self.dns.pop_front();
                }
                self.dns.push_back(record);
            }
            Update::Reject(record) => {
                self.see_time(record.time);
                self.aggregator.add_reject(&record);
            }
            Update::Conntrack { netns, reading } => self.pressure.apply(netns, reading),
        }
    }

    /// Forgets closed connections, cumulative counts (rejected connections too), rates
    /// and lost connections; keeps Service definitions and open connections.
    fn reset(&mut self) {
        let mut aggregator = Aggregator::default();
        for service in self.service_records.values() {
            aggregator.add_service(service);
        }
        for (id, record) in self.conns.open() {
            aggregator.apply(*id, record);
        }
        self.aggregator = aggregator;
        self.conns.clear_closed();
        self.histograms.clear();
        self.samples.clear();
        self.lost_baseline = self.capture.lost_connections;
        self.first_seen = self.conns.open().map(|(_, r)| r.start).min();
        self.message = Some("counters reset".to_owned());
    }

    /// Rebuilds what is drawn. Aggregates are recomputed at most every `STATS_EVERY`
    /// unless `force`d; filter, sort and the connection list always.
    fn refresh(&mut self, force: bool) {
        let due = self.stats_at.is_none_or(|at| self.now - at >= STATS_EVERY);
        if force || due {
            self.refresh_stats();
        }
        let selected = self.selected_row().map(ServiceRow::key);
        self.refilter();
        if let Some(key) = selected
            && let Some(index) = self
                .shown
                .visible
                .iter()
                .position(|&i| self.shown.rows[i].key() == key)
        {
            self.selected = index;
        }
        self.clamp_selection();
        self.shown.at = Some(self.clock());
        self.refresh_detail();
    }

    /// Rebuilds the current screen's detail only: switching screens needs it even
    /// while paused, and the aggregates stay as they were.
    fn refresh_detail(&mut self) {
        self.shown.detail = match &self.screen {
            Screen::Service(key) => Some(self.detail(key)),
            Screen::Services | Screen::Dns => None,
        };
        self.clamp_selection();
    }

    fn clamp_selection(&mut self) {
        self.selected = self
            .selected
            .min(self.shown.visible.len().saturating_sub(1));
        let conns = self.shown.detail.as_ref().map_or(0, |d| d.conns.len());
        self.conn_selected = self.conn_selected.min(conns.saturating_sub(1));
    }
}

/// Applies one message; returns what `run` must do about it, if anything.
pub fn update(app: &mut App, msg: Msg) -> Option<Effect> {
    match msg {
        Msg::Key(key) => return app.key(key),
        Msg::Tick(now) => {
            app.now = now;
            if !app.paused {
                app.refresh(false);
            }
        }
        Msg::Live(update) => app.apply(*update),
        Msg::UpdatesClosed => app.ended = true,
        Msg::Exported { path, result } => {
            app.message = Some(match result {
                Ok(lines) => format!("exported {lines} lines to {path}"),
                Err(err) => format!("export failed: {err}"),
            });
        }
    }
    None
}
