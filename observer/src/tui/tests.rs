//! State-update tests and full-buffer snapshots of every screen. Snapshots live in
//! `snapshots/*.txt`; `OBSERVER_UPDATE_SNAPSHOTS=1 cargo test -p observer --lib tui`
//! rewrites them (review the diff before committing).

use std::net::SocketAddr;

use chrono::{DateTime, TimeDelta, Utc};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::app::{App, Effect, Msg, Screen, SortKey, update};
use super::conns::{Change, ConnTable};
use super::replay::replay_updates;
use super::view::render;
use crate::model::record::{
    Close, ConnRecord, EndpointShare, Frontend, FrontendKind, Proto, Recording, ServiceRecord,
};
use crate::model::update::{CaptureStats, ConnId, Update};

const CHECKOUT: &str = "shop/checkout:http";
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
            })
            .collect(),
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
        proto: Proto::Tcp,
        client: addr(client),
        original_dst: addr("10.96.35.226:80"),
        backend: addr(pod),
        service: Some(name.to_owned()),
        endpoint_in_rules: Some(true),
        netns: 4026532301,
        start: at(start_ms),
        end: (close != Close::Open)
            .then(|| at(start_ms) + TimeDelta::microseconds((duration_ms * 1000.0) as i64)),
        duration_ms,
        requests,
        bytes_to_backend: requests * 93,
        bytes_from_backend: requests * 180,
        close,
        start_seen: true,
    }
}

fn id(n: u64) -> ConnId {
    ConnId {
        conntrack: 0xffff_8880_0000_0000 + n,
        start_ns: n,
    }
}

fn live(app: &mut App, update_: Update) {
    assert_eq!(update(app, Msg::Live(update_)), None);
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
        hooks_attached: 3,
        netns_seen: 2,
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
    live(
        &mut app,
        Update::Conn {
            id: id(1),
            record: conn(
                CHECKOUT,
                "10.244.1.9:45364",
                PODS[0],
                500,
                4087.655,
                30,
                Close::Open,
            ),
        },
    );
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

/// `steady` plus two more Services, for filter and sort.
fn three_services() -> App {
    let mut app = steady();
    live(
        &mut app,
        Update::Service(service(
            "shop/payments:grpc",
            "10.96.12.40:9090",
            &["10.244.1.20:9090", "10.244.2.21:9090"],
        )),
    );
    live(
        &mut app,
        Update::Service(service(
            "kube-system/kube-dns:dns-tcp",
            "10.96.0.10:53",
            &["10.244.0.2:53"],
        )),
    );
    for n in 0..4 {
        let client = format!("10.244.1.9:{}", 50000 + n);
        let pod = if n % 2 == 0 {
            "10.244.1.20:9090"
        } else {
            "10.244.2.21:9090"
        };
        let record = conn(
            "shop/payments:grpc",
            &client,
            pod,
            4000 + n as i64 * 100,
            120.0,
            2,
            Close::Fin,
        );
        live(
            &mut app,
            Update::Conn {
                id: id(10 + n),
                record,
            },
        );
    }
    tick(&mut app, 6000);
    app
}

fn screen(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| render(app, frame)).unwrap();
    let buffer = terminal.backend().buffer();
    let mut text = String::new();
    for y in 0..height {
        for x in 0..width {
            text.push_str(buffer[(x, y)].symbol());
        }
        text.push('\n');
    }
    text
}

/// Compares the whole screen with `snapshots/<name>.txt`.
fn assert_snapshot(name: &str, actual: &str) {
    let path = format!(
        "{}/src/tui/snapshots/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::env::var_os("OBSERVER_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"));
    assert!(
        expected == actual,
        "{name} differs from {path}\n--- expected\n{expected}--- actual\n{actual}"
    );
}

// ---- state updates ----

#[test]
fn a_later_record_replaces_the_one_with_the_same_id() {
    let mut app = steady();
    live(
        &mut app,
        Update::Conn {
            id: id(1),
            record: conn(
                CHECKOUT,
                "10.244.1.9:45364",
                PODS[0],
                500,
                9000.0,
                42,
                Close::Open,
            ),
        },
    );
    tick(&mut app, 6000);
    let row = app.selected_row().unwrap();
    assert_eq!(
        (row.stats.connections, row.stats.active, row.stats.requests),
        (1, 1, 42)
    );

    live(
        &mut app,
        Update::Conn {
            id: id(1),
            record: conn(
                CHECKOUT,
                "10.244.1.9:45364",
                PODS[0],
                500,
                9500.0,
                43,
                Close::Fin,
            ),
        },
    );
    tick(&mut app, 7000);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let detail = app.frame.detail.clone().unwrap();
    assert_eq!((detail.open, detail.closed, detail.conns.len()), (0, 1, 1));
    assert_eq!(detail.conns[0].requests, 43);
    assert_eq!(detail.conns[0].age_ms, 9500.0);
    assert_eq!(detail.histogram, [0, 0, 0, 1, 0, 0]);
    let row = app.shown_service().unwrap();
    assert_eq!(
        (row.stats.connections, row.stats.active, row.stats.requests),
        (1, 0, 43)
    );
}

#[test]
fn closed_connections_kept_are_capped_oldest_first() {
    let mut table = ConnTable::new(2);
    for n in 0..3 {
        let record = conn(
            CHECKOUT,
            &format!("10.0.0.1:{}", 1000 + n),
            PODS[0],
            0,
            1.0,
            1,
            Close::Fin,
        );
        assert_eq!(table.apply(id(n), record), Change::Closed);
    }
    let kept: Vec<u64> = table.closed().map(|(id, _)| id.start_ns).collect();
    assert_eq!(kept, vec![2, 1]);
    // A second final record of a kept connection replaces it without counting twice.
    let again = conn(CHECKOUT, "10.0.0.1:1002", PODS[0], 0, 2.0, 5, Close::Fin);
    assert_eq!(table.apply(id(2), again), Change::Progressed);
    assert_eq!(table.closed().next().unwrap().1.requests, 5);
    assert_eq!((table.open().count(), table.closed().count()), (0, 2));
}

#[test]
fn rates_come_from_deltas_between_ticks() {
    let mut app = steady();
    for n in 0..10 {
        let record = conn(
            CHECKOUT,
            &format!("10.244.1.9:{}", 40000 + n),
            PODS[1],
            5100,
            10.0,
            3,
            Close::Fin,
        );
        live(
            &mut app,
            Update::Conn {
                id: id(100 + n),
                record,
            },
        );
    }
    live(
        &mut app,
        Update::Stats(CaptureStats {
            events: 135,
            ..stats()
        }),
    );
    tick(&mut app, 6000);
    let row = app.selected_row().unwrap();
    // Samples at 1 s (0 connections), 5 s (1) and 6 s (11): the oldest sample kept is the
    // newest one at least the 2 s window old, the one at 1 s.
    assert_eq!(row.new_per_s, Some(11.0 / 5.0));
    assert_eq!(row.requests_per_s, Some(60.0 / 5.0));
    assert_eq!(app.frame.events_per_s, Some(135.0 / 5.0));
}

#[test]
fn aggregates_refresh_at_most_once_a_second() {
    let mut app = steady();
    let record = conn(
        CHECKOUT,
        "10.244.1.9:40000",
        PODS[1],
        5100,
        10.0,
        3,
        Close::Fin,
    );
    live(
        &mut app,
        Update::Conn {
            id: id(100),
            record,
        },
    );
    tick(&mut app, 5250);
    assert_eq!(app.selected_row().unwrap().stats.connections, 1);
    tick(&mut app, 6000);
    assert_eq!(app.selected_row().unwrap().stats.connections, 2);
}

#[test]
fn selection_stays_in_bounds() {
    let mut app = three_services();
    assert_eq!(app.frame.visible.len(), 3);
    assert_eq!(key(&mut app, KeyCode::Up), None);
    assert_eq!(app.selected, 0);
    keys(&mut app, "jjjjj");
    assert_eq!(app.selected, 2);
    keys(&mut app, "k");
    assert_eq!(app.selected, 1);
    keys(&mut app, "G");
    assert_eq!(app.selected, 2);
    keys(&mut app, "g");
    assert_eq!(app.selected, 0);
    // Narrowing the list pulls the cursor back onto it.
    keys(&mut app, "G/checkout");
    assert_eq!((app.frame.visible.len(), app.selected), (1, 0));
}

#[test]
fn filter_matches_names_and_frontends_and_esc_clears_it() {
    let mut app = three_services();
    keys(&mut app, "/PAY");
    assert!(app.editing_filter);
    let names = |app: &App| -> Vec<String> {
        app.frame
            .visible
            .iter()
            .map(|&i| app.frame.rows[i].stats.service.clone())
            .collect()
    };
    assert_eq!(names(&app), vec!["shop/payments:grpc"]);
    // While typing, q and s are text, not commands.
    keys(&mut app, "qs");
    assert_eq!(app.filter, "PAYqs");
    assert_eq!(names(&app), Vec::<String>::new());
    assert_eq!(key(&mut app, KeyCode::Backspace), None);
    assert_eq!(key(&mut app, KeyCode::Backspace), None);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert!(!app.editing_filter);
    assert_eq!(app.filter, "PAY");
    keys(&mut app, "/");
    for _ in 0..3 {
        assert_eq!(key(&mut app, KeyCode::Backspace), None);
    }
    keys(&mut app, "10.96.0.");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert_eq!(names(&app), vec!["kube-system/kube-dns:dns-tcp"]);
    assert_eq!(key(&mut app, KeyCode::Esc), None);
    assert_eq!(app.filter, "");
    assert_eq!(names(&app).len(), 3);
}

#[test]
fn s_cycles_sort_keys_and_reorders_rows() {
    let mut app = three_services();
    let names = |app: &App| -> Vec<String> {
        app.frame
            .visible
            .iter()
            .map(|&i| app.frame.rows[i].stats.service.clone())
            .collect()
    };
    assert_eq!(app.sort, SortKey::Name);
    assert_eq!(
        names(&app),
        vec![
            "kube-system/kube-dns:dns-tcp",
            CHECKOUT,
            "shop/payments:grpc"
        ]
    );
    keys(&mut app, "s");
    assert_eq!(app.sort, SortKey::Active);
    assert_eq!(
        names(&app),
        vec![
            CHECKOUT,
            "kube-system/kube-dns:dns-tcp",
            "shop/payments:grpc"
        ]
    );
    keys(&mut app, "ss");
    assert_eq!(app.sort, SortKey::RequestsPerSec);
    assert_eq!(
        names(&app),
        vec![
            CHECKOUT,
            "shop/payments:grpc",
            "kube-system/kube-dns:dns-tcp"
        ]
    );
    keys(&mut app, "s");
    assert_eq!(app.sort, SortKey::Skew);
    assert_eq!(
        names(&app),
        vec![
            CHECKOUT,
            "shop/payments:grpc",
            "kube-system/kube-dns:dns-tcp"
        ]
    );
    keys(&mut app, "sss");
    assert_eq!(app.sort, SortKey::Active);
}

#[test]
fn the_selected_service_stays_selected_when_rows_reorder() {
    let mut app = three_services();
    keys(&mut app, "sj");
    assert_eq!(
        app.selected_row().unwrap().stats.service,
        "kube-system/kube-dns:dns-tcp"
    );
    // Four open connections to payments move it to the top of the "active" order.
    for n in 0..4 {
        let record = conn(
            "shop/payments:grpc",
            &format!("10.244.1.9:{}", 30000 + n),
            "10.244.1.20:9090",
            6500,
            1.0,
            1,
            Close::Open,
        );
        live(
            &mut app,
            Update::Conn {
                id: id(200 + n),
                record,
            },
        );
    }
    tick(&mut app, 7000);
    assert_eq!(app.frame.rows.len(), 3);
    assert_eq!(app.selected, 2);
    assert_eq!(
        app.selected_row().unwrap().stats.service,
        "kube-system/kube-dns:dns-tcp"
    );
}

#[test]
fn pause_freezes_the_screen_but_keeps_counting() {
    let mut app = steady();
    keys(&mut app, "p");
    assert!(app.paused);
    let record = conn(
        CHECKOUT,
        "10.244.1.9:40000",
        PODS[1],
        5100,
        10.0,
        3,
        Close::Open,
    );
    live(
        &mut app,
        Update::Conn {
            id: id(100),
            record,
        },
    );
    tick(&mut app, 9000);
    assert_eq!(app.selected_row().unwrap().stats.active, 1);
    assert_eq!(app.frame.at, Some(at(5000)));
    keys(&mut app, "p");
    assert!(!app.paused);
    assert_eq!(app.selected_row().unwrap().stats.active, 2);
    assert_eq!(app.frame.at, Some(at(9000)));
}

#[test]
fn reset_forgets_closed_connections_and_lost_events() {
    let mut app = steady();
    let record = conn(
        CHECKOUT,
        "10.244.1.9:40000",
        PODS[1],
        5100,
        10.0,
        3,
        Close::Fin,
    );
    live(
        &mut app,
        Update::Conn {
            id: id(100),
            record,
        },
    );
    live(
        &mut app,
        Update::Stats(CaptureStats {
            lost_connections: 7,
            ..stats()
        }),
    );
    tick(&mut app, 6000);
    assert_eq!(app.lost_connections(), 7);
    assert_eq!(app.selected_row().unwrap().stats.connections, 2);
    keys(&mut app, "r");
    assert_eq!(app.lost_connections(), 0);
    let row = app.selected_row().unwrap();
    assert_eq!(
        (row.stats.connections, row.stats.active, row.stats.requests),
        (1, 1, 30)
    );
    assert_eq!(row.new_per_s, None);
    assert_eq!(app.message.as_deref(), Some("counters reset"));
    // Lost connections after the reset count again.
    live(
        &mut app,
        Update::Stats(CaptureStats {
            lost_connections: 9,
            ..stats()
        }),
    );
    assert_eq!(app.lost_connections(), 2);
}

#[test]
fn enter_opens_the_selected_service_and_esc_goes_back() {
    let mut app = three_services();
    keys(&mut app, "j");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert_eq!(
        app.screen,
        Screen::Service((CHECKOUT.to_owned(), Proto::Tcp))
    );
    let detail = app.frame.detail.as_ref().unwrap();
    assert_eq!((detail.open, detail.closed), (1, 0));
    assert_eq!(detail.conns[0].client, addr("10.244.1.9:45364"));
    // Age from the first packet to the tick at 6 s; idle since the last packet.
    assert_eq!(detail.conns[0].age_ms, 5500.0);
    assert_eq!(detail.conns[0].idle_ms, Some(5500.0 - 4087.655));
    // `s` and `/` do nothing on the Service screen.
    keys(&mut app, "s/");
    assert_eq!((app.sort, app.editing_filter), (SortKey::Name, false));
    assert_eq!(key(&mut app, KeyCode::Esc), None);
    assert_eq!(app.screen, Screen::Services);
    assert_eq!(app.frame.detail, None);
    assert_eq!(app.selected, 1);
}

#[test]
fn quit_keys_and_help() {
    let mut app = steady();
    assert_eq!(key(&mut app, KeyCode::Char('q')), Some(Effect::Quit));
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    keys(&mut app, "/");
    assert_eq!(update(&mut app, Msg::Key(ctrl_c)), Some(Effect::Quit));
    assert_eq!(key(&mut app, KeyCode::Esc), None);
    keys(&mut app, "?");
    assert!(app.help);
    keys(&mut app, "j");
    assert!(!app.help);
    assert_eq!(app.selected, 0);
}

#[test]
fn export_writes_the_rows_on_screen() {
    let mut app = three_services();
    keys(&mut app, "/payments");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let Some(Effect::Export {
        path,
        contents,
        lines,
    }) = key(&mut app, KeyCode::Char('e'))
    else {
        panic!("e did not export");
    };
    assert_eq!(path, "observer-export-20260806T134642Z.jsonl");
    assert_eq!(lines, 1);
    assert_eq!(
        contents,
        concat!(
            r#"{"active":0,"backends":2,"connections":4,"frontend":"10.96.12.40:9090","new_per_s":0.8,"#,
            r#""proto":"tcp","requests":8,"requests_per_s":1.6,"service":"shop/payments:grpc","skew":1.0,"#,
            r#""stale_pins":0,"type":"service_row"}"#,
            "\n"
        )
    );
    assert_eq!(
        update(
            &mut app,
            Msg::Exported {
                path: path.clone(),
                result: Ok(lines)
            }
        ),
        None
    );
    assert_eq!(
        app.message.as_deref(),
        Some("exported 1 lines to observer-export-20260806T134642Z.jsonl")
    );

    keys(&mut app, "");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let Some(Effect::Export {
        contents, lines, ..
    }) = key(&mut app, KeyCode::Char('e'))
    else {
        panic!("e did not export");
    };
    assert_eq!(lines, 6);
    let first: Vec<&str> = contents.lines().map(|l| &l[..40.min(l.len())]).collect();
    assert_eq!(
        first,
        vec![
            r#"{"active":0,"backend":"10.244.1.20:9090""#,
            r#"{"active":0,"backend":"10.244.2.21:9090""#,
            r#"{"age_ms":120.0,"backend":"10.244.2.21:9"#,
            r#"{"age_ms":120.0,"backend":"10.244.1.20:9"#,
            r#"{"age_ms":120.0,"backend":"10.244.2.21:9"#,
            r#"{"age_ms":120.0,"backend":"10.244.1.20:9"#,
        ]
    );
}

#[test]
fn replay_turns_a_recording_into_updates() {
    let mut recording = Recording::default();
    recording
        .services
        .push(service(CHECKOUT, "10.96.35.226:80", &PODS));
    recording.conns.push(conn(
        CHECKOUT,
        "10.244.1.9:2",
        PODS[1],
        900,
        5.0,
        1,
        Close::Fin,
    ));
    recording.conns.push(conn(
        CHECKOUT,
        "10.244.1.9:1",
        PODS[0],
        100,
        4087.655,
        30,
        Close::Open,
    ));
    let updates = replay_updates(&recording);
    assert_eq!(updates.len(), 4);
    assert_eq!(updates[0], Update::Service(recording.services[0].clone()));
    let start_ns = |ms: i64| u64::try_from(at(ms).timestamp_nanos_opt().unwrap()).unwrap();
    assert_eq!(
        updates[1],
        Update::Conn {
            id: ConnId {
                conntrack: 1,
                start_ns: start_ns(100)
            },
            record: recording.conns[1].clone()
        }
    );
    assert_eq!(
        updates[2],
        Update::Conn {
            id: ConnId {
                conntrack: 0,
                start_ns: start_ns(900)
            },
            record: recording.conns[0].clone()
        }
    );
    assert_eq!(
        updates[3],
        Update::Stats(CaptureStats {
            netns_seen: 1,
            live_connections: 1,
            ..CaptureStats::default()
        })
    );

    // In the view, ages and rates run on the recording's own clock.
    let mut app = App::new("replay", Some("shop.jsonl".to_owned()), true, at(3_600_000));
    for update_ in updates {
        live(&mut app, update_);
    }
    assert_eq!(update(&mut app, Msg::UpdatesClosed), None);
    tick(&mut app, 3_600_000);
    let row = app.selected_row().unwrap();
    let span_s = 4.087655;
    assert_eq!(row.new_per_s, Some(2.0 / span_s));
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let detail = app.frame.detail.as_ref().unwrap();
    assert_eq!(detail.conns[0].age_ms, 4087.655);
    assert_eq!(detail.conns[0].idle_ms, Some(0.0));
}

// ---- snapshots ----

#[test]
fn snapshot_empty() {
    let mut app = new_app();
    tick(&mut app, 0);
    assert_snapshot("empty", &screen(&app, 80, 24));
}

#[test]
fn snapshot_steady_services() {
    assert_snapshot("steady_services", &screen(&steady(), 80, 24));
}

#[test]
fn snapshot_steady_service() {
    let mut app = steady();
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert_snapshot("steady_service", &screen(&app, 80, 24));
}

#[test]
fn snapshot_filtered_and_paused() {
    let mut app = three_services();
    keys(&mut app, "/shop");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    keys(&mut app, "sjp");
    assert_snapshot("filtered", &screen(&app, 80, 24));
}

#[test]
fn snapshot_filter_without_matches() {
    let mut app = three_services();
    keys(&mut app, "/nothing");
    assert_snapshot("filter_no_match", &screen(&app, 80, 24));
}

#[test]
fn snapshot_long_names() {
    let mut app = new_app();
    let name = "a-very-long-namespace-name/an-even-longer-service-name-that-goes-on:https-metrics";
    let pod = "[fd00:10:244:1::1234]:8443";
    let mut record = service(name, "[fd00:10:96::abcd]:443", &[pod]);
    record.frontends.push(Frontend {
        kind: FrontendKind::NodePort,
        ip: None,
        port: 30443,
    });
    live(&mut app, Update::Service(record));
    let mut c = conn(
        name,
        "[fd00:10:244:2::9876]:54321",
        pod,
        0,
        1500.0,
        4,
        Close::Open,
    );
    c.original_dst = addr("[fd00:10:96::abcd]:443");
    live(
        &mut app,
        Update::Conn {
            id: id(1),
            record: c,
        },
    );
    live(
        &mut app,
        Update::Stats(CaptureStats {
            recording: Some(
                "/var/lib/observer/recordings/a-very-long-recording-file-name-2026-08-06.jsonl"
                    .to_owned(),
            ),
            ..stats()
        }),
    );
    tick(&mut app, 2000);
    assert_snapshot("long_names_services", &screen(&app, 80, 24));
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert_snapshot("long_names_service", &screen(&app, 80, 24));
}

#[test]
fn snapshot_lost_events() {
    let mut app = steady();
    live(
        &mut app,
        Update::Stats(CaptureStats {
            lost_connections: 12,
            events: 95,
            ..stats()
        }),
    );
    tick(&mut app, 6000);
    let text = screen(&app, 80, 24);
    assert_snapshot("lost_events", &text);
    // The count is drawn red.
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    terminal.draw(|frame| render(&app, frame)).unwrap();
    let status = text.lines().nth(23).unwrap();
    let x = status.find("lost 12").unwrap();
    let x = status[..x].chars().count() as u16;
    assert_eq!(
        terminal.backend().buffer()[(x, 23)].fg,
        ratatui::style::Color::Red
    );
}

#[test]
fn snapshot_narrow() {
    let mut app = three_services();
    assert_snapshot("narrow_60x20_services", &screen(&app, 60, 20));
    keys(&mut app, "j");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert_snapshot("narrow_60x20_service", &screen(&app, 60, 20));
    assert_snapshot("narrow_40x10_service", &screen(&app, 40, 10));
    assert_snapshot("too_small_30x8", &screen(&app, 30, 8));
}

#[test]
fn snapshot_help_and_replay_status() {
    let mut app = App::new("shop.jsonl", Some("shop.jsonl".to_owned()), true, at(0));
    live(
        &mut app,
        Update::Service(service(CHECKOUT, "10.96.35.226:80", &PODS)),
    );
    tick(&mut app, 0);
    keys(&mut app, "?");
    assert_snapshot("help_replay", &screen(&app, 80, 24));
}

#[test]
fn the_connection_list_is_capped_oldest_open_first() {
    use super::app::CONN_ROWS;
    let mut app = steady();
    let extra = CONN_ROWS as u64 + 5;
    for n in 0..extra {
        // Newer starts for higher n; none older than the keep-alive connection.
        let client = format!("10.244.9.{}:{}", n / 60000, 1 + n % 60000);
        let record = conn(
            CHECKOUT,
            &client,
            PODS[1],
            600 + n as i64,
            1.0,
            1,
            Close::Open,
        );
        live(
            &mut app,
            Update::Conn {
                id: id(1000 + n),
                record,
            },
        );
    }
    let record = conn(
        CHECKOUT,
        "10.244.1.9:1",
        PODS[2],
        700,
        9000.0,
        2,
        Close::Fin,
    );
    live(&mut app, Update::Conn { id: id(2), record });
    tick(&mut app, 6000);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let detail = app.frame.detail.as_ref().unwrap();
    assert_eq!(
        (detail.open, detail.closed, detail.conns.len()),
        (extra as usize + 1, 1, CONN_ROWS)
    );
    assert_eq!(detail.conns[0].client, addr("10.244.1.9:45364"));
    assert_eq!(detail.conns[1].client, addr("10.244.9.0:1"));
    assert_eq!(
        detail.conns[CONN_ROWS - 1].client,
        addr(&format!("10.244.9.0:{}", CONN_ROWS - 1))
    );
    // The closed connection pinned for 9 s beats the open one's 5.5 s.
    assert_eq!(
        detail.longest.as_ref().map(|c| (c.client, c.age_ms)),
        Some((addr("10.244.1.9:1"), 9000.0))
    );
    // 1 ms opens, then the keep-alive connection (4.1 s) and the closed one (9 s).
    assert_eq!(detail.histogram, [extra, 0, 0, 2, 0, 0]);
}
