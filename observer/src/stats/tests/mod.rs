//! Aggregator tests and the record builders they use.

use std::net::SocketAddr;

use chrono::{TimeZone, Utc};

use super::*;
use crate::model::record::{
    Close, ConnRecord, EndpointShare, Frontend, FrontendKind, Proto, Recording, ServiceRecord,
};
use crate::model::update::ConnId;

pub(crate) fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

pub(crate) fn conn(
    service: Option<&str>,
    backend: &str,
    requests: u64,
    duration_ms: f64,
) -> ConnRecord {
    ConnRecord {
        service: service.map(Into::into),
        endpoint_in_rules: service.map(|_| true),
        policy: None,
        same_node: None,
        duration_ms,
        requests,
        bytes_to_backend: requests * 93,
        bytes_from_backend: requests * 180,
        ..ConnRecord::example(backend)
    }
}

pub(crate) fn rules(service: &str, endpoints: &[(&str, f64)]) -> ServiceRecord {
    ServiceRecord {
        service: service.to_owned(),
        proto: Proto::Tcp,
        netns: 4026532301,
        frontends: vec![Frontend {
            kind: FrontendKind::ClusterIp,
            ip: Some("10.96.35.226".parse().unwrap()),
            port: 80,
        }],
        endpoints: endpoints
            .iter()
            .map(|(a, share)| EndpointShare {
                addr: addr(a),
                expected_share: *share,
                pod: None,
            })
            .collect(),
        local_endpoints: None,
        affinity: None,
        time: Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 30).unwrap(),
    }
}

fn id(n: u64) -> ConnId {
    ConnId {
        conntrack: n,
        start_ns: 7,
    }
}

const CHECKOUT: &str = "shop/checkout:http";
const THIRD: f64 = 1.0 / 3.0;

pub(crate) fn three_endpoints() -> ServiceRecord {
    rules(
        CHECKOUT,
        &[
            ("10.244.1.12:8080", THIRD),
            ("10.244.1.13:8080", THIRD),
            ("10.244.1.14:8080", THIRD),
        ],
    )
}

#[test]
fn keep_alive_client_shows_30_0_0_with_skew_3() {
    let mut agg = Aggregator::default();
    agg.add_service(&three_endpoints());
    agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 30, 4087.5));
    let services = agg.services();
    assert_eq!(services.len(), 1);
    let s = &services[0];
    assert_eq!(
        (s.service.as_str(), s.named, s.has_rules),
        (CHECKOUT, true, true)
    );
    assert_eq!(
        (s.connections, s.active, s.requests, s.stale_pins),
        (1, 0, 30, 0)
    );
    let requests: Vec<u64> = s.backends.iter().map(|b| b.requests).collect();
    assert_eq!(requests, [30, 0, 0]);
    let shares: Vec<f64> = s.backends.iter().map(|b| b.request_share).collect();
    assert_eq!(shares, [1.0, 0.0, 0.0]);
    assert_eq!(s.backends[1].connections, 0);
    assert_eq!(s.backends[1].lifetime_ms, None);
    assert_eq!(s.backends[1].expected_share, Some(THIRD));
    assert_eq!(s.skew, Some(1.0 / THIRD));
    let detail = s.skew_detail().unwrap();
    assert_eq!(
        (detail.backend.backend, detail.share),
        (addr("10.244.1.12:8080"), 1.0)
    );
    assert_eq!(s.frontends.len(), 1);
    let b = &s.backends[0];
    assert_eq!((b.bytes_to_backend, b.bytes_from_backend), (2790, 5400));
    assert_eq!(b.longest_pinned_ms, 4087.5);
    assert_eq!(
        b.lifetime_ms,
        Some(Percentiles {
            p50: 4087.5,
            p90: 4087.5,
            max: 4087.5
        })
    );
}

#[test]
fn percentiles_are_nearest_rank() {
    let values: Vec<f64> = (1..=10).rev().map(f64::from).collect();
    assert_eq!(
        percentiles(&values),
        Some(Percentiles {
            p50: 5.0,
            p90: 9.0,
            max: 10.0
        })
    );
    let values = vec![3.0, 1.0, 2.0];
    assert_eq!(
        percentiles(&values),
        Some(Percentiles {
            p50: 2.0,
            p90: 3.0,
            max: 3.0
        })
    );
    let values = vec![1.0, 2.0, 3.0, 4.0];
    // rank ceil(0.5 * 4) = 2, ceil(0.9 * 4) = 4
    assert_eq!(
        percentiles(&values),
        Some(Percentiles {
            p50: 2.0,
            p90: 4.0,
            max: 4.0
        })
    );
    assert_eq!(percentiles(&[]), None);
}

#[test]
fn percentiles_per_backend_through_the_aggregator() {
    let mut agg = Aggregator::default();
    for n in 1..=10 {
        agg.apply(
            id(n),
            &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, n as f64 * 100.0),
        );
    }
    agg.apply(id(11), &conn(Some(CHECKOUT), "10.244.1.13:8080", 1, 5.0));
    let s = &agg.services()[0];
    assert_eq!(
        s.backends[0].lifetime_ms,
        Some(Percentiles {
            p50: 500.0,
            p90: 900.0,
            max: 1000.0
        })
    );
    assert_eq!(s.backends[0].longest_pinned_ms, 1000.0);
    assert_eq!(
        s.backends[1].lifetime_ms,
        Some(Percentiles {
            p50: 5.0,
            p90: 5.0,
            max: 5.0
        })
    );
}

#[test]
fn replacing_by_id_updates_totals_instead_of_adding() {
    let mut agg = Aggregator::default();
    let mut open = conn(Some(CHECKOUT), "10.244.1.12:8080", 3, 100.0);
    open.close = Close::Open;
    open.end = None;
    agg.apply(id(1), &open);
    agg.apply(id(2), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 50.0));
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.active, s.requests), (2, 1, 4));
    assert_eq!(s.backends[0].lifetime_ms.unwrap().max, 100.0);

    // The same connection progresses, then closes.
    open.requests = 10;
    open.bytes_to_backend = 930;
    open.duration_ms = 2500.0;
    agg.apply(id(1), &open);
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.active, s.requests), (2, 1, 11));
    assert_eq!(s.backends[0].bytes_to_backend, 930 + 93);
    assert_eq!(
        s.backends[0].lifetime_ms,
        Some(Percentiles {
            p50: 50.0,
            p90: 2500.0,
            max: 2500.0
        })
    );
    open.close = Close::Fin;
    agg.apply(id(1), &open);
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.active, s.requests), (2, 0, 11));
    assert_eq!(s.backends[0].active, 0);
}

#[test]
fn replacing_with_another_backend_moves_the_connection() {
    let mut agg = Aggregator::default();
    agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 10.0));
    agg.apply(id(2), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 20.0));
    agg.apply(id(3), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 30.0));
    // id 1 moves: id 3's duration is swapped into its slot and must stay tracked.
    agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.13:8080", 2, 15.0));
    agg.apply(id(3), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 35.0));
    let s = &agg.services()[0];
    assert_eq!(s.backends.len(), 2);
    assert_eq!((s.backends[0].connections, s.backends[0].requests), (2, 2));
    assert_eq!(
        s.backends[0].lifetime_ms,
        Some(Percentiles {
            p50: 20.0,
            p90: 35.0,
            max: 35.0
        })
    );
    assert_eq!((s.backends[1].connections, s.backends[1].requests), (1, 2));
    assert_eq!(s.backends[1].lifetime_ms.unwrap().max, 15.0);
    // Moving the last connection away drops a backend that is not in any rules.
    agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 2, 15.0));
    let s = &agg.services()[0];
    assert_eq!(s.backends.len(), 1);
    assert_eq!((s.connections, s.requests), (3, 4));
}

#[test]
fn unnamed_services_are_grouped_by_original_dst_with_1_over_n_expected() {
    let mut agg = Aggregator::default();
    agg.apply(id(1), &conn(None, "10.244.1.12:8080", 3, 1.0));
    agg.apply(id(2), &conn(None, "10.244.1.13:8080", 1, 1.0));
    let mut other = conn(None, "10.244.2.5:53", 1, 1.0);
    other.original_dst = addr("10.96.0.10:53");
    other.proto = Proto::Udp;
    agg.apply(id(3), &other);
    let services = agg.services();
    let names: Vec<(&str, Proto, bool)> = services
        .iter()
        .map(|s| (s.service.as_str(), s.proto, s.named))
        .collect();
    assert_eq!(
        names,
        [
            ("10.96.0.10:53", Proto::Udp, false),
            ("10.96.35.226:80", Proto::Tcp, false)
        ]
    );
    let s = &services[1];
    assert!(!s.has_rules);
    assert_eq!(s.backends[0].expected_share, Some(0.5));
    assert!(s.backends.iter().all(|b| b.in_rules));
    assert_eq!(s.backends[0].request_share, 0.75);
    assert_eq!(s.skew, Some(1.5));
    assert!(s.frontends.is_empty());
}

#[test]
fn stale_pins_and_backends_missing_from_the_latest_rules() {
    let mut agg = Aggregator::default();
    agg.add_service(&rules(
        CHECKOUT,
        &[("10.244.1.12:8080", 0.5), ("10.244.1.99:8080", 0.5)],
    ));
    // The endpoint went away: a later ServiceRecord wins.
    agg.add_service(&rules(CHECKOUT, &[("10.244.1.12:8080", 1.0)]));
    let mut stale = conn(Some(CHECKOUT), "10.244.1.99:8080", 4, 9000.0);
    stale.endpoint_in_rules = Some(false);
    stale.close = Close::Open;
    agg.apply(id(1), &stale);
    agg.apply(id(2), &stale);
    agg.apply(id(3), &conn(Some(CHECKOUT), "10.244.1.12:8080", 8, 1.0));
    let s = &agg.services()[0];
    assert_eq!((s.stale_pins, s.active, s.requests), (2, 2, 16));
    let b: Vec<(SocketAddr, bool, Option<f64>, u64)> = s
        .backends
        .iter()
        .map(|b| (b.backend, b.in_rules, b.expected_share, b.stale_pins))
        .collect();
    assert_eq!(
        b,
        [
            (addr("10.244.1.12:8080"), true, Some(1.0), 0),
            (addr("10.244.1.99:8080"), false, None, 2),
        ]
    );
    // Requests to the stale backend do not count towards skew: the current
    // endpoint got all the others, as its share of 1.0 says.
    assert_eq!(s.skew, Some(1.0));
}

#[test]
fn services_without_connections_list_every_endpoint() {
    let mut agg = Aggregator::default();
    agg.add_service(&three_endpoints());
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.requests, s.skew), (0, 0, None));
    let listed: Vec<(SocketAddr, u64, f64)> = s
        .backends
        .iter()
        .map(|b| (b.backend, b.connections, b.request_share))
        .collect();
    assert_eq!(
        listed,
        [
            (addr("10.244.1.12:8080"), 0, 0.0),
            (addr("10.244.1.13:8080"), 0, 0.0),
            (addr("10.244.1.14:8080"), 0, 0.0),
        ]
    );
}

#[test]
fn connections_without_requests_have_no_skew() {
    let mut agg = Aggregator::default();
    agg.add_service(&three_endpoints());
    agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 0, 1.0));
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.requests, s.skew), (1, 0, None));
    assert_eq!(s.backends[0].request_share, 0.0);
}

#[test]
fn from_recording_uses_line_order_ids() {
    let recording = Recording {
        conns: vec![
            conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 1.0),
            conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 1.0),
        ],
        services: vec![three_endpoints()],
        endpoints: vec![],
        dns: vec![],
        rejects: vec![],
        marks: vec![],
        summary: None,
        cut: None,
    };
    let s = &Aggregator::from_recording(&recording).services()[0];
    // Identical records on different lines are different connections.
    assert_eq!((s.connections, s.requests, s.backends.len()), (2, 2, 3));
    assert_eq!(s.skew, Some(3.0));
}

mod frontends;
mod outcomes;
mod window;
