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

/// `ConnState::last_payload` values: which side sent the latest payload.
pub const PAYLOAD_NONE: u8 = 0;
pub const PAYLOAD_ORIGINAL: u8 = 1;
pub const PAYLOAD_REPLY: u8 = 2;

/// `ConnState::fins`: what one FIN of each direction adds. The two halves of one `u64`
/// are updated with atomic adds, so both FINs are seen by whichever CPU adds last.
pub const FIN_ORIGINAL_ADD: u64 = 1;
pub const FIN_REPLY_ADD: u64 = 1 << 32;

/// What the kernel keeps per DNATed connection, keyed by the `struct nf_conn` address.
///
/// Packets of one connection run on several CPUs at once (the client's on one, the
/// backend's on another), so no update may read-modify-write a word another CPU
/// writes: every flag is its own byte (a one-byte store cannot clobber a neighbour),
/// per-direction fields are written only by packets of that direction, and the FIN
/// counts, read by both directions, are atomic adds (`BPF_XADD`, kernel 5.10 has it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnState {
    /// `bpf_ktime_get_ns()` of the first packet seen.
    pub start_ns: u64,
    /// When the latest packet was seen, on `bpf_ktime_get_ns()`'s clock (one 8-byte store
    /// per packet). Exact for packets that open or close a connection (TCP SYN, FIN,
    /// RST), DNS packets, and any packet that reports an event; for the others (most of
    /// a connection's packets) `start_ns` plus the jiffies since `start_jiffies`, which
    /// is up to a clock tick (`TICK_NS`, 1-10 ms) early: reading jiffies costs a load,
    /// reading the clock as much as the map lookup (observer-ebpf/src/clock.rs).
    pub last_ns: u64,
    /// The kernel's `jiffies_64` when `start_ns` was read.
    pub start_jiffies: u64,
    /// TCP: when the backend's first SYN-ACK was seen (`bpf_ktime_get_ns()`), 0 until
    /// then. Written by reply packets only. With `start_ns` of a connection whose SYN
    /// was seen, how long connecting took as the node saw it.
    pub synack_ns: u64,
    /// Payload bytes per direction (`ORIGINAL` = to the backend), each byte counted once.
    pub bytes: [u64; 2],
    /// UDP de-duplication: the device (`skb->dev`) each direction's datagrams are
    /// counted on. A datagram can pass several devices (a bridge, then the bridge port),
    /// and every datagram of a direction ends on the same one, while some skip the
    /// devices before it: a datagram that waited for the node to learn a pod's MAC
    /// address (ARP) passes the bridge and then the port, later ones go straight to the
    /// port. So the device is the last one the direction's first datagram passed: set
    /// on its first pass, moved along while the same `sk_buff` passes later devices.
    pub udp_dev: [u64; 2],
    /// UDP: the address of each direction's first datagram's `sk_buff`, which moves
    /// `udp_dev` along; once another datagram was counted on `udp_dev`, that device with
    /// `accounting::UDP_SETTLED` set: datagrams count there from then on.
    pub udp_first_skb: [u64; 2],
    /// FINs seen: low half from the client, high half from the backend (atomic adds
    /// of `FIN_ORIGINAL_ADD` / `FIN_REPLY_ADD`).
    pub fins: u64,
    /// Requests: the first client payload, then each client payload that follows
    /// backend payload. Written by client packets only.
    pub requests: u32,
    /// Network namespace inode of the conntrack entry (`nf_conn.ct_net->ns.inum`).
    pub netns: u32,
    /// TCP: the sequence number after the highest payload byte seen, per direction.
    /// Duplicates and retransmissions do not advance it, so they are not counted.
    pub next_seq: [u32; 2],
    /// TCP: the client's initial sequence number (valid when `syn_seen`): a SYN with
    /// another one on the same `nf_conn` is a new connection.
    pub isn: u32,
    /// `next_seq[dir]` holds a sequence number (0 or 1).
    pub seq_known: [u8; 2],
    /// A RST was seen (0 or 1).
    pub rst: u8,
    /// `PAYLOAD_*`: which side sent the latest payload.
    pub last_payload: u8,
    /// The connection's first packet (conntrack `IP_CT_NEW`) was seen (0 or 1); when 0,
    /// observer attached while the connection was already established.
    pub start_seen: u8,
    /// A reply packet was forwarded by the node (seen on `net_dev_queue`): the reply
    /// direction is accounted there, not at local delivery (0 or 1).
    pub reply_forwarded: u8,
    /// The client's SYN was seen and `isn` holds its sequence number (0 or 1).
    pub syn_seen: u8,
    /// A packet of the reply direction was accounted (0 or 1).
    pub replied: u8,
    /// `CLOSE_*` once the connection ended but its close event could not be written
    /// (ring buffer full): user space writes the record from the table instead.
    pub closed: u8,
    /// The backend said nothing listens (0 or 1): a TCP RST before any SYN-ACK, or an
    /// ICMP port unreachable about the connection (TCP or UDP). Written by reply
    /// packets only.
    pub refused: u8,
    /// The entry was not confirmed yet at the first packet seen, and no packet or
    /// revalidation has seen it confirmed since (0 or 1). Only the netfilter hook, which
    /// runs just before confirmation, sees such entries. One that ends so never became a
    /// connection: it lost a clash (its packet went on with the winner's entry) or was
    /// dropped at confirmation.
    pub unconfirmed: u8,
    /// The connection has a `DIALED` entry (0 or 1): every connection, except where user
    /// space learns opens from the table (`SETTING_OPENS_FROM_TABLE`), where only those
    /// whose dialed address the socket-side hooks look up (a client on the node itself,
    /// a DNS client) get one.
    pub dialed: u8,
    /// Client -> the address it dialed (ClusterIP:port, NodePort, ...).
    pub original: FlowTuple,
    /// Backend (pod IP:targetPort) -> client (or the SNAT address).
    pub reply: FlowTuple,
}

/// Index of the kernel's `SETTINGS` array: 1 when user space learns of new connections
/// from the table (observer-ebpf's `maps::open_event_wanted`).
pub const SETTING_OPENS_FROM_TABLE: u32 = 0;
/// `ConnEvent::kind`: the connection's first packet after its DNAT decision (written only
/// for connections adopted established once user space learns opens from the table).
pub const EVENT_OPEN: u32 = 1;
/// `ConnEvent::kind`: the connection closed (TCP FIN from both sides, or RST).
pub const EVENT_CLOSE: u32 = 2;

/// `ConnEvent::close` values.
pub const CLOSE_NONE: u32 = 0;
pub const CLOSE_FIN: u32 = 1;
pub const CLOSE_RST: u32 = 2;
/// The conntrack entry is gone without FIN or RST (its memory or its tuple now belongs
/// to a new connection).
pub const CLOSE_EXPIRED: u32 = 3;

/// The revalidation program's mark on a checked `nf_conn` address whose conntrack
/// entry is gone (the `CHECKED` array; an `nf_conn` is 8-byte aligned, so bit 0 is free).
pub const GONE_MARK: u64 = 1;

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
const _: () = assert!(core::mem::size_of::<ConnState>() == 208);
const _: () = assert!(core::mem::size_of::<ConnEvent>() == 232);
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
