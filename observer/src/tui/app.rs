//! The live view's state and its pure `update`: keys, ticks and capture updates in,
//! state (and at most one side effect for `run` to perform) out. No I/O here.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;

use chrono::{DateTime, TimeDelta, Utc};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::conns::{Change, ConnTable};
use crate::model::record::{Close, ConnRecord, Proto, ServiceRecord};
use crate::model::update::{CaptureStats, Update};
use crate::stats::{Aggregator, ServiceStats};

/// Closed connections kept for display (all open ones are kept).
pub const CLOSED_KEPT: usize = 10_000;
/// Connection rows built for the Service screen (oldest open first).
pub const CONN_ROWS: usize = 2_000;
/// Aggregates (percentiles over every connection) are recomputed at most this often.
const STATS_EVERY: TimeDelta = TimeDelta::seconds(1);
/// Rates are averaged over about this long.
const RATE_WINDOW: TimeDelta = TimeDelta::seconds(2);

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

/// A Service as the aggregator keys it: name (or original_dst when unnamed) and proto.
pub type ServiceKey = (String, Proto);

fn conn_key(record: &ConnRecord) -> ServiceKey {
    let name = match &record.service {
        Some(name) => name.clone(),
        None => record.original_dst.to_string(),
    };
    (name, record.proto)
}

fn bucket(duration_ms: f64) -> usize {
    LIFETIME_BUCKETS
        .iter()
        .position(|(limit, _)| duration_ms < *limit)
        .unwrap_or(LIFETIME_BUCKETS.len() - 1)
}

fn millis(delta: TimeDelta) -> f64 {
    delta
        .num_microseconds()
        .map_or(f64::MAX, |us| us as f64 / 1000.0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Name,
    Active,
    NewPerSec,
    RequestsPerSec,
    Skew,
    StalePins,
}

impl SortKey {
    fn next(self) -> SortKey {
        match self {
            SortKey::Name => SortKey::Active,
            SortKey::Active => SortKey::NewPerSec,
            SortKey::NewPerSec => SortKey::RequestsPerSec,
            SortKey::RequestsPerSec => SortKey::Skew,
            SortKey::Skew => SortKey::StalePins,
            SortKey::StalePins => SortKey::Name,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::Active => "active",
            SortKey::NewPerSec => "new/s",
            SortKey::RequestsPerSec => "req/s",
            SortKey::Skew => "skew",
            SortKey::StalePins => "stale",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Screen {
    Services,
    Service(ServiceKey),
}

/// Everything the view reacts to.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Key(KeyEvent),
    /// Time to refresh what is shown; `now` is injected so tests are deterministic.
    Tick(DateTime<Utc>),
    Live(Update),
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
    /// Write `contents` (JSON Lines, `lines` of them) to `path`.
    Export {
        path: String,
        contents: String,
        lines: usize,
    },
}

/// One Services-screen row.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceRow {
    pub stats: ServiceStats,
    /// `None` until two samples exist.
    pub new_per_s: Option<f64>,
    pub requests_per_s: Option<f64>,
}

impl ServiceRow {
    pub fn key(&self) -> ServiceKey {
        (self.stats.service.clone(), self.stats.proto)
    }

    /// The first frontend ("10.96.0.10:53", ":30080" for a NodePort) and how many more.
    pub fn frontend(&self) -> String {
        let Some(first) = self.stats.frontends.first() else {
            // Unnamed Services are keyed by what the client dialed.
            return if self.stats.named {
                "-".to_owned()
            } else {
                self.stats.service.clone()
            };
        };
        let mut text = match first.ip {
            Some(ip) => SocketAddr::new(ip, first.port).to_string(),
            None => format!(":{}", first.port),
        };
        if self.stats.frontends.len() > 1 {
            text.push_str(&format!(" +{}", self.stats.frontends.len() - 1));
        }
        text
    }
}

/// One live-connection row of the Service screen.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnRow {
    pub client: SocketAddr,
    pub backend: SocketAddr,
    /// Open: time since the first packet; closed: how long it stayed pinned.
    pub age_ms: f64,
    pub requests: u64,
    /// Open: time since the last packet seen; `None` when closed.
    pub idle_ms: Option<f64>,
    pub close: Close,
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
}

/// Samples of cumulative counters, for rates.
#[derive(Clone, Debug)]
struct Sample {
    at: DateTime<Utc>,
    events: u64,
    services: HashMap<ServiceKey, (u64, u64)>,
}

/// What is drawn: refreshed on ticks (not per update), frozen while paused.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    /// The clock ages are measured against (the data's own clock in a replay).
    pub at: Option<DateTime<Utc>>,
    pub rows: Vec<ServiceRow>,
    /// Indexes into `rows` after filter and sort.
    pub visible: Vec<usize>,
    pub events_per_s: Option<f64>,
    pub detail: Option<Detail>,
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
    pub(crate) frame: Frame,
    pub(crate) screen: Screen,
    pub(crate) selected: usize,
    pub(crate) conn_selected: usize,
    pub(crate) filter: String,
    pub(crate) editing_filter: bool,
    pub(crate) sort: SortKey,
    pub(crate) paused: bool,
    pub(crate) help: bool,
    pub(crate) ended: bool,
    /// A one-line notice (export written, counters reset...).
    pub(crate) message: Option<String>,
}

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
            capture: CaptureStats::default(),
            lost_baseline: 0,
            samples: VecDeque::new(),
            stats_at: None,
            data_clock: None,
            first_seen: None,
            now,
            frame: Frame::default(),
            screen: Screen::Services,
            selected: 0,
            conn_selected: 0,
            filter: String::new(),
            editing_filter: false,
            sort: SortKey::Name,
            paused: false,
            help: false,
            ended: false,
            message: None,
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
        let index = *self.frame.visible.get(self.selected)?;
        self.frame.rows.get(index)
    }

    /// The row of the Service the Service screen shows.
    pub fn shown_service(&self) -> Option<&ServiceRow> {
        let Screen::Service(key) = &self.screen else {
            return None;
        };
        self.frame
            .rows
            .iter()
            .find(|row| row.stats.service == key.0 && row.stats.proto == key.1)
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
        }
    }

    /// Forgets closed connections, cumulative counts, rates and lost connections; keeps
    /// Service definitions and open connections.
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
                .frame
                .visible
                .iter()
                .position(|&i| self.frame.rows[i].key() == key)
        {
            self.selected = index;
        }
        self.clamp_selection();
        self.frame.at = Some(self.clock());
        self.frame.detail = match &self.screen {
            Screen::Service(key) => Some(self.detail(key)),
            Screen::Services => None,
        };
        self.clamp_selection();
    }

    fn refresh_stats(&mut self) {
        let services = self.aggregator.services();
        let sample = Sample {
            at: self.now,
            events: self.capture.events,
            services: services
                .iter()
                .map(|s| ((s.service.clone(), s.proto), (s.connections, s.requests)))
                .collect(),
        };
        self.samples.push_back(sample);
        while self.samples.len() > 2 && self.samples[1].at <= self.now - RATE_WINDOW {
            self.samples.pop_front();
        }
        let oldest = &self.samples[0];
        let seconds = millis(self.now - oldest.at) / 1000.0;
        let rate = |now: u64, then: u64| {
            (seconds > 0.0).then(|| now.saturating_sub(then) as f64 / seconds)
        };
        // A replay arrives all at once: average over the recording's span instead.
        let span = match (self.first_seen, self.data_clock) {
            (Some(first), Some(last)) if last > first => Some(millis(last - first) / 1000.0),
            _ => None,
        };
        self.frame.events_per_s = if self.replay {
            None
        } else {
            rate(self.capture.events, oldest.events)
        };
        self.frame.rows = services
            .into_iter()
            .map(|stats| {
                let (new_per_s, requests_per_s) = if self.replay {
                    (
                        span.map(|s| stats.connections as f64 / s),
                        span.map(|s| stats.requests as f64 / s),
                    )
                } else {
                    let (conns, requests) = oldest
                        .services
                        .get(&(stats.service.clone(), stats.proto))
                        .copied()
                        .unwrap_or((0, 0));
                    (
                        rate(stats.connections, conns),
                        rate(stats.requests, requests),
                    )
                };
                ServiceRow {
                    stats,
                    new_per_s,
                    requests_per_s,
                }
            })
            .collect();
        self.stats_at = Some(self.now);
    }

    fn refilter(&mut self) {
        let needle = self.filter.to_lowercase();
        let rows = &self.frame.rows;
        let mut visible: Vec<usize> = (0..rows.len())
            .filter(|&i| {
                needle.is_empty()
                    || rows[i].stats.service.to_lowercase().contains(&needle)
                    || rows[i].frontend().to_lowercase().contains(&needle)
            })
            .collect();
        let by_name = |a: &ServiceRow, b: &ServiceRow| a.key().cmp(&b.key());
        let rate = |r: Option<f64>| r.unwrap_or(0.0);
        visible.sort_by(|&a, &b| {
            let (a, b) = (&rows[a], &rows[b]);
            // Numbers sort largest first; ties by name.
            let order = match self.sort {
                SortKey::Name => std::cmp::Ordering::Equal,
                SortKey::Active => b.stats.active.cmp(&a.stats.active),
                SortKey::NewPerSec => rate(b.new_per_s).total_cmp(&rate(a.new_per_s)),
                SortKey::RequestsPerSec => {
                    rate(b.requests_per_s).total_cmp(&rate(a.requests_per_s))
                }
                SortKey::Skew => b
                    .stats
                    .skew
                    .unwrap_or(0.0)
                    .total_cmp(&a.stats.skew.unwrap_or(0.0)),
                SortKey::StalePins => b.stats.stale_pins.cmp(&a.stats.stale_pins),
            };
            order.then_with(|| by_name(a, b))
        });
        self.frame.visible = visible;
    }

    fn clamp_selection(&mut self) {
        self.selected = self
            .selected
            .min(self.frame.visible.len().saturating_sub(1));
        let conns = self.frame.detail.as_ref().map_or(0, |d| d.conns.len());
        self.conn_selected = self.conn_selected.min(conns.saturating_sub(1));
    }

    /// Bounded work even with many thousands of connections: one pass to filter and
    /// count, then only the rows shown are sorted and built.
    fn detail(&self, key: &ServiceKey) -> Detail {
        let clock = self.clock();
        let unnamed: Option<SocketAddr> = key.0.parse().ok();
        let belongs = |record: &&ConnRecord| {
            record.proto == key.1
                && match &record.service {
                    Some(name) => *name == key.0,
                    None => Some(record.original_dst) == unnamed,
                }
        };
        let age = |record: &ConnRecord| millis(clock - record.start).max(record.duration_ms);
        let open_row = |record: &ConnRecord| {
            let age_ms = age(record);
            ConnRow {
                client: record.client,
                backend: record.backend,
                age_ms,
                requests: record.requests,
                idle_ms: Some((age_ms - record.duration_ms).max(0.0)),
                close: record.close,
            }
        };
        let closed_row = |record: &ConnRecord| ConnRow {
            client: record.client,
            backend: record.backend,
            age_ms: record.duration_ms,
            requests: record.requests,
            idle_ms: None,
            close: record.close,
        };

        let mut histogram = self.histograms.get(key).copied().unwrap_or_default();
        let mut open: Vec<&ConnRecord> =
            self.conns.open().map(|(_, r)| r).filter(belongs).collect();
        let mut longest: Option<&ConnRecord> = None;
        for record in &open {
            histogram[bucket(record.duration_ms)] += 1;
            if longest.is_none_or(|l| age(record) > age(l)) {
                longest = Some(record);
            }
        }
        let mut longest = longest.map(open_row);
        let order = |a: &&ConnRecord, b: &&ConnRecord| {
            (a.start, a.client, a.backend).cmp(&(b.start, b.client, b.backend))
        };
        let open_count = open.len();
        if open.len() > CONN_ROWS {
            open.select_nth_unstable_by(CONN_ROWS, order);
            open.truncate(CONN_ROWS);
        }
        open.sort_by(order);
        let mut conns: Vec<ConnRow> = open.iter().map(|r| open_row(r)).collect();

        let mut closed_count = 0;
        for record in self.conns.closed().map(|(_, r)| r).filter(belongs) {
            closed_count += 1;
            if longest
                .as_ref()
                .is_none_or(|l| record.duration_ms > l.age_ms)
            {
                longest = Some(closed_row(record));
            }
            if conns.len() < CONN_ROWS {
                conns.push(closed_row(record));
            }
        }
        Detail {
            conns,
            open: open_count,
            closed: closed_count,
            histogram,
            longest,
        }
    }

    fn key(&mut self, key: KeyEvent) -> Option<Effect> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Some(Effect::Quit);
        }
        if self.editing_filter {
            match key.code {
                KeyCode::Char(c) => self.filter.push(c),
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Enter => self.editing_filter = false,
                KeyCode::Esc => {
                    self.filter.clear();
                    self.editing_filter = false;
                }
                _ => return None,
            }
            self.selected = 0;
            self.refilter();
            self.clamp_selection();
            return None;
        }
        if self.help {
            match key.code {
                KeyCode::Char('q') => return Some(Effect::Quit),
                _ => self.help = false,
            }
            return None;
        }
        let on_service = matches!(self.screen, Screen::Service(_));
        match key.code {
            KeyCode::Char('q') => return Some(Effect::Quit),
            KeyCode::Char('?') => self.help = true,
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-20),
            KeyCode::PageDown => self.move_selection(20),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(isize::MIN),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(isize::MAX),
            KeyCode::Enter if !on_service => {
                if let Some(row) = self.selected_row() {
                    self.screen = Screen::Service(row.key());
                    self.conn_selected = 0;
                    self.refresh_keep_frame();
                }
            }
            KeyCode::Esc if on_service => {
                self.screen = Screen::Services;
                self.refresh_keep_frame();
            }
            KeyCode::Esc => {
                self.filter.clear();
                self.refilter();
                self.clamp_selection();
            }
            KeyCode::Char('/') if !on_service => {
                self.editing_filter = true;
            }
            KeyCode::Char('s') if !on_service => {
                self.sort = self.sort.next();
                self.refilter();
            }
            KeyCode::Char('p') => {
                self.paused = !self.paused;
                if !self.paused {
                    self.refresh(true);
                }
            }
            KeyCode::Char('r') => {
                self.reset();
                self.refresh(true);
            }
            KeyCode::Char('e') => return Some(self.export()),
            _ => {}
        }
        None
    }

    /// Switching screens needs the new screen's detail even while paused; the
    /// aggregates stay as they were.
    fn refresh_keep_frame(&mut self) {
        self.frame.detail = match &self.screen {
            Screen::Service(key) => Some(self.detail(key)),
            Screen::Services => None,
        };
        self.clamp_selection();
    }

    fn move_selection(&mut self, by: isize) {
        let (current, len) = match &self.frame.detail {
            Some(detail) if matches!(self.screen, Screen::Service(_)) => {
                (&mut self.conn_selected, detail.conns.len())
            }
            _ => (&mut self.selected, self.frame.visible.len()),
        };
        let target = current.saturating_add_signed(by);
        *current = target.min(len.saturating_sub(1));
    }

    fn export(&mut self) -> Effect {
        let path = format!(
            "observer-export-{}.jsonl",
            self.now.format("%Y%m%dT%H%M%SZ")
        );
        let lines = super::export::lines(self);
        let contents: String = lines.iter().map(|line| format!("{line}\n")).collect();
        Effect::Export {
            path,
            contents,
            lines: lines.len(),
        }
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
        Msg::Live(update) => app.apply(update),
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
