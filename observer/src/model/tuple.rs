//! Kernel tuples as the records write them: addresses and protocols.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use observer_common::conn::{Endpoint, FAMILY_IPV6, PROTO_TCP, PROTO_UDP};

use crate::model::record::Proto;

/// A tracked connection whose IP protocol is neither TCP nor UDP (the kernel programs
/// follow only those): it cannot be recorded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown IP protocol {0} in a tracked connection")]
pub struct UnknownProtocol(pub u8);

/// An endpoint as a socket address: IPv4 uses the first four address bytes.
pub fn socket_addr(family: u16, endpoint: &Endpoint) -> SocketAddr {
    let ip = if family == FAMILY_IPV6 {
        IpAddr::V6(Ipv6Addr::from(endpoint.addr))
    } else {
        let [a, b, c, d, ..] = endpoint.addr;
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    };
    SocketAddr::new(ip, endpoint.port)
}

/// The record's protocol for a kernel protocol number.
pub fn proto(protocol: u8) -> Result<Proto, UnknownProtocol> {
    match protocol {
        PROTO_TCP => Ok(Proto::Tcp),
        PROTO_UDP => Ok(Proto::Udp),
        other => Err(UnknownProtocol(other)),
    }
}

#[cfg(test)]
mod tests {
    use observer_common::conn::FAMILY_IPV4;

    use super::*;

    #[test]
    fn addresses() {
        let mut endpoint = Endpoint {
            port: 8080,
            ..Default::default()
        };
        endpoint.addr[..4].copy_from_slice(&[10, 244, 1, 12]);
        assert_eq!(
            socket_addr(FAMILY_IPV4, &endpoint).to_string(),
            "10.244.1.12:8080"
        );
        let mut v6 = Endpoint {
            port: 80,
            ..Default::default()
        };
        v6.addr = "fd00::1".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(socket_addr(FAMILY_IPV6, &v6).to_string(), "[fd00::1]:80");
        assert_eq!(proto(6), Ok(Proto::Tcp));
        assert_eq!(proto(1), Err(UnknownProtocol(1)));
    }
}
