//! The filter runs in the kernel on a unix datagram socket pair (no root needed): the
//! netlink ancillary loads parse any linear skb's bytes as netlink attributes.

use std::os::fd::AsRawFd as _;
use std::os::unix::net::UnixDatagram;

use super::*;

fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
    out.extend(kind.to_ne_bytes());
    out.extend(payload);
    out.resize(out.len().next_multiple_of(4), 0);
    out
}

/// A ctnetlink message of `msg` (0 new, 2 delete) with a tuple-like attribute first and,
/// if given, a TCP state in `CTA_PROTOINFO` (nested, with NLA_F_NESTED as the kernel
/// sets it).
fn message(msg: u8, tcp_state: Option<u8>) -> Vec<u8> {
    const NESTED: u16 = 0x8000;
    let mut attrs = attr(1 | NESTED, &attr(2, &[10, 0, 0, 1]));
    attrs.extend(attr(3, &0x20u32.to_be_bytes()));
    if let Some(state) = tcp_state {
        let tcp = attr(1, &[state]);
        attrs.extend(attr(4 | NESTED, &attr(1 | NESTED, &tcp)));
    }
    let len = 16 + 4 + attrs.len();
    // nlmsghdr: length, type (subsystem ctnetlink, message), flags, seq, pid.
    let mut out = (len as u32).to_ne_bytes().to_vec();
    out.extend((0x0100u16 | msg as u16).to_ne_bytes());
    out.extend([0u8; 10]);
    // nfgenmsg: AF_INET, version 0, resource id 0.
    out.extend([2, 0, 0, 0]);
    out.extend(attrs);
    out
}

/// Which of `messages` pass the filter, in order.
fn passing(messages: &[Vec<u8>]) -> Vec<usize> {
    let (send, receive) = UnixDatagram::pair().unwrap();
    attach(receive.as_raw_fd()).unwrap();
    receive.set_nonblocking(true).unwrap();
    for (i, message) in messages.iter().enumerate() {
        let mut tagged = message.clone();
        tagged.push(i as u8);
        send.send(&tagged).unwrap();
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok(n) = receive.recv(&mut buf) {
        out.push(buf[n - 1] as usize);
    }
    out
}

#[test]
fn only_destroys_of_closed_tcp_entries_are_dropped() {
    let messages = [
        message(2, Some(tcp_state::TIME_WAIT)),
        message(2, Some(tcp_state::ESTABLISHED)),
        message(2, Some(tcp_state::CLOSE)),
        message(2, None),
        message(0, Some(tcp_state::TIME_WAIT)),
        message(2, Some(tcp_state::FIN_WAIT)),
    ];
    assert_eq!(passing(&messages), vec![1, 3, 4, 5]);
}
