//! Root integration tests for DNS search walks (issue 11, section 3). The lab's dns pods
//! run a real authoritative DNS server behind kube-dns's ClusterIP; the client namespace
//! resolves with kube's resolv.conf (`search shop.svc.cluster.local svc.cluster.local
//! cluster.local`, `ndots:5`) through glibc (Python's `getaddrinfo`, Node's `dns.lookup`).
//! Every query observer logged must be one the server received (client, id, name,
//! type, rcode), none missing and none twice, and the walks must be what glibc's
//! search algorithm sends.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{DnsRecord, Proto, Recording};
use observer::stats::dns::{CLUSTER_DOMAIN, ClientDns, per_client};
use observer_lab::{DnsLab, Lab, LabConfig, RuleMode, ServerQuery, Topology};

/// An external name an upstream resolver would answer (TEST-NET-1: never dialed).
const EXTERNAL: (&str, Ipv4Addr) = ("www.example.com", Ipv4Addr::new(192, 0, 2, 10));

const FQDN: &str = "checkout.shop.svc.cluster.local";

/// Resolves each name with glibc (`getaddrinfo`, A and AAAA), 1.5 s apart so that no
/// two lookups fall in one lookup window; prints one line per name.
const PYTHON: &str = r#"
import socket, sys, time
for name in sys.argv[1:]:
    try:
        found = sorted({a[4][0] for a in socket.getaddrinfo(name, 80, proto=socket.IPPROTO_TCP)})
    except socket.gaierror as e:
        found = ["error", str(e)]
    print(name, " ".join(found), flush=True)
    time.sleep(1.5)
"#;

/// The same with Node's `dns.lookup` (getaddrinfo on libuv's thread pool).
const NODE: &str = r#"
const dns = require('dns');
const names = process.argv.slice(1);
(async () => {
  for (const name of names) {
    const found = await new Promise(r => dns.lookup(name, {all: true}, (e, a) => r(e ? ['error', e.code] : a.map(x => x.address).sort())));
    console.log(name, found.join(' '));
    await new Promise(r => setTimeout(r, 1500));
  }
})();
"#;

struct Run {
    lab: Lab,
    dns: DnsLab,
    recorder: Recorder,
    _dir: tempfile::TempDir,
}

fn start(rules: RuleMode, tag: &str) -> Run {
    require_root();
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    let dns = lab.serve_dns(&[EXTERNAL]).expect("DNS servers up");
    let dir = tempfile::tempdir().unwrap();
    let runtime_root = lab.runtime_root();
    let recorder = Recorder::start(
        dir.path(),
        &["--runtime-root", runtime_root.to_str().unwrap()],
    );
    Run {
        lab,
        dns,
        recorder,
        _dir: dir,
    }
}

/// DNS messages skipped in this lab's node (other labs on the machine send non-DNS
/// datagrams to their own kube-dns, which observer sees too).
fn malformed_here(recording: &Recording, node_inode: u32) -> u64 {
    let inode = node_inode.to_string();
    let summary = recording.summary.as_ref().expect("a summary line");
    summary
        .dns_malformed_by_netns
        .get(&inode)
        .copied()
        .unwrap_or(0)
}

/// Stops observer; returns this lab's dns lines and the server's log.
fn finish(run: Run) -> (Recording, Vec<ServerQuery>) {
    // Let the last responses come in (and their lines be written) before stopping.
    std::thread::sleep(Duration::from_millis(500));
    let mut recording = run.recorder.stop();
    only_node(&mut recording, run.lab.node_ns());
    let server = run.dns.queries().unwrap();
    (recording, server)
}

fn resolve(lab: &Lab, program: &str, script: &str, names: &[&str]) -> String {
    let mut args = vec![if program == "node" { "-e" } else { "-c" }, script];
    args.extend_from_slice(names);
    let out = lab.run_in(lab.client_ns(), program, &args).unwrap();
    assert!(
        out.status.success(),
        "{program}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

type Key = (String, u16, String, String, Option<String>);

/// (client, id, name, type, rcode) of each query, sorted.
fn observed(records: &[DnsRecord]) -> Vec<Key> {
    let mut keys: Vec<Key> = records
        .iter()
        .map(|r| {
            (
                r.client.to_string(),
                r.id,
                r.name.clone(),
                r.qtype.clone(),
                r.rcode.clone(),
            )
        })
        .collect();
    keys.sort();
    keys
}

fn received(queries: &[ServerQuery]) -> Vec<Key> {
    let mut keys: Vec<Key> = queries
        .iter()
        .map(|q| {
            (
                q.client.clone(),
                q.id,
                q.name.clone().unwrap_or_default(),
                q.qtype.clone().unwrap_or_default(),
                Some(q.rcode.clone()),
            )
        })
        .collect();
    keys.sort();
    keys
}

/// Names and rcodes, in the server's order (A and AAAA may arrive in either order).
fn walk(queries: &[ServerQuery]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = queries
        .iter()
        .map(|q| {
            (
                q.name.clone().unwrap_or_default(),
                q.qtype.clone().unwrap_or_default(),
                q.rcode.clone(),
            )
        })
        .collect();
    out.sort();
    out
}

/// A client's walks as (base, answer, lookups, queries, NXDOMAIN), to compare whole.
fn walk_rows(client: &ClientDns) -> Vec<(&str, Option<&str>, u64, u64, u64)> {
    client
        .walks
        .iter()
        .map(|w| {
            (
                w.base.as_str(),
                w.answer.as_deref(),
                w.lookups,
                w.queries,
                w.nxdomain,
            )
        })
        .collect()
}

fn glibc(rules: RuleMode, tag: &str) {
    let run = start(rules, tag);
    let fqdn_dot = format!("{FQDN}.");
    let names = ["checkout", FQDN, &fqdn_dot, EXTERNAL.0];
    let printed = resolve(&run.lab, "python3", PYTHON, &names);
    assert_eq!(
        printed,
        "checkout 10.96.35.226\n\
         checkout.shop.svc.cluster.local 10.96.35.226\n\
         checkout.shop.svc.cluster.local. 10.96.35.226\n\
         www.example.com 192.0.2.10\n"
    );
    let node_inode = common::netns_inode(run.lab.node_ns());
    let (recording, server) = finish(run);

    // glibc's walks, from the server's own log: A and AAAA for each name tried.
    let both = |name: &str, rcode: &str| {
        [
            (name.to_owned(), "A".to_owned(), rcode.to_owned()),
            (name.to_owned(), "AAAA".to_owned(), rcode.to_owned()),
        ]
    };
    let mut expected: Vec<(String, String, String)> = Vec::new();
    expected.extend(both(FQDN, "NOERROR")); // checkout
    for suffix in [
        "shop.svc.cluster.local",
        "svc.cluster.local",
        "cluster.local",
    ] {
        expected.extend(both(&format!("{FQDN}.{suffix}"), "NXDOMAIN"));
        expected.extend(both(&format!("{}.{suffix}", EXTERNAL.0), "NXDOMAIN"));
    }
    expected.extend(both(FQDN, "NOERROR")); // checkout.shop.svc.cluster.local
    expected.extend(both(FQDN, "NOERROR")); // checkout.shop.svc.cluster.local.
    expected.extend(both(EXTERNAL.0, "NOERROR"));
    expected.sort();
    assert_eq!(walk(&server), expected, "the server's log");

    // observer logged exactly the queries the server received.
    assert_eq!(observed(&recording.dns), received(&server));
    assert!(
        recording
            .dns
            .iter()
            .all(|r| r.client_pod.as_deref() == Some("default/client"))
    );
    assert!(
        recording
            .dns
            .iter()
            .all(|r| r.server.to_string() == "10.96.0.10:53")
    );
    assert_eq!(malformed_here(&recording, node_inode), 0);

    // Lookups and walks.
    let clients = per_client(&recording.dns, CLUSTER_DOMAIN);
    assert_eq!(clients.len(), 1);
    let client = &clients[0];
    assert_eq!(
        (client.lookups, client.queries, client.nxdomain),
        (4, 20, 12)
    );
    assert_eq!(client.queries_per_lookup, 5.0);
    let walks = walk_rows(client);
    assert_eq!(
        walks,
        [
            (FQDN, Some(FQDN), 1, 8, 6),
            (EXTERNAL.0, Some(EXTERNAL.0), 1, 8, 6),
            // `checkout` and `checkout.shop.svc.cluster.local.` send the same queries.
            ("checkout", Some(FQDN), 2, 4, 0),
        ]
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn glibc_walks_iptables() {
    glibc(RuleMode::Iptables, "dnsi");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn glibc_walks_nftables() {
    glibc(RuleMode::Nftables, "dnsn");
}

/// Queries over TCP (RFC 1035 4.2.2: a 2-byte length, then the message) on one
/// connection: A and AAAA in one segment, then an A query split in two segments after
/// its length and 5 bytes. Prints the responses' rcodes.
const TCP_QUERIES: &str = r#"
import socket, struct, sys, time
name = sys.argv[1]
def query(ident, qtype):
    q = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    q += struct.pack("!HH", qtype, 1)
    return struct.pack("!H", len(q)) + q
s = socket.create_connection(("10.96.0.10", 53), timeout=5)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
stream = s.makefile("rb")
def rcode():
    size = struct.unpack("!H", stream.read(2))[0]
    return str(stream.read(size)[3] & 0x0f)
s.sendall(query(0x4241, 1) + query(0x4242, 28))
print(rcode(), rcode())
split = query(0x4243, 1)
s.sendall(split[:7])
time.sleep(0.2)
s.sendall(split[7:])
print(rcode(), flush=True)
"#;

/// Node's `dns.lookup`: whatever glibc sends for it, observer logs exactly that, and
/// each name is one lookup. Then queries over TCP from a plain socket (`TCP_QUERIES`,
/// their payload in page fragments, read where the node forwards them on the netfilter
/// hooks, at the client's socket on `net_dev_queue`): the two in one
/// segment are decoded with their responses; the split one's first segment holds only
/// 5 bytes of its header, so that query is counted malformed and its line comes from
/// its response alone.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn node_lookups_and_tcp() {
    let run = start(RuleMode::Iptables, "dnsnode");
    let printed = resolve(&run.lab, "node", NODE, &["checkout", EXTERNAL.0, "nope"]);
    assert_eq!(
        printed,
        "checkout 10.96.35.226\nwww.example.com 192.0.2.10\nnope error ENOTFOUND\n"
    );
    let tcp = resolve(
        &run.lab,
        "python3",
        TCP_QUERIES,
        &["nope.shop.svc.cluster.local"],
    );
    assert_eq!(tcp, "3 3\n3\n");
    let node_inode = common::netns_inode(run.lab.node_ns());
    let (mut recording, server) = finish(run);
    let (tcp_server, server): (Vec<ServerQuery>, Vec<ServerQuery>) =
        server.into_iter().partition(|q| q.proto == "tcp");
    assert_eq!(tcp_server.len(), 3);
    let (tcp_lines, udp_lines): (Vec<DnsRecord>, Vec<DnsRecord>) =
        recording.dns.drain(..).partition(|r| r.proto == Proto::Tcp);
    let malformed = malformed_here(&recording, node_inode);
    assert_eq!(
        (observed(&tcp_lines), malformed),
        (received(&tcp_server), 1)
    );
    let mut answered: Vec<(u16, bool)> = tcp_lines
        .iter()
        .map(|r| (r.id, r.latency_ms.is_some()))
        .collect();
    answered.sort();
    assert_eq!(answered, [(0x4241, true), (0x4242, true), (0x4243, false)]);
    recording.dns = udp_lines;
    assert!(!server.is_empty());
    assert_eq!(observed(&recording.dns), received(&server));
    // Node's getaddrinfo sends what Python's does: A and AAAA per name tried.
    let clients = per_client(&recording.dns, CLUSTER_DOMAIN);
    assert_eq!(clients.len(), 1);
    assert_eq!((clients[0].lookups, clients[0].queries), (3, 18));
    let walks = walk_rows(&clients[0]);
    assert_eq!(
        walks,
        [
            ("nope", None, 1, 8, 8),
            (EXTERNAL.0, Some(EXTERNAL.0), 1, 8, 6),
            ("checkout", Some(FQDN), 1, 2, 0),
        ]
    );
}

/// glibc's resolver over TCP (`options use-vc`): it writes the A and AAAA queries of
/// each name tried in one segment and reads the two responses; observer logs exactly
/// the queries the server received over TCP, with their rcodes, and the same walks as
/// over UDP.
#[test]
#[ignore = "root: run by cargo xtask test"]
fn glibc_walks_over_tcp() {
    let run = start(RuleMode::Iptables, "dnstcp");
    run.dns.over_tcp(true).unwrap();
    let printed = resolve(&run.lab, "python3", PYTHON, &["checkout", EXTERNAL.0]);
    assert_eq!(
        printed,
        "checkout 10.96.35.226\nwww.example.com 192.0.2.10\n"
    );
    let node_inode = common::netns_inode(run.lab.node_ns());
    let (recording, server) = finish(run);
    assert!(server.iter().all(|q| q.proto == "tcp"), "{server:?}");
    assert_eq!(server.len(), 10);
    assert_eq!(observed(&recording.dns), received(&server));
    assert!(recording.dns.iter().all(|r| r.proto == Proto::Tcp
        && r.latency_ms.is_some()
        && r.server.to_string() == "10.96.0.10:53"
        && r.client_pod.as_deref() == Some("default/client")));
    assert_eq!(malformed_here(&recording, node_inode), 0);
    let clients = per_client(&recording.dns, CLUSTER_DOMAIN);
    assert_eq!(clients.len(), 1);
    assert_eq!(
        (clients[0].lookups, clients[0].queries, clients[0].nxdomain),
        (2, 10, 6)
    );
    assert_eq!(
        walk_rows(&clients[0]),
        [
            (EXTERNAL.0, Some(EXTERNAL.0), 1, 8, 6),
            ("checkout", Some(FQDN), 1, 2, 0),
        ]
    );
}
