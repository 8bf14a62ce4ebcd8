//! Root test of observer as the DaemonSet's pod (issue 22, item 4; README "On a kind
//! cluster", path 3): the OCI image of `cargo xtask dist`, unpacked as a runtime pulls
//! it, run by runc on a kind-like node container ([`observer_lab::NodeContainer`]) with
//! the runtime spec translated from deploy/daemonset.yaml (`common::daemonset`): the
//! node's network and PID namespaces (hostNetwork, hostPID), a mount, IPC and UTS
//! namespace of its own (stricter than containerd, which gives a hostNetwork pod the
//! node's UTS namespace: so that pods named by hostname must not be named after the
//! node), exactly the listed capabilities that this machine can grant, the host paths,
//! a read-only root, the user, and the memory limit as its memory cgroup's limit.
//!
//! The node has no sandbox bundles, so pods are named by their hostnames. `/metrics`
//! must count every connection and request exactly per backend and name every backend
//! by its pod, none after the node; the container's stdout must carry the connection log
//! (`serve --write -`) matching `conntrack -E`; the pod's peak memory must stay under the
//! limit with the default `--max-connections`.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::daemonset::{self, DaemonSet, Runtime, capability_number, runtime_spec};
use common::host_client::{HostClientRun, REQUESTS, python_args, route_service_range};
use common::metrics::{per_backend, samples, scrape_in};
use common::{assert_same_decisions, image, only_node, prefix, require_root};
use observer::model::record::{Close, ConnRecord, Recording};
use observer_lab::{
    ConntrackWatch, Lab, LabConfig, Observer, RuleMode, Service, Topology, http_fresh,
    http_keepalive, udp_queries,
};

/// OCI's name of this machine's architecture.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no image for {other}"),
    }
}

/// This process's capability bounding set: what a runtime it starts can grant.
fn bounding_set() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapBnd:"))
        .unwrap();
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

/// The spec for a pod called `hostname` in cgroup `cgroups_path`.
fn spec_for(daemonset: &DaemonSet, hostname: &str, cgroups_path: &str) -> serde_json::Value {
    let bounding = bounding_set();
    let grantable = |name: &str| bounding & (1 << capability_number(name)) != 0;
    runtime_spec(
        daemonset,
        &image::image_config(oci_arch()),
        &Runtime {
            hostname,
            cgroups_path,
            grantable: &grantable,
        },
    )
}

#[test]
#[ignore = "needs the release artifacts (cargo xtask dist): run by cargo xtask test"]
fn the_manifest_becomes_the_runtime_spec_a_runtime_makes() {
    let daemonset = daemonset::read();
    let container = daemonset.container();
    let spec = spec_for(&daemonset, "observer-pod", "observer-pod");
    // hostNetwork and hostPID: no namespace of the pod's own for either.
    let namespaces: Vec<&str> = spec["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["type"].as_str().unwrap())
        .collect();
    assert_eq!(namespaces, ["mount", "uts", "ipc"]);
    assert_eq!(
        spec["process"]["args"],
        serde_json::json!([
            "/observer",
            "serve",
            "--listen",
            "127.0.0.1:9465",
            "--write",
            "-"
        ])
    );
    assert_eq!(spec["root"]["readonly"], true);
    assert_eq!(spec["process"]["user"]["uid"], 0);
    assert_eq!(spec["process"]["noNewPrivileges"], false);
    assert_eq!(
        spec["linux"]["resources"]["memory"]["limit"],
        256 * 1024 * 1024
    );
    // Exactly the added capabilities, less what this machine cannot grant at all: its
    // bounding set lacks CAP_SYS_RESOURCE, which observer needs only on kernels before
    // 5.11 (where maps are counted against the locked-memory limit).
    let granted: Vec<String> =
        serde_json::from_value(spec["process"]["capabilities"]["bounding"].clone()).unwrap();
    let listed: Vec<String> = container
        .security_context
        .capabilities
        .add
        .iter()
        .map(|name| format!("CAP_{name}"))
        .collect();
    let withheld: Vec<&String> = listed.iter().filter(|c| !granted.contains(c)).collect();
    assert!(
        withheld.is_empty() || withheld == ["CAP_SYS_RESOURCE"],
        "{withheld:?}"
    );
    assert_eq!(
        spec["process"]["capabilities"]["effective"],
        spec["process"]["capabilities"]["bounding"]
    );
    // Every host path at its mount path, read-only as listed.
    let binds: Vec<(String, String, String)> = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "bind")
        .map(|m| {
            (
                m["source"].as_str().unwrap().to_owned(),
                m["destination"].as_str().unwrap().to_owned(),
                m["options"][1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        binds,
        [
            ("/sys/kernel/btf", "/sys/kernel/btf", "ro"),
            ("/sys/fs/cgroup", "/sys/fs/cgroup", "ro"),
            ("/run/netns", "/run/netns", "ro"),
        ]
        .map(|(s, d, o)| (s.to_owned(), d.to_owned(), o.to_owned()))
    );
}

/// This process's memory cgroup (v1), as the host sees it: a runtime this process
/// starts puts a relative `cgroupsPath` under it.
fn own_memory_cgroup() -> PathBuf {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = cgroups
        .lines()
        .find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then_some(path)
        })
        .expect("a cgroup v1 memory controller (this test reads memory.max_usage_in_bytes)");
    PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'))
}

/// The cgroups runc makes for the pod (`<own cgroup>/<name>` in every hierarchy), removed
/// on drop when runc could not remove them itself (a test that failed killed it).
struct PodCgroups {
    name: String,
}

impl Drop for PodCgroups {
    fn drop(&mut self) {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for hierarchy in hierarchies.flatten() {
            for line in own.lines() {
                let Some(path) = line.splitn(3, ':').nth(2) else {
                    continue;
                };
                let dir = hierarchy
                    .path()
                    .join(path.trim_start_matches('/'))
                    .join(&self.name);
                // Its processes died with the node; the cgroup empties a moment later.
                for _ in 0..100 {
                    if !dir.exists() || std::fs::remove_dir(&dir).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

fn read_number(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

/// What the clients' own records say each backend of a Service got: connections and
/// requests (0 for an endpoint that got nothing: it is exported all the same).
struct Expected {
    connections: BTreeMap<String, u64>,
    requests: BTreeMap<String, u64>,
}

impl Expected {
    fn new(service: &Service) -> Expected {
        let none: BTreeMap<String, u64> = service
            .endpoint_addrs()
            .iter()
            .map(|addr| (addr.to_string(), 0))
            .collect();
        Expected {
            connections: none.clone(),
            requests: none,
        }
    }

    fn add(&mut self, backend: SocketAddr, connections: u64, requests: u64) {
        *self.connections.entry(backend.to_string()).or_default() += connections;
        *self.requests.entry(backend.to_string()).or_default() += requests;
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn as_the_daemonsets_pod_it_counts_and_names_exactly_and_logs_to_stdout_under_its_memory_limit() {
    require_root();
    let prefix = prefix("dsp");
    let pod_name = format!("observer-{prefix}");
    // Declared before the lab, so removed after the node (and the pod in it) ended.
    let _cgroups = PodCgroups {
        name: pod_name.clone(),
    };
    let lab = Lab::up_in_node_container_without_runtime_bundles(LabConfig {
        topology: Topology::Routed,
        rules: RuleMode::Nftables,
        prefix: prefix.clone(),
    })
    .expect("lab up in a node container");
    let node = lab.node_container().unwrap();
    route_service_range(&lab);
    let daemonset = daemonset::read();
    let container = daemonset.container();

    // The image as a runtime pulls it, in the node; the runtime spec from the manifest.
    let bundle = node.root().join("observer-pod");
    image::unpack(oci_arch(), &bundle);
    let spec = spec_for(&daemonset, &pod_name, &pod_name);
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();

    // runc, run in the node as its runtime would; the container's stdout to a file.
    let dir = tempfile::tempdir().unwrap();
    let stdout_path = dir.path().join("stdout");
    let mut runc = Command::new("/usr/bin/runc");
    runc.args(["run", "--bundle", "/observer-pod"])
        .arg(&pod_name)
        .stdout(std::fs::File::create(&stdout_path).unwrap());
    let watch = ConntrackWatch::start(lab.node_ns()).unwrap();
    let mut pod = Observer::start_with(runc, true, |command| node.exec(command))
        .expect("the DaemonSet's pod attaches");
    let memory = own_memory_cgroup().join(&pod_name);
    assert_eq!(
        read_number(&memory.join("memory.limit_in_bytes")),
        container.memory_limit()
    );

    // Pod clients and a host-network client of the node, each with its own record.
    let backend_of = |pod: &str, port: u16| {
        let ip = lab.pods().iter().find(|p| p.name == pod).unwrap().ip;
        SocketAddr::new(ip.into(), port)
    };
    let checkout = lab.service("checkout").unwrap().clone();
    let dns = lab.service("kube-dns").unwrap().clone();
    let mut tcp = Expected::new(&checkout);
    let mut udp = Expected::new(&dns);
    for answer in http_fresh(&lab, checkout.cluster_addr(), 9).unwrap() {
        tcp.add(backend_of(&answer.pod, checkout.target_port), 1, 1);
    }
    let keepalive = http_keepalive(&lab, checkout.cluster_addr(), 12).unwrap();
    tcp.add(
        backend_of(&keepalive[0].pod, checkout.target_port),
        1,
        keepalive.len() as u64,
    );
    for answer in udp_queries(&lab, dns.cluster_addr(), 5).unwrap() {
        udp.add(backend_of(&answer.pod, dns.target_port), 1, 1);
    }
    let mut host_client_command = Command::new("/usr/bin/python3");
    host_client_command
        .args(python_args(&lab))
        .stdout(std::process::Stdio::piped());
    let host_client = HostClientRun::parse(
        &node
            .exec(&mut host_client_command)
            .unwrap()
            .wait_with_output()
            .unwrap(),
    );
    tcp.add(
        backend_of(&host_client.answers[0], checkout.target_port),
        1,
        REQUESTS,
    );
    udp.add(backend_of(&host_client.udp_answer, dns.target_port), 1, 1);

    // `/metrics` on the node's loopback, as the readiness probe reaches it (and
    // kube-rbac-proxy, which is not run here: it needs an API server).
    let probe = &container.readiness_probe.http_get;
    let addr = format!("{}:{}", probe.host, probe.port);
    let deadline = Instant::now() + Duration::from_secs(20);
    let checkout_name = checkout.port_name_string();
    let dns_name = dns.port_name_string();
    let metrics = loop {
        let metrics = scrape_in(lab.node_ns(), &addr, &probe.path);
        let counted = |service: &str, proto: &str| {
            per_backend(&metrics, "observer_requests_total", service, proto)
        };
        // UDP connections end after the idle timeout (30 s): counted as they start.
        if counted(&checkout_name, "tcp") == tcp.requests
            && counted(&dns_name, "udp") == udp.requests
        {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "requests never matched {:?} and {:?}:\n{metrics}",
            tcp.requests,
            udp.requests
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    for (service, proto, expected) in [(&checkout_name, "tcp", &tcp), (&dns_name, "udp", &udp)] {
        assert_eq!(
            per_backend(&metrics, "observer_connections_total", service, proto),
            expected.connections,
            "{service}"
        );
    }
    assert!(metrics.lines().any(|l| l == "observer_lost_events_total 0"));
    // Every backend named by its pod's hostname (no bundles on this node), none after
    // the node.
    let mut named = 0;
    for (labels, _) in samples(&metrics, "observer_connections_total") {
        let backend: SocketAddr = labels["backend"].parse().unwrap();
        let pod = lab
            .pods()
            .iter()
            .find(|p| std::net::IpAddr::V4(p.ip) == backend.ip())
            .unwrap();
        assert_eq!(labels.get("backend_pod"), Some(&pod.name), "{labels:?}");
        named += 1;
    }
    assert_eq!(named, lab.pods().len(), "{metrics}");
    assert!(
        !metrics.contains(&format!("=\"{}\"", node.hostname())),
        "{metrics}"
    );

    // The peak memory of the pod's cgroup, maps included, with the default table size.
    let peak = read_number(&memory.join("memory.max_usage_in_bytes"));
    let failures = read_number(&memory.join("memory.failcnt"));
    eprintln!(
        "observer pod: peak memory {:.1} MiB of its {} MiB limit",
        peak as f64 / f64::from(1 << 20),
        container.memory_limit() >> 20
    );
    assert!(peak < container.memory_limit(), "{peak}");
    assert_eq!(failures, 0, "the pod hit its memory limit");

    // SIGTERM to runc reaches observer; its stdout carried the connection log.
    let status = pod.terminate().unwrap();
    assert!(status.success(), "the pod exited with {status}");
    let events = watch.stop().unwrap();
    let text = std::fs::read_to_string(&stdout_path).unwrap();
    let mut recording = Recording::parse("the pod's stdout", &text).unwrap();
    let summary = recording.summary.clone().expect("a summary line on stdout");
    assert_eq!(
        (summary.lost_events, summary.lost_connections),
        (0, 0),
        "{summary:?}"
    );
    only_node(&mut recording, lab.node_ns());
    let conns: Vec<&ConnRecord> = recording.conns.iter().collect();
    assert_same_decisions(&conns, &events, lab.node_ns());
    let total: u64 = tcp
        .connections
        .values()
        .chain(udp.connections.values())
        .sum();
    assert_eq!(conns.len() as u64, total);
    // Still open at exit: the manifest keeps the default 30 s idle timeout.
    host_client.assert_recorded(&lab, &conns, Close::Open);
}
