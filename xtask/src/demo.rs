//! `cargo xtask demo`: a simulated kind node with traffic that pins, and observer's live
//! view on it, so a newcomer sees keep-alive pinning within seconds without a cluster,
//! and what goes wrong on real nodes: a pod whose server stops while it is still an
//! endpoint (refused connections), then fails its readiness probe and leaves the
//! Service, then comes back; a Service with no endpoints (rejected connections); real
//! DNS lookups under kube's resolv.conf (`ndots:5` search walks). Quitting the view (q or
//! Ctrl-C) tears everything down.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    process::Command,
    sync::{
        RwLock,
        atomic::{AtomicBool, Ordering},
    },
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
    let mut lab = Lab::up(LabConfig {
        topology: args.topology,
        rules: args.rules,
        prefix: PREFIX.to_owned(),
    })?;
    // A kind node's default route (no uplink still), so that the rules' REJECT of a
    // Service without endpoints is reached; that Service; a DNS server behind kube-dns.
    lab.add_default_route()?;
    lab.add_service(empty_service())?;
    let _dns = lab.serve_dns(&[("www.example.com", Ipv4Addr::new(192, 0, 2, 10))])?;
    // Clients take the lab for reading, the failure timeline for writing (a readiness
    // flip rewrites the rules): clients are short, so a flip waits a few seconds at most.
    let lab = RwLock::new(lab);
    let stop = AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        for client in CLIENTS {
            let (lab, stop) = (&lab, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(lab) = lab.read() else { return };
                    // Errors are expected when the demo stops mid-request.
                    let _ = client(&lab);
                }
            });
        }
        scope.spawn(|| failures(&lab, &stop));
        // Read and let go: the failure timeline needs the lab for writing.
        let (runtime_root, client_ns) = {
            let lab = lab.read().expect("no client panics holding the lab");
            (lab.runtime_root(), lab.client_ns().to_owned())
        };
        // Pod names from the runtime state the lab writes as containerd would.
        let status = Command::new(&observer)
            .args(["--idle-timeout", "5"])
            .arg("--runtime-root")
            .arg(runtime_root)
            .status();
        stop.store(true, Ordering::Relaxed);
        // End the clients that are still talking so the threads notice the stop.
        let _ = Command::new("ip")
            .args(["netns", "pids", &client_ns])
            .output()
            .map(|out| {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    // A client may end on its own meanwhile: no word about it.
                    let _ = Command::new("kill")
                        .arg(pid)
                        .stderr(std::process::Stdio::null())
                        .status();
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
const CLIENTS: [Client; 6] = [keepalive, fresh, node_fetch, dns, node_port, rejected];

/// `shop/empty-web:http`: a Service scaled to zero, which kube-proxy's rules reject.
fn empty_service() -> lab::Service {
    lab::Service {
        namespace: "shop".into(),
        name: "empty-web".into(),
        port_name: "http".into(),
        proto: lab::Proto::Tcp,
        cluster_ip: Ipv4Addr::new(10, 96, 200, 1),
        port: 80,
        target_port: 8080,
        node_port: None,
        traffic: Default::default(),
        endpoints: Vec::new(),
    }
}

/// The failure timeline, every minute: at 15 s checkout-b's server stops (it is still an
/// endpoint: its new connections are refused); 11 s later it fails its readiness probe
/// (period 10 s x failure threshold, plus the sync) and leaves the Service's endpoints;
/// at 45 s it serves and is ready again.
fn failures(lab: &RwLock<Lab>, stop: &AtomicBool) {
    let pod = lab.read().ok().and_then(|lab| {
        lab.pods()
            .iter()
            .find(|p| p.name == "checkout-b")
            .map(|p| p.ip)
    });
    let Some(pod) = pod else { return };
    let service = "shop/checkout:http";
    /// What happens to the pod, after how many seconds.
    type Step = (u64, fn(&mut Lab, Ipv4Addr, &str) -> anyhow::Result<()>);
    let steps: [Step; 3] = [
        (15, |lab, pod, _| lab.stop_server(pod)),
        (11, |lab, pod, service| lab.remove_endpoint(service, pod)),
        (19, |lab, pod, service| {
            lab.restart_server(pod)?;
            lab.add_endpoint(service, pod)
        }),
    ];
    loop {
        for (wait, step) in steps {
            if !sleep_unless_stopped(Duration::from_secs(wait), stop) {
                return;
            }
            let Ok(mut lab) = lab.write() else { return };
            if let Err(err) = step(&mut lab, pod, service) {
                eprintln!("demo: {err:#}");
                return;
            }
        }
        if !sleep_unless_stopped(Duration::from_secs(15), stop) {
            return;
        }
    }
}

/// Sleeps `duration` in small steps; false when the demo stopped meanwhile.
fn sleep_unless_stopped(duration: Duration, stop: &AtomicBool) -> bool {
    let deadline = std::time::Instant::now() + duration;
    while std::time::Instant::now() < deadline {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    !stop.load(Ordering::Relaxed)
}

/// Attempts to the Service without endpoints: rejected by the node's rules.
fn rejected(lab: &Lab) -> anyhow::Result<()> {
    let target = SocketAddrV4::new(Ipv4Addr::new(10, 96, 200, 1), 80);
    lab::attempts(lab, lab::Proto::Tcp, target, 1, Duration::from_secs(1), 1)?;
    std::thread::sleep(Duration::from_secs(2));
    Ok(())
}

fn checkout(lab: &Lab) -> std::net::SocketAddrV4 {
    lab.service("checkout")
        .expect("the lab defines it")
        .cluster_addr()
}

/// A keep-alive client: one connection, 5 requests a second for 6 s, all to one pod.
fn keepalive(lab: &Lab) -> anyhow::Result<()> {
    lab::http_keepalive_paced(lab, checkout(lab), 30, Duration::from_millis(200)).map(drop)
}

/// Fresh connections: these spread across the pods as the rules intend.
fn fresh(lab: &Lab) -> anyhow::Result<()> {
    lab::http_fresh(lab, checkout(lab), 5)?;
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// Fresh connections through the NodePort on the node's address: another frontend.
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

/// Real DNS lookups through glibc under kube's resolv.conf (`ndots:5`): a short
/// Service name, a namespace-qualified one, and an external name that walks every
/// search domain (NXDOMAIN) before its answer.
fn dns(lab: &Lab) -> anyhow::Result<()> {
    lab::resolve(lab, &["checkout", "checkout.shop", "www.example.com"])?;
    std::thread::sleep(Duration::from_secs(3));
    Ok(())
}
