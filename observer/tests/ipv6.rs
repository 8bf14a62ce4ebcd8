//! Root integration test: an IPv6 Service. A minimal routed node of its own (client and
//! pod namespaces behind a node namespace with no uplink), kube-proxy-format ip6tables
//! rules, a real HTTP/1.1 keep-alive exchange; the log must carry bracketed IPv6
//! endpoints, the exact request count, and the Service name from ip6tables-save.

mod common;

use std::process::{Child, Command, Stdio};

use common::{Recorder, require_root};
use observer::model::record::{Close, Proto};

/// Namespaces and processes made by this test; removed on drop, also on failure.
struct Node {
    namespaces: Vec<String>,
    server: Option<Child>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(server) = self.server.as_mut() {
            let _ = server.kill();
            let _ = server.wait();
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn sh(args: &[&str]) {
    let status = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(status.success(), "{args:?} failed");
}

fn in_ns(ns: &str, args: &[&str]) {
    let mut all = vec!["ip", "netns", "exec", ns];
    all.extend_from_slice(args);
    sh(&all);
}

const RULES: &str = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-V6TESTCHECKOUT6H - [0:0]
:KUBE-SEP-V6TESTPODA000000 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d fd00:96::1/128 -p tcp -m comment --comment "shop/checkout6:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-V6TESTCHECKOUT6H
-A KUBE-SVC-V6TESTCHECKOUT6H -m comment --comment "shop/checkout6:http -> [fd00:b::12]:8080" -j KUBE-SEP-V6TESTPODA000000
-A KUBE-SEP-V6TESTPODA000000 -p tcp -m comment --comment "shop/checkout6:http" -m tcp -j DNAT --to-destination [fd00:b::12]:8080
COMMIT
"#;

const SERVER: &str = r#"
import http.server, socket
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"pod-v6"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
Server(("::", 8080), Handler).serve_forever()
"#;

const CLIENT: &str = r#"
import http.client, json, time
for _ in range(100):
    try:
        conn = http.client.HTTPConnection("fd00:96::1", 80, timeout=5)
        conn.connect()
        break
    except OSError:
        time.sleep(0.05)
out = []
for _ in range(5):
    conn.request("GET", "/")
    out.append(conn.getresponse().read().decode())
print(json.dumps([conn.sock.getsockname()[1], out]))
conn.close()
"#;

#[test]
#[ignore = "root: run by cargo xtask test"]
fn ipv6_service_connection_is_recorded() {
    require_root();
    let tag = std::process::id() % 10000;
    let (node, client, pod) = (
        format!("ov6n{tag}"),
        format!("ov6c{tag}"),
        format!("ov6p{tag}"),
    );
    let mut guard = Node {
        namespaces: Vec::new(),
        server: None,
    };
    for ns in [&node, &client, &pod] {
        sh(&["ip", "netns", "add", ns]);
        guard.namespaces.push(ns.clone());
        in_ns(ns, &["ip", "link", "set", "lo", "up"]);
    }
    for (peer, node_dev, prefix, host) in [
        (&client, "c0", "fd00:a::", "9"),
        (&pod, "p0", "fd00:b::", "12"),
    ] {
        sh(&[
            "ip", "-n", &node, "link", "add", node_dev, "type", "veth", "peer", "name", "eth0",
            "netns", peer,
        ]);
        sh(&["ip", "-n", &node, "link", "set", node_dev, "up"]);
        sh(&["ip", "-n", peer, "link", "set", "eth0", "up"]);
        sh(&[
            "ip",
            "-n",
            &node,
            "-6",
            "addr",
            "add",
            &format!("{prefix}1/64"),
            "dev",
            node_dev,
            "nodad",
        ]);
        sh(&[
            "ip",
            "-n",
            peer,
            "-6",
            "addr",
            "add",
            &format!("{prefix}{host}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        sh(&[
            "ip",
            "-n",
            peer,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("{prefix}1"),
        ]);
    }
    in_ns(&node, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    let mut restore = Command::new("ip")
        .args(["netns", "exec", &node, "ip6tables-restore", "--noflush"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut restore.stdin.take().unwrap(), RULES.as_bytes()).unwrap();
    assert!(restore.wait().unwrap().success(), "ip6tables-restore");
    guard.server = Some(
        Command::new("ip")
            .args(["netns", "exec", &pod, "python3", "-c", SERVER])
            .spawn()
            .unwrap(),
    );

    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(dir.path(), &[]);
    let out = Command::new("ip")
        .args(["netns", "exec", &client, "python3", "-c", CLIENT])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (port, answers): (u16, Vec<String>) = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answers, vec!["pod-v6"; 5]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut recording = recorder.stop();
    assert_eq!(recording.summary.as_ref().unwrap().lost_events, 0);
    common::only_node(&mut recording, &node);

    assert_eq!(recording.conns.len(), 1, "{:?}", recording.conns);
    let conn = &recording.conns[0];
    assert_eq!(
        (
            conn.proto,
            conn.client.to_string(),
            conn.original_dst.to_string(),
            conn.backend.to_string(),
            conn.requests,
            conn.close,
            conn.service.as_deref(),
            conn.endpoint_in_rules,
        ),
        (
            Proto::Tcp,
            format!("[fd00:a::9]:{port}"),
            "[fd00:96::1]:80".to_owned(),
            "[fd00:b::12]:8080".to_owned(),
            5,
            Close::Fin,
            Some("shop/checkout6:http"),
            Some(true),
        )
    );
    // Five identical requests from http.client: "GET / HTTP/1.1", "Host: [fd00:96::1]",
    // "Accept-Encoding: identity", each line with CRLF, and a blank line: 65 bytes each.
    assert_eq!(conn.bytes_to_backend, 5 * 65);
    let line = serde_json::to_string(conn).unwrap();
    assert!(line.contains(r#""client":"[fd00:a::9]:"#), "{line}");
}
