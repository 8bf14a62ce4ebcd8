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

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::raw_tracepoint, programs::RawTracePointContext};
use observer_common::{
    conn::{CLOSE_NONE, ConnState, EVENT_OPEN, FlowTuple, ORIGINAL, PROTO_TCP, REPLY, flags},
    counters,
    offsets::{KernelOffsets, ctinfo, status, tcp_state},
};

use crate::{
    conn::{BPF_NOEXIST, account, close, emit, remember_dialed},
    kernel::{ReadFailed, read, read_netns, read_tuple},
    maps::{CONNS, SCRATCH, count, offsets},
    packet::parse,
};

/// `-EEXIST`.
const EEXIST: i32 = -17;

#[raw_tracepoint(tracepoint = "net_dev_queue")]
pub fn net_dev_queue(ctx: RawTracePointContext) -> i32 {
    let _ = handle(ctx.arg::<u64>(0));
    0
}

#[inline(always)]
fn handle(skb: u64) -> Result<(), ReadFailed> {
    let off = offsets();
    if off.valid == 0 {
        return Ok(());
    }
    let nfct: u64 = read(skb, off.skb_nfct)?;
    let info = nfct & ctinfo::MASK;
    let conntrack = nfct & !ctinfo::MASK;
    if conntrack == 0 || info == ctinfo::UNTRACKED {
        return Ok(());
    }
    let ct_status: u64 = read(conntrack, off.ct_status)?;
    if ct_status & (1 << status::DST_NAT_BIT) == 0 {
        return Ok(());
    }
    // RELATED (ICMP errors about the connection) carry no payload of it.
    if info == ctinfo::RELATED || info == ctinfo::RELATED + ctinfo::IS_REPLY {
        return Ok(());
    }
    count(counters::PACKETS);
    let Some(packet) = parse(skb, &off)? else {
        return Ok(());
    };
    let dir = if info >= ctinfo::IS_REPLY {
        REPLY
    } else {
        ORIGINAL
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };

    if let Some(state) = CONNS.get_ptr_mut(&conntrack) {
        if info == ctinfo::NEW && reused(conntrack, state, &off)? {
            // The kernel freed the entry we tracked (it idled out unseen) and reused
            // its memory for this new connection: report the old one as ended.
            close(conntrack, state, CLOSE_NONE, now);
        } else {
            // SAFETY: a live map value; concurrent updates from another CPU can only
            // make a counter off by one packet, never unsafe.
            let state_ref = unsafe { &mut *state };
            if dir == REPLY {
                state_ref.flags |= flags::REPLY_FORWARDED;
            }
            let reason = account(state_ref, dir, &packet, now);
            if reason != CLOSE_NONE {
                close(conntrack, state, reason, now);
            }
            return Ok(());
        }
    }

    let start_seen = info == ctinfo::NEW;
    if !start_seen && packet.protocol == PROTO_TCP {
        // Attached mid-connection: adopt established connections only, not the last
        // ACKs of one that just closed.
        let state: u8 = read(conntrack, off.ct_tcp_state)?;
        if state != tcp_state::ESTABLISHED {
            return Ok(());
        }
    }
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return Ok(());
    };
    // SAFETY: this CPU's scratch slot, not shared while the program runs.
    let fresh = unsafe { &mut *scratch };
    *fresh = ConnState::default();
    fresh.start_ns = now;
    fresh.flags = if start_seen { flags::START_SEEN } else { 0 };
    fresh.netns = read_netns(conntrack, &off)?;
    read_tuple(
        conntrack + off.ct_tuple_original as u64,
        &off,
        &mut fresh.original,
    )?;
    read_tuple(
        conntrack + off.ct_tuple_reply as u64,
        &off,
        &mut fresh.reply,
    )?;
    if dir == REPLY {
        fresh.flags |= flags::REPLY_FORWARDED;
    }
    account(fresh, dir, &packet, now);
    match CONNS.insert(&conntrack, &*fresh, BPF_NOEXIST) {
        Ok(()) => {
            remember_dialed(conntrack, fresh);
            emit(EVENT_OPEN, CLOSE_NONE, conntrack, fresh, now);
        }
        // Another CPU inserted it first and reported it.
        Err(EEXIST) => {}
        Err(_) => count(counters::TABLE_FULL),
    }
    Ok(())
}

/// Whether a tracked entry belongs to an earlier connection whose `nf_conn` memory
/// the kernel has reused: the original tuple differs.
#[inline(always)]
fn reused(
    conntrack: u64,
    state: *const ConnState,
    off: &KernelOffsets,
) -> Result<bool, ReadFailed> {
    let mut current = FlowTuple::default();
    read_tuple(conntrack + off.ct_tuple_original as u64, off, &mut current)?;
    // SAFETY: a live map value.
    let tracked = unsafe { &(*state).original };
    Ok(current.src != tracked.src || current.dst != tracked.dst)
}
