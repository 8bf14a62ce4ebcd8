//! A client on the node itself (host network, like kubelet or a hostNetwork pod): its
//! Service connections are DNATed by the node's OUTPUT rules and its replies delivered
//! locally, never forwarded. It makes one keep-alive TCP connection through
//! `shop/checkout:http` and one UDP query through `kube-system/kube-dns:dns`, and
//! prints its own record of them.

use std::net::IpAddr;
use std::process::Output;

use observer::model::record::{Close, ConnRecord, Proto};
use observer_lab::Lab;

/// Prints `[[local_port, [answers...]], [local_port, answer]]`: `count` keep-alive
/// requests, then one UDP query from a new socket.
const SCRIPT: &str = r#"
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

/// Keep-alive requests the client sends.
pub const REQUESTS: u64 = 30;

/// The node has no uplink, so no default route: routes the Service range to a pod veth
/// in the node (kube-proxy's OUTPUT DNAT then picks the real backend).
pub fn route_service_range(lab: &Lab) {
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
}

/// `python3`'s arguments that run the client against the lab's Services.
pub fn python_args(lab: &Lab) -> Vec<String> {
    let checkout = lab.service("checkout").unwrap();
    let dns = lab.service("kube-dns").unwrap();
    vec![
        "-c".to_owned(),
        SCRIPT.to_owned(),
        checkout.cluster_ip.to_string(),
        checkout.port.to_string(),
        REQUESTS.to_string(),
        dns.cluster_ip.to_string(),
        dns.port.to_string(),
    ]
}

/// The client's own record: its TCP port and the pods that answered, its UDP port and
/// the pod that answered.
#[derive(Debug)]
pub struct HostClientRun {
    pub http_port: u16,
    pub answers: Vec<String>,
    pub udp_port: u16,
    pub udp_answer: String,
}

impl HostClientRun {
    /// Reads the client's output; panics with its stderr unless it succeeded.
    pub fn parse(out: &Output) -> HostClientRun {
        assert!(
            out.status.success(),
            "host-network client: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ((http_port, answers), (udp_port, udp_answer)): ((u16, Vec<String>), (u16, String)) =
            serde_json::from_slice(&out.stdout).unwrap();
        HostClientRun {
            http_port,
            answers,
            udp_port,
            udp_answer,
        }
    }

    /// `conns` hold exactly the client's two connections, counted both ways: every
    /// request, the replies' bytes, the close (the UDP one's is `udp_close`: `Timeout`
    /// once idle long enough, `Open` before), the Service, and no pod as the client.
    pub fn assert_recorded(&self, lab: &Lab, conns: &[&ConnRecord], udp_close: Close) {
        let pod = |name: &str| IpAddr::V4(lab.pods().iter().find(|p| p.name == name).unwrap().ip);
        let mine: Vec<&&ConnRecord> = conns
            .iter()
            .filter(|c| match c.proto {
                Proto::Tcp => c.client.port() == self.http_port,
                Proto::Udp => c.client.port() == self.udp_port,
            })
            .collect();
        assert_eq!(mine.len(), 2, "{conns:?}");
        let tcp = mine.iter().find(|c| c.proto == Proto::Tcp).unwrap();
        assert!(self.answers.iter().all(|a| *a == self.answers[0]));
        assert_eq!(
            (
                tcp.backend.ip(),
                tcp.requests,
                tcp.close,
                tcp.service.as_deref(),
                tcp.client_pod.as_deref()
            ),
            (
                pod(&self.answers[0]),
                REQUESTS,
                Close::Fin,
                Some("shop/checkout:http"),
                None
            ),
            "{tcp:?}"
        );
        // Each response carries the pod's name as its body, after the same headers.
        assert!(
            tcp.bytes_from_backend > REQUESTS * self.answers[0].len() as u64,
            "{tcp:?}"
        );
        let udp = mine.iter().find(|c| c.proto == Proto::Udp).unwrap();
        assert_eq!(
            (
                udp.backend.ip(),
                udp.requests,
                udp.bytes_to_backend,
                udp.bytes_from_backend,
                udp.close,
                udp.service.as_deref()
            ),
            (
                pod(&self.udp_answer),
                1,
                1,
                self.udp_answer.len() as u64,
                udp_close,
                Some("kube-system/kube-dns:dns")
            ),
            "{udp:?}"
        );
    }
}
