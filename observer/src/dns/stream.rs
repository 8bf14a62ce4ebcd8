//! DNS over TCP: finding the messages in the segments the kernel copies. Each message
//! carries a 2-byte length (RFC 1035 4.2.2); a segment may hold several, or start inside
//! one that an earlier segment began. The kernel copies each segment's first bytes with
//! its sequence number and payload length, so per connection direction it is enough to
//! remember where the next message starts.
//!
//! Covered: every message that starts inside a segment's copied bytes (its length and,
//! for decoding, its header and question within them), whatever the segment holds before
//! or after it; retransmitted and continuation segments start nothing and are skipped.
//! Not covered, counted (`Framed::unread`): a message whose length lies past a segment's
//! copied bytes (the segment's later messages are unknown too). A segment the kernel
//! could not copy is counted there; the stream then resumes at the next segment it sees,
//! taken to start a message, as is the first segment seen of a direction.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;

/// A stream idle this long is forgotten: a DNS client writes whole messages, so its next
/// segment starts one.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Streams followed at most; beyond, a new one's segments are each taken to start a
/// message, so memory stays bounded whatever the traffic.
const MAX_STREAMS: usize = 65_536;

/// One direction of one TCP connection: the conntrack entry's address and namespace, the
/// client's address (the entry's memory may be reused by another connection) and the
/// direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey {
    pub conntrack: u64,
    pub netns: u32,
    pub client: SocketAddr,
    pub dir: u8,
}

/// What one segment holds.
#[derive(Debug, PartialEq, Eq)]
pub struct Framed {
    /// Each message that starts in the segment, as a range of the copied bytes (without
    /// its length; cut at the copied bytes' end).
    pub messages: Vec<Range<usize>>,
    /// Messages that start in the segment past its copied bytes (at least one each time
    /// the walk stops there).
    pub unread: u64,
    /// Where the next message starts in the stream.
    pub next: u32,
}

/// Finds the messages in a segment: `seq` is its first payload byte's sequence number,
/// `segment` its payload length, `copied` its first bytes, `next` where the stream's next
/// message starts (`None`: the first segment seen, taken to start one).
pub fn frame(next: Option<u32>, seq: u32, segment: u32, copied: &[u8]) -> Framed {
    let copied = &copied[..copied.len().min(segment as usize)];
    let start = match next {
        // The next message starts inside this segment, or at its end or beyond
        // (a retransmission, or the continuation of a long message).
        Some(next) if (next.wrapping_sub(seq) as i32) >= 0 => next.wrapping_sub(seq),
        // Bytes before this segment were not seen: resume here.
        _ => 0,
    };
    let mut framed = Framed {
        messages: Vec::new(),
        unread: 0,
        next: seq.wrapping_add(start),
    };
    let mut at = start as usize;
    while at < segment as usize {
        let Some(length) = copied.get(at..at + 2) else {
            // The length is past the copied bytes: so is where later messages start.
            framed.unread += 1;
            framed.next = seq.wrapping_add(segment);
            return framed;
        };
        let end = at + 2 + u16::from_be_bytes([length[0], length[1]]) as usize;
        framed.messages.push(at + 2..end.min(copied.len()));
        at = end;
    }
    framed.next = seq.wrapping_add(at as u32);
    framed
}

/// Where each followed stream's next message starts.
#[derive(Default)]
pub struct Streams {
    next: HashMap<StreamKey, (u32, u64)>,
}

impl Streams {
    /// Frames one segment seen at `time_ns` and remembers where the stream continues.
    pub fn segment(
        &mut self,
        key: StreamKey,
        seq: u32,
        segment: u32,
        copied: &[u8],
        time_ns: u64,
    ) -> Framed {
        let next = self.next.get(&key).map(|(next, _)| *next);
        let framed = frame(next, seq, segment, copied);
        if next.is_some() || self.next.len() < MAX_STREAMS {
            self.next.insert(key, (framed.next, time_ns));
        }
        framed
    }

    /// Forgets the streams idle for `IDLE` by `now_ns`.
    pub fn expire(&mut self, now_ns: u64) {
        let idle = IDLE.as_nanos() as u64;
        self.next
            .retain(|_, (_, last)| now_ns.saturating_sub(*last) <= idle);
    }

    /// Streams followed.
    pub fn len(&self) -> usize {
        self.next.len()
    }

    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }
}

#[cfg(test)]
mod tests;
