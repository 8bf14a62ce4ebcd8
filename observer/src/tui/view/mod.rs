//! Rendering from `&App` only: no I/O, no state changes. Text is laid out in fixed-width
//! columns and truncated with an ellipsis, so long names never wrap or push columns.
//!
//! `services`, `service` and `dns` lay out the screens, `help` the key box, `widgets` the
//! cells, numbers and bars they are made of.

mod dns;
mod help;
mod service;
mod services;
mod widgets;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use self::widgets::{fit, rate, skew, truncate};
use super::state::{App, Screen};

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
    // conntrack's warning, when there is one, takes the body's first line.
    let warning = app.pressure.warning();
    let warned = u16::from(warning.is_some());
    let body = Rect {
        y: area.y + 1 + warned,
        height: area.height - 2 - warned,
        ..area
    };
    frame.render_widget(Paragraph::new(header_line(app, area.width)), header);
    frame.render_widget(Paragraph::new(status_line(app, area.width)), status);
    if let Some(warning) = warning {
        let line = Span::styled(truncate(&warning, usize::from(area.width)), ALERT);
        frame.render_widget(
            Paragraph::new(line),
            Rect {
                y: area.y + 1,
                ..header
            },
        );
    }
    let lines = match (&app.screen, &app.shown.detail) {
        (Screen::Service(_), Some(detail)) => service::service_screen(app, detail, body, compact),
        (Screen::Dns, _) => dns::dns_screen(app, body),
        _ => services::services_screen(app, body, compact),
    };
    frame.render_widget(Paragraph::new(lines), body);
    if app.help {
        help::help(frame, area);
    }
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
        (Screen::Dns, _) => {
            left.push(Span::raw(format!(" │ DNS │ {} queries", app.dns.len())));
        }
        (Screen::Services, _) => {
            left.push(Span::raw(format!(
                " │ services {}/{} │ sort {}",
                app.shown.visible.len(),
                app.shown.rows.len(),
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
            rate(app.shown.events_per_s)
        )));
    }
    spans.push(Span::styled(format!("lost {lost}"), lost_style));
    if !app.replay {
        spans.push(Span::raw(format!(" │ hooks {}", capture.hooks_attached)));
    }
    spans.push(Span::raw(format!(" │ netns {}", capture.netns_seen)));
    for (label, lost) in [
        ("dns malformed", capture.dns_malformed),
        ("lost rejects", capture.lost_rejects),
    ] {
        if lost > 0 {
            spans.push(Span::styled(format!(" │ {label} {lost}"), ALERT));
        }
    }
    if capture.dns_lost > 0 {
        spans.push(Span::styled(
            format!(" │ dns lost {}", capture.dns_lost),
            ALERT,
        ));
    }
    if let Some(file) = capture.recording.as_ref().or(app.recording.as_ref()) {
        let verb = if app.replay { "file" } else { "rec" };
        spans.push(Span::raw(format!(" │ {verb} {file}")));
    }
    if app.ended && !app.replay {
        spans.push(Span::styled(" │ capture ended", ALERT));
    }
    Line::from(fit(spans, usize::from(width)))
}
