//! New connections to a Service that netfilter dropped before any DNAT: kube-proxy's
//! REJECT (or DROP) of a Service port with no endpoints. The kernel program on
//! `skb:kfree_skb` keeps one entry per client flow (`RejectKey`) and reports each
//! flow's first packet, and each new TCP attempt, through its own ring buffer.

use crate::conn::Endpoint;

/// `RejectEvent::kind`: distinct from the connection and DNS events' kinds.
pub const EVENT_REJECT: u32 = 4;

/// One client flow whose first packet netfilter dropped: for TCP a connection attempt
/// (one client port), for UDP a client socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RejectKey {
    /// The client's address and port.
    pub client: Endpoint,
    /// What it dialed: the Service's address and port (no DNAT happened).
    pub dialed: Endpoint,
    /// Network namespace inode of the conntrack entry (which node dropped it).
    pub netns: u32,
    /// `conn::FAMILY_IPV4` or `conn::FAMILY_IPV6`.
    pub family: u16,
    /// `conn::PROTO_TCP` or `conn::PROTO_UDP`.
    pub protocol: u8,
    pub _pad: u8,
}

/// What the kernel counted of a flow (`REJECTED` map value).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectCount {
    /// `bpf_ktime_get_ns()` of the flow's first dropped packet.
    pub first_ns: u64,
    /// ... and of its latest.
    pub last_ns: u64,
    /// Dropped packets (atomic adds: several CPUs may drop the same flow's packets).
    pub packets: u64,
    /// TCP: the initial sequence number of the attempt (a SYN with another one on the
    /// same client port is a new attempt); UDP: 0.
    pub isn: u32,
    pub _pad: u32,
}

/// A ring-buffer record: a flow's first dropped packet, or a new TCP attempt.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectEvent {
    /// `EVENT_REJECT`.
    pub kind: u32,
    /// TCP: the attempt's initial sequence number; UDP: 0.
    pub isn: u32,
    /// `bpf_ktime_get_ns()` of the dropped packet.
    pub time_ns: u64,
    pub key: RejectKey,
}

const _: () = assert!(core::mem::size_of::<RejectKey>() == 48);
const _: () = assert!(core::mem::size_of::<RejectCount>() == 32);
const _: () = assert!(core::mem::size_of::<RejectEvent>() == 64);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain old data: `#[repr(C)]`, every bit pattern valid, no implicit padding
    // (the sizes are asserted above and every gap is an explicit `_pad` field).
    unsafe impl aya::Pod for super::RejectKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RejectCount {}
}
