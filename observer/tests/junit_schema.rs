//! `observer check -o junit` against the JUnit schema CI systems validate reports with
//! (Jenkins' xUnit plugin's `junit-10.xsd`, `data/junit/`), by xmlschema from PyPI, which
//! `cargo xtask setup` installs: passing and failing checks, every kind of condition, text
//! that needs escaping. A document that breaks the schema is refused, so the validator is
//! known to be working.

mod common;

use std::path::Path;
use std::process::Command;

use common::junit::validate_junit as validate;

fn check_junit(log: &Path, conditions: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["check", "-o", "junit"])
        .args(conditions)
        .arg(log)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

#[test]
#[ignore = "needs xmlschema (cargo xtask setup): run by cargo xtask test"]
fn check_reports_are_valid_junit() {
    let dir = tempfile::tempdir().unwrap();
    let logs = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/logs");
    // A file name that needs escaping in attributes.
    let odd = dir.path().join("a&b<\"c\">.jsonl");
    std::fs::copy(format!("{logs}/outcomes.jsonl"), &odd).unwrap();
    let every = [
        "--max-skew",
        "1.5",
        "--min-backends",
        "3",
        "--max-stale",
        "0",
        "--min-connections",
        "1",
        "--min-requests",
        "1",
        "--max-refused",
        "0",
        "--max-unanswered",
        "0",
        "--max-resets",
        "0",
        "--max-rejected",
        "0",
        "--max-connect-p99",
        "10",
    ];
    for (log, expected) in [
        (Path::new(logs).join("keepalive.jsonl"), 1),
        (Path::new(logs).join("balanced.jsonl"), 0),
        (Path::new(logs).join("mixed.jsonl"), 1),
        (Path::new(logs).join("cut.jsonl"), 1),
        (odd, 1),
    ] {
        let (code, xml) = check_junit(&log, &every);
        assert_eq!(code, Some(expected), "{}: {xml}", log.display());
        assert!(xml.contains("<testcase name=\"max_skew 1.5\""), "{xml}");
        if let Err(why) = validate(&xml, dir.path()) {
            panic!("{}: not valid JUnit: {why}\n{xml}", log.display());
        }
        let failures = xml.matches("<failure ").count();
        assert_eq!(failures > 0, expected == 1, "{xml}");
        assert!(xml.contains(&format!("failures=\"{failures}\" errors=\"0\">")));
    }
    // The validator refuses what breaks the schema: a test suite without its counts.
    let broken = "<?xml version=\"1.0\"?>\n<testsuites><testsuite name=\"x\"><testcase name=\"y\"/></testsuite></testsuites>\n";
    assert!(validate(broken, dir.path()).is_err());
}
