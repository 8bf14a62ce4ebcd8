//! Root integration test: loss is counted exactly, in connections (issue 8). observer
//! is stopped (SIGSTOP) for 3 s under fresh-connection churn, with a small ring buffer
//! and connection table so that both fill: closes then wait in the table and new
//! connections find it full. After SIGCONT, records with `start_seen` + the summary's
//! `lost_connections` of the node's namespace (`lost_by_netns`) must equal the DNAT decisions the node's rules counted, and
//! connections made afterwards are recorded whole.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{Recorder, only_node, prefix, require_root};
use nix::sys::signal::Signal;
use observer::model::record::{Close, Proto};
use observer_lab::{Lab, LabConfig, RuleMode, Topology, http_churn, http_fresh};

#[test]
#[ignore = "root: run by cargo xtask test"]
fn stopped_observer_counts_every_lost_connection() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: prefix("ov"),
    })
    .expect("lab up");
    let checkout = lab.service("checkout").unwrap().cluster_addr();
    let pod_ip: HashMap<String, SocketAddr> = lab
        .service("checkout")
        .unwrap()
        .endpoints
        .iter()
        .map(|p| (p.name.clone(), SocketAddr::new(p.ip.into(), 8080)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(
        dir.path(),
        &["--ring-buffer-bytes", "65536", "--max-connections", "1024"],
    );
    let before = lab.dnat_decisions().expect("DNAT counters");
    let churn = std::thread::scope(|scope| {
        let churn = scope.spawn(|| http_churn(&lab, checkout, Duration::from_secs(8), 2));
        std::thread::sleep(Duration::from_secs(2));
        recorder.signal(Signal::SIGSTOP);
        std::thread::sleep(Duration::from_secs(3));
        recorder.signal(Signal::SIGCONT);
        churn.join().unwrap().expect("churn client")
    });
    // The table empties at observer's next sweeps; then connections are recorded whole.
    std::thread::sleep(Duration::from_secs(3));
    let after_churn = lab.dnat_decisions().expect("DNAT counters");
    let after_stall = chrono::Utc::now();
    let fresh = http_fresh(&lab, checkout, 21).expect("fresh connections");
    let decisions = lab.dnat_decisions().expect("DNAT counters") - before;
    let mut recording = recorder.stop();
    let summary = recording.summary.clone().expect("a summary line");
    only_node(&mut recording, lab.node_ns());
    let recorded = recording.conns.iter().filter(|c| c.start_seen).count() as u64;
    // Other labs on the machine may lose connections too: this node's share.
    let lost = summary
        .lost_by_netns
        .get(&common::netns_inode(lab.node_ns()).to_string())
        .copied()
        .unwrap_or(0);
    eprintln!(
        "{decisions} DNAT decisions ({} in the churn), {recorded} records, churn client {churn:?}, summary {summary:?}",
        after_churn - before
    );

    assert!(lost > 0, "the table never filled");
    assert_eq!(
        summary.lost_by_netns.values().sum::<u64>(),
        summary.lost_connections,
        "every loss has its namespace"
    );
    assert!(summary.lost_events > 0, "the ring buffer never filled");
    assert_eq!(
        recorded + lost,
        decisions,
        "records + lost connections == DNAT decisions"
    );
    assert_eq!(decisions, after_churn - before + 21);

    // After the stall: each connection whole, to the pod that answered.
    for answer in &fresh {
        let conn = recording
            .conns
            .iter()
            .find(|c| {
                c.start >= after_stall
                    && c.proto == Proto::Tcp
                    && c.client.port() == answer.client_port
            })
            .expect("a record for each connection after the stall");
        assert_eq!(conn.backend, pod_ip[&answer.pod]);
        assert_eq!((conn.requests, conn.close), (1, Close::Fin));
        assert_eq!(conn.bytes_to_backend, 84, "each byte once");
        assert!(conn.start_seen);
    }
}
