use chrono::TimeZone;

use super::*;
use crate::stats::tests::{addr, conn};

const CHECKOUT: &str = "shop/checkout:http";
const NS: u32 = 4026532301;
const A: &str = "10.244.1.13:8080";

/// Seconds after 13:46:00.
fn at(seconds: f64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 0).unwrap()
        + chrono::TimeDelta::milliseconds((seconds * 1000.0) as i64)
}

fn id(n: u64) -> ConnId {
    ConnId {
        conntrack: n,
        start_ns: n,
    }
}

/// A connection to `backend` from `start` to `end` (None: open).
fn to(backend: &str, start: f64, end: Option<f64>) -> ConnRecord {
    let mut record = conn(Some(CHECKOUT), backend, 1, 1.0);
    record.start = at(start);
    record.end = end.map(at);
    record
}

fn endpoints(time: f64, added: &[&str], removed: &[&str]) -> EndpointsRecord {
    EndpointsRecord {
        service: CHECKOUT.into(),
        proto: Proto::Tcp,
        netns: NS,
        added: added.iter().map(|a| addr(a)).collect(),
        removed: removed.iter().map(|a| addr(a)).collect(),
        time: at(time),
    }
}

/// The live order: connections seen as they open, the change, then their ends.
#[test]
fn live_flip_reports_last_new_connection_stale_pins_and_first_after_return() {
    let mut timeline = Timeline::default();
    timeline.conn(id(1), &to(A, 1.0, None)); // keep-alive, pinned through the flip
    timeline.conn(id(2), &to(A, 2.0, Some(2.5))); // closed before the flip
    timeline.conn(id(3), &to("10.244.1.12:8080", 3.0, None));
    timeline.change(&endpoints(5.0, &[], &[A]));
    let live = timeline.service(CHECKOUT, Proto::Tcp);
    let left = &live.departures[0];
    assert_eq!(
        (left.backend, left.left, left.last_new, left.still_pinned()),
        (addr(A), at(5.0), Some(at(2.0)), 1)
    );
    assert_eq!(left.longest_pin(at(17.0)), Some(Duration::from_secs(12)));
    timeline.conn(id(1), &to(A, 1.0, Some(9.0)));
    timeline.change(&endpoints(20.0, &[A], &[]));
    timeline.conn(id(4), &to(A, 20.5, Some(21.0)));
    timeline.conn(id(5), &to(A, 20.2, Some(21.0)));
    let after = timeline.service(CHECKOUT, Proto::Tcp);
    let left = &after.departures[0];
    assert_eq!(left.still_pinned(), 0);
    assert_eq!(left.longest_pin(at(30.0)), Some(Duration::from_secs(4)));
    assert_eq!(left.pins[&id(1)].end, Some(at(9.0)));
    assert_eq!((left.late.len(), left.returned), (0, Some(at(20.0))));
    assert_eq!(
        after.arrivals,
        vec![Arrival {
            backend: addr(A),
            joined: at(20.0),
            first_conn: Some(at(20.2)),
        }]
    );
}

/// A recording's order: lines are written when connections end, after the change.
#[test]
fn recording_order_gives_the_same_story_and_counts_late_connections() {
    let recording = Recording {
        conns: vec![
            to(A, 2.0, Some(2.5)),
            to(A, 1.0, Some(9.0)),
            to(A, 6.0, Some(6.1)), // reached A after it left: the rules failed
            to(A, 4.0, Some(4.5)),
        ],
        endpoints: vec![endpoints(5.0, &[], &[A])],
        ..Recording::default()
    };
    let timeline = Timeline::from_recording(&recording);
    let left = &timeline.service(CHECKOUT, Proto::Tcp).departures[0];
    assert_eq!(left.last_new, Some(at(4.0)));
    let pins: Vec<(SocketAddr, Option<DateTime<Utc>>)> = left
        .pins
        .values()
        .map(|pin| (pin.client, pin.end))
        .collect();
    assert_eq!(pins, vec![(addr("10.244.1.9:45364"), Some(at(9.0)))]);
    assert_eq!(left.late.len(), 1);
    assert_eq!(left.longest_pin(at(60.0)), Some(Duration::from_secs(4)));
}

#[test]
fn other_services_backends_and_unnamed_connections_do_not_count() {
    let mut timeline = Timeline::default();
    timeline.change(&endpoints(5.0, &[], &[A]));
    let mut other = to(A, 1.0, None);
    other.service = Some("shop/cart:http".into());
    timeline.conn(id(1), &other);
    let mut unnamed = to(A, 1.0, None);
    unnamed.service = None;
    timeline.conn(id(2), &unnamed);
    timeline.conn(id(3), &to("10.244.1.12:8080", 6.0, None));
    let left = &timeline.service(CHECKOUT, Proto::Tcp).departures[0];
    assert_eq!(
        (left.last_new, left.pins.len(), left.late.len()),
        (None, 0, 0)
    );
    assert!(
        timeline
            .service("shop/cart:http", Proto::Tcp)
            .departures
            .is_empty()
    );
}
