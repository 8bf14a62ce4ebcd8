//! `?`: the keys, in a box over the screen.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph};

const HELP: [&str; 14] = [
    "↑/↓ j/k   move",
    "g/G       first / last",
    "Enter     open the Service",
    "Esc       back / clear filter",
    "/         filter Services",
    "s         next sort key",
    "p         pause / resume",
    "r         reset counters",
    "e         export screen (JSON Lines)",
    "n         pod names / IP addresses",
    "d         DNS lookups (Esc: back)",
    "?         this help",
    "q Ctrl-C  quit",
    "any key closes this help",
];

pub(super) fn help(frame: &mut Frame<'_>, area: Rect) {
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
