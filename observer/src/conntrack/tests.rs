//! The parser against messages captured from this machine's kernel (6.18): events of
//! `conntrack -I` / `conntrack -D` with `--dst-nat`, and a dump of both entries; then
//! every truncation and corruption of them.

use super::parse::{self, ParseError};
use super::*;

const NEW_TCP4: &[u8] = include_bytes!("fixtures/new_tcp4.bin");
const NEW_UDP6: &[u8] = include_bytes!("fixtures/new_udp6.bin");
const DESTROY_TCP4: &[u8] = include_bytes!("fixtures/destroy_tcp4.bin");
const DESTROY_UDP6: &[u8] = include_bytes!("fixtures/destroy_udp6.bin");
const DUMP: &[u8] = include_bytes!("fixtures/dump.bin");
const DUMP_DONE: &[u8] = include_bytes!("fixtures/dump_done.bin");

fn tcp4() -> (CtTuple, CtTuple) {
    (
        CtTuple {
            protocol: 6,
            src: "10.244.1.9:45364".parse().unwrap(),
            dst: "10.96.35.226:80".parse().unwrap(),
        },
        CtTuple {
            protocol: 6,
            src: "10.244.1.13:8080".parse().unwrap(),
            dst: "10.244.1.9:45364".parse().unwrap(),
        },
    )
}

fn udp6() -> (CtTuple, CtTuple) {
    (
        CtTuple {
            protocol: 17,
            src: "[fd00::9]:5353".parse().unwrap(),
            dst: "[fd00:96::10]:53".parse().unwrap(),
        },
        CtTuple {
            protocol: 17,
            src: "[fd00:244::14]:53".parse().unwrap(),
            dst: "[fd00::9]:5353".parse().unwrap(),
        },
    )
}

fn only(buf: &[u8]) -> (CtKind, CtEntry) {
    let messages = parse::messages(buf);
    assert_eq!(messages.len(), 1, "{messages:?}");
    match messages.into_iter().next().unwrap() {
        Ok(CtMessage::Conntrack(kind, entry)) => (kind, entry),
        other => panic!("{other:?}"),
    }
}

#[test]
fn new_and_destroy_events_of_this_kernel() {
    let (kind, entry) = only(NEW_TCP4);
    assert_eq!(kind, CtKind::New);
    assert_eq!((entry.original, entry.reply), tcp4());
    assert!(entry.dnat(), "{:#x}", entry.status);
    assert!(entry.id.is_some());
    // Timestamps are off here (nf_conntrack_timestamp=0).
    assert_eq!(entry.start_ns, None);
    assert_eq!(entry.tcp_state, Some(tcp_state::ESTABLISHED));

    let (kind, v6) = only(NEW_UDP6);
    assert_eq!(kind, CtKind::New);
    assert_eq!((v6.original, v6.reply), udp6());
    assert!(v6.dnat());

    let (kind, gone) = only(DESTROY_TCP4);
    assert_eq!(kind, CtKind::Destroy);
    assert_eq!((gone.original, gone.reply), tcp4());
    assert_eq!(gone.id, entry.id, "the same entry");
    let (kind, gone6) = only(DESTROY_UDP6);
    assert_eq!((kind, gone6.original), (CtKind::Destroy, udp6().0));
}

#[test]
fn a_dump_of_this_kernel() {
    let messages = parse::messages(DUMP);
    let entries: Vec<CtEntry> = messages
        .into_iter()
        .map(|m| match m {
            Ok(CtMessage::Conntrack(CtKind::Entry, entry)) => entry,
            other => panic!("{other:?}"),
        })
        .collect();
    let mut tuples: Vec<CtTuple> = entries.iter().map(|e| e.original).collect();
    tuples.sort_by_key(|t| t.protocol);
    assert_eq!(tuples, vec![tcp4().0, udp6().0]);
    assert!(entries.iter().all(CtEntry::dnat));
    assert_eq!(parse::messages(DUMP_DONE), vec![Ok(CtMessage::Done)]);
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    for fixture in [NEW_TCP4, NEW_UDP6, DESTROY_TCP4, DESTROY_UDP6, DUMP] {
        for len in 0..fixture.len() {
            let cut = &fixture[..len];
            for message in parse::messages(cut) {
                // A shorter header length inside a shorter buffer may still parse:
                // only a complete entry may come out.
                if let Ok(CtMessage::Conntrack(_, entry)) = message {
                    assert!(entry.original.protocol == 6 || entry.original.protocol == 17);
                }
            }
            // A single message cut anywhere: its length says more than was received.
            if len > 0 && fixture != DUMP {
                assert!(parse::messages(cut).iter().any(Result::is_err), "{len}");
            }
        }
    }
}

#[test]
fn corrupted_lengths_and_attributes_are_errors() {
    // Every byte set to every interesting value: no panic, and no entry with a
    // protocol the fixture never had.
    for fixture in [NEW_TCP4, DESTROY_UDP6] {
        for at in 0..fixture.len() {
            for value in [0u8, 1, 3, 4, 0x7f, 0x80, 0xff] {
                let mut bad = fixture.to_vec();
                bad[at] = value;
                let _ = parse::messages(&bad);
            }
        }
    }
    // The netlink length smaller than its own header.
    let mut bad = NEW_TCP4.to_vec();
    bad[..4].copy_from_slice(&8u32.to_ne_bytes());
    assert_eq!(
        parse::messages(&bad),
        vec![Err(ParseError::Length { len: 8, left: 232 })]
    );
    // An attribute claiming more bytes than its message holds.
    let mut bad = NEW_TCP4.to_vec();
    bad[20..22].copy_from_slice(&0xfff0u16.to_ne_bytes());
    assert!(matches!(
        parse::messages(&bad)[0],
        Err(ParseError::Attribute { .. })
    ));
    // Without its original tuple (the attribute's type zeroed), an entry is incomplete.
    let mut bad = NEW_TCP4.to_vec();
    bad[22..24].copy_from_slice(&0x8000u16.to_ne_bytes());
    assert_eq!(
        parse::messages(&bad),
        vec![Err(ParseError::Missing("CTA_TUPLE_ORIG"))]
    );
    assert!(parse::messages(&[]).is_empty());
}

#[test]
fn requests_are_well_formed() {
    let dump = parse::dump_request(7);
    assert_eq!(dump.len(), 20);
    assert_eq!(u16::from_ne_bytes([dump[4], dump[5]]), 0x101);
    assert_eq!(u16::from_ne_bytes([dump[6], dump[7]]), 0x301);
    // A get request carries the tuple as the kernel's own events do: parse it back.
    for (tuple, _) in [tcp4(), udp6()] {
        let get = parse::get_request(1, &tuple);
        assert_eq!(get.len() % 4, 0);
        let attrs = &get[20..];
        // Wrap it as an entry with a reply tuple and status to reuse the parser.
        let mut message = get[..20].to_vec();
        message[4..6].copy_from_slice(&0x100u16.to_ne_bytes());
        message.extend_from_slice(attrs);
        let reply = &attrs.to_vec();
        let mut as_reply = reply.clone();
        as_reply[2..4].copy_from_slice(&(2u16 | 0x8000).to_ne_bytes());
        message.extend_from_slice(&as_reply);
        message.extend_from_slice(&8u16.to_ne_bytes());
        message.extend_from_slice(&3u16.to_ne_bytes());
        message.extend_from_slice(&IPS_DST_NAT.to_be_bytes());
        let len = message.len() as u32;
        message[..4].copy_from_slice(&len.to_ne_bytes());
        let (_, entry) = only(&message);
        assert_eq!(entry.original, tuple);
        assert!(entry.dnat());
    }
}

#[test]
fn a_kernel_without_conntrack_netlink_is_told_apart_from_other_failures() {
    use std::io::Error;
    // nfnetlink without nf_conntrack_netlink; no nfnetlink at all.
    assert!(netlink_missing(&Error::from_raw_os_error(libc::EINVAL)));
    assert!(netlink_missing(&Error::from_raw_os_error(
        libc::EPROTONOSUPPORT
    )));
    for other in [libc::EPERM, libc::ENOENT, libc::ENOBUFS] {
        assert!(!netlink_missing(&Error::from_raw_os_error(other)));
    }
    assert!(!netlink_missing(&Error::other("not an errno")));
    // One sentence that names the module and what is lost without it.
    assert!(NETLINK_MISSING.contains("module nf_conntrack_netlink is not loaded"));
    assert!(NETLINK_MISSING.contains("cannot adopt connections that began before it"));
    assert_eq!(NETLINK_MISSING.matches(". ").count(), 0);
}
