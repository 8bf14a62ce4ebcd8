//! `skb:kfree_skb`: every packet the kernel drops, in every network namespace. Kernel
//! prototype (include/trace/events/skb.h; `reason` since Linux 5.17, `rx_sk` since 6.11):
//!
//! ```c
//! TRACE_EVENT(kfree_skb,
//!     TP_PROTO(struct sk_buff *skb, void *location,
//!              enum skb_drop_reason reason, struct sock *rx_sk), ...);
//! ```
//!
//! kube-proxy rejects (or drops) new connections to a Service port that has no
//! endpoints in the filter table (iptables: `KUBE-SERVICES` / `KUBE-EXTERNAL-SERVICES`
//! `-j REJECT`; nftables: the `no-endpoint-services` map's `goto reject-chain`). Such a
//! connection is never DNATed, so `net_dev_queue` never sees it: its first packet ends
//! here, freed by netfilter (`nf_hook_slow`, reason `SKB_DROP_REASON_NETFILTER_DROP`),
//! still carrying conntrack's unconfirmed entry. Only such packets go further: a
//! netfilter drop (where the kernel says why), of a new connection (ctinfo NEW: a TCP SYN
//! or a UDP datagram) that was not DNATed. Which of them dialed a Service is user space's
//! to say, from the rules. Drops are rare on a node; the other packets cost one compare.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::btf_tracepoint, programs::BtfTracePointContext};
use observer_common::{
    conn::{FlowTuple, PROTO_TCP},
    counters,
    offsets::{ctinfo, status},
    reject::{EVENT_REJECT, RejectCount, RejectEvent, RejectKey},
};

use crate::{
    kernel::{ReadFailed, read, read_netns, read_original},
    maps::{BPF_NOEXIST, REJECT_EVENTS, REJECTED, atomic_add, count, offset},
    packet::{TCP_ACK, TCP_SYN, parse},
    skb::{BtfSkb, SkbFields},
};

/// `enum skb_drop_reason`'s `SKB_DROP_REASON_NETFILTER_DROP` on this kernel, from its BTF
/// (user space sets it before load); 0 on kernels whose tracepoint has no reason
/// (before 5.17): then every drop is looked at. A read-only global, so the verifier
/// knows it and never checks the read of the third argument where it is 0.
// SAFETY: a unique symbol; user space finds it by this name.
#[unsafe(no_mangle)]
static NETFILTER_DROP_REASON: u32 = 0;

#[btf_tracepoint(function = "kfree_skb")]
pub fn netfilter_drop(ctx: BtfTracePointContext) -> i32 {
    // SAFETY: a plain static of POD data.
    let wanted = unsafe { core::ptr::read_volatile(&raw const NETFILTER_DROP_REASON) };
    if wanted != 0 {
        // The tracepoint's third argument, which exists where user space set the reason
        // (its BTF has it).
        let reason: u32 = ctx.arg(2);
        if reason != wanted {
            return 0;
        }
    }
    // The tracepoint's first argument is the `struct sk_buff *`.
    let _ = handle(BtfSkb::new(ctx.arg::<*const u8>(0)));
    0
}

#[inline(always)]
fn handle<S: SkbFields>(skb: S) -> Result<(), ReadFailed> {
    if offset!(valid) == 0 {
        return Ok(());
    }
    let (nfct, len, data_len) = skb.conntrack_and_lengths()?;
    let conntrack = nfct & !ctinfo::MASK;
    if conntrack == 0 || nfct & ctinfo::MASK != ctinfo::NEW {
        return Ok(());
    }
    let ct_status: u64 = read(conntrack, offset!(ct_status))?;
    if ct_status & (1 << status::DST_NAT_BIT) != 0 {
        return Ok(());
    }
    let Some(packet) = parse(skb, len, data_len)? else {
        return Ok(());
    };
    let tcp = packet.protocol == PROTO_TCP;
    if tcp && packet.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN {
        return Ok(());
    }
    let mut tuple = FlowTuple::default();
    read_original(conntrack, &mut tuple)?;
    let key = RejectKey {
        client: tuple.src,
        dialed: tuple.dst,
        netns: read_netns(conntrack)?,
        family: tuple.family,
        protocol: tuple.protocol,
        _pad: 0,
    };
    let isn = if tcp { packet.seq } else { 0 };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(flow) = REJECTED.get_ptr_mut(&key) {
        // SAFETY: a live map value; `packets` is only changed by atomic adds.
        unsafe {
            atomic_add(&raw mut (*flow).packets, 1);
            core::ptr::write_volatile(&raw mut (*flow).last_ns, now);
            // A SYN with another initial sequence number: the client port's next attempt.
            if tcp && core::ptr::read_volatile(&raw const (*flow).isn) != isn {
                core::ptr::write_volatile(&raw mut (*flow).isn, isn);
                report(&key, isn, now);
            }
        }
        return Ok(());
    }
    let first = RejectCount {
        first_ns: now,
        last_ns: now,
        packets: 1,
        isn,
        _pad: 0,
    };
    // Only the CPU that enters the flow reports it.
    if REJECTED.insert(&key, &first, BPF_NOEXIST).is_ok() {
        report(&key, isn, now);
    } else if let Some(flow) = REJECTED.get_ptr_mut(&key) {
        // SAFETY: as above.
        atomic_add(unsafe { &raw mut (*flow).packets }, 1);
    }
    Ok(())
}

/// Tells user space of a rejected flow or attempt; a full ring buffer is counted.
#[inline(always)]
fn report(key: &RejectKey, isn: u32, now: u64) {
    match REJECT_EVENTS.reserve::<RejectEvent>(0) {
        Some(mut entry) => {
            let event = entry.as_mut_ptr();
            // SAFETY: a reserved ring-buffer slot of the right size and alignment.
            unsafe {
                (*event).kind = EVENT_REJECT;
                (*event).isn = isn;
                (*event).time_ns = now;
                (*event).key = *key;
            }
            entry.submit(0);
        }
        None => count(counters::REJECTS_DROPPED),
    }
}
