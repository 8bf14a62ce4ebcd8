//! The connections behind a skew, told in one line: a rollout window that carried the
//! excess, and pinning without one.

use chrono::{TimeDelta, TimeZone};

use super::*;
use crate::model::record::{Close, ConnRecord, EndpointsRecord, ServiceRecord};
use crate::stats::Aggregator;
use crate::stats::tests::{addr, conn, rules};

const CHECKOUT: &str = "shop/checkout:http";

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 8, 6, 12, 3, 0).unwrap() + TimeDelta::seconds(seconds)
}

/// Endpoints a (10.244.1.12) and b (10.244.1.13) with their pods.
fn two_pods() -> ServiceRecord {
    let mut service = rules(
        CHECKOUT,
        &[("10.244.1.12:8080", 0.5), ("10.244.1.13:8080", 0.5)],
    );
    for (endpoint, pod) in service
        .endpoints
        .iter_mut()
        .zip(["shop/checkout-a", "shop/checkout-b"])
    {
        endpoint.pod = Some(pod.to_owned());
    }
    service
}

fn change(time: DateTime<Utc>, added: &[&str], removed: &[&str]) -> EndpointsRecord {
    EndpointsRecord {
        service: CHECKOUT.into(),
        proto: crate::model::record::Proto::Tcp,
        netns: 4026532301,
        added: added.iter().map(|a| addr(a)).collect(),
        removed: removed.iter().map(|a| addr(a)).collect(),
        time,
    }
}

/// A connection to `backend` opened at `start` carrying `requests`.
fn opened(backend: &str, start: i64, requests: u64) -> ConnRecord {
    let mut record = conn(Some(CHECKOUT), backend, requests, 1000.0);
    record.start = at(start);
    record.end = Some(at(start + 20));
    record.client = format!("10.244.2.9:{}", 40_000 + start).parse().unwrap();
    record
}

fn told(recording: &Recording) -> (Vec<String>, Vec<String>) {
    let services = Aggregator::from_recording(recording).services();
    let stories = stories(&services, recording);
    let s = &services[0];
    let story = &stories[&(s.service.clone(), s.proto)];
    let check = crate::report::check::check_recording(
        recording,
        &crate::report::check::Conditions {
            max_skew: Some(1.5),
            ..Default::default()
        },
    )
    .1;
    (
        reason_lines(s, Some(story), true),
        check
            .iter()
            .filter(|v| v.subject == CHECKOUT)
            .map(ToString::to_string)
            .collect(),
    )
}

#[test]
fn a_keep_alive_connection_opened_before_a_pod_became_ready_is_the_rollout_window() {
    // b joined at 12:03:06; the keep-alive connection to a opened 2 s before and carried
    // 30 requests; two one-request connections after spread evenly.
    let mut service = two_pods();
    service.time = at(0);
    let recording = Recording {
        services: vec![service],
        endpoints: vec![change(at(6), &["10.244.1.13:8080"], &[])],
        conns: vec![
            opened("10.244.1.12:8080", 4, 30),
            opened("10.244.1.12:8080", 8, 1),
            opened("10.244.1.13:8080", 9, 1),
        ],
        ..Recording::default()
    };
    let (lines, check) = told(&recording);
    let story =
        "31 requests on 2 keep-alive connections to shop/checkout-a, opened 12:03:04 .. 12:03:08";
    assert!(lines.iter().all(|l| !l.contains(story)), "{lines:?}");
    assert_eq!(
        lines[..2],
        [
            "pinning: 1 connection carried 30 of 32 requests (a fair DNAT of 3 connections over 2 pods gives skew 1.94 or more half the time)".to_owned(),
            "rollout window: 30 requests on 1 keep-alive connection to shop/checkout-a, opened 12:03:04, 2.00s before shop/checkout-b became ready".to_owned(),
        ],
        "{lines:#?}"
    );
    assert_eq!(check.len(), 1);
    assert!(
        check[0].ends_with("; rollout window: 30 requests on 1 keep-alive connection to shop/checkout-a, opened 12:03:04, 2.00s before shop/checkout-b became ready"),
        "{check:?}"
    );
}

#[test]
fn connections_opened_while_a_pod_was_out_of_the_rules_are_the_rollout_window() {
    // b was out of the rules from 12:03:10 to 12:03:40: the 80 connections opened then
    // all went to a, 30 before and 30 after spread evenly.
    let mut conns = Vec::new();
    for i in 0..30 {
        let backend = if i % 2 == 0 {
            "10.244.1.12:8080"
        } else {
            "10.244.1.13:8080"
        };
        conns.push(opened(backend, i / 6, 1));
        conns.push(opened(backend, 41 + i / 6, 1));
    }
    for i in 0..80 {
        let mut record = opened("10.244.1.12:8080", 10, 1);
        record.start += TimeDelta::milliseconds(i * 300);
        record.client.set_port(50_000 + i as u16);
        conns.push(record);
    }
    let recording = Recording {
        services: vec![two_pods()],
        endpoints: vec![
            change(at(10), &[], &["10.244.1.13:8080"]),
            change(at(40), &["10.244.1.13:8080"], &[]),
        ],
        conns,
        ..Recording::default()
    };
    let (lines, check) = told(&recording);
    assert_eq!(
        lines[0],
        "rollout window: 80 requests on 80 connections to shop/checkout-a, opened 12:03:10 .. 12:03:33, the last 6.30s before shop/checkout-b became ready",
        "{lines:#?}"
    );
    assert_eq!(
        check,
        [
            "shop/checkout:http: skew 1.57 > --max-skew 1.5 (shop/checkout-a (10.244.1.12:8080) got 79% of requests, expected 50%): rollout window: 80 requests on 80 connections to shop/checkout-a, opened 12:03:10 .. 12:03:33, the last 6.30s before shop/checkout-b became ready"
        ]
    );
}

#[test]
fn pinning_without_a_rollout_names_the_connection_and_when_it_opened() {
    let recording = Recording {
        services: vec![two_pods()],
        conns: vec![
            ConnRecord {
                close: Close::Open,
                end: None,
                ..opened("10.244.1.12:8080", 4, 30)
            },
            opened("10.244.1.13:8080", 5, 2),
        ],
        ..Recording::default()
    };
    let (lines, _) = told(&recording);
    assert_eq!(
        lines[1..],
        [
            "30 requests on 1 keep-alive connection to shop/checkout-a, opened 12:03:04".to_owned(),
            "spread: 32 requests on 2 connections (1.1 effective, the busiest carried 30); skew 1.88 = 1.00 from connection counts x 1.88 from requests per connection; a fair DNAT of these connections: median skew 1.88, p = 1.00".to_owned(),
            "busiest: 10.244.2.9:40004 -> 10.244.1.12:8080 30 requests since 12:03:04 (open)".to_owned(),
            "busiest: 10.244.2.9:40005 -> 10.244.1.13:8080 2 requests since 12:03:05".to_owned(),
        ],
        "{lines:#?}"
    );
}
