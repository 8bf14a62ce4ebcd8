//! Matches DNS queries to their responses by client (address and port) and message id,
//! and writes one [`DnsRecord`] per query: with the response's rcode, or with rcode
//! null when none came within [`ANSWER_WAIT`]. A response whose query was not seen is
//! still a query the client made: it is written with the response's time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::dns::wire::{Message, qtype_name, rcode_name};
use crate::model::record::{DnsRecord, Proto};
use crate::model::tracker::Clock;

/// How long a query waits for its response: glibc's resolver gives up after 5 s
/// (`options timeout:5`, its default) and sends it again.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// Queries waiting for responses at most; beyond, a new query is written at once
/// (unanswered) so that memory stays bounded whatever the traffic.
const MAX_PENDING: usize = 65_536;

/// One DNS message seen on a connection to a port-53 Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// `bpf_ktime_get_ns()` of the packet.
    pub time_ns: u64,
    pub proto: Proto,
    pub client: SocketAddr,
    /// What the client dialed (ClusterIP:53).
    pub server: SocketAddr,
    pub netns: u32,
    /// Sent by the server (the connection's reply direction).
    pub response: bool,
    pub message: Message,
}

pub struct Matcher {
    clock: Clock,
    wait_ns: u64,
    pending: HashMap<(SocketAddr, u16), Seen>,
}

impl Matcher {
    pub fn new(clock: Clock) -> Matcher {
        Matcher {
            clock,
            wait_ns: ANSWER_WAIT.as_nanos() as u64,
            pending: HashMap::new(),
        }
    }

    /// Queries waiting for their responses.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes one message; returns the records it completes.
    pub fn on_message(&mut self, seen: Seen) -> Vec<DnsRecord> {
        let key = (seen.client, seen.message.id);
        let mut out = Vec::new();
        if seen.response {
            match self.pending.remove(&key) {
                Some(query) => out.push(self.record(&query, Some(&seen))),
                None => out.push(self.record(&seen, None)),
            }
            return out;
        }
        // The same id again from the same socket (a retransmission after a timeout):
        // the earlier copy is written unanswered, the answer goes to the later one.
        if let Some(earlier) = self.pending.remove(&key) {
            out.push(self.record(&earlier, None));
        }
        if self.pending.len() >= MAX_PENDING {
            out.push(self.record(&seen, None));
        } else {
            self.pending.insert(key, seen);
        }
        out
    }

    /// Writes the queries that waited for a response longer than `ANSWER_WAIT` by `now_ns`.
    pub fn expire(&mut self, now_ns: u64) -> Vec<DnsRecord> {
        let wait = self.wait_ns;
        let expired: Vec<(SocketAddr, u16)> = self
            .pending
            .iter()
            .filter(|(_, query)| now_ns.saturating_sub(query.time_ns) > wait)
            .map(|(key, _)| *key)
            .collect();
        self.take(expired)
    }

    /// Writes every query still waiting (the recording ends), oldest first.
    pub fn finish(&mut self) -> Vec<DnsRecord> {
        let keys: Vec<(SocketAddr, u16)> = self.pending.keys().copied().collect();
        self.take(keys)
    }

    fn take(&mut self, keys: Vec<(SocketAddr, u16)>) -> Vec<DnsRecord> {
        let mut queries: Vec<Seen> = keys
            .into_iter()
            .filter_map(|key| self.pending.remove(&key))
            .collect();
        queries.sort_by_key(|query| query.time_ns);
        queries
            .iter()
            .map(|query| self.record(query, None))
            .collect()
    }

    /// The record of `first` (a query, or a response whose query was not seen) and its
    /// response, if any.
    fn record(&self, first: &Seen, response: Option<&Seen>) -> DnsRecord {
        let rcode = if first.response {
            Some(first.message.rcode)
        } else {
            response.map(|r| r.message.rcode)
        };
        DnsRecord {
            proto: first.proto,
            client: first.client,
            client_pod: None,
            server: first.server,
            netns: first.netns,
            id: first.message.id,
            name: first.message.name.clone(),
            qtype: qtype_name(first.message.qtype),
            rcode: rcode.map(rcode_name),
            time: self.clock.wall(first.time_ns),
            latency_ms: response.map(|r| r.time_ns.saturating_sub(first.time_ns) as f64 / 1e6),
        }
    }
}
