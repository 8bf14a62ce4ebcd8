//! The rules' timeline: per Service, each endpoint that left the rules (a readiness
//! flip, a rollout) with the last new connection it got before, the connections still
//! pinned to it afterwards (stale pins) and how long they lasted, and new connections
//! it got after leaving (the rules should make that 0); and each endpoint that joined,
//! with its first connection. Pure: fed endpoint changes and connection records, live
//! (in any order the capture sends them) or from a recording.
//!
//! Definitions: an endpoint left at the `endpoints` line's `time`. A connection to it
//! that started before then is "before": the latest such start is `last_new`, and it
//! is a stale pin if it was still open at that moment (no end, or an end after it). One
//! that started at or after then, before the endpoint came back, is `late`. An added
//! endpoint's first connection is the earliest start at or after it joined.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::model::record::{ConnRecord, EndpointsRecord, Proto, Recording};
use crate::model::update::ConnId;

/// A Service port in one namespace's rules.
pub type ServiceKey = (String, Proto, u32);

/// A connection pinned to an endpoint when the endpoint left the rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Pin {
    pub client: SocketAddr,
    pub start: DateTime<Utc>,
    /// `None` while it is still open.
    pub end: Option<DateTime<Utc>>,
}

impl Pin {
    /// How long it stayed pinned after `left` (until `now` while still open).
    pub fn stale_for(&self, left: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
        (self.end.unwrap_or(now) - left)
            .to_std()
            .unwrap_or_default()
    }
}

/// An endpoint that left a Service's rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Departure {
    pub backend: SocketAddr,
    pub left: DateTime<Utc>,
    /// The start of the last connection it got before it left.
    pub last_new: Option<DateTime<Utc>>,
    /// Connections open to it when it left.
    pub pins: BTreeMap<ConnId, Pin>,
    /// Connections that reached it after it left (and before it came back).
    pub late: BTreeSet<ConnId>,
    /// When it came back into the rules, if it did.
    pub returned: Option<DateTime<Utc>>,
}

impl Departure {
    /// Pins not closed yet.
    pub fn still_pinned(&self) -> usize {
        self.pins.values().filter(|pin| pin.end.is_none()).count()
    }

    /// The longest any pin lasted after it left (until `now` for open ones).
    pub fn longest_pin(&self, now: DateTime<Utc>) -> Option<Duration> {
        self.pins
            .values()
            .map(|pin| pin.stale_for(self.left, now))
            .max()
    }
}

/// An endpoint that joined a Service's rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrival {
    pub backend: SocketAddr,
    pub joined: DateTime<Utc>,
    /// The start of its first connection since.
    pub first_conn: Option<DateTime<Utc>>,
}

/// One Service port's changes, in the order they happened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceTimeline {
    pub departures: Vec<Departure>,
    pub arrivals: Vec<Arrival>,
}

/// An open connection to a named Service, as the timeline needs it.
struct Open {
    key: ServiceKey,
    backend: SocketAddr,
    pin: Pin,
}

#[derive(Default)]
pub struct Timeline {
    services: BTreeMap<ServiceKey, ServiceTimeline>,
    /// Open connections (the ones an endpoint leaving leaves pinned).
    open: HashMap<ConnId, Open>,
    /// The latest connection start per Service port and backend.
    last_start: HashMap<(ServiceKey, SocketAddr), DateTime<Utc>>,
}

impl Timeline {
    /// The timeline of a recording: its endpoint changes and connections.
    pub fn from_recording(recording: &Recording) -> Timeline {
        let mut timeline = Timeline::default();
        for change in &recording.endpoints {
            timeline.change(change);
        }
        for (index, conn) in recording.conns.iter().enumerate() {
            let id = ConnId {
                conntrack: index as u64,
                start_ns: 0,
            };
            timeline.conn(id, conn);
        }
        timeline
    }

    /// Takes in one `endpoints` line.
    pub fn change(&mut self, change: &EndpointsRecord) {
        let key = (change.service.clone(), change.proto, change.netns);
        let service = self.services.entry(key.clone()).or_default();
        for &backend in &change.removed {
            let pins = self
                .open
                .iter()
                .filter(|(_, open)| {
                    open.key == key && open.backend == backend && open.pin.start < change.time
                })
                .map(|(id, open)| (*id, open.pin.clone()))
                .collect();
            let last_new = self
                .last_start
                .get(&(key.clone(), backend))
                .copied()
                .filter(|start| *start < change.time);
            service.departures.push(Departure {
                backend,
                left: change.time,
                last_new,
                pins,
                late: BTreeSet::new(),
                returned: None,
            });
        }
        for &backend in &change.added {
            for departure in &mut service.departures {
                if departure.backend == backend && departure.returned.is_none() {
                    departure.returned = Some(change.time);
                }
            }
            service.arrivals.push(Arrival {
                backend,
                joined: change.time,
                first_conn: None,
            });
        }
    }

    /// Takes in a connection record (opened, progressing or final); `id` tells updates
    /// of the same connection apart.
    pub fn conn(&mut self, id: ConnId, record: &ConnRecord) {
        let Some(name) = &record.service else {
            return;
        };
        let key = (name.to_string(), record.proto, record.netns);
        let (start, end) = (record.start, record.end);
        let last = self
            .last_start
            .entry((key.clone(), record.backend))
            .or_insert(start);
        *last = (*last).max(start);
        let pin = Pin {
            client: record.client,
            start,
            end,
        };
        if let Some(service) = self.services.get_mut(&key) {
            for departure in service
                .departures
                .iter_mut()
                .filter(|d| d.backend == record.backend)
            {
                departure.see(id, &pin);
            }
            for arrival in service
                .arrivals
                .iter_mut()
                .filter(|a| a.backend == record.backend && start >= a.joined)
            {
                arrival.first_conn = Some(arrival.first_conn.map_or(start, |f| f.min(start)));
            }
        }
        if end.is_none() {
            self.open.insert(
                id,
                Open {
                    key,
                    backend: record.backend,
                    pin,
                },
            );
        } else {
            self.open.remove(&id);
        }
    }

    /// Service ports with changes, by name.
    pub fn services(&self) -> impl Iterator<Item = (&ServiceKey, &ServiceTimeline)> {
        self.services.iter()
    }

    /// One Service port's changes (any namespace's, merged in time order).
    pub fn service(&self, name: &str, proto: Proto) -> ServiceTimeline {
        let mut merged = ServiceTimeline::default();
        for ((service, p, _), timeline) in &self.services {
            if service == name && *p == proto {
                merged
                    .departures
                    .extend(timeline.departures.iter().cloned());
                merged.arrivals.extend(timeline.arrivals.iter().cloned());
            }
        }
        merged.departures.sort_by_key(|d| d.left);
        merged.arrivals.sort_by_key(|a| a.joined);
        merged
    }
}

impl Departure {
    fn see(&mut self, id: ConnId, pin: &Pin) {
        if pin.start < self.left {
            self.last_new = Some(self.last_new.map_or(pin.start, |l| l.max(pin.start)));
            if pin.end.is_none_or(|end| end > self.left) {
                self.pins.insert(id, pin.clone());
            } else {
                self.pins.remove(&id);
            }
        } else if self.returned.is_none_or(|back| pin.start < back) {
            self.late.insert(id);
        }
    }
}

#[cfg(test)]
#[path = "tests/timeline.rs"]
mod tests;
