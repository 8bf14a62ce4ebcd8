//! State-update tests and full-buffer snapshots of every screen, with the fixtures they
//! share. Snapshots live in `../snapshots/*.txt`;
//! `OBSERVER_UPDATE_SNAPSHOTS=1 cargo test -p observer --lib tui` rewrites them (review
//! the diff before committing).

mod dns;
mod export;
mod keys;
mod pressure;
mod replay;
mod snapshots;
mod state;

use std::net::SocketAddr;

use chrono::{DateTime, TimeDelta, Utc};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::state::{App, Effect, Msg, update};
use crate::model::record::{
    Close, ConnRecord, EndpointShare, Frontend, FrontendKind, Proto, ServiceRecord,
};
use crate::model::update::{CaptureStats, ConnId, Update};

const CHECKOUT: &str = "shop/checkout:http";
const PAYMENTS: &str = "shop/payments:grpc";
const KUBE_DNS: &str = "kube-system/kube-dns:dns-tcp";
const PODS: [&str; 3] = ["10.244.1.13:3000", "10.244.2.7:3000", "10.244.3.4:3000"];

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-08-06T13:46:36.412345Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn at(ms: i64) -> DateTime<Utc> {
    t0() + TimeDelta::milliseconds(ms)
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn service(name: &str, cluster_ip: &str, pods: &[&str]) -> ServiceRecord {
    let cluster: SocketAddr = addr(cluster_ip);
    ServiceRecord {
        service: name.to_owned(),
        proto: Proto::Tcp,
        netns: 4026532301,
        frontends: vec![Frontend {
            kind: FrontendKind::ClusterIp,
            ip: Some(cluster.ip()),
            port: cluster.port(),
        }],
        endpoints: pods
            .iter()
            .map(|pod| EndpointShare {
                addr: addr(pod),
                expected_share: 1.0 / pods.len() as f64,
                pod: None,
            })
            .collect(),
        local_endpoints: None,
        affinity: None,
        time: t0(),
    }
}

/// A connection to `name` pinned to `pod`, started `start_ms` after t0.
fn conn(
    name: &str,
    client: &str,
    pod: &str,
    start_ms: i64,
    duration_ms: f64,
    requests: u64,
    close: Close,
) -> ConnRecord {
    ConnRecord {
        client: addr(client),
        service: Some(name.into()),
        endpoint_in_rules: Some(true),
        policy: None,
        same_node: None,
        start: at(start_ms),
        end: (close != Close::Open)
            .then(|| at(start_ms) + TimeDelta::microseconds((duration_ms * 1000.0) as i64)),
        duration_ms,
        requests,
        bytes_to_backend: requests * 93,
        bytes_from_backend: requests * 180,
        close,
        ..ConnRecord::example(pod)
    }
}

/// `steady`'s keep-alive client on the first pod, opened 500 ms after t0.
fn keep_alive(duration_ms: f64, requests: u64, close: Close) -> ConnRecord {
    conn(
        CHECKOUT,
        "10.244.1.9:45364",
        PODS[0],
        500,
        duration_ms,
        requests,
        close,
    )
}

fn id(n: u64) -> ConnId {
    ConnId {
        conntrack: 0xffff_8880_0000_0000 + n,
        start_ns: n,
    }
}

fn live(app: &mut App, update_: Update) {
    assert_eq!(update(app, Msg::Live(Box::new(update_))), None);
}

/// Feeds connection `n`'s latest record.
fn live_conn(app: &mut App, n: u64, record: ConnRecord) {
    live(app, Update::Conn { id: id(n), record });
}

fn key(app: &mut App, code: KeyCode) -> Option<Effect> {
    update(app, Msg::Key(KeyEvent::new(code, KeyModifiers::NONE)))
}

fn keys(app: &mut App, text: &str) {
    for c in text.chars() {
        assert_eq!(key(app, KeyCode::Char(c)), None, "key {c}");
    }
}

fn tick(app: &mut App, ms: i64) {
    assert_eq!(update(app, Msg::Tick(at(ms))), None);
}

fn stats() -> CaptureStats {
    CaptureStats {
        events: 0,
        dnat_events: 1,
        lost_connections: 0,
        lost_events: 0,
        read_errors: 0,
        dns_malformed: 0,
        dns_lost: 0,
        lost_rejects: 0,
        hooks_attached: 3,
        netns_seen: 2,
        blind_spots: 0,
        live_connections: 1,
        recording: None,
    }
}

fn new_app() -> App {
    App::new("node-1", None, false, at(0))
}

/// One keep-alive client: 30 requests on one connection to the first pod, 0 to the
/// others; shown 5 s after it opened.
fn steady() -> App {
    let mut app = new_app();
    live(
        &mut app,
        Update::Service(service(CHECKOUT, "10.96.35.226:80", &PODS)),
    );
    live(&mut app, Update::Stats(stats()));
    tick(&mut app, 1000);
    live_conn(&mut app, 1, keep_alive(4087.655, 30, Close::Open));
    live(
        &mut app,
        Update::Stats(CaptureStats {
            events: 95,
            ..stats()
        }),
    );
    tick(&mut app, 5000);
    app
}

const EMPTY: &str = "shop/empty:http";

/// The lab: the first pod answers 5 connections (connect 0.3 to 12.5 ms), the
/// second refuses 7 (nothing listens), the third leaves 6 unanswered; `shop/empty:http`
/// has no endpoints and rejects 5 attempts; 2 reject reports were lost. Shown 10 s in.
fn failing() -> App {
    let mut app = new_app();
    live(
        &mut app,
        Update::Service(service(CHECKOUT, "10.96.35.226:80", &PODS)),
    );
    live(
        &mut app,
        Update::Service(service(EMPTY, "10.96.200.1:80", &[])),
    );
    let mut n = 0;
    let mut attempt = |app: &mut App, pod: &str, close: Close, connect_ms: Option<f64>| {
        n += 1;
        // Answered: one request; refused: the RST came at once; unanswered: the last
        // SYN retransmission 3 s after the first.
        let (duration_ms, requests) = match close {
            Close::Refused => (0.087, 0),
            Close::Unanswered => (3000.0, 0),
            _ => (8.0, 1),
        };
        let record = ConnRecord {
            connect_ms,
            ..conn(
                CHECKOUT,
                &format!("10.244.1.9:{}", 41000 + n),
                pod,
                n as i64 * 300,
                duration_ms,
                requests,
                close,
            )
        };
        live_conn(app, n, record);
    };
    for connect_ms in [0.31, 0.29, 0.4, 0.35, 12.5] {
        attempt(&mut app, PODS[0], Close::Fin, Some(connect_ms));
    }
    for _ in 0..7 {
        attempt(&mut app, PODS[1], Close::Refused, None);
    }
    for _ in 0..6 {
        attempt(&mut app, PODS[2], Close::Unanswered, None);
    }
    for port in 0..5 {
        live(
            &mut app,
            Update::Reject(crate::model::record::RejectRecord {
                client: addr(&format!("10.244.1.9:{}", 40000 + port)),
                time: at(1000 + i64::from(port) * 200),
                ..crate::model::record::RejectRecord::example()
            }),
        );
    }
    live(
        &mut app,
        Update::Stats(CaptureStats {
            events: 40,
            lost_rejects: 2,
            ..stats()
        }),
    );
    tick(&mut app, 10_000);
    app
}

/// `steady` plus two more Services, for filter and sort.
fn three_services() -> App {
    let mut app = steady();
    live(
        &mut app,
        Update::Service(service(
            PAYMENTS,
            "10.96.12.40:9090",
            &["10.244.1.20:9090", "10.244.2.21:9090"],
        )),
    );
    live(
        &mut app,
        Update::Service(service(KUBE_DNS, "10.96.0.10:53", &["10.244.0.2:53"])),
    );
    for n in 0..4 {
        let client = format!("10.244.1.9:{}", 50000 + n);
        let pod = if n % 2 == 0 {
            "10.244.1.20:9090"
        } else {
            "10.244.2.21:9090"
        };
        let record = conn(
            PAYMENTS,
            &client,
            pod,
            4000 + n as i64 * 100,
            120.0,
            2,
            Close::Fin,
        );
        live_conn(&mut app, 10 + n, record);
    }
    tick(&mut app, 6000);
    app
}
