//! Moving, filtering, sorting, opening a Service, help and quitting.

use super::*;
use crate::tui::state::{Screen, SortKey};

/// The Services shown, in order.
fn names(app: &App) -> Vec<String> {
    app.shown
        .visible
        .iter()
        .map(|&i| app.shown.rows[i].stats.service.clone())
        .collect()
}

#[test]
fn selection_stays_in_bounds() {
    let mut app = three_services();
    assert_eq!(app.shown.visible.len(), 3);
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
    assert_eq!((app.shown.visible.len(), app.selected), (1, 0));
}

#[test]
fn filter_matches_names_and_frontends_and_esc_clears_it() {
    let mut app = three_services();
    keys(&mut app, "/PAY");
    assert!(app.editing_filter);
    assert_eq!(names(&app), vec![PAYMENTS]);
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
    assert_eq!(names(&app), vec![KUBE_DNS]);
    assert_eq!(key(&mut app, KeyCode::Esc), None);
    assert_eq!(app.filter, "");
    assert_eq!(names(&app).len(), 3);
}

#[test]
fn s_cycles_sort_keys_and_reorders_rows() {
    let mut app = three_services();
    assert_eq!(app.sort, SortKey::Name);
    assert_eq!(names(&app), vec![KUBE_DNS, CHECKOUT, PAYMENTS]);
    keys(&mut app, "s");
    assert_eq!(app.sort, SortKey::Active);
    assert_eq!(names(&app), vec![CHECKOUT, KUBE_DNS, PAYMENTS]);
    keys(&mut app, "ss");
    assert_eq!(app.sort, SortKey::RequestsPerSec);
    assert_eq!(names(&app), vec![CHECKOUT, PAYMENTS, KUBE_DNS]);
    keys(&mut app, "s");
    assert_eq!(app.sort, SortKey::Skew);
    assert_eq!(names(&app), vec![CHECKOUT, PAYMENTS, KUBE_DNS]);
    keys(&mut app, "sss");
    assert_eq!(app.sort, SortKey::Active);
}

#[test]
fn the_selected_service_stays_selected_when_rows_reorder() {
    let mut app = three_services();
    keys(&mut app, "sj");
    assert_eq!(app.selected_row().unwrap().stats.service, KUBE_DNS);
    // Four open connections to payments move it to the top of the "active" order.
    for n in 0..4 {
        let record = conn(
            PAYMENTS,
            &format!("10.244.1.9:{}", 30000 + n),
            "10.244.1.20:9090",
            6500,
            1.0,
            1,
            Close::Open,
        );
        live_conn(&mut app, 200 + n, record);
    }
    tick(&mut app, 7000);
    assert_eq!(app.shown.rows.len(), 3);
    assert_eq!(app.selected, 2);
    assert_eq!(app.selected_row().unwrap().stats.service, KUBE_DNS);
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
    let detail = app.shown.detail.as_ref().unwrap();
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
    assert_eq!(app.shown.detail, None);
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
