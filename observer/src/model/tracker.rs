//! Turns kernel events and connection-table snapshots into connection records: every
//! DNATed connection exactly once, closed by FIN/RST or found gone (kernel), by idle
//! timeout (here), or still open when the recording ends.

use chrono::{DateTime, Utc};
use observer_common::conn::{
    CLOSE_EXPIRED, CLOSE_FIN, CLOSE_NONE, CLOSE_RST, ConnEvent, ConnState, EVENT_OPEN, PROTO_UDP,
    REPLY,
};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::clash::ClashMerges;
use crate::model::record::{Close, ConnRecord};
use crate::model::tuple::{self, UnknownProtocol};
use crate::model::update::ConnId;

/// Maps the kernel's monotonic clock (`bpf_ktime_get_ns`) to wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub monotonic_ns: u64,
    pub wall: DateTime<Utc>,
}

impl Clock {
    pub fn wall(&self, monotonic_ns: u64) -> DateTime<Utc> {
        let delta = monotonic_ns as i128 - self.monotonic_ns as i128;
        self.wall + chrono::Duration::nanoseconds(delta as i64)
    }
}

/// What a sweep of the kernel's connection table found.
#[derive(Debug, Default, PartialEq)]
pub struct Sweep {
    /// Open connections whose counters moved since the last sweep.
    pub progress: Vec<(ConnId, ConnRecord)>,
    /// Connections that ended: idle past the timeout, or closed in the kernel while its
    /// ring buffer was full. Remove each from the kernel table, then call `Tracker::end`
    /// with the given close for each removal that succeeded.
    pub ended: Vec<(u64, ConnState, Close)>,
}

/// How a connection the kernel closed ended (`ConnEvent::close`, `ConnState::closed`).
fn kernel_close(close: u32) -> Close {
    match close {
        CLOSE_FIN => Close::Fin,
        CLOSE_RST => Close::Rst,
        CLOSE_EXPIRED => Close::Expired,
        _ => Close::Timeout,
    }
}

/// Why a tracked connection has no record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoRecord {
    /// It cannot be recorded: a lost connection.
    #[error(transparent)]
    Unknown(#[from] UnknownProtocol),
    /// It ended before its conntrack entry was ever seen confirmed
    /// (`ConnState::unconfirmed`): its first packet lost a clash (it went on with the
    /// winning entry, a connection of its own) or was dropped at confirmation. No
    /// connection.
    #[error("its conntrack entry was never confirmed")]
    NeverConfirmed,
}

pub struct Tracker {
    clock: Clock,
    idle_timeout_ns: u64,
    /// Open connections and the `last_ns` reported for each.
    open: FxHashMap<ConnId, u64>,
    /// What clashes' losers carried, for their winners' records.
    clashes: ClashMerges,
}

impl Tracker {
    pub fn new(clock: Clock, idle_timeout: std::time::Duration) -> Tracker {
        Tracker {
            clock,
            idle_timeout_ns: idle_timeout.as_nanos() as u64,
            open: FxHashMap::default(),
            clashes: ClashMerges::default(),
        }
    }

    /// The forwarding program runs on `net_dev_queue`: a clash's loser's datagram is
    /// counted on its winner's entry too (`model::clash`).
    pub fn losers_counted_by_winners(&mut self) {
        self.clashes.counted_by_winners();
    }

    /// Connections currently open.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// An open or close event from the ring buffer.
    pub fn on_event(&mut self, event: &ConnEvent) -> Result<(ConnId, ConnRecord), NoRecord> {
        let id = ConnId::of(event.conntrack, &event.state);
        if event.kind == EVENT_OPEN {
            let record = self.record(&event.state, Close::Open, event.time_ns)?;
            self.opened(event);
            return Ok((id, record));
        }
        self.open.remove(&id);
        let close = kernel_close(event.close);
        Ok((
            id,
            self.final_record(&event.state, close, event.state.last_ns)?,
        ))
    }

    /// An open event when no record of it is wanted (nothing shows connections before
    /// they end): only remembered as open.
    pub fn opened(&mut self, event: &ConnEvent) {
        let id = ConnId::of(event.conntrack, &event.state);
        self.open.insert(id, event.state.last_ns);
    }

    /// Compares the kernel's table with what is known: idle connections to expire, and
    /// with `progress` (a live view shows open connections) records of those that moved.
    pub fn sweep(&mut self, entries: &[(u64, ConnState)], now_ns: u64, progress: bool) -> Sweep {
        let mut sweep = Sweep::default();
        for (conntrack, state) in entries {
            let id = ConnId::of(*conntrack, state);
            if state.closed as u32 != CLOSE_NONE {
                sweep
                    .ended
                    .push((*conntrack, *state, kernel_close(state.closed as u32)));
                continue;
            }
            if self.is_idle(state, now_ns) {
                sweep.ended.push((*conntrack, *state, Close::Timeout));
                continue;
            }
            let moved = self.open.insert(id, state.last_ns) != Some(state.last_ns);
            // Shown once its entry is confirmed (a connection, not a clash's loser).
            if moved
                && progress
                && state.unconfirmed == 0
                && let Ok(record) = self.record(state, Close::Open, now_ns)
            {
                sweep.progress.push((id, record));
            }
        }
        // A connection no longer in the kernel table whose close event is still in the
        // ring buffer, or was lost (counted by the kernel), stops counting as open.
        let present: FxHashSet<ConnId> = entries
            .iter()
            .map(|(conntrack, state)| ConnId::of(*conntrack, state))
            .collect();
        self.open.retain(|id, _| present.contains(id));
        self.clashes.retain_live(entries);
        sweep
    }

    /// The final record of a connection that user space removed from the kernel table
    /// (the removal must have succeeded, or the kernel reports it too): idle (`Timeout`),
    /// closed while the ring buffer was full, or its conntrack entry found destroyed
    /// (`Expired`). It ends at its last packet.
    pub fn end(
        &mut self,
        conntrack: u64,
        state: &ConnState,
        close: Close,
    ) -> Result<(ConnId, ConnRecord), NoRecord> {
        let id = ConnId::of(conntrack, state);
        self.open.remove(&id);
        Ok((id, self.final_record(state, close, state.last_ns)?))
    }

    /// A connection that ended outside the kernel programs' sight (conntrack destroyed
    /// its entry) at `until_ns`, after it was removed from the kernel table.
    pub fn ended(
        &mut self,
        conntrack: u64,
        state: &ConnState,
        close: Close,
        until_ns: u64,
    ) -> Result<(ConnId, ConnRecord), NoRecord> {
        let id = ConnId::of(conntrack, state);
        self.open.remove(&id);
        Ok((id, self.final_record(state, close, until_ns)?))
    }

    /// At the end of a recording: every connection still in the kernel table, as open
    /// (or closed, if it closed while the ring buffer was full).
    pub fn finish(
        &mut self,
        entries: &[(u64, ConnState)],
        now_ns: u64,
    ) -> Vec<Result<(ConnId, ConnRecord), NoRecord>> {
        self.open.clear();
        entries
            .iter()
            .map(|(conntrack, state)| {
                let id = ConnId::of(*conntrack, state);
                if state.closed as u32 != CLOSE_NONE {
                    let close = kernel_close(state.closed as u32);
                    return Ok((id, self.record(state, close, state.last_ns)?));
                }
                // Refused, and only waiting for its idle timeout: that is its end.
                if state.refused != 0 {
                    return Ok((id, self.record(state, Close::Refused, state.last_ns)?));
                }
                Ok((id, self.record(state, Close::Open, now_ns)?))
            })
            .collect()
    }

    /// UDP has no end but silence; a TCP connection that never got an answer (a SYN to
    /// a dead backend) ends the same way. Established TCP waits for FIN or RST.
    fn is_idle(&self, state: &ConnState, now_ns: u64) -> bool {
        let silent = now_ns.saturating_sub(state.last_ns) >= self.idle_timeout_ns;
        let answered = state.seq_known[REPLY] != 0;
        silent && (state.original.protocol == PROTO_UDP || !answered)
    }

    /// The last record of a connection that ended; one never confirmed is none, but
    /// what it carried joins the record of the entry it lost its clash to.
    fn final_record(
        &mut self,
        state: &ConnState,
        close: Close,
        until_ns: u64,
    ) -> Result<ConnRecord, NoRecord> {
        let record = self.record(state, close, until_ns);
        match &record {
            Err(NoRecord::NeverConfirmed) => self.clashes.lost(state),
            Ok(_) => self.clashes.written(state),
            Err(_) => {}
        }
        record
    }

    /// The record for `state`: `close == Open` measures the duration up to `until_ns`;
    /// otherwise the connection ended at `until_ns`. A clash's losers that merged into
    /// it add their requests and bytes.
    fn record(
        &self,
        state: &ConnState,
        close: Close,
        until_ns: u64,
    ) -> Result<ConnRecord, NoRecord> {
        if close != Close::Open && state.unconfirmed != 0 {
            return Err(NoRecord::NeverConfirmed);
        }
        let proto = tuple::proto(state.original.protocol)?;
        let end_ns = until_ns.max(state.start_ns);
        let carried = self.clashes.carried(state).unwrap_or_default();
        Ok(ConnRecord {
            proto,
            client: tuple::socket_addr(state.original.family, &state.original.src),
            client_pod: None,
            original_dst: tuple::socket_addr(state.original.family, &state.original.dst),
            backend: tuple::socket_addr(state.reply.family, &state.reply.src),
            backend_pod: None,
            service: None,
            frontend: None,
            endpoint_in_rules: None,
            policy: None,
            same_node: None,
            netns: state.netns,
            start: self.clock.wall(state.start_ns),
            end: (close != Close::Open).then(|| self.clock.wall(end_ns)),
            duration_ms: (end_ns - state.start_ns) as f64 / 1e6,
            // The losers' datagrams were among the flow's first, before any reply: the
            // same run of the client's payload as the winner's first, no request more.
            requests: (state.requests as u64).max(carried.requests),
            bytes_to_backend: state.bytes[0] + carried.bytes[0],
            bytes_from_backend: state.bytes[1] + carried.bytes[1],
            close: outcome_close(state, close),
            connect_ms: connect_ms(state),
            start_seen: state.start_seen != 0,
        })
    }
}

/// How a connection ended, given what the kernel saw of its answers: a refusal as the
/// backend's first answer makes it `Refused` however it ended; a connection whose start
/// was seen and that never got a packet back is `Unanswered` when it timed out, expired
/// or was reset by its client. A connection still open stays `Open`.
pub fn outcome_close(state: &ConnState, close: Close) -> Close {
    if close == Close::Open {
        return close;
    }
    if state.refused != 0 {
        return Close::Refused;
    }
    let silent = state.start_seen != 0 && state.replied == 0;
    match close {
        Close::Timeout | Close::Expired | Close::Rst if silent => Close::Unanswered,
        _ => close,
    }
}

/// Milliseconds from the client's SYN (the connection's first packet) to the backend's
/// first SYN-ACK; `None` without both.
pub fn connect_ms(state: &ConnState) -> Option<f64> {
    (state.start_seen != 0 && state.syn_seen != 0 && state.synack_ns >= state.start_ns)
        .then(|| (state.synack_ns - state.start_ns) as f64 / 1e6)
        .filter(|_| state.synack_ns != 0)
}

#[cfg(test)]
mod tests {
    use observer_common::conn::{EVENT_CLOSE, Endpoint, FAMILY_IPV4, FlowTuple, PROTO_TCP};

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

    fn state(protocol: u8, start_ns: u64, last_ns: u64) -> ConnState {
        ConnState {
            start_ns,
            last_ns,
            bytes: [93, 180],
            requests: 1,
            netns: 4026532301,
            start_seen: 1,
            seq_known: [1, 1],
            replied: 1,
            original: FlowTuple {
                src: endpoint([10, 244, 1, 9], 45364),
                dst: endpoint([10, 96, 35, 226], 80),
                family: FAMILY_IPV4,
                protocol,
                _pad: 0,
            },
            reply: FlowTuple {
                src: endpoint([10, 244, 1, 13], 8080),
                dst: endpoint([10, 244, 1, 9], 45364),
                family: FAMILY_IPV4,
                protocol,
                _pad: 0,
            },
            ..Default::default()
        }
    }

    fn tracker() -> Tracker {
        let clock = Clock {
            monotonic_ns: 100 * SECOND,
            wall: "2026-08-06T13:46:00Z".parse().unwrap(),
        };
        Tracker::new(clock, std::time::Duration::from_secs(30))
    }

    #[test]
    fn open_then_fin_gives_one_closed_record() {
        let mut tracker = tracker();
        let open = ConnEvent {
            kind: EVENT_OPEN,
            conntrack: 7,
            time_ns: 136 * SECOND,
            state: state(PROTO_TCP, 136 * SECOND, 136 * SECOND),
            ..Default::default()
        };
        let (id, record) = tracker.on_event(&open).unwrap();
        assert_eq!(record.close, Close::Open);
        assert_eq!(record.end, None);
        assert_eq!(tracker.open_count(), 1);
        let mut closing = state(PROTO_TCP, 136 * SECOND, 140 * SECOND + 500_000);
        closing.requests = 30;
        let close = ConnEvent {
            kind: EVENT_CLOSE,
            close: CLOSE_FIN,
            conntrack: 7,
            time_ns: closing.last_ns,
            state: closing,
        };
        let (closed_id, record) = tracker.on_event(&close).unwrap();
        assert_eq!(closed_id, id);
        assert_eq!(tracker.open_count(), 0);
        let line = serde_json::to_string(&crate::model::record::LogLine::Conn(record)).unwrap();
        assert_eq!(
            line,
            r#"{"type":"conn","proto":"tcp","client":"10.244.1.9:45364","client_pod":null,"original_dst":"10.96.35.226:80","backend":"10.244.1.13:8080","backend_pod":null,"service":null,"frontend":null,"endpoint_in_rules":null,"netns":4026532301,"start":"2026-08-06T13:46:36.000000Z","end":"2026-08-06T13:46:40.000500Z","duration_ms":4000.5,"requests":30,"bytes_to_backend":93,"bytes_from_backend":180,"close":"fin","connect_ms":null,"start_seen":true}"#
        );
    }

    #[test]
    fn an_entry_never_seen_confirmed_is_no_connection_and_is_not_shown_while_open() {
        let mut tracker = tracker();
        let mut loser = state(PROTO_UDP, 100 * SECOND, 100 * SECOND);
        loser.unconfirmed = 1;
        let sweep = tracker.sweep(&[(9, loser)], 100 * SECOND, true);
        assert!(sweep.progress.is_empty(), "a clash's loser is never shown");
        for close in [Close::Expired, Close::Timeout] {
            assert_eq!(tracker.end(9, &loser, close), Err(NoRecord::NeverConfirmed));
        }
        let close = ConnEvent {
            kind: EVENT_CLOSE,
            close: CLOSE_EXPIRED,
            conntrack: 9,
            time_ns: 100 * SECOND,
            state: loser,
        };
        assert_eq!(tracker.on_event(&close), Err(NoRecord::NeverConfirmed));
        // Seen confirmed since (a later packet, or the revalidation): a connection.
        loser.unconfirmed = 0;
        assert!(tracker.end(9, &loser, Close::Expired).is_ok());
    }

    #[test]
    fn udp_idles_out_and_tcp_established_does_not() {
        let mut tracker = tracker();
        let udp = state(PROTO_UDP, 100 * SECOND, 101 * SECOND);
        let tcp = state(PROTO_TCP, 100 * SECOND, 101 * SECOND);
        let mut unanswered = state(PROTO_TCP, 100 * SECOND, 101 * SECOND);
        unanswered.seq_known = [1, 0];
        unanswered.replied = 0;
        unanswered.bytes = [93, 0];
        let entries = [(1, udp), (2, tcp), (3, unanswered)];
        let early = tracker.sweep(&entries, 130 * SECOND, true);
        assert!(early.ended.is_empty());
        assert_eq!(early.progress.len(), 3);
        assert!(
            tracker
                .sweep(&entries, 130 * SECOND, true)
                .progress
                .is_empty(),
            "no change, no progress"
        );
        let late = tracker.sweep(&entries, 131 * SECOND, true);
        assert_eq!(
            late.ended
                .iter()
                .map(|(ct, _, close)| (*ct, *close))
                .collect::<Vec<_>>(),
            vec![(1, Close::Timeout), (3, Close::Timeout)]
        );
        let (_, record) = tracker.end(1, &udp, Close::Timeout).unwrap();
        assert_eq!(record.close, Close::Timeout);
        assert_eq!(record.duration_ms, 1000.0);
    }

    /// Without a live view a sweep makes no progress records, and still counts and ends
    /// connections as with one.
    #[test]
    fn a_sweep_without_progress_records_still_ends_and_counts() {
        let mut tracker = tracker();
        let udp = state(PROTO_UDP, 100 * SECOND, 101 * SECOND);
        let tcp = state(PROTO_TCP, 100 * SECOND, 101 * SECOND);
        let open = ConnEvent {
            kind: EVENT_OPEN,
            conntrack: 2,
            time_ns: 100 * SECOND,
            state: tcp,
            ..Default::default()
        };
        tracker.opened(&open);
        let entries = [(1, udp), (2, tcp)];
        let early = tracker.sweep(&entries, 130 * SECOND, false);
        assert_eq!(early, Sweep::default());
        assert_eq!(tracker.open_count(), 2);
        let late = tracker.sweep(&entries, 131 * SECOND, false);
        assert!(late.progress.is_empty());
        assert_eq!(
            late.ended
                .iter()
                .map(|(ct, _, close)| (*ct, *close))
                .collect::<Vec<_>>(),
            vec![(1, Close::Timeout)]
        );
    }

    #[test]
    fn connections_gone_from_the_kernel_table_stop_counting_as_open() {
        let mut tracker = tracker();
        let state = state(PROTO_TCP, 100 * SECOND, 101 * SECOND);
        let open = ConnEvent {
            kind: EVENT_OPEN,
            conntrack: 5,
            time_ns: 100 * SECOND,
            state,
            ..Default::default()
        };
        tracker.on_event(&open).unwrap();
        tracker.sweep(&[(5, state)], 102 * SECOND, true);
        assert_eq!(tracker.open_count(), 1);
        // Its close event was lost: the kernel removed the entry.
        tracker.sweep(&[], 103 * SECOND, true);
        assert_eq!(tracker.open_count(), 0);
    }

    #[test]
    fn closes_the_kernel_could_not_report_end_from_the_table() {
        let mut tracker = tracker();
        // Closed by FIN while the ring buffer was full: the entry waits in the table.
        let mut fin = state(PROTO_TCP, 100 * SECOND, 101 * SECOND);
        fin.closed = CLOSE_FIN as u8;
        let live = state(PROTO_TCP, 100 * SECOND, 101 * SECOND);
        let sweep = tracker.sweep(&[(1, fin), (2, live)], 102 * SECOND, true);
        assert_eq!(sweep.ended, vec![(1, fin, Close::Fin)]);
        let (_, record) = tracker.end(1, &fin, Close::Fin).unwrap();
        assert_eq!(
            (record.close, record.duration_ms, record.start_seen),
            (Close::Fin, 1000.0, true)
        );
        // Still waiting when the recording ends: written closed, not open.
        let records = tracker.finish(&[(1, fin), (2, live)], 103 * SECOND);
        let closes: Vec<Close> = records
            .iter()
            .map(|r| r.as_ref().unwrap().1.close)
            .collect();
        assert_eq!(closes, [Close::Fin, Close::Open]);
    }

    #[test]
    fn an_entry_the_kernel_found_gone_ends_expired() {
        let mut tracker = tracker();
        let event = ConnEvent {
            kind: EVENT_CLOSE,
            close: CLOSE_EXPIRED,
            conntrack: 7,
            time_ns: 150 * SECOND,
            state: state(PROTO_TCP, 100 * SECOND, 120 * SECOND),
        };
        let (_, record) = tracker.on_event(&event).unwrap();
        assert_eq!(
            (record.close, record.duration_ms),
            (Close::Expired, 20_000.0)
        );
        let line = serde_json::to_string(&record).unwrap();
        assert!(line.contains(r#""close":"expired""#), "{line}");
    }

    #[test]
    fn finish_reports_open_connections() {
        let mut tracker = tracker();
        let records = tracker.finish(
            &[(9, state(PROTO_TCP, 100 * SECOND, 101 * SECOND))],
            103 * SECOND,
        );
        let (_, record) = records[0].as_ref().unwrap();
        assert_eq!(
            (record.close, record.end, record.duration_ms),
            (Close::Open, None, 3000.0)
        );
    }

    /// What the kernel programs leave in a connection's state after a packet sequence
    /// (observer-ebpf `conn::account`, `conn::refuses`, `hooks/dev_queue.rs` `refusal`),
    /// and the outcome user space makes of it.
    mod outcomes {
        use super::*;
        use crate::model::record::Outcome;

        /// The client's SYN at 100 s: the first packet, so `start_seen` and `syn_seen`.
        fn syn(protocol: u8) -> ConnState {
            let mut state = state(protocol, 100 * SECOND, 100 * SECOND);
            state.syn_seen = (protocol == PROTO_TCP) as u8;
            state.seq_known = [1, 0];
            state.replied = 0;
            state.bytes = [0, 0];
            state.requests = 0;
            state
        }

        fn close_of(state: &ConnState, close: Close) -> (Close, Option<f64>) {
            let mut tracker = tracker();
            let (_, record) = tracker.end(7, state, close).unwrap();
            (record.close, record.connect_ms)
        }

        #[test]
        fn syn_then_rst_from_the_backend_is_refused() {
            let mut state = syn(PROTO_TCP);
            // The RST: a reply packet, no SYN-ACK before it.
            state.replied = 1;
            state.rst = 1;
            state.refused = 1;
            state.last_ns = 100 * SECOND + 300_000;
            assert_eq!(close_of(&state, Close::Rst), (Close::Refused, None));
        }

        #[test]
        fn syn_then_nothing_is_unanswered_at_the_idle_timeout_or_when_conntrack_drops_it() {
            let state = syn(PROTO_TCP);
            assert_eq!(close_of(&state, Close::Timeout), (Close::Unanswered, None));
            assert_eq!(close_of(&state, Close::Expired), (Close::Unanswered, None));
            // The client gave up with an RST of its own.
            let mut reset = state;
            reset.rst = 1;
            assert_eq!(close_of(&reset, Close::Rst), (Close::Unanswered, None));
            // Still open at the end of a recording: not known yet.
            let mut tracker = tracker();
            let records = tracker.finish(&[(7, state)], 101 * SECOND);
            let record = &records[0].as_ref().unwrap().1;
            assert_eq!(
                (record.close, record.outcome()),
                (Close::Open, Outcome::Pending)
            );
        }

        #[test]
        fn syn_then_syn_ack_is_answered_with_its_connect_time() {
            let mut state = syn(PROTO_TCP);
            state.replied = 1;
            state.synack_ns = 100 * SECOND + 20_412_000;
            state.seq_known = [1, 1];
            assert_eq!(close_of(&state, Close::Fin), (Close::Fin, Some(20.412)));
            // An RST after the answer is a reset, not a refusal.
            state.rst = 1;
            assert_eq!(close_of(&state, Close::Rst), (Close::Rst, Some(20.412)));
            // Adopted mid-stream: no connect time.
            state.start_seen = 0;
            state.syn_seen = 0;
            assert_eq!(close_of(&state, Close::Rst), (Close::Rst, None));
        }

        #[test]
        fn udp_with_and_without_a_reply() {
            let mut answered = syn(PROTO_UDP);
            answered.replied = 1;
            answered.bytes = [40, 120];
            assert_eq!(close_of(&answered, Close::Timeout), (Close::Timeout, None));
            let silent = syn(PROTO_UDP);
            assert_eq!(close_of(&silent, Close::Timeout), (Close::Unanswered, None));
            // An ICMP port unreachable came back: refused, also when the recording ends
            // before its idle timeout.
            let mut refused = syn(PROTO_UDP);
            refused.refused = 1;
            assert_eq!(close_of(&refused, Close::Timeout), (Close::Refused, None));
            let mut tracker = tracker();
            let records = tracker.finish(&[(7, refused)], 101 * SECOND);
            assert_eq!(records[0].as_ref().unwrap().1.close, Close::Refused);
        }
    }
}
