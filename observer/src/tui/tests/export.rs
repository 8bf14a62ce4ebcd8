//! `e`: the rows on screen as JSON Lines.

use super::*;
use crate::tui::export::{self, ExportFile};

/// Presses `e`; returns the path asked for and the file `run` would write there.
fn press_e(app: &mut App) -> (String, ExportFile) {
    let Some(Effect::Export {
        path,
        screen,
        shown,
    }) = key(app, KeyCode::Char('e'))
    else {
        panic!("e did not export");
    };
    // What is exported is what is drawn.
    assert_eq!((&screen, &*shown), (&app.screen, &app.shown));
    (path, export::file(&screen, &shown))
}

#[test]
fn export_writes_the_rows_on_screen() {
    let mut app = three_services();
    keys(&mut app, "/payments");
    assert_eq!(key(&mut app, KeyCode::Enter), None);
    let (path, ExportFile { contents, lines }) = press_e(&mut app);
    assert_eq!(path, "observer-export-20260806T134642Z.jsonl");
    assert_eq!(lines, 1);
    assert_eq!(
        contents,
        concat!(
            r#"{"active":0,"backends":2,"connections":4,"frontend":"10.96.12.40:9090","new_per_s":0.8,"#,
            r#""outcomes":{"answered":4,"pending":0,"refused":0,"unanswered":0},"proto":"tcp","#,
            r#""rejected":0,"requests":8,"requests_per_s":1.6,"service":"shop/payments:grpc","skew":1.0,"#,
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
    let (_, ExportFile { contents, lines }) = press_e(&mut app);
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
