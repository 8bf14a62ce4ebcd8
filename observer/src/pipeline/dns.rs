//! The session's DNS side: decodes the port-53 message prefixes the kernel copies,
//! matches queries to responses, names the client pod and writes `dns` lines.

use observer_common::dns::DnsEvent;

use crate::dns::{Matcher, Streams, from_event};
use crate::model::record::DnsRecord;

pub(super) struct DnsSide {
    matcher: Matcher,
    /// Where each TCP connection's next message starts.
    streams: Streams,
    /// Messages that could not be decoded (the kernel's drops are counted apart: lost).
    pub malformed: u64,
    /// `malformed` per network namespace inode.
    pub malformed_by_netns: std::collections::BTreeMap<u32, u64>,
}

impl DnsSide {
    pub fn new(clock: crate::model::tracker::Clock) -> DnsSide {
        DnsSide {
            matcher: Matcher::new(clock),
            streams: Streams::default(),
            malformed: 0,
            malformed_by_netns: Default::default(),
        }
    }

    /// The queries answered (or answered in error) by these messages, in order.
    pub fn on_events(&mut self, events: &[DnsEvent]) -> Vec<DnsRecord> {
        let mut done = Vec::new();
        for event in events {
            for message in from_event(event, &mut self.streams) {
                match message {
                    Ok(seen) => done.extend(self.matcher.on_message(seen)),
                    Err(err) => {
                        log::debug!("skipped a DNS message in netns {}: {err}", event.netns);
                        self.malformed += 1;
                        *self.malformed_by_netns.entry(event.netns).or_default() += 1;
                    }
                }
            }
        }
        done
    }

    /// The queries whose responses did not come in time.
    pub fn expire(&mut self, now_ns: u64) -> Vec<DnsRecord> {
        self.streams.expire(now_ns);
        self.matcher.expire(now_ns)
    }

    /// Every query still waiting (the session ends).
    pub fn finish(&mut self) -> Vec<DnsRecord> {
        self.matcher.finish()
    }
}
