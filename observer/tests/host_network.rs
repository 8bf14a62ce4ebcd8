//! Root integration test: clients on the node itself (host network, like kubelet or a
//! hostNetwork pod). Their Service connections are DNATed by the node's OUTPUT rules and
//! the replies are delivered locally, never forwarded: the local-delivery hook must
//! still count every request and reply byte and see the close.

mod common;

use common::host_client::{HostClientRun, python_args, route_service_range};
use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::Close;
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

#[test]
#[ignore = "root: run by cargo xtask test"]
fn host_network_clients_are_counted_both_ways() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Routed,
        rules: RuleMode::Iptables,
        prefix: prefix("hn"),
    })
    .expect("lab up");
    route_service_range(&lab);

    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(dir.path(), &["--idle-timeout", "1"]);
    let args = python_args(&lab);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let client = HostClientRun::parse(&lab.run_in(lab.node_ns(), "python3", &args).unwrap());
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let mut recording = recorder.stop();
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);
    only_node(&mut recording, lab.node_ns());
    assert_eq!(recording.conns.len(), 2, "{:?}", recording.conns);
    client.assert_recorded(
        &lab,
        &recording.conns.iter().collect::<Vec<_>>(),
        Close::Timeout,
    );
}
