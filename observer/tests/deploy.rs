//! deploy/: every Kubernetes manifest validates against the Kubernetes schemas
//! (kubernetes-validate, which `cargo xtask setup` installs), the objects that put
//! kube-rbac-proxy in front of observer point at each other, the Prometheus alert rules
//! pass `promtool check rules` and their unit tests, every query of the alerts and the
//! Grafana dashboard parses and uses only metrics `observer serve` exports, and those
//! metrics pass `promtool check metrics` with every family filled.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use observer::model::record::CtStats;
use observer::model::record::Recording;
use observer::model::update::CaptureStats;
use observer::sinks::metrics::{Exposition, render};
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
    assert_eq!(
        names,
        [
            "daemonset.yaml",
            "namespace.yaml",
            "rbac.yaml",
            "service.yaml"
        ]
    );
    // 1.30 is the oldest release with the securityContext.appArmorProfile field.
    for version in ["1.30.0", "1.37.0"] {
        let out = run(Command::new(&validate)
            .args(["--strict", "--kubernetes-version", version])
            .args(&manifests));
        let report = String::from_utf8_lossy(&out.stdout);
        // One per object: rbac.yaml holds five.
        assert_eq!(report.matches(" passed ").count(), 8, "{report}");
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

/// The objects of `file` in deploy/ (one or more YAML documents).
fn objects(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(deploy().join(file)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect()
}

fn one_of<'a>(objects: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// `--name=value` among a container's args.
fn flag<'a>(container: &'a serde_json::Value, name: &str) -> &'a str {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|arg| arg.as_str()?.strip_prefix(&format!("--{name}=")))
        .unwrap_or_else(|| panic!("no --{name} in {container}"))
}

/// kube-rbac-proxy is the only way to observer's /metrics from the network, and every
/// object on that way names the next: Service -> proxy port -> observer's loopback
/// listener; the proxy's ServiceAccount may make the reviews it needs; the
/// ServiceMonitor scrapes the Service's port with a token. (The ServiceMonitor is a
/// custom resource that kubernetes-validate has no schema for.)
#[test]
fn kube_rbac_proxy_guards_metrics() {
    let daemonset = &objects("daemonset.yaml")[0];
    let pod = &daemonset["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    let container = |name: &str| containers.iter().find(|c| c["name"] == name).unwrap();
    let (observer, proxy) = (container("observer"), container("kube-rbac-proxy"));

    // observer listens on the node's loopback only, on no declared port.
    let args: Vec<&str> = observer["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let listen = args[args.iter().position(|a| *a == "--listen").unwrap() + 1];
    let listen: std::net::SocketAddr = listen.parse().unwrap();
    assert!(listen.ip().is_loopback(), "{listen}");
    assert!(observer.get("ports").is_none());
    let probe = &observer["readinessProbe"]["httpGet"];
    assert_eq!(probe["host"], "127.0.0.1");
    assert_eq!(probe["port"], listen.port());

    // The proxy forwards only /metrics, to that listener, from its own HTTPS port.
    assert_eq!(flag(proxy, "upstream"), format!("http://{listen}/"));
    assert_eq!(flag(proxy, "allow-paths"), "/metrics");
    assert!(
        proxy["image"]
            .as_str()
            .unwrap()
            .starts_with("quay.io/brancz/kube-rbac-proxy:")
    );
    let https = &proxy["ports"][0];
    assert_eq!(https["name"], "https");
    assert_eq!(https["hostPort"], https["containerPort"]);
    let port = https["containerPort"].as_u64().unwrap();
    assert_eq!(
        flag(proxy, "secure-listen-address"),
        format!("[$(IP)]:{port}")
    );
    assert_eq!(proxy["securityContext"]["runAsNonRoot"], true);

    // Its ServiceAccount may create TokenReviews and SubjectAccessReviews.
    let rbac = objects("rbac.yaml");
    let account = pod["serviceAccountName"].as_str().unwrap();
    let namespace = daemonset["metadata"]["namespace"].as_str().unwrap();
    let service_account = one_of(&rbac, "ServiceAccount", account);
    assert_eq!(service_account["metadata"]["namespace"], namespace);
    let binding = one_of(&rbac, "ClusterRoleBinding", "observer");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}])
    );
    let role = one_of(
        &rbac,
        "ClusterRole",
        binding["roleRef"]["name"].as_str().unwrap(),
    );
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for (group, resource, verb) in granted_by(rule) {
            granted.insert((group, resource, verb));
        }
    }
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        assert!(granted.contains(&(group.into(), resource.into(), "create".into())));
    }
    // Readers get /metrics, nothing else.
    let reader = one_of(&rbac, "ClusterRole", "observer-metrics-reader");
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );

    // The Service and its ServiceMonitor reach the proxy's port, over HTTPS, with a token.
    let service = &objects("service.yaml")[0];
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
    assert_eq!(service["spec"]["ports"][0]["port"], port);
    let annotations = &service["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], port.to_string());
    assert_eq!(annotations["prometheus.io/scheme"], "https");
    for (label, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels(daemonset)[label], value);
    }
    let monitor = &objects("prometheus/observer-servicemonitor.yaml")[0];
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["kind"], "ServiceMonitor");
    for (label, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][label], value);
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["path"], "/metrics");
    assert!(endpoint["bearerTokenFile"].is_string());
}

/// Every (API group, resource, verb) a rule grants.
fn granted_by(rule: &serde_json::Value) -> Vec<(String, String, String)> {
    let list = |field: &str| -> Vec<String> {
        rule[field]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let mut granted = Vec::new();
    for group in list("apiGroups") {
        for resource in list("resources") {
            for verb in list("verbs") {
                granted.push((group.clone(), resource.clone(), verb));
            }
        }
    }
    granted
}

fn pod_labels(daemonset: &serde_json::Value) -> &serde_json::Map<String, serde_json::Value> {
    daemonset["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap()
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

    let exported = metric_names(&render(Exposition::default()));
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
    let metrics = render(Exposition {
        services: Aggregator::from_recording(&recording).services(),
        capture: CaptureStats {
            lost_rejects: 1,
            ..CaptureStats::default()
        },
        conntrack: BTreeMap::from([(4026531840, CtStats::default())]),
        rollouts: BTreeMap::new(),
    });
    common::metrics::promtool_lint(&metrics);
}
