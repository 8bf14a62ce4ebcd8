//! `e`: what is on screen as JSON Lines (asked for by `update`, built here, written by
//! `run`).

use serde_json::{Value, json};

use super::state::{Detail, Screen, ServiceKey, Shown};

/// The export's text and how many lines it has.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportFile {
    pub contents: String,
    pub lines: usize,
}

/// One JSON object per row shown: Service rows on the Services screen; backend rows then
/// connection rows on a Service screen.
pub fn file(screen: &Screen, shown: &Shown) -> ExportFile {
    let values = match (screen, &shown.detail) {
        (Screen::Service(key), Some(detail)) => service_values(key, shown, detail),
        _ => services_values(shown),
    };
    ExportFile {
        contents: values.iter().map(|value| format!("{value}\n")).collect(),
        lines: values.len(),
    }
}

fn service_values(key: &ServiceKey, shown: &Shown, detail: &Detail) -> Vec<Value> {
    let mut values: Vec<Value> = Vec::new();
    if let Some(row) = shown.row(key) {
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
                "outcomes": b.outcomes,
                "connect_ms": b.connect_ms,
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
            "close": conn.close.as_str(),
        }));
    }
    values
}

fn services_values(shown: &Shown) -> Vec<Value> {
    shown
        .visible
        .iter()
        .map(|&index| {
            let row = &shown.rows[index];
            let s = &row.stats;
            json!({
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
                "outcomes": s.outcomes,
                "rejected": s.rejected,
            })
        })
        .collect()
}
