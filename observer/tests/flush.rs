//! Root integration test: a conntrack entry flushed under a live keep-alive connection
//! (issue 8). The client's next request makes conntrack pick the connection up as a
//! new entry, which the rules DNAT again: a new DNAT decision. The kernel programs see
//! the new entry take the old one's tuple, so the old record ends `expired` at once
//! and the rest of the connection is a new record; nothing stays open.

mod common;

use std::time::Duration;

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::Close;
use observer_lab::{Lab, LabConfig, RuleMode, Topology, http_keepalive_paced};

#[test]
#[ignore = "root: run by cargo xtask test"]
fn a_flushed_entry_ends_expired_and_the_connection_goes_on_as_a_new_record() {
    require_root();
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: prefix("fl"),
    })
    .expect("lab up");
    // One endpoint left, so that the picked-up connection is DNATed to the same pod
    // and goes on (another pod would answer it with RST).
    let service = lab.service("checkout").unwrap().clone();
    for pod in &service.endpoints[1..] {
        lab.remove_endpoint(&service.port_name_string(), pod.ip)
            .unwrap();
    }
    let checkout = service.cluster_addr();
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(dir.path(), &[]);
    let before = lab.dnat_decisions().expect("DNAT counters");
    let answers = std::thread::scope(|scope| {
        let client =
            scope.spawn(|| http_keepalive_paced(&lab, checkout, 6, Duration::from_secs(1)));
        // Between the third and the fourth request.
        std::thread::sleep(Duration::from_millis(2500));
        let flush = lab
            .run_in(lab.node_ns(), "conntrack", &["-F"])
            .expect("conntrack -F");
        assert!(flush.status.success(), "{flush:?}");
        client.join().unwrap().expect("keep-alive client")
    });
    std::thread::sleep(Duration::from_secs(1));
    let decisions = lab.dnat_decisions().expect("DNAT counters") - before;
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());

    let port = answers[0].client_port;
    assert!(answers.iter().all(|a| a.client_port == port), "{answers:?}");
    assert_eq!(
        decisions, 2,
        "the first SYN and the pick-up after the flush"
    );
    let conns: Vec<_> = recording
        .conns
        .iter()
        .map(|c| (c.client.port(), c.requests, c.close, c.start_seen))
        .collect();
    assert_eq!(
        conns,
        [(port, 3, Close::Expired, true), (port, 3, Close::Fin, true)]
    );
}
