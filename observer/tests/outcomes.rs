//! Root integration tests for connection outcomes (issue: what happened to each
//! connection). On a lab node with a default route, as kind's nodes have, one client
//! records each attempt's outcome (connected and to which pod, ECONNREFUSED, timeout)
//! against three kinds of target:
//!
//! - `shop/checkout:http`, whose pod checkout-a answers 20 ms late (an NFQUEUE delayer
//!   on its link, as `tc netem delay` would), checkout-b has no listener (its server
//!   stopped) and checkout-c drops SYNs;
//! - `kube-system/kube-dns:dns` (UDP), whose pod dns-a has no listener;
//! - `shop/empty-web:http` (TCP) and `shop/empty-dns:dns` (UDP), Service ports with no
//!   endpoints, which kube-proxy's rules reject.
//!
//! Every attempt must come out exactly as the client saw it: connected ones answered by
//! the same pod with a connect time of 20 ms ± 5, refused ones `refused`, timed-out ones
//! `unanswered`, each with its own client port and named; the DNATed ones are exactly
//! conntrack's own decisions; each attempt to a Service without endpoints is one
//! `reject` line naming the Service (UDP: one per socket, with the datagrams it sent).
//! Run in both rule formats.

mod common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use common::{Recorder, assert_same_decisions, only_node, prefix, require_root};
use observer::model::record::{Close, ConnRecord, FrontendKind, Proto, RejectReason, RejectRecord};
use observer_lab::{
    Attempt, AttemptOutcome, ConntrackWatch, Lab, LabConfig, RuleMode, Service, Topology, attempts,
};

/// The delay checkout-a's replies get, and how far a measured connect time may be off.
const DELAY: Duration = Duration::from_millis(20);
const TOLERANCE_MS: f64 = 5.0;
/// Long enough for a SYN's first retransmission (1 s), short enough for 30 attempts.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// A Service port without endpoints: kube-proxy writes only its rejection.
fn without_endpoints(
    name: &str,
    port_name: &str,
    proto: observer_lab::Proto,
    ip: Ipv4Addr,
    port: u16,
) -> Service {
    Service {
        namespace: "shop".into(),
        name: name.into(),
        port_name: port_name.into(),
        proto,
        cluster_ip: ip,
        port,
        target_port: port,
        node_port: None,
        traffic: Default::default(),
        endpoints: Vec::new(),
    }
}

fn scenario(rules: RuleMode, tag: &str) {
    require_root();
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    lab.add_default_route()
        .expect("a default route on the node");
    let empty_web = without_endpoints(
        "empty-web",
        "http",
        observer_lab::Proto::Tcp,
        Ipv4Addr::new(10, 96, 200, 1),
        80,
    );
    let empty_dns = without_endpoints(
        "empty-dns",
        "dns",
        observer_lab::Proto::Udp,
        Ipv4Addr::new(10, 96, 200, 2),
        53,
    );
    let (empty_web_addr, empty_dns_addr) = (empty_web.cluster_addr(), empty_dns.cluster_addr());
    lab.add_services(vec![empty_web, empty_dns])
        .expect("Services without endpoints");
    let ips: BTreeMap<String, Ipv4Addr> =
        lab.pods().iter().map(|p| (p.name.clone(), p.ip)).collect();
    let pod_ip = |name: &str| ips[name];
    let (late, listenerless, silent, dns_down) = (
        pod_ip("checkout-a"),
        pod_ip("checkout-b"),
        pod_ip("checkout-c"),
        pod_ip("dns-a"),
    );
    lab.delay_replies(late, DELAY).expect("delay checkout-a");
    lab.stop_server(listenerless).expect("stop checkout-b");
    lab.drop_syns(silent).expect("checkout-c drops SYNs");
    lab.stop_server(dns_down).expect("stop dns-a");
    let checkout = lab.service("checkout").unwrap().cluster_addr();
    let dns = lab.service("kube-dns").unwrap().cluster_addr();

    let dir = tempfile::tempdir().unwrap();
    let watch = ConntrackWatch::start(lab.node_ns()).expect("conntrack -E");
    let runtime_root = lab.runtime_root();
    let recorder = Recorder::start(
        dir.path(),
        &[
            "--idle-timeout",
            "2",
            "--runtime-root",
            runtime_root.to_str().unwrap(),
        ],
    );
    let tcp = attempts(
        &lab,
        observer_lab::Proto::Tcp,
        checkout,
        30,
        ATTEMPT_TIMEOUT,
        1,
    )
    .unwrap();
    let udp = attempts(&lab, observer_lab::Proto::Udp, dns, 12, ATTEMPT_TIMEOUT, 1).unwrap();
    let rejected_tcp = attempts(
        &lab,
        observer_lab::Proto::Tcp,
        empty_web_addr,
        5,
        ATTEMPT_TIMEOUT,
        1,
    )
    .unwrap();
    let rejected_udp = attempts(
        &lab,
        observer_lab::Proto::Udp,
        empty_dns_addr,
        3,
        Duration::from_millis(500),
        4,
    )
    .unwrap();
    // Unanswered connections and UDP sockets end after 2 s of silence.
    std::thread::sleep(Duration::from_secs(4));
    let mut recording = recorder.stop();
    let events = watch.stop().unwrap();
    only_node(&mut recording, lab.node_ns());

    let summary = recording.summary.clone().expect("a summary line");
    assert_eq!(
        (
            summary.lost_connections,
            summary.lost_events,
            summary.read_errors,
            summary.lost_rejects
        ),
        (0, 0, 0, 0),
        "nothing lost"
    );
    let conns: Vec<&ConnRecord> = recording.conns.iter().collect();
    assert_same_decisions(&conns, &events, lab.node_ns());
    let pod_addr = |ip: Ipv4Addr, port: u16| SocketAddr::V4(SocketAddrV4::new(ip, port));

    // shop/checkout:http: each attempt is one record with the client's outcome.
    let outcomes = attempts_by_outcome(&tcp);
    assert!(
        outcomes.connected > 0 && outcomes.refused > 0 && outcomes.timeout > 0,
        "the client met every kind of pod: {outcomes:?}"
    );
    let by_port = records_by_port(&recording.conns, checkout);
    assert_eq!(by_port.len(), tcp.len(), "one record per TCP attempt");
    let mut connect_times = Vec::new();
    for attempt in &tcp {
        let record = by_port
            .get(&attempt.client_port)
            .unwrap_or_else(|| panic!("no record of attempt {attempt:?}"));
        assert_eq!(record.service.as_deref(), Some("shop/checkout:http"));
        assert!(record.start_seen);
        match &attempt.outcome {
            AttemptOutcome::Connected { pod, connect_ms } => {
                assert_eq!(pod, "checkout-a", "only checkout-a listens");
                assert_eq!(record.backend, pod_addr(late, 8080));
                assert_eq!(record.close, Close::Fin, "{record:?}");
                let seen = record.connect_ms.expect("a connect time");
                // The node sees the SYN after the client sent it and the SYN-ACK before
                // the client gets it; the delayer holds every SYN-ACK at least DELAY (on a
                // loaded machine its Python loop may wake late: the client sees that too).
                let client = connect_ms.expect("the client's connect time");
                assert!(
                    seen >= DELAY.as_millis() as f64 - TOLERANCE_MS && seen <= client + 1.0,
                    "connect_ms {seen}: not between the delay and the client's own {client}"
                );
                connect_times.push(seen);
            }
            AttemptOutcome::Refused => {
                assert_eq!(record.backend, pod_addr(listenerless, 8080));
                assert_eq!((record.close, record.connect_ms), (Close::Refused, None));
                assert_eq!(record.backend_pod.as_deref(), Some("shop/checkout-b"));
            }
            AttemptOutcome::Timeout => {
                assert_eq!(record.backend, pod_addr(silent, 8080));
                assert_eq!((record.close, record.connect_ms), (Close::Unanswered, None));
                assert_eq!(record.backend_pod.as_deref(), Some("shop/checkout-c"));
            }
            AttemptOutcome::Unreachable => panic!("no REJECT on the way: {attempt:?}"),
        }
    }

    connect_times.sort_by(f64::total_cmp);
    let median = connect_times[connect_times.len() / 2];
    assert!(
        (median - DELAY.as_millis() as f64).abs() <= TOLERANCE_MS,
        "median connect_ms {median} is not 20 ± 5 ms: {connect_times:?}"
    );

    // kube-system/kube-dns:dns over UDP: answered by dns-b, refused by dns-a.
    let by_port = records_by_port(&recording.conns, dns);
    assert_eq!(by_port.len(), udp.len(), "one record per UDP socket");
    for attempt in &udp {
        let record = &by_port[&attempt.client_port];
        let (backend, close) = match &attempt.outcome {
            AttemptOutcome::Connected { pod, .. } => {
                assert_eq!(pod, "dns-b");
                (pod_ip("dns-b"), Close::Timeout)
            }
            AttemptOutcome::Refused => (dns_down, Close::Refused),
            // dns-a's kernel may hold back its ICMP error (its rate limit): no answer.
            AttemptOutcome::Timeout => (dns_down, Close::Unanswered),
            AttemptOutcome::Unreachable => panic!("no REJECT on the way: {attempt:?}"),
        };
        assert_eq!(
            (record.backend, record.close),
            (pod_addr(backend, 5353), close),
            "{attempt:?}"
        );
        assert_eq!(record.connect_ms, None);
    }

    // Services without endpoints: rejected, never DNATed, each attempt one line.
    assert!(
        recording
            .conns
            .iter()
            .all(|c| c.original_dst != SocketAddr::V4(empty_web_addr)
                && c.original_dst != SocketAddr::V4(empty_dns_addr))
    );
    let rejects = |dialed: SocketAddrV4| -> BTreeMap<u16, &RejectRecord> {
        recording
            .rejects
            .iter()
            .filter(|r| r.original_dst == SocketAddr::V4(dialed))
            .map(|r| (r.client.port(), r))
            .collect()
    };
    let web = rejects(empty_web_addr);
    assert_eq!(
        web.keys().copied().collect::<Vec<_>>(),
        sorted_ports(&rejected_tcp),
        "one reject line per TCP attempt: {:?}",
        recording.rejects
    );
    assert!(
        rejected_tcp
            .iter()
            .all(|a| a.outcome != AttemptOutcome::Timeout || a.datagrams_sent == 0),
        "TCP attempts send no datagrams"
    );
    for reject in web.values() {
        assert_eq!(reject.proto, Proto::Tcp);
        assert_eq!(reject.service.as_deref(), Some("shop/empty-web:http"));
        assert_eq!(reject.frontend, Some(FrontendKind::ClusterIp));
        assert_eq!(reject.reason, Some(RejectReason::NoEndpoints));
        assert_eq!(reject.client_pod.as_deref(), Some("default/client"));
        assert_eq!(reject.packets, None);
    }
    let dns_rejects = rejects(empty_dns_addr);
    assert_eq!(
        dns_rejects.keys().copied().collect::<Vec<_>>(),
        sorted_ports(&rejected_udp),
        "one reject line per UDP socket"
    );
    for attempt in &rejected_udp {
        let reject = dns_rejects[&attempt.client_port];
        assert_eq!(reject.proto, Proto::Udp);
        assert_eq!(reject.service.as_deref(), Some("shop/empty-dns:dns"));
        assert_eq!(
            reject.packets,
            Some(attempt.datagrams_sent),
            "every datagram the socket sent was rejected"
        );
    }
    assert_eq!(
        summary.rejects,
        (rejected_tcp.len() + rejected_udp.len()) as u64
    );
}

#[derive(Debug, Default)]
struct Outcomes {
    connected: usize,
    refused: usize,
    timeout: usize,
}

fn attempts_by_outcome(attempts: &[Attempt]) -> Outcomes {
    let mut outcomes = Outcomes::default();
    for attempt in attempts {
        match attempt.outcome {
            AttemptOutcome::Connected { .. } => outcomes.connected += 1,
            AttemptOutcome::Refused => outcomes.refused += 1,
            AttemptOutcome::Timeout | AttemptOutcome::Unreachable => outcomes.timeout += 1,
        }
    }
    outcomes
}

/// The records of connections to `dialed`, by client port (each port is used once).
fn records_by_port(conns: &[ConnRecord], dialed: SocketAddrV4) -> BTreeMap<u16, &ConnRecord> {
    let mut by_port = BTreeMap::new();
    for conn in conns
        .iter()
        .filter(|c| c.original_dst == SocketAddr::V4(dialed))
    {
        assert!(
            by_port.insert(conn.client.port(), conn).is_none(),
            "two records of client port {}",
            conn.client.port()
        );
    }
    by_port
}

fn sorted_ports(attempts: &[Attempt]) -> Vec<u16> {
    let mut ports: Vec<u16> = attempts.iter().map(|a| a.client_port).collect();
    ports.sort_unstable();
    ports
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn outcomes_iptables() {
    scenario(RuleMode::Iptables, "outi");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn outcomes_nftables() {
    scenario(RuleMode::Nftables, "outn");
}
