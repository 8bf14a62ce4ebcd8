//! `cargo xtask demo`: a simulated kind node with traffic that pins, and observer's live
//! view on it, so a newcomer sees keep-alive pinning within seconds without a cluster.
//! Quitting the view (q or Ctrl-C) tears everything down.

use std::{
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail};

use observer_lab::{self as lab, Lab, LabConfig, RuleMode, Topology};

const PREFIX: &str = "demo";

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    #[arg(long, value_enum, default_value_t = Topology::Bridged)]
    topology: Topology,
    #[arg(long, value_enum, default_value_t = RuleMode::Iptables)]
    rules: RuleMode,
}

/// Builds observer (debug: quickest to build, fast enough for the demo's traffic).
pub fn build_observer(release: bool) -> anyhow::Result<std::path::PathBuf> {
    let mut cargo = Command::new("cargo");
    cargo.args(["build", "--package", "observer", "--bin", "observer"]);
    if release {
        cargo.arg("--release");
    }
    crate::setup::run(&mut cargo)?;
    let dir = if release { "release" } else { "debug" };
    // Where cargo put it: CARGO_TARGET_DIR when set.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| crate::workspace_root().join("target"), Into::into);
    Ok(target.join(dir).join("observer"))
}

pub fn demo(args: DemoArgs) -> anyhow::Result<()> {
    crate::setup::setup()?;
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the demo builds network namespaces and loads eBPF programs; run it as root: sudo -E cargo xtask demo"
        );
    }
    let observer = build_observer(false)?;
    // Leftovers of a demo that was killed before it could clean up.
    lab::down(PREFIX)?;
    eprintln!(
        "demo: building a simulated kind node ({:?}, {:?} rules)...",
        args.topology, args.rules
    );
    let lab = Lab::up(LabConfig {
        topology: args.topology,
        rules: args.rules,
        prefix: PREFIX.to_owned(),
    })?;
    let stop = AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        for client in CLIENTS {
            let (lab, stop) = (&lab, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // Errors are expected when the demo stops mid-request.
                    let _ = client(lab);
                }
            });
        }
        // Pod names from the runtime state the lab writes as containerd would.
        let status = Command::new(&observer)
            .args(["--idle-timeout", "5"])
            .arg("--runtime-root")
            .arg(lab.runtime_root())
            .status();
        stop.store(true, Ordering::Relaxed);
        // End the clients that are still talking so the threads notice the stop.
        let _ = Command::new("ip")
            .args(["netns", "pids", lab.client_ns()])
            .output()
            .map(|out| {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").arg(pid).status();
                }
            });
        status.context("cannot start observer")
    })?;
    drop(lab);
    eprintln!("demo: lab removed");
    if !result.success() {
        bail!("observer exited with {result}");
    }
    Ok(())
}

type Client = fn(&Lab) -> anyhow::Result<()>;

/// The demo's traffic: each runs in a loop on its own thread.
const CLIENTS: [Client; 5] = [keepalive, fresh, node_fetch, dns, node_port];

fn checkout(lab: &Lab) -> std::net::SocketAddrV4 {
    lab.service("checkout")
        .expect("the lab defines it")
        .cluster_addr()
}

/// A keep-alive client: one connection, 5 requests a second for 20 s, all to one pod.
fn keepalive(lab: &Lab) -> anyhow::Result<()> {
    lab::http_keepalive_paced(lab, checkout(lab), 100, Duration::from_millis(200)).map(drop)
}

/// Fresh connections: these spread across the pods as the rules intend.
fn fresh(lab: &Lab) -> anyhow::Result<()> {
    lab::http_fresh(lab, checkout(lab), 5)?;
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// Fresh connections through the NodePort on the node's address: another door.
fn node_port(lab: &Lab) -> anyhow::Result<()> {
    let checkout = lab.service("checkout").expect("the lab defines it");
    let port = checkout
        .node_port
        .expect("the lab gives checkout a NodePort");
    lab::http_fresh(
        lab,
        std::net::SocketAddrV4::new(lab::spec::NODE_IP, port),
        2,
    )?;
    std::thread::sleep(Duration::from_secs(1));
    Ok(())
}

/// Node's fetch: keep-alive by default, so 30 requests ride on one or two connections.
fn node_fetch(lab: &Lab) -> anyhow::Result<()> {
    lab::node_fetch(lab, checkout(lab), 30)?;
    std::thread::sleep(Duration::from_secs(3));
    Ok(())
}

/// DNS-like UDP queries, each from a new socket.
fn dns(lab: &Lab) -> anyhow::Result<()> {
    let dns = lab
        .service("kube-dns")
        .expect("the lab defines it")
        .cluster_addr();
    lab::udp_queries(lab, dns, 3)?;
    std::thread::sleep(Duration::from_secs(1));
    Ok(())
}
