//! The Services screen: one row per Service, filtered and sorted.

use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;

use super::widgets::{Align, count, rate, row, scroll, skew};
use super::{BOLD, DIM, SELECTED};
use crate::tui::state::{App, ServiceRow};

pub(super) fn services_screen(app: &App, area: Rect, compact: bool) -> Vec<Line<'static>> {
    let width = usize::from(area.width);
    // Selection marker (2) plus the fixed columns and their separators.
    let fixed = if compact {
        6 + 5 + 5 + 5 + 4
    } else {
        16 + 6 + 5 + 5 + 4 + 5 + 5 + 7
    };
    let name = width.saturating_sub(fixed + 2).max(8);
    let mut lines = vec![Line::styled(
        format!("  {}", header_cells("SERVICE", name, compact)),
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
        let text = service_cells(&name_text, name, service, compact);
        let selected = index == app.selected;
        let marker = if selected { "> " } else { "  " };
        let mut style = Style::new();
        if service.stats.stale_pins > 0 {
            style = style.fg(Color::Yellow);
        }
        if selected {
            style = style.patch(SELECTED);
        }
        lines.push(Line::styled(format!("{marker}{text}"), style));
    }
    lines
}

/// One Service's row: its name in `name` columns, then its numbers.
fn service_cells(name_text: &str, name: usize, service: &ServiceRow, compact: bool) -> String {
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
}

/// The header row: the first title left-aligned in `first` columns, the rest
/// right-aligned above numbers except FRONTEND.
fn header_cells(first_title: &str, first: usize, compact: bool) -> String {
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
    row(&cells)
}
