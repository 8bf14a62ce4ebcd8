//! Which connections, rules and lines a window keeps.

use chrono::{TimeDelta, TimeZone};

use super::*;
use crate::model::record::{ConnRecord, EndpointsRecord, Proto};

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 8, 6, 13, 46, 0).unwrap() + TimeDelta::seconds(seconds)
}

fn conn(start: i64, end: Option<i64>) -> ConnRecord {
    ConnRecord {
        start: at(start),
        end: end.map(at),
        client: format!("10.244.1.9:{}", 40_000 + start).parse().unwrap(),
        ..ConnRecord::example("10.244.1.12:8080")
    }
}

fn rules(time: i64, endpoints: usize) -> ServiceRecord {
    let text = format!(
        r#"{{"service":"shop/checkout:http","proto":"tcp","netns":1,"frontends":[],"endpoints":[{}],"time":"2026-08-06T13:46:{time:02}.000000Z"}}"#,
        (0..endpoints)
            .map(|i| format!(
                r#"{{"addr":"10.244.1.{}:8080","expected_share":{}}}"#,
                12 + i,
                1.0 / endpoints as f64
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    serde_json::from_str(&text).unwrap()
}

#[test]
fn connections_open_at_any_moment_of_the_window_count_whole() {
    let recording = Recording {
        conns: vec![
            conn(0, Some(5)),   // before
            conn(0, Some(15)),  // opened before, open in the window
            conn(12, Some(14)), // inside
            conn(18, None),     // opened inside, still open
            conn(25, Some(26)), // after
        ],
        endpoints: vec![EndpointsRecord {
            service: "shop/checkout:http".into(),
            proto: Proto::Tcp,
            netns: 1,
            added: vec!["10.244.1.13:8080".parse().unwrap()],
            removed: vec![],
            time: at(3),
        }],
        services: vec![rules(0, 1), rules(3, 2), rules(22, 3)],
        ..Recording::default()
    };
    let span = Span {
        since: Some(at(10)),
        until: Some(at(20)),
    };
    let kept = span.apply(&recording);
    let starts: Vec<i64> = kept
        .conns
        .iter()
        .map(|c| (c.start - at(0)).num_seconds())
        .collect();
    assert_eq!(starts, [0, 12, 18]);
    // The rules as they were at the window's end; the change before it stays.
    let endpoints: Vec<usize> = kept.services.iter().map(|s| s.endpoints.len()).collect();
    assert_eq!(endpoints, [1, 2]);
    assert_eq!(kept.endpoints.len(), 1);
    // Open-ended windows.
    let from = Span {
        since: Some(at(20)),
        until: None,
    };
    assert_eq!(from.apply(&recording).conns.len(), 2);
    // A Service defined only after the window keeps its first definition.
    let early = Span {
        since: None,
        until: Some(at(1)),
    };
    let late_only = Recording {
        services: vec![rules(3, 2), rules(22, 3)],
        ..Recording::default()
    };
    assert_eq!(early.apply(&late_only).services, vec![rules(3, 2)]);
}
