//! Root integration test of `observer serve`: real traffic in the lab, then a scrape of
//! `/metrics` over loopback; per-backend request and connection counters must equal
//! what the clients' own records say each pod answered, and `promtool check metrics`
//! accepts the scrape.

mod common;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    process::Command,
    time::{Duration, Instant},
};

use common::metrics::{per_backend, promtool_lint, samples, scrape};
use common::{prefix, require_root};
use observer_lab::{Lab, LabConfig, Observer, RuleMode, Topology, http_fresh, http_keepalive};

#[test]
fn samples_are_read_with_their_labels() {
    let metrics = "# HELP observer_requests_total x\n\
        observer_requests_total{service=\"shop/checkout:http\",proto=\"tcp\",backend=\"10.244.1.12:8080\",backend_pod=\"shop/a\\\"b\"} 3\n\
        observer_requests_total_other{service=\"x\"} 1\n";
    let found = samples(metrics, "observer_requests_total");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0["backend_pod"], "shop/a\"b");
    assert_eq!(found[0].1, 3.0);
    assert_eq!(
        per_backend(
            metrics,
            "observer_requests_total",
            "shop/checkout:http",
            "tcp"
        ),
        BTreeMap::from([("10.244.1.12:8080".to_owned(), 3)])
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn metrics_count_what_the_clients_saw() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Routed,
        rules: RuleMode::Nftables,
        prefix: prefix("met"),
    })
    .expect("lab up");
    let addr = format!("127.0.0.1:{}", 20000 + std::process::id() % 20000);
    let mut serve = Command::new(env!("CARGO_BIN_EXE_observer"));
    serve.args(["serve", "--listen", &addr]);
    let _server = Observer::start(serve, false).expect("observer serve attaches");

    let service = lab.service("checkout").unwrap().clone();
    let keepalive = http_keepalive(&lab, service.cluster_addr(), 30).unwrap();
    let fresh = http_fresh(&lab, service.cluster_addr(), 9).unwrap();
    let backend_of = |pod: &str| {
        let pod = service.endpoints.iter().find(|p| p.name == pod).unwrap();
        SocketAddr::new(pod.ip.into(), service.target_port).to_string()
    };
    let mut expected_requests: BTreeMap<String, u64> = service
        .endpoint_addrs()
        .into_iter()
        .map(|a| (a.to_string(), 0))
        .collect();
    let mut expected_connections = expected_requests.clone();
    for answer in keepalive.iter().chain(&fresh) {
        *expected_requests.get_mut(&backend_of(&answer.pod)).unwrap() += 1;
    }
    // One connection per fresh request, one for all the keep-alive requests.
    for answer in fresh.iter().chain(&keepalive[..1]) {
        *expected_connections
            .get_mut(&backend_of(&answer.pod))
            .unwrap() += 1;
    }

    let name = "shop/checkout:http";
    let deadline = Instant::now() + Duration::from_secs(15);
    let metrics = loop {
        let metrics = scrape(&addr, "/metrics");
        if per_backend(&metrics, "observer_requests_total", name, "tcp") == expected_requests {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "requests never matched {expected_requests:?}:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(
        per_backend(&metrics, "observer_connections_total", name, "tcp"),
        expected_connections
    );
    assert!(
        metrics.lines().any(|l| l == "observer_lost_events_total 0"),
        "{metrics}"
    );
    let hooks = common::hooks_attached();
    assert!(
        metrics
            .lines()
            .any(|l| l == format!("observer_hooks_attached {hooks}")),
        "{metrics}"
    );
    let shares = per_backend(&metrics, "observer_expected_share", name, "tcp");
    assert_eq!(shares.len(), 3, "{metrics}");

    // Prometheus' own linter accepts the real scrape (format and naming conventions).
    promtool_lint(&metrics);
}
