//! What came of connection attempts, counted: outcomes per backend, connect times in
//! histogram buckets, rejected attempts per frontend kind.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::record::{FrontendKind, Outcome};

/// Connections per outcome (see [`Outcome`]). Pending ones (still open, no answer yet)
/// are not failures: they are counted apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OutcomeCounts {
    pub answered: u64,
    pub refused: u64,
    pub unanswered: u64,
    pub pending: u64,
}

impl OutcomeCounts {
    fn slot(&mut self, outcome: Outcome) -> &mut u64 {
        match outcome {
            Outcome::Answered => &mut self.answered,
            Outcome::Refused => &mut self.refused,
            Outcome::Unanswered => &mut self.unanswered,
            Outcome::Pending => &mut self.pending,
        }
    }

    pub(super) fn add(&mut self, outcome: Outcome) {
        *self.slot(outcome) += 1;
    }

    /// Undoes an earlier `add` of the same outcome.
    pub(super) fn subtract(&mut self, outcome: Outcome) {
        *self.slot(outcome) -= 1;
    }

    pub fn get(&self, outcome: Outcome) -> u64 {
        let mut counts = *self;
        *counts.slot(outcome)
    }

    /// Refused plus unanswered.
    pub fn failed(&self) -> u64 {
        self.refused + self.unanswered
    }
}

/// Upper bounds (ms, inclusive) of the connect-time histogram's buckets; one more
/// bucket counts what is slower than the last.
pub const CONNECT_BUCKETS_MS: [f64; 12] = [
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
];

/// Connect times counted per bucket, with their sum: what a Prometheus histogram
/// exposes. Kept exactly (integers), so a replaced record subtracts what it added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectHistogram {
    /// Per bucket of `CONNECT_BUCKETS_MS`, then slower than the last (not cumulative).
    buckets: [u64; CONNECT_BUCKETS_MS.len() + 1],
    /// The sum of the connect times, in microseconds.
    pub sum_us: u64,
    pub count: u64,
}

impl ConnectHistogram {
    fn bucket(ms: f64) -> usize {
        CONNECT_BUCKETS_MS
            .iter()
            .position(|bound| ms <= *bound)
            .unwrap_or(CONNECT_BUCKETS_MS.len())
    }

    fn micros(ms: f64) -> u64 {
        (ms * 1000.0).round() as u64
    }

    pub(super) fn add(&mut self, ms: f64) {
        self.buckets[Self::bucket(ms)] += 1;
        self.sum_us += Self::micros(ms);
        self.count += 1;
    }

    /// Undoes an earlier `add` of the same time.
    pub(super) fn subtract(&mut self, ms: f64) {
        self.buckets[Self::bucket(ms)] -= 1;
        self.sum_us -= Self::micros(ms);
        self.count -= 1;
    }

    /// Connect times at most each bound of `CONNECT_BUCKETS_MS`, in order (the `le`
    /// buckets; `+Inf` is `count`).
    pub fn cumulative(&self) -> [u64; CONNECT_BUCKETS_MS.len()] {
        let mut total = 0;
        std::array::from_fn(|i| {
            total += self.buckets[i];
            total
        })
    }
}

/// The frontend kinds Kubernetes has, in the order counts are kept.
const FRONTEND_KINDS: [FrontendKind; 4] = [
    FrontendKind::ClusterIp,
    FrontendKind::NodePort,
    FrontendKind::ExternalIp,
    FrontendKind::LoadBalancer,
];

/// Counts per frontend kind (connections, or rejected attempts, by the kind dialed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct FrontendCounts([u64; FRONTEND_KINDS.len()]);

impl FrontendCounts {
    fn index(kind: FrontendKind) -> usize {
        FRONTEND_KINDS.iter().position(|d| *d == kind).unwrap_or(0)
    }

    pub(super) fn add(&mut self, frontend: Option<FrontendKind>) {
        if let Some(frontend) = frontend {
            self.0[Self::index(frontend)] += 1;
        }
    }

    /// Undoes an earlier `add` of the same frontend kind.
    pub(super) fn subtract(&mut self, frontend: Option<FrontendKind>) {
        if let Some(frontend) = frontend {
            self.0[Self::index(frontend)] -= 1;
        }
    }

    /// The frontend kinds with a count, and their counts.
    pub(super) fn to_map(self) -> BTreeMap<FrontendKind, u64> {
        FRONTEND_KINDS
            .iter()
            .zip(self.0)
            .filter(|(_, n)| *n > 0)
            .map(|(kind, n)| (*kind, n))
            .collect()
    }
}
