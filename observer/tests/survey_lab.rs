//! Root test (issue 28): where no network namespace holds kube-proxy's rules, observer
//! says so once at start, in one sentence, instead of showing "no Service seen yet"
//! forever; where a node holds them, it says nothing.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Recorder, prefix, require_root};
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

const SENTENCE: &str = "no kube-proxy rules in any of";

/// observer's stderr lines once the survey had its time (it runs first thing on the
/// rules thread).
fn stderr_after_start(recorder: &Recorder, expect: bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines = recorder.stderr();
        if lines.iter().any(|l| l.contains(SENTENCE)) || Instant::now() > deadline {
            return lines;
        }
        if !expect && Instant::now() > deadline - Duration::from_secs(15) {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn a_node_without_kube_proxy_rules_is_said_to_be_one() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Nftables,
        prefix: prefix("sv"),
    })
    .expect("lab up");
    let dir = tempfile::tempdir().unwrap();

    // With the node's rules: nothing to say.
    let recorder = Recorder::start(dir.path(), &[]);
    let lines = stderr_after_start(&recorder, false);
    assert!(!lines.iter().any(|l| l.contains(SENTENCE)), "{lines:#?}");
    recorder.stop();

    // kube-proxy gone: its table deleted from the node.
    let status = Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.node_ns(),
            "nft",
            "delete",
            "table",
            "ip",
            "kube-proxy",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let recorder = Recorder::start(dir.path(), &[]);
    let lines = stderr_after_start(&recorder, true);
    let said: Vec<&String> = lines.iter().filter(|l| l.contains(SENTENCE)).collect();
    assert_eq!(said.len(), 1, "one sentence: {lines:#?}");
    assert!(
        said[0].contains("observer will show no Service"),
        "{said:?}"
    );
    let recording = recorder.stop();
    let summary = recording.summary.expect("a summary line");
    assert!(
        summary.blind_spots.iter().any(|s| s.contains(SENTENCE)),
        "the summary line keeps it: {summary:?}"
    );
}
