//! `net:net_dev_queue`: every packet a device is about to transmit, in every network
//! namespace. Kernel prototype (include/trace/events/net.h):
//!
//! ```c
//! DEFINE_EVENT(net_dev_template, net_dev_queue, TP_PROTO(struct sk_buff *skb), TP_ARGS(skb));
//! ```
//!
//! A packet forwarded by a node has passed PREROUTING (kube-proxy's DNAT) and
//! POSTROUTING (conntrack confirmation) by then, so `skb->_nfct` holds the conntrack
//! entry with its NAT decision. Both directions of a pod-to-Service connection are
//! forwarded by the node, so both pass here. A bridged packet passes twice (bridge,
//! then bridge port): `conn::account` counts each byte once.
//!
//! `handle`, the per-packet work, is also the netfilter program's
//! (`forward_netfilter.rs`), which runs it once per packet where the kernel has it.

use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use observer_common::{
    conn::{
        CLOSE_EXPIRED, CLOSE_NONE, ConnState, DialedKey, EVENT_OPEN, FlowTuple, ORIGINAL,
        PROTO_TCP, REPLY,
    },
    counters,
    offsets::{ctinfo, status, tcp_state},
};

use crate::{
    clock,
    conn::{
        account, both_fins, close, dialed_wanted, emit, end_now, insert_dialed, lost_identity,
        pending_close, refuses, remember_dialed,
    },
    dns::{capture, capture_segment},
    kernel::{EntryReads, ReadFailed},
    maps::{
        DIALED, SCRATCH, count, count_lost, forget_lost, lost_at, offset, opens_from_table,
        remember_lost,
    },
    packet::{
        Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, carries_nothing, parse, port_unreachable,
    },
    skb::{BtfSkb, ProbedSkb, SkbFields},
    state::{is_dns, load, store},
    table::Table,
};

/// `-EEXIST`.
const EEXIST: i32 = -17;

/// The program user space attaches: `sk_buff` fields are plain loads.
#[btf_tracepoint(function = "net_dev_queue")]
pub fn net_dev_queue(ctx: BtfTracePointContext) -> i32 {
    let _ = handle(BtfSkb::new(ctx.arg::<*const u8>(0)));
    0
}

/// The same for kernels that refuse the first (no BTF tracepoints, or a verifier that
/// cannot follow its loads): `sk_buff` fields through helper calls.
#[raw_tracepoint(tracepoint = "net_dev_queue")]
pub fn dev_queue_raw(ctx: RawTracePointContext) -> i32 {
    let _ = handle(ProbedSkb(ctx.arg::<u64>(0)));
    0
}

#[inline(always)]
pub(super) fn handle<S: SkbFields>(skb: S) -> Result<(), ReadFailed> {
    // A packet without a DNAT decision costs the skb's `_nfct` and the entry's `status`,
    // and no map lookup. (A tracked connection whose `nf_conn` the kernel freed and
    // reused for a connection without DNAT is ended by user space, on conntrack's
    // destroy event: a `CONNS` lookup here for every new connection cost more than the
    // whole rest of a packet without DNAT. docs/perf-log.md, 2026-12-02, later.)
    if offset!(valid) == 0 {
        return Ok(());
    }
    let (nfct, len, data_len) = skb.conntrack_and_lengths()?;
    let info = nfct & ctinfo::MASK;
    let conntrack = nfct & !ctinfo::MASK;
    if conntrack == 0 || info == ctinfo::UNTRACKED {
        return Ok(());
    }
    let ct_status = S::Entry::status(conntrack)?;
    if ct_status & (1 << status::DST_NAT_BIT) == 0 {
        return Ok(());
    }
    // RELATED packets (ICMP errors about the connection) carry no payload of it; one
    // from the backend's side may say that nothing listens there.
    if info == ctinfo::RELATED + ctinfo::IS_REPLY {
        return refusal(skb, conntrack);
    }
    if info == ctinfo::RELATED {
        return Ok(());
    }
    let Some(packet) = parse(skb, len, data_len)? else {
        return Ok(());
    };
    // A pure ACK changes nothing but a connection's time (`carries_nothing`): no lookup.
    if info != ctinfo::NEW && carries_nothing(&packet) {
        return Ok(());
    }
    let dir = if info >= ctinfo::IS_REPLY {
        REPLY
    } else {
        ORIGINAL
    };
    if let Some(state) = S::Table::get(conntrack) {
        // An entry still unconfirmed may be a clash's loser, freed since and its memory
        // taken by another connection, whose packets are not NEW any more: checked on
        // every packet until it is seen confirmed.
        let unconfirmed = load!(state.unconfirmed) != 0;
        if (info == ctinfo::NEW || unconfirmed)
            && reused::<S::Entry>(conntrack, ct_status, state, &packet)?
        {
            // The kernel freed the entry we tracked and reused its memory for this new
            // connection: the old one ended without FIN or RST.
            let time = clock::exact();
            end_now::<S::Table>(conntrack, state, CLOSE_EXPIRED, time.0);
            return open(skb, conntrack, (info, ct_status), dir, &packet, time);
        }
        if unconfirmed && ct_status & (1 << status::CONFIRMED_BIT) != 0 {
            store!(state.unconfirmed, 0);
        }
        let now = if needs_exact_time(state, &packet) {
            clock::exact().0
        } else {
            clock::estimated(state)
        };
        follow(skb, conntrack, state, dir, &packet, now);
        return Ok(());
    }
    open(
        skb,
        conntrack,
        (info, ct_status),
        dir,
        &packet,
        clock::exact(),
    )
}

/// An ICMP error about a tracked connection, coming from the backend's side: a port
/// unreachable as its first answer marks the connection refused (a UDP datagram, or a
/// SYN a REJECT rule answered, to a port nothing listens on). Rare: only ICMP errors
/// about DNATed connections get here.
#[inline(always)]
fn refusal<S: SkbFields>(skb: S, conntrack: u64) -> Result<(), ReadFailed> {
    let Some(state) = S::Table::get(conntrack) else {
        return Ok(());
    };
    if refuses(state) && port_unreachable(skb)? {
        store!(state.refused, 1);
        store!(state.last_ns, clock::exact().0);
    }
    Ok(())
}

/// Whether a packet of a tracked connection is stamped with the exact time (see
/// `clock`): a TCP SYN, FIN or RST, a DNS packet (its exchange is timed), or one that
/// retries a close report.
#[inline(always)]
fn needs_exact_time(state: *const ConnState, packet: &Packet) -> bool {
    (packet.protocol == PROTO_TCP && packet.tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0)
        || is_dns(state)
        || pending_close(state) != CLOSE_NONE
}

/// A packet of a tracked connection.
#[inline(always)]
fn follow<S: SkbFields>(
    skb: S,
    conntrack: u64,
    state: *mut ConnState,
    dir: usize,
    packet: &Packet,
    now: u64,
) {
    let pending = pending_close(state);
    if pending != CLOSE_NONE {
        // It ended while the ring buffer was full: try to report it again.
        close::<S::Table>(conntrack, state, pending, now);
        return;
    }
    if dir == REPLY {
        store!(state.reply_forwarded, 1);
    }
    let (reason, fresh) = account(state, dir, packet, now);
    if is_dns(state) {
        // Before `close`, which may free the entry.
        capture_dns(skb, conntrack, state, dir, packet, fresh, now);
    }
    if reason != CLOSE_NONE {
        close::<S::Table>(conntrack, state, reason, now);
    }
}

/// The first packet seen of a connection: enters it in the table and reports it.
#[inline(always)]
fn open<S: SkbFields>(
    skb: S,
    conntrack: u64,
    (info, ct_status): (u64, u64),
    dir: usize,
    packet: &Packet,
    (now, jiffies): (u64, u64),
) -> Result<(), ReadFailed> {
    let start_seen = is_decision(conntrack, info, packet);
    if !start_seen && packet.protocol == PROTO_TCP && !established::<S::Entry>(conntrack)? {
        // Attached mid-connection: adopt established connections only, not the last
        // ACKs of one that just closed.
        return Ok(());
    }
    let confirmed = ct_status & (1 << status::CONFIRMED_BIT) != 0;
    let Some(fresh) =
        new_state::<S::Entry>(conntrack, dir, (start_seen, confirmed), (now, jiffies))?
    else {
        return Ok(());
    };
    let (_, fresh_bytes) = account(fresh, dir, packet, now);
    let local = local_client(skb, dir)?;
    // Only the socket-side programs look connections up by what their client dialed,
    // and they run only where the forwarding program cannot read whole packets.
    let socket_side = !S::READS_FRAGMENTS;
    let wanted = dialed_wanted(
        local && socket_side,
        is_dns(fresh) && socket_side,
        opens_from_table(),
    );
    // SAFETY: this CPU's scratch slot, not shared while the program runs.
    unsafe { (*fresh).dialed = wanted as u8 };
    // SAFETY: as above.
    let fresh_ref = unsafe { &*fresh };
    // An earlier owner of the tuple has a `DIALED` entry only where this one gets one.
    if start_seen && packet.protocol == PROTO_TCP && wanted {
        supersede::<S::Table>(conntrack, fresh_ref, now);
    }
    match S::Table::insert(conntrack, fresh_ref, !start_seen) {
        Ok(()) => {
            if keep_inserted::<S::Entry, S::Table>(conntrack, fresh_ref, start_seen, packet) {
                report_opened(
                    skb,
                    conntrack,
                    fresh,
                    (dir, local),
                    packet,
                    fresh_bytes,
                    now,
                );
            }
        }
        // Another CPU inserted it first and reported it: this packet is another of its
        // connection's (the flow's first datagrams on two CPUs, after a clash merged
        // them), accounted on that entry as any later packet.
        Err(EEXIST) => {
            if let Some(state) = S::Table::get(conntrack) {
                follow(skb, conntrack, state, dir, packet, now);
            }
        }
        // The table is full. Only a decision made while attached (ctinfo NEW) is a lost
        // connection, and only once: its later packets find the table full too.
        Err(_) if start_seen => {
            if !counted_lost(conntrack, fresh_ref, packet) {
                remember_lost(conntrack, lost_identity(fresh_ref, packet));
                count_lost(counters::LOST_TABLE_FULL, fresh_ref.netns);
            }
        }
        Err(_) => {}
    }
    Ok(())
}

/// A new connection's state, before its first packet is accounted, in this CPU's
/// scratch slot (too large for the stack); `None` if the slot is missing.
#[inline(always)]
fn new_state<E: EntryReads>(
    conntrack: u64,
    dir: usize,
    (start_seen, confirmed): (bool, bool),
    (now, jiffies): (u64, u64),
) -> Result<Option<*mut ConnState>, ReadFailed> {
    let Some(fresh) = SCRATCH.get_ptr_mut(0) else {
        return Ok(None);
    };
    // SAFETY: this CPU's scratch slot, not shared while the program runs.
    let init = unsafe { &mut *fresh };
    *init = ConnState::default();
    init.start_ns = now;
    init.start_jiffies = jiffies;
    init.start_seen = start_seen as u8;
    init.unconfirmed = !confirmed as u8;
    init.netns = E::netns(conntrack)?;
    E::tuples(conntrack, &mut init.original, &mut init.reply)?;
    init.reply_forwarded = (dir == REPLY) as u8;
    Ok(Some(fresh))
}

/// Whether the entry just inserted for `fresh` stays; removes it when it is not a
/// connection to record.
#[inline(always)]
fn keep_inserted<E: EntryReads, T: Table>(
    conntrack: u64,
    fresh: &ConnState,
    start_seen: bool,
    packet: &Packet,
) -> bool {
    if !start_seen
        && packet.protocol == PROTO_TCP
        && matches!(established::<E>(conntrack), Ok(false))
    {
        // A late packet of a connection another CPU just closed and removed: its
        // state left ESTABLISHED before that removal, so checking after the insert
        // cannot miss it. Not a connection to adopt.
        T::remove(conntrack);
        return false;
    }
    if start_seen && counted_lost(conntrack, fresh, packet) {
        // An earlier pass of this packet (bridge, then bridge port) or of its SYN
        // found the table full and counted the connection lost: it stays lost, not
        // also recorded (its later packets may adopt it, `start_seen: false`).
        T::remove(conntrack);
        return false;
    }
    if !start_seen {
        // Adopted: any SYN on this address from now on is a new entry's (see the
        // removal above).
        forget_lost(conntrack);
    }
    true
}

/// Reports a connection just entered in the table: counts it, remembers where its
/// client dialed (`local`: a client on the node itself) for the socket-side programs
/// where they run, emits its open event where user space wants one, and copies its
/// first DNS message.
#[inline(always)]
fn report_opened<S: SkbFields>(
    skb: S,
    conntrack: u64,
    fresh: *mut ConnState,
    (dir, local): (usize, bool),
    packet: &Packet,
    fresh_bytes: u32,
    now: u64,
) {
    // SAFETY: this CPU's scratch slot, not shared while the program runs.
    let fresh_ref = unsafe { &*fresh };
    count(counters::TRACKED);
    if !S::READS_FRAGMENTS {
        remember_dialed(conntrack, fresh_ref, local);
    } else if fresh_ref.dialed != 0 {
        insert_dialed(conntrack, fresh_ref);
    }
    // An adopted connection (established when observer attached) always has one: user
    // space matches it to the entry conntrack listed at start.
    if fresh_ref.start_seen == 0 || !opens_from_table() {
        emit(EVENT_OPEN, CLOSE_NONE, conntrack, fresh, now);
    }
    if is_dns(fresh) {
        capture_dns(skb, conntrack, fresh, dir, packet, fresh_bytes, now);
    }
}

/// Copies the packet's DNS message (the connection's client dialed port 53): a UDP
/// datagram where its bytes were first counted (`fresh`), a TCP segment with payload
/// where the program reads page fragments (elsewhere the socket-side programs copy
/// TCP).
#[inline(always)]
fn capture_dns<S: SkbFields>(
    skb: S,
    conntrack: u64,
    state: *const ConnState,
    dir: usize,
    packet: &Packet,
    fresh: u32,
    now: u64,
) {
    if packet.protocol != PROTO_TCP {
        capture(conntrack, state, dir, packet, fresh, now);
    } else if S::READS_FRAGMENTS {
        let from = packet.payload_at;
        capture_segment(
            move |dst, len| skb.copy_payload(from, dst, len),
            (packet.payload, packet.seq),
            conntrack,
            state,
            dir,
            now,
        );
    }
}

/// Whether the connection's client is a socket of the node itself (host network): a
/// packet in the original direction that a local socket sent. A packet forwarded from
/// a pod has no socket by now (crossing network namespaces orphans it), and a reply
/// that passes here is forwarded, so its client is elsewhere. Only a local client's
/// replies reach `local_delivery` without having passed here.
#[inline(always)]
fn local_client<S: SkbFields>(skb: S, dir: usize) -> Result<bool, ReadFailed> {
    Ok(dir == ORIGINAL && skb.socket()? != 0)
}

/// Whether a packet of an untracked connection is its DNAT decision: marked NEW, and
/// not a FIN or RST (conntrack never creates an entry for those: one marked NEW belongs
/// to an entry not answered yet). A FIN or RST also ends a connection the table had no
/// room for: a SYN on its tuple from now on makes a new entry (conntrack reopens closed
/// ones), even at the same address with the same initial sequence number, so it is a
/// new decision and no longer the lost one `LOST` remembers.
#[inline(always)]
fn is_decision(conntrack: u64, info: u64, packet: &Packet) -> bool {
    let closing = packet.protocol == PROTO_TCP && packet.tcp_flags & (TCP_FIN | TCP_RST) != 0;
    if closing {
        forget_lost(conntrack);
    }
    info == ctinfo::NEW && !closing
}

/// Whether the connection `fresh` (at `conntrack`) was already counted lost for a full
/// table, on an earlier pass of `packet` or an earlier copy of its SYN.
#[inline(always)]
fn counted_lost(conntrack: u64, fresh: &ConnState, packet: &Packet) -> bool {
    let identity = lost_identity(fresh, packet);
    lost_at(conntrack) == Some(identity)
}

/// Whether conntrack's TCP state of the entry is ESTABLISHED now.
#[inline(always)]
fn established<E: EntryReads>(conntrack: u64) -> Result<bool, ReadFailed> {
    let state = E::tcp_state(conntrack)?;
    Ok(state == tcp_state::ESTABLISHED)
}

/// A new TCP connection whose original tuple a tracked connection in the same
/// namespace still holds: conntrack keeps one entry per tuple, so that entry is gone
/// (flushed, deleted, or timed out) and its connection ended.
#[inline(always)]
fn supersede<T: Table>(conntrack: u64, fresh: &ConnState, now: u64) {
    let Some(owner) = DIALED.get_ptr(&DialedKey::of(&fresh.original)) else {
        return;
    };
    // SAFETY: a live map value.
    let owner = unsafe { *owner };
    if owner == conntrack {
        return;
    }
    let Some(old) = T::get(owner) else {
        return;
    };
    if load!(old.netns) == fresh.netns {
        end_now::<T>(owner, old, CLOSE_EXPIRED, now);
    }
}

/// Whether the tracked connection saw its end: an RST, FINs both ways, or a close
/// still waiting for room in the ring buffer.
#[inline(always)]
fn closed(state: *const ConnState) -> bool {
    load!(state.rst) != 0 || pending_close(state) != CLOSE_NONE || both_fins(load!(state.fins))
}

/// Whether a tracked entry belongs to an earlier connection whose `nf_conn` memory the
/// kernel has reused, seen on a packet conntrack marked NEW: the original tuple
/// differs; or, with the same tuple (a client port reused), a SYN carries another
/// initial sequence number than the one recorded; or the connection we track was
/// answered (saw a reply, or was adopted ESTABLISHED) while the entry (`ct_status`, read
/// now) has seen no reply. conntrack marks packets
/// NEW until an entry sees its first reply, and a NEW packet can reach this hook after
/// a reply another CPU handled: then the entry has seen that reply and is ours.
#[inline(always)]
fn reused<E: EntryReads>(
    conntrack: u64,
    ct_status: u64,
    state: *const ConnState,
    packet: &Packet,
) -> Result<bool, ReadFailed> {
    let mut current = FlowTuple::default();
    E::original(conntrack, &mut current)?;
    // SAFETY: a live map value; the tuples are written once, before insertion.
    let tracked = unsafe { &(*state).original };
    if current.src != tracked.src || current.dst != tracked.dst {
        return Ok(true);
    }
    let syn = packet.protocol == PROTO_TCP && packet.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    if syn && closed(state) {
        // A NEW packet on an entry that closed (an unanswered one can only have closed by
        // RST): conntrack killed that entry for this SYN and made a new one, often at the
        // same address, and a retransmitted SYN carries the sequence number recorded.
        return Ok(true);
    }
    if syn && load!(state.syn_seen) != 0 {
        return Ok(packet.seq != load!(state.isn));
    }
    // A TCP connection adopted mid-stream (`start_seen` 0) was ESTABLISHED, so its entry
    // had seen a reply, though we may not have: an entry without one is another.
    let answered =
        load!(state.replied) != 0 || (packet.protocol == PROTO_TCP && load!(state.start_seen) == 0);
    Ok(answered && ct_status & (1 << status::SEEN_REPLY_BIT) == 0)
}
