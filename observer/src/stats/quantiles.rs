//! Nearest-rank quantiles over exact values, weighted over a reservoir sample once a
//! backend has more closed connections than `EXACT_VALUES`: pinning lifetimes and
//! connect times both go through here.

use std::net::SocketAddr;

use serde::Serialize;

/// Nearest-rank percentiles of pinning lifetimes, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

/// Nearest-rank percentiles of connect times (first SYN to the backend's SYN-ACK), in
/// milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ConnectTimes {
    pub p50: f64,
    pub p99: f64,
}

/// Values standing for `weight` values each: a reservoir's sample, or exact values
/// (weight 1).
pub(super) type Group<'a> = (&'a [f64], f64);

/// Nearest-rank quantiles `ps` (each in (0, 100]) over weighted groups of values;
/// `None` when there are none. With every weight 1 the p-th quantile of N values is the
/// value at rank ceil(p/100 * N); otherwise it is the first value whose cumulative
/// weight reaches p% of the total. Either way it is a value that occurred.
pub(super) fn quantiles<const N: usize>(groups: &[Group<'_>], ps: [f64; N]) -> Option<[f64; N]> {
    let mut weighted: Vec<(f64, f64)> = groups
        .iter()
        .flat_map(|(values, weight)| values.iter().map(move |v| (*v, *weight)))
        .collect();
    weighted.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let last = weighted.last()?.0;
    let total: f64 = weighted.iter().map(|(_, w)| w).sum();
    Some(ps.map(|p| {
        let target = p / 100.0 * total;
        let mut cumulative = 0.0;
        weighted
            .iter()
            .find(|(_, w)| {
                cumulative += w;
                cumulative >= target
            })
            .map_or(last, |(v, _)| *v)
    }))
}

/// Nearest-rank p50/p90/max of `values`; `None` when empty.
pub fn percentiles(values: &[f64]) -> Option<Percentiles> {
    let [p50, p90, max] = quantiles(&[(values, 1.0)], [50.0, 90.0, 100.0])?;
    Some(Percentiles { p50, p90, max })
}

/// Closed connections per backend whose values are kept exactly; beyond this many a
/// uniform sample of this size stands for them.
pub(super) const EXACT_VALUES: usize = 4096;

/// One kind of value (lifetime, connect time) of a backend's closed connections (those
/// older than the recent window).
pub(super) struct Reservoir {
    /// Every value while `seen <= EXACT_VALUES`, then a uniform sample of them.
    pub(super) values: Vec<f64>,
    /// Values folded in.
    pub(super) seen: u64,
    /// The largest value folded in (exact even when sampled).
    pub(super) max: f64,
    /// xorshift64 state; never 0.
    rng: u64,
}

impl Reservoir {
    /// Seeded from `kind` and the backend's address: reproducible, and each backend's
    /// reservoirs sample independently.
    pub(super) fn new(kind: &str, backend: SocketAddr) -> Reservoir {
        let ip = match backend.ip() {
            std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(ip) => ip.octets(),
        };
        // FNV-1a: stable across Rust versions, unlike std's hashers.
        let mut seed: u64 = 0xcbf2_9ce4_8422_2325;
        let bytes = kind.bytes().chain(ip).chain(backend.port().to_be_bytes());
        for byte in bytes {
            seed = (seed ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        Reservoir {
            values: Vec::new(),
            seen: 0,
            max: f64::NEG_INFINITY,
            rng: seed | 1,
        }
    }

    #[cfg(test)]
    pub(super) fn sampled(&self) -> bool {
        self.seen > self.values.len() as u64
    }

    /// Reservoir sampling (Algorithm R): the n-th value replaces a random slot with
    /// probability EXACT_VALUES/n, so every value is equally likely to be kept.
    pub(super) fn add(&mut self, value: f64) {
        self.seen += 1;
        self.max = self.max.max(value);
        if self.values.len() < EXACT_VALUES {
            self.values.push(value);
            return;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        // Uniform in 0..seen without the bias of `%`.
        let slot = ((u128::from(self.rng) * u128::from(self.seen)) >> 64) as usize;
        if let Some(value_slot) = self.values.get_mut(slot) {
            *value_slot = value;
        }
    }

    /// Its values, each standing for seen/kept values.
    pub(super) fn group(&self) -> Group<'_> {
        let weight = self.seen as f64 / self.values.len().max(1) as f64;
        (&self.values, weight)
    }
}

/// Lifetime percentiles over a backend's folded `lifetimes` plus `exact` durations (open
/// and recently closed connections); `None` when there are none. The maximum is exact.
pub(super) fn lifetime_percentiles(lifetimes: &Reservoir, exact: &[f64]) -> Option<Percentiles> {
    let [p50, p90] = quantiles(&[lifetimes.group(), (exact, 1.0)], [50.0, 90.0])?;
    Some(Percentiles {
        p50,
        p90,
        max: exact.iter().fold(lifetimes.max, |max, v| max.max(*v)),
    })
}

/// Connect-time p50/p99 over groups of folded and exact connect times; `None` when
/// there are none.
pub(super) fn connect_times(groups: &[Group<'_>]) -> Option<ConnectTimes> {
    let [p50, p99] = quantiles(groups, [50.0, 99.0])?;
    Some(ConnectTimes { p50, p99 })
}
