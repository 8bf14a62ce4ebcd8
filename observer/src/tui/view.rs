//! Rendering from `&App` only: no I/O, no state changes. Text is laid out in fixed-width
//! columns and truncated with an ellipsis, so long names never wrap or push columns.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::app::{App, Detail, LIFETIME_BUCKETS, Screen, ServiceRow};
use crate::model::record::Close;
use crate::sinks::text::{Digits, duration};
use crate::stats::BackendStats;

/// Below this the view only says it is too small.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 10;
/// From this size up the full layout is used; in between a compact one.
pub const FULL_WIDTH: u16 = 80;
pub const FULL_HEIGHT: u16 = 24;

const BOLD: Style = Style::new().add_modifier(Modifier::BOLD);
const DIM: Style = Style::new().add_modifier(Modifier::DIM);
const SELECTED: Style = Style::new().add_modifier(Modifier::REVERSED);
const ALERT: Style = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);

pub fn render(app: &App, frame: &mut Frame<'_>) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = Paragraph::new("terminal too small: need 80x24").wrap(Wrap { trim: true });
        frame.render_widget(text, area);
        return;
    }
    let compact = area.width < FULL_WIDTH || area.height < FULL_HEIGHT;
    let header = Rect { height: 1, ..area };
    let status = Rect {
        y: area.bottom() - 1,
        height: 1,
        ..area
    };
    let body = Rect {
        y: area.y + 1,
        height: area.height - 2,
        ..area
    };
    frame.render_widget(Paragraph::new(header_line(app, area.width)), header);
    frame.render_widget(Paragraph::new(status_line(app, area.width)), status);
    let lines = match (&app.screen, &app.frame.detail) {
        (Screen::Service(_), Some(detail)) => service_screen(app, detail, body, compact),
        _ => services_screen(app, body, compact),
    };
    frame.render_widget(Paragraph::new(lines), body);
    if app.help {
        help(frame, area);
    }
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// Shortens `text` to `width` characters, marking the cut with an ellipsis.
pub fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('…');
    out
}

fn pad(text: &str, width: usize, align: Align) -> String {
    let text = truncate(text, width);
    match align {
        Align::Left => format!("{text:<width$}"),
        Align::Right => format!("{text:>width$}"),
    }
}

/// Lays cells out in columns separated by one space.
fn row(cells: &[(&str, usize, Align)]) -> String {
    let cells: Vec<String> = cells
        .iter()
        .map(|(text, width, align)| pad(text, *width, *align))
        .collect();
    cells.join(" ")
}

fn rate(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v < 10.0 => format!("{v:.1}"),
        Some(v) if v < 9_999.5 => format!("{v:.0}"),
        // At most five characters: 99.9k, 9999k, then millions.
        Some(v) if v < 99_950.0 => format!("{:.1}k", v / 1e3),
        Some(v) if v < 9_999_500.0 => format!("{:.0}k", v / 1e3),
        Some(v) => format!("{:.0}M", v / 1e6),
    }
}

fn count(value: u64) -> String {
    match value {
        0..100_000 => value.to_string(),
        100_000..10_000_000 => format!("{}k", value / 1_000),
        _ => format!("{}M", value / 1_000_000),
    }
}

fn skew(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v < 10.0 => format!("{v:.2}x"),
        Some(v) if v < 100.0 => format!("{v:.1}x"),
        Some(v) => format!("{v:.0}x"),
    }
}

/// Keeps spans up to `width` characters, cutting the last one with an ellipsis.
fn fit(spans: Vec<Span<'static>>, width: usize) -> Vec<Span<'static>> {
    let mut left = width;
    let mut out = Vec::new();
    for span in spans {
        let len = span.content.chars().count();
        if len <= left {
            left -= len;
            out.push(span);
        } else {
            out.push(Span::styled(truncate(&span.content, left), span.style));
            break;
        }
    }
    out
}

fn header_line(app: &App, width: u16) -> Line<'static> {
    let mut left = vec![Span::styled(format!("observer · {}", app.title), BOLD)];
    match (&app.screen, app.shown_service()) {
        (Screen::Service(key), row) => {
            left.push(Span::raw(format!(" │ {} {}", key.0, key.1)));
            if let Some(row) = row {
                left.push(Span::raw(format!(
                    " │ {} │ skew {}",
                    row.frontend(),
                    skew(row.stats.skew)
                )));
            }
        }
        (Screen::Services, _) => {
            left.push(Span::raw(format!(
                " │ services {}/{} │ sort {}",
                app.frame.visible.len(),
                app.frame.rows.len(),
                app.sort.label()
            )));
            if app.editing_filter || !app.filter.is_empty() {
                let cursor = if app.editing_filter { "_" } else { "" };
                left.push(Span::raw(format!(" │ filter {}{cursor}", app.filter)));
            }
        }
    }
    if app.paused {
        left.push(Span::raw(" │ "));
        left.push(Span::styled("PAUSED", ALERT));
    }
    let right = app.message.clone().unwrap_or_else(|| "? keys".to_owned());
    let width = usize::from(width);
    let right = truncate(&right, width.saturating_sub(20));
    let room = width.saturating_sub(right.chars().count() + 1);
    let mut spans = fit(left, room);
    let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
    spans.push(Span::raw(" ".repeat(width - used - right.chars().count())));
    spans.push(Span::styled(right, DIM));
    Line::from(spans)
}

fn status_line(app: &App, width: u16) -> Line<'static> {
    let lost = app.lost_connections();
    let lost_style = if lost > 0 { ALERT } else { Style::new() };
    let capture = &app.capture;
    let mut spans = Vec::new();
    if app.replay {
        spans.push(Span::raw("replay │ "));
    } else {
        spans.push(Span::raw(format!(
            "events/s {} │ ",
            rate(app.frame.events_per_s)
        )));
    }
    spans.push(Span::styled(format!("lost {lost}"), lost_style));
    if !app.replay {
        spans.push(Span::raw(format!(" │ hooks {}", capture.hooks_attached)));
    }
    spans.push(Span::raw(format!(" │ netns {}", capture.netns_seen)));
    if let Some(file) = capture.recording.as_ref().or(app.recording.as_ref()) {
        let verb = if app.replay { "file" } else { "rec" };
        spans.push(Span::raw(format!(" │ {verb} {file}")));
    }
    if app.ended && !app.replay {
        spans.push(Span::styled(" │ capture ended", ALERT));
    }
    Line::from(fit(spans, usize::from(width)))
}

/// The first row shown so that `selected` is inside a window of `rows` rows.
fn scroll(selected: usize, rows: usize) -> usize {
    (selected + 1).saturating_sub(rows)
}

fn services_screen(app: &App, area: Rect, compact: bool) -> Vec<Line<'static>> {
    let width = usize::from(area.width);
    // Selection marker (2) plus the fixed columns and their separators.
    let fixed = if compact {
        6 + 5 + 5 + 5 + 4
    } else {
        16 + 6 + 5 + 5 + 4 + 5 + 5 + 7
    };
    let name = width.saturating_sub(fixed + 2).max(8);
    let columns = |name_text: &str, service: Option<&ServiceRow>| -> String {
        let Some(service) = service else {
            let titles: &[&str] = if compact {
                &["ACTIVE", "REQ/S", "SKEW", "STALE"]
            } else {
                &[
                    "FRONTEND", "ACTIVE", "NEW/S", "REQ/S", "PODS", "SKEW", "STALE",
                ]
            };
            return header_cells(name_text, name, titles, compact);
        };
        let s = &service.stats;
        if compact {
            row(&[
                (name_text, name, Align::Left),
                (&count(s.active), 6, Align::Right),
                (&rate(service.requests_per_s), 5, Align::Right),
                (&skew(s.skew), 5, Align::Right),
                (&count(s.stale_pins), 5, Align::Right),
            ])
        } else {
            row(&[
                (name_text, name, Align::Left),
                (&service.frontend(), 16, Align::Left),
                (&count(s.active), 6, Align::Right),
                (&rate(service.new_per_s), 5, Align::Right),
                (&rate(service.requests_per_s), 5, Align::Right),
                (&s.backends.len().to_string(), 4, Align::Right),
                (&skew(s.skew), 5, Align::Right),
                (&count(s.stale_pins), 5, Align::Right),
            ])
        }
    };
    let mut lines = vec![Line::styled(
        format!("  {}", columns("SERVICE", None)),
        BOLD,
    )];
    if app.frame.visible.is_empty() {
        let text = if app.frame.rows.is_empty() {
            "  no Service seen yet".to_owned()
        } else {
            format!("  no Service matches \"{}\"", app.filter)
        };
        lines.push(Line::styled(text, DIM));
        return lines;
    }
    let rows = usize::from(area.height).saturating_sub(1);
    let first = scroll(app.selected, rows);
    for (index, &row_index) in app.frame.visible.iter().enumerate().skip(first).take(rows) {
        let row = &app.frame.rows[row_index];
        let name_text = format!("{} {}", row.stats.service, row.stats.proto);
        let text = columns(&name_text, Some(row));
        let selected = index == app.selected;
        let marker = if selected { "> " } else { "  " };
        let mut style = Style::new();
        if row.stats.stale_pins > 0 {
            style = style.fg(Color::Yellow);
        }
        if selected {
            style = style.patch(SELECTED);
        }
        lines.push(Line::styled(format!("{marker}{text}"), style));
    }
    lines
}

/// A header row: the first title left-aligned in `first` columns, the rest right-aligned
/// above numbers except FRONTEND.
fn header_cells(first_title: &str, first: usize, titles: &[&str], compact: bool) -> String {
    let widths: &[usize] = if compact {
        &[6, 5, 5, 5]
    } else {
        &[16, 6, 5, 5, 4, 5, 5]
    };
    let mut cells = vec![(first_title, first, Align::Left)];
    for (title, width) in titles.iter().zip(widths) {
        let align = if *title == "FRONTEND" {
            Align::Left
        } else {
            Align::Right
        };
        cells.push((title, *width, align));
    }
    row(&cells)
}

/// A bar `width` wide, filled to `share`, with `│` where the expected share ends.
fn share_bar(share: f64, expected: Option<f64>, width: usize) -> String {
    let filled = (share * width as f64).round() as usize;
    let marker = expected.map(|e| ((e * width as f64).round() as usize).clamp(1, width) - 1);
    (0..width)
        .map(|i| {
            if Some(i) == marker {
                '│'
            } else if i < filled {
                '█'
            } else {
                '·'
            }
        })
        .collect()
}

fn service_screen(app: &App, detail: &Detail, area: Rect, compact: bool) -> Vec<Line<'static>> {
    let width = usize::from(area.width);
    let height = usize::from(area.height);
    let backends: &[BackendStats] = app.shown_service().map_or(&[], |row| &row.stats.backends);
    // Backend header, longest-pinned line, histogram line, connections title and header.
    let fixed_lines = if compact && height < 16 { 4 } else { 5 };
    let backend_rows = backends
        .len()
        .min(((height.saturating_sub(fixed_lines)) / 2).max(1));
    let mut lines = Vec::new();

    // Backends.
    let pct_width = 4;
    let (addr_width, bar_width) = if compact {
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
    let share_title = if bar_width + 1 + pct_width >= 16 {
        "SHARE │=expected"
    } else {
        "SHARE"
    };
    let share_width = bar_width + 1 + pct_width;
    let header = if compact {
        row(&[
            ("BACKEND", addr_width, Align::Left),
            ("ACTIVE", 6, Align::Right),
            ("REQS", 6, Align::Right),
            (share_title, share_width, Align::Left),
            ("MAX", 6, Align::Right),
        ])
    } else {
        row(&[
            ("BACKEND", addr_width, Align::Left),
            ("ACTIVE", 6, Align::Right),
            ("CONNS", 6, Align::Right),
            ("REQS", 6, Align::Right),
            (share_title, share_width, Align::Left),
            ("P50", 6, Align::Right),
            ("P90", 6, Align::Right),
            ("MAX", 6, Align::Right),
        ])
    };
    lines.push(Line::styled(header, BOLD));
    for backend in backends.iter().take(backend_rows) {
        let share = format!(
            "{} {:>3.0}%",
            share_bar(backend.request_share, backend.expected_share, bar_width),
            backend.request_share * 100.0
        );
        let lifetime = |pick: fn(&crate::stats::Percentiles) -> f64| {
            backend
                .lifetime_ms
                .as_ref()
                .map_or("-".to_owned(), |p| duration(pick(p), Digits::Compact))
        };
        let mut addr = backend.backend.to_string();
        if !backend.in_rules {
            addr.push_str(" gone");
        }
        let text = if compact {
            row(&[
                (&addr, addr_width, Align::Left),
                (&count(backend.active), 6, Align::Right),
                (&count(backend.requests), 6, Align::Right),
                (&share, share_width, Align::Left),
                (&lifetime(|p| p.max), 6, Align::Right),
            ])
        } else {
            row(&[
                (&addr, addr_width, Align::Left),
                (&count(backend.active), 6, Align::Right),
                (&count(backend.connections), 6, Align::Right),
                (&count(backend.requests), 6, Align::Right),
                (&share, share_width, Align::Left),
                (&lifetime(|p| p.p50), 6, Align::Right),
                (&lifetime(|p| p.p90), 6, Align::Right),
                (&lifetime(|p| p.max), 6, Align::Right),
            ])
        };
        let style = if backend.in_rules {
            Style::new()
        } else {
            Style::new().fg(Color::Yellow)
        };
        lines.push(Line::styled(text, style));
    }
    if backends.len() > backend_rows {
        // Replace the last row with how many are hidden rather than hiding it silently.
        lines.pop();
        lines.push(Line::styled(
            format!("… {} more backends", backends.len() - backend_rows + 1),
            DIM,
        ));
    }

    // The longest-pinned connection and the lifetime histogram.
    let longest = match &detail.longest {
        Some(conn) => format!(
            "longest pinned: {} → {}  {}  requests {}  {}",
            conn.client,
            conn.backend,
            duration(conn.age_ms, Digits::Compact),
            conn.requests,
            close_text(conn.close)
        ),
        None => "longest pinned: -".to_owned(),
    };
    lines.push(Line::raw(truncate(&longest, width)));
    if fixed_lines == 5 {
        lines.push(Line::raw(truncate(
            &histogram_text(&detail.histogram),
            width,
        )));
    }

    // Live connections.
    let title = format!(
        "CONNECTIONS {} open, {} closed kept; open oldest first",
        detail.open, detail.closed
    );
    lines.push(Line::styled(truncate(&title, width), BOLD));
    let addr = if compact {
        (width.saturating_sub(2 + 7 + 6 + 3) / 2).max(8)
    } else {
        21
    };
    let conn_cells =
        |client: &str, backend: &str, age: &str, requests: &str, idle: &str, state: &str| {
            if compact {
                row(&[
                    (client, addr, Align::Left),
                    (backend, addr, Align::Left),
                    (age, 7, Align::Right),
                    (requests, 6, Align::Right),
                ])
            } else {
                row(&[
                    (client, addr, Align::Left),
                    (backend, addr, Align::Left),
                    (age, 7, Align::Right),
                    (requests, 6, Align::Right),
                    (idle, 7, Align::Right),
                    (state, 7, Align::Left),
                ])
            }
        };
    lines.push(Line::styled(
        format!(
            "  {}",
            conn_cells("CLIENT", "BACKEND", "AGE", "REQS", "IDLE", "STATE")
        ),
        BOLD,
    ));
    let rows = height.saturating_sub(lines.len());
    let first = scroll(app.conn_selected, rows);
    for (index, conn) in detail.conns.iter().enumerate().skip(first).take(rows) {
        let text = conn_cells(
            &conn.client.to_string(),
            &conn.backend.to_string(),
            &duration(conn.age_ms, Digits::Compact),
            &count(conn.requests),
            &conn
                .idle_ms
                .map_or("-".to_owned(), |ms| duration(ms, Digits::Compact)),
            close_text(conn.close),
        );
        let selected = index == app.conn_selected;
        let marker = if selected { "> " } else { "  " };
        let style = if selected {
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

pub fn close_text(close: Close) -> &'static str {
    match close {
        Close::Open => "open",
        Close::Fin => "fin",
        Close::Rst => "rst",
        Close::Timeout => "timeout",
        Close::Expired => "expired",
    }
}

/// One line: each bucket's label, a bar scaled to the largest bucket, and its count.
fn histogram_text(histogram: &[u64]) -> String {
    const LEVELS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = histogram.iter().copied().max().unwrap_or(0);
    let mut text = "lifetimes".to_owned();
    for ((_, label), &n) in LIFETIME_BUCKETS.iter().zip(histogram) {
        let level = if max == 0 {
            0
        } else {
            (n * 8).div_ceil(max) as usize
        };
        text.push_str(&format!("  {label} {}{}", LEVELS[level], count(n)));
    }
    text
}

const HELP: [&str; 12] = [
    "↑/↓ j/k   move",
    "g/G       first / last",
    "Enter     open the Service",
    "Esc       back / clear filter",
    "/         filter Services",
    "s         next sort key",
    "p         pause / resume",
    "r         reset counters",
    "e         export screen (JSON Lines)",
    "?         this help",
    "q Ctrl-C  quit",
    "any key closes this help",
];

fn help(frame: &mut Frame<'_>, area: Rect) {
    let width = 40.min(area.width);
    let height = (HELP.len() as u16 + 2).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    let lines: Vec<Line<'_>> = HELP.iter().map(|line| Line::raw(*line)).collect();
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).block(Block::new().borders(Borders::ALL).title(" keys ")),
        popup,
    );
}
