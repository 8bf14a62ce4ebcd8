//! A UDP address no Service of the lab uses, DNATed to a pod's UDP echo by a plain
//! iptables rule: UDP that is not DNS (port 53 packets have a path of their own in the
//! kernel programs).

use observer::model::record::{ConnRecord, Proto, Recording};
use observer_lab::{Lab, Pod};

pub const FLOW_IP: &str = "10.96.77.77";
pub const FLOW_PORT: u16 = 8125;

/// DNATs `FLOW_IP:FLOW_PORT` (UDP) to `pod`'s UDP echo in the lab's node, and flushes the
/// node's neighbour table: the node then has to ask for the pod's address (ARP) first,
/// and a flow's first datagram takes a longer path through the node than later ones.
pub fn dnat_to(lab: &Lab, pod: &Pod) {
    dnat_split(lab, std::slice::from_ref(pod));
}

/// As `dnat_to`, with each new flow DNATed to one of `pods` at random, as kube-proxy's
/// iptables rules choose: `-m statistic --mode random --probability 1/n`, then 1/(n-1),
/// ..., the last rule without.
pub fn dnat_split(lab: &Lab, pods: &[Pod]) {
    let port = FLOW_PORT.to_string();
    // Each rule is inserted first: the last pod's rule goes in first, ends up last.
    for (at, pod) in pods.iter().enumerate().rev() {
        let to = format!("{}:{}", pod.ip, pod.udp_port);
        let probability = format!("{:.5}", 1.0 / (pods.len() - at) as f64);
        let mut rule = vec![
            "-t",
            "nat",
            "-I",
            "PREROUTING",
            "1",
            "-d",
            FLOW_IP,
            "-p",
            "udp",
            "--dport",
            &port,
        ];
        if at + 1 < pods.len() {
            rule.extend([
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &probability,
            ]);
        }
        rule.extend(["-j", "DNAT", "--to-destination", &to]);
        let out = lab.run_in(lab.node_ns(), "iptables", &rule).unwrap();
        assert!(out.status.success(), "iptables: {out:?}");
    }
    let out = lab
        .run_in(lab.node_ns(), "ip", &["neigh", "flush", "all"])
        .unwrap();
    assert!(out.status.success(), "ip neigh flush: {out:?}");
}

/// Runs the Python `script` in the lab's client namespace, with `FLOW_IP FLOW_PORT` and
/// then `args` as its arguments, and parses the JSON it prints: the client's own record.
pub fn run_client<T: serde::de::DeserializeOwned>(lab: &Lab, script: &str, args: &[&str]) -> T {
    let port = FLOW_PORT.to_string();
    let mut argv = vec!["-c", script, FLOW_IP, &port];
    argv.extend_from_slice(args);
    let out = lab.run_in(lab.client_ns(), "python3", &argv).unwrap();
    assert!(
        out.status.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The one UDP connection of `recording` from client port `port`.
pub fn flow_from(recording: &Recording, port: u16) -> &ConnRecord {
    let found: Vec<_> = recording
        .conns
        .iter()
        .filter(|c| c.proto == Proto::Udp && c.client.port() == port)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "flow from port {port}: {:?}",
        recording.conns
    );
    found[0]
}
