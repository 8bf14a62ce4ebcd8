//! Root integration test (issue: name every connection): a readiness flip. While a
//! keep-alive connection to pod A stays open, A is removed from the rules the way
//! kube-proxy removes it. New connections never reach A; the open one keeps flowing to
//! A and the log reports it as a stale pin (`endpoint_in_rules: false`), and `observer
//! check --max-stale 0` fails on it. observer notices the change as it happens (issue
//! 11): an `endpoints` line within 100 ms of it, a timeline that shows the pin stale
//! until it closed and no new connection to A after it left, and A's return the same
//! way.

mod common;

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::{Command, Stdio},
    time::Duration,
};

use chrono::{DateTime, Utc};
use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{Close, EndpointsRecord, Proto, Recording};
use observer::stats::timeline::Timeline;
use observer_lab::{Lab, LabConfig, RuleMode, Service, Topology, http_fresh};

/// A keep-alive client that sends `count` requests `pause` seconds apart on one
/// connection and prints `[[local_port, pod], ...]`.
const SLOW_KEEPALIVE: &str = r#"
import http.client, json, sys, time
host, port, count, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
conn = http.client.HTTPConnection(host, port, timeout=5)
out = []
for i in range(count):
    if i:
        time.sleep(pause)
    conn.request("GET", "/")
    out.append([conn.sock.getsockname()[1], conn.getresponse().read().decode()])
conn.close()
print(json.dumps(out))
"#;

/// The pod IP an established connection to `cluster` is pinned to, from conntrack.
fn pinned_backend(lab: &Lab, cluster: SocketAddr) -> Ipv4Addr {
    let out = lab
        .run_in(
            lab.node_ns(),
            "conntrack",
            &[
                "-L",
                "-p",
                "tcp",
                "--orig-dst",
                &cluster.ip().to_string(),
                "--state",
                "ESTABLISHED",
            ],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&format!("dport={} ", cluster.port())))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one established connection expected: {text}"
    );
    // The reply tuple's source (the second `src=`) is the pod.
    lines[0]
        .split_whitespace()
        .filter_map(|f| f.strip_prefix("src="))
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

fn readiness_flip(rules: RuleMode, tag: &str) {
    require_root();
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    let dir = tempfile::tempdir().unwrap();
    let service = lab.service("checkout").unwrap().clone();
    let cluster = service.cluster_addr();
    let recorder = Recorder::start(dir.path(), &[]);

    // 40 requests 250 ms apart: one connection open for 10 s.
    let keepalive = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.client_ns(),
            "python3",
            "-c",
            SLOW_KEEPALIVE,
        ])
        .args([
            cluster.ip().to_string(),
            cluster.port().to_string(),
            "40".into(),
            "0.25".into(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let pinned = pinned_backend(&lab, cluster.into());
    let before_removal = Utc::now();
    lab.remove_endpoint(&service.port_name_string(), pinned)
        .expect("readiness flip");
    let removed_at = Utc::now();

    // New connections never reach the removed pod.
    let fresh = http_fresh(&lab, cluster, 30).unwrap();
    let pod_ip = |pod: &str| service.endpoints.iter().find(|p| p.name == pod).unwrap().ip;
    assert!(
        fresh.iter().all(|a| pod_ip(&a.pod) != pinned),
        "a new connection reached the removed pod"
    );

    // The open one kept flowing to it.
    let out = keepalive.wait_with_output().unwrap();
    assert!(out.status.success());
    let answers: Vec<(u16, String)> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answers.len(), 40);
    assert!(
        answers
            .iter()
            .all(|(port, pod)| *port == answers[0].0 && pod_ip(pod) == pinned)
    );
    // The pod is ready again: new connections reach it.
    std::thread::sleep(Duration::from_millis(500));
    let before_return = Utc::now();
    lab.add_endpoint(&service.port_name_string(), pinned)
        .expect("the pod's return");
    let returned_at = Utc::now();
    let back = http_fresh(&lab, cluster, 30).unwrap();
    assert!(back.iter().any(|a| pod_ip(&a.pod) == pinned));
    std::thread::sleep(Duration::from_millis(500));
    let mut recording = recorder.stop();
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);
    only_node(&mut recording, lab.node_ns());

    let name = service.port_name_string();
    let pinned_addr = SocketAddr::new(pinned.into(), service.target_port);
    let stale = recording
        .conns
        .iter()
        .find(|c| c.proto == Proto::Tcp && c.client.port() == answers[0].0 && c.start < removed_at)
        .unwrap();
    assert_eq!(
        (
            stale.service.as_deref(),
            stale.backend,
            stale.endpoint_in_rules,
            stale.requests,
            stale.close
        ),
        (
            Some(name.as_str()),
            pinned_addr,
            Some(false),
            40,
            Close::Fin
        )
    );
    let fresh_records: Vec<_> = recording
        .conns
        .iter()
        .filter(|c| fresh.iter().any(|a| a.client_port == c.client.port()) && c.start < returned_at)
        .collect();
    assert_eq!(fresh_records.len(), 30);
    assert!(
        fresh_records
            .iter()
            .all(|c| c.endpoint_in_rules == Some(true) && c.backend != pinned_addr)
    );

    definitions_around_the_flip(
        &recording,
        &service,
        pinned_addr,
        (before_removal, before_return),
    );

    timeline_is_told(
        &recording,
        &name,
        pinned_addr,
        (before_removal, removed_at),
        (before_return, returned_at),
        stale,
    );

    reports_tell(&recorder_log(&dir), &name, pinned_addr);
}

/// The log's definition of the Service after the flip has the two remaining endpoints
/// (and after the return, all three again).
fn definitions_around_the_flip(
    recording: &Recording,
    service: &Service,
    pinned_addr: SocketAddr,
    (before_removal, before_return): (DateTime<Utc>, DateTime<Utc>),
) {
    let name = service.port_name_string();
    let definition = |from: DateTime<Utc>, to: DateTime<Utc>| {
        let found: Vec<_> = recording
            .services
            .iter()
            .filter(|s| s.service == name && s.time >= from && s.time < to)
            .collect();
        assert_eq!(found.len(), 1, "one definition expected: {found:?}");
        found[0].clone()
    };
    // From before the lab applied the return: a read that patches the change in takes
    // well under a millisecond, so its line can be dated before the lab's own call returned.
    let mut all: Vec<SocketAddr> =
        definition(before_return, Utc::now() + chrono::TimeDelta::hours(1))
            .endpoints
            .iter()
            .map(|e| e.addr)
            .collect();
    all.sort();
    let mut expected_all: Vec<SocketAddr> = service
        .endpoint_addrs()
        .into_iter()
        .map(SocketAddr::V4)
        .collect();
    expected_all.sort();
    assert_eq!(all, expected_all);
    let latest = definition(before_removal, before_return);
    let mut endpoints: Vec<(SocketAddr, f64)> = latest
        .endpoints
        .iter()
        .map(|e| (e.addr, e.expected_share))
        .collect();
    endpoints.sort_by_key(|(addr, _)| *addr);
    let remaining: Vec<(SocketAddr, f64)> = service
        .endpoint_addrs()
        .into_iter()
        .map(SocketAddr::V4)
        .filter(|addr| *addr != pinned_addr)
        .map(|addr| (addr, 0.5))
        .collect();
    assert_eq!(endpoints, remaining);
}

/// `observer summary` tells the story and `observer check --max-stale 0` catches it.
fn reports_tell(log: &std::path::Path, name: &str, pinned_addr: SocketAddr) {
    let summary = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["summary", "--service", name])
        .arg(log)
        .output()
        .unwrap();
    assert_eq!(summary.status.code(), Some(0));
    let text = String::from_utf8_lossy(&summary.stdout);
    for said in [
        format!("{pinned_addr} left the rules; last new connection "),
        "; 1 connection stale afterwards, for up to ".to_owned(),
        format!("{pinned_addr} joined the rules; first connection "),
    ] {
        assert!(text.contains(&said), "{said:?} not in:\n{text}");
    }

    // `observer check` catches it.
    let check = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["check", "--max-stale", "0"])
        .arg(log)
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(text.contains(name) && text.contains("stale"), "{text}");
}

/// The `endpoints` line of `name` that says `addr` left (or joined), dated within
/// 100 ms of the rule change: after the change began, at most 100 ms after it was
/// applied (`applied` is read just after; the bound is the issue's).
fn change_line<'a>(
    recording: &'a Recording,
    name: &str,
    addr: SocketAddr,
    removed: bool,
    (began, applied): (DateTime<Utc>, DateTime<Utc>),
) -> &'a EndpointsRecord {
    let lines: Vec<&EndpointsRecord> = recording
        .endpoints
        .iter()
        .filter(|e| e.service == name)
        .filter(|e| {
            let (mine, other) = if removed {
                (&e.removed, &e.added)
            } else {
                (&e.added, &e.removed)
            };
            mine == &vec![addr] && other.is_empty()
        })
        .collect();
    assert_eq!(lines.len(), 1, "{:?}", recording.endpoints);
    let line = lines[0];
    let late = (line.time - applied).num_microseconds().unwrap();
    eprintln!(
        "{name}: {addr} {} in the log {late} us after the change was applied",
        if removed { "left" } else { "joined" }
    );
    assert!(
        line.time >= began && late <= 100_000,
        "the endpoints line is dated {} (began {began}, applied {applied}: {late} us after)",
        line.time
    );
    line
}

/// What the timeline says about the flip: no new connection to the pod after it left,
/// its keep-alive connection stale until it closed, and its return with a first new
/// connection.
fn timeline_is_told(
    recording: &Recording,
    name: &str,
    pinned: SocketAddr,
    removal: (DateTime<Utc>, DateTime<Utc>),
    comeback: (DateTime<Utc>, DateTime<Utc>),
    stale: &observer::model::record::ConnRecord,
) {
    assert_eq!(recording.endpoints.len(), 2, "{:?}", recording.endpoints);
    let left = change_line(recording, name, pinned, true, removal);
    let joined = change_line(recording, name, pinned, false, comeback);
    let to_pod: Vec<_> = recording
        .conns
        .iter()
        .filter(|c| c.backend == pinned && c.start >= left.time && c.start < joined.time)
        .collect();
    assert!(
        to_pod.is_empty(),
        "new connections after it left: {to_pod:?}"
    );

    let timeline = Timeline::from_recording(recording).service(name, Proto::Tcp);
    assert_eq!(timeline.departures.len(), 1);
    let departure = &timeline.departures[0];
    assert_eq!(
        (departure.backend, departure.left, departure.returned),
        (pinned, left.time, Some(joined.time))
    );
    assert!(departure.late.is_empty());
    let pins: Vec<_> = departure
        .pins
        .values()
        .map(|pin| (pin.client, pin.start, pin.end))
        .collect();
    assert_eq!(pins, vec![(stale.client, stale.start, stale.end)]);
    assert!(
        departure
            .last_new
            .is_some_and(|last| last >= stale.start && last < left.time)
    );
    let first = recording
        .conns
        .iter()
        .filter(|c| c.backend == pinned && c.start >= joined.time)
        .map(|c| c.start)
        .min();
    assert!(first.is_some());
    assert_eq!(timeline.arrivals.len(), 1);
    assert_eq!(
        (timeline.arrivals[0].joined, timeline.arrivals[0].first_conn),
        (joined.time, first)
    );
}

fn recorder_log(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("conns.jsonl")
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn readiness_flip_iptables() {
    readiness_flip(RuleMode::Iptables, "si");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn readiness_flip_nftables() {
    readiness_flip(RuleMode::Nftables, "sn");
}
