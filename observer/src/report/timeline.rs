//! The rules' timeline in words: `summary`'s "endpoint changes" section and the live
//! view's marker on a Service screen.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use crate::model::record::format_time;
use crate::report::text::{Digits, duration, plural};
use crate::stats::timeline::{Arrival, Departure, ServiceTimeline, Timeline};

fn between(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    let ms = (to - from).num_microseconds().unwrap_or(0) as f64 / 1000.0;
    duration(ms.max(0.0), Digits::Report)
}

/// One line for an endpoint that left: when, its last new connection before, the
/// connections pinned to it afterwards and for how long, new connections after.
pub fn departure_line(d: &Departure, now: DateTime<Utc>) -> String {
    let mut line = format!("{} {} left the rules", format_time(&d.left), d.backend);
    match d.last_new {
        Some(last) => {
            let _ = write!(
                line,
                "; last new connection {} before",
                between(last, d.left)
            );
        }
        None => line.push_str("; no connection before"),
    }
    match d.longest_pin(now) {
        None => line.push_str("; no connection pinned to it"),
        Some(longest) => {
            let open = d.still_pinned();
            let _ = write!(
                line,
                "; {} stale afterwards, for up to {}{}",
                plural(d.pins.len() as u64, "connection"),
                duration(longest.as_secs_f64() * 1000.0, Digits::Report),
                if open > 0 {
                    format!(" ({open} still open)")
                } else {
                    String::new()
                }
            );
        }
    }
    if !d.late.is_empty() {
        let _ = write!(
            line,
            "; STALE RULES: {} after it left",
            plural(d.late.len() as u64, "new connection")
        );
    }
    if let Some(back) = d.returned {
        let _ = write!(line, "; back {} later", between(d.left, back));
    }
    line
}

/// One line for an endpoint that joined, with its first connection.
pub fn arrival_line(a: &Arrival) -> String {
    let first = match a.first_conn {
        Some(first) => format!("first connection {} after", between(a.joined, first)),
        None => "no connection since".to_owned(),
    };
    format!(
        "{} {} joined the rules; {first}",
        format_time(&a.joined),
        a.backend
    )
}

/// Every change of one Service port, in time order.
pub fn service_lines(timeline: &ServiceTimeline, now: DateTime<Utc>) -> Vec<String> {
    let mut lines: Vec<(DateTime<Utc>, String)> = timeline
        .departures
        .iter()
        .map(|d| (d.left, departure_line(d, now)))
        .chain(
            timeline
                .arrivals
                .iter()
                .map(|a| (a.joined, arrival_line(a))),
        )
        .collect();
    lines.sort_by_key(|(time, _)| *time);
    lines.into_iter().map(|(_, line)| line).collect()
}

/// `summary`'s section (empty when the rules did not change during the recording);
/// `only` keeps one Service. `now` ends pins still open (the recording's end).
pub fn render(timeline: &Timeline, only: Option<&str>, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    for ((service, proto, netns), changes) in timeline.services() {
        if only.is_some_and(|only| only != service) {
            continue;
        }
        if out.is_empty() {
            out.push_str("\nendpoint changes\n");
        }
        let _ = writeln!(out, "  {service} ({proto}, netns {netns})");
        for line in service_lines(changes, now) {
            let _ = writeln!(out, "    {line}");
        }
    }
    out
}

/// The live view's marker for an endpoint that left: "10.244.1.13 left 12 s ago, 2
/// connections still pinned".
pub fn marker(d: &Departure, now: DateTime<Utc>) -> String {
    let ago = (now - d.left).num_seconds().max(0);
    let pinned = d.still_pinned();
    let mut text = format!("{} left {ago} s ago", d.backend.ip());
    if pinned > 0 {
        let _ = write!(
            text,
            ", {} still pinned",
            plural(pinned as u64, "connection")
        );
    }
    if let Some(back) = d.returned {
        let _ = write!(text, ", back after {}", between(d.left, back));
    }
    text
}

/// The live view's marker for an endpoint that joined: "10.244.1.13 joined 3 s ago,
/// first connection 120.0ms after".
pub fn arrival_marker(a: &Arrival, now: DateTime<Utc>) -> String {
    let ago = (now - a.joined).num_seconds().max(0);
    let first = match a.first_conn {
        Some(first) => format!("first connection {} after", between(a.joined, first)),
        None => "no connection yet".to_owned(),
    };
    format!("{} joined {ago} s ago, {first}", a.backend.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::{EndpointsRecord, Proto, Recording};
    use crate::stats::tests::{addr, conn};
    use chrono::TimeZone;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 0).unwrap() + chrono::TimeDelta::seconds(seconds)
    }

    #[test]
    fn summary_and_marker_say_when_it_left_what_stayed_pinned_and_when_it_came_back() {
        let mut pinned = conn(Some("shop/checkout:http"), "10.244.1.13:8080", 1, 1.0);
        (pinned.start, pinned.end) = (at(1), Some(at(9)));
        let mut first = pinned.clone();
        (first.start, first.end) = (at(21), Some(at(22)));
        let change = |time, added: Vec<_>, removed: Vec<_>| EndpointsRecord {
            service: "shop/checkout:http".into(),
            proto: Proto::Tcp,
            netns: 4026532301,
            added,
            removed,
            time,
        };
        let recording = Recording {
            conns: vec![pinned, first],
            endpoints: vec![
                change(at(5), vec![], vec![addr("10.244.1.13:8080")]),
                change(at(20), vec![addr("10.244.1.13:8080")], vec![]),
            ],
            ..Recording::default()
        };
        let timeline = Timeline::from_recording(&recording);
        assert_eq!(
            render(&timeline, None, at(30)),
            "\nendpoint changes\n  shop/checkout:http (tcp, netns 4026532301)\n    \
             2026-08-06T13:46:05.000000Z 10.244.1.13:8080 left the rules; last new connection 4.00s before; \
             1 connection stale afterwards, for up to 4.00s; back 15.00s later\n    \
             2026-08-06T13:46:20.000000Z 10.244.1.13:8080 joined the rules; first connection 1.00s after\n"
        );
        assert_eq!(render(&timeline, Some("shop/cart:http"), at(30)), "");
        let departure = &timeline
            .service("shop/checkout:http", Proto::Tcp)
            .departures[0];
        assert_eq!(
            marker(departure, at(25)),
            "10.244.1.13 left 20 s ago, back after 15.00s"
        );
    }
}
