//! What the capture side hands to its consumers (the recorder and the live view) while
//! it runs. Plain data: no aya or tokio types, so consumers are testable without root.

use chrono::{DateTime, Utc};

use crate::model::record::CtStats;
use crate::model::record::{ConnRecord, DnsRecord, EndpointsRecord, RejectRecord, ServiceRecord};

/// Identifies one connection: the kernel's `struct nf_conn` address (reused after the
/// entry is freed) plus the time its first packet was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub conntrack: u64,
    pub start_ns: u64,
}

impl ConnId {
    /// The connection the kernel's table holds at `conntrack` with `state`.
    pub fn of(conntrack: u64, state: &observer_common::conn::ConnState) -> ConnId {
        ConnId {
            conntrack,
            start_ns: state.start_ns,
        }
    }
}

/// Counters from the kernel side and the capture loop, cumulative since start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Events read from the ring buffer.
    pub events: u64,
    /// DNAT decisions seen: connections tracked + `lost_connections`.
    pub dnat_events: u64,
    /// DNAT decisions that have no record (see `SummaryRecord::lost_connections`).
    pub lost_connections: u64,
    /// Kernel events delayed because the ring buffer was full (no record missing).
    pub lost_events: u64,
    /// Kernel memory reads that failed.
    pub read_errors: u64,
    /// DNS messages copied that could not be read (malformed).
    pub dns_malformed: u64,
    /// DNS messages the kernel could not copy (their ring buffer full): lost.
    pub dns_lost: u64,
    /// Rejected-connection reports lost (their ring buffer was full, or undecodable):
    /// `reject` lines may be missing.
    pub lost_rejects: u64,
    /// Kernel programs attached.
    pub hooks_attached: u32,
    /// Distinct network namespaces whose conntrack entries were seen.
    pub netns_seen: u32,
    /// Sentences on what observer cannot see or follow (`SummaryRecord::blind_spots`).
    pub blind_spots: u64,
    /// Connections currently tracked by the kernel.
    pub live_connections: u64,
    /// Where the connection log is being written, if anywhere.
    pub recording: Option<String>,
}

/// One update from the capture side.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// A connection opened, progressed (`record.close == Close::Open`, counters so far)
    /// or finished (`record.close` is fin, rst or timeout: the final record).
    Conn { id: ConnId, record: ConnRecord },
    /// A Service's definition from the rules (first sight or changed endpoints).
    Service(ServiceRecord),
    /// Endpoints that joined or left a Service's rules.
    Endpoints(EndpointsRecord),
    /// A DNS query to a port-53 Service, with its response's rcode.
    Dns(DnsRecord),
    /// A new connection to a Service that netfilter rejected before any DNAT (a TCP
    /// attempt, or a UDP socket once quiet).
    Reject(RejectRecord),
    /// Counters, sent about once a second.
    Stats(CaptureStats),
    /// conntrack's own figures in namespace `netns` (every 5 s where conntrack is used),
    /// or `None` when they are no longer read there (the namespace is gone, or reading
    /// failed). An update of its own, not a part of `Stats`: the figures come per
    /// namespace at their own pace, and the live view warns about what rose between two
    /// readings of one namespace, which a copy repeated in every `Stats` would blur.
    Conntrack {
        netns: u32,
        reading: Option<ConntrackReading>,
    },
}

/// One reading of conntrack's figures in a namespace, and when it was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConntrackReading {
    pub time: DateTime<Utc>,
    pub stats: CtStats,
}
