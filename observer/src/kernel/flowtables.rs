//! nftables flowtables in a network namespace, read with one nf_tables dump
//! (`NFT_MSG_GETFLOWTABLE`, include/uapi/linux/netfilter/nf_tables.h).
//!
//! A flow a flowtable offloads (`flow add @ft` in a forward chain) leaves the normal
//! path after its first packets: the flowtable's ingress hook NATs and sends the rest
//! itself (net/netfilter/nf_flow_table_ip.c, `nf_flow_offload_ip_hook`), past the
//! netfilter hooks, and without a conntrack entry on the packet (`skb->_nfct` is reset
//! when a packet crosses a veth, and the fast path never sets it). Neither of observer's
//! forwarding hooks can count those packets, so a node namespace with a flowtable is
//! said in a warning rather than counted short in silence.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

pub mod watch;

use crate::netlink::{self, Attrs, Messages, NFGENMSG_LEN};

/// `NETLINK_NETFILTER`; nf_tables' subsystem and message types.
const NETLINK_NETFILTER: i32 = 12;
const SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWFLOWTABLE: u16 = 22;
const NFT_MSG_GETFLOWTABLE: u16 = 23;
/// `enum nft_flowtable_attributes`.
const NFTA_FLOWTABLE_TABLE: u16 = 1;
const NFTA_FLOWTABLE_NAME: u16 = 2;
const NFTA_FLOWTABLE_HOOK: u16 = 3;
/// `NFTA_FLOWTABLE_HOOK_DEVS`, a list of `NFTA_DEVICE_NAME`.
const NFTA_FLOWTABLE_HOOK_DEVS: u16 = 3;
const NFTA_DEVICE_NAME: u16 = 1;
/// `NLMSG_ERROR`, `NLMSG_DONE`; `NLM_F_REQUEST | NLM_F_DUMP`.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const DUMP_REQUEST: u16 = 0x1 | 0x300;

/// One flowtable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Flowtable {
    /// `NFPROTO_*` of its table.
    pub family: u8,
    pub table: String,
    pub name: String,
    pub devices: Vec<String>,
}

impl std::fmt::Display for Flowtable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let family = match self.family {
            1 => "inet",
            2 => "ip",
            10 => "ip6",
            _ => "family",
        };
        write!(f, "{family} {}/{}", self.table, self.name)?;
        if !self.devices.is_empty() {
            write!(f, " on {}", self.devices.join(", "))?;
        }
        Ok(())
    }
}

/// A dump answer that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DumpError {
    #[error("a malformed netlink message ({0:?})")]
    Malformed(netlink::Overrun),
    #[error("a flowtable message without its table or name")]
    Incomplete,
    #[error("nf_tables answered with error {0}")]
    Refused(i32),
}

/// Where a dump stands after one datagram.
#[derive(Debug, PartialEq)]
pub enum Read {
    More,
    Done,
}

/// The flowtables of the calling thread's network namespace (call it inside
/// `netns::run_in`). A kernel without nf_tables has none.
pub fn in_current_namespace() -> io::Result<Vec<Flowtable>> {
    let socket = match open() {
        // No nfnetlink at all: no nf_tables either.
        Err(err) if err.raw_os_error() == Some(libc::EPROTONOSUPPORT) => return Ok(Vec::new()),
        opened => opened?,
    };
    send_request(&socket)?;
    let mut found = Vec::new();
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        // SAFETY: `buffer` is writable for its whole length.
        let got = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        match read_datagram(&buffer[..got as usize], &mut found) {
            Ok(Read::Done) => return Ok(found),
            Ok(Read::More) => {}
            // nf_tables absent (no module, or built without it): no flowtable either.
            Err(DumpError::Refused(code)) if -code == libc::EOPNOTSUPP => return Ok(Vec::new()),
            Err(DumpError::Refused(code)) => return Err(io::Error::from_raw_os_error(-code)),
            Err(err) => return Err(io::Error::new(io::ErrorKind::InvalidData, err)),
        }
    }
}

/// Reads one datagram of the dump's answer into `found`.
pub fn read_datagram(datagram: &[u8], found: &mut Vec<Flowtable>) -> Result<Read, DumpError> {
    for message in Messages(datagram) {
        let message = message.map_err(DumpError::Malformed)?;
        match message.kind {
            NLMSG_DONE => return Ok(Read::Done),
            NLMSG_ERROR => {
                let code = message
                    .body
                    .get(..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                // An acknowledgement (0) is no answer of a dump; any other ends it.
                if code != 0 {
                    return Err(DumpError::Refused(code));
                }
            }
            kind if kind == (SUBSYS_NFTABLES << 8) | NFT_MSG_NEWFLOWTABLE => {
                found.push(flowtable(message.body)?);
            }
            _ => {}
        }
    }
    Ok(Read::More)
}

fn flowtable(body: &[u8]) -> Result<Flowtable, DumpError> {
    let family = *body.first().ok_or(DumpError::Incomplete)?;
    let attrs = body.get(NFGENMSG_LEN..).ok_or(DumpError::Incomplete)?;
    let string = |value: &[u8]| {
        String::from_utf8_lossy(value.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
    };
    let (mut table, mut name, mut devices) = (None, None, Vec::new());
    for attr in Attrs(attrs) {
        let (kind, value) = attr.map_err(DumpError::Malformed)?;
        match kind {
            NFTA_FLOWTABLE_TABLE => table = Some(string(value)),
            NFTA_FLOWTABLE_NAME => name = Some(string(value)),
            NFTA_FLOWTABLE_HOOK => {
                if let Some(list) =
                    netlink::find(value, NFTA_FLOWTABLE_HOOK_DEVS).map_err(DumpError::Malformed)?
                {
                    for device in Attrs(list) {
                        let (kind, value) = device.map_err(DumpError::Malformed)?;
                        if kind == NFTA_DEVICE_NAME {
                            devices.push(string(value));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(Flowtable {
        family,
        table: table.ok_or(DumpError::Incomplete)?,
        name: name.ok_or(DumpError::Incomplete)?,
        devices,
    })
}

fn open() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned right below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // A dump is answered at once; a kernel that does not answer in 2 s will not.
    let timeout = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: `timeout` is a live timeval of the size passed.
    let set = unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    if set < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

fn send_request(socket: &OwnedFd) -> io::Result<()> {
    let request = dump_request();
    // SAFETY: `request` is readable for its whole length; the socket is unconnected
    // netlink, which sends to the kernel.
    let sent = unsafe {
        libc::send(
            socket.as_raw_fd(),
            request.as_ptr().cast(),
            request.len(),
            0,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `nlmsghdr` and `nfgenmsg` (family `NFPROTO_UNSPEC`: every family) of the dump.
fn dump_request() -> Vec<u8> {
    let len = (netlink::HEADER_LEN + NFGENMSG_LEN) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&((SUBSYS_NFTABLES << 8) | NFT_MSG_GETFLOWTABLE).to_ne_bytes());
    out.extend_from_slice(&DUMP_REQUEST.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(netlink::align(out.len()), 0);
        out
    }

    fn nested(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        attr(kind | 0x8000, &parts.concat())
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let len = (netlink::HEADER_LEN + body.len()) as u32;
        let mut out = len.to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&0x2u16.to_ne_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(body);
        out.resize(netlink::align(out.len()), 0);
        out
    }

    /// A flowtable as `nft add flowtable inet fttest f { hook ingress priority 0;
    /// devices = { cni0, eth0 }; }` lists it (nf_tables_fill_flowtable_info).
    fn new_flowtable(family: u8, table: &str, name: &str, devices: &[&str]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        body.extend(attr(NFTA_FLOWTABLE_TABLE, format!("{table}\0").as_bytes()));
        body.extend(attr(NFTA_FLOWTABLE_NAME, format!("{name}\0").as_bytes()));
        let devices: Vec<Vec<u8>> = devices
            .iter()
            .map(|d| attr(NFTA_DEVICE_NAME, format!("{d}\0").as_bytes()))
            .collect();
        body.extend(nested(
            NFTA_FLOWTABLE_HOOK,
            &[
                attr(1, &0u32.to_be_bytes()),
                attr(2, &0u32.to_be_bytes()),
                nested(NFTA_FLOWTABLE_HOOK_DEVS, &devices),
            ],
        ));
        body.extend(attr(5, &7u64.to_be_bytes()));
        message((SUBSYS_NFTABLES << 8) | NFT_MSG_NEWFLOWTABLE, &body)
    }

    #[test]
    fn a_dump_lists_each_flowtable_with_its_devices_until_done() {
        let mut datagram = new_flowtable(1, "fttest", "f", &["cni0", "eth0"]);
        datagram.extend(new_flowtable(2, "filter", "offload", &[]));
        let mut found = Vec::new();
        assert_eq!(read_datagram(&datagram, &mut found), Ok(Read::More));
        let done = message(NLMSG_DONE, &0i32.to_ne_bytes());
        assert_eq!(read_datagram(&done, &mut found), Ok(Read::Done));
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].to_string(), "inet fttest/f on cni0, eth0");
        assert_eq!(found[1].to_string(), "ip filter/offload");
    }

    #[test]
    fn an_error_answer_and_a_malformed_message_end_the_dump_with_an_error() {
        let mut found = Vec::new();
        let refused = message(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(
            read_datagram(&refused, &mut found),
            Err(DumpError::Refused(-libc::EPERM))
        );
        let mut cut = new_flowtable(1, "t", "f", &["cni0"]);
        cut.truncate(cut.len() - 4);
        let len = cut.len() as u32;
        cut[..4].copy_from_slice(&len.to_ne_bytes());
        assert!(matches!(
            read_datagram(&cut, &mut found),
            Err(DumpError::Malformed(_))
        ));
        let nameless = message((SUBSYS_NFTABLES << 8) | NFT_MSG_NEWFLOWTABLE, &[1, 0, 0, 0]);
        assert_eq!(
            read_datagram(&nameless, &mut found),
            Err(DumpError::Incomplete)
        );
        assert!(found.is_empty());
    }

    #[test]
    fn the_request_asks_nf_tables_for_a_dump_of_every_family() {
        let request = dump_request();
        assert_eq!(request.len(), 20);
        assert_eq!(u16::from_ne_bytes([request[4], request[5]]), 0x0a17);
        assert_eq!(u16::from_ne_bytes([request[6], request[7]]), 0x0301);
        assert_eq!(request[16], 0);
    }
}
