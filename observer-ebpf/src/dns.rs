//! DNS capture: the first bytes of each message of a connection whose client dialed
//! port 53, for user space to decode (query name and type, rcode). Costs one compare
//! per DNATed packet of any other connection.

use aya_ebpf::helpers::generated::bpf_probe_read_kernel;
use observer_common::{
    conn::ConnState,
    counters,
    dns::{DNS_PORT, DNS_PREFIX, DnsEvent, EVENT_DNS},
};

use crate::{
    conn::load,
    maps::{EVENTS, count, count_dns_dropped},
    packet::Packet,
};

/// Whether the connection's client dialed the DNS port.
#[inline(always)]
pub fn is_dns(state: *const ConnState) -> bool {
    // SAFETY: `state` points at a live map value or this CPU's scratch slot; the port is
    // written once, before the entry is inserted.
    unsafe { core::ptr::read_volatile(&raw const (*state).original.dst.port) == DNS_PORT }
}

/// Copies a DNS message's first bytes into the ring buffer. `fresh` is what accounting
/// counted of this packet: 0 for the second pass of a bridged packet (and for a TCP
/// retransmission), which is not copied again.
#[inline(always)]
pub fn capture(
    conntrack: u64,
    state: *const ConnState,
    dir: usize,
    packet: &Packet,
    fresh: u32,
    now: u64,
) {
    if fresh == 0 || packet.payload == 0 {
        return;
    }
    let netns = load!(state.netns);
    if packet.linear == 0 {
        // In page fragments only (TCP, usually): nothing to read cheaply here.
        count_dns_dropped(netns);
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<DnsEvent>(0) else {
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
        (*event).kind = EVENT_DNS;
        (*event).len = len;
        (*event).dir = dir as u8;
        (*event).protocol = packet.protocol;
        (*event).conntrack = conntrack;
        (*event).time_ns = now;
        (*event).netns = netns;
        (*event)._pad = [0; 4];
        (*event)._tail = [0; 4];
        core::ptr::copy_nonoverlapping(&raw const (*state).original, &raw mut (*event).original, 1);
        bpf_probe_read_kernel(
            (&raw mut (*event).payload).cast(),
            DNS_PREFIX as u32,
            packet.payload_at as *const _,
        )
    };
    if copied < 0 {
        entry.discard(0);
        count_dns_dropped(netns);
        return;
    }
    entry.submit(0);
    count(counters::DNS_EMITTED);
}
