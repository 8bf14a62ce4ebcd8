//! Turns a recorded log into the updates the live view consumes, so a recording can be
//! browsed in the same UI without root.

use std::collections::BTreeSet;

use crate::model::record::{Close, Recording};
use crate::model::update::{CaptureStats, ConnId, Update};

/// Services first (in file order, so a later definition wins), then endpoint changes
/// and DNS queries, then every connection's final record in order of start time, then the recording's
/// counters.
pub fn replay_updates(recording: &Recording) -> Vec<Update> {
    let mut updates: Vec<Update> = recording
        .services
        .iter()
        .cloned()
        .map(Update::Service)
        .chain(recording.endpoints.iter().cloned().map(Update::Endpoints))
        .chain(recording.dns.iter().cloned().map(Update::Dns))
        .chain(recording.rejects.iter().cloned().map(Update::Reject))
        .collect();
    let mut conns: Vec<_> = recording.conns.iter().enumerate().collect();
    conns.sort_by_key(|(index, conn)| (conn.start, *index));
    let mut netns = BTreeSet::new();
    netns.extend(recording.services.iter().map(|service| service.netns));
    let mut open = 0;
    for (index, conn) in conns {
        netns.insert(conn.netns);
        if conn.close == Close::Open {
            open += 1;
        }
        // A recording has no kernel addresses: the line number keeps ids distinct.
        let id = ConnId {
            conntrack: index as u64,
            start_ns: conn
                .start
                .timestamp_nanos_opt()
                .and_then(|ns| u64::try_from(ns).ok())
                .unwrap_or(0),
        };
        updates.push(Update::Conn {
            id,
            record: conn.clone(),
        });
    }
    let summary = recording.summary.clone().unwrap_or_default();
    updates.push(Update::Stats(CaptureStats {
        events: summary.dnat_events,
        dnat_events: summary.dnat_events,
        lost_connections: summary.lost_connections,
        lost_events: summary.lost_events,
        read_errors: summary.read_errors,
        dns_malformed: summary.dns_malformed,
        dns_lost: summary.dns_lost,
        lost_rejects: summary.lost_rejects,
        hooks_attached: 0,
        netns_seen: u32::try_from(netns.len()).unwrap_or(u32::MAX),
        blind_spots: summary.blind_spots.len() as u64,
        live_connections: open,
        recording: None,
    }));
    updates
}
