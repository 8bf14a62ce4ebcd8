//! Capture updates, ticks, pause and reset: what the state keeps and computes.

use super::*;
use crate::tui::state::CONN_ROWS;
use crate::tui::state::conns::{Change, ConnTable};

/// `steady` gets a second client, to the second pod, 5.1 s after t0.
fn second_client(app: &mut App, close: Close) {
    let record = conn(CHECKOUT, "10.244.1.9:40000", PODS[1], 5100, 10.0, 3, close);
    live_conn(app, 100, record);
}

#[test]
fn a_later_record_replaces_the_one_with_the_same_id() {
    let mut app = steady();
    live_conn(&mut app, 1, keep_alive(9000.0, 42, Close::Open));
    tick(&mut app, 6000);
    let row = app.selected_row().unwrap();
    assert_eq!(
        (row.stats.connections, row.stats.active, row.stats.requests),
        (1, 1, 42)
    );

    live_conn(&mut app, 1, keep_alive(9500.0, 43, Close::Fin));
    tick(&mut app, 7000);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let detail = app.shown.detail.clone().unwrap();
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
        live_conn(&mut app, 100 + n, record);
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
    assert_eq!(app.shown.events_per_s, Some(135.0 / 5.0));
}

#[test]
fn aggregates_refresh_at_most_once_a_second() {
    let mut app = steady();
    second_client(&mut app, Close::Fin);
    tick(&mut app, 5250);
    assert_eq!(app.selected_row().unwrap().stats.connections, 1);
    tick(&mut app, 6000);
    assert_eq!(app.selected_row().unwrap().stats.connections, 2);
}

#[test]
fn pause_freezes_the_screen_but_keeps_counting() {
    let mut app = steady();
    keys(&mut app, "p");
    assert!(app.paused);
    second_client(&mut app, Close::Open);
    tick(&mut app, 9000);
    assert_eq!(app.selected_row().unwrap().stats.active, 1);
    assert_eq!(app.shown.at, Some(at(5000)));
    keys(&mut app, "p");
    assert!(!app.paused);
    assert_eq!(app.selected_row().unwrap().stats.active, 2);
    assert_eq!(app.shown.at, Some(at(9000)));
}

#[test]
fn reset_forgets_closed_connections_and_lost_events() {
    let mut app = steady();
    second_client(&mut app, Close::Fin);
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
fn the_connection_list_is_capped_oldest_open_first() {
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
        live_conn(&mut app, 1000 + n, record);
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
    live_conn(&mut app, 2, record);
    tick(&mut app, 6000);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let detail = app.shown.detail.as_ref().unwrap();
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
