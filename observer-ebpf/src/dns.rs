//! DNS capture: the first bytes of each message of a connection whose client dialed
//! port 53, for user space to decode (query name and type, rcode).
//!
//! UDP messages are copied where the node forwards them (`capture`, from the
//! forwarding program), which costs one compare per DNATed packet of any other
//! connection. TCP payload usually lies in page fragments: the netfilter program reads
//! them through a dynamic pointer and copies TCP segments where it forwards them too
//! (`capture_segment`); `net_dev_queue` cannot read them safely, so there TCP segments are
//! copied at the client's socket instead (`capture_segment` from the cgroup_skb programs,
//! whose `bpf_skb_load_bytes` reads fragments): the query as the client sends it
//! (`dns_egress`), the response as it is delivered (`local_delivery`).

use aya_ebpf::{
    helpers::generated::{bpf_probe_read_kernel, bpf_skb_load_bytes},
    maps::ring_buf::RingBufEntry,
    programs::SkBuffContext,
};
use observer_common::{
    conn::{ConnState, PROTO_TCP},
    counters,
    dns::{DNS_PREFIX, DnsEvent, EVENT_DNS},
};

use crate::{
    maps::{DNS_EVENTS, DNS_EVENTS_WAKEUP_BYTES, count, count_dns_dropped, submit_flags},
    packet::Packet,
    state::load,
};

/// Copies a UDP DNS message's first bytes into `DNS_EVENTS`. `fresh` is what
/// accounting counted of this packet: 0 for the second pass of a bridged packet, which
/// is not copied again. TCP is left to `capture_segment`.
#[inline(always)]
pub fn capture(
    conntrack: u64,
    state: *const ConnState,
    dir: usize,
    packet: &Packet,
    fresh: u32,
    now: u64,
) {
    if fresh == 0 || packet.payload == 0 || packet.protocol == PROTO_TCP {
        return;
    }
    let netns = load!(state.netns);
    if packet.linear == 0 {
        // In page fragments only: nothing to read cheaply here.
        count_dns_dropped(netns);
        return;
    }
    let Some(mut entry) = DNS_EVENTS.reserve::<DnsEvent>(0) else {
        count_dns_dropped(netns);
        return;
    };
    let event = entry.as_mut_ptr();
    let len = if packet.linear as usize > DNS_PREFIX {
        DNS_PREFIX as u16
    } else {
        packet.linear as u16
    };
    // SAFETY: `event` is a reserved ring-buffer slot of `DnsEvent`'s size and alignment;
    // `state` is a live map value or scratch slot. bpf_probe_read_kernel copies with fault
    // handling. It always reads `DNS_PREFIX` bytes (a constant size the verifier accepts):
    // past a short message that is the rest of the skb's buffer, which `len` excludes.
    let copied = unsafe {
        fill(event, conntrack, state, dir, packet.protocol, now);
        (*event).len = len;
        bpf_probe_read_kernel(
            (&raw mut (*event).payload).cast(),
            DNS_PREFIX as u32,
            packet.payload_at as *const _,
        )
    };
    submit_copied(entry, copied, netns);
}

/// Copies the first bytes of a TCP segment with `segment` payload bytes, sequence
/// number `seq`, into `DNS_EVENTS`, through `copy(dst, len)`, which copies the
/// segment's first `len` (1..=`DNS_PREFIX`) bytes to `dst` or returns `< 0`. User space
/// finds the messages in it (`observer::dns::stream`).
#[inline(always)]
pub fn capture_segment(
    copy: impl FnOnce(*mut u8, u32) -> i64,
    (segment, seq): (u32, u32),
    conntrack: u64,
    state: *const ConnState,
    dir: usize,
    now: u64,
) {
    if segment == 0 {
        return;
    }
    let netns = load!(state.netns);
    let len = copy_len(segment);
    let Some(mut entry) = DNS_EVENTS.reserve::<DnsEvent>(0) else {
        count_dns_dropped(netns);
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` is a reserved ring-buffer slot of `DnsEvent`'s size and alignment;
    // `state` is a live map value. `copy` writes at most `len` (1..=DNS_PREFIX,
    // `copy_len`) bytes into `payload` (DNS_PREFIX bytes).
    let copied = unsafe {
        fill(event, conntrack, state, dir, PROTO_TCP, now);
        (*event).len = len as u16;
        (*event).seq = seq;
        (*event).segment = segment;
        copy((&raw mut (*event).payload).cast(), len)
    };
    submit_copied(entry, copied, netns);
}

/// `capture_segment`'s copy at a socket-side hook: `bpf_skb_load_bytes` of the bytes at
/// offset `at` of the packet (from its IP header), from its linear part or its page
/// fragments.
#[inline(always)]
pub fn load_bytes(ctx: &SkBuffContext, at: u32) -> impl FnOnce(*mut u8, u32) -> i64 {
    let skb = ctx.skb.skb;
    move |dst, len| {
        // SAFETY: `skb` is the program's context; the helper writes at most `len` bytes
        // to `dst` (the caller's buffer of at least that size) or fails.
        unsafe { bpf_skb_load_bytes(skb as *const _, at, dst.cast(), len) }
    }
}

/// Submits a filled DNS event whose payload copy returned `copied`; a failed copy is
/// discarded and counted as a message not copied.
#[inline(always)]
fn submit_copied(entry: RingBufEntry<DnsEvent>, copied: i64, netns: u32) {
    if copied < 0 {
        entry.discard(0);
        count_dns_dropped(netns);
        return;
    }
    entry.submit(submit_flags(&DNS_EVENTS, DNS_EVENTS_WAKEUP_BYTES));
    count(counters::DNS_EMITTED);
}

// `copy_len` masks with `DNS_PREFIX - 1`.
const _: () = assert!(DNS_PREFIX.is_power_of_two());

/// How many of a segment's `segment` (at least 1) bytes to copy, 1..=`DNS_PREFIX`, in a
/// form the verifier bounds: the helper takes no zero length, and once the compiler knows
/// `segment >= 1` it drops a plain `len == 0` test or checks it on another register. A
/// volatile round trip hides the bounds from the compiler, so the mask stays in the code.
#[inline(always)]
fn copy_len(segment: u32) -> u32 {
    let mut len = if segment > DNS_PREFIX as u32 {
        DNS_PREFIX as u32
    } else {
        segment
    };
    // SAFETY: `len` is a local; a volatile read of it is a plain load.
    let opaque = unsafe { core::ptr::read_volatile(&raw mut len) };
    (opaque.wrapping_sub(1) & (DNS_PREFIX as u32 - 1)) + 1
}

/// Writes every field of a reserved `DnsEvent` but the payload and its length.
///
/// # Safety
/// `event` is a reserved ring-buffer slot of `DnsEvent`'s size and alignment; `state`
/// is a live map value or scratch slot.
#[inline(always)]
unsafe fn fill(
    event: *mut DnsEvent,
    conntrack: u64,
    state: *const ConnState,
    dir: usize,
    protocol: u8,
    now: u64,
) {
    let netns = load!(state.netns);
    // SAFETY: as the caller promises.
    unsafe {
        (*event).kind = EVENT_DNS;
        (*event).dir = dir as u8;
        (*event).protocol = protocol;
        (*event).conntrack = conntrack;
        (*event).time_ns = now;
        (*event).netns = netns;
        (*event).seq = 0;
        (*event).segment = 0;
        core::ptr::copy_nonoverlapping(&raw const (*state).original, &raw mut (*event).original, 1);
    }
}
