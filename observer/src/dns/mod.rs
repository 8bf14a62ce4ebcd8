//! DNS on port 53: decoding the message prefixes the kernel copies ([`wire`]), finding
//! the messages in TCP segments ([`stream`]), and matching queries to their responses
//! ([`matcher`]). Pure: no kernel, no runtime.

use observer_common::conn::{PROTO_TCP, REPLY};
use observer_common::dns::{DNS_PREFIX, DnsEvent};

use crate::model::tuple::{proto, socket_addr};

pub mod matcher;
pub mod stream;
pub mod wire;

pub use matcher::{Matcher, Seen};
pub use stream::{StreamKey, Streams};

/// Why a copied DNS message was skipped (counted as malformed by the caller).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DnsError {
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    #[error("unknown IP protocol {0}")]
    Protocol(u8),
    #[error("a {0} on the connection's {1} direction")]
    Direction(&'static str, &'static str),
    #[error("a TCP message starting past the segment's first {0} bytes")]
    PastPrefix(u16),
}

/// Decodes the messages of one kernel DNS record: a UDP message, or the messages that
/// start in a TCP segment (`streams` follows each TCP connection's directions). One
/// result per message, an error for each one skipped.
pub fn from_event(event: &DnsEvent, streams: &mut Streams) -> Vec<Result<Seen, DnsError>> {
    let bytes = &event.payload[..(event.len as usize).min(DNS_PREFIX)];
    if event.protocol != PROTO_TCP {
        return vec![decode_one(event, bytes)];
    }
    let key = StreamKey {
        conntrack: event.conntrack,
        netns: event.netns,
        client: socket_addr(event.original.family, &event.original.src),
        dir: event.dir,
    };
    let framed = streams.segment(key, event.seq, event.segment, bytes, event.time_ns);
    let past = (0..framed.unread).map(|_| Err(DnsError::PastPrefix(event.len)));
    framed
        .messages
        .into_iter()
        .map(|range| decode_one(event, &bytes[range]))
        .chain(past)
        .collect()
}

/// Decodes one message of `event` (`bytes`, without a TCP length).
fn decode_one(event: &DnsEvent, bytes: &[u8]) -> Result<Seen, DnsError> {
    let proto_ = proto(event.protocol).map_err(|_| DnsError::Protocol(event.protocol))?;
    let message = wire::decode(bytes)?;
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
