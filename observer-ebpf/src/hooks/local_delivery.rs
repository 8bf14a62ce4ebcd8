//! `cgroup_skb/ingress` on the cgroup v2 root: every packet delivered to a local socket,
//! in every network namespace. Kernel entry (net/core/filter.c, `sk_filter_trim_cap`):
//!
//! ```c
//! int BPF_CGROUP_RUN_PROG_INET_INGRESS(struct sock *sk, struct sk_buff *skb);
//! ```
//!
//! A client on the node itself (host network) gets its replies delivered locally: they
//! never pass `net_dev_queue`. Delivered after conntrack has undone the DNAT, a reply
//! reads `dialed address -> client`, which finds the connection in `DIALED`. Replies
//! the node forwarded (`ConnState::reply_forwarded`) were accounted already and are not
//! accounted again. Every client's TCP DNS responses are copied here (`dns`), forwarded
//! or not. The program never drops anything: it returns 1.
//!
//! Most delivered packets are no such reply. `classify` tells them apart by reading
//! the headers in place (direct packet access, no helper call) and one byte of
//! `DIALED_SEEN`, before any map lookup; the same read gives the `DIALED` key, so only
//! headers outside the linear part (or after IPv4 options) cost `bpf_skb_load_bytes`.
//! (`skb->_nfct`, which the forwarding hook reads, is gone by now: TCP and UDP reset it
//! before socket filters run.)

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::cgroup_skb, programs::SkBuffContext};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use observer_common::conn::{CLOSE_NONE, DialedKey, PROTO_TCP, PROTO_UDP, REPLY};

use crate::{
    conn::{account, close, load, pending_close},
    dns::{capture_segment, is_dns},
    maps::{CONNS, DIALED, dialed_slot, maybe_dialed},
    packet::Packet,
};

#[cgroup_skb]
pub fn local_delivery(ctx: SkBuffContext) -> i32 {
    let _ = handle(&ctx);
    1
}

/// What the headers say about a delivered packet, read in place.
enum Delivered {
    /// Certainly no reply to a tracked connection: its source was never a tracked
    /// connection's dialed address (or it is no TCP or UDP).
    NotReply,
    /// Maybe a reply: its `DIALED` key, and the IP header's length.
    Candidate(DialedKey, usize),
    /// The headers are not all in the linear part, or carry IPv4 options: the careful
    /// path (`bpf_skb_load_bytes`) decides.
    Unsure,
}

/// Reads the IP header and the ports in place (direct packet access, no helper call)
/// and checks one byte of `DIALED_SEEN`.
#[inline(always)]
fn classify(ctx: &SkBuffContext) -> Delivered {
    // SAFETY: `skb` is the program's context; `data` and `data_end` are readable fields.
    let (data, end) = unsafe {
        (
            (*ctx.skb.skb).data as usize,
            (*ctx.skb.skb).data_end as usize,
        )
    };
    // An IPv4 header without options and the ports, or an IPv6 header and the ports.
    const V4: usize = Ipv4Hdr::LEN + 4;
    const V6: usize = Ipv6Hdr::LEN + 4;
    if data + V4 > end {
        return Delivered::Unsure;
    }
    // SAFETY: `data..data + V4` is inside the packet (checked above).
    let first = unsafe { *(data as *const u8) };
    // The reply's source is what the client dialed, its destination the client. Only
    // the source is copied before the filter says the packet may be a reply.
    let mut dialed = [0u8; 16];
    let (protocol, ip_header) = match first >> 4 {
        4 if first & 0x0f == 5 => {
            // SAFETY: as above; `Ipv4Hdr` is plain bytes.
            let ip: Ipv4Hdr = unsafe { core::ptr::read_unaligned(data as *const Ipv4Hdr) };
            dialed[..4].copy_from_slice(&ip.src_addr);
            (ip.proto, Ipv4Hdr::LEN)
        }
        4 => return Delivered::Unsure,
        6 => {
            if data + V6 > end {
                return Delivered::Unsure;
            }
            // SAFETY: `data..data + V6` is inside the packet (checked above).
            let ip: Ipv6Hdr = unsafe { core::ptr::read_unaligned(data as *const Ipv6Hdr) };
            dialed = ip.src_addr;
            (ip.next_hdr, Ipv6Hdr::LEN)
        }
        _ => return Delivered::NotReply,
    };
    if protocol != PROTO_TCP && protocol != PROTO_UDP {
        return Delivered::NotReply;
    }
    // SAFETY: the four bytes after the IP header are inside the packet (checked above).
    let ports: [u8; 4] = unsafe { core::ptr::read_unaligned((data + ip_header) as *const [u8; 4]) };
    let dialed_port = u16::from_be_bytes([ports[0], ports[1]]);
    if !maybe_dialed(dialed_slot(&dialed, dialed_port, protocol)) {
        return Delivered::NotReply;
    }
    let mut key = DialedKey {
        dialed,
        dialed_port,
        client_port: u16::from_be_bytes([ports[2], ports[3]]),
        protocol,
        ..DialedKey::default()
    };
    // The destination address: 4 bytes at 16 (IPv4) or 16 at 24 (IPv6), inside the
    // checked range.
    if ip_header == Ipv4Hdr::LEN {
        // SAFETY: bytes 16..20 are inside `data..data + V4`.
        let client: [u8; 4] = unsafe { core::ptr::read_unaligned((data + 16) as *const [u8; 4]) };
        key.client[..4].copy_from_slice(&client);
    } else {
        // SAFETY: bytes 24..40 are inside `data..data + V6`.
        key.client = unsafe { core::ptr::read_unaligned((data + 24) as *const [u8; 16]) };
    }
    Delivered::Candidate(key, ip_header)
}

/// The careful path of `classify`: the key through `bpf_skb_load_bytes`, which also
/// reads headers beyond the linear part and after IPv4 options.
#[inline(always)]
fn load_key(ctx: &SkBuffContext) -> Result<Option<(DialedKey, usize)>, i64> {
    let first: u8 = ctx.load(0)?;
    let mut key = DialedKey::default();
    let (ip_header, protocol) = match first >> 4 {
        4 => {
            key.dialed[..4].copy_from_slice(&ctx.load::<[u8; 4]>(12)?);
            key.client[..4].copy_from_slice(&ctx.load::<[u8; 4]>(16)?);
            (((first & 0x0f) as usize) * 4, ctx.load::<u8>(9)?)
        }
        6 => {
            key.dialed = ctx.load(8)?;
            key.client = ctx.load(24)?;
            (40, ctx.load::<u8>(6)?)
        }
        _ => return Ok(None),
    };
    if protocol != PROTO_TCP && protocol != PROTO_UDP {
        return Ok(None);
    }
    let ports: [u8; 4] = ctx.load(ip_header)?;
    key.dialed_port = u16::from_be_bytes([ports[0], ports[1]]);
    key.client_port = u16::from_be_bytes([ports[2], ports[3]]);
    key.protocol = protocol;
    Ok(Some((key, ip_header)))
}

#[inline(always)]
fn handle(ctx: &SkBuffContext) -> Result<(), i64> {
    let (key, ip_header) = match classify(ctx) {
        Delivered::NotReply => return Ok(()),
        Delivered::Candidate(key, ip_header) => (key, ip_header),
        Delivered::Unsure => match load_key(ctx)? {
            Some(found) => found,
            None => return Ok(()),
        },
    };
    let protocol = key.protocol;
    let Some(owner) = DIALED.get_ptr(&key) else {
        return Ok(());
    };
    // SAFETY: a live map value.
    let conntrack = unsafe { *owner };
    let Some(state) = CONNS.get_ptr_mut(&conntrack) else {
        return Ok(());
    };
    // A TCP DNS response is copied here even when the node forwarded it: its payload,
    // in page fragments, was unreadable there (`dns::capture_segment`).
    let dns = protocol == PROTO_TCP && is_dns(state);
    let unaccounted = load!(state.reply_forwarded) == 0 && pending_close(state) == CLOSE_NONE;
    if !dns && !unaccounted {
        return Ok(());
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (packet, at) = read_packet(ctx, protocol, ip_header)?;
    if dns && packet.payload > 0 {
        capture_segment(
            ctx,
            at,
            packet.payload,
            packet.seq,
            conntrack,
            state,
            REPLY,
            now,
        );
    }
    if !unaccounted {
        return Ok(());
    }
    let (reason, _) = account(state, REPLY, &packet, now);
    if reason != CLOSE_NONE {
        close(conntrack, state, reason, now);
    }
    Ok(())
}

/// The packet's transport fields and where its payload starts (from the IP header).
#[inline(always)]
fn read_packet(ctx: &SkBuffContext, protocol: u8, ip_header: usize) -> Result<(Packet, u32), i64> {
    let len = ctx.len();
    let mut packet = Packet {
        protocol,
        tcp_flags: 0,
        seq: 0,
        payload: 0,
        // Delivered packets have no device: each is seen once.
        dev: 0,
        payload_at: 0,
        linear: 0,
    };
    let at = if protocol == PROTO_TCP {
        let header: [u8; 14] = ctx.load(ip_header)?;
        packet.tcp_flags = header[13];
        packet.seq = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        ip_header as u32 + ((header[12] >> 4) as u32) * 4
    } else {
        ip_header as u32 + 8
    };
    packet.payload = len.saturating_sub(at);
    Ok((packet, at))
}
