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
//! the node forwarded (`ConnState::reply_forwarded`) were accounted already and are left
//! alone. The program never drops anything: it returns 1.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::cgroup_skb, programs::SkBuffContext};
use observer_common::conn::{CLOSE_NONE, DialedKey, PROTO_TCP, PROTO_UDP, REPLY};

use crate::{
    conn::{account, close, load, pending_close},
    maps::{CONNS, DIALED},
    packet::Packet,
};

#[cgroup_skb]
pub fn local_delivery(ctx: SkBuffContext) -> i32 {
    let _ = handle(&ctx);
    1
}

#[inline(always)]
fn handle(ctx: &SkBuffContext) -> Result<(), i64> {
    let first: u8 = ctx.load(0)?;
    let mut key = DialedKey::default();
    let (ip_header, protocol) = match first >> 4 {
        4 => {
            // The reply's source is what the client dialed, its destination the client.
            key.dialed[..4].copy_from_slice(&ctx.load::<[u8; 4]>(12)?);
            key.client[..4].copy_from_slice(&ctx.load::<[u8; 4]>(16)?);
            (((first & 0x0f) as usize) * 4, ctx.load::<u8>(9)?)
        }
        6 => {
            key.dialed = ctx.load(8)?;
            key.client = ctx.load(24)?;
            (40, ctx.load::<u8>(6)?)
        }
        _ => return Ok(()),
    };
    if protocol != PROTO_TCP && protocol != PROTO_UDP {
        return Ok(());
    }
    let ports: [u8; 4] = ctx.load(ip_header)?;
    key.dialed_port = u16::from_be_bytes([ports[0], ports[1]]);
    key.client_port = u16::from_be_bytes([ports[2], ports[3]]);
    key.protocol = protocol;
    let Some(owner) = DIALED.get_ptr(&key) else {
        return Ok(());
    };
    // SAFETY: a live map value.
    let conntrack = unsafe { *owner };
    let Some(state) = CONNS.get_ptr_mut(&conntrack) else {
        return Ok(());
    };
    if load!(state.reply_forwarded) != 0 || pending_close(state) != CLOSE_NONE {
        return Ok(());
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let len = ctx.len();
    let packet = if protocol == PROTO_TCP {
        let header: [u8; 14] = ctx.load(ip_header)?;
        let data_offset = ((header[12] >> 4) as u32) * 4;
        Packet {
            protocol,
            tcp_flags: header[13],
            seq: u32::from_be_bytes([header[4], header[5], header[6], header[7]]),
            payload: len.saturating_sub(ip_header as u32 + data_offset),
            // Delivered packets have no device: each is seen once.
            dev: 0,
        }
    } else {
        Packet {
            protocol,
            tcp_flags: 0,
            seq: 0,
            payload: len.saturating_sub(ip_header as u32 + 8),
            dev: 0,
        }
    };
    let reason = account(state, REPLY, &packet, now);
    if reason != CLOSE_NONE {
        close(conntrack, state, reason, now);
    }
    Ok(())
}
