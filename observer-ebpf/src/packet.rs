//! The parts of a packet's headers that accounting needs, read from `skb->head`.

use observer_common::{
    conn::{PROTO_TCP, PROTO_UDP},
    offsets::KernelOffsets,
};

use crate::kernel::{ReadFailed, read};

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

pub struct Packet {
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub protocol: u8,
    /// TCP flags byte (0 for UDP).
    pub tcp_flags: u8,
    /// TCP sequence number (host order; 0 for UDP).
    pub seq: u32,
    /// Transport payload bytes in this skb (a GSO skb carries many segments).
    pub payload: u32,
    /// `skb->dev`: the device about to transmit it (0 at local delivery).
    pub dev: u64,
}

/// Parses an IPv4 or IPv6 TCP/UDP packet; `Ok(None)` for anything else.
#[inline(always)]
pub fn parse(skb: u64, off: &KernelOffsets) -> Result<Option<Packet>, ReadFailed> {
    let head: u64 = read(skb, off.skb_head)?;
    let data: u64 = read(skb, off.skb_data)?;
    let len: u32 = read(skb, off.skb_len)?;
    let dev: u64 = read(skb, off.skb_dev)?;
    let network_header: u16 = read(skb, off.skb_network_header)?;
    let ip = head + network_header as u64;
    // Bytes in front of the IP header that `skb->len` counts (the L2 header here).
    let l2 = ip.wrapping_sub(data) as u32;

    let first: u8 = read(ip, 0)?;
    let (ip_header, protocol) = match first >> 4 {
        4 => (((first & 0x0f) as u32) * 4, read::<u8>(ip, 9)?),
        // IPv6 without extension headers.
        6 => (40, read::<u8>(ip, 6)?),
        _ => return Ok(None),
    };
    let transport = ip + ip_header as u64;
    let before_transport = l2.wrapping_add(ip_header);
    match protocol {
        PROTO_TCP => {
            let header: [u8; 14] = read(transport, 0)?;
            let seq = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
            let data_offset = ((header[12] >> 4) as u32) * 4;
            Ok(Some(Packet {
                protocol,
                tcp_flags: header[13],
                seq,
                payload: len.saturating_sub(before_transport + data_offset),
                dev,
            }))
        }
        PROTO_UDP => Ok(Some(Packet {
            protocol,
            tcp_flags: 0,
            seq: 0,
            payload: len.saturating_sub(before_transport + 8),
            dev,
        })),
        _ => Ok(None),
    }
}
