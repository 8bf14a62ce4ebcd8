//! Lifetime percentiles: nearest-rank over exact values, weighted over a reservoir
//! sample once a backend has more closed connections than `EXACT_LIFETIMES`.

use std::net::SocketAddr;

use serde::Serialize;

/// Nearest-rank percentiles of pinning lifetimes, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

/// Nearest-rank percentile of ascending `sorted` values (non-empty), `p` in (0, 100].
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Nearest-rank p50/p90/max of `values`; `None` when empty.
pub fn percentiles(values: &mut [f64]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    Some(Percentiles {
        p50: nearest_rank(values, 50.0),
        p90: nearest_rank(values, 90.0),
        max: values[values.len() - 1],
    })
}

/// Closed connections per backend whose lifetimes are kept exactly; beyond this many a
/// uniform sample of this size stands for them.
pub(super) const EXACT_LIFETIMES: usize = 4096;

/// Lifetimes of a backend's closed connections (those older than the recent window).
pub(super) struct Lifetimes {
    /// Every lifetime while `seen <= EXACT_LIFETIMES`, then a uniform sample of them.
    pub(super) values: Vec<f64>,
    /// Lifetimes folded in.
    pub(super) seen: u64,
    /// The longest lifetime folded in (exact even when sampled).
    pub(super) max: f64,
    /// xorshift64 state; never 0.
    rng: u64,
}

impl Lifetimes {
    /// Seeded from the backend's address: reproducible, and backends sample independently.
    pub(super) fn new(backend: SocketAddr) -> Lifetimes {
        let ip = match backend.ip() {
            std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(ip) => ip.octets(),
        };
        // FNV-1a: stable across Rust versions, unlike std's hashers.
        let mut seed: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in ip.iter().chain(&backend.port().to_be_bytes()) {
            seed = (seed ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        Lifetimes {
            values: Vec::new(),
            seen: 0,
            max: f64::NEG_INFINITY,
            rng: seed | 1,
        }
    }

    pub(super) fn sampled(&self) -> bool {
        self.seen > self.values.len() as u64
    }

    /// Reservoir sampling (Algorithm R): the n-th lifetime replaces a random slot with
    /// probability EXACT_LIFETIMES/n, so every lifetime is equally likely to be kept.
    pub(super) fn add(&mut self, duration: f64) {
        self.seen += 1;
        self.max = self.max.max(duration);
        if self.values.len() < EXACT_LIFETIMES {
            self.values.push(duration);
            return;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        // Uniform in 0..seen without the bias of `%`.
        let slot = ((u128::from(self.rng) * u128::from(self.seen)) >> 64) as usize;
        if let Some(value) = self.values.get_mut(slot) {
            *value = duration;
        }
    }
}

/// Percentiles over folded `lifetimes` plus `exact` durations (open and recently closed
/// connections); `None` when there are none. Nearest-rank over all values while nothing
/// was sampled; otherwise each sampled value weighs seen/sampled and the p-th percentile
/// is the first value whose cumulative weight reaches p% of the total.
pub(super) fn lifetime_percentiles(lifetimes: &Lifetimes, exact: &[f64]) -> Option<Percentiles> {
    if !lifetimes.sampled() {
        let mut values: Vec<f64> = lifetimes.values.iter().chain(exact).copied().collect();
        return percentiles(&mut values);
    }
    let weight = lifetimes.seen as f64 / lifetimes.values.len() as f64;
    let mut weighted: Vec<(f64, f64)> = lifetimes
        .values
        .iter()
        .map(|v| (*v, weight))
        .chain(exact.iter().map(|v| (*v, 1.0)))
        .collect();
    weighted.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = weighted.iter().map(|(_, w)| w).sum();
    let rank = |p: f64| {
        let target = p / 100.0 * total;
        let mut cumulative = 0.0;
        weighted
            .iter()
            .find(|(_, w)| {
                cumulative += w;
                cumulative >= target
            })
            .or_else(|| weighted.last())
            .map_or(lifetimes.max, |(v, _)| *v)
    };
    Some(Percentiles {
        p50: rank(50.0),
        p90: rank(90.0),
        max: exact.iter().fold(lifetimes.max, |max, v| max.max(*v)),
    })
}
