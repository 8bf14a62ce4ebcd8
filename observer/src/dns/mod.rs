//! DNS on port 53: decoding the message prefixes the kernel copies ([`wire`]), and
//! matching queries to their responses ([`matcher`]). Pure: no kernel, no runtime.

use observer_common::conn::{PROTO_TCP, REPLY};
use observer_common::dns::{DNS_PREFIX, DnsEvent};

use crate::kernel::decode::{proto, socket_addr};

pub mod matcher;
pub mod wire;

pub use matcher::{Matcher, Seen};

/// Why a copied DNS message was skipped (counted as malformed by the caller).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DnsError {
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    #[error("unknown IP protocol {0}")]
    Protocol(u8),
    #[error("a {0} on the connection's {1} direction")]
    Direction(&'static str, &'static str),
}

/// Decodes the message of one kernel DNS record.
pub fn from_event(event: &DnsEvent) -> Result<Seen, DnsError> {
    let proto_ = proto(event.protocol).map_err(|_| DnsError::Protocol(event.protocol))?;
    let bytes = &event.payload[..(event.len as usize).min(DNS_PREFIX)];
    let message = if event.protocol == PROTO_TCP {
        wire::decode_tcp(bytes)?
    } else {
        wire::decode(bytes)?
    };
    let response = event.dir as usize == REPLY;
    if message.response != response {
        let (what, dir) = if message.response {
            ("response", "client")
        } else {
            ("query", "server")
        };
        return Err(DnsError::Direction(what, dir));
    }
    Ok(Seen {
        time_ns: event.time_ns,
        proto: proto_,
        client: socket_addr(event.original.family, &event.original.src),
        server: socket_addr(event.original.family, &event.original.dst),
        netns: event.netns,
        response,
        message,
    })
}

#[cfg(test)]
mod tests;
