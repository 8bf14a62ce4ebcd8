//! `e`: what is on screen as JSON Lines (asked for by `update`, built here, written by
//! `run`).

use std::net::SocketAddr;

use serde::Serialize;

use super::state::{Detail, Screen, ServiceKey, Shown};
use crate::model::record::Proto;
use crate::stats::{ConnectTimes, OutcomeCounts, Percentiles};

/// The export's text and how many lines it has.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportFile {
    pub contents: String,
    pub lines: usize,
}

/// One row shown, as one line.
#[derive(Serialize)]
#[serde(tag = "type")]
enum Row<'a> {
    #[serde(rename = "service_row")]
    Service {
        service: &'a str,
        proto: Proto,
        frontend: String,
        active: u64,
        connections: u64,
        requests: u64,
        new_per_s: Option<f64>,
        requests_per_s: Option<f64>,
        backends: usize,
        skew: Option<f64>,
        stale_pins: u64,
        outcomes: &'a OutcomeCounts,
        rejected: u64,
    },
    #[serde(rename = "backend_row")]
    Backend {
        service: &'a str,
        proto: Proto,
        backend: SocketAddr,
        active: u64,
        connections: u64,
        requests: u64,
        request_share: f64,
        expected_share: Option<f64>,
        in_rules: bool,
        stale_pins: u64,
        lifetime_ms: &'a Option<Percentiles>,
        longest_pinned_ms: f64,
        outcomes: &'a OutcomeCounts,
        connect_ms: &'a Option<ConnectTimes>,
    },
    #[serde(rename = "connection_row")]
    Connection {
        service: &'a str,
        proto: Proto,
        client: SocketAddr,
        backend: SocketAddr,
        age_ms: f64,
        requests: u64,
        idle_ms: Option<f64>,
        close: &'static str,
    },
}

/// One JSON object per row shown: Service rows on the Services screen; backend rows then
/// connection rows on a Service screen.
pub fn file(screen: &Screen, shown: &Shown) -> ExportFile {
    let rows = match (screen, &shown.detail) {
        (Screen::Service(key), Some(detail)) => service_rows(key, shown, detail),
        _ => services_rows(shown),
    };
    ExportFile {
        contents: rows
            .iter()
            .map(|row| serde_json::to_string(row).expect("plain data serializes") + "\n")
            .collect(),
        lines: rows.len(),
    }
}

fn service_rows<'a>(key: &'a ServiceKey, shown: &'a Shown, detail: &'a Detail) -> Vec<Row<'a>> {
    let backends = shown
        .row(key)
        .into_iter()
        .flat_map(|row| &row.stats.backends);
    let backends = backends.map(|b| Row::Backend {
        service: &key.0,
        proto: key.1,
        backend: b.backend,
        active: b.active,
        connections: b.connections,
        requests: b.requests,
        request_share: b.request_share,
        expected_share: b.expected_share,
        in_rules: b.in_rules,
        stale_pins: b.stale_pins,
        lifetime_ms: &b.lifetime_ms,
        longest_pinned_ms: b.longest_pinned_ms,
        outcomes: &b.outcomes,
        connect_ms: &b.connect_ms,
    });
    let conns = detail.conns.iter().map(|conn| Row::Connection {
        service: &key.0,
        proto: key.1,
        client: conn.client,
        backend: conn.backend,
        age_ms: conn.age_ms,
        requests: conn.requests,
        idle_ms: conn.idle_ms,
        close: conn.close.as_str(),
    });
    backends.chain(conns).collect()
}

fn services_rows(shown: &Shown) -> Vec<Row<'_>> {
    shown
        .visible
        .iter()
        .map(|&index| {
            let row = &shown.rows[index];
            let s = &row.stats;
            Row::Service {
                service: &s.service,
                proto: s.proto,
                frontend: row.frontend(),
                active: s.active,
                connections: s.connections,
                requests: s.requests,
                new_per_s: row.new_per_s,
                requests_per_s: row.requests_per_s,
                backends: s.backends.len(),
                skew: s.skew,
                stale_pins: s.stale_pins,
                outcomes: &s.outcomes,
                rejected: s.rejected,
            }
        })
        .collect()
}
