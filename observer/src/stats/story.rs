//! The connections behind a skew: the busiest ones (client, pod, since when), and whether
//! those that carry the skewed backend's excess opened while another endpoint was out of
//! the rules (a rollout or readiness window, from the endpoints timeline).
//!
//! An endpoint of the current rules is missing from an `endpoints` line that removed it
//! until one that added it back; one whose first change is an addition was missing from
//! before the recording until then. A connection to the skewed backend opened inside
//! such a window of another endpoint could not have gone to that endpoint: if those
//! connections carried at least the backend's excess (its requests beyond its expected
//! share), the window explains the skew.

use std::net::SocketAddr;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::ServiceStats;
use super::timeline::ServiceTimeline;
use crate::model::record::{Close, ConnRecord, Proto};

/// Connections listed as the busiest.
pub const TOP: usize = 3;

/// One of the busiest connections.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TopConnection {
    pub client: SocketAddr,
    pub client_pod: Option<String>,
    pub backend: SocketAddr,
    pub backend_pod: Option<String>,
    #[serde(serialize_with = "crate::model::record::micros::serialize")]
    pub start: DateTime<Utc>,
    pub requests: u64,
    /// Still open at the end of what was seen.
    pub open: bool,
}

/// Connections to the skewed backend that opened while another endpoint was missing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rollout {
    /// The skewed backend and its pod where known.
    pub backend: SocketAddr,
    pub backend_pod: Option<String>,
    /// The endpoint that was out of the rules and its pod where known.
    pub missing: SocketAddr,
    pub missing_pod: Option<String>,
    /// When it left the rules (`None`: before the recording began) and came back
    /// (`None`: it has not come back).
    #[serde(serialize_with = "serialize_time_opt")]
    pub left: Option<DateTime<Utc>>,
    #[serde(serialize_with = "serialize_time_opt")]
    pub joined: Option<DateTime<Utc>>,
    /// The skewed backend's connections opened in that window and what they carried.
    pub connections: u64,
    pub requests: u64,
    #[serde(serialize_with = "crate::model::record::micros::serialize")]
    pub first_opened: DateTime<Utc>,
    #[serde(serialize_with = "crate::model::record::micros::serialize")]
    pub last_opened: DateTime<Utc>,
    /// The backend's requests beyond its expected share.
    pub excess: f64,
    /// Whether those connections carried at least the excess.
    pub explains: bool,
}

fn serialize_time_opt<S: serde::Serializer>(
    time: &Option<DateTime<Utc>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => crate::model::record::micros::serialize(time, s),
        None => s.serialize_none(),
    }
}

/// The connections behind one Service's skew.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Story {
    /// The busiest connections, most requests first.
    pub top: Vec<TopConnection>,
    /// The busiest backend's connections opened while another endpoint was missing.
    pub rollout: Option<Rollout>,
}

/// Whether `record` belongs to Service `service` (keyed as the aggregator keys it).
pub fn belongs(record: &ConnRecord, service: &str, proto: Proto) -> bool {
    record.proto == proto
        && match &record.service {
            Some(name) => **name == *service,
            None => record.original_dst.to_string() == service,
        }
}

/// A window in which an endpoint was out of the rules: `(left, joined)`, `None` for before
/// the recording and for not yet.
type Window = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// The windows in which `endpoint` was out of the rules.
fn missing(endpoint: SocketAddr, timeline: &ServiceTimeline) -> Vec<Window> {
    let mut changes: Vec<(DateTime<Utc>, bool)> = timeline
        .departures
        .iter()
        .filter(|d| d.backend == endpoint)
        .map(|d| (d.left, false))
        .chain(
            timeline
                .arrivals
                .iter()
                .filter(|a| a.backend == endpoint)
                .map(|a| (a.joined, true)),
        )
        .collect();
    changes.sort();
    let mut windows = Vec::new();
    // Missing from the start when its first change adds it.
    let mut since: Option<Option<DateTime<Utc>>> = changes.first().filter(|c| c.1).map(|_| None);
    for (time, added) in changes {
        match (added, since) {
            (true, Some(left)) => {
                windows.push((left, Some(time)));
                since = None;
            }
            (false, None) => since = Some(Some(time)),
            _ => {}
        }
    }
    if let Some(left) = since {
        windows.push((left, None));
    }
    windows
}

fn inside(
    time: DateTime<Utc>,
    (left, joined): (Option<DateTime<Utc>>, Option<DateTime<Utc>>),
) -> bool {
    left.is_none_or(|left| time >= left) && joined.is_none_or(|joined| time < joined)
}

impl Story {
    /// From the Service's figures, its connections (any order; others are skipped) and its
    /// endpoints timeline.
    pub fn of<'a>(
        service: &ServiceStats,
        conns: impl Iterator<Item = &'a ConnRecord>,
        timeline: &ServiceTimeline,
    ) -> Story {
        let mine: Vec<&ConnRecord> = conns
            .filter(|c| belongs(c, &service.service, service.proto))
            .collect();
        // Most requests first, the earlier on ties; only the first `TOP` sorted (the live
        // view asks every refresh, over thousands of connections).
        let order = |a: &&ConnRecord, b: &&ConnRecord| {
            b.requests.cmp(&a.requests).then(a.start.cmp(&b.start))
        };
        let mut busiest = mine.clone();
        if busiest.len() > TOP {
            busiest.select_nth_unstable_by(TOP - 1, order);
            busiest.truncate(TOP);
        }
        busiest.sort_by(order);
        let top = busiest
            .iter()
            .filter(|c| c.requests > 0)
            .map(|c| TopConnection {
                client: c.client,
                client_pod: c.client_pod.as_deref().map(str::to_owned),
                backend: c.backend,
                backend_pod: c.backend_pod.as_deref().map(str::to_owned),
                start: c.start,
                requests: c.requests,
                open: c.close == Close::Open,
            })
            .collect();
        let opened: Vec<Opened> = mine.iter().map(|c| Opened::of(c)).collect();
        Story {
            top,
            rollout: rollout(service, &opened, timeline),
        }
    }
}

/// What the rollout window needs of one of the Service's connections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Opened {
    pub backend: SocketAddr,
    pub start: DateTime<Utc>,
    pub requests: u64,
}

impl Opened {
    pub fn of(record: &ConnRecord) -> Opened {
        Opened {
            backend: record.backend,
            start: record.start,
            requests: record.requests,
        }
    }
}

/// The skewed backend's connections (among `conns`, the Service's) opened while another
/// endpoint was out of the rules, for the endpoint whose windows hold most of its
/// requests.
pub fn rollout(
    service: &ServiceStats,
    conns: &[Opened],
    timeline: &ServiceTimeline,
) -> Option<Rollout> {
    let detail = service.skew_detail()?;
    let backend = detail.backend;
    let total: u64 = service
        .backends
        .iter()
        .filter(|b| b.expected_share.is_some_and(|e| e > 0.0))
        .map(|b| b.requests)
        .sum();
    let excess = backend.requests as f64 - backend.expected_share? * total as f64;
    // The other endpoint whose windows hold the most of the backend's requests.
    let found = service
        .backends
        .iter()
        .filter(|b| b.backend != backend.backend && b.expected_share.is_some_and(|e| e > 0.0))
        .filter_map(|other| {
            let windows = missing(other.backend, timeline);
            let opened: Vec<&Opened> = conns
                .iter()
                .filter(|c| c.backend == backend.backend)
                .filter(|c| windows.iter().any(|w| inside(c.start, *w)))
                .collect();
            let requests: u64 = opened.iter().map(|c| c.requests).sum();
            // The window of the busiest of them.
            let busiest = opened.iter().max_by_key(|c| c.requests)?;
            let window = windows
                .iter()
                .copied()
                .find(|w| inside(busiest.start, *w))?;
            Some((other, window, opened, requests))
        })
        .max_by_key(|(_, _, _, requests)| *requests)?;
    let (other, (left, joined), opened, requests) = found;
    Some(Rollout {
        backend: backend.backend,
        backend_pod: backend.pod.clone(),
        missing: other.backend,
        missing_pod: other.pod.clone(),
        left,
        joined,
        connections: opened.len() as u64,
        requests,
        first_opened: opened.iter().map(|c| c.start).min()?,
        last_opened: opened.iter().map(|c| c.start).max()?,
        excess,
        explains: excess > 0.0 && requests as f64 >= excess,
    })
}
