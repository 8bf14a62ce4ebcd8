//! Text building blocks: fixed-width cells cut with an ellipsis, short numbers, bars.

use ratatui::style::Style;
use ratatui::text::Span;

use crate::tui::state::LIFETIME_BUCKETS;

#[derive(Clone, Copy)]
pub(super) enum Align {
    Left,
    Right,
}

/// Shortens `text` to `width` characters, marking the cut with an ellipsis.
pub(super) fn truncate(text: &str, width: usize) -> String {
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
pub(super) fn row(cells: &[(&str, usize, Align)]) -> String {
    let cells: Vec<String> = cells
        .iter()
        .map(|(text, width, align)| pad(text, *width, *align))
        .collect();
    cells.join(" ")
}

/// A cell made of differently styled parts (`158/7/6` with the 7 and 6 in red).
pub(super) type Parts = Vec<(String, Style)>;

/// Lays styled cells out as `row` does: each padded to its width, or cut with an
/// ellipsis keeping the styles of what stays.
pub(super) fn styled_row(cells: &[(Parts, usize, Align)]) -> Vec<Span<'static>> {
    let mut spans = Vec::new();
    for (index, (parts, width, align)) in cells.iter().enumerate() {
        if index > 0 {
            spans.push(Span::raw(" "));
        }
        let len: usize = parts.iter().map(|(text, _)| text.chars().count()).sum();
        let gap = Span::raw(" ".repeat(width.saturating_sub(len)));
        let texts = parts
            .iter()
            .map(|(text, style)| Span::styled(text.clone(), *style));
        match align {
            _ if len > *width => spans.extend(fit(texts.collect(), *width)),
            Align::Left => {
                spans.extend(texts);
                spans.push(gap);
            }
            Align::Right => {
                spans.push(gap);
                spans.extend(texts);
            }
        }
    }
    spans
}

/// One part in the default style.
pub(super) fn plain(text: impl Into<String>) -> Parts {
    vec![(text.into(), Style::new())]
}

pub(super) fn rate(value: Option<f64>) -> String {
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

pub(super) fn count(value: u64) -> String {
    match value {
        0..100_000 => value.to_string(),
        100_000..10_000_000 => format!("{}k", value / 1_000),
        _ => format!("{}M", value / 1_000_000),
    }
}

pub(super) fn skew(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v < 10.0 => format!("{v:.2}x"),
        Some(v) if v < 100.0 => format!("{v:.1}x"),
        Some(v) => format!("{v:.0}x"),
    }
}

/// Keeps spans up to `width` characters, cutting the last one with an ellipsis.
pub(super) fn fit(spans: Vec<Span<'static>>, width: usize) -> Vec<Span<'static>> {
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

/// The first row shown so that `selected` is inside a window of `rows` rows.
pub(super) fn scroll(selected: usize, rows: usize) -> usize {
    (selected + 1).saturating_sub(rows)
}

/// A bar `width` wide, filled to `share`, with `│` where the expected share ends.
pub(super) fn share_bar(share: f64, expected: Option<f64>, width: usize) -> String {
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

/// One line: each bucket's label, a bar scaled to the largest bucket, and its count.
pub(super) fn histogram_text(histogram: &[u64]) -> String {
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
