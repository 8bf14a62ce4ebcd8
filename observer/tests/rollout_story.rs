//! Root integration test (issue 29): a real keep-alive client through a real rollout. One
//! pod leaves the rules (its readiness flips), a Node.js client (`fetch`, which keeps its
//! connection alive) starts sending 30 requests, and the pod comes back while the client's
//! one connection still carries them all to another pod. The test writes marks with
//! `observer mark` around the rollout while `observer record` runs; then:
//! - `observer check --max-skew 1.5` fails as pinning and tells the rollout window in one
//!   line, to the second: "rollout window: 30 requests on 1 keep-alive connection to POD,
//!   opened HH:MM:SS, D before POD-B became ready";
//! - `--since-mark rollout-done` judges the traffic after the rollout and still catches the
//!   connection (it was open then); before `rollout-start` there is no traffic to judge;
//! - `observer check -o junit` validates against the JUnit schema (xmlschema, installed by
//!   `cargo xtask setup`), with the story in its failure;
//! - `observer summary` says the same line under the skew.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::junit::validate_junit;
use common::synthetic::jsonl;
use common::{Recorder, only_node, prefix, require_root};
use observer::report::text::{Digits, duration};
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

/// Node's `fetch` (undici: one kept-alive connection for sequential requests): `count`
/// GETs `pause` ms apart; prints the pods that answered, as JSON.
const FETCH_KEEPALIVE: &str = r#"
const [url, count, pause] = process.argv.slice(1);
const pods = [];
for (let i = 0; i < Number(count); i++) {
  if (i) await new Promise((done) => setTimeout(done, Number(pause)));
  const response = await fetch(url);
  pods.push(await response.text());
}
console.log(JSON.stringify(pods));
"#;

fn observer(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn mark(name: &str, log: &Path) {
    let (code, _) = observer(&["mark", name, "--log", log.to_str().unwrap()]);
    assert_eq!(code, Some(0), "observer mark {name}");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn a_keep_alive_client_through_a_rollout_is_told_as_the_rollout_window() {
    require_root();
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Nftables,
        prefix: prefix("rs"),
    })
    .expect("lab up");
    let dir = tempfile::tempdir().unwrap();
    let service = lab.service("checkout").unwrap().clone();
    let name = service.port_name_string();
    let cluster = service.cluster_addr();
    let leaving = service.endpoints[1].clone();
    let recorder = Recorder::start(dir.path(), &[]);
    let log = recorder.output.clone();

    mark("rollout-start", &log);
    lab.remove_endpoint(&name, leaving.ip)
        .expect("readiness flip");
    std::thread::sleep(Duration::from_millis(300));
    // 30 requests 100 ms apart on one connection, opened while the pod is out (Node takes
    // a moment to start: the pod comes back 2 s after the client was started).
    let client = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.client_ns(),
            "node",
            "--input-type=module",
            "-e",
        ])
        .arg(FETCH_KEEPALIVE)
        .args([format!("http://{cluster}/"), "30".into(), "100".into()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    lab.add_endpoint(&name, leaving.ip)
        .expect("the pod is ready again");
    mark("rollout-done", &log);
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "the node client failed");
    let pods: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pods.len(), 30);
    assert!(
        pods.iter()
            .all(|pod| *pod == pods[0] && *pod != leaving.name)
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());
    assert_eq!(recording.marks.len(), 2);

    // What the story must say, from the log's own records.
    let keep_alive: Vec<_> = recording
        .conns
        .iter()
        .filter(|c| c.service.as_deref() == Some(name.as_str()))
        .collect();
    assert_eq!(keep_alive.len(), 1, "one connection: {keep_alive:?}");
    let conn = keep_alive[0];
    assert_eq!(conn.requests, 30);
    let leaving_addr = std::net::SocketAddr::new(leaving.ip.into(), service.target_port);
    let joined: DateTime<Utc> = recording
        .endpoints
        .iter()
        .find(|e| e.added == [leaving_addr])
        .expect("the endpoints line of the return")
        .time;
    let pod_of = |addr: std::net::SocketAddr, pod: Option<&str>| {
        pod.map_or_else(|| addr.to_string(), str::to_owned)
    };
    let before = (joined - conn.start).num_microseconds().unwrap() as f64 / 1000.0;
    assert!(
        before > 0.0,
        "the connection opened {before} ms after the pod came back"
    );
    let story = format!(
        "rollout window: 30 requests on 1 keep-alive connection to {}, opened {}, {} before {} became ready",
        pod_of(conn.backend, conn.backend_pod.as_deref()),
        conn.start.format("%H:%M:%S"),
        duration(before, Digits::Report),
        pod_of(
            leaving_addr,
            recording.services.last().and_then(|s| s
                .endpoints
                .iter()
                .find(|e| e.addr == leaving_addr)
                .and_then(|e| e.pod.as_deref()))
        ),
    );
    let path = dir.path().join("node.jsonl");
    std::fs::write(&path, jsonl(&recording)).unwrap();
    let file = path.to_str().unwrap();

    let args = ["check", "--service", &name, "--max-skew", "1.5", file];
    let (code, text) = observer(&args);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.starts_with(&format!("{name}: skew 3.00 > --max-skew 1.5 ("))
            && text.contains("): pinning: 1 connection carried 30 of 30 requests (")
            && text.trim_end().ends_with(&format!("; {story}")),
        "{text}\nexpected the story: {story}"
    );
    // After the rollout: the connection was still open, so it is still judged.
    let (code, after) = observer(&[
        "check",
        "--since-mark",
        "rollout-done",
        "--max-skew",
        "1.5",
        file,
    ]);
    assert_eq!((code, after.as_str()), (Some(1), text.as_str()));
    // Before it: nothing to judge.
    let (code, before) = observer(&[
        "check",
        "--until-mark",
        "rollout-start",
        "--max-skew",
        "1.5",
        file,
    ]);
    assert_eq!(code, Some(0));
    assert!(
        before.ends_with(" Services, 0 connections, every condition holds\n"),
        "{before}"
    );

    let (code, xml) = observer(&[
        "check",
        "-o",
        "junit",
        "--max-skew",
        "1.5",
        "--max-resets",
        "0",
        file,
    ]);
    assert_eq!(code, Some(1));
    assert!(xml.contains(&story.replace('>', "&gt;")), "{xml}");
    if let Err(why) = validate_junit(&xml, dir.path()) {
        panic!("not valid JUnit: {why}\n{xml}");
    }

    let (code, summary) = observer(&["summary", "--service", &name, file]);
    assert_eq!(code, Some(0));
    assert!(summary.contains(&format!("\n    {story}\n")), "{summary}");
}
