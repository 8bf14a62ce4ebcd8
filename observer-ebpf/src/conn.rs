//! Per-connection accounting in the kernel: each packet through
//! `observer_common::accounting` (bytes each way, each byte once; requests; TCP closing),
//! then events, the dialed-address table, and ending a connection exactly once.
//!
//! A connection's packets run on several CPUs at once, so `ConnState` is never
//! updated with a read-modify-write of a word another CPU writes (see its doc): fields
//! are read and written one by one through `load!`/`store!` (volatile, so the compiler
//! neither merges nor caches them), and the FIN counts are atomic adds.

use aya_ebpf::maps::ring_buf::RingBufEntry;
pub use observer_common::accounting::both_fins;
use observer_common::{
    accounting,
    conn::{ConnEvent, ConnState, DialedKey, EVENT_CLOSE, PROTO_TCP},
    counters,
};

use crate::{
    maps::{
        BPF_NOEXIST, DIALED, EVENTS, EVENTS_WAKEUP_BYTES, atomic_add, count, count_lost,
        dialed_slot, fold_address, mark_dialed, submit_flags,
    },
    packet::{Packet, TCP_ACK, TCP_SYN},
    state::{is_dns, load, store},
    table::Table,
};

/// Accounts one packet in direction `dir` (see `observer_common::accounting::account`,
/// unit-tested there), with the kernel's atomic add for the FIN counts.
#[inline(always)]
pub fn account(state: *mut ConnState, dir: usize, packet: &Packet, now: u64) -> (u32, u32) {
    // SAFETY: every caller passes a live map value or this CPU's scratch slot.
    unsafe { accounting::account(state, dir, packet, now, atomic_add) }
}

/// Whether a refusal now is the backend's first answer (`accounting::refuses`).
#[inline(always)]
pub fn refuses(state: *const ConnState) -> bool {
    // SAFETY: as in `account`.
    unsafe { accounting::refuses(state) }
}

/// The flags to submit a connection event with (see `maps::submit_flags`).
#[inline(always)]
fn event_flags() -> u64 {
    submit_flags(&EVENTS, EVENTS_WAKEUP_BYTES)
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

/// Writes an event carrying a copy of `state`. A full ring buffer is counted: the
/// connection is still in the table, so its record is not lost.
#[inline(always)]
pub fn emit(kind: u32, close: u32, conntrack: u64, state: *const ConnState, now: u64) {
    match EVENTS.reserve::<ConnEvent>(0) {
        Some(mut entry) => {
            fill(&mut entry, kind, close, conntrack, state, now);
            entry.submit(event_flags());
        }
        None => count(counters::EVENTS_DROPPED),
    }
}

/// Whether a new connection gets a `DIALED` entry (`ConnState::dialed`). The
/// socket-side hooks look up only a client on the node itself (`local_client`), whose
/// replies `local_delivery` accounts, and a DNS client, whose TCP messages both copy.
/// Every other connection needs one only to be superseded in the kernel (`supersede`:
/// a new connection on the tuple of one whose conntrack entry went unseen), which a
/// destroy event about the old entry must not find first; where user space learns opens
/// from the table it revalidates by entry address and supersedes at its sweep, and pod
/// clients' connections skip the entry, its insert and its removal.
#[inline(always)]
pub fn dialed_wanted(local_client: bool, dns: bool, opens_from_table: bool) -> bool {
    local_client || dns || !opens_from_table
}

/// Makes a new connection findable by what its client dialed (see `DIALED`), where
/// `state.dialed` says so. A tuple already taken (the same client and address in another
/// node's namespace) keeps its first owner. `DIALED_SEEN` lets `local_delivery` look for
/// it only where that hook has work: a client on the node itself (`local_client`),
/// whose replies never pass the forwarding hook, or a DNS exchange, whose TCP responses
/// are copied there. A pod client's replies then cost that hook one byte read instead of
/// two map lookups.
#[inline(always)]
pub fn remember_dialed(conntrack: u64, state: &ConnState, local_client: bool) {
    if local_client || is_dns(state) {
        let dst = &state.original.dst;
        mark_dialed(dialed_slot(
            fold_address(&dst.addr),
            dst.port,
            state.original.protocol,
        ));
    }
    if state.dialed != 0 {
        insert_dialed(conntrack, state);
    }
}

/// Enters a new connection in `DIALED` (a tuple already taken keeps its first owner).
#[inline(always)]
pub fn insert_dialed(conntrack: u64, state: &ConnState) {
    let _ = DIALED.insert(&DialedKey::of(&state.original), &conntrack, BPF_NOEXIST);
}

/// Removes a `DIALED` entry, if it is `conntrack`'s.
#[inline(always)]
fn forget_dialed(conntrack: u64, key: &DialedKey) {
    if DIALED.get_ptr(key).is_some_and(|owner| {
        // SAFETY: a live map value.
        unsafe { *owner == conntrack }
    }) {
        let _ = DIALED.remove(key);
    }
}

/// Ends a tracked connection: reports it and removes its entry. Only the CPU whose
/// removal succeeds reports, so a connection is closed exactly once. With the ring
/// buffer full the entry stays, marked `closed`: user space's next sweep removes it
/// and writes the record (a later packet of the connection retries the report).
///
/// Marked only while `conntrack`'s entry is still the one `state` points at: another CPU
/// may have ended it meanwhile (and reported or counted it), and the kernel hands a
/// removed element straight to the next insert, so `state` may hold another connection
/// by now, which must not be marked closed. (A narrow window remains between this check
/// and the store; docs/design.md, "A removed entry's memory".)
#[inline(always)]
pub fn close<T: Table>(conntrack: u64, state: *mut ConnState, reason: u32, now: u64) {
    if !report::<T>(conntrack, state, reason, now)
        && T::get(conntrack).is_some_and(|current| core::ptr::eq(current, state))
    {
        store!(state.closed, reason as u8);
        count(counters::EVENTS_DROPPED);
    }
}

/// Ends a tracked connection now, because its key is needed for a new connection
/// (the kernel reused the `nf_conn`). With the ring buffer full it cannot wait for
/// user space: it is counted as a lost connection, if its start was seen. One adopted
/// mid-connection (`start_seen` 0) was no decision made while attached (or was counted
/// lost when its first packet found the table full): only its event is counted.
#[inline(always)]
pub fn end_now<T: Table>(conntrack: u64, state: *mut ConnState, reason: u32, now: u64) {
    if report::<T>(conntrack, state, reason, now) {
        return;
    }
    // SAFETY: a live map value; read before the removal frees it.
    let key = DialedKey::of(unsafe { &(*state).original });
    let dialed = load!(state.dialed) != 0;
    let netns = load!(state.netns);
    let start_seen = load!(state.start_seen) != 0;
    if T::remove(conntrack) {
        if dialed {
            forget_dialed(conntrack, &key);
        }
        count(counters::EVENTS_DROPPED);
        if start_seen {
            count_lost(counters::LOST_UNREPORTED, netns);
        }
    }
}

/// Writes the close event and removes the entry if this CPU removes it first; false
/// when the ring buffer is full (nothing changed).
#[inline(always)]
fn report<T: Table>(conntrack: u64, state: *mut ConnState, reason: u32, now: u64) -> bool {
    let Some(mut entry) = EVENTS.reserve::<ConnEvent>(0) else {
        return false;
    };
    // Copied before the removal: a removed element may be reused at once.
    fill(&mut entry, EVENT_CLOSE, reason, conntrack, state, now);
    // SAFETY: as above.
    let key = DialedKey::of(unsafe { &(*state).original });
    let dialed = load!(state.dialed) != 0;
    if T::remove(conntrack) {
        if dialed {
            forget_dialed(conntrack, &key);
        }
        entry.submit(event_flags());
    } else {
        entry.discard(0);
    }
    true
}

/// What distinguishes one connection from an earlier one on the same `nf_conn` in the
/// `LOST` map: its tuple's ports and client address, or, for a TCP SYN, the client's
/// initial sequence number (the same in a retransmitted SYN).
#[inline(always)]
pub fn lost_identity(state: &ConnState, packet: &Packet) -> u64 {
    let ports = ((state.original.src.port as u64) << 48) | ((state.original.dst.port as u64) << 32);
    let low = if packet.protocol == PROTO_TCP && packet.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
        packet.seq
    } else {
        let a = state.original.src.addr;
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]])
    };
    ports | low as u64
}

/// The `CLOSE_*` reason of a connection that ended while the ring buffer was full and
/// awaits user space (`CLOSE_NONE` for a live connection).
#[inline(always)]
pub fn pending_close(state: *const ConnState) -> u32 {
    load!(state.closed) as u32
}
