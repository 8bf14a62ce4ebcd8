//! `reject` lines: new connections to a Service that netfilter dropped before any
//! DNAT, because the Service port has no endpoints (kube-proxy's REJECT, or DROP).

use std::net::SocketAddr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{FrontendKind, Name, Proto};

/// Why the rules turned a connection away, as kube-proxy's rules tell it (their chain
/// and map names and comments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// The Service port has no endpoints (REJECT).
    NoEndpoints,
    /// `externalTrafficPolicy`/`internalTrafficPolicy: Local` and no endpoint on this
    /// node (DROP).
    NoLocalEndpoints,
    /// A LoadBalancer's `loadBalancerSourceRanges` left the client out.
    SourceRange,
    /// A ClusterIP dialed on a port the Service does not have (nftables'
    /// `cluster-ips-check` REJECT).
    InvalidPort,
    /// An address of the Service range that no Service has (`cluster-ips-check` DROP).
    UnallocatedIp,
    /// A drop or reject the rules do not explain.
    Other,
}

impl RejectReason {
    /// In words: "no endpoints", "source range".
    pub fn text(self) -> &'static str {
        match self {
            RejectReason::NoEndpoints => "no endpoints",
            RejectReason::NoLocalEndpoints => "no local endpoints",
            RejectReason::SourceRange => "source range",
            RejectReason::InvalidPort => "invalid port",
            RejectReason::UnallocatedIp => "unallocated ClusterIP",
            RejectReason::Other => "other",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::NoEndpoints => "no_endpoints",
            RejectReason::NoLocalEndpoints => "no_local_endpoints",
            RejectReason::SourceRange => "source_range",
            RejectReason::InvalidPort => "invalid_port",
            RejectReason::UnallocatedIp => "unallocated_ip",
            RejectReason::Other => "other",
        }
    }
}

/// One rejected TCP connection attempt, or one UDP client socket whose datagrams were
/// rejected (with how many).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RejectRecord {
    pub proto: Proto,
    /// The client's address and port.
    pub client: SocketAddr,
    /// `namespace/pod` of the client when it is a pod on a node observer sees.
    #[serde(default)]
    pub client_pod: Option<Name>,
    /// What the client dialed: the Service's address and port.
    pub original_dst: SocketAddr,
    /// `ns/name:port` of the Service port, from the rules.
    pub service: Option<Name>,
    /// Which kind of Service address the client dialed.
    pub frontend: Option<FrontendKind>,
    /// Why the rules turned it away (their names tell: kube-proxy's chains, maps and
    /// comments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<RejectReason>,
    /// Network namespace (inode) whose netfilter rejected it: which node.
    pub netns: u32,
    /// The first rejected packet.
    #[serde(with = "super::micros")]
    pub time: DateTime<Utc>,
    /// UDP: the client socket's rejected datagrams; TCP: absent (one line per attempt,
    /// its retransmitted SYNs not counted again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<u64>,
}

/// A rejected TCP attempt to `shop/empty:http` at its ClusterIP, for tests: each test
/// changes what it needs with `RejectRecord { field, ..RejectRecord::example() }`.
#[cfg(test)]
impl RejectRecord {
    pub(crate) fn example() -> RejectRecord {
        use chrono::TimeZone as _;
        RejectRecord {
            proto: Proto::Tcp,
            client: "10.244.1.9:40000".parse().unwrap(),
            client_pod: None,
            original_dst: "10.96.200.1:80".parse().unwrap(),
            service: Some("shop/empty:http".into()),
            frontend: Some(FrontendKind::ClusterIp),
            reason: Some(RejectReason::NoEndpoints),
            netns: 4026532301,
            time: Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 37).unwrap(),
            packets: None,
        }
    }
}
