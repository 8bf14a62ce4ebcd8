//! `e`: what is on screen as JSON Lines (built here, written by `run`).

use serde_json::{Value, json};

use super::app::{App, Screen};
use super::view::close_text;

/// One JSON object per row shown: Service rows on the Services screen; backend rows then
/// connection rows on a Service screen.
pub fn lines(app: &App) -> Vec<String> {
    let mut values: Vec<Value> = Vec::new();
    match (&app.screen, &app.frame.detail) {
        (Screen::Service(key), Some(detail)) => {
            if let Some(row) = app.shown_service() {
                for b in &row.stats.backends {
                    values.push(json!({
                        "type": "backend_row",
                        "service": key.0,
                        "proto": key.1,
                        "backend": b.backend,
                        "active": b.active,
                        "connections": b.connections,
                        "requests": b.requests,
                        "request_share": b.request_share,
                        "expected_share": b.expected_share,
                        "in_rules": b.in_rules,
                        "stale_pins": b.stale_pins,
                        "lifetime_ms": b.lifetime_ms,
                        "longest_pinned_ms": b.longest_pinned_ms,
                    }));
                }
            }
            for conn in &detail.conns {
                values.push(json!({
                    "type": "connection_row",
                    "service": key.0,
                    "proto": key.1,
                    "client": conn.client,
                    "backend": conn.backend,
                    "age_ms": conn.age_ms,
                    "requests": conn.requests,
                    "idle_ms": conn.idle_ms,
                    "close": close_text(conn.close),
                }));
            }
        }
        _ => {
            for &index in &app.frame.visible {
                let row = &app.frame.rows[index];
                let s = &row.stats;
                values.push(json!({
                    "type": "service_row",
                    "service": s.service,
                    "proto": s.proto,
                    "frontend": row.frontend(),
                    "active": s.active,
                    "connections": s.connections,
                    "requests": s.requests,
                    "new_per_s": row.new_per_s,
                    "requests_per_s": row.requests_per_s,
                    "backends": s.backends.len(),
                    "skew": s.skew,
                    "stale_pins": s.stale_pins,
                }));
            }
        }
    }
    values.iter().map(Value::to_string).collect()
}
