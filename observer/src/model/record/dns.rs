//! `{"type":"dns",...}`: one DNS query to a Service on port 53 and its answer.

use std::net::SocketAddr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Proto;

/// One query a client sent to a port-53 Service (kube-dns), matched to its response by
/// client address and port and message id. Written when the response arrives, or 5 s
/// after the query without one, so lines are in completion order, not `time` order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DnsRecord {
    pub proto: Proto,
    /// The client's address and port.
    pub client: SocketAddr,
    /// `namespace/pod` of the client when it is a pod on a node observer sees; null otherwise.
    #[serde(default)]
    pub client_pod: Option<String>,
    /// What the client dialed: the DNS Service's ClusterIP:53.
    pub server: SocketAddr,
    /// Network namespace (inode) of the conntrack entry: which node made the decision.
    pub netns: u32,
    /// The message id.
    pub id: u16,
    /// The question's name: lower-cased, no trailing dot (`.` for the root).
    pub name: String,
    /// The question's type: `A`, `AAAA`, ... (`TYPE65280` for unnamed ones).
    pub qtype: String,
    /// The response's code: `NOERROR`, `NXDOMAIN`, ...; null when no response was seen
    /// (within 5 s of the query, or before the recording ended).
    pub rcode: Option<String>,
    /// When the query was sent (when only its response was seen: the response's time).
    #[serde(with = "super::micros")]
    pub time: DateTime<Utc>,
    /// From the query to its response; null when either was not seen.
    pub latency_ms: Option<f64>,
}

impl DnsRecord {
    pub fn is_nxdomain(&self) -> bool {
        self.rcode.as_deref() == Some("NXDOMAIN")
    }
}
