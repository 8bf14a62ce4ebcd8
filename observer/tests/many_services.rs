//! Root integration test (issue 8: names never stall capture): a node with 5,000
//! Services of 3 endpoints each. Reading its rules takes observer's rule reader a while
//! (`iptables-save` of some 75,000 lines, or `nft -j` of a 5,000-Service table: seconds
//! on a busy machine); that happens on a worker thread, so fresh connections recorded
//! meanwhile, from the start, are neither lost nor unnamed: the first ones wait for the
//! node's rules to be read and are written named.

mod common;

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use common::{Recorder, only_node, prefix, require_root};
use observer::model::record::ConnRecord;
use observer_lab::{Answer, Lab, LabConfig, Proto, RuleMode, Service, Topology, http_fresh};

const SERVICES: usize = 5000;
const PER_TARGET: usize = 300;

fn many(lab: &Lab) -> Vec<Service> {
    let checkout = lab.service("checkout").unwrap();
    (0..SERVICES)
        .map(|i| Service {
            namespace: "load".into(),
            name: format!("svc-{i}"),
            port_name: "http".into(),
            proto: Proto::Tcp,
            cluster_ip: Ipv4Addr::new(10, 97, (i / 250) as u8, (i % 250 + 1) as u8),
            port: 80,
            target_port: checkout.target_port,
            node_port: None,
            traffic: Default::default(),
            endpoints: checkout.endpoints.clone(),
        })
        .collect()
}

fn five_thousand_services(rules: RuleMode, tag: &str) {
    require_root();
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: prefix(tag),
    })
    .expect("lab up");
    let extra = many(&lab);
    let loading = Instant::now();
    lab.add_services(extra.clone()).expect("5,000 Services");
    eprintln!(
        "loaded {SERVICES} Services in {:.1} s",
        loading.elapsed().as_secs_f64()
    );
    let dumping = Instant::now();
    let dump = lab.rules_dump().unwrap();
    eprintln!(
        "the node's rules: {} bytes dumped in {:.1} s",
        dump.len(),
        dumping.elapsed().as_secs_f64()
    );
    let mut targets: Vec<&Service> = [0, SERVICES / 2, SERVICES - 1]
        .iter()
        .map(|&i| &extra[i])
        .collect();
    let checkout = lab.service("checkout").unwrap().clone();
    targets.push(&checkout);
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::start(dir.path(), &[]);
    // Two clients at once from the first moment: the node's rules are new to observer.
    let answers: Vec<(String, SocketAddr, Answer)> = std::thread::scope(|scope| {
        let lab = &lab;
        let runs: Vec<_> = targets
            .chunks(2)
            .map(|pair| {
                scope.spawn(move || {
                    let mut out = Vec::new();
                    for service in pair {
                        let addr = service.cluster_addr();
                        for answer in http_fresh(lab, addr, PER_TARGET).unwrap() {
                            out.push((service.port_name_string(), SocketAddr::V4(addr), answer));
                        }
                    }
                    out
                })
            })
            .collect();
        runs.into_iter()
            .flat_map(|run| run.join().unwrap())
            .collect()
    });
    assert_eq!(answers.len(), targets.len() * PER_TARGET);
    std::thread::sleep(Duration::from_millis(500));
    let mut recording = recorder.stop();
    let summary = recording.summary.clone().unwrap();
    assert_eq!((summary.lost_events, summary.read_errors), (0, 0));
    only_node(&mut recording, lab.node_ns());
    assert_eq!(
        recording.conns.len(),
        answers.len(),
        "one record per answer"
    );

    // Every connection recorded once, to the pod that answered it, named after the
    // Service it dialed: per dialed address and client port, the backends of the records
    // are those the client says answered.
    let pod_ip: HashMap<&str, Ipv4Addr> = checkout
        .endpoints
        .iter()
        .map(|pod| (pod.name.as_str(), pod.ip))
        .collect();
    let mut answered: HashMap<(SocketAddr, u16), Vec<SocketAddr>> = HashMap::new();
    for (_, dialed, answer) in &answers {
        let backend = SocketAddr::from((pod_ip[answer.pod.as_str()], checkout.target_port));
        answered
            .entry((*dialed, answer.client_port))
            .or_default()
            .push(backend);
    }
    let mut recorded: HashMap<(SocketAddr, u16), Vec<&ConnRecord>> = HashMap::new();
    for conn in &recording.conns {
        recorded
            .entry((conn.original_dst, conn.client.port()))
            .or_default()
            .push(conn);
    }
    let service_of: HashMap<SocketAddr, &str> = answers
        .iter()
        .map(|(service, dialed, _)| (*dialed, service.as_str()))
        .collect();
    let mut unnamed = 0;
    for ((dialed, port), mut backends) in answered {
        let conns = recorded.remove(&(dialed, port)).unwrap_or_default();
        let mut recorded_backends: Vec<SocketAddr> = conns.iter().map(|c| c.backend).collect();
        backends.sort();
        recorded_backends.sort();
        assert_eq!(
            recorded_backends, backends,
            "client port {port} to {dialed}: {conns:?}"
        );
        for conn in conns {
            if conn.service.as_deref() == Some(service_of[&dialed]) {
                assert_eq!(conn.endpoint_in_rules, Some(true), "{conn:?}");
            } else {
                unnamed += 1;
                if unnamed <= 3 {
                    eprintln!("not named: {conn:?}");
                }
            }
        }
    }
    assert_eq!(unnamed, 0, "connections without their Service's name");
    // The log defines every Service of the node once.
    assert_eq!(recording.services.len(), SERVICES + 2);
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn five_thousand_services_iptables() {
    five_thousand_services(RuleMode::Iptables, "mi");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn five_thousand_services_nftables() {
    five_thousand_services(RuleMode::Nftables, "mn");
}
