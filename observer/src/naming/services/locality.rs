//! Where a connection's ends are, seen from the node that made its DNAT decision: is
//! the backend on that node, and is the client the node itself? The node's own routing
//! table answers the first (`RTM_GETROUTE` for the backend's address, inside the node's
//! network namespace): a pod of this node is reached straight through a local device
//! (a pod's veth, the CNI bridge), a pod of another node through a gateway or tunnel
//! (kindnet's `10.244.2.0/24 via 172.18.0.3`, flannel's `dev flannel.1 onlink`), and a
//! host-network backend elsewhere on the node's own uplink. The node's addresses answer
//! the second. Answers are kept per namespace and address: pods do not move.

use crate::model::NetMap;
use rustc_hash::FxHashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::netlink::{Attrs, Messages};
use crate::netns::{Kind, run_in_file};

/// `RTM_NEWROUTE`, `RTM_GETROUTE`; `RTA_DST`, `RTA_OIF`, `RTA_GATEWAY`; `RTN_LOCAL`.
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTN_LOCAL: u8 = 2;
/// `sizeof(struct rtmsg)`.
const RTMSG_LEN: usize = 12;

/// How the node routes to an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Through a gateway (another host).
    pub gateway: bool,
    /// The address is the node's own.
    pub local: bool,
    /// The output interface.
    pub oif: Option<u32>,
}

impl Route {
    /// Whether a backend routed this way is on the node itself, given the interface of
    /// the node's default route (its uplink).
    pub fn on_node(self, uplink: Option<u32>) -> bool {
        self.local || (!self.gateway && (self.oif.is_none() || self.oif != uplink))
    }
}

/// Parses the reply to one `RTM_GETROUTE`.
pub fn parse_route(reply: &[u8]) -> Option<Route> {
    for message in Messages(reply) {
        let message = message.ok()?;
        if message.kind != RTM_NEWROUTE {
            continue;
        }
        let header = message.body.get(..RTMSG_LEN)?;
        let mut route = Route {
            gateway: false,
            local: header[7] == RTN_LOCAL,
            oif: None,
        };
        for attr in Attrs(&message.body[RTMSG_LEN..]) {
            let (kind, value) = attr.ok()?;
            match kind {
                RTA_GATEWAY => route.gateway = true,
                RTA_OIF => {
                    route.oif = value
                        .get(..4)
                        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                }
                _ => {}
            }
        }
        return Some(route);
    }
    None
}

/// One `RTM_GETROUTE` request for `dst` (a host route).
fn request(dst: IpAddr) -> Vec<u8> {
    let (family, addr): (u8, Vec<u8>) = match dst {
        IpAddr::V4(ip) => (libc::AF_INET as u8, ip.octets().to_vec()),
        IpAddr::V6(ip) => (libc::AF_INET6 as u8, ip.octets().to_vec()),
    };
    let attr_len = 4 + addr.len();
    let len = crate::netlink::HEADER_LEN + RTMSG_LEN + attr_len;
    let mut out = Vec::with_capacity(len);
    out.extend((len as u32).to_ne_bytes());
    out.extend(RTM_GETROUTE.to_ne_bytes());
    out.extend((libc::NLM_F_REQUEST as u16).to_ne_bytes());
    out.extend(1u32.to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    let dst_len = (addr.len() * 8) as u8;
    out.extend([family, dst_len, 0, 0, 0, 0, 0, 0]);
    out.extend(0u32.to_ne_bytes());
    out.extend((attr_len as u16).to_ne_bytes());
    out.extend(RTA_DST.to_ne_bytes());
    out.extend(addr);
    out
}

/// Asks the routing table of the namespace at `path` for `dst`, and for a default
/// route's interface.
fn lookup(path: &std::path::Path, dst: IpAddr) -> Option<(Route, Option<u32>)> {
    let uplink_probe = match dst {
        IpAddr::V4(_) => IpAddr::from([8, 8, 8, 8]),
        IpAddr::V6(_) => "2001:4860:4860::8888".parse().ok()?,
    };
    run_in_file(path, Kind::Network, move || {
        let ask = |addr: IpAddr| -> Option<Route> {
            use nix::sys::socket::{
                AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv,
                sendto, socket,
            };
            use std::os::fd::AsRawFd;
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkRoute,
            )
            .ok()?;
            sendto(
                fd.as_raw_fd(),
                &request(addr),
                &NetlinkAddr::new(0, 0),
                MsgFlags::empty(),
            )
            .ok()?;
            let mut buffer = vec![0u8; 4096];
            let n = recv(fd.as_raw_fd(), &mut buffer, MsgFlags::empty()).ok()?;
            parse_route(&buffer[..n])
        };
        // A node without a default route (the lab's) has no uplink.
        let uplink = ask(uplink_probe).filter(|r| r.gateway).and_then(|r| r.oif);
        ask(dst).map(|route| (route, uplink))
    })
    .ok()
    .flatten()
}

/// Answers per (namespace, address), and each namespace's path and addresses.
#[derive(Default)]
pub struct Locality {
    paths: FxHashMap<u32, Option<PathBuf>>,
    node_addresses: FxHashMap<u32, Vec<IpAddr>>,
    /// Asked for every connection: foldhash, not SipHash.
    backends: NetMap<(u32, IpAddr), Option<bool>>,
}

/// Backends remembered at most (then forgotten all at once).
const REMEMBERED: usize = 65_536;

impl Locality {
    /// Whether `backend` is on the node of namespace `netns`; `None` when the node's
    /// routing table cannot be asked.
    pub fn backend_on_node(&mut self, netns: u32, backend: IpAddr) -> Option<bool> {
        if let Some(known) = self.backends.get(&(netns, backend)) {
            return *known;
        }
        let answer = self
            .path(netns)
            .and_then(|path| lookup(&path, backend))
            .map(|(route, uplink)| route.on_node(uplink));
        if self.backends.len() >= REMEMBERED {
            self.backends.clear();
        }
        self.backends.insert((netns, backend), answer);
        answer
    }

    /// Whether `client` is an address of the node of `netns` (a host-network client);
    /// `None` when the node's addresses cannot be read.
    pub fn client_is_node(&mut self, netns: u32, client: IpAddr) -> Option<bool> {
        if !self.node_addresses.contains_key(&netns) {
            let path = self.path(netns)?;
            let addresses = crate::naming::pods::runtime::netns_addresses(&path).ok()?;
            self.node_addresses.insert(netns, addresses);
        }
        Some(self.node_addresses[&netns].contains(&client))
    }

    fn path(&mut self, netns: u32) -> Option<PathBuf> {
        self.paths
            .entry(netns)
            .or_insert_with(|| {
                super::list_namespaces()
                    .into_iter()
                    .find(|info| info.inode == netns)
                    .map(|info| info.path)
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `RTM_NEWROUTE` reply: rtmsg with `rtm_type`, then attributes.
    fn reply(rtm_type: u8, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![2, 32, 0, 0, 254, 3, 0, rtm_type, 0, 0, 0, 0];
        for (kind, value) in attrs {
            body.extend(((4 + value.len()) as u16).to_ne_bytes());
            body.extend(kind.to_ne_bytes());
            body.extend(value);
            body.resize(body.len().next_multiple_of(4), 0);
        }
        let len = 16 + body.len();
        let mut out = Vec::new();
        out.extend((len as u32).to_ne_bytes());
        out.extend(RTM_NEWROUTE.to_ne_bytes());
        out.extend([0u8; 10]);
        out.extend(body);
        out
    }

    #[test]
    fn a_backend_is_on_the_node_unless_a_gateway_or_the_uplink_leads_to_it() {
        let veth = parse_route(&reply(1, &[(RTA_OIF, 7u32.to_ne_bytes().to_vec())])).unwrap();
        let other_node = parse_route(&reply(
            1,
            &[
                (RTA_GATEWAY, vec![172, 18, 0, 3]),
                (RTA_OIF, 2u32.to_ne_bytes().to_vec()),
            ],
        ))
        .unwrap();
        let uplink_neighbour =
            parse_route(&reply(1, &[(RTA_OIF, 2u32.to_ne_bytes().to_vec())])).unwrap();
        let own =
            parse_route(&reply(RTN_LOCAL, &[(RTA_OIF, 1u32.to_ne_bytes().to_vec())])).unwrap();
        assert!(veth.on_node(Some(2)));
        assert!(!other_node.on_node(Some(2)));
        assert!(
            !uplink_neighbour.on_node(Some(2)),
            "a host-network backend on another node"
        );
        assert!(
            uplink_neighbour.on_node(None),
            "no uplink: a lab node's own link"
        );
        assert!(own.on_node(Some(2)));
        assert_eq!(parse_route(&[1, 2, 3]), None);
    }
}
