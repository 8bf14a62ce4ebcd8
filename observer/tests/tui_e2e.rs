//! Root end-to-end test of the live view (issue: the live view): the real binary runs
//! in tmux against the lab; real clients send traffic; the test drives it with keys and
//! reads the screen. The Service must show by name, each backend's request count must
//! equal what the clients' own records say each pod answered, and the keep-alive
//! connection's 30 requests must sit on one backend.

mod common;

use std::{collections::BTreeMap, net::SocketAddr};

use common::tmux::Tmux;
use common::{prefix, require_root};
use observer_lab::{Lab, LabConfig, RuleMode, Topology, http_fresh, http_keepalive};

/// The REQS column of each backend row on the Service screen.
fn backend_requests(screen: &str) -> BTreeMap<String, u64> {
    screen
        .lines()
        .filter(|line| line.starts_with("10.244."))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields[0].to_owned(), fields[3].parse().unwrap())
        })
        .collect()
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn live_view_shows_pinning() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules: RuleMode::Iptables,
        prefix: prefix("tui"),
    })
    .expect("lab up");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("live.jsonl");
    let command = format!(
        "{} --idle-timeout 2 --write {} --runtime-root {}",
        env!("CARGO_BIN_EXE_observer"),
        log.display(),
        lab.runtime_root().display()
    );
    let tmux = Tmux::start(&format!("observer-e2e-{}", std::process::id()), &command);
    let hooks = format!("hooks {}", common::hooks_attached());
    tmux.wait_for("the status bar", |s| s.contains(&hooks));

    let service = lab.service("checkout").unwrap().clone();
    let keepalive = http_keepalive(&lab, service.cluster_addr(), 30).unwrap();
    let fresh = http_fresh(&lab, service.cluster_addr(), 6).unwrap();
    let mut expected: BTreeMap<String, u64> = service
        .endpoint_addrs()
        .into_iter()
        .map(|addr| (addr.to_string(), 0))
        .collect();
    for answer in keepalive.iter().chain(&fresh) {
        let pod = service
            .endpoints
            .iter()
            .find(|p| p.name == answer.pod)
            .unwrap();
        *expected
            .get_mut(&SocketAddr::new(pod.ip.into(), service.target_port).to_string())
            .unwrap() += 1;
    }

    tmux.wait_for("the Service row", |s| s.contains("shop/checkout:http"));
    // Filter to the Service, open it, and switch from pod names (the default) to addresses.
    tmux.keys(&[
        "/", "c", "h", "e", "c", "k", "o", "u", "t", "Enter", "Enter", "n",
    ]);
    let screen = tmux.wait_for("per-backend requests equal to the traffic sent", |s| {
        backend_requests(s) == expected
    });
    assert!(screen.contains("shop/checkout:http"), "{screen}");

    // The keep-alive connection: one row with its client port and 30 requests.
    let client = format!("10.244.1.9:{}", keepalive[0].client_port);
    let rows: Vec<Vec<&str>> = screen
        .lines()
        .map(|l| {
            l.split_whitespace()
                .filter(|f| *f != ">")
                .collect::<Vec<_>>()
        })
        .filter(|fields| fields.first() == Some(&client.as_str()))
        .collect();
    assert_eq!(rows.len(), 1, "one connection row for {client}:\n{screen}");
    let (fields, row) = (&rows[0], rows[0].join(" "));
    assert_eq!(fields[3], "30", "keep-alive row: {row}");
    let pinned = service
        .endpoints
        .iter()
        .find(|p| p.name == keepalive[0].pod)
        .unwrap();
    assert!(
        fields[1].starts_with(&pinned.ip.to_string()),
        "keep-alive row: {row}"
    );

    // `n` shows pod names again: every backend row, and the keep-alive row by both pods.
    tmux.keys(&["n"]);
    let named = tmux.wait_for("pod names", |s| s.contains("BACKEND POD"));
    let backend_rows = named
        .lines()
        .filter(|l| l.starts_with("shop/checkout-"))
        .count();
    assert_eq!(backend_rows, 3, "{named}");
    let pinned_pod = format!("shop/{}", keepalive[0].pod);
    assert!(
        named.lines().any(|l| {
            let fields: Vec<&str> = l.split_whitespace().filter(|f| *f != ">").collect();
            fields.len() > 3
                && fields[..2] == ["default/client", pinned_pod.as_str()]
                && fields[3] == "30"
        }),
        "keep-alive row by pod names:\n{named}"
    );

    // q quits, restores the terminal, and the recording is complete.
    tmux.quit();
    let mut recording = observer::model::record::Recording::read(&log).unwrap();
    assert_eq!(recording.summary.clone().unwrap().lost_events, 0);
    common::only_node(&mut recording, lab.node_ns());
    assert_eq!(recording.conns.len(), 7);
}
