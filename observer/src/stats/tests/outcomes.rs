//! Outcomes and connect times per backend and per Service, and rejected connections.

use std::collections::BTreeMap;

use super::*;
use crate::model::record::RejectRecord;
use crate::stats::aggregator::RECENT_CLOSED;

fn ended(backend: &str, close: Close, connect_ms: Option<f64>) -> ConnRecord {
    ConnRecord {
        close,
        connect_ms,
        ..conn(Some(CHECKOUT), backend, 1, 100.0)
    }
}

const A: &str = "10.244.1.12:8080";
const B: &str = "10.244.1.13:8080";
const C: &str = "10.244.1.14:8080";

#[test]
fn outcomes_count_per_backend_and_per_service() {
    let mut agg = Aggregator::default();
    agg.add_service(&three_endpoints());
    agg.apply(id(1), &ended(A, Close::Fin, Some(0.4)));
    agg.apply(id(2), &ended(A, Close::Fin, Some(0.6)));
    for n in 3..10 {
        agg.apply(id(n), &ended(B, Close::Refused, None));
    }
    for n in 10..16 {
        agg.apply(id(n), &ended(C, Close::Unanswered, None));
    }
    // A SYN still waiting for its answer: pending, then answered when its final record
    // comes (it counts once).
    let mut waiting = ended(A, Close::Open, None);
    waiting.bytes_from_backend = 0;
    agg.apply(id(16), &waiting);
    let s = &agg.services()[0];
    let counts = |answered, refused, unanswered, pending| OutcomeCounts {
        answered,
        refused,
        unanswered,
        pending,
    };
    assert_eq!(s.outcomes, counts(2, 7, 6, 1));
    assert_eq!(s.outcomes.failed(), 13);
    let per_backend: Vec<OutcomeCounts> = s.backends.iter().map(|b| b.outcomes).collect();
    assert_eq!(
        per_backend,
        [counts(2, 0, 0, 1), counts(0, 7, 0, 0), counts(0, 0, 6, 0)]
    );
    agg.apply(id(16), &ended(A, Close::Fin, Some(20.0)));
    let s = &agg.services()[0];
    assert_eq!(s.outcomes, counts(3, 7, 6, 0));
    assert_eq!(s.backends[0].outcomes, counts(3, 0, 0, 0));
    assert_eq!(s.connections, 16);
}

#[test]
fn connect_times_have_p50_p99_per_backend_and_per_service() {
    let mut agg = Aggregator::default();
    for n in 1..=100 {
        agg.apply(id(n), &ended(A, Close::Fin, Some(n as f64)));
    }
    agg.apply(id(101), &ended(B, Close::Fin, Some(1000.0)));
    // No connect time (UDP, adopted mid-stream): not counted.
    agg.apply(id(102), &ended(B, Close::Fin, None));
    let s = &agg.services()[0];
    assert_eq!(
        s.backends[0].connect_ms,
        Some(ConnectTimes {
            p50: 50.0,
            p99: 99.0
        })
    );
    assert_eq!(
        s.backends[1].connect_ms,
        Some(ConnectTimes {
            p50: 1000.0,
            p99: 1000.0
        })
    );
    // 101 values: ranks ceil(50.5) = 51 and ceil(99.99) = 100.
    assert_eq!(
        s.connect_ms,
        Some(ConnectTimes {
            p50: 51.0,
            p99: 100.0
        })
    );
    let histogram = s.backends[0].connect_histogram;
    assert_eq!((histogram.count, histogram.sum_us), (100, 5050 * 1000));
    // At most 1, 2.5, 5, 10, 25, 50, 100 ms, then everything.
    assert_eq!(
        histogram.cumulative(),
        [1, 2, 5, 10, 25, 50, 100, 100, 100, 100, 100, 100]
    );
    let slow = s.backends[1].connect_histogram;
    assert_eq!(
        (slow.count, slow.cumulative()[8], slow.cumulative()[9]),
        (1, 0, 1)
    );
}

#[test]
fn connect_times_survive_the_recent_window_and_replacement() {
    let mut agg = Aggregator::default();
    // Answered while open (the SYN-ACK came), then closed: one connect time.
    let mut open = ended(A, Close::Open, Some(3.0));
    open.end = None;
    agg.apply(id(0), &open);
    agg.apply(id(0), &ended(A, Close::Fin, Some(3.0)));
    for n in 1..=RECENT_CLOSED as u64 + 10 {
        agg.apply(id(n), &ended(B, Close::Fin, Some(0.5)));
    }
    let s = &agg.services()[0];
    let a = &s.backends[0];
    assert_eq!(a.connect_histogram.count, 1);
    assert_eq!(a.connect_ms, Some(ConnectTimes { p50: 3.0, p99: 3.0 }));
    let b = &s.backends[1];
    assert_eq!(b.connect_histogram.count, RECENT_CLOSED as u64 + 10);
    assert_eq!(b.connect_ms, Some(ConnectTimes { p50: 0.5, p99: 0.5 }));
    assert_eq!(agg.accs[0].backends[&addr(A)].connect_times.seen, 1);
}

#[test]
fn rejects_count_per_service_and_frontend_even_without_any_connection() {
    let mut agg = Aggregator::default();
    // The Service's rules list no endpoint.
    agg.add_service(&rules("shop/empty:http", &[]));
    for _ in 0..5 {
        agg.add_reject(&RejectRecord::example());
    }
    agg.add_reject(&RejectRecord {
        frontend: Some(FrontendKind::NodePort),
        ..RejectRecord::example()
    });
    // A UDP socket whose 12 datagrams were rejected, at a Service without rules.
    agg.add_reject(&RejectRecord {
        proto: Proto::Udp,
        service: Some("kube-system/kube-dns:dns".into()),
        original_dst: addr("10.96.0.10:53"),
        packets: Some(12),
        ..RejectRecord::example()
    });
    let services = agg.services();
    let listed: Vec<(&str, Proto, u64, u64, u64)> = services
        .iter()
        .map(|s| {
            (
                s.service.as_str(),
                s.proto,
                s.connections,
                s.rejected,
                s.rejected_datagrams,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("kube-system/kube-dns:dns", Proto::Udp, 0, 1, 12),
            ("shop/empty:http", Proto::Tcp, 0, 6, 0),
        ]
    );
    let empty = &services[1];
    assert!(empty.named && empty.has_rules && empty.backends.is_empty());
    assert_eq!(
        empty.rejected_by_frontend,
        BTreeMap::from([(FrontendKind::ClusterIp, 5), (FrontendKind::NodePort, 1)])
    );
    assert!(services[0].named && !services[0].has_rules);
    // Unnamed, they are grouped by what was dialed.
    agg.add_reject(&RejectRecord {
        service: None,
        ..RejectRecord::example()
    });
    let unnamed = &agg.services()[0];
    assert_eq!(
        (unnamed.service.as_str(), unnamed.named, unnamed.rejected),
        ("10.96.200.1:80", false, 1)
    );
    // From a recording, reject lines count the same.
    let recording = Recording {
        rejects: vec![RejectRecord::example(); 3],
        ..Recording::default()
    };
    let s = &Aggregator::from_recording(&recording).services()[0];
    assert_eq!((s.service.as_str(), s.rejected), ("shop/empty:http", 3));
}
