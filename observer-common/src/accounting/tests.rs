//! The kernel programs' per-packet accounting, exercised on the host: the same functions
//! `observer-ebpf/src/conn.rs` calls on every packet (its compiled instructions did not
//! change when they moved here).

use super::*;
use crate::conn::{CLOSE_FIN, CLOSE_NONE, CLOSE_RST, ConnState, ORIGINAL, PROTO_UDP, REPLY};

/// One connection as the programs keep it, with a plain add standing in for `BPF_XADD`.
struct Conn(ConnState);

impl Conn {
    /// A TCP connection whose first packet (the client's SYN) was seen.
    fn tcp() -> Conn {
        let mut state = ConnState {
            start_seen: 1,
            ..ConnState::default()
        };
        state.original.protocol = PROTO_TCP;
        Conn(state)
    }

    /// A UDP flow whose first datagram was seen.
    fn udp() -> Conn {
        let mut state = ConnState {
            start_seen: 1,
            ..ConnState::default()
        };
        state.original.protocol = PROTO_UDP;
        Conn(state)
    }

    /// Accounts `packet`; returns (close reason, fresh bytes).
    fn see(&mut self, dir: usize, packet: Packet, now: u64) -> (u32, u32) {
        // SAFETY: `self.0` is a live ConnState, exclusively borrowed here.
        unsafe {
            account(&raw mut self.0, dir, &packet, now, |target, value| {
                // `target` is `self.0.fins`: aligned, and no one else adds to it.
                *target += value
            })
        }
    }

    fn refuses(&self) -> bool {
        // SAFETY: `self.0` is a live ConnState.
        unsafe { refuses(&raw const self.0) }
    }
}

fn tcp(flags: u8, seq: u32, payload: u32) -> Packet {
    Packet {
        protocol: PROTO_TCP,
        tcp_flags: flags,
        seq,
        payload,
        dev: 0,
        skb: 0,
        payload_at: 0,
        linear: 0,
    }
}

fn udp(dev: u64, skb: u64, payload: u32) -> Packet {
    Packet {
        protocol: PROTO_UDP,
        tcp_flags: 0,
        seq: 0,
        payload,
        dev,
        skb,
        payload_at: 0,
        linear: 0,
    }
}

/// Handshake, two request/response exchanges and a FIN from each side, each packet seen
/// twice (on the pod's veth and the bridge): every byte counted once, two requests.
#[test]
fn a_keep_alive_exchange_counts_each_byte_and_request_once() {
    let mut conn = Conn::tcp();
    let packets = [
        (ORIGINAL, tcp(TCP_SYN, 1000, 0)),
        (REPLY, tcp(TCP_SYN | TCP_ACK, 5000, 0)),
        (ORIGINAL, tcp(TCP_ACK, 1001, 0)),
        (ORIGINAL, tcp(TCP_ACK, 1001, 82)),
        (REPLY, tcp(TCP_ACK, 5001, 148)),
        (ORIGINAL, tcp(TCP_ACK, 1083, 82)),
        (REPLY, tcp(TCP_ACK, 5149, 148)),
    ];
    let mut fresh = 0;
    for (now, (dir, packet)) in packets.into_iter().enumerate() {
        for _device in 0..2 {
            let (close, bytes) = conn.see(
                dir,
                tcp(packet.tcp_flags, packet.seq, packet.payload),
                now as u64 + 10,
            );
            assert_eq!(close, CLOSE_NONE);
            fresh += bytes;
        }
    }
    assert_eq!(fresh, 2 * 82 + 2 * 148);
    assert_eq!(conn.0.bytes, [164, 296]);
    assert_eq!(conn.0.requests, 2);
    assert_eq!(conn.0.synack_ns, 11, "the SYN-ACK's time");
    assert_eq!((conn.0.isn, conn.0.syn_seen), (1000, 1));
    assert_eq!(conn.0.last_ns, 16);

    assert_eq!(
        conn.see(ORIGINAL, tcp(TCP_FIN | TCP_ACK, 1165, 0), 20),
        (CLOSE_NONE, 0)
    );
    // A retransmitted FIN of the same side is still one side.
    assert_eq!(
        conn.see(ORIGINAL, tcp(TCP_FIN | TCP_ACK, 1165, 0), 21),
        (CLOSE_NONE, 0)
    );
    assert_eq!(
        conn.see(REPLY, tcp(TCP_FIN | TCP_ACK, 5297, 0), 22),
        (CLOSE_FIN, 0)
    );
    assert!(both_fins(conn.0.fins));
    assert_eq!((conn.0.rst, conn.0.refused), (0, 0));
}

/// A request sent in several segments before any answer is one request.
#[test]
fn segments_before_an_answer_are_one_request() {
    let mut conn = Conn::tcp();
    conn.see(ORIGINAL, tcp(TCP_SYN, 7, 0), 1);
    conn.see(REPLY, tcp(TCP_SYN | TCP_ACK, 70, 0), 2);
    conn.see(ORIGINAL, tcp(TCP_ACK, 8, 1000), 3);
    conn.see(ORIGINAL, tcp(TCP_ACK, 1008, 1000), 4);
    assert_eq!(conn.0.requests, 1);
    conn.see(REPLY, tcp(TCP_ACK, 71, 10), 5);
    conn.see(ORIGINAL, tcp(TCP_ACK, 2008, 5), 6);
    assert_eq!(conn.0.requests, 2);
    assert_eq!(conn.0.bytes, [2005, 10]);
}

/// A retransmission that overlaps what was seen adds only its new tail; one wholly
/// seen adds nothing.
#[test]
fn retransmissions_add_only_new_bytes() {
    let mut conn = Conn::tcp();
    conn.see(ORIGINAL, tcp(TCP_SYN, 1000, 0), 1);
    assert_eq!(conn.see(ORIGINAL, tcp(TCP_ACK, 1001, 100), 2).1, 100);
    assert_eq!(conn.see(ORIGINAL, tcp(TCP_ACK, 1051, 100), 3).1, 50);
    assert_eq!(conn.see(ORIGINAL, tcp(TCP_ACK, 1001, 150), 4).1, 0);
    assert_eq!(conn.0.bytes[ORIGINAL], 150);
}

/// Sequence numbers wrap past 2^32 without losing or inventing bytes.
#[test]
fn sequence_numbers_wrap() {
    let mut conn = Conn::tcp();
    conn.see(ORIGINAL, tcp(TCP_SYN, u32::MAX - 10, 0), 1);
    assert_eq!(
        conn.see(ORIGINAL, tcp(TCP_ACK, u32::MAX - 9, 100), 2).1,
        100
    );
    assert_eq!(conn.see(ORIGINAL, tcp(TCP_ACK, 90, 50), 3).1, 50);
    // An old segment from before the wrap is a duplicate.
    assert_eq!(conn.see(ORIGINAL, tcp(TCP_ACK, u32::MAX - 9, 100), 4).1, 0);
    assert_eq!(conn.0.bytes[ORIGINAL], 150);
}

/// A connection adopted mid-stream starts counting at its first packet seen.
#[test]
fn a_connection_adopted_mid_stream_counts_from_its_first_packet() {
    let mut conn = Conn::tcp();
    conn.0.start_seen = 0;
    assert_eq!(conn.see(REPLY, tcp(TCP_ACK, 900, 40), 1).1, 40);
    assert_eq!(conn.0.syn_seen, 0);
    assert_eq!(conn.see(REPLY, tcp(TCP_RST, 940, 0), 2).0, CLOSE_RST);
    assert_eq!(conn.0.refused, 0, "an adopted connection is never refused");
}

/// The backend's RST as its first answer is a refusal; after a SYN-ACK it is a reset.
#[test]
fn an_rst_is_a_refusal_only_before_any_answer() {
    let mut refused = Conn::tcp();
    refused.see(ORIGINAL, tcp(TCP_SYN, 1, 0), 1);
    assert!(refused.refuses());
    assert_eq!(
        refused.see(REPLY, tcp(TCP_RST | TCP_ACK, 0, 0), 2),
        (CLOSE_RST, 0)
    );
    assert_eq!((refused.0.rst, refused.0.refused), (1, 1));

    let mut reset = Conn::tcp();
    reset.see(ORIGINAL, tcp(TCP_SYN, 1, 0), 1);
    reset.see(REPLY, tcp(TCP_SYN | TCP_ACK, 50, 0), 2);
    assert!(!reset.refuses());
    assert_eq!(reset.see(REPLY, tcp(TCP_RST, 51, 0), 3), (CLOSE_RST, 0));
    assert_eq!((reset.0.rst, reset.0.refused), (1, 0));

    // The client's own RST is never the backend's refusal.
    let mut aborted = Conn::tcp();
    aborted.see(ORIGINAL, tcp(TCP_SYN, 1, 0), 1);
    assert_eq!(aborted.see(ORIGINAL, tcp(TCP_RST, 2, 0), 2), (CLOSE_RST, 0));
    assert_eq!(aborted.0.refused, 0);
}

/// A datagram passing two devices counts once, on the last device the direction's
/// first datagram passed; later datagrams count there too.
#[test]
fn a_forwarded_datagram_counts_once() {
    let mut conn = Conn::udp();
    let (veth, bridge) = (0xa0, 0xb0);
    // The first datagram (skb 0x100) on the pod's veth, then on the bridge.
    assert_eq!(conn.see(ORIGINAL, udp(veth, 0x100, 30), 1).1, 30);
    assert_eq!(conn.see(ORIGINAL, udp(bridge, 0x100, 30), 2).1, 0);
    assert_eq!(conn.0.udp_dev[ORIGINAL], bridge);
    // The second datagram: not on the veth, once on the bridge.
    assert_eq!(conn.see(ORIGINAL, udp(veth, 0x200, 40), 3).1, 0);
    assert_eq!(conn.see(ORIGINAL, udp(bridge, 0x200, 40), 4).1, 40);
    assert_eq!(
        conn.0.udp_first_skb[ORIGINAL],
        bridge | UDP_SETTLED,
        "the device settled"
    );
    assert_eq!(conn.see(ORIGINAL, udp(bridge, 0x300, 50), 5).1, 50);
    assert_eq!(conn.0.bytes[ORIGINAL], 120);
    assert_eq!(conn.0.requests, 1, "no answer between the datagrams");
}

/// A datagram passing one device only (a routed node): the next one may get the first's
/// freed `sk_buff`, at the same address; it still counts.
#[test]
fn a_later_datagram_in_the_first_ones_memory_counts() {
    let mut conn = Conn::udp();
    let veth = 0xa0;
    assert_eq!(conn.see(REPLY, udp(veth, 0x100, 60), 1).1, 60);
    assert_eq!(conn.see(REPLY, udp(veth, 0x100, 70), 2).1, 70);
    assert_eq!(conn.see(REPLY, udp(veth, 0x100, 80), 3).1, 80);
    assert_eq!(conn.0.bytes[REPLY], 210);
}

/// A flow's first two datagrams on two CPUs at once (after a clash merged their
/// entries): the second settles the bridge while the first, already past its check,
/// moves the device on to the bridge port. That late move changes nothing: each
/// datagram counts once, on the bridge.
#[test]
fn a_move_that_lands_after_the_settle_changes_nothing() {
    let mut conn = Conn::udp();
    let (bridge, port) = (0xb0, 0xc0);
    assert_eq!(conn.see(ORIGINAL, udp(bridge, 0x100, 40), 1).1, 40);
    assert_eq!(conn.see(ORIGINAL, udp(bridge, 0x200, 40), 2).1, 40);
    // The first datagram's CPU read the state before the settle and stores its move now.
    conn.0.udp_dev[ORIGINAL] = port;
    assert_eq!(conn.see(ORIGINAL, udp(port, 0x100, 40), 3).1, 0);
    assert_eq!(conn.see(ORIGINAL, udp(port, 0x200, 40), 4).1, 0);
    assert_eq!(conn.see(ORIGINAL, udp(bridge, 0x300, 40), 5).1, 40);
    assert_eq!(conn.see(ORIGINAL, udp(port, 0x300, 40), 6).1, 0);
    assert_eq!(conn.0.bytes[ORIGINAL], 120);
}

/// At local delivery (`dev` and `skb` 0) every datagram arrives once and counts; an
/// answer makes a UDP flow no refusal, and a UDP flow never closes by a packet.
#[test]
fn delivered_datagrams_count_and_an_answer_is_no_refusal() {
    let mut conn = Conn::udp();
    assert_eq!(conn.see(ORIGINAL, udp(0, 0, 30), 1), (CLOSE_NONE, 30));
    assert!(
        conn.refuses(),
        "unanswered: an ICMP port unreachable now is a refusal"
    );
    assert_eq!(conn.see(REPLY, udp(0, 0, 60), 2), (CLOSE_NONE, 60));
    assert_eq!(conn.see(ORIGINAL, udp(0, 0, 30), 3), (CLOSE_NONE, 30));
    assert!(!conn.refuses());
    assert_eq!((conn.0.bytes, conn.0.requests), ([60, 60], 2));
}

#[test]
fn a_pure_ack_changes_nothing_but_the_time_so_the_programs_skip_it() {
    let mut conn = Conn::tcp();
    conn.see(ORIGINAL, tcp(TCP_SYN, 1000, 0), 1);
    conn.see(REPLY, tcp(TCP_SYN | TCP_ACK, 5000, 0), 2);
    conn.see(ORIGINAL, tcp(TCP_ACK, 1001, 78), 3);
    conn.see(REPLY, tcp(TCP_ACK, 5001, 0), 4);
    conn.see(REPLY, tcp(TCP_ACK | 0x08, 5001, 180), 5);
    for (dir, ack) in [
        (ORIGINAL, tcp(TCP_ACK, 1079, 0)),
        (REPLY, tcp(TCP_ACK, 5181, 0)),
        (ORIGINAL, tcp(TCP_ACK | 0x08, 1079, 0)),
    ] {
        assert!(carries_nothing(&ack));
        let before = conn.0;
        assert_eq!(conn.see(dir, ack, 9), (CLOSE_NONE, 0));
        let mut after = conn.0;
        after.last_ns = before.last_ns;
        assert_eq!(after, before, "only last_ns moved");
    }
    for carrying in [
        tcp(TCP_ACK, 1079, 1),
        tcp(TCP_SYN, 1, 0),
        tcp(TCP_FIN | TCP_ACK, 1079, 0),
        tcp(TCP_RST, 1079, 0),
    ] {
        assert!(
            !carries_nothing(&carrying),
            "flags {:#x}",
            carrying.tcp_flags
        );
    }
    assert!(
        !carries_nothing(&udp(1, 1, 0)),
        "an empty datagram is a datagram"
    );
}
