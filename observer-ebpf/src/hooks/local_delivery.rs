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
//! the headers in place (direct packet access, no helper call) and a byte or two of
//! `DIALED_SEEN`, before any map lookup; the same read gives the `DIALED` key, so only
//! headers outside the linear part (or after IPv4 options) cost `bpf_skb_load_bytes`.
//! `DIALED_SEEN` holds only the addresses local clients and DNS clients dialed
//! (`conn::remember_dialed`), so the replies to pod clients of other Services, which
//! the node forwarded and accounted, stop there too.
//! (`skb->_nfct`, which the forwarding hook reads, is gone by now: TCP and UDP reset it
//! before socket filters run.)

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::cgroup_skb, programs::SkBuffContext};
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use observer_common::conn::{CLOSE_NONE, DialedKey, PROTO_TCP, PROTO_UDP, REPLY};

use crate::{
    conn::{account, close, pending_close},
    dns::{capture_segment, load_bytes},
    maps::{DIALED, dialed_slot, maybe_dialed},
    packet::Packet,
    state::{is_dns, load},
    table::{Single, Table},
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
/// and checks the filter (`maybe_dialed`). Up to that check only the bytes the filter
/// needs are loaded (protocol, source address and port), one by one: the BPF target
/// splits unaligned reads into bytes anyway, and a whole header read here kept ~80
/// instructions of loads and spills on every delivered packet.
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
    // SAFETY (every `byte` below): `data + at` is inside the checked range of its
    // header version.
    let byte = |at: usize| unsafe { *((data + at) as *const u8) };
    let word = |at: usize| u32::from_ne_bytes([byte(at), byte(at + 1), byte(at + 2), byte(at + 3)]);
    // The reply's source is what the client dialed, its destination the client.
    let (protocol, ip_header, dialed_at, client_at, folded) = match byte(0) {
        // IPv4 without options: protocol at 9, source at 12, destination at 16.
        0x45 => (byte(9), Ipv4Hdr::LEN, 12, 16, word(12)),
        first if first >> 4 == 4 => return Delivered::Unsure,
        first if first >> 4 == 6 => {
            if data + V6 > end {
                return Delivered::Unsure;
            }
            // Next header at 6, source at 8, destination at 24.
            let folded = word(8) ^ word(12) ^ word(16) ^ word(20);
            (byte(6), Ipv6Hdr::LEN, 8, 24, folded)
        }
        _ => return Delivered::NotReply,
    };
    if protocol != PROTO_TCP && protocol != PROTO_UDP {
        return Delivered::NotReply;
    }
    let dialed_port = u16::from_be_bytes([byte(ip_header), byte(ip_header + 1)]);
    if !maybe_dialed(dialed_slot(folded, dialed_port, protocol)) {
        return Delivered::NotReply;
    }
    let address_len = if ip_header == Ipv4Hdr::LEN { 4 } else { 16 };
    let mut key = DialedKey {
        dialed_port,
        client_port: u16::from_be_bytes([byte(ip_header + 2), byte(ip_header + 3)]),
        protocol,
        ..DialedKey::default()
    };
    for i in 0..address_len {
        key.dialed[i] = byte(dialed_at + i);
        key.client[i] = byte(client_at + i);
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
    let Some(state) = Single::get(conntrack) else {
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
            load_bytes(ctx, at),
            (packet.payload, packet.seq),
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
        close::<Single>(conntrack, state, reason, now);
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
        skb: 0,
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
