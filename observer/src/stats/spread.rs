//! The reason behind a skew: how concentrated requests are, how the skew splits between
//! the DNAT's picks and requests per connection, and whether a fair DNAT of the same
//! connections would give as much ([`super::chance`]).
//!
//! Over the backends with a positive expected share, as skew is defined in
//! [`crate::stats`]. For the backend with the highest skew,
//! `skew = connection factor × requests-per-connection factor`: its share of the
//! connections over its expected share (what the DNAT picked), times its requests per
//! connection over the Service's (what the connections carried).

use std::net::SocketAddr;

use serde::Serialize;

use super::chance::{FairDnat, Method, PValue};
use super::mix::RequestMix;
use super::{BackendStats, ServiceStats};

/// What a Service's skew is made of (`summary -o json`'s `spread`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// Connections to the endpoints with an expected share.
    pub connections: u64,
    /// Those that carried at least one request.
    pub busy_connections: u64,
    pub requests: u64,
    /// R² / Σ r² over the connections' request counts: how many equally busy connections
    /// would spread as evenly (1: one connection carried everything).
    pub effective_connections: f64,
    /// The most requests one connection carried.
    pub busiest_connection: u64,
    /// The fewest connections that carried at least half of the requests, and what they
    /// carried.
    pub busiest_half: Carried,
    /// The backend with the highest skew.
    pub backend: SocketAddr,
    pub skew: f64,
    /// Its share of the connections over its expected share (the DNAT's picks).
    pub connection_factor: f64,
    /// Its requests per connection over the Service's (what its connections carried).
    pub requests_per_connection_factor: f64,
    /// The chance that a fair DNAT of these connections gives this skew or more.
    pub chance: PValue,
    /// A skew that a fair DNAT of these connections reaches at least half the time.
    pub fair_median: f64,
    pub method: Method,
    /// The backend picked most often for its share, and how unlikely that is.
    pub connection_skew: ConnectionSkew,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Carried {
    pub connections: u64,
    pub requests: u64,
}

/// The DNAT's own picks: the backend with the highest share of connections for its
/// expected share.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConnectionSkew {
    pub backend: SocketAddr,
    pub connections: u64,
    pub share: f64,
    pub expected: f64,
    pub skew: f64,
    /// The chance that a fair DNAT of as many connections picks this unevenly or more.
    pub chance: PValue,
}

/// Why a skew limit fails, or that it holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Finding {
    /// At most the limit, and a fair DNAT of these connections usually is too.
    Holds,
    /// Above the limit, but a fair DNAT of these connections gives as much often enough.
    WithinChance(PValue),
    /// A fair DNAT of these connections usually exceeds the limit because few of them
    /// carry most requests.
    Pinning { half: Carried, median: f64 },
    /// A fair DNAT of these connections usually exceeds the limit, and would even with
    /// every request on a connection of its own.
    TooFewConnections {
        connections: u64,
        backends: usize,
        median: f64,
    },
    /// Above the limit and beyond chance, with the DNAT's own picks beyond chance too.
    RulesUneven(ConnectionSkew),
    /// Above the limit and beyond chance, while the DNAT's picks are not: the busier
    /// connections went to one backend.
    BusierConnections { chance: PValue },
}

impl Finding {
    /// Whether the limit fails.
    pub fn fails(&self) -> bool {
        !matches!(self, Finding::Holds | Finding::WithinChance(_))
    }
}

/// A Service with ClientIP session affinity is judged on stickiness, not on skew: its
/// connections are not independent picks (a client's stay on its first pick).
pub fn judged_on_stickiness(service: &ServiceStats) -> bool {
    service.affinity.is_some()
}

/// The endpoints with an expected share, and their connections' request counts.
struct Endpoints<'a> {
    backends: Vec<(&'a BackendStats, f64)>,
    mix: RequestMix,
}

impl<'a> Endpoints<'a> {
    fn of(service: &'a ServiceStats) -> Endpoints<'a> {
        let backends: Vec<(&BackendStats, f64)> = service
            .backends
            .iter()
            .filter_map(|b| Some((b, b.expected_share.filter(|e| *e > 0.0)?)))
            .collect();
        let mut mix = RequestMix::default();
        for (b, _) in &backends {
            mix.merge(&b.request_mix);
        }
        Endpoints { backends, mix }
    }

    fn expected(&self) -> Vec<f64> {
        self.backends.iter().map(|(_, e)| *e).collect()
    }

    fn connections(&self) -> u64 {
        self.backends.iter().map(|(b, _)| b.connections).sum()
    }

    fn connection_skew(&self) -> Option<ConnectionSkew> {
        let total = self.connections();
        if total == 0 {
            return None;
        }
        let (b, expected) = self.backends.iter().copied().reduce(|best, next| {
            if next.0.connections as f64 / next.1 > best.0.connections as f64 / best.1 {
                next
            } else {
                best
            }
        })?;
        let share = b.connections as f64 / total as f64;
        let skew = share / expected;
        let picks = FairDnat::new(&self.expected(), &RequestMix::uniform(total))?;
        Some(ConnectionSkew {
            backend: b.backend,
            connections: total,
            share,
            expected,
            skew,
            chance: picks.p_value(skew),
        })
    }

    /// `(connection factor, requests-per-connection factor)` of `backend`.
    fn split(&self, backend: &BackendStats, expected: f64) -> (f64, f64) {
        let (connections, requests) = (self.connections(), self.mix.requests());
        let connection_factor = backend.connections as f64 / connections as f64 / expected;
        let per_connection = |r: u64, c: u64| r as f64 / c.max(1) as f64;
        let requests_factor = per_connection(backend.requests, backend.connections)
            / per_connection(requests, connections);
        (connection_factor, requests_factor)
    }
}

impl Spread {
    /// `None` without requests to the endpoints with an expected share.
    pub fn of(service: &ServiceStats) -> Option<Spread> {
        let detail = service.skew_detail()?;
        let endpoints = Endpoints::of(service);
        let fair = FairDnat::new(&endpoints.expected(), &endpoints.mix)?;
        let busy = endpoints.mix.busy();
        let (connection_factor, requests_per_connection_factor) =
            endpoints.split(detail.backend, detail.backend.expected_share?);
        let (connections, requests) = busy.busiest_half();
        Some(Spread {
            connections: endpoints.connections(),
            busy_connections: busy.connections(),
            requests: busy.requests(),
            effective_connections: busy.effective_connections(),
            busiest_connection: busy.busiest(),
            busiest_half: Carried {
                connections,
                requests,
            },
            backend: detail.backend.backend,
            skew: detail.skew,
            connection_factor,
            requests_per_connection_factor,
            chance: fair.p_value(detail.skew),
            fair_median: fair.median(),
            method: fair.method(),
            connection_skew: endpoints.connection_skew()?,
        })
    }
}

/// Judges `--max-skew limit` at confidence `1 - alpha` (cheap bounds first, so that a
/// clear case costs little): `None` without requests to judge.
///
/// It fails when a fair DNAT of these connections usually exceeds the limit (pinning,
/// or too few connections), or when the skew is above the limit and beyond chance: then
/// the DNAT's own picks tell rules that pick unevenly from busier connections that went
/// to one backend.
pub fn judge(service: &ServiceStats, limit: f64, alpha: f64) -> Option<Finding> {
    let detail = service.skew_detail()?;
    let endpoints = Endpoints::of(service);
    let expected = endpoints.expected();
    let fair = FairDnat::new(&expected, &endpoints.mix)?;
    if fair.usually_above(limit) {
        // The same requests, each on a connection of its own: if even they cannot stay
        // under the limit, there is too little traffic; if they can, it rides too few
        // connections.
        let busy = endpoints.mix.busy();
        let unpinned = FairDnat::new(&expected, &RequestMix::uniform(busy.requests()))?;
        if unpinned.usually_above(limit) {
            return Some(Finding::TooFewConnections {
                connections: busy.connections(),
                backends: expected.len(),
                median: fair.median(),
            });
        }
        let (connections, requests) = busy.busiest_half();
        return Some(Finding::Pinning {
            half: Carried {
                connections,
                requests,
            },
            median: fair.median(),
        });
    }
    if detail.skew <= limit {
        return Some(Finding::Holds);
    }
    if !fair.beyond_chance(detail.skew, alpha) {
        return Some(Finding::WithinChance(fair.p_value(detail.skew)));
    }
    let picks = endpoints.connection_skew()?;
    Some(if picks.chance.value <= alpha {
        Finding::RulesUneven(picks)
    } else {
        Finding::BusierConnections {
            chance: fair.p_value(detail.skew),
        }
    })
}
