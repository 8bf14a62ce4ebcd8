//! The lab: a simulated kind node built from network namespaces, with kube-proxy's rules
//! in its exact iptables or nftables format, real servers in pod namespaces and real
//! clients in a client namespace. The kernel's conntrack and NAT paths are the real ones.
//!
//! # Topology (addresses as in kind)
//!
//! - `{prefix}-node`: the node. No uplink at all, so a packet no rule DNATs can never leave
//!   the machine. `ip_forward=1`. Bridged: bridge `cni0` 10.244.1.1/24 with every pod's veth
//!   as a port and br_netfilter on (`bridge-nf-call-iptables=1`). Routed (kindnet/ptp): no
//!   bridge; every host-side veth carries 10.244.1.1/32 and a /32 route to its pod.
//! - `{prefix}-pod-<name>`: `eth0` 10.244.1.X, default route via 10.244.1.1, running
//!   `scripts/pod_server.py` (HTTP/1.1 keep-alive on 8080 and UDP on 5353, both answering with
//!   the pod's name): checkout-a/b/c = .12-.14, dns-a/b = .20-.21.
//! - `{prefix}-client`: a pod too, 10.244.1.9.
//! - Services: `shop/checkout:http` TCP 10.96.35.226:80 -> checkout pods :8080, NodePort
//!   30080; `kube-system/kube-dns:dns` UDP 10.96.0.10:53 -> dns pods :5353.
//!
//! Nothing is added to the host namespace except the netns files under /run/netns. State
//! (scripts, logs, pids) lives in `/run/observer-lab/<prefix>/`.
//!
//! # Library API (observer's root integration tests use it)
//!
//! ```no_run
//! use observer_lab::{ConntrackWatch, Lab, LabConfig, RuleMode, Topology, http_fresh};
//! # fn main() -> anyhow::Result<()> {
//! let mut lab = Lab::up(LabConfig {
//!     topology: Topology::Bridged,
//!     rules: RuleMode::Nftables,
//!     prefix: "mytest1".into(), // [a-z0-9], unique per test
//! })?; // returns once every server answers, directly and through its Service
//! let checkout = lab.services()[0].clone();
//! let watch = ConntrackWatch::start(lab.node_ns())?;
//! let answers = http_fresh(&lab, checkout.cluster_addr(), 30)?; // client's own record
//! let events = watch.stop()?; // the kernel's record: one NEW entry per connection
//! lab.remove_endpoint("shop/checkout:http", "10.244.1.13".parse()?)?; // readiness flip
//! println!("{}", lab.rules_dump()?);
//! drop(lab); // kills every process and deletes every namespace, also on panic
//! # Ok(()) }
//! ```
//!
//! - [`Lab::up`], [`Lab::node_ns`], [`Lab::client_ns`], [`Lab::services`], [`Lab::pods`],
//!   [`Lab::run_in`], [`Lab::remove_endpoint`], [`Lab::rules_dump`]; dropping a [`Lab`]
//!   tears it down.
//! - Pods by name: [`Lab::runtime_root`] holds containerd-style sandbox bundles for every
//!   pod (see [`runtime`]), [`Lab::pod_names`] the `namespace/pod` each address must get.
//! - [`ConntrackWatch`]: `conntrack -E -e NEW` in a namespace, parsed into [`CtEvent`]s.
//! - Clients, each returning its own ground truth: [`http_fresh`], [`http_keepalive`],
//!   [`node_fetch`], [`udp_queries`].
//! - Pure rule generation, unit-tested without root: [`iptables::sync`], [`nftables::sync`].
//! - [`down`] removes a lab by prefix (also a crashed one); [`namespaces`] lists what exists.

mod clients;
mod conntrack;
mod names;
mod sys;

pub mod cli;
pub mod iptables;
pub mod nftables;
pub mod runtime;
pub mod spec;

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

pub use clients::{
    Answer, http_fresh, http_keepalive, http_keepalive_paced, node_fetch, udp_queries,
};
pub use conntrack::{ConntrackWatch, CtEvent};
pub use spec::{Pod, Proto, Service};

use spec::NODE_IP;
use sys::{Tools, end_process, in_netns, is_lab_netns, list_netns, run, run_with_input, state_dir};

const POD_SERVER_PY: &str = include_str!("../scripts/pod_server.py");
const CLIENTS_PY: &str = include_str!("../scripts/clients.py");
const NODE_FETCH_MJS: &str = include_str!("../scripts/node_fetch.mjs");

/// How pods attach to the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// A `cni0` bridge with br_netfilter (bridge/flannel-like CNI).
    Bridged,
    /// Point-to-point veths with /32 routes (kindnet/ptp).
    Routed,
}

/// Which kube-proxy mode writes the node's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleMode {
    /// `iptables-restore` of KUBE-SERVICES / KUBE-SVC-* / KUBE-SEP-* chains.
    Iptables,
    /// `nft -f` of `table ip kube-proxy` with verdict maps and numgen.
    Nftables,
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Topology::Bridged => "bridged",
            Topology::Routed => "routed",
        })
    }
}

impl std::fmt::Display for RuleMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RuleMode::Iptables => "iptables",
            RuleMode::Nftables => "nftables",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabConfig {
    pub topology: Topology,
    pub rules: RuleMode,
    /// Namespace name prefix: 1-16 characters of [a-z0-9]; unique per concurrent lab.
    pub prefix: String,
}

/// What `lab.json` in the state directory records (for `lab status`).
#[derive(Debug, Serialize, Deserialize)]
struct LabState {
    topology: Topology,
    rules: RuleMode,
    server_pids: Vec<u32>,
}

/// A running lab. Dropping it kills its processes and deletes its namespaces.
pub struct Lab {
    config: LabConfig,
    tools: Tools,
    node_ns: String,
    client_ns: String,
    pods: Vec<Pod>,
    services: Vec<Service>,
    state_dir: PathBuf,
    servers: Vec<Child>,
    /// nftables chains a sync left empty, and when: deleted by the next sync a second later.
    stale_nft_chains: Vec<(String, Instant)>,
    /// Set by `cargo xtask lab up`: the lab outlives this process.
    detached: bool,
}

fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    let ok = (1..=16).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok {
        bail!("lab prefix `{prefix}` is not 1-16 characters of [a-z0-9]");
    }
    Ok(())
}

fn check_root() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the lab needs root: it creates network namespaces and loads netfilter rules");
    }
    Ok(())
}

/// The host-side veth of a pod (interface names have at most 15 bytes).
fn veth_name(pod: &str) -> String {
    format!("veth-{pod}").chars().take(15).collect()
}

/// The namespaces of the lab with this prefix that exist now.
pub fn namespaces(prefix: &str) -> anyhow::Result<Vec<String>> {
    check_prefix(prefix)?;
    let ip = sys::find_tool("ip", "iproute2")?;
    Ok(list_netns(&ip)?
        .into_iter()
        .filter(|n| is_lab_netns(prefix, n))
        .collect())
}

/// Removes everything the lab with this prefix made: its processes (found through its
/// namespaces), its namespaces and its state directory. Returns what it removed.
pub fn down(prefix: &str) -> anyhow::Result<Vec<String>> {
    check_root()?;
    let ip = sys::find_tool("ip", "iproute2")?;
    let mut removed = Vec::new();
    for ns in namespaces(prefix)? {
        sys::remove_netns(&ip, &ns)?;
        removed.push(ns);
    }
    let dir = state_dir(prefix);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("could not remove {}", dir.display()))?;
        removed.push(dir.display().to_string());
    }
    Ok(removed)
}

impl Lab {
    /// Builds the lab and returns once every server answers, directly and through its
    /// Service. Fails if a lab with the same prefix exists.
    pub fn up(config: LabConfig) -> anyhow::Result<Lab> {
        check_root()?;
        check_prefix(&config.prefix)?;
        let tools = Tools::find()?;
        let prefix = config.prefix.clone();
        let existing: Vec<String> = list_netns(&tools.ip)?
            .into_iter()
            .filter(|n| is_lab_netns(&prefix, n))
            .collect();
        let dir = state_dir(&prefix);
        if !existing.is_empty() || dir.exists() {
            let mut what = existing;
            if dir.exists() {
                what.push(dir.display().to_string());
            }
            bail!(
                "a lab with prefix `{prefix}` already exists ({}); `cargo xtask lab down --prefix {prefix}` removes it",
                what.join(", ")
            );
        }
        let pods = spec::pods(&prefix);
        let services = spec::services(&pods);
        let mut lab = Lab {
            node_ns: format!("{prefix}-node"),
            client_ns: format!("{prefix}-client"),
            config,
            tools,
            pods,
            services,
            state_dir: dir,
            servers: Vec::new(),
            stale_nft_chains: Vec::new(),
            detached: false,
        };
        // From here on, dropping `lab` on an error removes whatever was built.
        lab.build()?;
        Ok(lab)
    }

    pub fn config(&self) -> &LabConfig {
        &self.config
    }

    pub fn node_ns(&self) -> &str {
        &self.node_ns
    }

    pub fn client_ns(&self) -> &str {
        &self.client_ns
    }

    /// The Service ports with their current endpoints.
    pub fn services(&self) -> &[Service] {
        &self.services
    }

    /// The serving pods (the client is not one of them).
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    fn all_namespaces(&self) -> Vec<String> {
        let mut all = vec![self.node_ns.clone(), self.client_ns.clone()];
        all.extend(self.pods.iter().map(|p| p.ns.clone()));
        all
    }

    /// Runs `program` in one of this lab's namespaces (`ip netns exec`) and returns its
    /// output whatever its exit status.
    pub fn run_in(&self, netns: &str, program: &str, args: &[&str]) -> anyhow::Result<Output> {
        if !self.all_namespaces().iter().any(|n| n == netns) {
            bail!(
                "`{netns}` is not a namespace of lab `{}`",
                self.config.prefix
            );
        }
        in_netns(&self.tools.ip, netns, program)
            .args(args)
            .output()
            .with_context(|| format!("could not run `{program}` in {netns}"))
    }

    /// Takes `pod_ip` out of a Service port's endpoints (`"ns/name:port"`) and rewrites
    /// the rules as kube-proxy does after the readiness flip: a partial sync through
    /// `iptables-restore --noflush` or one `nft -f` transaction, then, for UDP, deleting
    /// the conntrack entries that still point at the removed endpoint.
    /// The Service called `name` (e.g. `checkout`).
    pub fn service(&self, name: &str) -> anyhow::Result<&Service> {
        self.services
            .iter()
            .find(|s| s.name == name)
            .with_context(|| format!("the lab has no Service called {name}"))
    }

    /// Adds a Service port (e.g. the benchmark's sink) and syncs the rules as kube-proxy
    /// would when a Service is created.
    pub fn add_service(&mut self, service: Service) -> anyhow::Result<()> {
        if self
            .services
            .iter()
            .any(|s| s.port_name_string() == service.port_name_string())
        {
            bail!(
                "the lab already has Service port `{}`",
                service.port_name_string()
            );
        }
        let previous = self.services.clone();
        self.services.push(service);
        if let Err(e) = self.sync_rules(Some(&previous)) {
            self.services = previous;
            return Err(e);
        }
        Ok(())
    }

    pub fn remove_endpoint(&mut self, service: &str, pod_ip: Ipv4Addr) -> anyhow::Result<()> {
        let Some(idx) = self
            .services
            .iter()
            .position(|s| s.port_name_string() == service)
        else {
            let known: Vec<String> = self
                .services
                .iter()
                .map(Service::port_name_string)
                .collect();
            bail!(
                "the lab has no Service port `{service}` (it has {})",
                known.join(", ")
            );
        };
        let previous = self.services.clone();
        let svc = &mut self.services[idx];
        svc.endpoints.retain(|p| p.ip != pod_ip);
        if svc.endpoints.len() == previous[idx].endpoints.len() {
            bail!("{pod_ip} is not an endpoint of {service}");
        }
        let (proto, cluster_ip) = (svc.proto, svc.cluster_ip);
        if let Err(e) = self.sync_rules(Some(&previous)) {
            self.services = previous;
            return Err(e);
        }
        if proto == Proto::Udp {
            // conntrack exits 1 when no entry matched: that is fine.
            let _ = in_netns(&self.tools.ip, &self.node_ns, &self.tools.conntrack)
                .args(["-D", "-p", "udp", "--orig-dst", &cluster_ip.to_string()])
                .args(["--reply-src", &pod_ip.to_string()])
                .output();
        }
        Ok(())
    }

    /// The node's NAT rules: `iptables-save -t nat`, or `nft -j list table ip kube-proxy`.
    pub fn rules_dump(&self) -> anyhow::Result<String> {
        let out = match self.config.rules {
            RuleMode::Iptables => {
                run(
                    in_netns(&self.tools.ip, &self.node_ns, &self.tools.iptables_save)
                        .args(["-t", "nat"]),
                )?
            }
            RuleMode::Nftables => run(in_netns(&self.tools.ip, &self.node_ns, &self.tools.nft)
                .args(["-j", "list", "table", "ip", "kube-proxy"]))?,
        };
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Keeps the lab running after this process exits (`cargo xtask lab up`).
    pub(crate) fn detach(mut self) {
        self.detached = true;
    }

    fn build(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("could not create {}", self.state_dir.display()))?;
        for (name, text) in [
            ("pod_server.py", POD_SERVER_PY),
            ("clients.py", CLIENTS_PY),
            ("node_fetch.mjs", NODE_FETCH_MJS),
        ] {
            let path = self.state_dir.join(name);
            std::fs::write(&path, text)
                .with_context(|| format!("could not write {}", path.display()))?;
        }
        self.build_topology()?;
        self.sync_rules(None)?;
        self.start_servers()?;
        self.wait_until_answering()
    }

    fn ip_batch(&self, netns: &str, commands: &[String]) -> anyhow::Result<()> {
        let mut input = commands.join("\n");
        input.push('\n');
        run_with_input(
            Command::new(&self.tools.ip).args(["-n", netns, "-batch", "-"]),
            &input,
        )
        .with_context(|| format!("could not configure {netns}"))?;
        Ok(())
    }

    fn sysctls(&self, netns: &str, settings: &[(&str, &str)]) -> anyhow::Result<()> {
        let script: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("echo {v} > /proc/sys/{k}"))
            .collect();
        run(in_netns(&self.tools.ip, netns, "/bin/sh").args(["-c", &script.join(" && ")]))
            .with_context(|| format!("could not set sysctls in {netns}"))?;
        Ok(())
    }

    fn build_topology(&mut self) -> anyhow::Result<()> {
        let bridged = self.config.topology == Topology::Bridged;
        let client = self.client_pod();
        let members: Vec<Pod> = self
            .pods
            .iter()
            .cloned()
            .chain(std::iter::once(client))
            .collect();
        // No IPv6: nothing but the lab's IPv4 traffic reaches conntrack.
        let no_ipv6 = [
            ("net/ipv6/conf/all/disable_ipv6", "1"),
            ("net/ipv6/conf/default/disable_ipv6", "1"),
        ];
        for ns in self.all_namespaces() {
            run(Command::new(&self.tools.ip).args(["netns", "add", &ns]))?;
            self.sysctls(&ns, &no_ipv6)?;
        }
        let node = self.node_ns.clone();
        self.sysctls(
            &node,
            &[
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv4/conf/all/route_localnet", "1"),
            ],
        )?;
        let mut node_cmds = vec!["link set lo up".to_string()];
        if bridged {
            let has_bridge_nf = in_netns(&self.tools.ip, &node, "/bin/sh")
                .args(["-c", "test -d /proc/sys/net/bridge"])
                .status()
                .context("could not look for /proc/sys/net/bridge")?
                .success();
            if !has_bridge_nf {
                bail!(
                    "the bridged topology needs br_netfilter, but /proc/sys/net/bridge does not exist in {node} (load the br_netfilter module, or use --topology routed)"
                );
            }
            self.sysctls(&node, &[("net/bridge/bridge-nf-call-iptables", "1")])?;
            node_cmds.extend([
                "link add cni0 type bridge".to_string(),
                format!("addr add {NODE_IP}/24 dev cni0"),
                "link set cni0 up".to_string(),
            ]);
        }
        for pod in &members {
            let veth = veth_name(&pod.name);
            node_cmds.push(format!(
                "link add {veth} type veth peer name eth0 netns {}",
                pod.ns
            ));
            if bridged {
                node_cmds.extend([
                    format!("link set {veth} master cni0"),
                    format!("link set {veth} type bridge_slave hairpin on"),
                    format!("link set {veth} up"),
                ]);
            } else {
                node_cmds.extend([
                    format!("addr add {NODE_IP}/32 dev {veth}"),
                    format!("link set {veth} up"),
                    format!("route add {}/32 dev {veth}", pod.ip),
                ]);
            }
        }
        self.ip_batch(&node, &node_cmds)?;
        runtime::write(&self.state_dir, &self.config.prefix, &members)?;
        for pod in &members {
            let cmds = if bridged {
                vec![
                    "link set lo up".to_string(),
                    format!("addr add {}/24 dev eth0", pod.ip),
                    "link set eth0 up".to_string(),
                    format!("route add default via {NODE_IP} dev eth0"),
                ]
            } else {
                vec![
                    "link set lo up".to_string(),
                    format!("addr add {}/32 dev eth0", pod.ip),
                    "link set eth0 up".to_string(),
                    format!("route add default via {NODE_IP} dev eth0 onlink"),
                ]
            };
            self.ip_batch(&pod.ns, &cmds)?;
        }
        Ok(())
    }

    /// Writes the rules for the current Services, as kube-proxy's sync loop does:
    /// `previous = None` is its first (full) sync.
    fn sync_rules(&mut self, previous: Option<&[Service]>) -> anyhow::Result<()> {
        let ip = self.tools.ip.clone();
        match self.config.rules {
            RuleMode::Iptables => {
                let restore = || {
                    let mut cmd = in_netns(&ip, &self.node_ns, &self.tools.iptables_restore);
                    cmd.args(["-w", "5", "--noflush", "--counters"]);
                    cmd
                };
                let existing = match previous {
                    None => {
                        run_with_input(&mut restore(), &iptables::setup())
                            .context("could not load kube-proxy's iptables jump rules")?;
                        Vec::new()
                    }
                    Some(_) => {
                        let save = run(in_netns(&ip, &self.node_ns, &self.tools.iptables_save)
                            .args(["-t", "nat"]))?;
                        iptables::chains_in_save(&String::from_utf8_lossy(&save.stdout))
                    }
                };
                run_with_input(
                    &mut restore(),
                    &iptables::sync(&self.services, previous, &existing),
                )
                .context("could not load kube-proxy's iptables rules")?;
            }
            RuleMode::Nftables => {
                let nft_f = || {
                    let mut cmd = in_netns(&ip, &self.node_ns, &self.tools.nft);
                    cmd.args(["-f", "-"]);
                    cmd
                };
                let second_ago = Instant::now() - Duration::from_secs(1);
                let (old, young): (Vec<_>, Vec<_>) = std::mem::take(&mut self.stale_nft_chains)
                    .into_iter()
                    .partition(|(_, t)| *t < second_ago);
                self.stale_nft_chains = young;
                if !old.is_empty() {
                    let chains: Vec<String> = old.into_iter().map(|(c, _)| c).collect();
                    run_with_input(&mut nft_f(), &nftables::delete_chains(&chains))
                        .context("could not delete stale nftables chains")?;
                }
                let existing = match previous {
                    None => Vec::new(),
                    Some(_) => {
                        let list = run(in_netns(&ip, &self.node_ns, &self.tools.nft)
                            .args(["-j", "list", "chains", "ip"]))?;
                        nftables::chains_in_json(&String::from_utf8_lossy(&list.stdout))
                            .context("could not read `nft -j list chains`")?
                    }
                };
                let sync = nftables::sync(&self.services, previous, &existing);
                run_with_input(&mut nft_f(), &sync.script)
                    .context("could not load kube-proxy's nftables rules")?;
                let now = Instant::now();
                self.stale_nft_chains
                    .extend(sync.stale_chains.into_iter().map(|c| (c, now)));
            }
        }
        Ok(())
    }

    fn start_servers(&mut self) -> anyhow::Result<()> {
        let script = self.state_dir.join("pod_server.py");
        for pod in &self.pods {
            let log_path = self.state_dir.join(format!("{}.log", pod.name));
            let log = File::create(&log_path)
                .with_context(|| format!("could not create {}", log_path.display()))?;
            let child = in_netns(&self.tools.ip, &pod.ns, &self.tools.python3)
                .arg("-u")
                .arg(&script)
                .args(["--name", &pod.name])
                .args([
                    "--http-port",
                    &pod.http_port.to_string(),
                    "--udp-port",
                    &pod.udp_port.to_string(),
                ])
                .arg("--ready-file")
                .arg(self.ready_file(pod))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                // Not in the terminal's process group: ^C after `lab up` leaves it running.
                .process_group(0)
                .spawn()
                .with_context(|| format!("could not start the server of pod {}", pod.name))?;
            self.servers.push(child);
        }
        let state = LabState {
            topology: self.config.topology,
            rules: self.config.rules,
            server_pids: self.servers.iter().map(Child::id).collect(),
        };
        std::fs::write(
            self.state_dir.join("lab.json"),
            serde_json::to_string_pretty(&state)?,
        )?;
        Ok(())
    }

    fn ready_file(&self, pod: &Pod) -> PathBuf {
        self.state_dir.join(format!("{}.ready", pod.name))
    }

    fn wait_until_answering(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (i, pod) in self.pods.iter().enumerate() {
            while !self.ready_file(pod).exists() {
                if let Some(status) = self.servers[i].try_wait()? {
                    let log =
                        std::fs::read_to_string(self.state_dir.join(format!("{}.log", pod.name)))
                            .unwrap_or_default();
                    bail!(
                        "the server of pod {} exited ({status}): {}",
                        pod.name,
                        log.trim()
                    );
                }
                if Instant::now() > deadline {
                    bail!("the server of pod {} did not start within 10 s", pod.name);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // Every pod directly, then every Service through the node's rules.
        let mut targets: Vec<(String, Option<&str>)> = Vec::new();
        for pod in &self.pods {
            targets.push((format!("tcp:{}:{}", pod.ip, pod.http_port), Some(&pod.name)));
            targets.push((format!("udp:{}:{}", pod.ip, pod.udp_port), Some(&pod.name)));
        }
        for svc in &self.services {
            targets.push((
                format!("{}:{}:{}", svc.proto, svc.cluster_ip, svc.port),
                None,
            ));
            if let Some(np) = svc.node_port {
                targets.push((format!("{}:{NODE_IP}:{np}", svc.proto), None));
            }
        }
        let script = self.state_dir.join("clients.py");
        let out = run(
            in_netns(&self.tools.ip, &self.client_ns, &self.tools.python3)
                .arg(&script)
                .arg("probe")
                .args(targets.iter().map(|(t, _)| t)),
        )
        .context("the lab's servers do not answer")?;
        let answers: std::collections::BTreeMap<String, String> =
            serde_json::from_slice(&out.stdout)?;
        for (target, want) in &targets {
            let got = answers.get(target).map(String::as_str);
            if want.is_some() && got != *want {
                bail!("{target} answered {got:?}, expected {want:?}");
            }
        }
        Ok(())
    }

    fn teardown(&mut self) -> anyhow::Result<()> {
        for child in &mut self.servers {
            if let Ok(pid) = i32::try_from(child.id()) {
                end_process(pid);
            }
            let _ = child.wait();
        }
        self.servers.clear();
        let mut first_error = None;
        for ns in self.all_namespaces() {
            if list_netns(&self.tools.ip)?.contains(&ns)
                && let Err(e) = sys::remove_netns(&self.tools.ip, &ns)
            {
                first_error.get_or_insert(e);
            }
        }
        if self.state_dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.state_dir)
        {
            first_error.get_or_insert(
                anyhow::Error::new(e)
                    .context(format!("could not remove {}", self.state_dir.display())),
            );
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if let Err(e) = self.teardown() {
            eprintln!("lab {}: teardown incomplete: {e:#}", self.config.prefix);
        }
    }
}

/// A human-readable account of the lab with this prefix: its configuration, namespaces
/// and processes.
pub fn status(prefix: &str) -> anyhow::Result<String> {
    check_prefix(prefix)?;
    let ip = sys::find_tool("ip", "iproute2")?;
    let found = namespaces(prefix)?;
    let dir = state_dir(prefix);
    if found.is_empty() && !dir.exists() {
        return Ok(format!(
            "no lab with prefix `{prefix}` (`cargo xtask lab up` builds one)\n"
        ));
    }
    let mut out = String::new();
    match std::fs::read_to_string(dir.join("lab.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<LabState>(&s).ok())
    {
        Some(state) => out.push_str(&format!(
            "lab `{prefix}`: {} topology, {} rules; state in {}\n",
            state.topology,
            state.rules,
            dir.display()
        )),
        None => out.push_str(&format!(
            "lab `{prefix}`: no readable state in {} (a crashed run?)\n",
            dir.display()
        )),
    }
    for ns in &found {
        let pids = sys::netns_pids(&ip, ns)?;
        out.push_str(&format!("  {ns:<28} {} process(es)\n", pids.len()));
    }
    let expected = 2 + spec::pods(prefix).len();
    if found.len() != expected {
        out.push_str(&format!(
            "  {} of {expected} namespaces exist: `cargo xtask lab down --prefix {prefix}` cleans up\n",
            found.len()
        ));
    }
    Ok(out)
}
