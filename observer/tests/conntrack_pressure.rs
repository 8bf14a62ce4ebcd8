//! Root test of conntrack pressure (issue 21): what `observer serve` exports of a
//! namespace's conntrack table equals what `conntrack -C`, `conntrack -S` and the sysctl
//! say there at the same moment. The lab's node is filled (by conntrack itself, no
//! traffic) to a known count. A pod's namespace is filled with entries conntrack may
//! evict: new flows evict some (early drops). Then the node is filled to its maximum
//! with entries conntrack may not evict: new flows are dropped. (In that order: a drop
//! sets conntrack's garbage collector evicting, uncounted, in every table 95% full for a
//! pass.) The summary line has each one's peak and what its counters rose by. conntrack counts entries per namespace against the global
//! `nf_conntrack_max`, which a test must not change (and a child namespace cannot), so
//! only the lab's namespaces fill. Nothing full is flushed: every observer on the host
//! would get a destroy event per entry.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::metrics::{promtool_lint, samples, scrape};
use common::{netns_inode, prefix, require_root};
use observer::model::record::{ConntrackSummary, Recording};
use observer_lab::{Lab, LabConfig, Observer, RuleMode, Topology};

/// Sends one UDP datagram from each of `argv[1]` new sockets to a closed port on the
/// namespace's loopback (each a new flow for conntrack); prints how many were refused
/// (`EPERM`: conntrack dropped the packet).
const DATAGRAMS: &str = r#"
import socket, sys
refused = 0
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"x", ("127.0.0.1", 9))
    except PermissionError:
        refused += 1
    s.close()
print(refused)
"#;

/// conntrack's figures in one namespace, as the tools print them or observer exports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Figures {
    entries: u64,
    insert_failed: u64,
    drop: u64,
    early_drop: u64,
}

/// What `program` prints in the lab's namespace `netns`; it must succeed.
fn output(lab: &Lab, netns: &str, program: &str, args: &[&str]) -> String {
    let out = lab.run_in(netns, program, args).unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} in {netns}: {out:?}"
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `conntrack -C` and `conntrack -S` (summed over its per-CPU lines) in `netns`.
fn conntrack_figures(lab: &Lab, netns: &str) -> Figures {
    let entries = output(lab, netns, "conntrack", &["-C"])
        .trim()
        .parse()
        .unwrap();
    let mut figures = Figures {
        entries,
        ..Figures::default()
    };
    for field in output(lab, netns, "conntrack", &["-S"]).split_whitespace() {
        let Some((name, value)) = field.split_once('=') else {
            continue;
        };
        let counter = match name {
            "insert_failed" => &mut figures.insert_failed,
            "drop" => &mut figures.drop,
            "early_drop" => &mut figures.early_drop,
            _ => continue,
        };
        *counter += value.parse::<u64>().unwrap();
    }
    figures
}

/// The sample of `metric` for namespace `inode`, if there is one.
fn sample(metrics: &str, metric: &str, inode: u32) -> Option<u64> {
    samples(metrics, metric)
        .into_iter()
        .find(|(labels, _)| labels["netns"] == inode.to_string())
        .map(|(_, value)| value as u64)
}

fn exported(metrics: &str, inode: u32) -> Option<Figures> {
    Some(Figures {
        entries: sample(metrics, "observer_conntrack_entries", inode)?,
        insert_failed: sample(metrics, "observer_conntrack_insert_failed_total", inode)?,
        drop: sample(metrics, "observer_conntrack_drop_total", inode)?,
        early_drop: sample(metrics, "observer_conntrack_early_drop_total", inode)?,
    })
}

/// Waits until observer exports for `netns` what conntrack's tools print there, with
/// their figures the same before and after the scrape (observer reads every 5 s);
/// returns them and the scrape.
fn agreed(lab: &Lab, addr: &str, netns: &str) -> (Figures, String) {
    let inode = netns_inode(netns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let before = conntrack_figures(lab, netns);
        let metrics = scrape(addr, "/metrics");
        let after = conntrack_figures(lab, netns);
        if before == after && exported(&metrics, inode) == Some(before) {
            return (before, metrics);
        }
        assert!(
            Instant::now() < deadline,
            "{netns}: observer's figures {:?} never matched conntrack's {before:?} (then {after:?})",
            exported(&metrics, inode)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Adds `count` UDP entries to the table of `netns` through conntrack itself
/// (`conntrack -R`), 600 s to live, `ASSURED` (never evicted) or not; `batch` keeps
/// their tuples apart from other batches'.
fn add_entries(lab: &Lab, netns: &str, dir: &Path, batch: u16, count: u64, assured: bool) {
    let status = if assured { " -u ASSURED" } else { "" };
    let mut lines = String::new();
    for i in 0..count {
        lines.push_str(&format!(
            "-I -p udp -s 10.250.{}.{batch} -d 10.251.0.1 --sport {} --dport 53 -t 600{status}\n",
            i / 50_000,
            1024 + i % 50_000
        ));
    }
    let file = dir.join(format!("batch{batch}.txt"));
    std::fs::write(&file, lines).unwrap();
    output(lab, netns, "conntrack", &["-R", file.to_str().unwrap()]);
}

/// New flows conntrack refused in `netns` (see `DATAGRAMS`).
fn datagrams(lab: &Lab, netns: &str, count: u32) -> u64 {
    let count = count.to_string();
    let refused = output(lab, netns, "python3", &["-c", DATAGRAMS, &count]);
    refused.trim().parse().unwrap()
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn conntrack_figures_are_what_conntrack_says() {
    require_root();
    let lab = Lab::up(LabConfig {
        topology: Topology::Routed,
        rules: RuleMode::Iptables,
        prefix: prefix("ctp"),
    })
    .expect("lab up");
    let (node, pod) = (lab.node_ns(), lab.pods()[0].ns.as_str());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("conns.jsonl");
    let addr = format!("127.0.0.1:{}", 20000 + std::process::id() % 20000);
    let mut serve = Command::new(env!("CARGO_BIN_EXE_observer"));
    serve
        .args(["serve", "--listen", &addr, "--write"])
        .arg(&log);
    let mut server = Observer::start(serve, false).expect("observer serve attaches");
    // The global value, as the node sees it (read-only there).
    let max: u64 = output(
        &lab,
        node,
        "cat",
        &["/proc/sys/net/netfilter/nf_conntrack_max"],
    )
    .trim()
    .parse()
    .unwrap();

    // The node: what the lab's own checks left is flushed, 5,000 entries added.
    output(&lab, node, "conntrack", &["-F"]);
    add_entries(&lab, node, dir.path(), 1, 5000, true);
    let (known, metrics) = agreed(&lab, &addr, node);
    assert_eq!(known.entries, 5000);
    let inode = netns_inode(node);
    assert_eq!(
        sample(&metrics, "observer_conntrack_max_entries", inode),
        Some(max)
    );

    // A pod: conntrack made to track its own packets, its table full of entries it may
    // evict; each new flow evicts some (early drops).
    for rule in [
        "add table ip pressure",
        "add chain ip pressure out { type filter hook output priority 0; }",
        "add rule ip pressure out ct state new counter",
    ] {
        output(&lab, pod, "nft", &[rule]);
    }
    add_entries(&lab, pod, dir.path(), 3, max, false);
    assert_eq!(
        agreed(&lab, &addr, pod).0,
        Figures {
            entries: max,
            ..Figures::default()
        }
    );
    assert_eq!(
        datagrams(&lab, pod, 5),
        0,
        "evicting, conntrack refuses nothing"
    );
    let (evicting, _) = agreed(&lab, &addr, pod);
    assert!(evicting.early_drop >= 1, "{evicting:?}");
    assert_eq!((evicting.drop, evicting.insert_failed), (0, 0));

    // The node full of entries conntrack may not evict: each new flow is dropped.
    add_entries(&lab, node, dir.path(), 2, max - 5000, true);
    assert_eq!(datagrams(&lab, node, 5), 5, "all refused");
    let (dropping, metrics) = agreed(&lab, &addr, node);
    let full = Figures {
        entries: max,
        drop: 5,
        ..Figures::default()
    };
    assert_eq!(dropping, full);
    promtool_lint(&metrics);
    eprintln!("nf_conntrack_max {max}; node {dropping:?}; pod {evicting:?}");

    let status = server.terminate().unwrap();
    assert!(status.success(), "observer serve exited with {status}");
    let summary = Recording::read(&log)
        .unwrap()
        .summary
        .expect("a summary line");
    // The lab's namespaces are this test's: conntrack counted nothing before observer
    // read them first.
    let peak = |figures: Figures| ConntrackSummary {
        peak_entries: max as u32,
        max_entries: max as u32,
        insert_failed: figures.insert_failed,
        drop: figures.drop,
        early_drop: figures.early_drop,
    };
    let of = |netns: &str| summary.conntrack.get(&netns_inode(netns).to_string());
    assert_eq!(of(node), Some(&peak(dropping)), "{:?}", summary.conntrack);
    assert_eq!(of(pod), Some(&peak(evicting)), "{:?}", summary.conntrack);
}
