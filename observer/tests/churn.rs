//! Root integration test: exactly once under churn (issue 8). For 60 s, two client
//! threads open fresh `Connection: close` HTTP connections as fast as they go (client
//! ports are reused while conntrack still holds their earlier entries in TIME_WAIT)
//! beside one keep-alive client sending a request a second. The log must hold exactly
//! one record per DNAT decision the node's own rules counted, each fresh connection
//! with one request, closed by FIN or RST in under a second; nothing open, timed out,
//! expired or merged; nothing lost.

mod common;

use std::time::Duration;

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{Close, ConnRecord};
use observer_lab::{Lab, LabConfig, RuleMode, Topology, http_churn, http_keepalive_paced};

const CHURN: Duration = Duration::from_secs(60);
const KEEPALIVE_REQUESTS: usize = 60;

fn churn(rules: RuleMode, tag: &str) {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    lab.install_dnat_counters().expect("DNAT counters");
    let checkout = lab.service("checkout").unwrap().cluster_addr();
    let dir = tempfile::tempdir().unwrap();
    // The counters are read with observer attached around them: no decision (a late
    // packet DNATed again counts too) falls between a read and observer's attach or stop.
    let before = lab.dnat_decisions().expect("DNAT counters");
    let recorder = Recorder::start(dir.path(), &[]);
    let (keepalive, churn) = std::thread::scope(|scope| {
        let keepalive = scope.spawn(|| {
            http_keepalive_paced(&lab, checkout, KEEPALIVE_REQUESTS, Duration::from_secs(1))
        });
        let churn = http_churn(&lab, checkout, CHURN, 2).expect("churn client");
        (keepalive.join().unwrap().expect("keep-alive client"), churn)
    });
    // The last FINs cross within milliseconds.
    std::thread::sleep(Duration::from_secs(1));
    let mut recording = recorder.stop();
    let decisions = lab.dnat_decisions().expect("DNAT counters") - before;
    let summary = recording.summary.clone().expect("a summary line");
    only_node(&mut recording, lab.node_ns());
    eprintln!(
        "{rules}: {} DNAT decisions (rules' counters), {} records, churn client {churn:?}, summary {summary:?}",
        decisions,
        recording.conns.len()
    );

    // Other labs on the machine may lose connections (a bench beside the test): this
    // node's share must be 0.
    let lost_here = summary
        .lost_by_netns
        .get(&common::netns_inode(lab.node_ns()).to_string())
        .copied()
        .unwrap_or(0);
    assert_eq!(lost_here, 0, "lost connections of this node");
    assert_eq!(summary.read_errors, 0, "failed kernel reads");
    assert_eq!(
        churn.failed, 0,
        "the churn client's connections all got answers"
    );
    // Anything but one whole client connection, shown before the count is asserted.
    let unusual: Vec<&ConnRecord> = recording
        .conns
        .iter()
        .filter(|c| {
            !(c.requests == 1 && matches!(c.close, Close::Fin | Close::Rst) && c.start_seen)
        })
        .collect();
    eprintln!("records other than one whole request: {unusual:#?}");
    assert_eq!(
        recording.conns.len() as u64,
        decisions,
        "one record per DNAT decision"
    );

    let keepalive_port = keepalive[0].client_port;
    assert!(keepalive.iter().all(|a| a.client_port == keepalive_port));
    let (kept, others): (Vec<&ConnRecord>, Vec<&ConnRecord>) = recording
        .conns
        .iter()
        .partition(|c| c.client.port() == keepalive_port);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        (kept[0].requests, kept[0].close, kept[0].start_seen),
        (KEEPALIVE_REQUESTS as u64, Close::Fin, true)
    );
    // Every client connection whole: one request, closed, under a second.
    let (whole, strays): (Vec<&ConnRecord>, Vec<&ConnRecord>) = others.into_iter().partition(|c| {
        c.requests == 1
            && matches!(c.close, Close::Fin | Close::Rst)
            && c.duration_ms < 1000.0
            && c.start_seen
    });
    assert_eq!(whole.len() as u64, churn.connections, "strays: {strays:#?}");
    // Anything else is a DNAT decision no client connection made: conntrack picking up
    // a late packet of a connection it already forgot (a new entry, DNATed again). It
    // carries no request: a merged or split connection would.
    eprintln!("DNAT decisions from stray packets: {strays:#?}");
    assert!(
        strays
            .iter()
            .all(|c| c.requests == 0 && c.bytes_to_backend == 0 && c.start_seen),
        "{strays:#?}"
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn churn_iptables() {
    churn(RuleMode::Iptables, "ci");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn churn_nftables() {
    churn(RuleMode::Nftables, "cn");
}
