//! How a Service's requests rode its connections: connections by request count.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

/// Connections by how many requests each carried (`requests -> connections`): all that
/// a fair DNAT of the same connections needs to know, and what tells pinning (few busy
/// connections) from an even load. Its size is the number of distinct request counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestMix(BTreeMap<u64, u64>);

impl RequestMix {
    /// `connections` connections of one request each (what a DNAT decides: one pick each).
    pub fn uniform(connections: u64) -> RequestMix {
        let mut mix = RequestMix::default();
        if connections > 0 {
            mix.0.insert(1, connections);
        }
        mix
    }

    pub fn add(&mut self, requests: u64) {
        *self.0.entry(requests).or_default() += 1;
    }

    /// Undoes an `add` of the same count (a connection's record replaced by a newer one).
    pub fn subtract(&mut self, requests: u64) {
        if let Entry::Occupied(mut entry) = self.0.entry(requests) {
            *entry.get_mut() -= 1;
            if *entry.get() == 0 {
                entry.remove();
            }
        }
    }

    pub fn merge(&mut self, other: &RequestMix) {
        for (&requests, &connections) in &other.0 {
            *self.0.entry(requests).or_default() += connections;
        }
    }

    /// `(requests, connections)`, fewest requests first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(r, m)| (*r, *m))
    }

    /// The same without the connections that carried no request.
    pub fn busy(&self) -> RequestMix {
        RequestMix(self.0.range(1..).map(|(r, m)| (*r, *m)).collect())
    }

    pub fn connections(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn requests(&self) -> u64 {
        self.iter().map(|(r, m)| r * m).sum()
    }

    /// Distinct request counts.
    pub fn distinct(&self) -> usize {
        self.0.len()
    }

    /// The most requests one connection carried (0 with none).
    pub fn busiest(&self) -> u64 {
        self.0.keys().next_back().copied().unwrap_or(0)
    }

    /// R² / Σ r²: how many equally busy connections would spread requests as evenly as
    /// these do (1 when one connection carried all; the connection count when all
    /// carried the same). 0 without requests.
    pub fn effective_connections(&self) -> f64 {
        let squares: f64 = self
            .iter()
            .map(|(r, m)| (r as f64).powi(2) * m as f64)
            .sum();
        if squares == 0.0 {
            return 0.0;
        }
        (self.requests() as f64).powi(2) / squares
    }

    /// The fewest connections that carried at least half of the requests, and how many
    /// requests they carried: `(1, 30)` for one connection with all 30.
    pub fn busiest_half(&self) -> (u64, u64) {
        let total = self.requests();
        let (mut connections, mut carried) = (0, 0);
        for (r, m) in self.iter().rev() {
            if r == 0 || 2 * carried >= total {
                break;
            }
            // Of this count, only as many as it takes to reach half.
            let needed = (total - 2 * carried).div_ceil(2 * r).min(m);
            connections += needed;
            carried += needed * r;
        }
        (connections, carried)
    }
}
