//! Matching conntrack's entries to kernel connections, without root: entries found at start, adoption, destroy events.

use observer_common::conn::{EVENT_CLOSE, Endpoint, FAMILY_IPV4, FlowTuple, PROTO_TCP, PROTO_UDP};

use super::*;

/// The state bits these tests set, as arguments of `event`.
mod flags {
    pub const START_SEEN: u32 = 1 << 0;
    pub const SEQ_KNOWN_REPLY: u32 = 1 << 1;
}
use crate::conntrack::IPS_DST_NAT;

const NETNS: u32 = 4026532301;

fn now() -> DateTime<Utc> {
    "2026-08-06T13:46:40Z".parse().unwrap()
}

fn entry(protocol: u8, client_port: u16, tcp: Option<u8>) -> CtEntry {
    CtEntry {
        original: CtTuple {
            protocol,
            src: format!("10.244.1.9:{client_port}").parse().unwrap(),
            dst: "10.96.35.226:80".parse().unwrap(),
        },
        reply: CtTuple {
            protocol,
            src: "10.244.1.13:8080".parse().unwrap(),
            dst: format!("10.244.1.9:{client_port}").parse().unwrap(),
        },
        status: IPS_DST_NAT,
        id: Some(1),
        start_ns: None,
        tcp_state: tcp,
    }
}

fn endpoint(ip: [u8; 4], port: u16) -> Endpoint {
    let mut addr = [0; 16];
    addr[..4].copy_from_slice(&ip);
    Endpoint {
        addr,
        port,
        _pad: [0; 2],
    }
}

fn event(kind: u32, conntrack: u64, client_port: u16, flags: u32) -> ConnEvent {
    let tuple = |src, dst| FlowTuple {
        src,
        dst,
        family: FAMILY_IPV4,
        protocol: PROTO_TCP,
        _pad: 0,
    };
    ConnEvent {
        kind,
        conntrack,
        state: ConnState {
            start_ns: 5,
            netns: NETNS,
            start_seen: u8::from(flags & flags::START_SEEN != 0),
            seq_known: [0, u8::from(flags & flags::SEQ_KNOWN_REPLY != 0)],
            original: tuple(
                endpoint([10, 244, 1, 9], client_port),
                endpoint([10, 96, 35, 226], 80),
            ),
            reply: tuple(
                endpoint([10, 244, 1, 13], 8080),
                endpoint([10, 244, 1, 9], client_port),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The id of `event(_, conntrack, ..)`'s connection (start 5), or with another start.
fn id(conntrack: u64, start_ns: u64) -> ConnId {
    ConnId {
        conntrack,
        start_ns,
    }
}

fn key(client_port: u16) -> CtKey {
    CtKey::of_entry(NETNS, &entry(PROTO_TCP, client_port, None))
}

#[test]
fn found_at_start_keeps_open_dnat_tcp_and_udp() {
    let mut view = ConntrackMatcher::default();
    let mut not_dnat = entry(PROTO_TCP, 1, Some(tcp_state::ESTABLISHED));
    not_dnat.status = 0;
    let mut stamped = entry(PROTO_UDP, 2, None);
    stamped.start_ns = Some(1_786_023_960_000_000_000);
    let entries = vec![
        not_dnat,
        entry(PROTO_TCP, 3, Some(tcp_state::TIME_WAIT)),
        entry(1, 4, None),
        stamped,
        entry(PROTO_TCP, 5, Some(tcp_state::ESTABLISHED)),
    ];
    let found = view.found_at_start(NETNS, entries, now());
    let ports: Vec<(Proto, u16)> = found
        .iter()
        .map(|(_, r)| (r.proto, r.client.port()))
        .collect();
    assert_eq!(ports, vec![(Proto::Udp, 2), (Proto::Tcp, 5)]);
    let (_, udp) = &found[0];
    assert_eq!(
        (udp.start_seen, udp.close, udp.end, udp.requests),
        (false, Close::Open, None, 0)
    );
    // conntrack's own start (nf_conntrack_timestamp), 40 s before the dump.
    assert_eq!(
        udp.start,
        "2026-08-06T13:46:00Z".parse::<DateTime<Utc>>().unwrap()
    );
    assert_eq!(udp.duration_ms, 40_000.0);
    assert_eq!(found[1].1.start, now());
}

#[test]
fn a_found_connection_continues_as_the_kernels() {
    let mut view = ConntrackMatcher::default();
    let found = view.found_at_start(NETNS, vec![entry(PROTO_TCP, 7, Some(3))], now());
    let found_id = found[0].0;
    view.on_kernel_event(&event(EVENT_OPEN, 0xffff_8880_0000_1000, 7, 0));
    let kernel_id = ConnId {
        conntrack: 0xffff_8880_0000_1000,
        start_ns: 5,
    };
    let mut record = found[0].1.clone();
    record.start = now() + chrono::Duration::seconds(2);
    record.duration_ms = 1000.0;
    record.requests = 2;
    let rewritten = |view: &mut ConntrackMatcher, record: &ConnRecord| {
        let (mut id, mut record) = (kernel_id, record.clone());
        view.rewrite(&mut id, &mut record);
        (id, record)
    };
    let (id, progress) = rewritten(&mut view, &record);
    assert_eq!(
        (id, progress.start, progress.duration_ms),
        (found_id, now(), 3000.0)
    );
    record.close = Close::Fin;
    let (id, last) = rewritten(&mut view, &record);
    assert_eq!((id, last.requests), (found_id, 2));
    // Once final, the mapping is gone.
    assert_eq!(rewritten(&mut view, &record).0, kernel_id);
    assert!(view.finish(now()).is_empty(), "recorded once");
}

#[test]
fn a_connection_begun_after_attach_is_not_adopted() {
    let mut view = ConntrackMatcher::default();
    view.found_at_start(NETNS, vec![entry(PROTO_TCP, 8, Some(3))], now());
    view.on_kernel_event(&event(
        EVENT_OPEN,
        0xffff_8880_0000_2000,
        8,
        flags::START_SEEN,
    ));
    let id = ConnId {
        conntrack: 0xffff_8880_0000_2000,
        start_ns: 5,
    };
    let mut record = ConntrackMatcher::default().found_at_start(
        NETNS,
        vec![entry(PROTO_TCP, 8, Some(3))],
        now(),
    )[0]
    .1
    .clone();
    let mut rewritten = id;
    view.rewrite(&mut rewritten, &mut record);
    assert_eq!(rewritten, id);
    assert!(view.finish(now()).is_empty());
}

#[test]
fn destroy_events_end_found_and_kernel_connections_once() {
    let mut view = ConntrackMatcher::default();
    view.found_at_start(NETNS, vec![entry(PROTO_TCP, 9, Some(3))], now());
    view.on_kernel_event(&event(EVENT_OPEN, 0xa000, 10, flags::START_SEEN));
    view.on_kernel_event(&event(EVENT_OPEN, 0xb000, 11, flags::START_SEEN));
    view.on_kernel_event(&event(EVENT_CLOSE, 0xb000, 11, flags::START_SEEN));
    let established = |port| entry(PROTO_TCP, port, Some(tcp_state::ESTABLISHED));
    assert!(view.matters(&key(9), &established(9)) && view.matters(&key(10), &established(10)));
    assert!(
        !view.matters(&key(11), &established(11)),
        "closed by FIN first"
    );
    let later = now() + chrono::Duration::seconds(3);
    match view.destroyed(&key(9), &established(9), later) {
        Destroyed::Found(_, record) => {
            assert_eq!(
                (record.close, record.end, record.duration_ms),
                (Close::Expired, Some(later), 3000.0)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        view.destroyed(&key(10), &established(10), later),
        Destroyed::Kernel(id(0xa000, 5))
    );
    assert_eq!(
        view.destroyed(&key(10), &established(10), later),
        Destroyed::Unknown
    );
    assert_eq!(
        view.destroyed(&key(11), &established(11), later),
        Destroyed::Unknown
    );
}

#[test]
fn a_closed_entry_destroyed_never_ends_the_newer_connection_on_its_tuple() {
    // A new SYN on a tuple in TIME_WAIT: conntrack kills the old entry and may place
    // the new one at the same address. The old entry's destroy event comes after the
    // new connection's open.
    let mut view = ConntrackMatcher::default();
    view.on_kernel_event(&event(EVENT_OPEN, 0xa000, 12, flags::START_SEEN));
    view.on_kernel_event(&event(EVENT_CLOSE, 0xa000, 12, flags::START_SEEN));
    view.on_kernel_event(&event(EVENT_OPEN, 0xa000, 12, flags::START_SEEN));
    for state in [tcp_state::TIME_WAIT, tcp_state::CLOSE] {
        let old = entry(PROTO_TCP, 12, Some(state));
        assert!(!view.matters(&key(12), &old));
        assert_eq!(view.destroyed(&key(12), &old, now()), Destroyed::Unknown);
    }
    // The newer connection's own entry, flushed while established, ends it.
    let flushed = entry(PROTO_TCP, 12, Some(tcp_state::ESTABLISHED));
    assert!(view.matters(&key(12), &flushed));
    assert_eq!(
        view.destroyed(&key(12), &flushed, now()),
        Destroyed::Kernel(id(0xa000, 5))
    );
}

#[test]
fn found_tcp_entries_are_asked_about_in_turn_and_end_by_state() {
    let mut view = ConntrackMatcher::default();
    let entries = (20..23)
        .map(|port| entry(PROTO_TCP, port, Some(3)))
        .collect();
    view.found_at_start(NETNS, entries, now());
    view.found_at_start(NETNS, vec![entry(PROTO_UDP, 30, None)], now());
    assert_eq!(view.to_check(2), vec![key(20), key(21)]);
    assert_eq!(view.to_check(2), vec![key(22), key(20)]);
    let established = entry(PROTO_TCP, 20, Some(tcp_state::ESTABLISHED));
    assert_eq!(view.checked(&key(20), Some(&established), now()), None);
    let closes = [
        (
            20,
            Some(entry(PROTO_TCP, 20, Some(tcp_state::TIME_WAIT))),
            Close::Fin,
        ),
        (
            21,
            Some(entry(PROTO_TCP, 21, Some(tcp_state::CLOSE))),
            Close::Rst,
        ),
        (22, None, Close::Expired),
    ];
    for (port, answer, close) in closes {
        let (_, record) = view.checked(&key(port), answer.as_ref(), now()).unwrap();
        assert_eq!((record.close, record.start_seen), (close, false));
    }
    assert_eq!(view.finish(now()).len(), 1, "the UDP one, still open");
}

#[test]
fn a_destroyed_connection_that_idled_out_is_a_timeout() {
    const SECOND: u64 = 1_000_000_000;
    let mut state = event(
        EVENT_OPEN,
        1,
        40,
        flags::START_SEEN | flags::SEQ_KNOWN_REPLY,
    )
    .state;
    state.last_ns = 100 * SECOND;
    let idle = 30 * SECOND;
    // Answered TCP never idles: conntrack removing it is the news.
    assert_eq!(
        destroyed_close(&state, 131 * SECOND, idle),
        (Close::Expired, 131 * SECOND)
    );
    // UDP silent for the idle timeout: observer's own sweep would end it so.
    state.original.protocol = PROTO_UDP;
    assert_eq!(
        destroyed_close(&state, 131 * SECOND, idle),
        (Close::Timeout, 100 * SECOND)
    );
    // UDP flushed while still talking.
    assert_eq!(
        destroyed_close(&state, 110 * SECOND, idle),
        (Close::Expired, 110 * SECOND)
    );
}

#[test]
fn a_newer_entry_for_the_same_tuple_supersedes_the_followed_one() {
    let mut view = ConntrackMatcher::default();
    view.on_kernel_event(&event(EVENT_OPEN, 0xa000, 50, flags::START_SEEN));
    view.on_kernel_event(&event(EVENT_OPEN, 0xa000, 50, flags::START_SEEN));
    assert!(view.take_superseded().is_empty(), "the same entry again");
    // Its close was missed; the client's port is reused for a new entry.
    view.on_kernel_event(&event(EVENT_OPEN, 0xb000, 50, flags::START_SEEN));
    assert_eq!(view.take_superseded(), vec![(id(0xa000, 5), key(50))]);
    assert!(view.take_superseded().is_empty());
    // A sweep that finds both in the table keeps the newer.
    let mut old = event(EVENT_OPEN, 0xa000, 50, 0).state;
    old.start_ns = 1;
    let mut new = old;
    new.start_ns = 9;
    view.on_sweep(&[(0xb000, new), (0xa000, old)]);
    assert_eq!(
        view.take_superseded(),
        vec![(
            ConnId {
                conntrack: 0xa000,
                start_ns: 1
            },
            key(50)
        )]
    );
    let flushed = entry(PROTO_TCP, 50, Some(tcp_state::ESTABLISHED));
    assert_eq!(
        view.destroyed(&key(50), &flushed, now()),
        Destroyed::Kernel(id(0xb000, 9))
    );
}

#[test]
fn an_entry_not_confirmed_yet_supersedes_nothing() {
    // A clash: two CPUs each made an entry for the flow's first datagrams, and the
    // netfilter hook saw both before conntrack confirmed either.
    let mut view = ConntrackMatcher::default();
    let unconfirmed = |conntrack| {
        let mut event = event(EVENT_OPEN, conntrack, 50, flags::START_SEEN);
        event.state.unconfirmed = 1;
        event
    };
    view.on_kernel_event(&unconfirmed(0xa000));
    view.on_kernel_event(&unconfirmed(0xb000));
    assert!(view.take_superseded().is_empty(), "the winner lives on");
    // A sweep finds the winner confirmed, the loser not (yet ended): the winner stays.
    let mut winner = unconfirmed(0xa000).state;
    winner.start_ns = 1;
    winner.unconfirmed = 0;
    let mut loser = unconfirmed(0xb000).state;
    loser.start_ns = 2;
    view.on_sweep(&[(0xa000, winner), (0xb000, loser)]);
    assert!(view.take_superseded().is_empty(), "the loser is newer");
    // Once confirmed, a newer entry does supersede.
    loser.unconfirmed = 0;
    view.on_sweep(&[(0xa000, winner), (0xb000, loser)]);
    assert_eq!(view.take_superseded(), vec![(id(0xa000, 1), key(50))]);
}

#[test]
fn connections_older_than_their_subscription_lack_destroy_events() {
    let mut state = event(EVENT_OPEN, 0xa000, 13, flags::START_SEEN).state;
    state.start_ns = 1_000;
    assert!(!lacks_destroy_events(&state, Some(999)), "began after it");
    assert!(lacks_destroy_events(&state, Some(1_001)), "began before it");
    assert!(lacks_destroy_events(&state, None), "never subscribed");
    state.start_seen = 0;
    assert!(
        lacks_destroy_events(&state, Some(0)),
        "adopted mid-connection"
    );
}

#[test]
fn a_clash_loser_kept_as_an_entry_of_its_own_and_its_winner_supersede_neither() {
    // The flow's first datagrams on two CPUs were DNATed to two pods: conntrack keeps
    // the loser, with the winner's original tuple and its own reply tuple, until its
    // first reply (nf_ct_resolve_clash_harder).
    let mut view = ConntrackMatcher::default();
    let mut winner = event(EVENT_OPEN, 0xa000, 50, flags::START_SEEN);
    winner.state.start_ns = 1;
    let mut loser = event(EVENT_OPEN, 0xb000, 50, flags::START_SEEN);
    loser.state.start_ns = 2;
    loser.state.reply.src = endpoint([10, 244, 1, 14], 8080);
    view.on_kernel_event(&winner);
    view.on_kernel_event(&loser);
    view.on_sweep(&[(0xb000, loser.state), (0xa000, winner.state)]);
    assert!(view.take_superseded().is_empty(), "both live on");
    assert_eq!(view.all_kernel_connections().len(), 2);
    // The loser's destroy event (after its reply) ends the loser only.
    let mut loser_entry = entry(PROTO_TCP, 50, None);
    loser_entry.reply.src = "10.244.1.14:8080".parse().unwrap();
    let loser_key = CtKey::of_entry(NETNS, &loser_entry);
    assert!(
        !loser_key.is(&entry(PROTO_TCP, 50, None)),
        "the winner's entry"
    );
    assert_eq!(
        view.destroyed(&loser_key, &loser_entry, now()),
        Destroyed::Kernel(id(0xb000, 2))
    );
    assert_eq!(
        view.all_kernel_connections(),
        vec![(id(0xa000, 1), key(50))]
    );
}
