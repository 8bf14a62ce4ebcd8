//! Root integration tests for `observer record` (issue: capture every ClusterIP -> pod
//! DNAT decision). For each rule format x topology, real clients in the lab's client
//! namespace make 21 fresh HTTP connections, one keep-alive connection carrying 30
//! requests, a Node.js fetch loop of 30 requests, and 10 UDP queries from new sockets.
//! The log must match `conntrack -E` in the node namespace exactly (none missing, none
//! twice) and the clients' own records of which pod answered; connections made straight
//! to a pod (not DNATed) must not appear.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, SocketAddrV4};

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::{Close, ConnRecord, FrontendKind, Proto, Recording};
use observer_lab::{
    Answer, ConntrackWatch, CtEvent, Lab, LabConfig, RuleMode, Topology, http_fresh,
    http_keepalive, node_fetch, udp_queries,
};

fn scenario(topology: Topology, rules: RuleMode, tag: &str, start: StartRecorder) {
    require_root();
    let lab = Lab::up(LabConfig {
        topology,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    let targets = Targets::of(&lab);
    let (mut recording, conntrack, traffic) = record_client_traffic(&lab, &targets, start);

    assert_nothing_lost(&recording);
    only_node(&mut recording, lab.node_ns());
    assert_same_connections_as_conntrack(&recording, &conntrack, &traffic, targets.direct_pod);
    assert_named_from_the_rules(&recording);
    assert_pods_named_from_the_runtime(&lab, &recording);
    assert_expected_shares(&recording);

    let by_port = records_by_client_port(&recording);
    assert_fresh_connections(&by_port, &traffic.fresh, &targets);
    assert_keepalive_connection(&by_port, &traffic.keepalive, &targets);
    assert_udp_queries(&by_port, &traffic.udp, &targets);
    assert_node_fetch_requests(&recording, &traffic, &targets);
}

/// Where the clients connect to, and each pod's address by name.
struct Targets {
    checkout: SocketAddrV4,
    dns: SocketAddrV4,
    /// A checkout pod, dialed straight (no DNAT).
    direct_pod: SocketAddrV4,
    pod_ip: HashMap<String, SocketAddr>,
}

impl Targets {
    fn of(lab: &Lab) -> Targets {
        let pod_ip = lab
            .services()
            .iter()
            .flat_map(|s| {
                s.endpoints
                    .iter()
                    .map(move |p| (p.name.clone(), SocketAddr::new(p.ip.into(), s.target_port)))
            })
            .collect();
        let checkout = lab.service("checkout").unwrap();
        Targets {
            checkout: checkout.cluster_addr(),
            dns: lab.service("kube-dns").unwrap().cluster_addr(),
            direct_pod: checkout.endpoint_addrs()[0],
            pod_ip,
        }
    }

    /// The name of the pod at `backend`.
    fn pod_at(&self, backend: SocketAddr) -> String {
        self.pod_ip
            .iter()
            .find(|(_, addr)| **addr == backend)
            .map(|(name, _)| name.clone())
            .unwrap()
    }
}

/// What the clients saw of their own connections.
struct Traffic {
    fresh: Vec<Answer>,
    keepalive: Vec<Answer>,
    /// Requests per pod, as Node's fetch counted them.
    node: BTreeMap<String, usize>,
    udp: Vec<Answer>,
    /// Connections straight to a pod.
    direct: Vec<Answer>,
}

/// Records (started by `start`) while the clients make their connections, and watches
/// `conntrack -E` in the node namespace meanwhile.
fn record_client_traffic(
    lab: &Lab,
    targets: &Targets,
    start: StartRecorder,
) -> (Recording, Vec<CtEvent>, Traffic) {
    let dir = tempfile::tempdir().unwrap();
    let watch = ConntrackWatch::start(lab.node_ns()).expect("conntrack -E");
    let runtime_root = lab.runtime_root();
    let recorder = start(
        dir.path(),
        &[
            "--idle-timeout",
            "2",
            "--runtime-root",
            runtime_root.to_str().unwrap(),
        ],
    );
    let traffic = Traffic {
        fresh: http_fresh(lab, targets.checkout, 21).unwrap(),
        keepalive: http_keepalive(lab, targets.checkout, 30).unwrap(),
        node: node_fetch(lab, targets.checkout, 30).unwrap(),
        udp: udp_queries(lab, targets.dns, 10).unwrap(),
        // Connections straight to a pod are not DNATed: conntrack sees them, observer
        // must not report them.
        direct: http_fresh(lab, targets.direct_pod, 3).unwrap(),
    };
    // Node's fetch keeps its connections open 4 s; let them close (FIN) before stopping.
    std::thread::sleep(std::time::Duration::from_secs(5));
    let recording = recorder.stop();
    let conntrack = watch.stop().unwrap();
    (recording, conntrack, traffic)
}

/// The summary line reports nothing lost, and the log holds as many connections.
fn assert_nothing_lost(recording: &Recording) {
    let summary = recording.summary.clone().expect("a summary line");
    assert_eq!(summary.lost_events, 0, "lost events");
    assert_eq!(summary.lost_connections, 0, "lost connections");
    assert_eq!(summary.read_errors, 0, "failed kernel reads");
    assert_eq!(summary.connections, recording.conns.len() as u64);
}

/// The same set of connections as conntrack's NEW events, each exactly once, and none
/// of the connections made straight to a pod.
fn assert_same_connections_as_conntrack(
    recording: &Recording,
    conntrack: &[CtEvent],
    traffic: &Traffic,
    direct_pod: SocketAddrV4,
) {
    let mut from_log: Vec<(String, String, String, String)> = recording
        .conns
        .iter()
        .map(|c| {
            (
                c.proto.to_string(),
                c.client.to_string(),
                c.original_dst.to_string(),
                c.backend.to_string(),
            )
        })
        .collect();
    let (dnat, not_dnat): (Vec<_>, Vec<_>) =
        conntrack.iter().partition(|e| e.original_dst != e.backend);
    assert_eq!(
        not_dnat.len(),
        traffic.direct.len(),
        "conntrack saw the direct connections"
    );
    // No record of a direct connection: none dialed the pod itself from its port (the
    // kernel may hand that port to a later connection through the Service).
    assert!(traffic.direct.iter().all(|a| {
        recording.conns.iter().all(|c| {
            c.client.port() != a.client_port || c.original_dst != SocketAddr::V4(direct_pod)
        })
    }));
    let mut from_conntrack: Vec<(String, String, String, String)> = dnat
        .iter()
        .map(|e| {
            (
                e.proto.clone(),
                e.client.to_string(),
                e.original_dst.to_string(),
                e.backend.to_string(),
            )
        })
        .collect();
    from_log.sort();
    from_conntrack.sort();
    assert_eq!(from_log, from_conntrack, "log vs conntrack -E");
    assert!(recording.conns.iter().all(|c| c.start_seen));
}

/// Every record is named from the node's own rules, and every backend is in them.
fn assert_named_from_the_rules(recording: &Recording) {
    for conn in &recording.conns {
        let expected = match conn.proto {
            Proto::Tcp => "shop/checkout:http",
            Proto::Udp => "kube-system/kube-dns:dns",
        };
        assert_eq!(conn.service.as_deref(), Some(expected), "{conn:?}");
        assert_eq!(conn.endpoint_in_rules, Some(true), "{conn:?}");
        assert_eq!(conn.frontend, Some(FrontendKind::ClusterIp), "{conn:?}");
    }
}

/// Every client and backend is a lab pod, named from the runtime state the lab wrote as
/// containerd does.
fn assert_pods_named_from_the_runtime(lab: &Lab, recording: &Recording) {
    let pods = lab.pod_names();
    let pod_of = |addr: SocketAddr| match addr.ip() {
        std::net::IpAddr::V4(ip) => pods.get(&ip).cloned(),
        std::net::IpAddr::V6(_) => None,
    };
    for conn in &recording.conns {
        assert_eq!(
            conn.client_pod.as_deref(),
            Some("default/client"),
            "{conn:?}"
        );
        assert_eq!(
            conn.client_pod.as_deref(),
            pod_of(conn.client).as_deref(),
            "{conn:?}"
        );
        assert!(conn.backend_pod.is_some(), "{conn:?}");
        assert_eq!(
            conn.backend_pod.as_deref(),
            pod_of(conn.backend).as_deref(),
            "{conn:?}"
        );
    }
}

/// The log describes both Services with the rules' expected shares.
fn assert_expected_shares(recording: &Recording) {
    let shares = |name: &str| -> Vec<(String, f64)> {
        let service = recording
            .services
            .iter()
            .rev()
            .find(|s| s.service == name)
            .expect(name);
        service
            .endpoints
            .iter()
            .map(|e| (e.addr.to_string(), (e.expected_share * 1e6).round() / 1e6))
            .collect()
    };
    assert_eq!(
        shares("shop/checkout:http"),
        [
            ("10.244.1.12:8080", 0.333333),
            ("10.244.1.13:8080", 0.333333),
            ("10.244.1.14:8080", 0.333333)
        ]
        .map(|(a, s)| (a.to_owned(), s))
    );
    assert_eq!(
        shares("kube-system/kube-dns:dns"),
        [("10.244.1.20:5353", 0.5), ("10.244.1.21:5353", 0.5)].map(|(a, s)| (a.to_owned(), s))
    );
}

/// The records by protocol and client port (unique in this test).
fn records_by_client_port(recording: &Recording) -> HashMap<(Proto, u16), &ConnRecord> {
    let by_port: HashMap<(Proto, u16), &ConnRecord> = recording
        .conns
        .iter()
        .map(|c| ((c.proto, c.client.port()), c))
        .collect();
    assert_eq!(
        by_port.len(),
        recording.conns.len(),
        "client ports are unique in this test"
    );
    by_port
}

/// 21 fresh connections: one request each, to the pod that answered.
fn assert_fresh_connections(
    by_port: &HashMap<(Proto, u16), &ConnRecord>,
    fresh: &[Answer],
    targets: &Targets,
) {
    assert_eq!(fresh.len(), 21);
    for answer in fresh {
        let conn = by_port[&(Proto::Tcp, answer.client_port)];
        assert_eq!(
            conn.backend, targets.pod_ip[&answer.pod],
            "fresh connection {}",
            answer.client_port
        );
        assert_eq!((conn.requests, conn.close), (1, Close::Fin));
        assert_eq!(conn.original_dst, SocketAddr::V4(targets.checkout));
        // The pod that answered, by the name it answered with.
        assert_eq!(
            conn.backend_pod.as_deref(),
            Some(format!("shop/{}", answer.pod).as_str())
        );
        // http.client's request: GET, Host, Accept-Encoding and Connection: close lines.
        assert_eq!(conn.bytes_to_backend, 84, "each byte once");
    }
    // Every answer has the same headers around the pod's name.
    let header_sizes: std::collections::BTreeSet<u64> = fresh
        .iter()
        .map(|a| by_port[&(Proto::Tcp, a.client_port)].bytes_from_backend - a.pod.len() as u64)
        .collect();
    assert_eq!(header_sizes.len(), 1, "{header_sizes:?}");
}

/// One keep-alive connection: 30 requests, all to one pod.
fn assert_keepalive_connection(
    by_port: &HashMap<(Proto, u16), &ConnRecord>,
    keepalive: &[Answer],
    targets: &Targets,
) {
    assert!(
        keepalive
            .iter()
            .all(|a| a.client_port == keepalive[0].client_port && a.pod == keepalive[0].pod)
    );
    let conn = by_port[&(Proto::Tcp, keepalive[0].client_port)];
    assert_eq!(conn.backend, targets.pod_ip[&keepalive[0].pod]);
    assert_eq!((conn.requests, conn.close), (30, Close::Fin));
    // 30 requests of GET, Host and Accept-Encoding lines: 65 bytes each.
    assert_eq!(conn.bytes_to_backend, 30 * 65);
}

/// UDP: one query per socket, answered by the pod the log names. The query is "q", the
/// answer the pod's name: each datagram counted once even where a bridge shows it to
/// the hook twice.
fn assert_udp_queries(
    by_port: &HashMap<(Proto, u16), &ConnRecord>,
    udp: &[Answer],
    targets: &Targets,
) {
    assert_eq!(udp.len(), 10);
    for answer in udp {
        let conn = by_port[&(Proto::Udp, answer.client_port)];
        assert_eq!(conn.backend, targets.pod_ip[&answer.pod]);
        assert_eq!(conn.original_dst, SocketAddr::V4(targets.dns));
        assert_eq!(
            conn.backend_pod.as_deref(),
            Some(format!("kube-system/{}", answer.pod).as_str())
        );
        assert_eq!(
            (
                conn.requests,
                conn.bytes_to_backend,
                conn.bytes_from_backend
            ),
            (1, 1, answer.pod.len() as u64)
        );
    }
}

/// Node's fetch: the remaining TCP connections; requests per pod equal what Node saw.
fn assert_node_fetch_requests(recording: &Recording, traffic: &Traffic, targets: &Targets) {
    let known: Vec<u16> = traffic
        .fresh
        .iter()
        .chain(&traffic.keepalive)
        .map(|a| a.client_port)
        .collect();
    let mut node_per_pod: BTreeMap<String, u64> = BTreeMap::new();
    for conn in recording
        .conns
        .iter()
        .filter(|c| c.proto == Proto::Tcp && !known.contains(&c.client.port()))
    {
        *node_per_pod
            .entry(targets.pod_at(conn.backend))
            .or_default() += conn.requests;
    }
    let node_seen: BTreeMap<String, u64> = traffic
        .node
        .iter()
        .map(|(pod, n)| (pod.clone(), *n as u64))
        .collect();
    assert_eq!(
        node_per_pod, node_seen,
        "requests per pod: log vs Node's fetch"
    );
    assert_eq!(node_seen.values().sum::<u64>(), 30);
}

/// How a scenario starts `observer record` (in `dir`, with extra arguments).
type StartRecorder = fn(&std::path::Path, &[&str]) -> Recorder;

/// On a kernel whose BTF is not at /sys/kernel/btf/vmlinux (here: an empty file mounted
/// over it, in a mount namespace of observer's own), with `--btf` naming a copy of it:
/// offsets come from the copy, and without the kernel's BTF the BTF tracepoint program
/// cannot load, so the raw tracepoint program must run, with the same results. (Nor
/// the netfilter program: the kernel functions it calls are named by their ids in the
/// kernel's BTF, which a copy cannot vouch for.)
fn start_with_kernel_btf_elsewhere(dir: &std::path::Path, extra: &[&str]) -> Recorder {
    let btf = dir.join("vmlinux.btf");
    std::fs::copy("/sys/kernel/btf/vmlinux", &btf).unwrap();
    let empty = dir.join("no-btf");
    std::fs::File::create(&empty).unwrap();
    let output = dir.join("conns.jsonl");
    let mut command = std::process::Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0" /sys/kernel/btf/vmlinux && exec "$@""#)
        .arg(&empty)
        .arg(env!("CARGO_BIN_EXE_observer"))
        .arg("record")
        .arg("--write")
        .arg(&output)
        .arg("--btf")
        .arg(&btf)
        .args(extra);
    let recorder = Recorder::spawn(command, output);
    // Without the kernel's BTF, the skb:kfree_skb program cannot load either (observer
    // warns that rejections are not seen).
    assert_programs_at(
        &recorder,
        false,
        &[BPF_PROG_TYPE_RAW_TRACEPOINT],
        "the raw tracepoint program",
    );
    recorder
}

const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_PROG_TYPE_NETFILTER: u32 = 32;

/// The forwarding program's type: `on_dev_queue` where it runs on `net_dev_queue`, a
/// netfilter program where this run puts it on the netfilter hooks.
fn forwarding(on_dev_queue: u32) -> u32 {
    if common::netfilter_hook() {
        BPF_PROG_TYPE_NETFILTER
    } else {
        on_dev_queue
    }
}

/// Asserts that observer holds the revalidation program (a raw tracepoint program,
/// loaded and run but attached to nothing: this kernel has `bpf_loop`), `tracing`
/// (`what`): on `net_dev_queue`, a BTF or raw tracepoint program, and on
/// `skb:kfree_skb` a BTF tracepoint program where the kernel's BTF is there), and on
/// `net_dev_queue` the two socket-side cgroup_skb programs (the netfilter program reads
/// what they would itself).
fn assert_programs(recorder: &Recorder, tracing: &[u32], what: &str) {
    assert_programs_at(recorder, common::netfilter_hook(), tracing, what);
}

/// `assert_programs` for a run whose forwarding program is on the netfilter hooks, or not.
fn assert_programs_at(recorder: &Recorder, netfilter: bool, tracing: &[u32], what: &str) {
    let mut expected = vec![BPF_PROG_TYPE_RAW_TRACEPOINT];
    if !netfilter {
        expected.extend([BPF_PROG_TYPE_CGROUP_SKB, BPF_PROG_TYPE_CGROUP_SKB]);
    }
    expected.extend_from_slice(tracing);
    expected.sort();
    assert_eq!(
        program_types(recorder.pid()),
        expected,
        "{what}, the revalidation program and, on net_dev_queue, the two cgroup_skb programs"
    );
}

/// The types of the BPF programs process `pid` holds, sorted (`prog_type` in fdinfo).
fn program_types(pid: u32) -> Vec<u32> {
    let mut types: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("prog_type:"))
                .and_then(|value| value.trim().parse().ok())
        })
        .collect();
    types.sort();
    types
}

/// `observer record` as users start it: the BTF tracepoint program runs.
fn start_normally(dir: &std::path::Path, extra: &[&str]) -> Recorder {
    let recorder = Recorder::start(dir, extra);
    assert_programs(
        &recorder,
        &[forwarding(BPF_PROG_TYPE_TRACING), BPF_PROG_TYPE_TRACING],
        "the BTF tracepoint programs (net_dev_queue, skb:kfree_skb)",
    );
    recorder
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn iptables_bridged() {
    scenario(Topology::Bridged, RuleMode::Iptables, "ib", start_normally);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn raw_tracepoint_where_the_kernel_btf_is_elsewhere() {
    scenario(
        Topology::Bridged,
        RuleMode::Iptables,
        "rt",
        start_with_kernel_btf_elsewhere,
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn iptables_routed() {
    scenario(Topology::Routed, RuleMode::Iptables, "ir", start_normally);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_bridged() {
    scenario(Topology::Bridged, RuleMode::Nftables, "nb", start_normally);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_routed() {
    scenario(Topology::Routed, RuleMode::Nftables, "nr", start_normally);
}
