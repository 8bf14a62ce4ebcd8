//! A recording browsed as if it were live.

use super::*;
use crate::model::record::Recording;
use crate::tui::replay::replay_updates;

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
    let detail = app.shown.detail.as_ref().unwrap();
    assert_eq!(detail.conns[0].age_ms, 4087.655);
    assert_eq!(detail.conns[0].idle_ms, Some(0.0));
}

/// A replayed flip shows on the Service screen like a live one.
#[test]
fn replay_marks_endpoint_changes() {
    let mut recording = Recording::default();
    recording
        .services
        .push(service(CHECKOUT, "10.96.35.226:80", &PODS));
    recording
        .endpoints
        .push(crate::model::record::EndpointsRecord {
            service: CHECKOUT.to_owned(),
            proto: Proto::Tcp,
            netns: 4026532301,
            added: vec![],
            removed: vec![addr(PODS[0])],
            time: at(2000),
        });
    recording.conns.push(keep_alive(9000.0, 30, Close::Fin));
    let updates = replay_updates(&recording);
    assert_eq!(
        updates[1],
        Update::Endpoints(recording.endpoints[0].clone())
    );
    let mut app = App::new("replay", None, true, at(0));
    for update_ in updates {
        live(&mut app, update_);
    }
    tick(&mut app, 0);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let changes = &app.shown.detail.as_ref().unwrap().changes;
    // The replay's clock is the data's: the connection's end, 9.5 s after t0.
    assert_eq!(changes, &["10.244.1.13 left 7 s ago".to_owned()]);
}

/// A log with dns lines replays them to the DNS screen, with the malformed count.
#[test]
fn replay_shows_dns_lines() {
    let recording = Recording::read(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/logs/dns.jsonl"
    )))
    .unwrap();
    let mut app = new_app();
    for update_ in replay_updates(&recording) {
        live(&mut app, update_);
    }
    assert_eq!(app.dns.len(), 11);
    assert_eq!(app.capture.dns_malformed, 2);
}

/// A recording with refused, unanswered and rejected connections shows them as a live
/// capture would: the same counts `observer summary` prints for it.
#[test]
fn replayed_outcomes_and_rejects_show_like_live_ones() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/logs/outcomes.jsonl"
    );
    let recording = Recording::read(std::path::Path::new(path)).unwrap();
    let mut app = App::new("outcomes.jsonl", None, true, at(0));
    for update_ in replay_updates(&recording) {
        live(&mut app, update_);
    }
    assert_eq!(update(&mut app, Msg::UpdatesClosed), None);
    tick(&mut app, 0);
    let rows: Vec<(&str, u64, u64, u64)> = app
        .shown
        .rows
        .iter()
        .map(|row| {
            let s = &row.stats;
            (
                s.service.as_str(),
                s.outcomes.refused,
                s.outcomes.unanswered,
                s.rejected,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (CHECKOUT, 7, 6, 0),
            ("shop/empty:dns", 0, 0, 1),
            ("shop/empty:http", 0, 0, 5)
        ]
    );
    let services = super::snapshots::screen(&app, 100, 24);
    assert!(services.contains(" FAILED REJECT\n"), "{services}");
    assert!(services.contains("     13      0\n"), "{services}");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let checkout = super::snapshots::screen(&app, 100, 24);
    for text in [
        "      11/0/0  330µs/12ms\n",
        "       0/7/0           -\n",
        "! 7 refused by 10.244.1.13:8080 (nothing listens)",
        "! 6 unanswered by 10.244.1.14:8080 (nothing came back)",
    ] {
        assert!(checkout.contains(text), "{text:?} in\n{checkout}");
    }
}
