//! Root tests of the lab: for each rule mode and topology, real clients' own records must
//! match the kernel's conntrack NEW events exactly, a keep-alive client must stay pinned to
//! one pod, a readiness flip must stop new connections to the removed pod, and the lab must
//! leave nothing behind. Not root is a failure, not a skip. `cargo xtask test` runs them;
//! alone: `sudo -E cargo test -p observer-lab --test lab -- --include-ignored --test-threads=1`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use observer_lab::spec::{CLIENT_IP, NODE_IP};
use observer_lab::testing::{prefix, require_root};
use observer_lab::{
    Answer, ConntrackWatch, CtEvent, Lab, LabConfig, RuleMode, Service, Topology, http_fresh,
    http_keepalive, node_fetch, udp_queries,
};

/// One lab at a time: they are cheap, but the machine has two cores.
static ONE_LAB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Every answer's client port appears in exactly one event, whose backend is the pod the
/// client saw; and there are no other events.
fn assert_events_match(
    what: &str,
    answers: &[Answer],
    events: &[CtEvent],
    proto: &str,
    dialed: SocketAddrV4,
    pod_by_ip: &HashMap<Ipv4Addr, String>,
) {
    let ports: BTreeSet<u16> = answers.iter().map(|a| a.client_port).collect();
    assert_eq!(
        events.len(),
        ports.len(),
        "{what}: one conntrack NEW event per client connection: {events:#?}"
    );
    for answer in answers {
        let matching: Vec<&CtEvent> = events
            .iter()
            .filter(|e| e.client.port() == answer.client_port)
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "{what}: client port {} in events {events:#?}",
            answer.client_port
        );
        let ev = matching[0];
        assert_eq!(ev.proto, proto, "{what}");
        assert_eq!(*ev.client.ip(), CLIENT_IP, "{what}");
        assert_eq!(ev.original_dst, dialed, "{what}");
        assert_eq!(
            pod_by_ip.get(ev.backend.ip()),
            Some(&answer.pod),
            "{what}: backend {} vs answer {}",
            ev.backend,
            answer.pod
        );
    }
}

fn watched<T>(lab: &Lab, client: impl FnOnce() -> anyhow::Result<T>) -> (T, Vec<CtEvent>) {
    let watch = ConntrackWatch::start(lab.node_ns()).expect("conntrack watch starts");
    let result = client().expect("client runs");
    (result, watch.stop().expect("conntrack watch stops"))
}

/// What every step of [`exercise`] needs: the lab's pods by address and its Services.
struct Seen {
    pod_by_ip: HashMap<Ipv4Addr, String>,
    checkout: Service,
    dns: Service,
}

impl Seen {
    fn new(lab: &Lab) -> Seen {
        let service = |name: &str| {
            lab.services()
                .iter()
                .find(|s| s.port_name_string() == name)
                .unwrap()
                .clone()
        };
        Seen {
            pod_by_ip: lab.pods().iter().map(|p| (p.ip, p.name.clone())).collect(),
            checkout: service("shop/checkout:http"),
            dns: service("kube-system/kube-dns:dns"),
        }
    }
}

fn exercise(topology: Topology, rules: RuleMode, tag: &str) {
    let _one = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let started = Instant::now();
    let prefix = prefix(tag);
    {
        let config = LabConfig {
            topology,
            rules,
            prefix: prefix.clone(),
        };
        let mut lab = Lab::up(config.clone()).expect("lab up");
        let again = Lab::up(config).err().expect("second lab refused");
        assert!(
            again
                .to_string()
                .contains(&format!("a lab with prefix `{prefix}` already exists")),
            "{again}"
        );
        let seen = Seen::new(&lab);
        tcp_clients(&lab, &seen);
        udp_and_node_port(&lab, &seen);
        let removed = flip_checkout(&mut lab, &seen);
        flip_dns(&mut lab, &seen);
        let bad = lab
            .remove_endpoint("shop/checkout:http", removed)
            .unwrap_err();
        assert_eq!(
            bad.to_string(),
            "10.244.1.13 is not an endpoint of shop/checkout:http"
        );
        let bad = lab.run_in("not-ours", "true", &[]).unwrap_err();
        assert_eq!(
            bad.to_string(),
            format!("`not-ours` is not a namespace of lab `{prefix}`")
        );
    }
    assert_eq!(
        observer_lab::namespaces(&prefix).unwrap(),
        Vec::<String>::new(),
        "teardown left namespaces"
    );
    assert!(
        !Path::new("/run/observer-lab").join(&prefix).exists(),
        "teardown left the state directory"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}

/// Fresh connections, keep-alive and Node's fetch: each client's record against conntrack.
fn tcp_clients(lab: &Lab, seen: &Seen) {
    let Seen {
        pod_by_ip,
        checkout,
        ..
    } = seen;
    let vip = checkout.cluster_addr();
    // Fresh connections: 30 events, each pinned where the client's answer came from.
    let (fresh, events) = watched(lab, || http_fresh(lab, vip, 30));
    assert_eq!(fresh.len(), 30);
    assert_events_match("fresh", &fresh, &events, "tcp", vip, pod_by_ip);
    let pods_seen: BTreeSet<&str> = fresh.iter().map(|a| a.pod.as_str()).collect();
    // All 30 on one pod of three has probability 3^-29.
    assert!(
        pods_seen.len() >= 2,
        "fresh connections spread: {pods_seen:?}"
    );
    assert!(
        pods_seen.iter().all(|p| p.starts_with("checkout-")),
        "{pods_seen:?}"
    );

    // Keep-alive: one connection, one event, all 30 answers from one pod.
    let (kept, events) = watched(lab, || http_keepalive(lab, vip, 30));
    assert_eq!(kept.len(), 30);
    let ports: BTreeSet<u16> = kept.iter().map(|a| a.client_port).collect();
    let pods: BTreeSet<&str> = kept.iter().map(|a| a.pod.as_str()).collect();
    assert_eq!(ports.len(), 1, "keep-alive used one connection");
    assert_eq!(pods.len(), 1, "keep-alive pinned to one pod: {pods:?}");
    assert_events_match("keep-alive", &kept, &events, "tcp", vip, pod_by_ip);

    // Node 20's fetch (undici) in a sequential loop: it asks for the next request before
    // the previous connection is released, so it keeps two connections and alternates
    // between them, 15 requests each, each pinned to its own pod.
    let (counts, events) = watched(lab, || node_fetch(lab, vip, 30));
    assert_eq!(events.len(), 2, "node fetch connections: {events:#?}");
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    for ev in &events {
        assert_eq!(ev.original_dst, vip);
        *expected
            .entry(pod_by_ip[ev.backend.ip()].clone())
            .or_default() += 15;
    }
    assert_eq!(counts, expected);
}

/// UDP through the Service, and TCP through the NodePort.
fn udp_and_node_port(lab: &Lab, seen: &Seen) {
    let Seen { pod_by_ip, dns, .. } = seen;
    // UDP: every query from a new socket is its own conntrack entry.
    let (answers, events) = watched(lab, || udp_queries(lab, dns.cluster_addr(), 30));
    assert_eq!(answers.len(), 30);
    assert_events_match(
        "udp",
        &answers,
        &events,
        "udp",
        dns.cluster_addr(),
        pod_by_ip,
    );
    assert!(answers.iter().all(|a| a.pod.starts_with("dns-")));

    // NodePort on the node's address.
    let nodeport = SocketAddrV4::new(NODE_IP, 30080);
    let (via_np, events) = watched(lab, || http_fresh(lab, nodeport, 10));
    assert_events_match("nodeport", &via_np, &events, "tcp", nodeport, pod_by_ip);
}

/// The first readiness flip; returns checkout-b's address.
fn flip_checkout(lab: &mut Lab, seen: &Seen) -> Ipv4Addr {
    let Seen {
        pod_by_ip,
        checkout,
        ..
    } = seen;
    let vip = checkout.cluster_addr();
    let rules = lab.config().rules;
    // Readiness flip: checkout-b leaves the rules; no new connection reaches it.
    let removed = lab
        .pods()
        .iter()
        .find(|p| p.name == "checkout-b")
        .unwrap()
        .ip;
    lab.remove_endpoint("shop/checkout:http", removed)
        .expect("readiness flip");
    assert_eq!(lab.services()[0].endpoints.len(), 2);
    let dump = lab.rules_dump().expect("rules dump");
    match rules {
        RuleMode::Iptables => {
            assert!(
                !dump.contains("--to-destination 10.244.1.13:8080"),
                "{dump}"
            );
            assert!(dump.contains("--to-destination 10.244.1.12:8080"), "{dump}");
            assert!(dump.contains("--probability 0.50000000000"), "{dump}");
        }
        _ => {
            assert!(!dump.contains("\"10.244.1.13\""), "{dump}");
            assert!(dump.contains("\"10.244.1.12\""), "{dump}");
        }
    }
    let (after, events) = watched(lab, || http_fresh(lab, vip, 30));
    assert_events_match("after flip", &after, &events, "tcp", vip, pod_by_ip);
    assert!(after.iter().all(|a| a.pod != "checkout-b"), "{after:?}");
    assert!(events.iter().all(|e| *e.backend.ip() != removed));
    // Before the second flip (on the UDP Service): in nftables mode kube-proxy's next
    // sync, a second or more after the first, also deletes the chain this one left empty.
    if rules == RuleMode::Nftables {
        assert!(
            dump.contains("10.244.1.13/8080"),
            "the first flip leaves the endpoint chain, flushed"
        );
        std::thread::sleep(Duration::from_millis(1100));
    }
    removed
}

/// A second flip, on the UDP Service: dns-b leaves the rules.
fn flip_dns(lab: &mut Lab, seen: &Seen) {
    let Seen { pod_by_ip, dns, .. } = seen;
    let rules = lab.config().rules;
    let dns_b = lab.pods().iter().find(|p| p.name == "dns-b").unwrap().ip;
    lab.remove_endpoint("kube-system/kube-dns:dns", dns_b)
        .expect("UDP readiness flip");
    let dump = lab.rules_dump().expect("rules dump");
    assert!(
        !dump.contains("10.244.1.13"),
        "checkout-b is gone from the rules:\n{dump}"
    );
    match rules {
        RuleMode::Iptables => assert!(!dump.contains("10.244.1.21"), "{dump}"),
        // dns-b's chain is left flushed, with no rule naming its address, until the next sync.
        _ => {
            assert!(dump.contains("__10.244.1.21/5353"), "{dump}");
            assert!(!dump.contains("\"10.244.1.21\""), "{dump}");
        }
    }
    let (answers, events) = watched(lab, || udp_queries(lab, dns.cluster_addr(), 20));
    assert_events_match(
        "udp after flip",
        &answers,
        &events,
        "udp",
        dns.cluster_addr(),
        pod_by_ip,
    );
    assert!(answers.iter().all(|a| a.pod == "dns-a"), "{answers:?}");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn iptables_bridged() {
    exercise(Topology::Bridged, RuleMode::Iptables, "ib");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn iptables_routed() {
    exercise(Topology::Routed, RuleMode::Iptables, "ir");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_bridged() {
    exercise(Topology::Bridged, RuleMode::Nftables, "nb");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn nftables_routed() {
    exercise(Topology::Routed, RuleMode::Nftables, "nr");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn down_removes_a_lab_whose_owner_died() {
    let _one = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let prefix = prefix("crash");
    let lab = Lab::up(LabConfig {
        topology: Topology::Routed,
        rules: RuleMode::Iptables,
        prefix: prefix.clone(),
    })
    .expect("lab up");
    let pods = lab.pods().to_vec();
    // What a killed test process leaves: namespaces, running servers, the state directory.
    std::mem::forget(lab);
    assert_eq!(observer_lab::namespaces(&prefix).unwrap().len(), 7);
    let removed = observer_lab::down(&prefix).expect("down");
    assert_eq!(removed.len(), 8, "{removed:?}");
    assert_eq!(
        observer_lab::namespaces(&prefix).unwrap(),
        Vec::<String>::new()
    );
    assert!(!Path::new("/run/observer-lab").join(&prefix).exists());
    assert!(
        pods.iter()
            .all(|p| !Path::new("/run/netns").join(&p.ns).exists())
    );
    assert_eq!(
        observer_lab::down(&prefix).expect("second down"),
        Vec::<String>::new()
    );
}
