//! One tracked connection: its conntrack tuples, counters, and the events that
//! report it.

/// Address families as the kernel numbers them (`AF_INET`, `AF_INET6`).
pub const FAMILY_IPV4: u16 = 2;
pub const FAMILY_IPV6: u16 = 10;

/// IP protocol numbers.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// One side of a tuple. IPv4 addresses use the first 4 bytes of `addr`
/// (network order), IPv6 all 16. `port` is in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub addr: [u8; 16],
    pub port: u16,
    pub _pad: [u8; 2],
}

/// A conntrack tuple as the kernel stores it for one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowTuple {
    pub src: Endpoint,
    pub dst: Endpoint,
    /// `FAMILY_IPV4` or `FAMILY_IPV6`.
    pub family: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub protocol: u8,
    pub _pad: u8,
}

/// `ConnState::flags` bits.
pub mod flags {
    /// `next_seq[ORIGINAL]` holds a sequence number.
    pub const SEQ_KNOWN_ORIGINAL: u32 = 1 << 0;
    /// `next_seq[REPLY]` holds a sequence number.
    pub const SEQ_KNOWN_REPLY: u32 = 1 << 1;
    pub const FIN_ORIGINAL: u32 = 1 << 2;
    pub const FIN_REPLY: u32 = 1 << 3;
    pub const RST: u32 = 1 << 4;
    /// The latest payload came from the client (original direction).
    pub const LAST_PAYLOAD_ORIGINAL: u32 = 1 << 5;
    /// The latest payload came from the backend (reply direction).
    pub const LAST_PAYLOAD_REPLY: u32 = 1 << 6;
    /// The connection's first packet (conntrack `IP_CT_NEW`) was seen; when clear,
    /// observer attached while the connection was already established.
    pub const START_SEEN: u32 = 1 << 7;
    /// A reply packet was forwarded by the node (seen on `net_dev_queue`): the reply
    /// direction is accounted there, not at local delivery.
    pub const REPLY_FORWARDED: u32 = 1 << 8;
}

/// Finds a connection by what its client dialed: the key of the `DIALED` map, which the
/// local-delivery hook uses for replies to clients on the node itself (host network),
/// whose replies are delivered locally and never forwarded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DialedKey {
    pub client: [u8; 16],
    pub dialed: [u8; 16],
    pub client_port: u16,
    pub dialed_port: u16,
    pub protocol: u8,
    pub _pad: [u8; 3],
}

impl DialedKey {
    /// The key of a connection from its original tuple.
    pub fn of(original: &FlowTuple) -> DialedKey {
        DialedKey {
            client: original.src.addr,
            dialed: original.dst.addr,
            client_port: original.src.port,
            dialed_port: original.dst.port,
            protocol: original.protocol,
            _pad: [0; 3],
        }
    }
}

/// Index of the original (client -> dialed address) direction in per-direction arrays.
pub const ORIGINAL: usize = 0;
/// Index of the reply (backend -> client) direction in per-direction arrays.
pub const REPLY: usize = 1;

/// What the kernel keeps per DNATed connection, keyed by the `struct nf_conn` address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnState {
    /// `bpf_ktime_get_ns()` of the first packet seen.
    pub start_ns: u64,
    /// `bpf_ktime_get_ns()` of the latest packet seen.
    pub last_ns: u64,
    /// Payload bytes per direction (`ORIGINAL` = to the backend), each byte counted once.
    pub bytes: [u64; 2],
    /// UDP de-duplication: `skb->head` of the latest datagram per direction. The same
    /// packet passes `net_dev_queue` once per device (bridge, then bridge port).
    pub last_head: [u64; 2],
    /// Requests: the first client payload, then each client payload that follows
    /// backend payload.
    pub requests: u32,
    /// Network namespace inode of the conntrack entry (`nf_conn.ct_net->ns.inum`).
    pub netns: u32,
    /// TCP: the sequence number after the highest payload byte seen, per direction.
    /// Duplicates and retransmissions do not advance it, so they are not counted.
    pub next_seq: [u32; 2],
    /// `flags::*` bits.
    pub flags: u32,
    pub _pad: u32,
    /// Client -> the address it dialed (ClusterIP:port, NodePort, ...).
    pub original: FlowTuple,
    /// Backend (pod IP:targetPort) -> client (or the SNAT address).
    pub reply: FlowTuple,
}

/// `ConnEvent::kind`: the connection's first packet after its DNAT decision.
pub const EVENT_OPEN: u32 = 1;
/// `ConnEvent::kind`: the connection closed (TCP FIN from both sides, or RST).
pub const EVENT_CLOSE: u32 = 2;

/// `ConnEvent::close` values.
pub const CLOSE_NONE: u32 = 0;
pub const CLOSE_FIN: u32 = 1;
pub const CLOSE_RST: u32 = 2;

/// A ring-buffer record. Every event carries the full state, so a close event whose
/// open event was dropped still yields a complete connection record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnEvent {
    /// `EVENT_OPEN` or `EVENT_CLOSE`.
    pub kind: u32,
    /// `CLOSE_*`.
    pub close: u32,
    /// The `struct nf_conn` address: with `state.start_ns`, identifies the connection.
    pub conntrack: u64,
    /// `bpf_ktime_get_ns()` of the packet that produced the event.
    pub time_ns: u64,
    pub state: ConnState,
}

const _: () = assert!(core::mem::size_of::<Endpoint>() == 20);
const _: () = assert!(core::mem::size_of::<FlowTuple>() == 44);
const _: () = assert!(core::mem::size_of::<ConnState>() == 160);
const _: () = assert!(core::mem::size_of::<ConnEvent>() == 184);
const _: () = assert!(core::mem::size_of::<DialedKey>() == 40);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain old data: `#[repr(C)]`, every bit pattern valid, no implicit padding
    // (the sizes are asserted above and every gap is an explicit `_pad` field).
    unsafe impl aya::Pod for super::ConnState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ConnEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::DialedKey {}
}
