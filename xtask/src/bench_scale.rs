//! `cargo xtask bench --services N`: what observer costs on a node with N Services of 3
//! endpoints each (kube-proxy's iptables and nftables formats) and light traffic (2 new
//! connections/s). Its CPU is read from /proc/PID/stat: user + system time of observer
//! and of its children it reaped (`nsenter` exec'ing `iptables-save`, `nft`), over the
//! traffic window that follows observer's first read of the rules; RSS from
//! /proc/PID/status at the window's end. Then one endpoint leaves a Service (a readiness
//! flip): the CPU observer spends until its `endpoints` line is written is the price of
//! one rule change (a full re-read). observer watches every namespace on the host: other
//! labs running meanwhile add to its CPU, so run it on a quiet machine. A benchmark: it
//! asserts nothing.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use observer_lab::{self as lab, Lab, LabConfig, Observer, Proto, RuleMode, Service, Topology};

const PREFIX: &str = "bscale";
/// New connections per second during the window.
const RATE: f64 = 2.0;
/// How long observer may take to read the node's rules for the first time.
const FIRST_READ: Duration = Duration::from_secs(180);
/// How long observer may take to log one endpoint change (a busy machine).
const CHANGE_LOGGED: Duration = Duration::from_secs(60);

/// What one rule format cost.
struct Figures {
    cpu_share: f64,
    rss_kib: u64,
    connections: usize,
    seconds: f64,
    first_read: Duration,
    /// CPU seconds for one endpoint change, and how long after the lab applied it the
    /// log had its line (the log is flushed every second); `None` for an observer that
    /// writes no `endpoints` lines.
    change: Option<(f64, Duration)>,
}

pub fn scale(observer: &Path, services: usize, seconds: f64) -> anyhow::Result<()> {
    println!(
        "observer at scale: {services} Services x 3 endpoints, {RATE} new connections/s for {seconds} s; \
         CPU of observer and its children (iptables-save, nft) from /proc/PID/stat"
    );
    println!(
        "  rules      CPU (% of a core)   RSS (MiB)   connections   first read (s)   one endpoint change: CPU s, logged after s"
    );
    for rules in [RuleMode::Iptables, RuleMode::Nftables] {
        let f = measure(observer, rules, services, seconds)?;
        println!(
            "  {:<9} {:>18.2}   {:>9.1}   {:>11}   {:>14.1}   {:>20}   ({:.1} s window)",
            format!("{rules:?}").to_lowercase(),
            f.cpu_share * 100.0,
            f.rss_kib as f64 / 1024.0,
            f.connections,
            f.first_read.as_secs_f64(),
            f.change
                .map_or("not logged".to_owned(), |(cpu, logged)| format!(
                    "{cpu:.2}, {:.2}",
                    logged.as_secs_f64()
                )),
            f.seconds
        );
    }
    Ok(())
}

fn many(checkout: &Service, count: usize) -> Vec<Service> {
    (0..count)
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

fn measure(
    observer: &Path,
    rules: RuleMode,
    services: usize,
    seconds: f64,
) -> anyhow::Result<Figures> {
    lab::down(PREFIX)?;
    let mut lab = Lab::up(LabConfig {
        topology: Topology::Bridged,
        rules,
        prefix: PREFIX.to_owned(),
    })?;
    let checkout = lab.service("checkout")?.clone();
    let extra = many(&checkout, services);
    let mut targets: Vec<SocketAddrV4> = [0, services / 2, services.saturating_sub(1)]
        .iter()
        .filter_map(|&i| extra.get(i).map(Service::cluster_addr))
        .collect();
    targets.push(checkout.cluster_addr());
    lab.add_services(extra)?;

    let dir = std::env::temp_dir().join(format!("observer-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("conns.jsonl");
    let mut command = Command::new(observer);
    command.args(["record", "--write"]).arg(&log);
    let mut recorder = Observer::start(command, false)?;
    let pid = recorder.pid();

    // The first connection makes observer read the node's rules: wait for that read
    // (its Service lines) before measuring the steady state.
    let started = Instant::now();
    lab::http_fresh(&lab, targets[0], 1)?;
    wait_for(&log, "\"type\":\"service\"", services, FIRST_READ)?;
    let first_read = started.elapsed();

    let before = cpu_ticks(pid)?;
    let window = Instant::now();
    let mut connections = 0;
    while window.elapsed().as_secs_f64() < seconds {
        lab::http_fresh(&lab, targets[connections % targets.len()], 1)?;
        connections += 1;
        let next = Duration::from_secs_f64(connections as f64 / RATE);
        std::thread::sleep(next.saturating_sub(window.elapsed()));
    }
    let after = cpu_ticks(pid)?;
    let elapsed = window.elapsed().as_secs_f64();
    let rss_kib = rss_kib(pid)?;

    let changing = cpu_ticks(pid)?;
    let flipped = &checkout.endpoints[0];
    lab.remove_endpoint("load/svc-0:http", flipped.ip)?;
    let changed = Instant::now();
    let node = std::fs::metadata(Path::new("/run/netns").join(lab.node_ns()))?;
    let line = format!(
        "\"type\":\"endpoints\",\"service\":\"load/svc-0:http\",\"proto\":\"tcp\",\"netns\":{}",
        std::os::unix::fs::MetadataExt::ino(&node)
    );
    let change = match wait_for(&log, &line, 1, CHANGE_LOGGED) {
        Ok(()) => Some((
            (cpu_ticks(pid)? - changing) as f64 / clock_ticks()?,
            changed.elapsed(),
        )),
        Err(_) => None,
    };
    recorder.terminate()?;
    let _ = std::fs::remove_dir_all(&dir);
    drop(lab);
    Ok(Figures {
        cpu_share: (after - before) as f64 / clock_ticks()? / elapsed,
        rss_kib,
        connections,
        seconds: elapsed,
        first_read,
        change,
    })
}

/// Waits until the log (flushed every second) has `count` lines with `marker` or more.
fn wait_for(log: &Path, marker: &str, count: usize, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(marker).count() >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "observer did not write {count} lines with {marker} within {} s",
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// utime + stime + cutime + cstime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at field 3.
    let rest = stat.rsplit_once(')').context("malformed /proc/PID/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields
        .get(11..15)
        .context("short /proc/PID/stat")?
        .iter()
        .map(|f| f.parse::<u64>().context("/proc/PID/stat field"))
        .sum()
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS in /proc/PID/status")
}

fn clock_ticks() -> anyhow::Result<f64> {
    let ticks =
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.context("CLK_TCK unknown")?;
    Ok(ticks as f64)
}
