//! The Service screen: its backends and their shares, the longest-pinned connection,
//! the lifetime histogram, then its connections.

use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;

use super::widgets::{Align, count, histogram_text, row, scroll, share_bar, truncate};
use super::{BOLD, DIM, SELECTED};
use crate::model::record::Close;
use crate::sinks::text::{Digits, duration};
use crate::stats::{BackendStats, Percentiles};
use crate::tui::labels::close_text;
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
    let mut lines = backend_lines(backends, backend_rows, width, compact);
    lines.push(Line::raw(truncate(&longest_text(detail), width)));
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
    lines.extend(connection_lines(
        detail,
        app.conn_selected,
        conn_lines,
        width,
        compact,
    ));
    lines
}

/// How wide the backend table's columns are.
struct BackendColumns {
    compact: bool,
    addr: usize,
    bar: usize,
    /// The bar, a space and the percentage.
    share: usize,
}

impl BackendColumns {
    fn new(width: usize, compact: bool) -> BackendColumns {
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
        if self.compact {
            row(&[
                ("BACKEND", self.addr, Align::Left),
                ("ACTIVE", 6, Align::Right),
                ("REQS", 6, Align::Right),
                (share_title, self.share, Align::Left),
                ("MAX", 6, Align::Right),
            ])
        } else {
            row(&[
                ("BACKEND", self.addr, Align::Left),
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
        let mut addr = backend.backend.to_string();
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
) -> Vec<Line<'static>> {
    let columns = BackendColumns::new(width, compact);
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

fn longest_text(detail: &Detail) -> String {
    match &detail.longest {
        Some(conn) => format!(
            "longest pinned: {} → {}  {}  requests {}  {}",
            conn.client,
            conn.backend,
            duration(conn.age_ms, Digits::Compact),
            conn.requests,
            close_text(conn.close)
        ),
        None => "longest pinned: -".to_owned(),
    }
}

/// The connections' title and header, then up to `rows` connections scrolled so that
/// `selected` shows.
fn connection_lines(
    detail: &Detail,
    selected: usize,
    rows: usize,
    width: usize,
    compact: bool,
) -> Vec<Line<'static>> {
    let title = format!(
        "CONNECTIONS {} open, {} closed kept; open oldest first",
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
                cells(["CLIENT", "BACKEND", "AGE", "REQS", "IDLE", "STATE"])
            ),
            BOLD,
        ),
    ];
    let first = scroll(selected, rows);
    for (index, conn) in detail.conns.iter().enumerate().skip(first).take(rows) {
        let texts = conn_texts(conn);
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

fn conn_texts(conn: &ConnRow) -> [String; 6] {
    [
        conn.client.to_string(),
        conn.backend.to_string(),
        duration(conn.age_ms, Digits::Compact),
        count(conn.requests),
        conn.idle_ms
            .map_or("-".to_owned(), |ms| duration(ms, Digits::Compact)),
        close_text(conn.close).to_owned(),
    ]
}
