use std::net::SocketAddr;

use chrono::{DateTime, Utc};
use observer_common::conn::{FAMILY_IPV4, ORIGINAL, PROTO_TCP, PROTO_UDP, REPLY};
use observer_common::dns::{DNS_PREFIX, DnsEvent};

use super::wire::{Message, WireError, build, decode};
use super::*;
use crate::model::record::Proto;
use crate::model::tracker::Clock;

const A: u16 = 1;
const AAAA: u16 = 28;

#[test]
fn decodes_a_query_and_a_response() {
    let query = decode(&build(
        0x1234,
        false,
        0,
        "Checkout.Shop.svc.cluster.local.",
        A,
    ))
    .unwrap();
    assert_eq!(
        query,
        Message {
            id: 0x1234,
            response: false,
            rcode: 0,
            name: "checkout.shop.svc.cluster.local".into(),
            qtype: A,
        }
    );
    let response = decode(&build(7, true, 3, "www.example.com", AAAA)).unwrap();
    assert_eq!((response.response, response.rcode), (true, 3));
    assert_eq!(
        (response.name.as_str(), response.qtype),
        ("www.example.com", AAAA)
    );
    assert_eq!(decode(&build(1, false, 0, ".", 2)).unwrap().name, ".");
}

#[test]
fn odd_bytes_are_escaped() {
    let mut message = build(1, false, 0, "ab", A);
    // "a.\0" as one label: 3 bytes.
    message.splice(12..15, [3, b'a', b'.', 0]);
    assert_eq!(decode(&message).unwrap().name, "a\\.\\000");
}

#[test]
fn malformed_messages_are_errors() {
    let good = build(1, false, 0, "checkout.shop", A);
    assert_eq!(decode(&good[..11]), Err(WireError::ShortHeader { got: 11 }));
    // Cut inside the name, and inside the type.
    assert_eq!(decode(&good[..15]), Err(WireError::PastEnd { len: 15 }));
    assert_eq!(
        decode(&good[..good.len() - 3]),
        Err(WireError::PastEnd {
            len: good.len() - 3
        })
    );
    let mut none = good.clone();
    none[5] = 0;
    assert_eq!(decode(&none), Err(WireError::NoQuestion));
    let mut long = good.clone();
    // 64 bytes and more: the length byte has a label type's bits set.
    long[12] = 64;
    assert_eq!(decode(&long), Err(WireError::LabelType(0x40)));
    let mut reserved = good.clone();
    reserved[12] = 0x80;
    assert_eq!(decode(&reserved), Err(WireError::LabelType(0x80)));
}

#[test]
fn compression_loops_and_forward_pointers_are_errors() {
    let mut header = build(1, false, 0, ".", A)[..12].to_vec();
    // A pointer to itself.
    let mut looped = header.clone();
    looped.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    assert_eq!(decode(&looped), Err(WireError::PointerLoop));
    // Two labels pointing at each other: the second points forward.
    let mut pair = header.clone();
    pair.extend_from_slice(&[1, b'a', 0xc0, 16, 1, b'b', 0xc0, 12]);
    assert_eq!(decode(&pair), Err(WireError::PointerLoop));
    // A pointer back into the header is read (as labels) without harm.
    header.extend_from_slice(&[0xc0, 2, 0, 1, 0, 1]);
    assert!(decode(&header).is_err() || decode(&header).is_ok());
}

#[test]
fn names_longer_than_255_bytes_are_errors() {
    let label = "a".repeat(63);
    let name = [label.as_str(); 4].join(".");
    // 4 x 64 + 1 = 257 bytes on the wire.
    assert_eq!(
        decode(&build(1, false, 0, &name, A)),
        Err(WireError::NameTooLong)
    );
    let fits = [
        label.as_str(),
        label.as_str(),
        label.as_str(),
        &"a".repeat(61),
    ]
    .join(".");
    assert_eq!(decode(&build(1, false, 0, &fits, A)).unwrap().name, fits);
}

/// xorshift64*: a tiny deterministic generator, so the property tests need no crate and
/// every failure is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Arbitrary bytes, and mutations of well-formed messages (which reach deeper): never a
/// panic, never an endless loop (each name is read in bounded steps).
#[test]
fn arbitrary_bytes_never_panic() {
    for seed in 1..=20_000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let len = rng.below(DNS_PREFIX as u64 + 8) as usize;
        let random: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let _ = decode(&random);
        let _ = stream::frame(
            Some(rng.next() as u32),
            rng.next() as u32,
            rng.next() as u32,
            &random,
        );
        let mut mutated = build(
            rng.next() as u16,
            seed % 2 == 0,
            3,
            "www.example.com.shop.svc",
            A,
        );
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(mutated.len() as u64) as usize;
            mutated[at] = rng.next() as u8;
        }
        let cut = rng.below(mutated.len() as u64 + 1) as usize;
        let _ = decode(&mutated[..cut]);
        let _ = decode(&mutated);
    }
}

/// Well-formed messages of random names (labels of 1-63 bytes of letters, digits and
/// hyphens) decode to exactly what was encoded.
#[test]
fn well_formed_messages_round_trip() {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
    for seed in 1..=5_000u64 {
        let mut rng = Rng(seed.wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1);
        let mut name = String::new();
        for _ in 0..1 + rng.below(5) {
            let len = 1 + rng.below(40) as usize;
            let label: String = (0..len)
                .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize] as char)
                .collect();
            if !name.is_empty() {
                name.push('.');
            }
            name.push_str(&label);
        }
        let (id, qtype, rcode) = (rng.next() as u16, rng.next() as u16, rng.below(16) as u8);
        let response = rng.below(2) == 1;
        let decoded = decode(&build(id, response, rcode, &name, qtype)).unwrap();
        let expected = Message {
            id,
            response,
            rcode: if response { rcode } else { 0 },
            name,
            qtype,
        };
        assert_eq!(decoded, expected, "seed {seed}");
    }
}

fn clock() -> Clock {
    Clock {
        monotonic_ns: 0,
        wall: "2026-08-06T13:46:36Z".parse::<DateTime<Utc>>().unwrap(),
    }
}

fn seen(ms: u64, port: u16, id: u16, response: bool, rcode: u8, name: &str) -> Seen {
    Seen {
        time_ns: ms * 1_000_000,
        proto: Proto::Udp,
        client: SocketAddr::from(([10, 244, 1, 9], port)),
        server: "10.96.0.10:53".parse().unwrap(),
        netns: 7,
        response,
        message: decode(&build(id, response, rcode, name, A)).unwrap(),
    }
}

#[test]
fn queries_are_matched_to_responses_by_client_and_id() {
    let mut matcher = Matcher::new(clock());
    assert!(
        matcher
            .on_message(seen(0, 40000, 1, false, 0, "a.shop"))
            .is_empty()
    );
    assert!(
        matcher
            .on_message(seen(1, 40000, 2, false, 0, "b.shop"))
            .is_empty()
    );
    // Same id from another port: another query.
    assert!(
        matcher
            .on_message(seen(2, 40001, 1, false, 0, "c.shop"))
            .is_empty()
    );
    let done = matcher.on_message(seen(3, 40000, 2, true, 3, "b.shop"));
    assert_eq!(done.len(), 1);
    assert_eq!(
        (
            done[0].name.as_str(),
            done[0].rcode.as_deref(),
            done[0].latency_ms
        ),
        ("b.shop", Some("NXDOMAIN"), Some(2.0))
    );
    assert_eq!(done[0].time.to_rfc3339(), "2026-08-06T13:46:36.001+00:00");
    assert_eq!(matcher.pending(), 2);
    // Nothing for 5 s after the first query yet, then it is written unanswered.
    assert!(matcher.expire(5_000_000_000).is_empty());
    let expired = matcher.expire(5_001_500_000);
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (expired[0].name.as_str(), expired[0].rcode.as_deref()),
        ("a.shop", None)
    );
    assert_eq!(expired[0].latency_ms, None);
    let rest = matcher.finish();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].name, "c.shop");
    assert_eq!(matcher.pending(), 0);
}

#[test]
fn retransmissions_and_lone_responses_each_make_a_record() {
    let mut matcher = Matcher::new(clock());
    assert!(
        matcher
            .on_message(seen(0, 40000, 1, false, 0, "a"))
            .is_empty()
    );
    let first = matcher.on_message(seen(5000, 40000, 1, false, 0, "a"));
    assert_eq!((first.len(), first[0].rcode.as_deref()), (1, None));
    let second = matcher.on_message(seen(5001, 40000, 1, true, 0, "a"));
    assert_eq!(second[0].rcode.as_deref(), Some("NOERROR"));
    assert_eq!(second[0].latency_ms, Some(1.0));
    // A response whose query was not seen: written at once, with its own time.
    let lone = matcher.on_message(seen(6000, 40002, 9, true, 3, "b"));
    assert_eq!(
        (lone[0].name.as_str(), lone[0].rcode.as_deref()),
        ("b", Some("NXDOMAIN"))
    );
    assert_eq!(lone[0].latency_ms, None);
    assert_eq!(matcher.pending(), 0);
}

fn event(dir: usize, protocol: u8, message: &[u8]) -> DnsEvent {
    let mut event = DnsEvent {
        len: message.len() as u16,
        dir: dir as u8,
        protocol,
        netns: 7,
        time_ns: 42,
        ..Default::default()
    };
    event.payload[..message.len()].copy_from_slice(message);
    event.original.family = FAMILY_IPV4;
    event.original.protocol = protocol;
    event.original.src.addr[..4].copy_from_slice(&[10, 244, 1, 9]);
    event.original.src.port = 40000;
    event.original.dst.addr[..4].copy_from_slice(&[10, 96, 0, 10]);
    event.original.dst.port = 53;
    event
}

/// The one result of a UDP record.
fn one(event: &DnsEvent) -> Result<Seen, DnsError> {
    let mut results = from_event(event, &mut Streams::default());
    assert_eq!(results.len(), 1);
    results.remove(0)
}

#[test]
fn kernel_records_decode_with_their_direction() {
    let query = build(5, false, 0, "checkout", A);
    let seen = one(&event(ORIGINAL, PROTO_UDP, &query)).unwrap();
    assert_eq!(seen.client.to_string(), "10.244.1.9:40000");
    assert_eq!(seen.server.to_string(), "10.96.0.10:53");
    assert_eq!((seen.response, seen.time_ns, seen.netns), (false, 42, 7));
    assert_eq!(seen.message.name, "checkout");
    assert_eq!(seen.proto, Proto::Udp);
    // A query on the server's direction is not what it claims.
    assert_eq!(
        one(&event(REPLY, PROTO_UDP, &query)),
        Err(DnsError::Direction("query", "server"))
    );
    // A length beyond the payload array is clamped, not trusted.
    let mut lying = event(ORIGINAL, PROTO_UDP, &query);
    lying.len = u16::MAX;
    assert_eq!(one(&lying).unwrap().message, seen.message);
    assert_eq!(one(&event(ORIGINAL, 1, &query)), Err(DnsError::Protocol(1)));
}

/// A TCP segment of the connection `event` builds: `seq`, `segment` payload bytes of
/// which `bytes` were copied.
fn segment(dir: usize, seq: u32, segment: u32, bytes: &[u8]) -> DnsEvent {
    let mut event = event(dir, PROTO_TCP, bytes);
    event.seq = seq;
    event.segment = segment;
    event
}

fn framed(messages: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for message in messages {
        out.extend_from_slice(&(message.len() as u16).to_be_bytes());
        out.extend_from_slice(message);
    }
    out
}

#[test]
fn tcp_segments_decode_each_message_that_starts_in_them() {
    let mut streams = Streams::default();
    // glibc writes the A and AAAA queries in one segment.
    let a = build(1, false, 0, "checkout.shop.svc.cluster.local", A);
    let aaaa = build(2, false, 0, "checkout.shop.svc.cluster.local", AAAA);
    let both = framed(&[&a, &aaaa]);
    let seen = from_event(
        &segment(ORIGINAL, 1000, both.len() as u32, &both),
        &mut streams,
    );
    let ids: Vec<(u16, u16, Proto)> = seen
        .iter()
        .map(|s| {
            let s = s.as_ref().unwrap();
            (s.message.id, s.message.qtype, s.proto)
        })
        .collect();
    assert_eq!(ids, [(1, A, Proto::Tcp), (2, AAAA, Proto::Tcp)]);
    // Its retransmission starts nothing new.
    let again = segment(ORIGINAL, 1000, both.len() as u32, &both);
    assert!(from_event(&again, &mut streams).is_empty());
    // The responses, on the other direction, are a stream of their own.
    let response = build(1, true, 3, "checkout.shop.svc.cluster.local", A);
    let bytes = framed(&[&response]);
    let replies = from_event(&segment(REPLY, 7, bytes.len() as u32, &bytes), &mut streams);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].as_ref().unwrap().message.rcode, 3);
    assert_eq!(streams.len(), 2);
    // A second message past the copied bytes is counted, not guessed.
    let long = build(3, false, 0, &"a".repeat(60), A);
    let many = framed(&[&long, &long, &long, &long, &long]);
    let next = 1000 + both.len() as u32;
    let results = from_event(
        &segment(ORIGINAL, next, many.len() as u32, &many[..DNS_PREFIX]),
        &mut streams,
    );
    // Three whole messages, one whose question the copied bytes cut, one whose length
    // lies past them.
    assert_eq!(results.len(), 5);
    assert!(
        results[..3]
            .iter()
            .all(|r| r.as_ref().unwrap().message.id == 3)
    );
    assert_eq!(
        results[3],
        Err(DnsError::Wire(WireError::PastEnd { len: 14 }))
    );
    assert_eq!(results[4], Err(DnsError::PastPrefix(DNS_PREFIX as u16)));
    // Idle streams are forgotten.
    streams.expire(42 + stream::IDLE.as_nanos() as u64 + 1);
    assert!(streams.is_empty());
}
