//! Root test: long UDP flows on one socket through a DNAT are counted exactly, every
//! datagram once, in both topologies. A bridged node passes a datagram on two devices
//! (the bridge, then its port) and a datagram that waited for ARP on others than the
//! later ones; and a later datagram's `sk_buff` may sit where the flow's first one was
//! freed (the kernel programs tell a flow's first datagram by that address).

mod common;

use common::{
    Recorder, only_node, prefix, require_root,
    udp_flow::{dnat_to, flow_from, run_client},
};
use observer::model::record::Close;
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

/// Round trips in the ping-pong flow, and datagrams in the burst flow.
const ROUND_TRIPS: usize = 400;
const BURST: usize = 60;

/// Two flows, each from a socket of its own: `ROUND_TRIPS` datagrams of 1 to 200 bytes,
/// each answered before the next is sent; then `BURST` datagrams sent back to back and
/// their answers read after. Prints, per flow, `[local_port, bytes sent, bytes
/// received]`: the client's own record.
const CLIENT: &str = r#"
import json, socket, sys
host, port, rounds, burst = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
flows = []
ping = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ping.settimeout(5)
sent = received = 0
for i in range(rounds):
    ping.sendto(b"p" * (i % 200 + 1), (host, port))
    received += len(ping.recv(2048))
    sent += i % 200 + 1
flows.append([ping.getsockname()[1], sent, received])
burster = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
burster.settimeout(1)
sent = received = 0
for i in range(burst):
    burster.sendto(b"b" * (i + 1), (host, port))
    sent += i + 1
try:
    for _ in range(burst):
        received += len(burster.recv(2048))
except socket.timeout:
    pass
flows.append([burster.getsockname()[1], sent, received])
print(json.dumps(flows))
"#;

fn long_flows(topology: Topology, tag: &str) {
    require_root();
    let lab = Lab::up(LabConfig {
        topology,
        rules: RuleMode::Iptables,
        prefix: prefix(tag),
    })
    .expect("lab up");
    let pod = &lab.pods()[0];
    dnat_to(&lab, pod);
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(dir.path(), &["--idle-timeout", "1"]);
    let (rounds, burst) = (ROUND_TRIPS.to_string(), BURST.to_string());
    let flows: Vec<(u16, u64, u64)> = run_client(&lab, CLIENT, &[&rounds, &burst]);
    // Both flows idle out (1 s) and are written.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());

    let (port, sent, received) = flows[0];
    let ping = flow_from(&recording, port);
    assert_eq!(
        (
            ping.close,
            ping.requests,
            ping.bytes_to_backend,
            ping.bytes_from_backend
        ),
        (Close::Timeout, ROUND_TRIPS as u64, sent, received),
        "{ping:?}"
    );
    // The pod answers every datagram with its name.
    assert_eq!(received, (ROUND_TRIPS * pod.name.len()) as u64);

    // Back-to-back datagrams: how the answers interleave with them decides how many
    // requests there are, not how many bytes.
    let (port, sent, received) = flows[1];
    let burst = flow_from(&recording, port);
    assert_eq!(
        (
            burst.close,
            burst.bytes_to_backend,
            burst.bytes_from_backend
        ),
        (Close::Timeout, sent, received),
        "{burst:?}"
    );
    assert!(received > 0, "no answer to the burst");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn long_udp_flows_bridged() {
    long_flows(Topology::Bridged, "usb");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn long_udp_flows_routed() {
    long_flows(Topology::Routed, "usr");
}
