//! ClientIP session affinity, checked: each client's new connections should stay on one
//! endpoint while it keeps connecting within the affinity timeout (kube-proxy refreshes
//! the client's entry with every new connection). A switch is a connection from a client
//! to another backend than its previous connection's, and how long after it started.
//! Each node keeps its own affinity (kube-proxy's `recent` lists and sets are per node),
//! so a client is followed per deciding network namespace.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use chrono::{DateTime, Utc};

/// Clients remembered at most per Service (then forgotten all at once).
const CLIENTS: usize = 65_536;
/// Switches remembered at most per Service.
const SWITCHES: usize = 65_536;

#[derive(Clone, Debug, Default)]
pub struct Stickiness {
    /// Per (deciding netns, client): its last backend and when.
    last: HashMap<(u32, IpAddr), (SocketAddr, DateTime<Utc>)>,
    /// Seconds between the start of a client's connection and the start of its next one
    /// to another backend.
    switches: Vec<f64>,
}

impl Stickiness {
    /// One finished connection, decided in network namespace `netns`.
    pub fn observe(
        &mut self,
        netns: u32,
        client: IpAddr,
        backend: SocketAddr,
        start: DateTime<Utc>,
    ) {
        if self.last.len() >= CLIENTS {
            self.last.clear();
        }
        if let Some((before, at)) = self.last.insert((netns, client), (backend, start))
            && before != backend
            && self.switches.len() < SWITCHES
        {
            let gap = (start - at).num_milliseconds() as f64 / 1000.0;
            self.switches.push(gap.abs());
        }
    }

    pub fn clients(&self) -> u64 {
        self.last.len() as u64
    }

    /// Switches within `timeout` seconds (kube-proxy's default: 10800).
    pub fn switches_within(&self, timeout: Option<u64>) -> u64 {
        let timeout = timeout.unwrap_or(10_800) as f64;
        self.switches.iter().filter(|gap| **gap < timeout).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_counts_only_within_the_timeout() {
        let t = |s: i64| DateTime::from_timestamp(s, 0).unwrap();
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let client: IpAddr = "10.244.1.9".parse().unwrap();
        let mut sticky = Stickiness::default();
        sticky.observe(1, client, a, t(0));
        sticky.observe(1, client, a, t(5));
        assert_eq!(sticky.switches_within(Some(10)), 0);
        sticky.observe(1, client, b, t(100));
        assert_eq!(sticky.switches_within(Some(10)), 0, "after the timeout");
        sticky.observe(1, client, a, t(101));
        assert_eq!(sticky.switches_within(Some(10)), 1);
        assert_eq!(sticky.clients(), 1);
    }

    /// Two kind nodes each keep their own affinity: the same client address (each
    /// node's client pod) staying on one pod per node is no switch.
    #[test]
    fn each_node_keeps_its_own_affinity() {
        let t = |s: i64| DateTime::from_timestamp(s, 0).unwrap();
        let a: SocketAddr = "10.244.1.12:8080".parse().unwrap();
        let b: SocketAddr = "10.244.1.13:8080".parse().unwrap();
        let client: IpAddr = "10.244.1.9".parse().unwrap();
        let mut sticky = Stickiness::default();
        for i in 0..5 {
            sticky.observe(1, client, a, t(2 * i));
            sticky.observe(2, client, b, t(2 * i + 1));
        }
        assert_eq!(sticky.switches_within(None), 0);
        assert_eq!(sticky.clients(), 2);
    }
}
