//! The Service screen: its backends and their shares, the longest-pinned connection,
//! the lifetime histogram, then its connections.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};

use super::widgets::{
    Align, Parts, count, histogram_text, plain, row, scroll, share_bar, styled_row, truncate,
};
use super::{ALERT, BOLD, DIM, SELECTED};
use crate::model::record::{Close, FrontendKind};
use crate::report::summary::failure_lines;
use crate::report::text::{Digits, duration, frontend_kind_text, latency};
use crate::stats::{BackendStats, OutcomeCounts, Percentiles};
use crate::tui::state::{App, ConnRow, Detail};

/// Failure lines shown at most ("7 refused by 10.244.1.13:8080 (nothing listens)").
const FAILURE_MARKS: usize = 3;

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
    // Endpoint changes and failures, only when there were any: the rest moves down.
    let yellow = Style::default().fg(Color::Yellow);
    for change in &detail.changes {
        lines.push(Line::styled(
            truncate(&format!("! {change}"), width),
            yellow,
        ));
    }
    // Why it is skewed, when it is: the cause and the keep-alive story.
    let magenta = Style::default().fg(Color::Magenta);
    for reason in &detail.reasons {
        lines.push(Line::styled(
            truncate(&format!("? {reason}"), width),
            magenta,
        ));
    }
    let failures = app
        .shown_service()
        .map(|row| failure_lines(&row.stats, names));
    let red = Style::default().fg(Color::Red);
    for failure in failures.unwrap_or_default().iter().take(FAILURE_MARKS) {
        lines.push(Line::styled(truncate(&format!("! {failure}"), width), red));
    }
    if fixed_lines == 5 {
        lines.push(Line::raw(truncate(
            &histogram_text(&detail.histogram),
            width,
        )));
    }
    let conn_lines = height.saturating_sub(lines.len() + 2);
    let frontends = app
        .shown_service()
        .map(|row| frontends_text(&row.stats.by_frontend))
        .unwrap_or_default();
    lines.extend(connection_lines(
        detail,
        ConnView {
            selected: app.conn_selected,
            rows: conn_lines,
            width,
            compact,
            // Headers say POD only when a pod is known; otherwise addresses show either way.
            names: names
                && detail
                    .conns
                    .iter()
                    .any(|c| c.client_pod.is_some() || c.backend_pod.is_some()),
            frontends,
        },
    ));
    lines
}

/// " │ frontends ClusterIP 6 NodePort 4", or nothing when no connection's frontend is known.
fn frontends_text(frontends: &BTreeMap<FrontendKind, u64>) -> String {
    if frontends.is_empty() {
        return String::new();
    }
    let counts: Vec<String> = frontends
        .iter()
        .map(|(frontend, n)| format!("{} {n}", frontend_kind_text(*frontend)))
        .collect();
    format!(" │ frontends {}", counts.join(" "))
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

/// A column of the backend table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    Addr,
    Active,
    Conns,
    Reqs,
    Share,
    /// Pinning lifetimes: p50, p90, max.
    P50,
    P90,
    Max,
    /// Answered/refused/unanswered, when any connection failed (compact: instead of MAX).
    Outcomes,
    /// Connect-time p50/p99, when any was measured (full layout).
    Connect,
}

/// The full layout gives these up, in order, before the share bar gets narrower than
/// `MIN_BAR`: the histogram line still shows lifetimes, the outcomes add up to CONNS.
const GIVEN_UP_FIRST: [Column; 3] = [Column::P90, Column::P50, Column::Conns];
const MIN_BAR: usize = 5;
/// The percentage after the bar.
const PCT_WIDTH: usize = 4;

impl Column {
    /// Its width; the address and the share bar are sized by `BackendColumns`.
    fn width(self) -> usize {
        match self {
            Column::Addr | Column::Share => 0,
            Column::Outcomes | Column::Connect => 11,
            _ => 6,
        }
    }
}

/// Which columns the backend table has and how wide they are.
struct BackendColumns {
    names: bool,
    columns: Vec<Column>,
    addr: usize,
    bar: usize,
    /// The bar, a space and the percentage.
    share: usize,
}

impl BackendColumns {
    fn new(width: usize, compact: bool, names: bool, backends: &[BackendStats]) -> BackendColumns {
        use Column::*;
        let mut columns = if compact {
            vec![Addr, Active, Reqs, Share, Max]
        } else {
            vec![Addr, Active, Conns, Reqs, Share, P50, P90, Max]
        };
        if backends.iter().any(|b| b.outcomes.failed() > 0) {
            // The compact layout has room for them in place of the lifetime max.
            if compact {
                columns.retain(|c| *c != Max);
            }
            columns.push(Outcomes);
        }
        if !compact && backends.iter().any(|b| b.connect_ms.is_some()) {
            columns.push(Connect);
        }
        // Everything but the address and the bar: widths, separators, the percentage.
        let others = |columns: &[Column]| {
            columns.iter().map(|c| c.width()).sum::<usize>() + columns.len() + PCT_WIDTH
        };
        let (addr, bar) = if compact {
            let bar = 10;
            (width.saturating_sub(others(&columns) + bar).max(8), bar)
        } else {
            let addr = 21;
            for column in GIVEN_UP_FIRST {
                if width >= others(&columns) + addr + MIN_BAR {
                    break;
                }
                columns.retain(|c| *c != column);
            }
            (
                addr,
                width.saturating_sub(others(&columns) + addr).max(MIN_BAR),
            )
        };
        BackendColumns {
            names: names && backends.iter().any(|b| b.pod.is_some()),
            columns,
            addr,
            bar,
            share: bar + 1 + PCT_WIDTH,
        }
    }

    fn width(&self, column: Column) -> usize {
        match column {
            Column::Addr => self.addr,
            Column::Share => self.share,
            _ => column.width(),
        }
    }

    fn align(column: Column) -> Align {
        match column {
            Column::Addr | Column::Share => Align::Left,
            _ => Align::Right,
        }
    }

    fn header(&self) -> String {
        let title = |column: Column| match column {
            Column::Addr if self.names => "BACKEND POD",
            Column::Addr => "BACKEND",
            Column::Active => "ACTIVE",
            Column::Conns => "CONNS",
            Column::Reqs => "REQS",
            Column::Share if self.share >= 16 => "SHARE │=expected",
            Column::Share => "SHARE",
            Column::P50 => "P50",
            Column::P90 => "P90",
            Column::Max => "MAX",
            Column::Outcomes => "ANS/REF/UNA",
            Column::Connect => "CONN P50/99",
        };
        let cells: Vec<(&str, usize, Align)> = self
            .columns
            .iter()
            .map(|c| (title(*c), self.width(*c), Self::align(*c)))
            .collect();
        row(&cells)
    }

    fn cells(&self, backend: &BackendStats) -> Vec<Span<'static>> {
        let cells: Vec<(Parts, usize, Align)> = self
            .columns
            .iter()
            .map(|c| (self.cell(*c, backend), self.width(*c), Self::align(*c)))
            .collect();
        styled_row(&cells)
    }

    fn cell(&self, column: Column, backend: &BackendStats) -> Parts {
        let lifetime = |pick: fn(&Percentiles) -> f64| {
            backend
                .lifetime_ms
                .as_ref()
                .map_or("-".to_owned(), |p| duration(pick(p), Digits::Compact))
        };
        match column {
            Column::Addr => {
                let mut addr =
                    shown_addr(backend.backend, backend.pod.as_ref(), self.names, self.addr);
                if !backend.in_rules {
                    addr.push_str(" gone");
                }
                plain(addr)
            }
            Column::Active => plain(count(backend.active)),
            Column::Conns => plain(count(backend.connections)),
            Column::Reqs => plain(count(backend.requests)),
            Column::Share => plain(format!(
                "{} {:>3.0}%",
                share_bar(backend.request_share, backend.expected_share, self.bar),
                backend.request_share * 100.0
            )),
            Column::P50 => plain(lifetime(|p| p.p50)),
            Column::P90 => plain(lifetime(|p| p.p90)),
            Column::Max => plain(lifetime(|p| p.max)),
            Column::Outcomes => outcome_parts(&backend.outcomes),
            Column::Connect => plain(backend.connect_ms.map_or("-".to_owned(), |c| {
                format!(
                    "{}/{}",
                    latency(c.p50, Digits::Compact),
                    latency(c.p99, Digits::Compact)
                )
            })),
        }
    }
}

/// "158/7/6": answered, refused and unanswered; refused and unanswered in red when any.
fn outcome_parts(outcomes: &OutcomeCounts) -> Parts {
    let red = |n: u64| if n > 0 { ALERT } else { Style::new() };
    vec![
        (count(outcomes.answered), Style::new()),
        ("/".to_owned(), Style::new()),
        (count(outcomes.refused), red(outcomes.refused)),
        ("/".to_owned(), Style::new()),
        (count(outcomes.unanswered), red(outcomes.unanswered)),
    ]
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
    let columns = BackendColumns::new(width, compact, names, backends);
    let mut lines = vec![Line::styled(columns.header(), BOLD)];
    for backend in backends.iter().take(rows) {
        let style = if backend.in_rules {
            Style::new()
        } else {
            Style::new().fg(Color::Yellow)
        };
        lines.push(Line::from(columns.cells(backend)).style(style));
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
    /// Appended to the title: connections per frontend.
    frontends: String,
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
        frontends,
    } = view;
    // With frontends to show, the order goes unsaid: the rows show it.
    let order = if frontends.is_empty() {
        "; open oldest first"
    } else {
        ""
    };
    let title = format!(
        "CONNECTIONS {} open, {} closed kept{order}{frontends}",
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
            cells.push((state, 10, Align::Left));
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
        let style = match conn.close {
            _ if index == selected => SELECTED,
            Close::Open => Style::new(),
            Close::Refused | Close::Unanswered => DIM.fg(Color::Red),
            _ => DIM,
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
