//! Turns the kernel's rejected-flow reports (`RejectEvent`) and counts (`RejectCount`)
//! into `reject` records: one per TCP connection attempt, written at once; one per UDP
//! client socket, with its datagram count, written once the socket has been quiet for
//! the idle timeout (or when the recording ends).

use observer_common::conn::PROTO_TCP;
use observer_common::reject::{RejectCount, RejectEvent, RejectKey};

use crate::model::NetMap;
use crate::model::record::{Proto, RejectRecord};
use crate::model::tracker::Clock;
use crate::model::tuple::{self, UnknownProtocol};

/// How long a written TCP attempt is remembered: a client whose SYNs are dropped
/// without an answer (DROP rules) retransmits them for about two minutes, on the same
/// port with the same initial sequence number.
const ATTEMPT_MEMORY_NS: u64 = 180 * 1_000_000_000;

/// A UDP client socket whose datagrams are being rejected.
struct UdpFlow {
    first_ns: u64,
    /// What the kernel counted when last asked.
    count: RejectCount,
}

pub struct RejectTracker {
    clock: Clock,
    idle_timeout_ns: u64,
    /// TCP attempts written: flow and initial sequence number, and when.
    attempts: NetMap<(RejectKey, u32), u64>,
    udp: NetMap<RejectKey, UdpFlow>,
}

/// What a sweep found: records to write, and flows the kernel may forget.
#[derive(Debug, Default, PartialEq)]
pub struct RejectSweep {
    pub records: Vec<RejectRecord>,
    pub forget: Vec<RejectKey>,
}

impl RejectTracker {
    /// No UDP socket is being followed (nothing a sweep could still write).
    pub fn is_idle(&self) -> bool {
        self.udp.is_empty()
    }

    pub fn new(clock: Clock, idle_timeout: std::time::Duration) -> RejectTracker {
        RejectTracker {
            clock,
            idle_timeout_ns: idle_timeout.as_nanos() as u64,
            attempts: NetMap::default(),
            udp: NetMap::default(),
        }
    }

    /// A report from the kernel: the record of a new TCP attempt, or `None` (a UDP
    /// socket's first rejected datagram, written when the socket goes quiet; or an
    /// attempt written already).
    pub fn on_event(
        &mut self,
        event: &RejectEvent,
    ) -> Result<Option<RejectRecord>, UnknownProtocol> {
        let proto = tuple::proto(event.key.protocol)?;
        if proto == Proto::Udp {
            self.udp.entry(event.key).or_insert(UdpFlow {
                first_ns: event.time_ns,
                count: RejectCount {
                    first_ns: event.time_ns,
                    last_ns: event.time_ns,
                    packets: 1,
                    ..RejectCount::default()
                },
            });
            return Ok(None);
        }
        if self
            .attempts
            .insert((event.key, event.isn), event.time_ns)
            .is_some()
        {
            return Ok(None);
        }
        self.record(&event.key, event.time_ns, None).map(Some)
    }

    /// UDP sockets quiet for the idle timeout are written with their counts; TCP
    /// attempts long past are forgotten. `count` asks the kernel for a flow's counts
    /// (`None`: the kernel no longer has it; the counts known last are used).
    pub fn sweep(
        &mut self,
        now_ns: u64,
        count: impl Fn(&RejectKey) -> Option<RejectCount>,
    ) -> Result<RejectSweep, UnknownProtocol> {
        let mut sweep = RejectSweep::default();
        let mut quiet = Vec::new();
        for (key, flow) in &mut self.udp {
            if let Some(counted) = count(key) {
                flow.count = counted;
            }
            if now_ns.saturating_sub(flow.count.last_ns) >= self.idle_timeout_ns {
                quiet.push(*key);
            }
        }
        quiet.sort_by_key(|key| self.udp[key].first_ns);
        for key in quiet {
            let flow = self.udp.remove(&key).expect("a key just listed");
            sweep
                .records
                .push(self.record(&key, flow.first_ns, Some(flow.count.packets))?);
            sweep.forget.push(key);
        }
        self.attempts.retain(|(key, _), at| {
            let old = now_ns.saturating_sub(*at) >= ATTEMPT_MEMORY_NS;
            if old && key.protocol == PROTO_TCP {
                sweep.forget.push(*key);
            }
            !old
        });
        Ok(sweep)
    }

    /// At the end of a recording: every UDP socket still being rejected.
    pub fn finish(
        &mut self,
        count: impl Fn(&RejectKey) -> Option<RejectCount>,
    ) -> Result<Vec<RejectRecord>, UnknownProtocol> {
        let mut flows: Vec<(RejectKey, UdpFlow)> = self.udp.drain().collect();
        flows.sort_by_key(|(_, flow)| flow.first_ns);
        flows
            .into_iter()
            .map(|(key, flow)| {
                let packets = count(&key).map_or(flow.count.packets, |c| c.packets);
                self.record(&key, flow.first_ns, Some(packets))
            })
            .collect()
    }

    /// UDP sockets being rejected now.
    pub fn open_udp(&self) -> usize {
        self.udp.len()
    }

    fn record(
        &self,
        key: &RejectKey,
        time_ns: u64,
        packets: Option<u64>,
    ) -> Result<RejectRecord, UnknownProtocol> {
        Ok(RejectRecord {
            proto: tuple::proto(key.protocol)?,
            client: tuple::socket_addr(key.family, &key.client),
            client_pod: None,
            original_dst: tuple::socket_addr(key.family, &key.dialed),
            service: None,
            frontend: None,
            reason: None,
            netns: key.netns,
            time: self.clock.wall(time_ns),
            packets,
        })
    }
}

#[cfg(test)]
mod tests {
    use observer_common::conn::{Endpoint, FAMILY_IPV4, PROTO_UDP};
    use observer_common::reject::EVENT_REJECT;

    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn endpoint(ip: [u8; 4], port: u16) -> Endpoint {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&ip);
        Endpoint {
            addr,
            port,
            _pad: [0; 2],
        }
    }

    fn event(protocol: u8, client_port: u16, isn: u32, time_ns: u64) -> RejectEvent {
        RejectEvent {
            kind: EVENT_REJECT,
            isn,
            time_ns,
            key: RejectKey {
                client: endpoint([10, 244, 1, 9], client_port),
                dialed: endpoint([10, 96, 200, 1], 80),
                netns: 4026532301,
                family: FAMILY_IPV4,
                protocol,
                _pad: 0,
            },
        }
    }

    fn tracker() -> RejectTracker {
        let clock = Clock {
            monotonic_ns: 100 * SECOND,
            wall: "2026-08-06T13:46:00Z".parse().unwrap(),
        };
        RejectTracker::new(clock, std::time::Duration::from_secs(30))
    }

    #[test]
    fn each_tcp_attempt_is_one_record_written_at_once() {
        let mut tracker = tracker();
        let first = tracker
            .on_event(&event(PROTO_TCP, 40000, 7, 101 * SECOND))
            .unwrap()
            .expect("a record");
        assert_eq!(first.client.to_string(), "10.244.1.9:40000");
        assert_eq!(first.original_dst.to_string(), "10.96.200.1:80");
        assert_eq!(first.packets, None);
        assert_eq!(
            serde_json::to_string(&crate::model::record::LogLine::Reject(first)).unwrap(),
            r#"{"type":"reject","proto":"tcp","client":"10.244.1.9:40000","client_pod":null,"original_dst":"10.96.200.1:80","service":null,"frontend":null,"netns":4026532301,"time":"2026-08-06T13:46:01.000000Z"}"#
        );
        // A retransmitted SYN of that attempt reported again (its kernel entry was
        // evicted): no second record. The port's next attempt is one.
        assert_eq!(
            tracker.on_event(&event(PROTO_TCP, 40000, 7, 102 * SECOND)),
            Ok(None)
        );
        assert!(
            tracker
                .on_event(&event(PROTO_TCP, 40000, 8, 103 * SECOND))
                .unwrap()
                .is_some()
        );
        // Long after, the kernel may forget the flow.
        let sweep = tracker.sweep(400 * SECOND, |_| None).unwrap();
        assert!(sweep.records.is_empty());
        assert_eq!(sweep.forget.len(), 2);
    }

    #[test]
    fn a_udp_socket_is_one_record_with_its_datagrams_once_quiet() {
        let mut tracker = tracker();
        let report = event(PROTO_UDP, 5000, 0, 101 * SECOND);
        assert_eq!(tracker.on_event(&report), Ok(None));
        let counted = RejectCount {
            first_ns: 101 * SECOND,
            last_ns: 110 * SECOND,
            packets: 12,
            ..RejectCount::default()
        };
        let sweep = tracker.sweep(139 * SECOND, |_| Some(counted)).unwrap();
        assert_eq!(sweep, RejectSweep::default(), "quiet for 29 s only");
        let sweep = tracker.sweep(140 * SECOND, |_| Some(counted)).unwrap();
        assert_eq!(sweep.forget, vec![report.key]);
        assert_eq!(sweep.records.len(), 1);
        assert_eq!(sweep.records[0].packets, Some(12));
        assert_eq!(sweep.records[0].time.to_string(), "2026-08-06 13:46:01 UTC");
        assert_eq!(tracker.open_udp(), 0);
    }

    #[test]
    fn udp_sockets_still_rejected_at_the_end_are_written_with_the_kernels_count() {
        let mut tracker = tracker();
        tracker
            .on_event(&event(PROTO_UDP, 5000, 0, 101 * SECOND))
            .unwrap();
        tracker
            .on_event(&event(PROTO_UDP, 5001, 0, 102 * SECOND))
            .unwrap();
        let records = tracker
            .finish(|key| {
                (key.client.port == 5000).then_some(RejectCount {
                    packets: 3,
                    ..RejectCount::default()
                })
            })
            .unwrap();
        let packets: Vec<_> = records
            .iter()
            .map(|r| (r.client.port(), r.packets))
            .collect();
        // The second one's kernel entry was evicted: the count known is kept.
        assert_eq!(packets, vec![(5000, Some(3)), (5001, Some(1))]);
    }
}
