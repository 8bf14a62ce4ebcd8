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
            r#"{"type":"service_row","service":"shop/payments:grpc","proto":"tcp","#,
            r#""frontend":"10.96.12.40:9090","active":0,"connections":4,"requests":8,"new_per_s":0.8,"#,
            r#""requests_per_s":1.6,"backends":2,"skew":1.0,"stale_pins":0,"#,
            r#""outcomes":{"answered":4,"refused":0,"unanswered":0,"pending":0},"rejected":0}"#,
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
    let rows: Vec<(String, String)> = contents
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let text = |key: &str| row[key].as_str().unwrap().to_owned();
            (text("type"), text("backend"))
        })
        .collect();
    let row = |kind: &str, backend: &str| (kind.to_owned(), backend.to_owned());
    assert_eq!(
        rows,
        [
            row("backend_row", "10.244.1.20:9090"),
            row("backend_row", "10.244.2.21:9090"),
            row("connection_row", "10.244.2.21:9090"),
            row("connection_row", "10.244.1.20:9090"),
            row("connection_row", "10.244.2.21:9090"),
            row("connection_row", "10.244.1.20:9090"),
        ]
    );
    assert!(
        contents
            .lines()
            .all(|line| line.starts_with(r#"{"type":""#)),
        "each line starts with its type: {contents}"
    );
}
