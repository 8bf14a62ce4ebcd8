//! Per-packet accounting of one connection, shared by the kernel programs (which call it
//! on every packet, `observer-ebpf/src/conn.rs`) and host unit tests (below): bytes each
//! way (each byte once), requests, the SYN-ACK, and how a TCP connection closes.
//!
//! A connection's packets run on several CPUs at once, so `ConnState` is never updated
//! with a read-modify-write of a word another CPU writes: fields are read and written one
//! by one through [`load!`](crate::load)/[`store!`](crate::store) (volatile, so the
//! compiler neither merges nor caches them), and the FIN counts are atomic adds. The
//! atomic add is passed in: core's atomic types lack it on the BPF target, where the
//! programs use the `atomic_xadd` intrinsic (`BPF_XADD`).

use crate::conn::{
    CLOSE_FIN, CLOSE_NONE, CLOSE_RST, ConnState, FIN_ORIGINAL_ADD, FIN_REPLY_ADD, ORIGINAL,
    PAYLOAD_ORIGINAL, PAYLOAD_REPLY, PROTO_TCP, REPLY,
};

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// What accounting needs of one packet, read from its headers by the kernel programs.
pub struct Packet {
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub protocol: u8,
    /// TCP flags byte (0 for UDP).
    pub tcp_flags: u8,
    /// TCP sequence number (host order; 0 for UDP).
    pub seq: u32,
    /// Transport payload bytes in this skb (a GSO skb carries many segments).
    pub payload: u32,
    /// UDP: `skb->dev`, the device about to transmit it (0 for TCP and at local
    /// delivery).
    pub dev: u64,
    /// UDP: the `sk_buff`'s address (0 for TCP and at local delivery).
    pub skb: u64,
    /// Kernel address of the first payload byte (0 at local delivery).
    pub payload_at: u64,
    /// Payload bytes in the skb's linear part, readable at `payload_at` (TCP payload
    /// usually lies in page fragments: 0 then).
    pub linear: u32,
}

/// Reads one field of a `*const/*mut ConnState`: `load!(state.field[index])`.
#[macro_export]
macro_rules! load {
    ($state:ident . $field:ident) => {{
        let state = $state;
        // SAFETY: `state` points at a live map value (or this CPU's scratch slot, a
        // ring-buffer slot, or a test's own value); the field is plain data, aligned
        // within the repr(C) struct.
        unsafe { core::ptr::read_volatile(&raw const (*state).$field) }
    }};
    ($state:ident . $field:ident [$index:expr]) => {{
        let (state, index) = ($state, $index);
        // SAFETY: as above; the index is in bounds (a direction, masked to 0 or 1).
        unsafe { core::ptr::read_volatile(&raw const (*state).$field[index]) }
    }};
}

/// Writes one field of a `*mut ConnState`: `store!(state.field[index], value)`. A store
/// of a field's own width never touches its neighbours.
#[macro_export]
macro_rules! store {
    ($state:ident . $field:ident, $value:expr) => {{
        let (state, value) = ($state, $value);
        // SAFETY: as in `load!`; the pointer is writable (a map value or scratch slot).
        unsafe { core::ptr::write_volatile(&raw mut (*state).$field, value) }
    }};
    ($state:ident . $field:ident [$index:expr], $value:expr) => {{
        let (state, index, value) = ($state, $index, $value);
        // SAFETY: as in `load!`; the pointer is writable (a map value or scratch slot).
        unsafe { core::ptr::write_volatile(&raw mut (*state).$field[index], value) }
    }};
}

/// Accounts one packet in direction `dir`; returns the `CLOSE_*` reason when the packet
/// ends the connection, and the payload bytes it added (0 for a duplicate).
/// `atomic_add(target, value)` adds atomically to an aligned u64 of `state`.
///
/// # Safety
/// `state` points at a live, aligned `ConnState` that this call may write (a map value
/// the verifier checked, a scratch slot, a test's own value).
#[inline(always)]
pub unsafe fn account<A: Fn(*mut u64, u64)>(
    state: *mut ConnState,
    dir: usize,
    packet: &Packet,
    now: u64,
    atomic_add: A,
) -> (u32, u32) {
    let dir = dir & 1;
    store!(state.last_ns, now);
    if dir == REPLY {
        store!(state.replied, 1);
        // Only SYN-ACKs go further: a packet of an established connection pays one test
        // of a flags byte it already holds.
        if packet.tcp_flags & TCP_SYN != 0 {
            answered(state, packet, now);
        }
    }
    let fresh = if packet.protocol == PROTO_TCP {
        fresh_tcp_bytes(state, dir, packet)
    } else {
        fresh_udp_bytes(state, dir, packet)
    };
    if fresh > 0 {
        // Per-direction fields: only packets of `dir` write them.
        store!(state.bytes[dir], load!(state.bytes[dir]) + fresh as u64);
        if dir == ORIGINAL {
            if load!(state.last_payload) != PAYLOAD_ORIGINAL {
                store!(state.requests, load!(state.requests) + 1);
            }
            store!(state.last_payload, PAYLOAD_ORIGINAL);
        } else {
            store!(state.last_payload, PAYLOAD_REPLY);
        }
    }
    (closing(state, dir, packet, atomic_add), fresh)
}

/// The `CLOSE_*` reason when this packet ends a TCP connection.
#[inline(always)]
fn closing<A: Fn(*mut u64, u64)>(
    state: *mut ConnState,
    dir: usize,
    packet: &Packet,
    atomic_add: A,
) -> u32 {
    if packet.protocol != PROTO_TCP {
        return CLOSE_NONE;
    }
    if packet.tcp_flags & TCP_RST != 0 {
        store!(state.rst, 1);
        // SAFETY: `state` is the live value `account` was given.
        if dir == REPLY && unsafe { refuses(state) } {
            store!(state.refused, 1);
        }
        return CLOSE_RST;
    }
    if packet.tcp_flags & TCP_FIN == 0 {
        return CLOSE_NONE;
    }
    let add = if dir == ORIGINAL {
        FIN_ORIGINAL_ADD
    } else {
        FIN_REPLY_ADD
    };
    // Adds to one word are ordered (and a plain load after this CPU's add sees it or
    // later), so the CPU that adds the second direction's FIN reads both halves set.
    // SAFETY: `fins` is aligned in the live value `state` points at.
    atomic_add(unsafe { &raw mut (*state).fins }, add);
    if both_fins(load!(state.fins)) {
        CLOSE_FIN
    } else {
        CLOSE_NONE
    }
}

/// The backend's SYN-ACK: the first one's time is when the connection was answered.
#[inline(always)]
fn answered(state: *mut ConnState, packet: &Packet, now: u64) {
    if packet.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK && load!(state.synack_ns) == 0 {
        store!(state.synack_ns, now);
    }
}

/// Whether a refusal from the backend (an RST, an ICMP port unreachable) is its first
/// answer to a connection whose start was seen: nothing listens there. A connection
/// adopted mid-stream, or one answered before (a SYN-ACK; for UDP any datagram), is not
/// refused.
///
/// # Safety
/// `state` points at a live, aligned `ConnState`.
#[inline(always)]
pub unsafe fn refuses(state: *const ConnState) -> bool {
    // SAFETY: as in `load!`; the tuple is written once, before the entry is inserted.
    let protocol = unsafe { core::ptr::read_volatile(&raw const (*state).original.protocol) };
    load!(state.start_seen) != 0
        && load!(state.synack_ns) == 0
        && (protocol == PROTO_TCP || load!(state.replied) == 0)
}

/// Whether a packet of a connection past its decision carries nothing `account` uses but
/// the time: TCP without payload, SYN, FIN or RST (a pure ACK, about one packet in three
/// of a keep-alive exchange). The programs let it go before any map lookup, except
/// when conntrack marked it NEW: then it is a decision (an entry picked up mid-stream).
/// The connection's `last_ns` is then its last packet that carried data or a flag.
#[inline(always)]
pub fn carries_nothing(packet: &Packet) -> bool {
    packet.protocol == PROTO_TCP
        && packet.payload == 0
        && packet.tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST) == 0
}

/// Whether `ConnState::fins` holds a FIN of each direction (one half each).
#[inline(always)]
pub fn both_fins(fins: u64) -> bool {
    fins as u32 != 0 && (fins >> 32) != 0
}

/// TCP payload bytes of `packet` beyond the highest sequence number already seen in
/// this direction. Duplicates (one packet seen on two devices) and retransmissions add
/// nothing, so every byte is counted once.
#[inline(always)]
fn fresh_tcp_bytes(state: *mut ConnState, dir: usize, packet: &Packet) -> u32 {
    if dir == ORIGINAL
        && packet.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
        && load!(state.syn_seen) == 0
    {
        store!(state.isn, packet.seq);
        store!(state.syn_seen, 1);
    }
    if load!(state.seq_known[dir]) == 0 {
        store!(state.seq_known[dir], 1);
        // A SYN consumes one sequence number before the first payload byte.
        let first = if packet.tcp_flags & TCP_SYN != 0 {
            packet.seq.wrapping_add(1)
        } else {
            packet.seq
        };
        store!(state.next_seq[dir], first);
    }
    let next = load!(state.next_seq[dir]);
    let end = packet.seq.wrapping_add(packet.payload);
    // Serial-number arithmetic (RFC 1982): correct across sequence wrap.
    if (end.wrapping_sub(next) as i32) <= 0 {
        return 0;
    }
    let start = if (packet.seq.wrapping_sub(next) as i32) > 0 {
        packet.seq
    } else {
        next
    };
    store!(state.next_seq[dir], end);
    end.wrapping_sub(start)
}

/// The low bit of `ConnState::udp_first_skb` once the direction's device settled (the
/// rest is then that device): `sk_buff` and `net_device` addresses are aligned, so it is
/// never set in either.
pub const UDP_SETTLED: u64 = 1;

/// UDP payload bytes of `packet`, counted only on the direction's counting device (see
/// `ConnState::udp_dev`): a datagram passing several devices is counted once, on the last
/// device the direction's first datagram passed, which every later datagram passes too.
///
/// The first datagram moves `udp_dev` along while another datagram may settle it on
/// another CPU: the settled device is written to `udp_first_skb`, a word the move never
/// writes, so a move that lands after the settle changes nothing. (Writing both to
/// `udp_dev` let a late move undo a settle: the datagram that settled it on the bridge
/// was counted again on the bridge port.)
#[inline(always)]
fn fresh_udp_bytes(state: *mut ConnState, dir: usize, packet: &Packet) -> u32 {
    let device = load!(state.udp_dev[dir]);
    if device == 0 {
        // The direction's first datagram, on its first device (or local delivery, where
        // `dev` is 0 and every datagram arrives once).
        store!(state.udp_dev[dir], packet.dev);
        store!(state.udp_first_skb[dir], packet.skb);
        return packet.payload;
    }
    let first = load!(state.udp_first_skb[dir]);
    if first & UDP_SETTLED != 0 {
        return if packet.dev == first & !UDP_SETTLED {
            packet.payload
        } else {
            0
        };
    }
    if packet.skb == first && packet.dev != device {
        // The first datagram, already counted, now on a later device: count there.
        store!(state.udp_dev[dir], packet.dev);
        return 0;
    }
    // Another datagram (one at the first's address on the same device is a later one in
    // the first's freed memory: a datagram passes a device once).
    if packet.dev == device {
        // Another datagram on the device the first one reached last: it stays the one.
        store!(state.udp_first_skb[dir], device | UDP_SETTLED);
        return packet.payload;
    }
    0
}

#[cfg(test)]
mod tests;
