//! Root integration test: clients on the node itself (host network, like kubelet or a
//! hostNetwork pod). Their Service connections are DNATed by the node's OUTPUT rules and
//! the replies are delivered locally, never forwarded: the local-delivery hook must
//! still count every request and reply byte and see the close.

mod common;

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{Close, Proto};
use observer_lab::{Lab, LabConfig, RuleMode, Topology};

/// Prints `[local_port, [answers...]]` after `count` keep-alive requests, then one UDP
/// query from a new socket: `[local_port, answer]`.
const NODE_CLIENT: &str = r#"
import http.client, json, socket, sys
http_host, http_port, count, dns_host, dns_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
conn = http.client.HTTPConnection(http_host, http_port, timeout=5)
answers = []
for _ in range(count):
    conn.request("GET", "/")
    answers.append(conn.getresponse().read().decode())
port = conn.sock.getsockname()[1]
conn.close()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.settimeout(5)
udp.sendto(b"q", (dns_host, dns_port))
answer = udp.recv(2048).decode()
print(json.dumps([[port, answers], [udp.getsockname()[1], answer]]))
"#;

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
    // The node has no uplink, so no default route: route the Service range to a pod
    // veth (kube-proxy's OUTPUT DNAT then picks the real backend).
    let veth = String::from_utf8(
        lab.run_in(lab.node_ns(), "ip", &["-o", "link", "show", "type", "veth"])
            .unwrap()
            .stdout,
    )
    .unwrap()
    .split(':')
    .nth(1)
    .map(|name| name.trim().split('@').next().unwrap().to_owned())
    .unwrap();
    let out = lab
        .run_in(
            lab.node_ns(),
            "ip",
            &["route", "add", "10.96.0.0/16", "dev", &veth],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let checkout = lab.service("checkout").unwrap().clone();
    let dns = lab.service("kube-dns").unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(dir.path(), &["--idle-timeout", "1"]);
    let out = lab
        .run_in(
            lab.node_ns(),
            "python3",
            &[
                "-c",
                NODE_CLIENT,
                &checkout.cluster_ip.to_string(),
                &checkout.port.to_string(),
                "30",
                &dns.cluster_ip.to_string(),
                &dns.port.to_string(),
            ],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ((http_port, answers), (udp_port, udp_answer)): ((u16, Vec<String>), (u16, String)) =
        serde_json::from_slice(&out.stdout).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let mut recording = recorder.stop();
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);
    only_node(&mut recording, lab.node_ns());
    assert_eq!(recording.conns.len(), 2, "{:?}", recording.conns);

    let pod = |name: &str| lab.pods().iter().find(|p| p.name == name).unwrap().ip;
    let tcp = recording
        .conns
        .iter()
        .find(|c| c.proto == Proto::Tcp)
        .unwrap();
    assert!(answers.iter().all(|a| *a == answers[0]));
    assert_eq!(
        (
            tcp.client.port(),
            tcp.backend.ip(),
            tcp.requests,
            tcp.close,
            tcp.service.as_deref()
        ),
        (
            http_port,
            std::net::IpAddr::V4(pod(&answers[0])),
            30,
            Close::Fin,
            Some("shop/checkout:http")
        )
    );
    // Each response carries the pod's name as its body, after the same headers.
    assert!(
        tcp.bytes_from_backend > 30 * answers[0].len() as u64,
        "{tcp:?}"
    );

    let udp = recording
        .conns
        .iter()
        .find(|c| c.proto == Proto::Udp)
        .unwrap();
    assert_eq!(
        (
            udp.client.port(),
            udp.backend.ip(),
            udp.requests,
            udp.bytes_to_backend,
            udp.bytes_from_backend,
            udp.close
        ),
        (
            udp_port,
            std::net::IpAddr::V4(pod(&udp_answer)),
            1,
            1,
            udp_answer.len() as u64,
            Close::Timeout
        )
    );
}
