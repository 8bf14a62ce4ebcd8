//! The Services screen's rows: per-Service aggregates with rates, then filter and sort.

use std::collections::HashMap;
use std::net::SocketAddr;

use chrono::{DateTime, TimeDelta, Utc};

use super::{App, ServiceKey, millis};
use crate::stats::ServiceStats;

/// Rates are averaged over about this long.
const RATE_WINDOW: TimeDelta = TimeDelta::seconds(2);

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
    pub(super) fn next(self) -> SortKey {
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

/// Samples of cumulative counters, for rates.
#[derive(Clone, Debug)]
pub(super) struct Sample {
    at: DateTime<Utc>,
    events: u64,
    services: HashMap<ServiceKey, (u64, u64)>,
}

impl App {
    /// Recomputes every Service's aggregates and rates into `shown`.
    pub(super) fn refresh_stats(&mut self) {
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
        self.shown.events_per_s = if self.replay {
            None
        } else {
            rate(self.capture.events, oldest.events)
        };
        self.shown.rows = services
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

    /// Recomputes which rows the filter lets through, in sort order.
    pub(super) fn refilter(&mut self) {
        let needle = self.filter.to_lowercase();
        let rows = &self.shown.rows;
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
        self.shown.visible = visible;
    }
}
