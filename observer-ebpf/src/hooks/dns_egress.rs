//! `cgroup_skb/egress` on the cgroup v2 root: every packet a local socket sends, in every
//! network namespace, for the TCP DNS queries clients send (`dns::capture_segment`).
//! Kernel entry (net/ipv4/ip_output.c `ip_finish_output`, net/ipv6/ip6_output.c
//! `ip6_finish_output`):
//!
//! ```c
//! int BPF_CGROUP_RUN_PROG_INET_EGRESS(struct sock *sk, struct sk_buff *skb);
//! ```
//!
//! It runs after the sending namespace's POSTROUTING: a pod's query still reads
//! `client -> ClusterIP:53` (the node DNATs it later, in its own namespace), which finds
//! the connection in `DIALED` as `local_delivery` finds replies. (A client on the node
//! itself has been DNATed by then and is not found: only its responses are copied.) The
//! program never drops anything: it returns 1.
//!
//! Every other packet costs a read of its headers in place (direct packet access): not
//! TCP to port 53, or no payload, and the program returns before any map lookup or
//! helper call.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::cgroup_skb, programs::SkBuffContext};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use observer_common::{
    conn::{DialedKey, ORIGINAL, PROTO_TCP},
    dns::DNS_PORT,
};

use crate::{
    dns::{capture_segment, load_bytes},
    maps::DIALED,
    table::{Single, Table},
};

/// The TCP header's bytes `dns_egress` reads: the ports, the sequence number and the
/// data offset.
const TCP_READ: usize = 13;

#[cgroup_skb]
pub fn dns_egress(ctx: SkBuffContext) -> i32 {
    handle(&ctx);
    1
}

/// A TCP segment to port 53 with payload, read from the packet's linear part.
struct Segment {
    key: DialedKey,
    seq: u32,
    /// Offset of the payload from the IP header.
    at: u32,
    payload: u32,
}

/// The segment, when the packet is TCP to port 53 with payload; headers a local socket
/// built lie in the linear part, so a packet whose headers do not is no query. Any other
/// packet costs a few one-byte loads: the version, the protocol and the port.
#[inline(always)]
fn segment(ctx: &SkBuffContext) -> Option<Segment> {
    // SAFETY: `skb` is the program's context; `data` and `data_end` are readable fields.
    let (data, end) = unsafe {
        (
            (*ctx.skb.skb).data as usize,
            (*ctx.skb.skb).data_end as usize,
        )
    };
    if data + Ipv4Hdr::LEN + TCP_READ > end {
        return None;
    }
    // SAFETY: `data..data + Ipv4Hdr::LEN + TCP_READ` is inside the packet (checked above).
    let first = unsafe { *(data as *const u8) };
    let (ip_len, protocol_at) = match first {
        // IPv4 without options: the protocol at byte 9.
        0x45 => (Ipv4Hdr::LEN, 9),
        // IPv6: the next header at byte 6 (extension headers: not TCP here).
        0x60..=0x6f if data + Ipv6Hdr::LEN + TCP_READ <= end => (Ipv6Hdr::LEN, 6),
        _ => return None,
    };
    let tcp = data + ip_len;
    // SAFETY: `data..tcp + TCP_READ` is inside the packet (checked above, per version).
    let (protocol, port) = unsafe {
        (
            *((data + protocol_at) as *const u8),
            [*((tcp + 2) as *const u8), *((tcp + 3) as *const u8)],
        )
    };
    if protocol != PROTO_TCP || u16::from_be_bytes(port) != DNS_PORT {
        return None;
    }
    // SAFETY: as above.
    let header: [u8; TCP_READ] = unsafe { core::ptr::read_unaligned(tcp as *const _) };
    let at = ip_len as u32 + ((header[12] >> 4) as u32) * 4;
    let payload = ctx.len().saturating_sub(at);
    if payload == 0 {
        return None;
    }
    let mut key = DialedKey {
        client_port: u16::from_be_bytes([header[0], header[1]]),
        dialed_port: DNS_PORT,
        protocol: PROTO_TCP,
        ..DialedKey::default()
    };
    if ip_len == Ipv4Hdr::LEN {
        // SAFETY: as above; `Ipv4Hdr` is plain bytes.
        let ip: Ipv4Hdr = unsafe { core::ptr::read_unaligned(data as *const Ipv4Hdr) };
        key.client[..4].copy_from_slice(&ip.src_addr);
        key.dialed[..4].copy_from_slice(&ip.dst_addr);
    } else {
        // SAFETY: as above; `Ipv6Hdr` is plain bytes.
        let ip: Ipv6Hdr = unsafe { core::ptr::read_unaligned(data as *const Ipv6Hdr) };
        key.client = ip.src_addr;
        key.dialed = ip.dst_addr;
    }
    Some(Segment {
        key,
        seq: u32::from_be_bytes([header[4], header[5], header[6], header[7]]),
        at,
        payload,
    })
}

#[inline(always)]
fn handle(ctx: &SkBuffContext) {
    let Some(segment) = segment(ctx) else {
        return;
    };
    let Some(owner) = DIALED.get_ptr(&segment.key) else {
        return;
    };
    // SAFETY: a live map value.
    let conntrack = unsafe { *owner };
    let Some(state) = Single::get(conntrack) else {
        return;
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    capture_segment(
        load_bytes(ctx, segment.at),
        (segment.payload, segment.seq),
        conntrack,
        state,
        ORIGINAL,
        now,
    );
}
