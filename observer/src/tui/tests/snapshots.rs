//! Full-buffer snapshots of every screen, compared with `../snapshots/*.txt`.

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::style::Color;

use super::*;
use crate::tui::view::render;

pub(super) fn screen(app: &App, width: u16, height: u16) -> String {
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
pub(super) fn assert_snapshot(name: &str, actual: &str) {
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
    live_conn(&mut app, 1, c);
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
    assert_eq!(color_at(&app, (80, 24), 23, "lost 12"), Color::Red);
}

/// The colour of the first character of `text` on line `y` of the screen.
fn color_at(app: &App, (width, height): (u16, u16), y: u16, text: &str) -> Color {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| render(app, frame)).unwrap();
    let buffer = terminal.backend().buffer();
    let line: String = (0..width).map(|x| buffer[(x, y)].symbol()).collect();
    let x = line
        .find(text)
        .unwrap_or_else(|| panic!("{text:?} not in line {y}: {line:?}"));
    buffer[(line[..x].chars().count() as u16, y)].fg
}

/// Refused, unanswered and rejected connections: the FAILED and REJECT columns on the
/// Services screen; answered/refused/unanswered and connect times per backend, and the
/// failures spelled out, on the Service screen (80 columns give up the lifetime p50/p90
/// and CONNS for them; 120 have room for all); lost reject reports in the status bar.
#[test]
fn snapshot_refused_unanswered_and_rejected() {
    let mut app = failing();
    let services = screen(&app, 80, 24);
    assert_snapshot("outcomes_services", &services);
    // Red: failures and rejects where there are any, and the lost reports.
    assert_eq!(color_at(&app, (80, 24), 2, "13 "), Color::Red);
    assert_eq!(color_at(&app, (80, 24), 3, "5"), Color::Red);
    assert_eq!(color_at(&app, (80, 24), 23, "lost rejects 2"), Color::Red);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert_snapshot("outcomes_service", &screen(&app, 80, 24));
    // Refused and unanswered counts red, answered ones not; so are those connections.
    assert_eq!(color_at(&app, (80, 24), 3, "7/0"), Color::Red);
    assert_eq!(color_at(&app, (80, 24), 3, "0/7"), Color::Reset);
    assert_eq!(color_at(&app, (80, 24), 4, "6 "), Color::Red);
    assert_eq!(color_at(&app, (80, 24), 2, "5/0/0"), Color::Reset);
    assert_eq!(color_at(&app, (80, 24), 2, "0/0"), Color::Reset);
    assert_eq!(color_at(&app, (80, 24), 14, "unanswered"), Color::Red);
    // Why the Service is skewed, in magenta under the longest pin.
    assert_eq!(
        color_at(&app, (80, 24), 6, "? too few connections"),
        Color::Magenta
    );
    assert_snapshot("outcomes_service_wide", &screen(&app, 120, 24));
    // The compact layout shows the outcomes instead of the lifetime max, and no connect
    // times.
    assert_snapshot("outcomes_narrow_60x20_service", &screen(&app, 60, 20));
    // The Service that only rejects.
    assert_eq!(key(&mut app, KeyCode::Esc), None);
    keys(&mut app, "j");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    assert_snapshot("outcomes_rejects_only", &screen(&app, 80, 24));
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

/// A readiness flip on the Service screen: the pod left the rules 12 s ago and the
/// keep-alive connection is still pinned to it; another pod joined since.
#[test]
fn snapshot_endpoint_left_with_a_pin() {
    let mut app = steady();
    let change = |ms, added: &[&str], removed: &[&str]| {
        Update::Endpoints(crate::model::record::EndpointsRecord {
            service: CHECKOUT.to_owned(),
            proto: Proto::Tcp,
            netns: 4026532301,
            added: added.iter().map(|a| addr(a)).collect(),
            removed: removed.iter().map(|a| addr(a)).collect(),
            time: at(ms),
        })
    };
    // As the capture sends them: the new definition, then the change.
    let mut left = service(CHECKOUT, "10.96.35.226:80", &PODS[1..]);
    left.time = at(2000);
    live(&mut app, Update::Service(left));
    live(&mut app, change(2000, &[], &[PODS[0]]));
    let mut joined = service(
        CHECKOUT,
        "10.96.35.226:80",
        &[PODS[1], PODS[2], "10.244.4.2:3000"],
    );
    joined.time = at(9000);
    live(&mut app, Update::Service(joined));
    live(&mut app, change(9000, &["10.244.4.2:3000"], &[]));
    let mut first = conn(
        CHECKOUT,
        "10.244.1.9:50000",
        "10.244.4.2:3000",
        9250,
        10.0,
        1,
        Close::Fin,
    );
    first.endpoint_in_rules = Some(true);
    live_conn(&mut app, 2, first);
    live_conn(&mut app, 1, keep_alive(13000.0, 90, Close::Open));
    tick(&mut app, 14000);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let text = screen(&app, 80, 24);
    assert!(text.contains("! 10.244.1.13 left 12 s ago, 1 connection still pinned"));
    assert!(text.contains("! 10.244.4.2 joined 5 s ago, first connection 250.0ms after"));
    assert_snapshot("endpoint_left_with_a_pin", &text);
}

/// The keep-alive story of a rollout: the client's connection opened while only one pod
/// was ready and kept carrying its requests after the second became ready; the Service
/// screen says so in one line.
#[test]
fn snapshot_keep_alive_through_a_rollout() {
    let mut app = new_app();
    live(
        &mut app,
        Update::Service(service(CHECKOUT, "10.96.35.226:80", &PODS[..1])),
    );
    live_conn(&mut app, 1, keep_alive(2000.0, 12, Close::Open));
    let mut ready = service(CHECKOUT, "10.96.35.226:80", &PODS[..2]);
    ready.time = at(2500);
    live(&mut app, Update::Service(ready));
    live(
        &mut app,
        Update::Endpoints(crate::model::record::EndpointsRecord {
            service: CHECKOUT.to_owned(),
            proto: Proto::Tcp,
            netns: 4026532301,
            added: vec![addr(PODS[1])],
            removed: vec![],
            time: at(2500),
        }),
    );
    live_conn(&mut app, 1, keep_alive(6000.0, 30, Close::Open));
    tick(&mut app, 7000);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let text = screen(&app, 140, 24);
    assert!(
        text.contains("? rollout window: 30 requests on 1 keep-alive connection to 10.244.1.13:3000, opened 13:46:36, 2.00s before 10.244.2.7:3000 became ready"),
        "{text}"
    );
    assert_snapshot("keep_alive_through_a_rollout", &text);
}

/// A pod client pinned through the ClusterIP and an outside client through the NodePort,
/// with the pods the runtime named: pod names by default, `n` switches to addresses and
/// back.
#[test]
fn snapshot_pod_names_toggle() {
    let mut app = new_app();
    live(
        &mut app,
        Update::Service(service(CHECKOUT, "10.96.35.226:80", &PODS)),
    );
    let mut inside = keep_alive(4087.655, 30, Close::Open);
    inside.client_pod = Some("shop/frontend-7d4b9c-x2x4k".into());
    inside.backend_pod = Some("shop/checkout-5f6d8-abcde".into());
    inside.frontend = Some(FrontendKind::ClusterIp);
    live_conn(&mut app, 1, inside);
    let mut outside = conn(
        CHECKOUT,
        "172.18.0.1:51000",
        PODS[1],
        1500,
        120.0,
        1,
        Close::Fin,
    );
    outside.original_dst = addr("172.18.0.2:30080");
    outside.backend_pod = Some("shop/checkout-5f6d8-fghij".into());
    outside.frontend = Some(FrontendKind::NodePort);
    live_conn(&mut app, 2, outside);
    live(&mut app, Update::Stats(stats()));
    tick(&mut app, 5000);
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let by_name = screen(&app, 80, 24);
    assert_snapshot("pods_named_service", &by_name);
    keys(&mut app, "n");
    let by_ip = screen(&app, 80, 24);
    assert!(
        by_ip
            .lines()
            .next()
            .unwrap()
            .ends_with("showing IP addresses"),
        "{by_ip}"
    );
    assert_snapshot("pods_ip_service", &by_ip);
    keys(&mut app, "n");
    let back = screen(&app, 80, 24);
    // Only the notice in the header differs.
    assert_eq!(
        back.lines().skip(1).collect::<Vec<_>>(),
        by_name.lines().skip(1).collect::<Vec<_>>()
    );
    assert!(
        back.lines()
            .next()
            .unwrap()
            .ends_with("showing pod names where known")
    );
}
