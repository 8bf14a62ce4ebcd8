//! One command line, one convention: each row is a command line, the exit status it must
//! end with (0 success, 1 a condition failed, 2 bad usage or unreadable input) and a text
//! its output must contain. None of these needs root.

use std::process::Command;

const LOGS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/logs");

/// (arguments, exit status, text in stdout or stderr). `{logs}` is the fixture folder.
const TABLE: &[(&str, i32, &str)] = &[
    // Live-view flags before a subcommand are a usage error, not silently dropped.
    (
        "--no-names summary {logs}/keepalive.jsonl",
        2,
        "the subcommand 'summary' cannot be used with '--no-names'",
    ),
    // A missing file is exit 2 from every reader, with the OS reason once.
    (
        "summary /nonexistent/conns.jsonl",
        2,
        "observer: /nonexistent/conns.jsonl: cannot read: No such file or directory (os error 2)\n",
    ),
    (
        "check /nonexistent/conns.jsonl",
        2,
        "observer: /nonexistent/conns.jsonl: cannot read: No such file or directory (os error 2)\n",
    ),
    (
        "--replay /nonexistent/conns.jsonl",
        2,
        "observer: /nonexistent/conns.jsonl: cannot read: No such file or directory (os error 2)\n",
    ),
    (
        "summary {logs}/corrupt.jsonl",
        2,
        "corrupt.jsonl:3: not a connection log line",
    ),
    // Negative numbers get the same sentence however they are written.
    (
        "record -w - --duration -5",
        2,
        "`-5` is not a positive number of seconds",
    ),
    (
        "record -w - --duration=-5",
        2,
        "`-5` is not a positive number of seconds",
    ),
    (
        "--idle-timeout -1",
        2,
        "`-1` is not a positive number of seconds",
    ),
    (
        "check --min-backends -5 {logs}/keepalive.jsonl",
        2,
        "`-5` is not a whole number >= 0",
    ),
    (
        "check --min-backends=-5 {logs}/keepalive.jsonl",
        2,
        "`-5` is not a whole number >= 0",
    ),
    // Absurd values are refused with the allowed range.
    (
        "record -w - --idle-timeout 1e-9",
        2,
        "`1e-9` seconds is out of range: allowed are 0.1 to 86400",
    ),
    (
        "record -w - --duration 1e12",
        2,
        "`1e12` seconds is out of range: allowed are 0.01 to 31536000",
    ),
    (
        "rules -o yaml",
        2,
        "invalid value 'yaml' for '--output <FORMAT>'",
    ),
    (
        "check --max-skew 0.5 {logs}/keepalive.jsonl",
        2,
        "is not a ratio >= 1",
    ),
    (
        "check --max-connect-p99=-5 {logs}/outcomes.jsonl",
        2,
        "`-5` is not a positive number of milliseconds",
    ),
    (
        "check --max-refused many {logs}/outcomes.jsonl",
        2,
        "`many` is not a whole number >= 0",
    ),
    // Verdicts: 1 when a condition fails, 0 when all hold.
    (
        "check --max-skew 1.5 {logs}/keepalive.jsonl",
        1,
        "shop/checkout:http: skew 3.00 > --max-skew 1.5",
    ),
    (
        "check --max-skew 1.5 {logs}/balanced.jsonl",
        0,
        "every condition holds",
    ),
    (
        "check --max-refused 0 --max-rejected 0 {logs}/outcomes.jsonl",
        1,
        "shop/checkout:http: 7 refused > --max-refused 0 (10.244.1.13:8080: 7)\nshop/empty:dns: 1 rejected",
    ),
    (
        "check --max-unanswered 6 --max-connect-p99 12.5 {logs}/outcomes.jsonl",
        0,
        "every condition holds",
    ),
    // `check -o json`: the same exit codes, every condition on a line, then the verdict.
    (
        "check -o json --max-skew 1.5 {logs}/keepalive.jsonl",
        1,
        "{\"type\":\"condition\",\"subject\":\"shop/checkout:http\",\"condition\":\"max_skew\",\"limit\":1.5,\"holds\":false,\"violation\":\"skew 3.00 > --max-skew 1.5",
    ),
    (
        "check --output json --max-skew 1.5 {logs}/balanced.jsonl",
        0,
        "\"holds\":true,\"services\":1,\"connections\":6,\"violations\":0}",
    ),
    (
        "check -o yaml {logs}/balanced.jsonl",
        2,
        "invalid value 'yaml' for '--output <FORMAT>'",
    ),
    // Output selection is the same flag on every listing command.
    (
        "summary -o json {logs}/keepalive.jsonl",
        0,
        "\"service\":\"shop/checkout:http\"",
    ),
    (
        "summary --output table {logs}/keepalive.jsonl",
        0,
        "! skew 3.00x",
    ),
    // Pod names beside the addresses by default; `--addresses` leaves them out.
    (
        "summary {logs}/pods.jsonl",
        0,
        "  10.244.1.12:8080  shop/checkout-a",
    ),
    (
        "summary --addresses {logs}/pods.jsonl",
        0,
        "  10.244.1.12:8080      2       0",
    ),
    // A log with dns lines reads everywhere; `--dns` shows the walks.
    (
        "summary --dns {logs}/dns.jsonl",
        0,
        "  www.example.com -> www.example.com: 8 queries, 6 NXDOMAIN\n  checkout -> checkout.shop.svc.cluster.local: 2 queries\n",
    ),
    (
        "summary --dns -o json {logs}/dns.jsonl",
        0,
        "\"queries_per_lookup\":3.6666666666666665,",
    ),
    (
        "summary --dns --service x {logs}/dns.jsonl",
        2,
        "cannot be used with",
    ),
    ("summary {logs}/dns.jsonl", 0, "kube-system/kube-dns:dns"),
    // Outcomes and rejects read from a log, in every reader.
    (
        "summary {logs}/outcomes.jsonl",
        0,
        "  ! 7 refused by 10.244.1.13:8080 (nothing listens)\n",
    ),
    (
        "summary --service shop/empty:http {logs}/outcomes.jsonl",
        0,
        "  ! 5 rejected: no endpoints\n",
    ),
    ("check {logs}/dns.jsonl", 0, ""),
];

#[test]
fn every_command_line_exits_by_the_convention() {
    let mut failures = Vec::new();
    for (args, status, text) in TABLE {
        let args = args.replace("{logs}", LOGS);
        let out = Command::new(env!("CARGO_BIN_EXE_observer"))
            .args(args.split_whitespace())
            .output()
            .expect("run observer");
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.code() != Some(*status)
            || !output.contains(text)
            || output.contains("panicked")
        {
            failures.push(format!(
                "observer {args}: want exit {status} and {text:?}, got {:?}:\n{output}",
                out.status.code()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn summary_json_is_one_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["summary", "-o", "json", &format!("{LOGS}/keepalive.jsonl")])
        .output()
        .expect("run observer");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["services"][0]["backends"][0]["requests"], 30);
}
