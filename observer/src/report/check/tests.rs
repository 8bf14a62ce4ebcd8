use std::path::PathBuf;

use super::*;
use crate::model::record::ReadError;

/// A check as the command line states it: the file and the conditions.
#[derive(Clone, Default)]
struct CheckArgs {
    file: PathBuf,
    service: Vec<String>,
    max_skew: Option<f64>,
    min_backends: Option<u64>,
    max_stale: Option<u64>,
    min_connections: Option<u64>,
    max_lost: u64,
    min_requests: Option<u64>,
}

impl CheckArgs {
    fn conditions(&self) -> Conditions {
        Conditions {
            service: self.service.clone(),
            max_skew: self.max_skew,
            min_backends: self.min_backends,
            max_stale: self.max_stale,
            min_connections: self.min_connections,
            max_lost: self.max_lost,
            min_requests: self.min_requests,
            ..Conditions::default()
        }
    }
}

fn check_file(args: &CheckArgs) -> Result<(Vec<ServiceStats>, Vec<Violation>), ReadError> {
    Ok(check_recording(
        &Recording::read(&args.file)?,
        &args.conditions(),
    ))
}

fn path(name: &str) -> PathBuf {
    format!("{}/tests/data/logs/{name}", env!("CARGO_MANIFEST_DIR")).into()
}

fn args(name: &str) -> CheckArgs {
    CheckArgs {
        file: path(name),
        ..CheckArgs::default()
    }
}

/// The violation lines `observer check` would print.
fn lines(args: &CheckArgs) -> Vec<String> {
    let (_, found) = check_file(args).unwrap();
    found.iter().map(Violation::to_string).collect()
}

const CHECKOUT: &str = "shop/checkout:http";

#[test]
fn worked_example_in_the_module_doc_is_exact() {
    let keepalive = CheckArgs {
        max_skew: Some(1.5),
        min_backends: Some(3),
        ..args("keepalive.jsonl")
    };
    assert_eq!(
        lines(&keepalive),
        [
            "shop/checkout:http: 1 backend got requests < --min-backends 3 (none to 10.244.1.13:8080, 10.244.1.14:8080)",
            "shop/checkout:http: skew 3.00 > --max-skew 1.5 (10.244.1.12:8080 got 100% of requests, expected 33%): pinning: 1 connection carried 30 of 30 requests (a fair DNAT of 1 connection over 3 pods gives skew 3.00 or more half the time); 30 requests on 1 keep-alive connection to 10.244.1.12:8080, opened 13:46:36",
        ]
    );
    let balanced = CheckArgs {
        file: path("balanced.jsonl"),
        ..keepalive.clone()
    };
    assert_eq!(lines(&balanced), Vec::<String>::new());
    let mixed = CheckArgs {
        service: vec!["shop/cart:http".to_owned()],
        ..args("mixed.jsonl")
    };
    assert_eq!(
        lines(&mixed),
        [
            "recording: 2 lost connections > --max-lost 0 (DNAT decisions without a record: counts are incomplete)"
        ]
    );
}

#[test]
fn unreadable_files_name_the_cause_and_line() {
    // As `observer check` prints it: the error and its causes.
    let err = |name: &str| {
        format!(
            "{:#}",
            anyhow::Error::from(check_file(&args(name)).unwrap_err())
        )
    };
    let dir = path("");
    let dir = dir.display();
    assert_eq!(
        err("corrupt.jsonl"),
        format!(
            "{dir}corrupt.jsonl:3: not a connection log line: EOF while parsing an object at line 1 column 52"
        )
    );
    assert_eq!(
        err("empty.jsonl"),
        format!(
            "{dir}empty.jsonl: the file is empty; expected JSON Lines written by `observer record`"
        )
    );
    assert!(
        err("missing.jsonl").starts_with(&format!("{dir}missing.jsonl: cannot read: No such file"))
    );
}

#[test]
fn max_skew_passes_at_the_limit_and_fails_above() {
    let at = CheckArgs {
        max_skew: Some(3.0),
        ..args("keepalive.jsonl")
    };
    // 1 / 0.33333333349 = 2.9999999986: within 3.
    assert_eq!(lines(&at), Vec::<String>::new());
    let below = CheckArgs {
        max_skew: Some(2.99),
        ..at
    };
    assert_eq!(
        lines(&below),
        [
            "shop/checkout:http: skew 3.00 > --max-skew 2.99 (10.244.1.12:8080 got 100% of requests, expected 33%): pinning: 1 connection carried 30 of 30 requests (a fair DNAT of 1 connection over 3 pods gives skew 3.00 or more half the time); 30 requests on 1 keep-alive connection to 10.244.1.12:8080, opened 13:46:36"
        ]
    );
}

#[test]
fn min_backends_counts_backends_with_a_request() {
    let pass = CheckArgs {
        min_backends: Some(3),
        ..args("balanced.jsonl")
    };
    assert_eq!(lines(&pass), Vec::<String>::new());
    let fail = CheckArgs {
        min_backends: Some(4),
        ..pass
    };
    // Every endpoint got requests, so no idle ones to name.
    assert_eq!(
        lines(&fail),
        ["shop/checkout:http: 3 backends got requests < --min-backends 4"]
    );
}

#[test]
fn min_connections_and_min_requests() {
    let pass = CheckArgs {
        min_connections: Some(6),
        min_requests: Some(30),
        ..args("balanced.jsonl")
    };
    assert_eq!(lines(&pass), Vec::<String>::new());
    let fail = CheckArgs {
        min_connections: Some(7),
        min_requests: Some(31),
        ..pass
    };
    assert_eq!(
        lines(&fail),
        [
            "shop/checkout:http: 6 connections < --min-connections 7",
            "shop/checkout:http: 30 requests < --min-requests 31",
        ]
    );
}

#[test]
fn max_stale_and_unnamed_services_are_labelled_with_proto() {
    let check = |max_stale| CheckArgs {
        max_stale: Some(max_stale),
        min_connections: Some(2),
        max_lost: 2,
        ..args("mixed.jsonl")
    };
    assert_eq!(
        lines(&check(0)),
        [
            "10.96.0.10:53/udp: 1 connection < --min-connections 2",
            "shop/cart:http: 1 stale pin > --max-stale 0 (10.244.2.99:8080: 1)",
        ]
    );
    assert_eq!(
        lines(&check(1)),
        ["10.96.0.10:53/udp: 1 connection < --min-connections 2"]
    );
}

#[test]
fn max_lost_and_a_missing_summary_line() {
    let lost = |max_lost| CheckArgs {
        max_lost,
        ..args("mixed.jsonl")
    };
    assert_eq!(lines(&lost(2)), Vec::<String>::new());
    assert_eq!(lines(&lost(1)).len(), 1);
    assert_eq!(
        lines(&args("nosummary.jsonl")),
        [
            "recording: no summary line, so lost connections are unknown (the recording did not end cleanly) and --max-lost 0 cannot hold"
        ]
    );
    // The same lines and half of one more: the cut is the violation.
    assert_eq!(
        lines(&args("cut.jsonl")),
        [
            "recording: the log was cut at line 3 (observer did not exit cleanly): counts are incomplete"
        ]
    );
}

#[test]
fn a_service_missing_from_the_recording_is_a_violation() {
    let check = CheckArgs {
        service: vec![CHECKOUT.to_owned(), "shop/cart:http".to_owned()],
        min_connections: Some(1),
        ..args("keepalive.jsonl")
    };
    assert_eq!(
        lines(&check),
        ["shop/cart:http: not in the recording (it has: shop/checkout:http)"]
    );
    // `observer check` exits 1 exactly when there are violations.
    assert!(!check_file(&check).unwrap().1.is_empty());
}

#[test]
fn conditions_on_a_recording_without_services_fail() {
    let summary = SummaryRecord::default();
    let check = CheckArgs {
        min_requests: Some(1),
        ..CheckArgs::default()
    };
    let found: Vec<String> = violations(&check.conditions(), None, Some(&summary), &[])
        .iter()
        .map(Violation::to_string)
        .collect();
    assert_eq!(found, ["recording: no Services or connections to check"]);
    // Without per-Service conditions an empty, loss-free recording passes.
    assert_eq!(
        violations(&Conditions::default(), None, Some(&summary), &[]),
        []
    );
}

#[test]
fn service_filter_limits_the_conditions_to_the_named_services() {
    let check = CheckArgs {
        service: vec!["shop/cart:http".to_owned()],
        min_connections: Some(2),
        max_lost: 2,
        ..args("mixed.jsonl")
    };
    // The unnamed DNS service has 1 connection but is not selected.
    assert_eq!(lines(&check), Vec::<String>::new());
    let (services, _) = check_file(&check).unwrap();
    assert_eq!(services.len(), 1);
}

/// The violation lines of `conditions` on the fixture with every outcome and rejects.
fn outcome_lines(conditions: &Conditions) -> Vec<String> {
    let recording = Recording::read(&path("outcomes.jsonl")).unwrap();
    let (_, found) = check_recording(&recording, conditions);
    found.iter().map(Violation::to_string).collect()
}

#[test]
fn worked_example_of_outcomes_in_the_module_doc_is_exact() {
    let strict = Conditions {
        max_refused: Some(0),
        max_unanswered: Some(0),
        max_rejected: Some(0),
        max_connect_p99: Some(10.0),
        ..Conditions::default()
    };
    assert_eq!(
        outcome_lines(&strict),
        [
            "shop/checkout:http: 7 refused > --max-refused 0 (10.244.1.13:8080: 7)",
            "shop/checkout:http: 6 unanswered > --max-unanswered 0 (10.244.1.14:8080: 6)",
            "shop/checkout:http: connect p99 12.5ms > --max-connect-p99 10 (10.244.1.12:8080: 12.5ms)",
            "shop/empty:dns: 1 rejected > --max-rejected 0 (no endpoints; 4 datagrams from 1 client socket)",
            "shop/empty:http: 5 rejected > --max-rejected 0 (no endpoints)",
        ]
    );
}

#[test]
fn outcome_conditions_pass_at_their_limit() {
    let at_limit = Conditions {
        max_refused: Some(7),
        max_unanswered: Some(6),
        max_rejected: Some(5),
        max_connect_p99: Some(12.5),
        ..Conditions::default()
    };
    assert_eq!(outcome_lines(&at_limit), Vec::<String>::new());
    // One below fails each; the filter keeps the Service that only got rejects.
    let below = Conditions {
        service: vec!["shop/empty:http".to_owned()],
        max_rejected: Some(4),
        ..at_limit.clone()
    };
    assert_eq!(
        outcome_lines(&below),
        ["shop/empty:http: 5 rejected > --max-rejected 4 (no endpoints)"]
    );
    let refused = Conditions {
        service: vec![CHECKOUT.to_owned()],
        max_refused: Some(6),
        ..at_limit
    };
    assert_eq!(
        outcome_lines(&refused),
        ["shop/checkout:http: 7 refused > --max-refused 6 (10.244.1.13:8080: 7)"]
    );
}

#[test]
fn recordings_without_outcomes_pass_the_outcome_conditions() {
    // Written before outcomes existed: every connection answered, no connect times.
    let conditions = Conditions {
        max_refused: Some(0),
        max_unanswered: Some(0),
        max_rejected: Some(0),
        max_connect_p99: Some(0.001),
        ..Conditions::default()
    };
    let recording = Recording::read(&path("balanced.jsonl")).unwrap();
    assert_eq!(check_recording(&recording, &conditions).1, []);
}

/// `check -o json`: every condition checked, one line each, then the verdict; the lines
/// that do not hold carry the same text as the table.
#[test]
fn json_lines_name_every_condition_and_end_with_the_verdict() {
    let conditions = Conditions {
        max_skew: Some(1.5),
        min_backends: Some(1),
        ..Conditions::default()
    };
    let recording = Recording::read(&path("keepalive.jsonl")).unwrap();
    let (services, verdicts) = judge_recording(&recording, &conditions);
    let text = render_json("keepalive.jsonl", &verdicts, &services);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let summary = |line: &serde_json::Value| {
        (
            line["subject"].as_str().unwrap_or("").to_owned(),
            line["condition"].as_str().unwrap_or("").to_owned(),
            line["holds"].as_bool().unwrap(),
        )
    };
    let conditions: Vec<_> = lines[..lines.len() - 1].iter().map(summary).collect();
    let condition = |subject: &str, name: &str, holds| (subject.to_owned(), name.to_owned(), holds);
    assert_eq!(
        conditions,
        [
            condition("recording", "complete_log", true),
            condition("recording", "max_lost", true),
            condition("recording", "services", true),
            condition(CHECKOUT, "min_backends", true),
            condition(CHECKOUT, "max_skew", false),
        ]
    );
    assert_eq!(lines[4]["limit"], 1.5);
    assert!(
        lines[4]["violation"]
            .as_str()
            .unwrap()
            .starts_with("skew 3.00 > --max-skew 1.5"),
        "{text}"
    );
    assert!(lines[3].get("violation").is_none());
    assert_eq!(
        lines.last().unwrap(),
        &serde_json::json!({
            "type": "verdict", "file": "keepalive.jsonl", "holds": false,
            "services": 1, "connections": services[0].connections, "violations": 1,
        })
    );
    assert!(lines[..4].iter().all(|l| l["type"] == "condition"));
}

/// The verdicts that do not hold are exactly the violations, in the same order.
#[test]
fn verdicts_that_fail_are_the_violations() {
    let conditions = Conditions {
        service: vec!["shop/nope:http".into(), CHECKOUT.into()],
        max_skew: Some(1.5),
        max_lost: 0,
        ..Conditions::default()
    };
    for log in [
        "keepalive.jsonl",
        "mixed.jsonl",
        "cut.jsonl",
        "balanced.jsonl",
    ] {
        let recording = Recording::read(&path(log)).unwrap();
        let (_, verdicts) = judge_recording(&recording, &conditions);
        let (_, found) = check_recording(&recording, &conditions);
        let failed: Vec<Violation> = verdicts
            .into_iter()
            .filter_map(Verdict::into_violation)
            .collect();
        assert_eq!(failed, found, "{log}");
    }
}

/// `--max-resets` counts answered connections that ended with an RST, not refused ones.
#[test]
fn max_resets_counts_answered_connections_reset_not_refused_ones() {
    use crate::model::record::{Close, ConnRecord};
    let conn = |backend: &str, close| ConnRecord {
        service: Some(CHECKOUT.into()),
        endpoint_in_rules: Some(true),
        close,
        ..ConnRecord::example(backend)
    };
    let recording = Recording {
        conns: vec![
            conn("10.244.1.12:8080", Close::Rst),
            conn("10.244.1.12:8080", Close::Rst),
            conn("10.244.1.13:8080", Close::Rst),
            conn("10.244.1.13:8080", Close::Refused),
            conn("10.244.1.14:8080", Close::Fin),
        ],
        summary: Some(SummaryRecord::default()),
        ..Recording::default()
    };
    let check = |max| {
        let conditions = Conditions {
            max_resets: Some(max),
            ..Conditions::default()
        };
        check_recording(&recording, &conditions)
            .1
            .iter()
            .map(Violation::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(check(3), Vec::<String>::new());
    assert_eq!(
        check(2),
        [
            "shop/checkout:http: 3 answered connections ended with an RST > --max-resets 2 (10.244.1.12:8080: 2, 10.244.1.13:8080: 1)"
        ]
    );
}

/// A Service with ClientIP session affinity is judged on stickiness: one client's 30
/// connections to one pod pass (no skew verdict); a client switching pods within the
/// timeout fails, saying so. `--max-cross-node` bounds connections to other nodes.
#[test]
fn affinity_is_judged_on_stickiness_and_cross_node_connections_are_bounded() {
    use crate::model::record::Affinity;
    use crate::stats::tests::{conn, three_endpoints};
    let mut service = three_endpoints();
    service.affinity = Some(Affinity {
        timeout_s: Some(10_800),
    });
    let mut recording = Recording {
        services: vec![service],
        summary: Some(crate::model::record::SummaryRecord::default()),
        ..Recording::default()
    };
    for i in 0..30 {
        let mut c = conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 5.0);
        c.start += chrono::Duration::seconds(i);
        c.same_node = Some(i % 3 != 0);
        recording.conns.push(c);
    }
    let conditions = Conditions {
        max_skew: Some(1.5),
        max_cross_node: Some(10),
        ..Conditions::default()
    };
    let (_, found) = check_recording(&recording, &conditions);
    assert!(
        found.is_empty(),
        "{:?}",
        found.iter().map(Violation::to_string).collect::<Vec<_>>()
    );
    let mut switched = conn(Some(CHECKOUT), "10.244.1.13:8080", 1, 5.0);
    switched.start += chrono::Duration::seconds(40);
    switched.same_node = Some(false);
    recording.conns.push(switched);
    let (_, found) = check_recording(&recording, &conditions);
    let text: Vec<String> = found.iter().map(Violation::to_string).collect();
    assert_eq!(text.len(), 2, "{text:?}");
    assert!(
        text.iter()
            .any(|t| t.contains("session affinity broken: 1 connection of 1 client")),
        "{text:?}"
    );
    assert!(
        text.iter().any(
            |t| t.contains("11 connections to a backend on another node > --max-cross-node 10")
        ),
        "{text:?}"
    );
}
