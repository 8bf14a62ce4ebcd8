//! Per-connection accounting: bytes each way (each byte once), requests, TCP closing.

use observer_common::{
    conn::{
        CLOSE_FIN, CLOSE_NONE, CLOSE_RST, ConnEvent, ConnState, DialedKey, EVENT_CLOSE, ORIGINAL,
        PROTO_TCP, flags,
    },
    counters,
};

use aya_ebpf::maps::ring_buf::RingBufEntry;

use crate::{
    maps::{CONNS, DIALED, EVENTS, count},
    packet::{Packet, TCP_FIN, TCP_RST, TCP_SYN},
};

/// Accounts one packet in direction `dir`; returns the `CLOSE_*` reason when the packet
/// ends the connection.
#[inline(always)]
pub fn account(state: &mut ConnState, dir: usize, packet: &Packet, now: u64) -> u32 {
    state.last_ns = now;
    let dir = dir & 1;
    let fresh = if packet.protocol == PROTO_TCP {
        fresh_tcp_bytes(state, dir, packet)
    } else if state.last_head[dir] == packet.head {
        // The same datagram passing a second device (bridge, then bridge port).
        0
    } else {
        state.last_head[dir] = packet.head;
        packet.payload
    };

    if fresh > 0 {
        state.bytes[dir] += fresh as u64;
        if dir == ORIGINAL {
            if state.flags & flags::LAST_PAYLOAD_ORIGINAL == 0 {
                state.requests += 1;
            }
            state.flags = (state.flags & !flags::LAST_PAYLOAD_REPLY) | flags::LAST_PAYLOAD_ORIGINAL;
        } else {
            state.flags = (state.flags & !flags::LAST_PAYLOAD_ORIGINAL) | flags::LAST_PAYLOAD_REPLY;
        }
    }

    if packet.protocol != PROTO_TCP {
        return CLOSE_NONE;
    }
    if packet.tcp_flags & TCP_RST != 0 {
        state.flags |= flags::RST;
        return CLOSE_RST;
    }
    if packet.tcp_flags & TCP_FIN != 0 {
        state.flags |= if dir == ORIGINAL {
            flags::FIN_ORIGINAL
        } else {
            flags::FIN_REPLY
        };
    }
    if state.flags & (flags::FIN_ORIGINAL | flags::FIN_REPLY)
        == flags::FIN_ORIGINAL | flags::FIN_REPLY
    {
        CLOSE_FIN
    } else {
        CLOSE_NONE
    }
}

/// TCP payload bytes of `packet` beyond the highest sequence number already seen in
/// this direction. Duplicates (one packet seen on two devices) and retransmissions add
/// nothing, so every byte is counted once.
#[inline(always)]
fn fresh_tcp_bytes(state: &mut ConnState, dir: usize, packet: &Packet) -> u32 {
    let known = if dir == ORIGINAL {
        flags::SEQ_KNOWN_ORIGINAL
    } else {
        flags::SEQ_KNOWN_REPLY
    };
    if state.flags & known == 0 {
        state.flags |= known;
        // A SYN consumes one sequence number before the first payload byte.
        state.next_seq[dir] = if packet.tcp_flags & TCP_SYN != 0 {
            packet.seq.wrapping_add(1)
        } else {
            packet.seq
        };
    }
    let next = state.next_seq[dir];
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
    state.next_seq[dir] = end;
    end.wrapping_sub(start)
}

/// `bpf_ringbuf_submit` flags and `bpf_ringbuf_query` selector.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
/// User space drains the ring buffer every few milliseconds anyway; it is woken early
/// only when this much is waiting (an eighth of the ring), so a busy node does not cost
/// a wake-up per event.
const WAKEUP_BYTES: u64 = 512 * 1024;

#[inline(always)]
fn submit_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Fills a reserved ring-buffer slot with an event carrying a copy of `state`.
#[inline(always)]
fn fill(
    entry: &mut RingBufEntry<ConnEvent>,
    kind: u32,
    close: u32,
    conntrack: u64,
    state: *const ConnState,
    now: u64,
) {
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reserved ring-buffer slot of the right size and
    // alignment; `state` points at a live map value or per-CPU scratch slot.
    unsafe {
        (*event).kind = kind;
        (*event).close = close;
        (*event).conntrack = conntrack;
        (*event).time_ns = now;
        core::ptr::copy_nonoverlapping(state, &raw mut (*event).state, 1);
    }
}

/// Writes an event carrying a copy of `state`; a full ring buffer is counted.
#[inline(always)]
pub fn emit(kind: u32, close: u32, conntrack: u64, state: *const ConnState, now: u64) {
    match EVENTS.reserve::<ConnEvent>(0) {
        Some(mut entry) => {
            fill(&mut entry, kind, close, conntrack, state, now);
            entry.submit(submit_flags());
            count(counters::EVENTS_EMITTED);
        }
        None => count(counters::RINGBUF_DROPS),
    }
}

/// Makes a new connection findable by what its client dialed (see `DIALED`). A tuple
/// already taken (the same client and address in another node's namespace) keeps its
/// first owner.
#[inline(always)]
pub fn remember_dialed(conntrack: u64, state: &ConnState) {
    let _ = DIALED.insert(&DialedKey::of(&state.original), &conntrack, BPF_NOEXIST);
}

/// Removes the `DIALED` entry of a closing connection, if it is its own.
#[inline(always)]
fn forget_dialed(conntrack: u64, state: *const ConnState) {
    // SAFETY: `state` points at a live map value or a ring-buffer copy.
    let key = DialedKey::of(unsafe { &(*state).original });
    if DIALED.get_ptr(&key).is_some_and(|owner| {
        // SAFETY: a live map value.
        unsafe { *owner == conntrack }
    }) {
        let _ = DIALED.remove(&key);
    }
}

/// `bpf_map_update_elem` flag: fail if the key exists.
pub const BPF_NOEXIST: u64 = 1;

/// Ends a tracked connection: reports it and removes its entry. Only the CPU whose
/// removal succeeds reports, so a connection is closed exactly once.
#[inline(always)]
pub fn close(conntrack: u64, state: *const ConnState, reason: u32, now: u64) {
    forget_dialed(conntrack, state);
    match EVENTS.reserve::<ConnEvent>(0) {
        Some(mut entry) => {
            fill(&mut entry, EVENT_CLOSE, reason, conntrack, state, now);
            if CONNS.remove(&conntrack).is_ok() {
                entry.submit(submit_flags());
                count(counters::EVENTS_EMITTED);
            } else {
                entry.discard(0);
            }
        }
        None => {
            if CONNS.remove(&conntrack).is_ok() {
                count(counters::RINGBUF_DROPS);
            }
        }
    }
}
