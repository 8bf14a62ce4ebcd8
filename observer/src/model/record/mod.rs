//! The connection log: one JSON object per line. This schema is a contract
//! (docs/log-format.md documents every line and field); other projects' tests parse it.
//!
//! ```text
//! {"type":"conn","proto":"tcp","client":"10.244.1.9:45364","client_pod":"shop/client",
//!  "original_dst":"10.96.35.226:80","backend":"10.244.1.13:3000",
//!  "backend_pod":"shop/checkout-b","service":"shop/checkout:http","frontend":"cluster_ip",
//!  "endpoint_in_rules":true,
//!  "netns":4026532301,"start":"2026-08-06T13:46:36.412345Z","end":"2026-08-06T13:46:40.500000Z",
//!  "duration_ms":4087.655,"requests":30,"bytes_to_backend":2790,"bytes_from_backend":5400,
//!  "close":"fin","connect_ms":null,"start_seen":true}
//! {"type":"dns","proto":"udp","client":"10.244.1.9:40512","client_pod":"shop/client",
//!  "server":"10.96.0.10:53","netns":4026532301,"id":4660,"name":"checkout.shop.svc.cluster.local",
//!  "qtype":"A","rcode":"NOERROR","time":"2026-08-06T13:46:36.401000Z","latency_ms":0.412}
//! {"type":"summary","connections":22,"dnat_events":22,"lost_connections":0,"lost_events":0,"read_errors":0,...}
//! ```

use std::net::SocketAddr;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

mod conntrack;
mod dns;
mod mark;
mod reject;

pub use conntrack::{ConntrackSummary, CtStats};
pub use dns::DnsRecord;
pub use mark::MarkRecord;
pub use reject::{RejectReason, RejectRecord};

/// Transport protocol of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Close {
    /// TCP: both sides sent FIN.
    Fin,
    /// TCP: a side sent RST.
    Rst,
    /// No packet for the idle timeout (UDP; TCP that never got a reply).
    Timeout,
    /// conntrack's entry is gone without FIN or RST (flushed, deleted, timed out): its
    /// destroy event said so, the kernel reused it, or a new entry took its tuple. The
    /// connection can carry no more packets on this pin.
    Expired,
    /// Still open when the recording ended.
    Open,
    /// The backend's first answer said nothing listens: a TCP RST before any SYN-ACK,
    /// or an ICMP port unreachable (UDP, or a REJECT rule in the pod). The pod is in
    /// the rules, but no server took the connection.
    Refused,
    /// Nothing ever came back from the backend (TCP SYNs, UDP datagrams without a
    /// reply); it ended when conntrack dropped the entry, by the idle timeout, or by
    /// the client's own RST.
    Unanswered,
}

impl Close {
    /// As the log writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Close::Fin => "fin",
            Close::Rst => "rst",
            Close::Timeout => "timeout",
            Close::Expired => "expired",
            Close::Open => "open",
            Close::Refused => "refused",
            Close::Unanswered => "unanswered",
        }
    }
}

/// What came of a connection attempt: summaries, metrics and `check` count these per
/// backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The backend answered (a SYN-ACK, a datagram), or the connection was adopted
    /// established.
    Answered,
    Refused,
    Unanswered,
    /// Still open without an answer when the recording ended: not known yet.
    Pending,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Answered,
        Outcome::Refused,
        Outcome::Unanswered,
        Outcome::Pending,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Refused => "refused",
            Outcome::Unanswered => "unanswered",
            Outcome::Pending => "pending",
        }
    }
}

impl ConnRecord {
    /// The connection's outcome from its record: refused and unanswered are closes of
    /// their own; an open connection without any sign of an answer is pending.
    pub fn outcome(&self) -> Outcome {
        match self.close {
            Close::Refused => Outcome::Refused,
            Close::Unanswered => Outcome::Unanswered,
            Close::Open
                if self.start_seen && self.connect_ms.is_none() && self.bytes_from_backend == 0 =>
            {
                Outcome::Pending
            }
            _ => Outcome::Answered,
        }
    }
}

/// A Service or pod name as records carry it: shared, so that naming a connection
/// copies a pointer, not the text.
pub type Name = std::sync::Arc<str>;

/// Which of a Service's endpoint sets the rules picked a connection's backend from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrafficPolicy {
    /// Every endpoint of the Service.
    Cluster,
    /// The endpoints on the deciding node (a Local traffic policy).
    Local,
}

/// One connection that the node's NAT rules DNATed: what the client dialed, which
/// backend conntrack pinned it to, for how long, and what it carried.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConnRecord {
    pub proto: Proto,
    /// The client's address and port (conntrack's original source).
    pub client: SocketAddr,
    /// `namespace/pod` of the client when it is a pod on a node observer sees; null otherwise.
    #[serde(default)]
    pub client_pod: Option<Name>,
    /// What the client dialed: ClusterIP:port, NodeIP:NodePort, external IP...
    pub original_dst: SocketAddr,
    /// The backend the connection was pinned to: pod IP:targetPort.
    pub backend: SocketAddr,
    /// `namespace/pod` of the backend when it is a pod on a node observer sees; null otherwise.
    #[serde(default)]
    pub backend_pod: Option<Name>,
    /// `ns/name:port` as kube-proxy's rules name the Service port; null when unknown.
    pub service: Option<Name>,
    /// Which kind of Service address the client dialed (the rule that matched); null
    /// with no service.
    #[serde(default)]
    pub frontend: Option<FrontendKind>,
    /// Whether `backend` is still an endpoint of `service` in the node's current rules;
    /// `false` is a stale pin; null when the service is unknown.
    #[serde(default)]
    pub endpoint_in_rules: Option<bool>,
    /// `local` when the rules picked the backend from the node's own endpoints for this
    /// client (externalTrafficPolicy or internalTrafficPolicy Local); absent for the
    /// cluster-wide endpoints, or when the service is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<TrafficPolicy>,
    /// Whether the backend runs on the node that made the DNAT decision (its routing
    /// table says so); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_node: Option<bool>,
    /// Network namespace (inode) of the conntrack entry: which node made the decision.
    pub netns: u32,
    /// First packet seen.
    #[serde(with = "micros")]
    pub start: DateTime<Utc>,
    /// Last packet (FIN/RST) or idle-timeout start; null while open.
    #[serde(with = "micros_opt")]
    pub end: Option<DateTime<Utc>>,
    /// How long the connection stayed pinned (so far, when open), in milliseconds.
    pub duration_ms: f64,
    /// Requests: the first client payload, then each client payload after backend payload.
    pub requests: u64,
    pub bytes_to_backend: u64,
    pub bytes_from_backend: u64,
    pub close: Close,
    /// TCP: milliseconds from the client's first SYN to the backend's SYN-ACK, as the
    /// node saw them; null when the connection was not answered, was adopted
    /// mid-stream, or is UDP.
    #[serde(default)]
    pub connect_ms: Option<f64>,
    /// False when observer attached after the connection's first packet (counts then
    /// cover only what was seen).
    #[serde(default = "yes")]
    pub start_seen: bool,
}

fn yes() -> bool {
    true
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// The last line of a recording.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SummaryRecord {
    /// Connection records written.
    pub connections: u64,
    /// DNAT decisions observer learned of: connections it tracked (including ones
    /// adopted mid-connection, `start_seen: false`) plus `lost_connections`.
    pub dnat_events: u64,
    /// DNAT decisions that have no record (connection table full at the connection's
    /// first packet, or a connection that ended when it could neither be reported nor
    /// kept). Records with `start_seen: true` + this == DNAT decisions made while
    /// attached. Absent in logs written before it existed.
    #[serde(default)]
    pub lost_connections: u64,
    /// `lost_connections` per network namespace inode (which node lost them), for the
    /// kernel's losses; absent when nothing was lost. Keys are the inodes as strings
    /// (JSON object keys; serde cannot read integer keys inside a tagged line).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub lost_by_netns: std::collections::BTreeMap<String, u64>,
    /// Kernel events not delivered at once because the ring buffer was full. No record
    /// is missing because of them (the connection table still holds each connection and
    /// its record is written from there); a high value means observer fell behind.
    pub lost_events: u64,
    /// Kernel memory reads that failed.
    pub read_errors: u64,
    /// `dns` lines written. Absent when there were none (and in older logs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dns_queries: u64,
    /// DNS messages on port 53 that were copied but could not be read: malformed, or
    /// truncated past the question. Absent when there were none. (Logs written before
    /// `dns_lost` existed count lost messages here too.)
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dns_malformed: u64,
    /// `dns_malformed` per network namespace inode (which node's DNS went unread);
    /// absent when there were none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dns_malformed_by_netns: std::collections::BTreeMap<String, u64>,
    /// DNS messages on port 53 (TCP: segments) the kernel could not copy: their ring
    /// buffer was full (a flood, or observer behind), or the payload was out of reach.
    /// Their `dns` lines are missing or lack a response. Absent when there were none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dns_lost: u64,
    /// `dns_lost` per network namespace inode; absent when there were none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dns_lost_by_netns: std::collections::BTreeMap<String, u64>,
    /// `reject` lines written. Absent when there were none (and in older logs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejects: u64,
    /// Rejected-connection reports the kernel could not hand over (their ring buffer was
    /// full): `reject` lines may be missing. Absent when there were none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_rejects: u64,
    /// conntrack's own figures per network namespace inode where conntrack was used:
    /// peak entries against the maximum, and the refusals it counted meanwhile. Absent
    /// when no namespace was read (and in older logs).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub conntrack: std::collections::BTreeMap<String, ConntrackSummary>,
    /// How observer learned that a connection's conntrack entry went without a FIN or
    /// RST (flushed, deleted, timed out). Absent when it did not follow conntrack (and
    /// in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conntrack_ends: Option<ConntrackEnds>,
    /// First packets seen (by the netfilter hook, before conntrack confirmed their
    /// entry) whose entry ended unconfirmed: it lost a clash to another packet of the
    /// same flow, whose entry is the connection, or was dropped. Not connections, not in
    /// `dnat_events`. Absent when there were none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub never_confirmed: u64,
    /// Where the program that follows forwarded packets ran. Absent in older logs
    /// (which all ran on `net_dev_queue`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding_hook: Option<ForwardingHook>,
    /// What observer could not see or follow of the node's Service datapath, one sentence
    /// each: rules it could not follow, frontends named by address, no kube-proxy rules,
    /// IPVS, a kube-proxy-free datapath. Absent when there was nothing to say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blind_spots: Vec<String>,
    #[serde(with = "micros")]
    pub started: DateTime<Utc>,
    #[serde(with = "micros")]
    pub ended: DateTime<Utc>,
}

/// How observer learns that a connection's conntrack entry went without a FIN or RST.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConntrackEnds {
    /// A kernel program checks the entries observer tracks, at most every 100 ms: nothing is
    /// added to the node's other connections.
    Revalidated,
    /// conntrack's destroy events, where the kernel refused that program (before Linux
    /// 5.17): while subscribed, conntrack builds a message at the end of every
    /// connection of the node.
    DestroyEvents,
}

impl ConntrackEnds {
    /// The name the log and `verify` use.
    pub fn as_str(self) -> &'static str {
        match self {
            ConntrackEnds::Revalidated => "revalidated",
            ConntrackEnds::DestroyEvents => "destroy_events",
        }
    }
}

/// Where the program that follows forwarded packets ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardingHook {
    /// Tracepoint `net_dev_queue`: every device a packet crosses, in every namespace.
    NetDevQueue,
    /// The netfilter hooks (LOCAL_IN, POST_ROUTING) of each node namespace: once per
    /// packet (Linux 6.4+).
    Netfilter,
}

impl ForwardingHook {
    /// How `verify` names it.
    pub fn described(self) -> &'static str {
        match self {
            ForwardingHook::NetDevQueue => "tracepoint net_dev_queue",
            ForwardingHook::Netfilter => "the netfilter hooks of the node namespaces",
        }
    }
}

/// How traffic reaches a Service: which kind of address the client dialed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrontendKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl FrontendKind {
    /// As the log writes it: `cluster_ip`, `node_port`, `external_ip`, `load_balancer`.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::ClusterIp => "cluster_ip",
            FrontendKind::NodePort => "node_port",
            FrontendKind::ExternalIp => "external_ip",
            FrontendKind::LoadBalancer => "load_balancer",
        }
    }
}

/// One address of a Service. `ip` is null for a NodePort (any local address).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frontend {
    pub kind: FrontendKind,
    pub ip: Option<std::net::IpAddr>,
    pub port: u16,
}

/// One endpoint of a Service with the share of new connections the rules give it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointShare {
    pub addr: SocketAddr,
    /// The iptables `--probability` waterfall multiplied out; 1/N in nftables mode.
    pub expected_share: f64,
    /// `namespace/pod` of the endpoint when it is a pod on a node observer sees; left
    /// out otherwise (so endpoints that got nothing are named too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// A Service port as the node's rules define it, written once when a recording first
/// sees it and again whenever its endpoints change, so that summaries can show backends
/// that received nothing (the "30 / 0 / 0" of a keep-alive client).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceRecord {
    /// `ns/name:port` as kube-proxy names the Service port.
    pub service: String,
    pub proto: Proto,
    /// Network namespace (inode) whose rules define it.
    pub netns: u32,
    pub frontends: Vec<Frontend>,
    /// The endpoints connections to any frontend can be sent to (cluster-wide; with
    /// `internalTrafficPolicy: Local`, this node's), with each one's share.
    pub endpoints: Vec<EndpointShare>,
    /// With `externalTrafficPolicy: Local`: the endpoints external clients of the
    /// NodePort, load-balancer and external IPs are sent to (this node's), with shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_endpoints: Option<Vec<EndpointShare>>,
    /// ClientIP session affinity: each client stays on one endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(with = "micros")]
    pub time: DateTime<Utc>,
}

/// A Service port's ClientIP session affinity, as its rules keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Affinity {
    /// How long a client stays on its endpoint after its last new connection
    /// (`sessionAffinityConfig.clientIP.timeoutSeconds`), when the rules say.
    pub timeout_s: Option<u64>,
}

/// Endpoints that joined or left a Service port in a namespace's rules (a readiness
/// flip, a rollout), written as soon as observer has read the changed rules. `time` is
/// when that read began: the change happened at most a moment before.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndpointsRecord {
    /// `ns/name:port` as kube-proxy names the Service port.
    pub service: String,
    pub proto: Proto,
    /// Network namespace (inode) whose rules changed.
    pub netns: u32,
    /// Sorted.
    pub added: Vec<SocketAddr>,
    /// Sorted; a Service that vanished from the rules lists all of its endpoints.
    pub removed: Vec<SocketAddr>,
    #[serde(with = "micros")]
    pub time: DateTime<Utc>,
}

/// One line of a recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum LogLine {
    Conn(ConnRecord),
    Service(ServiceRecord),
    Endpoints(EndpointsRecord),
    Dns(DnsRecord),
    Reject(RejectRecord),
    Summary(SummaryRecord),
    Mark(MarkRecord),
}

/// Errors reading a recording.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: cannot read")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a connection log line: {message}")]
    Parse {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: the file is empty; expected JSON Lines written by `observer record`")]
    Empty { path: String },
}

/// A parsed recording.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recording {
    pub conns: Vec<ConnRecord>,
    /// Service lines in file order (a later line for the same service and netns wins).
    pub services: Vec<ServiceRecord>,
    /// Endpoint changes in file order (none in logs written before they existed).
    pub endpoints: Vec<EndpointsRecord>,
    /// DNS queries in file order (none in logs written before they existed).
    pub dns: Vec<DnsRecord>,
    /// Rejected connections in file order (none in logs written before they existed).
    pub rejects: Vec<RejectRecord>,
    /// Marks in file order (none when no test wrote any).
    pub marks: Vec<MarkRecord>,
    pub summary: Option<SummaryRecord>,
    /// The line number of a last line that was cut short (observer killed, disk full):
    /// everything before it was read.
    pub cut: Option<usize>,
}

impl Recording {
    /// Parses JSON Lines text; `path` only names the source in errors.
    pub fn parse(path: &str, text: &str) -> Result<Recording, ReadError> {
        Recording::parse_bytes(path, text.as_bytes())
    }

    /// Parses JSON Lines. A last line without its newline that does not parse (even in
    /// the middle of a UTF-8 character) was cut short: the lines before it are kept and
    /// `cut` names it. Any other bad line is an error naming it.
    pub fn parse_bytes(path: &str, data: &[u8]) -> Result<Recording, ReadError> {
        let mut recording = Recording::default();
        let mut lines = 0;
        let unterminated = !data.is_empty() && !data.ends_with(b"\n");
        let segments: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
        let last = segments.len() - 1;
        for (index, line) in segments.into_iter().enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed: LogLine = match serde_json::from_slice(line) {
                Ok(parsed) => parsed,
                Err(_) if unterminated && index == last => {
                    recording.cut = Some(index + 1);
                    break;
                }
                Err(err) => {
                    return Err(ReadError::Parse {
                        path: path.to_owned(),
                        line: index + 1,
                        message: err.to_string(),
                    });
                }
            };
            lines += 1;
            match parsed {
                LogLine::Conn(conn) => recording.conns.push(conn),
                LogLine::Service(service) => recording.services.push(service),
                LogLine::Endpoints(change) => recording.endpoints.push(change),
                LogLine::Dns(query) => recording.dns.push(query),
                LogLine::Reject(reject) => recording.rejects.push(reject),
                LogLine::Summary(summary) => recording.summary = Some(summary),
                LogLine::Mark(mark) => recording.marks.push(mark),
            }
        }
        if lines == 0 && recording.cut.is_none() {
            return Err(ReadError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(recording)
    }

    /// Reads and parses a file.
    pub fn read(path: &std::path::Path) -> Result<Recording, ReadError> {
        let name = path.display().to_string();
        let data = std::fs::read(path).map_err(|source| ReadError::Io {
            path: name.clone(),
            source,
        })?;
        Recording::parse_bytes(&name, &data)
    }

    /// What to tell the reader of a cut log (`path` names it), once.
    pub fn cut_warning(&self, path: &str) -> Option<String> {
        self.cut.map(|line| {
            format!(
                "{path}:{line}: the log was cut at line {line} (observer did not exit cleanly): read up to the line before it; counts are incomplete"
            )
        })
    }
}

/// Formats a time the way the log writes it: RFC 3339, microseconds, `Z`.
pub fn format_time(time: &DateTime<Utc>) -> String {
    let mut buffer = [0; TIME_LEN];
    match write_time(time, &mut buffer) {
        Some(text) => text.to_owned(),
        None => time.to_rfc3339_opts(SecondsFormat::Micros, true),
    }
}

/// `2026-08-06T13:46:36.412345Z`
pub(crate) const TIME_LEN: usize = 27;

/// [`format_time`] without chrono's formatting machinery or an allocation (two per
/// connection line): `None` for what only chrono writes right (years outside
/// 0..=9999, leap seconds).
pub(crate) fn write_time<'a>(time: &DateTime<Utc>, out: &'a mut [u8; TIME_LEN]) -> Option<&'a str> {
    use chrono::{Datelike as _, Timelike as _};
    let year = u32::try_from(time.year())
        .ok()
        .filter(|year| *year <= 9999)?;
    let nanos = time.nanosecond();
    if nanos >= 1_000_000_000 {
        return None;
    }
    let mut put = |at: usize, value: u32, digits: usize| {
        let mut value = value;
        for i in (at..at + digits).rev() {
            out[i] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, year, 4);
    put(5, time.month(), 2);
    put(8, time.day(), 2);
    put(11, time.hour(), 2);
    put(14, time.minute(), 2);
    put(17, time.second(), 2);
    put(20, nanos / 1000, 6);
    for (at, separator) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
    ] {
        out[at] = separator;
    }
    out[26] = b'Z';
    std::str::from_utf8(out).ok()
}

/// Serializes a time as [`format_time`] writes it.
fn serialize_time<S: serde::Serializer>(time: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    let mut buffer = [0; TIME_LEN];
    match write_time(time, &mut buffer) {
        Some(text) => s.serialize_str(text),
        None => s.serialize_str(&time.to_rfc3339_opts(SecondsFormat::Micros, true)),
    }
}

pub(crate) mod micros {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(time: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        super::serialize_time(time, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

mod micros_opt {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(time: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match time {
            Some(time) => super::serialize_time(time, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| {
                DateTime::parse_from_rfc3339(&text)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(serde::de::Error::custom)
            })
            .transpose()
    }
}

/// The one `ConnRecord` builder of the unit tests: a finished TCP connection that
/// 10.244.1.9:45364 made to 10.96.35.226:80, pinned to `backend` in namespace
/// 4026532301 from 2026-08-06T13:46:36Z to 13:46:40Z, one request, no names. A test
/// changes what it needs with `ConnRecord { field, ..ConnRecord::example(backend) }`.
#[cfg(test)]
impl ConnRecord {
    pub(crate) fn example(backend: &str) -> ConnRecord {
        use chrono::TimeZone as _;
        ConnRecord {
            proto: Proto::Tcp,
            client: "10.244.1.9:45364".parse().unwrap(),
            client_pod: None,
            original_dst: "10.96.35.226:80".parse().unwrap(),
            backend: backend.parse().unwrap(),
            backend_pod: None,
            service: None,
            frontend: None,
            endpoint_in_rules: None,
            policy: None,
            same_node: None,
            netns: 4026532301,
            start: Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 36).unwrap(),
            end: Some(Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 40).unwrap()),
            duration_ms: 4000.0,
            requests: 1,
            bytes_to_backend: 93,
            bytes_from_backend: 180,
            close: Close::Fin,
            connect_ms: None,
            start_seen: true,
        }
    }
}

#[cfg(test)]
mod tests;
