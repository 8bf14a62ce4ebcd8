//! The parser against messages captured from this machine's kernel (6.18): events of
//! `conntrack -I` / `conntrack -D` with `--dst-nat`, a dump of both entries, and the
//! statistics `conntrack -C` and `conntrack -S` read; then every truncation and
//! corruption of them.

use super::parse::{self, ParseError};
use super::*;

const NEW_TCP4: &[u8] = include_bytes!("fixtures/new_tcp4.bin");
const NEW_UDP6: &[u8] = include_bytes!("fixtures/new_udp6.bin");
const DESTROY_TCP4: &[u8] = include_bytes!("fixtures/destroy_tcp4.bin");
const DESTROY_UDP6: &[u8] = include_bytes!("fixtures/destroy_udp6.bin");
const DUMP: &[u8] = include_bytes!("fixtures/dump.bin");
const DUMP_DONE: &[u8] = include_bytes!("fixtures/dump_done.bin");

/// `conntrack -C` and `conntrack -S` in a namespace of this kernel whose table had been
/// filled to `nf_conntrack_max` (262,144) with entries mostly assured, then sent 40 new
/// UDP flows from each CPU (drops where no entry could be evicted, early drops where
/// one could), then had 22,143 entries deleted. What the tools printed:
/// `240001`, and `cpu=0 ... insert_failed=0 drop=34 early_drop=6`,
/// `cpu=1 ... insert_failed=0 drop=35 early_drop=5`.
const STATS_TABLE: &[u8] = include_bytes!("fixtures/stats_table.bin");
const STATS_CPU: &[u8] = include_bytes!("fixtures/stats_cpu.bin");

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
    // Every byte set to every interesting value: no panic.
    for fixture in [NEW_TCP4, DESTROY_UDP6, STATS_TABLE, STATS_CPU] {
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

/// A request's length, message type and flags.
fn header(request: &[u8]) -> (usize, u16, u16) {
    let kind = u16::from_ne_bytes([request[4], request[5]]);
    let flags = u16::from_ne_bytes([request[6], request[7]]);
    (request.len(), kind, flags)
}

#[test]
fn requests_are_well_formed() {
    assert_eq!(header(&parse::dump_request(7)), (20, 0x101, 0x301));
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

#[test]
fn statistics_of_this_kernel_as_conntrack_prints_them() {
    assert_eq!(
        parse::messages(STATS_TABLE),
        vec![Ok(CtMessage::Table {
            entries: 240_001,
            max_entries: 262_144,
        })]
    );
    let cpus: Vec<CtCpuStats> = parse::messages(STATS_CPU)
        .into_iter()
        .map(|m| match m {
            Ok(CtMessage::CpuStats(cpu)) => cpu,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        cpus,
        [
            CtCpuStats {
                insert_failed: 0,
                drop: 34,
                early_drop: 6,
            },
            CtCpuStats {
                insert_failed: 0,
                drop: 35,
                early_drop: 5,
            },
        ]
    );
    assert_eq!(
        super::table_stats(240_001, 262_144, &cpus),
        CtStats {
            entries: 240_001,
            max_entries: 262_144,
            insert_failed: 0,
            drop: 69,
            early_drop: 11,
        }
    );
}

#[test]
fn broken_statistics_are_errors_never_a_panic() {
    // Each message on its own, cut anywhere: its length says more than was received.
    for fixture in [STATS_TABLE, &STATS_CPU[..100], &STATS_CPU[100..]] {
        for len in 1..fixture.len() {
            assert!(
                parse::messages(&fixture[..len]).iter().any(Result::is_err),
                "{len}"
            );
        }
    }
    // Without the maximum (the second attribute's type zeroed): incomplete.
    let mut bad = STATS_TABLE.to_vec();
    bad[30..32].copy_from_slice(&0u16.to_ne_bytes());
    assert_eq!(
        parse::messages(&bad),
        vec![Err(ParseError::Missing("CTA_STATS_GLOBAL_MAX_ENTRIES"))]
    );
    // A counter of the wrong size.
    let mut bad = STATS_CPU[..100].to_vec();
    bad[52..54].copy_from_slice(&6u16.to_ne_bytes());
    assert_eq!(
        parse::messages(&bad),
        vec![Err(ParseError::Size("CTA_STATS_DROP"))]
    );
    // A counter the kernel leaves out counts 0; other attributes are passed over.
    let mut fewer = STATS_CPU[..100].to_vec();
    fewer[54..56].copy_from_slice(&0x40u16.to_ne_bytes());
    assert_eq!(
        parse::messages(&fewer),
        vec![Ok(CtMessage::CpuStats(CtCpuStats {
            insert_failed: 0,
            drop: 0,
            early_drop: 6,
        }))]
    );
}

#[test]
fn statistics_requests_are_what_conntrack_sends() {
    // `conntrack -C` sends GET_STATS (0x105) with NLM_F_REQUEST; observer adds NLM_F_ACK
    // to know where the answer ends. `conntrack -S` dumps GET_STATS_CPU (0x104).
    let table = parse::table_request(3);
    assert_eq!(header(&table), (20, 0x105, 0x5));
    assert_eq!(&table[8..12], &3u32.to_ne_bytes(), "the sequence number");
    let cpu = parse::cpu_stats_request(4);
    assert_eq!(header(&cpu), (20, 0x104, 0x301));
    assert_eq!(&cpu[16..], &[0, 0, 0, 0], "nfgenmsg: AF_UNSPEC, version 0");
}

#[test]
fn a_namespace_is_used_once_conntrack_holds_or_counts_anything() {
    let idle = CtStats {
        max_entries: 262_144,
        ..Default::default()
    };
    assert!(!idle.used());
    assert!(CtStats { entries: 1, ..idle }.used());
    assert!(
        CtStats {
            early_drop: 1,
            ..idle
        }
        .used()
    );
}
