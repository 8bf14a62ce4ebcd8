//! Root test: a connection that ends without FIN or RST (here a UDP flow that idles out)
//! ends at its last packet. The kernel programs stamp most packets from jiffies instead
//! of reading the clock (`observer-ebpf/src/clock.rs`), and that stamp must still say
//! when the last packet passed, to within a clock tick, and not when the flow began.

mod common;

use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use common::{
    Recorder, only_node, prefix, require_root,
    udp_flow::{FLOW_IP, dnat_to, flow_from, run_client},
};
use observer::model::record::Close;
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

/// Sends a datagram and reads its answer, pauses, and does it again from the same
/// socket; prints `[local_port, first_answered, last_answered]` (Unix seconds).
const FLOW_CLIENT: &str = r#"
import json, socket, sys, time
host, port, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.settimeout(5)
udp.sendto(b"q", (host, port))
udp.recv(2048)
first = time.time()
time.sleep(pause)
udp.sendto(b"q", (host, port))
udp.recv(2048)
last = time.time()
print(json.dumps([udp.getsockname()[1], first, last]))
"#;

fn unix_time(seconds: f64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros((seconds * 1e6) as i64).unwrap()
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn a_flow_that_idles_out_ends_at_its_last_packet() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: prefix("lp"),
    })
    .expect("lab up");
    let pod = &lab.pods()[0];
    // The first datagram waits for ARP and takes a longer path than the second.
    dnat_to(&lab, pod);
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(dir.path(), &["--idle-timeout", "1"]);
    let (port, first, last): (u16, f64, f64) = run_client(&lab, FLOW_CLIENT, &["1.5"]);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let mut recording = recorder.stop();
    only_node(&mut recording, lab.node_ns());

    let flow = flow_from(&recording, port);
    assert_eq!(
        (
            flow.original_dst.ip(),
            flow.close,
            flow.requests,
            flow.bytes_to_backend,
            flow.bytes_from_backend
        ),
        (
            std::net::IpAddr::V4(FLOW_IP.parse::<Ipv4Addr>().unwrap()),
            Close::Timeout,
            2,
            2,
            // The pod answers each datagram with its name.
            2 * pod.name.len() as u64
        ),
        "{flow:?}"
    );
    // The answer to the second datagram passed the node just before the client read it.
    // A stamp may be a tick (at most 10 ms) off either way, and the wall clocks of the
    // client and of observer's record differ by a little more.
    let (first, last) = (unix_time(first), unix_time(last));
    let end = flow.end.expect("an end");
    let slack = chrono::Duration::milliseconds(60);
    assert!(
        end > last - slack && end < last + slack,
        "ended at {end}, the last answer was read at {last} (the first at {first}): {flow:?}"
    );
    assert!(flow.start < first, "{flow:?}");
}
