//! ClientIP session affinity, checked: each client's new connections should stay on one
//! endpoint while it keeps connecting within the affinity timeout (kube-proxy refreshes
//! the client's entry with every new connection). A switch is a connection from a client
//! to another backend than its previous connection's, and how long after it started.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use chrono::{DateTime, Utc};

/// Clients remembered at most per Service (then forgotten all at once).
const CLIENTS: usize = 65_536;
/// Switches remembered at most per Service.
const SWITCHES: usize = 65_536;

#[derive(Clone, Debug, Default)]
pub struct Stickiness {
    last: HashMap<IpAddr, (SocketAddr, DateTime<Utc>)>,
    /// Seconds between the start of a client's connection and the start of its next one
    /// to another backend.
    switches: Vec<f64>,
}

impl Stickiness {
    /// One finished connection.
    pub fn observe(&mut self, client: IpAddr, backend: SocketAddr, start: DateTime<Utc>) {
        if self.last.len() >= CLIENTS {
            self.last.clear();
        }
        if let Some((before, at)) = self.last.insert(client, (backend, start))
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
        sticky.observe(client, a, t(0));
        sticky.observe(client, a, t(5));
        assert_eq!(sticky.switches_within(Some(10)), 0);
        sticky.observe(client, b, t(100));
        assert_eq!(sticky.switches_within(Some(10)), 0, "after the timeout");
        sticky.observe(client, a, t(101));
        assert_eq!(sticky.switches_within(Some(10)), 1);
        assert_eq!(sticky.clients(), 1);
    }
}
