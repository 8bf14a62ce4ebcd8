//! The Services screen: one row per Service, filtered and sorted.

use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};

use super::widgets::{Align, Parts, count, plain, rate, row, scroll, skew, styled_row};
use super::{ALERT, BOLD, DIM, SELECTED};
use crate::tui::state::{App, ServiceRow};

/// Width of the FAILED and REJECT columns.
const FAILURE_WIDTH: usize = 6;

pub(super) fn services_screen(app: &App, area: Rect, compact: bool) -> Vec<Line<'static>> {
    let width = usize::from(area.width);
    // Failed and rejected connections get columns once any Service has some.
    let failures = app
        .shown
        .rows
        .iter()
        .any(|row| row.stats.outcomes.failed() > 0 || row.stats.rejected > 0);
    // Selection marker (2) plus the fixed columns and their separators.
    let mut fixed = if compact {
        6 + 5 + 5 + 5 + 4
    } else {
        16 + 6 + 5 + 5 + 4 + 5 + 5 + 7
    };
    if failures {
        fixed += 2 * (FAILURE_WIDTH + 1);
    }
    let name = width.saturating_sub(fixed + 2).max(8);
    let mut lines = vec![Line::styled(
        format!("  {}", header_cells("SERVICE", name, compact, failures)),
        BOLD,
    )];
    if app.shown.visible.is_empty() {
        let text = if app.shown.rows.is_empty() {
            "  no Service seen yet".to_owned()
        } else {
            format!("  no Service matches \"{}\"", app.filter)
        };
        lines.push(Line::styled(text, DIM));
        return lines;
    }
    let rows = usize::from(area.height).saturating_sub(1);
    let first = scroll(app.selected, rows);
    for (index, &row_index) in app.shown.visible.iter().enumerate().skip(first).take(rows) {
        let service = &app.shown.rows[row_index];
        let name_text = format!("{} {}", service.stats.service, service.stats.proto);
        let selected = index == app.selected;
        let marker = if selected { "> " } else { "  " };
        let mut style = Style::new();
        if service.stats.stale_pins > 0 {
            style = style.fg(Color::Yellow);
        }
        if selected {
            style = style.patch(SELECTED);
        }
        let mut spans = vec![Span::raw(marker)];
        spans.extend(styled_row(&service_cells(
            &name_text, name, service, compact, failures,
        )));
        lines.push(Line::from(spans).style(style));
    }
    lines
}

/// A count that is red when it is not zero.
fn alarming(value: u64) -> Parts {
    let style = if value > 0 { ALERT } else { Style::new() };
    vec![(count(value), style)]
}

/// One Service's cells: its name in `name` columns, then its numbers.
fn service_cells(
    name_text: &str,
    name: usize,
    service: &ServiceRow,
    compact: bool,
    failures: bool,
) -> Vec<(Parts, usize, Align)> {
    let s = &service.stats;
    let mut cells = vec![(plain(name_text), name, Align::Left)];
    if !compact {
        cells.push((plain(service.frontend()), 16, Align::Left));
    }
    cells.push((plain(count(s.active)), 6, Align::Right));
    if !compact {
        cells.push((plain(rate(service.new_per_s)), 5, Align::Right));
    }
    cells.push((plain(rate(service.requests_per_s)), 5, Align::Right));
    if !compact {
        cells.push((plain(s.backends.len().to_string()), 4, Align::Right));
    }
    cells.push((plain(skew(s.skew)), 5, Align::Right));
    cells.push((plain(count(s.stale_pins)), 5, Align::Right));
    if failures {
        cells.push((alarming(s.outcomes.failed()), FAILURE_WIDTH, Align::Right));
        cells.push((alarming(s.rejected), FAILURE_WIDTH, Align::Right));
    }
    cells
}

/// The header row: the first title left-aligned in `first` columns, the rest
/// right-aligned above numbers except FRONTEND.
fn header_cells(first_title: &str, first: usize, compact: bool, failures: bool) -> String {
    let (titles, widths): (&[&str], &[usize]) = if compact {
        (&["ACTIVE", "REQ/S", "SKEW", "STALE"], &[6, 5, 5, 5])
    } else {
        (
            &[
                "FRONTEND", "ACTIVE", "NEW/S", "REQ/S", "PODS", "SKEW", "STALE",
            ],
            &[16, 6, 5, 5, 4, 5, 5],
        )
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
    if failures {
        cells.push(("FAILED", FAILURE_WIDTH, Align::Right));
        cells.push(("REJECT", FAILURE_WIDTH, Align::Right));
    }
    row(&cells)
}
