//! The session's DNS side: decodes the port-53 message prefixes the kernel copies,
//! matches queries to responses, names the client pod and writes `dns` lines.

use observer_common::dns::DnsEvent;

use super::Session;
use super::output::Emitted;
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
}

impl Session {
    pub(super) fn on_dns(&mut self, events: &[DnsEvent]) -> anyhow::Result<()> {
        for event in events {
            for message in from_event(event, &mut self.dns.streams) {
                match message {
                    Ok(seen) => {
                        let done = self.dns.matcher.on_message(seen);
                        self.write_dns(done)?;
                    }
                    Err(err) => {
                        log::debug!("skipped a DNS message in netns {}: {err}", event.netns);
                        self.dns.malformed += 1;
                        *self.dns.malformed_by_netns.entry(event.netns).or_default() += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes the queries whose responses did not come in time.
    pub(super) fn expire_dns(&mut self, now_ns: u64) -> anyhow::Result<()> {
        self.dns.streams.expire(now_ns);
        let expired = self.dns.matcher.expire(now_ns);
        self.write_dns(expired)
    }

    /// Writes every query still waiting (the session ends).
    pub(super) fn finish_dns(&mut self) -> anyhow::Result<()> {
        let rest = self.dns.matcher.finish();
        self.write_dns(rest)
    }

    fn write_dns(&mut self, records: Vec<DnsRecord>) -> anyhow::Result<()> {
        for mut record in records {
            self.naming.name_dns(&mut record);
            self.output.emit(Emitted::Dns(record))?;
        }
        Ok(())
    }
}
