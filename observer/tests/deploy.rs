//! deploy/: every Kubernetes manifest validates against the Kubernetes schemas
//! (kubernetes-validate, which `cargo xtask setup` installs), the Prometheus alert rules
//! pass `promtool check rules` and their unit tests, every query of the alerts and the
//! Grafana dashboard parses and uses only metrics `observer serve` exports, and those
//! metrics pass `promtool check metrics` with every family filled.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use observer::model::record::Recording;
use observer::model::update::CaptureStats;
use observer::stats::Aggregator;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn run(command: &mut Command) -> Output {
    common::command::run_hinting(command, " (`cargo xtask setup` installs it)")
}

#[test]
#[ignore = "needs promtool and kubernetes-validate (cargo xtask setup): run by cargo xtask test"]
fn manifests_validate_against_kubernetes_schemas() {
    let home = std::env::var_os("HOME").expect("HOME");
    let validate = Path::new(&home).join(".local/share/observer-venv/bin/kubernetes-validate");
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(deploy())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    manifests.sort();
    let names: Vec<String> = manifests
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["daemonset.yaml", "namespace.yaml", "service.yaml"]);
    // 1.30 is the oldest release with the securityContext.appArmorProfile field.
    for version in ["1.30.0", "1.37.0"] {
        let out = run(Command::new(&validate)
            .args(["--strict", "--kubernetes-version", version])
            .args(&manifests));
        let report = String::from_utf8_lossy(&out.stdout);
        assert_eq!(report.matches(" passed ").count(), 3, "{report}");
    }
    // The validator rejects what it should (an unknown field), so a pass means something.
    let bad = tempfile::NamedTempFile::new().unwrap();
    let daemonset = std::fs::read_to_string(deploy().join("daemonset.yaml")).unwrap();
    std::fs::write(
        bad.path(),
        daemonset.replace("hostPID: true", "hostPID: true\n      hostPIDs: true"),
    )
    .unwrap();
    let out = Command::new(&validate)
        .arg("--strict")
        .arg(bad.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
#[ignore = "needs promtool and kubernetes-validate (cargo xtask setup): run by cargo xtask test"]
fn alert_rules_check_and_pass_their_unit_tests() {
    let dir = deploy().join("prometheus");
    let out = run(Command::new("promtool")
        .args(["check", "rules", "observer-alerts.yml"])
        .current_dir(&dir));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("SUCCESS: 6 rules found"),
        "{out:?}"
    );
    run(Command::new("promtool")
        .args(["test", "rules", "observer-alerts.test.yml"])
        .current_dir(&dir));
}

/// Every `observer_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("observer_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

#[test]
#[ignore = "needs promtool and kubernetes-validate (cargo xtask setup): run by cargo xtask test"]
fn dashboard_queries_parse_and_use_exported_metrics() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/observer-dashboard.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap().iter())
        .map(|target| target["expr"].as_str().unwrap().replace("$service", ".*"))
        .collect();
    assert!(exprs.len() >= 7, "{exprs:?}");
    // promtool parses PromQL in rule files: one recording rule per query.
    let rules: String = exprs
        .iter()
        .enumerate()
        .map(|(i, expr)| format!("      - record: dashboard_query_{i}\n        expr: '{expr}'\n"))
        .collect();
    let file = tempfile::Builder::new().suffix(".yml").tempfile().unwrap();
    std::fs::write(
        file.path(),
        format!("groups:\n  - name: dashboard\n    rules:\n{rules}"),
    )
    .unwrap();
    run(Command::new("promtool")
        .args(["check", "rules"])
        .arg(file.path()));

    let exported = metric_names(&observer::sinks::metrics::render(
        &[],
        &CaptureStats::default(),
    ));
    let alerts = std::fs::read_to_string(deploy().join("prometheus/observer-alerts.yml")).unwrap();
    let used = metric_names(&(exprs.join("\n") + &alerts));
    assert!(used.len() >= 7, "{used:?}");
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "not exported by observer serve: {unknown:?}"
    );
}

#[test]
#[ignore = "needs promtool and kubernetes-validate (cargo xtask setup): run by cargo xtask test"]
fn metrics_of_every_outcome_pass_promtool_lint() {
    // Refused, unanswered and answered connections with connect times, rejects at two
    // Services, and every capture counter.
    let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/logs/outcomes.jsonl");
    let recording = Recording::read(&log).unwrap();
    let metrics = observer::sinks::metrics::render(
        &Aggregator::from_recording(&recording).services(),
        &CaptureStats {
            lost_rejects: 1,
            ..CaptureStats::default()
        },
    );
    common::metrics::promtool_lint(&metrics);
}
