//! The Service screen: its backends and their shares, the longest-pinned connection,
//! the lifetime histogram, then its connections.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;

use super::widgets::{Align, count, histogram_text, row, scroll, share_bar, truncate};
use super::{BOLD, DIM, SELECTED};
use crate::model::record::{Close, FrontendKind};
use crate::sinks::text::{Digits, door_text, duration};
use crate::stats::{BackendStats, Percentiles};
use crate::tui::state::{App, ConnRow, Detail};

pub(super) fn service_screen(
    app: &App,
    detail: &Detail,
    area: Rect,
    compact: bool,
) -> Vec<Line<'static>> {
    let width = usize::from(area.width);
    let height = usize::from(area.height);
    let backends: &[BackendStats] = app.shown_service().map_or(&[], |row| &row.stats.backends);
    // Backend header, longest-pinned line, histogram line, connections title and header.
    let fixed_lines = if compact && height < 16 { 4 } else { 5 };
    let backend_rows = backends
        .len()
        .min(((height.saturating_sub(fixed_lines)) / 2).max(1));
    let names = app.pod_names;
    let mut lines = backend_lines(backends, backend_rows, width, compact, names);
    lines.push(Line::raw(truncate(&longest_text(detail, names), width)));
    // Endpoint changes, only when there were any: the rest moves down.
    let yellow = Style::default().fg(Color::Yellow);
    for change in &detail.changes {
        lines.push(Line::styled(
            truncate(&format!("! {change}"), width),
            yellow,
        ));
    }
    if fixed_lines == 5 {
        lines.push(Line::raw(truncate(
            &histogram_text(&detail.histogram),
            width,
        )));
    }
    let conn_lines = height.saturating_sub(lines.len() + 2);
    let doors = app
        .shown_service()
        .map(|row| doors_text(&row.stats.doors))
        .unwrap_or_default();
    lines.extend(connection_lines(
        detail,
        ConnView {
            selected: app.conn_selected,
            rows: conn_lines,
            width,
            compact,
            names,
            doors,
        },
    ));
    lines
}

/// " │ doors ClusterIP 6 NodePort 4", or nothing when no connection's door is known.
fn doors_text(doors: &BTreeMap<FrontendKind, u64>) -> String {
    if doors.is_empty() {
        return String::new();
    }
    let counts: Vec<String> = doors
        .iter()
        .map(|(door, n)| format!("{} {n}", door_text(*door)))
        .collect();
    format!(" │ doors {}", counts.join(" "))
}

/// An address as the current mode shows it: the pod where known (`n`), else the IP. A
/// pod name too long for `width` loses its start, not the suffix that tells replicas apart.
fn shown_addr(addr: SocketAddr, pod: Option<&String>, names: bool, width: usize) -> String {
    match pod {
        Some(pod) if names => {
            let chars = pod.chars().count();
            if chars <= width || width == 0 {
                pod.clone()
            } else {
                let tail: String = pod.chars().skip(chars - (width - 1)).collect();
                format!("…{tail}")
            }
        }
        _ => addr.to_string(),
    }
}

/// How wide the backend table's columns are.
struct BackendColumns {
    compact: bool,
    names: bool,
    addr: usize,
    bar: usize,
    /// The bar, a space and the percentage.
    share: usize,
}

impl BackendColumns {
    fn new(width: usize, compact: bool, names: bool) -> BackendColumns {
        let pct_width = 4;
        let (addr, bar) = if compact {
            let bar = 10;
            (
                width.saturating_sub(6 + 6 + bar + pct_width + 6 + 5).max(8),
                bar,
            )
        } else {
            (
                21,
                width
                    .saturating_sub(21 + 6 + 6 + 6 + pct_width + 6 + 6 + 6 + 8)
                    .max(5),
            )
        };
        BackendColumns {
            compact,
            names,
            addr,
            bar,
            share: bar + 1 + pct_width,
        }
    }

    fn header(&self) -> String {
        let share_title = if self.share >= 16 {
            "SHARE │=expected"
        } else {
            "SHARE"
        };
        let title = if self.names { "BACKEND POD" } else { "BACKEND" };
        if self.compact {
            row(&[
                (title, self.addr, Align::Left),
                ("ACTIVE", 6, Align::Right),
                ("REQS", 6, Align::Right),
                (share_title, self.share, Align::Left),
                ("MAX", 6, Align::Right),
            ])
        } else {
            row(&[
                (title, self.addr, Align::Left),
                ("ACTIVE", 6, Align::Right),
                ("CONNS", 6, Align::Right),
                ("REQS", 6, Align::Right),
                (share_title, self.share, Align::Left),
                ("P50", 6, Align::Right),
                ("P90", 6, Align::Right),
                ("MAX", 6, Align::Right),
            ])
        }
    }

    fn cells(&self, backend: &BackendStats) -> String {
        let share = format!(
            "{} {:>3.0}%",
            share_bar(backend.request_share, backend.expected_share, self.bar),
            backend.request_share * 100.0
        );
        let lifetime = |pick: fn(&Percentiles) -> f64| {
            backend
                .lifetime_ms
                .as_ref()
                .map_or("-".to_owned(), |p| duration(pick(p), Digits::Compact))
        };
        let mut addr = shown_addr(backend.backend, backend.pod.as_ref(), self.names, self.addr);
        if !backend.in_rules {
            addr.push_str(" gone");
        }
        if self.compact {
            row(&[
                (&addr, self.addr, Align::Left),
                (&count(backend.active), 6, Align::Right),
                (&count(backend.requests), 6, Align::Right),
                (&share, self.share, Align::Left),
                (&lifetime(|p| p.max), 6, Align::Right),
            ])
        } else {
            row(&[
                (&addr, self.addr, Align::Left),
                (&count(backend.active), 6, Align::Right),
                (&count(backend.connections), 6, Align::Right),
                (&count(backend.requests), 6, Align::Right),
                (&share, self.share, Align::Left),
                (&lifetime(|p| p.p50), 6, Align::Right),
                (&lifetime(|p| p.p90), 6, Align::Right),
                (&lifetime(|p| p.max), 6, Align::Right),
            ])
        }
    }
}

/// The backend table's header and up to `rows` backends, the last one giving way to
/// how many more there are.
fn backend_lines(
    backends: &[BackendStats],
    rows: usize,
    width: usize,
    compact: bool,
    names: bool,
) -> Vec<Line<'static>> {
    let columns = BackendColumns::new(width, compact, names);
    let mut lines = vec![Line::styled(columns.header(), BOLD)];
    for backend in backends.iter().take(rows) {
        let style = if backend.in_rules {
            Style::new()
        } else {
            Style::new().fg(Color::Yellow)
        };
        lines.push(Line::styled(columns.cells(backend), style));
    }
    if backends.len() > rows {
        // Replace the last row with how many are hidden rather than hiding it silently.
        lines.pop();
        lines.push(Line::styled(
            format!("… {} more backends", backends.len() - rows + 1),
            DIM,
        ));
    }
    lines
}

fn longest_text(detail: &Detail, names: bool) -> String {
    match &detail.longest {
        Some(conn) => format!(
            "longest pinned: {} → {}  {}  requests {}  {}",
            shown_addr(conn.client, conn.client_pod.as_ref(), names, usize::MAX),
            shown_addr(conn.backend, conn.backend_pod.as_ref(), names, usize::MAX),
            duration(conn.age_ms, Digits::Compact),
            conn.requests,
            conn.close.as_str()
        ),
        None => "longest pinned: -".to_owned(),
    }
}

/// How the connection list is laid out.
struct ConnView {
    selected: usize,
    rows: usize,
    width: usize,
    compact: bool,
    names: bool,
    /// Appended to the title: connections per door.
    doors: String,
}

/// The connections' title and header, then up to `rows` connections scrolled so that
/// `selected` shows.
fn connection_lines(detail: &Detail, view: ConnView) -> Vec<Line<'static>> {
    let ConnView {
        selected,
        rows,
        width,
        compact,
        names,
        doors,
    } = view;
    // With doors to show, the order goes unsaid: the rows show it.
    let order = if doors.is_empty() {
        "; open oldest first"
    } else {
        ""
    };
    let title = format!(
        "CONNECTIONS {} open, {} closed kept{order}{doors}",
        detail.open, detail.closed
    );
    let addr = if compact {
        (width.saturating_sub(2 + 7 + 6 + 3) / 2).max(8)
    } else {
        21
    };
    let cells = |texts: [&str; 6]| {
        let [client, backend, age, requests, idle, state] = texts;
        let mut cells = vec![
            (client, addr, Align::Left),
            (backend, addr, Align::Left),
            (age, 7, Align::Right),
            (requests, 6, Align::Right),
        ];
        if !compact {
            cells.push((idle, 7, Align::Right));
            cells.push((state, 7, Align::Left));
        }
        row(&cells)
    };
    let mut lines = vec![
        Line::styled(truncate(&title, width), BOLD),
        Line::styled(
            format!(
                "  {}",
                if names {
                    cells(["CLIENT POD", "BACKEND POD", "AGE", "REQS", "IDLE", "STATE"])
                } else {
                    cells(["CLIENT", "BACKEND", "AGE", "REQS", "IDLE", "STATE"])
                }
            ),
            BOLD,
        ),
    ];
    let first = scroll(selected, rows);
    for (index, conn) in detail.conns.iter().enumerate().skip(first).take(rows) {
        let texts = conn_texts(conn, names, addr);
        let text = cells(texts.each_ref().map(String::as_str));
        let marker = if index == selected { "> " } else { "  " };
        let style = if index == selected {
            SELECTED
        } else if conn.close == Close::Open {
            Style::new()
        } else {
            DIM
        };
        lines.push(Line::styled(format!("{marker}{text}"), style));
    }
    lines
}

fn conn_texts(conn: &ConnRow, names: bool, width: usize) -> [String; 6] {
    [
        shown_addr(conn.client, conn.client_pod.as_ref(), names, width),
        shown_addr(conn.backend, conn.backend_pod.as_ref(), names, width),
        duration(conn.age_ms, Digits::Compact),
        count(conn.requests),
        conn.idle_ms
            .map_or("-".to_owned(), |ms| duration(ms, Digits::Compact)),
        conn.close.as_str().to_owned(),
    ]
}
