//! The first bytes of a DNS message sent to or from a Service on port 53: copied by the
//! kernel programs, decoded in user space (`observer::dns`).

use crate::conn::FlowTuple;

/// The Service port whose payload is copied (what the client dialed, before DNAT).
pub const DNS_PORT: u16 = 53;

/// At most this many payload bytes are copied: the 12-byte header and the question
/// (id, flags with rcode, name, type). A question whose name is too long to fit (over
/// about 240 bytes) cannot be decoded and is counted as malformed.
pub const DNS_PREFIX: usize = 256;

/// `DnsEvent::kind`: distinct from the connection events' kinds (`conn::EVENT_*`), which
/// share its first field, so that a record read from the wrong ring buffer is refused.
pub const EVENT_DNS: u32 = 3;

/// A record of the DNS ring buffer (`DNS_EVENTS`): a DNS message's first bytes. For TCP
/// it holds a segment's first bytes instead: messages there carry a 2-byte length (RFC 1035
/// 4.2.2), a segment may start inside a message or hold several, and user space finds
/// the messages' starts from `seq` and `segment`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DnsEvent {
    /// `EVENT_DNS`.
    pub kind: u32,
    /// Bytes of `payload` that hold the message or segment (at most `DNS_PREFIX`). The kernel reads
    /// `DNS_PREFIX` bytes whatever the message's length (a constant size for the
    /// verifier): the bytes past `len` are the rest of the packet's buffer, never read.
    pub len: u16,
    /// `conn::ORIGINAL` (client -> server: a query) or `conn::REPLY` (a response).
    pub dir: u8,
    /// `conn::PROTO_UDP` or `conn::PROTO_TCP`.
    pub protocol: u8,
    /// The `struct nf_conn` address of the connection.
    pub conntrack: u64,
    /// `bpf_ktime_get_ns()` of the packet.
    pub time_ns: u64,
    /// Network namespace inode of the conntrack entry.
    pub netns: u32,
    /// TCP: the sequence number of the segment's first payload byte (0 for UDP).
    pub seq: u32,
    /// Client -> the address it dialed (ClusterIP:53).
    pub original: FlowTuple,
    pub payload: [u8; DNS_PREFIX],
    /// TCP: the segment's payload bytes (`len` of them copied); UDP: 0.
    pub segment: u32,
}

impl Default for DnsEvent {
    fn default() -> DnsEvent {
        DnsEvent {
            kind: EVENT_DNS,
            len: 0,
            dir: 0,
            protocol: 0,
            conntrack: 0,
            time_ns: 0,
            netns: 0,
            seq: 0,
            original: FlowTuple::default(),
            payload: [0; DNS_PREFIX],
            segment: 0,
        }
    }
}

const _: () = assert!(core::mem::size_of::<DnsEvent>() == 336);
const _: () = assert!(core::mem::offset_of!(DnsEvent, original) == 32);
const _: () = assert!(core::mem::offset_of!(DnsEvent, payload) == 76);
