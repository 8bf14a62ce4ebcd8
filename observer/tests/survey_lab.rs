//! Root test (issue 28): where no network namespace holds kube-proxy's rules, observer
//! says so once at start, in one sentence, instead of showing "no Service seen yet"
//! forever; where a node holds them, it says nothing. DNAT rules of others (Docker's
//! for its embedded DNS server, in a container on a user-defined network: a CI runner, a
//! kind node) are no kube-proxy rules: the sentence says they are followed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Recorder, prefix, require_root};
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

const SENTENCE: &str = "no kube-proxy rules in any of";

/// What the survey logs when it is done (`surveying_recorder`).
const SURVEYED: &str = "survey: Survey {";

/// observer's stderr lines once the survey is done (it runs first thing on the rules
/// thread) and its sentence, if any, had the time of a few of the loop's ticks to be
/// said.
fn stderr_after_start(recorder: &Recorder) -> Vec<String> {
    // A loaded CI machine may take a while to run the survey's nft and iptables-save.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut surveyed: Option<Instant> = None;
    loop {
        let lines = recorder.stderr();
        if lines.iter().any(|l| l.contains(SENTENCE)) || Instant::now() > deadline {
            return lines;
        }
        if surveyed.is_none() && lines.iter().any(|l| l.contains(SURVEYED)) {
            surveyed = Some(Instant::now());
        }
        if surveyed.is_some_and(|at| at.elapsed() > Duration::from_secs(3)) {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(100));
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
    let recorder = surveying_recorder(dir.path());
    let lines = stderr_after_start(&recorder);
    assert!(lines.iter().any(|l| l.contains(SURVEYED)), "{lines:#?}");
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
    let said = said_once(dir.path());
    assert!(said.contains("observer will show no Service"), "{said}");
    // Where observer runs (its own namespace, a CI runner's container) may hold DNAT
    // rules of others already: the node's are counted on top of them.
    let others = other_dnat_in(&said);

    // Docker's embedded DNS rules in the node: still no kube-proxy rules.
    let docker_dns = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/rules/iptables/docker-embedded-dns.saved"
    );
    let restore = lab
        .run_in(lab.node_ns(), "iptables-restore", &[docker_dns])
        .unwrap();
    assert!(restore.status.success(), "iptables-restore: {restore:?}");
    let said = said_once(dir.path());
    assert!(said.contains("observer will show no Service"), "{said}");
    assert_eq!(other_dnat_in(&said), others + 1, "{said}");
}

/// The survey's sentence, said exactly once by a recorder started now, which also keeps
/// it in its summary line.
fn said_once(dir: &std::path::Path) -> String {
    let recorder = surveying_recorder(dir);
    let lines = stderr_after_start(&recorder);
    let said: Vec<&String> = lines.iter().filter(|l| l.contains(SENTENCE)).collect();
    assert_eq!(said.len(), 1, "one sentence: {lines:#?}");
    let said = said[0].clone();
    let recording = recorder.stop();
    let summary = recording.summary.expect("a summary line");
    assert!(
        summary.blind_spots.iter().any(|s| s.contains(SENTENCE)),
        "the summary line keeps it: {summary:?}"
    );
    said
}

/// `observer record` that also logs what its survey found in each namespace (a failure
/// then shows, say, another lab's node with kube-proxy's rules).
fn surveying_recorder(dir: &std::path::Path) -> Recorder {
    let output = dir.join("conns.jsonl");
    let mut command = Command::new(env!("CARGO_BIN_EXE_observer"));
    command
        .args(["record", "--write"])
        .arg(&output)
        .env("RUST_LOG", "warn,observer::naming::services::survey=debug");
    Recorder::spawn(command, output)
}

/// In how many namespaces the sentence says DNAT rules of others are followed.
fn other_dnat_in(said: &str) -> usize {
    let Some((_, rest)) = said.split_once("no kube-proxy chain or comment names, in ") else {
        return 0;
    };
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count of namespaces: {said}"))
}
