//! ctnetlink messages, bounds-checked: netlink header, `nfgenmsg`, then conntrack's
//! attributes (include/uapi/linux/netfilter/nfnetlink_conntrack.h). Never panics on
//! malformed input; every message that cannot be read is an error of its own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{CtCpuStats, CtEntry, CtKind, CtMessage, CtTuple};
use crate::netlink::{self, Attrs, HEADER_LEN, Messages, NFGENMSG_LEN, Overrun, align, find};

/// Netlink's own message types and flags (include/uapi/linux/netlink.h).
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;

/// nfnetlink: subsystem in the high byte of the message type.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const IPCTNL_MSG_CT_GET_STATS_CPU: u16 = 4;
const IPCTNL_MSG_CT_GET_STATS: u16 = 5;

/// `enum ctattr_type` and its nested attributes.
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_ID: u16 = 12;
const CTA_TIMESTAMP: u16 = 20;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_TIMESTAMP_START: u16 = 1;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
/// `enum ctattr_stats_global` (4.9 sends only the first; every kernel observer runs on,
/// 5.8 and newer, both: docs/kernel-facts.md) and the counters of `enum ctattr_stats_cpu`
/// observer reads (there since the statistics messages, 3.7).
const CTA_STATS_GLOBAL_ENTRIES: u16 = 1;
const CTA_STATS_GLOBAL_MAX_ENTRIES: u16 = 2;
const CTA_STATS_INSERT_FAILED: u16 = 9;
const CTA_STATS_DROP: u16 = 10;
const CTA_STATS_EARLY_DROP: u16 = 11;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Why a message could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("netlink message of {len} bytes does not fit the {left} bytes received")]
    Length { len: usize, left: usize },
    #[error("conntrack message too short for its nfgenmsg header")]
    Short,
    #[error("attribute of {len} bytes does not fit the {left} bytes left")]
    Attribute { len: usize, left: usize },
    #[error("conntrack message without {0}")]
    Missing(&'static str),
    #[error("attribute {0} has the wrong size")]
    Size(&'static str),
}

/// Reads every message in one datagram. A header that does not fit ends the datagram
/// (nothing after it can be located); a message whose body is malformed is one error.
pub fn messages(buf: &[u8]) -> Vec<Result<CtMessage, ParseError>> {
    Messages(buf)
        .map(|read| match read {
            Ok(netlink::Message { kind, flags, body }) => message(kind, flags, body),
            Err(Overrun { len, left }) => Err(ParseError::Length { len, left }),
        })
        .collect()
}

fn message(kind: u16, flags: u16, body: &[u8]) -> Result<CtMessage, ParseError> {
    match kind {
        NLMSG_DONE => return Ok(CtMessage::Done),
        NLMSG_ERROR => {
            let code = body.get(..4).ok_or(ParseError::Size("nlmsgerr"))?;
            return Ok(CtMessage::Error(i32::from_ne_bytes([
                code[0], code[1], code[2], code[3],
            ])));
        }
        NLMSG_NOOP => return Ok(CtMessage::Other),
        _ => {}
    }
    if kind >> 8 != NFNL_SUBSYS_CTNETLINK {
        return Ok(CtMessage::Other);
    }
    let kind = match kind & 0xff {
        IPCTNL_MSG_CT_DELETE => CtKind::Destroy,
        IPCTNL_MSG_CT_NEW if flags & NLM_F_CREATE != 0 => CtKind::New,
        IPCTNL_MSG_CT_NEW => CtKind::Entry,
        IPCTNL_MSG_CT_GET_STATS => return table(attributes(body)?),
        IPCTNL_MSG_CT_GET_STATS_CPU => return cpu_stats(attributes(body)?),
        _ => return Ok(CtMessage::Other),
    };
    Ok(CtMessage::Conntrack(kind, entry(attributes(body)?)?))
}

/// What follows the `nfgenmsg` header.
fn attributes(body: &[u8]) -> Result<&[u8], ParseError> {
    body.get(NFGENMSG_LEN..).ok_or(ParseError::Short)
}

fn table(attrs: &[u8]) -> Result<CtMessage, ParseError> {
    let (mut entries, mut max_entries) = (None, None);
    for attr in Attrs(attrs) {
        let (kind, value) = attr?;
        match kind {
            CTA_STATS_GLOBAL_ENTRIES => {
                entries = Some(be_u32(value, "CTA_STATS_GLOBAL_ENTRIES")?);
            }
            CTA_STATS_GLOBAL_MAX_ENTRIES => {
                max_entries = Some(be_u32(value, "CTA_STATS_GLOBAL_MAX_ENTRIES")?);
            }
            _ => {}
        }
    }
    Ok(CtMessage::Table {
        entries: entries.ok_or(ParseError::Missing("CTA_STATS_GLOBAL_ENTRIES"))?,
        max_entries: max_entries.ok_or(ParseError::Missing("CTA_STATS_GLOBAL_MAX_ENTRIES"))?,
    })
}

/// One CPU's counters; those the kernel leaves out count 0.
fn cpu_stats(attrs: &[u8]) -> Result<CtMessage, ParseError> {
    let mut stats = CtCpuStats::default();
    for attr in Attrs(attrs) {
        let (kind, value) = attr?;
        let (counter, name) = match kind {
            CTA_STATS_INSERT_FAILED => (&mut stats.insert_failed, "CTA_STATS_INSERT_FAILED"),
            CTA_STATS_DROP => (&mut stats.drop, "CTA_STATS_DROP"),
            CTA_STATS_EARLY_DROP => (&mut stats.early_drop, "CTA_STATS_EARLY_DROP"),
            _ => continue,
        };
        *counter = be_u32(value, name)?;
    }
    Ok(CtMessage::CpuStats(stats))
}

fn entry(attrs: &[u8]) -> Result<CtEntry, ParseError> {
    let (mut original, mut reply, mut status) = (None, None, None);
    let (mut id, mut start_ns, mut tcp_state) = (None, None, None);
    for attr in Attrs(attrs) {
        let (kind, value) = attr?;
        match kind {
            CTA_TUPLE_ORIG => original = Some(tuple(value)?),
            CTA_TUPLE_REPLY => reply = Some(tuple(value)?),
            CTA_STATUS => status = Some(be_u32(value, "CTA_STATUS")?),
            CTA_ID => id = Some(be_u32(value, "CTA_ID")?),
            CTA_TIMESTAMP => {
                start_ns = find(value, CTA_TIMESTAMP_START)?.map(be_u64).transpose()?
            }
            CTA_PROTOINFO => tcp_state = protoinfo_tcp_state(value)?,
            _ => {}
        }
    }
    Ok(CtEntry {
        original: original.ok_or(ParseError::Missing("CTA_TUPLE_ORIG"))?,
        reply: reply.ok_or(ParseError::Missing("CTA_TUPLE_REPLY"))?,
        status: status.ok_or(ParseError::Missing("CTA_STATUS"))?,
        id,
        start_ns,
        tcp_state,
    })
}

fn protoinfo_tcp_state(value: &[u8]) -> Result<Option<u8>, ParseError> {
    let Some(tcp) = find(value, CTA_PROTOINFO_TCP)? else {
        return Ok(None);
    };
    match find(tcp, CTA_PROTOINFO_TCP_STATE)? {
        Some([state]) => Ok(Some(*state)),
        Some(_) => Err(ParseError::Size("CTA_PROTOINFO_TCP_STATE")),
        None => Ok(None),
    }
}

fn tuple(value: &[u8]) -> Result<CtTuple, ParseError> {
    let (mut src, mut dst) = (None, None);
    let (mut protocol, mut sport, mut dport) = (None, 0, 0);
    for attr in Attrs(value) {
        let (kind, value) = attr?;
        match kind {
            CTA_TUPLE_IP => {
                for attr in Attrs(value) {
                    let (kind, value) = attr?;
                    match kind {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(ip(value)?),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = Some(ip(value)?),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for attr in Attrs(value) {
                    let (kind, value) = attr?;
                    match (kind, value) {
                        (CTA_PROTO_NUM, [number]) => protocol = Some(*number),
                        (CTA_PROTO_SRC_PORT, [a, b]) => sport = u16::from_be_bytes([*a, *b]),
                        (CTA_PROTO_DST_PORT, [a, b]) => dport = u16::from_be_bytes([*a, *b]),
                        (CTA_PROTO_NUM | CTA_PROTO_SRC_PORT | CTA_PROTO_DST_PORT, _) => {
                            return Err(ParseError::Size("CTA_PROTO"));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(CtTuple {
        protocol: protocol.ok_or(ParseError::Missing("CTA_PROTO_NUM"))?,
        src: SocketAddr::new(src.ok_or(ParseError::Missing("CTA_IP source"))?, sport),
        dst: SocketAddr::new(dst.ok_or(ParseError::Missing("CTA_IP destination"))?, dport),
    })
}

fn ip(value: &[u8]) -> Result<IpAddr, ParseError> {
    if let Ok(v4) = <[u8; 4]>::try_from(value) {
        Ok(IpAddr::V4(Ipv4Addr::from(v4)))
    } else if let Ok(v6) = <[u8; 16]>::try_from(value) {
        Ok(IpAddr::V6(Ipv6Addr::from(v6)))
    } else {
        Err(ParseError::Size("CTA_IP"))
    }
}

fn be_u32(value: &[u8], name: &'static str) -> Result<u32, ParseError> {
    <[u8; 4]>::try_from(value)
        .map(u32::from_be_bytes)
        .map_err(|_| ParseError::Size(name))
}

fn be_u64(value: &[u8]) -> Result<u64, ParseError> {
    <[u8; 8]>::try_from(value)
        .map(u64::from_be_bytes)
        .map_err(|_| ParseError::Size("CTA_TIMESTAMP_START"))
}

impl From<Overrun> for ParseError {
    fn from(Overrun { len, left }: Overrun) -> Self {
        ParseError::Attribute { len, left }
    }
}

/// A request: netlink header, `nfgenmsg` for `family`, then `attrs`.
fn request(kind: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) -> Vec<u8> {
    let len = HEADER_LEN + NFGENMSG_LEN + attrs.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version NFNETLINK_V0, res_id (big endian) 0.
    out.extend_from_slice(&[family, 0, 0, 0]);
    out.extend_from_slice(attrs);
    out
}

/// Asks for every entry of every family.
pub fn dump_request(seq: u32) -> Vec<u8> {
    request(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, 0, &[])
}

/// Asks for the namespace's entry count and maximum (what `conntrack -C` asks): one
/// message, then the acknowledgement.
pub fn table_request(seq: u32) -> Vec<u8> {
    request(
        IPCTNL_MSG_CT_GET_STATS,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        0,
        &[],
    )
}

/// Asks for every CPU's statistics (what `conntrack -S` asks): a dump, one message per
/// possible CPU.
pub fn cpu_stats_request(seq: u32) -> Vec<u8> {
    request(
        IPCTNL_MSG_CT_GET_STATS_CPU,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        0,
        &[],
    )
}

/// Asks for the one entry whose original tuple is `tuple` (zone 0). The answer is the
/// entry, or an error (`-ENOENT` when conntrack no longer has it).
pub fn get_request(seq: u32, tuple: &CtTuple) -> Vec<u8> {
    let mut ips = Vec::new();
    let family = match (tuple.src.ip(), tuple.dst.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            attr(&mut ips, CTA_IP_V4_SRC, &src.octets());
            attr(&mut ips, CTA_IP_V4_DST, &dst.octets());
            AF_INET
        }
        (src, dst) => {
            attr(&mut ips, CTA_IP_V6_SRC, &v6(src).octets());
            attr(&mut ips, CTA_IP_V6_DST, &v6(dst).octets());
            AF_INET6
        }
    };
    let mut proto = Vec::new();
    attr(&mut proto, CTA_PROTO_NUM, &[tuple.protocol]);
    attr(
        &mut proto,
        CTA_PROTO_SRC_PORT,
        &tuple.src.port().to_be_bytes(),
    );
    attr(
        &mut proto,
        CTA_PROTO_DST_PORT,
        &tuple.dst.port().to_be_bytes(),
    );
    let mut inner = Vec::new();
    attr(&mut inner, CTA_TUPLE_IP | NLA_F_NESTED, &ips);
    attr(&mut inner, CTA_TUPLE_PROTO | NLA_F_NESTED, &proto);
    let mut attrs = Vec::new();
    attr(&mut attrs, CTA_TUPLE_ORIG | NLA_F_NESTED, &inner);
    request(
        IPCTNL_MSG_CT_GET,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        family,
        &attrs,
    )
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(v6) => v6,
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
    }
}

fn attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(align(out.len()), 0);
}
