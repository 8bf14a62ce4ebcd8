//! The parts of a packet's headers that accounting needs, read from `skb->head`: the
//! IP header and the start of the transport header in one read (`read_layers`), or field
//! by field as the kernel's own header types (`cast_layers`, the netfilter program), and
//! where the payload starts.

use network_types::{
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    udp::UdpHdr,
};
use observer_common::conn::{PROTO_TCP, PROTO_UDP};

use crate::{
    kernel::{ReadFailed, member, read, typed},
    maps::offset,
    skb::SkbFields,
};

pub use observer_common::accounting::{
    Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, carries_nothing,
};

/// An IPv6 header and a TCP header: read at the IP header, it holds an IPv4 header
/// without options and its TCP header too (`V4_TRANSPORT`). Past the end of a short
/// packet the read still lands in the skb's buffer (`skb_shared_info` follows it).
#[repr(C)]
pub struct Headers {
    pub ip: [u8; Ipv6Hdr::LEN],
    pub transport: TcpHdr,
}

/// Where an option-less IPv4 header's transport header starts in `Headers`.
const V4_TRANSPORT: usize = Ipv4Hdr::LEN;

/// The transport fields accounting uses.
pub struct Transport {
    pub tcp_flags: u8,
    pub seq: u32,
    /// Transport header length.
    pub header: u32,
}

impl Transport {
    /// From a TCP header (`TcpHdr` keeps the flags in its bitfield: byte 13).
    #[inline(always)]
    pub fn tcp(header: &TcpHdr) -> Transport {
        // SAFETY: TcpHdr is 20 plain bytes; byte 12 is the data offset, 13 the flags.
        let bytes: [u8; TcpHdr::LEN] = unsafe { core::mem::transmute_copy(header) };
        Transport {
            tcp_flags: bytes[13],
            seq: u32::from_be_bytes(header.seq),
            header: ((bytes[12] >> 4) as u32) * 4,
        }
    }

    pub const UDP: Transport = Transport {
        tcp_flags: 0,
        seq: 0,
        header: UdpHdr::LEN as u32,
    };
}

/// What accounting needs of a packet's IP and transport headers.
pub struct Layers {
    /// IP header length (IPv6: without extension headers).
    pub ip_header: u32,
    pub protocol: u8,
    pub transport: Transport,
}

/// Parses an IPv4 or IPv6 TCP/UDP packet; `Ok(None)` for anything else. `len` and
/// `data_len` (bytes in page fragments) are the skb's. Reads: `head` with `data`,
/// `network_header`, the headers (`SkbFields::layers`), and for UDP `dev`.
#[inline(always)]
pub fn parse<S: SkbFields>(skb: S, len: u32, data_len: u32) -> Result<Option<Packet>, ReadFailed> {
    let (head, data) = skb.head_and_data()?;
    let network_header = skb.network_header()?;
    let ip = head + network_header as u64;
    // Bytes in front of the IP header that `skb->len` counts (the L2 header here).
    let l2 = ip.wrapping_sub(data) as u32;
    let Some(Layers {
        ip_header,
        protocol,
        transport,
    }) = skb.layers(ip)?
    else {
        return Ok(None);
    };
    // Only UDP de-duplication needs the device and the sk_buff.
    let (dev, skb_address) = if protocol == PROTO_UDP {
        (skb.dev()?, skb.address())
    } else {
        (0, 0)
    };
    let before_payload = l2.wrapping_add(ip_header) + transport.header;
    let payload = len.saturating_sub(before_payload);
    let headlen = len.saturating_sub(data_len);
    Ok(Some(Packet {
        protocol,
        tcp_flags: transport.tcp_flags,
        seq: transport.seq,
        payload,
        dev,
        skb: skb_address,
        payload_at: data.wrapping_add(before_payload as u64),
        linear: headlen.saturating_sub(before_payload).min(payload),
    }))
}

/// `Layers` of the IP header at `ip`, read with `bpf_probe_read_kernel`: the IP header
/// and the start of the transport header in one call.
#[inline(always)]
pub fn read_layers(ip: u64) -> Result<Option<Layers>, ReadFailed> {
    let headers: Headers = read(ip, 0)?;
    let (ip_header, protocol, tcp) = match headers.ip[0] >> 4 {
        4 => {
            // SAFETY: `Ipv4Hdr` is 20 plain bytes, within the 40 of `headers.ip`.
            let v4: Ipv4Hdr = unsafe { core::ptr::read_unaligned(headers.ip.as_ptr().cast()) };
            let ihl = ((v4.vihl & 0x0f) as u32) * 4;
            let tcp = if v4.proto != PROTO_TCP {
                None
            } else if ihl as usize == V4_TRANSPORT {
                // SAFETY: bytes 20..40 of `headers.ip` are the TCP header here.
                Some(unsafe {
                    core::ptr::read_unaligned(headers.ip.as_ptr().add(V4_TRANSPORT).cast())
                })
            } else {
                // IP options: the TCP header lies further on.
                Some(read::<TcpHdr>(ip, ihl)?)
            };
            (ihl, v4.proto, tcp)
        }
        6 => {
            // IPv6 without extension headers.
            // SAFETY: `Ipv6Hdr` is 40 plain bytes: `headers.ip`.
            let v6: Ipv6Hdr = unsafe { core::ptr::read_unaligned(headers.ip.as_ptr().cast()) };
            let tcp = (v6.next_hdr == PROTO_TCP).then_some(headers.transport);
            (Ipv6Hdr::LEN as u32, v6.next_hdr, tcp)
        }
        _ => return Ok(None),
    };
    let transport = match (protocol, tcp) {
        (PROTO_TCP, Some(header)) => Transport::tcp(&header),
        (PROTO_UDP, _) => Transport::UDP,
        _ => return Ok(None),
    };
    Ok(Some(Layers {
        ip_header,
        protocol,
        transport,
    }))
}

/// `Layers` of the IP header at `ip`, read as typed pointers: `bpf_rdonly_cast` to
/// `struct iphdr`, `ipv6hdr` or `tcphdr` (their ids in `OFFSETS`), then one fault-safe
/// load per member, instead of a helper call that copies 60 bytes. Only the netfilter
/// program, whose loader rewrites the kfunc call, reads headers so.
#[inline(always)]
pub fn cast_layers(ip: u64) -> Option<Layers> {
    let v4 = typed(ip, offset!(iphdr_btf_id));
    // `ihl` and `version`: one byte of two bitfields, which the verifier allows as one
    // load (it covers both); `protocol` is byte 9 (include/uapi/linux/ip.h).
    let first: u8 = member(v4, 0);
    let (ip_header, protocol) = match first >> 4 {
        4 => (((first & 0x0f) as u32) * 4, member::<u8>(v4, 9)),
        // `nexthdr`, byte 6 (include/uapi/linux/ipv6.h); no extension headers.
        6 => (
            Ipv6Hdr::LEN as u32,
            member::<u8>(typed(ip, offset!(ipv6hdr_btf_id)), 6),
        ),
        _ => return None,
    };
    let transport = match protocol {
        PROTO_TCP => {
            let tcp = typed(ip + ip_header as u64, offset!(tcphdr_btf_id));
            // `seq` at byte 4; bytes 12 and 13 hold `doff` and the flags as bitfields
            // (include/uapi/linux/tcp.h), one load of two bytes that covers the first.
            let seq: u32 = member(tcp, 4);
            let [offset, flags] = member::<u16>(tcp, 12).to_ne_bytes();
            Transport {
                tcp_flags: flags,
                seq: u32::from_be(seq),
                header: ((offset >> 4) as u32) * 4,
            }
        }
        PROTO_UDP => Transport::UDP,
        _ => return None,
    };
    Some(Layers {
        ip_header,
        protocol,
        transport,
    })
}

/// ICMP's "port unreachable": type 3 code 3 (ICMPv4), type 1 code 4 (ICMPv6).
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PORT_UNREACH: u8 = 4;
const PROTO_ICMP: u8 = 1;
const PROTO_ICMPV6: u8 = 58;

/// Whether the packet is an ICMP or ICMPv6 "port unreachable" (the answer of a host
/// where nothing listens on a UDP port, and of an iptables or nftables REJECT). Reads
/// the IP header and the ICMP type and code in one read.
#[inline(always)]
pub fn port_unreachable<S: SkbFields>(skb: S) -> Result<bool, ReadFailed> {
    let (head, _) = skb.head_and_data()?;
    let ip = head + skb.network_header()? as u64;
    let headers: Headers = read(ip, 0)?;
    let (protocol, type_code) = match headers.ip[0] >> 4 {
        4 => {
            let ihl = ((headers.ip[0] & 0x0f) as u64) * 4;
            let type_code: [u8; 2] = if ihl as usize == V4_TRANSPORT {
                [headers.ip[V4_TRANSPORT], headers.ip[V4_TRANSPORT + 1]]
            } else {
                read(ip, ihl as u32)?
            };
            (headers.ip[9], type_code)
        }
        6 => {
            // SAFETY: TcpHdr is 20 plain bytes; the ICMPv6 type and code are the first two.
            let bytes: [u8; TcpHdr::LEN] = unsafe { core::mem::transmute_copy(&headers.transport) };
            (headers.ip[6], [bytes[0], bytes[1]])
        }
        _ => return Ok(false),
    };
    Ok(match protocol {
        PROTO_ICMP => type_code == [ICMP_DEST_UNREACH, ICMP_PORT_UNREACH],
        PROTO_ICMPV6 => type_code == [ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH],
        _ => false,
    })
}
