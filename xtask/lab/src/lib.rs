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
//!   Every pod (the client too) also runs a pause process in a UTS namespace of its own
//!   whose hostname is the pod's name, as kubelet sets it; [`Lab::up_without_runtime_bundles`]
//!   leaves the hostnames as the only source, and [`Lab::set_hostname`] changes one as a pod
//!   with `CAP_SYS_ADMIN` can. [`Containerd`] runs Debian's containerd (1.6, 1.7 or 2.x)
//!   privately and, through its CRI plugin, a real pod sandbox per pod;
//!   [`Lab::up_in_sandboxes`] builds the lab in those sandboxes' netns, so that only
//!   containerd's own bundles ([`Containerd::runtime_root`]) name the pods.
//! - IPv6: [`Lab::up_with_families`] gives the Services IPv6 ([`Family::V6`], kind's
//!   `ipFamily: ipv6`, written into `table ip6 kube-proxy`) or both (`dual`); every pod
//!   and the node then have both addresses ([`Family::ip`] derives the IPv6 one).
//! - Node containers: [`Lab::up_in_node_container`] puts the node in a kind-like
//!   [`NodeContainer`] (its own PID namespace holding the pods' processes, a root with the
//!   node's tools and bundles, cgroup and UTS namespaces); [`NodeContainer::exec`] starts a
//!   process in it as `docker exec` does.
//! - DNS: [`Lab::serve_dns`] runs a real authoritative DNS server (UDP and TCP, port 53)
//!   in the dns pods behind kube-dns's ClusterIP and gives the client namespace kube's
//!   resolv.conf ([`RESOLV_CONF`]); [`DnsLab::queries`] reads what the servers received.
//! - Floods: [`Lab::flood`] sends DNS queries, UDP datagrams or TCP SYNs from a pod
//!   through a Service as fast as it can, as a hostile pod would ([`FloodKind`]).
//! - Failures: [`Lab::add_default_route`] (a kind node's default route, still no uplink),
//!   [`Lab::stop_server`], [`Lab::drop_syns`], [`Lab::delay_replies`] (netem-like).
//! - [`ConntrackWatch`]: `conntrack -E -e NEW` in a namespace, parsed into [`CtEvent`]s.
//! - [`Lab::install_dnat_counters`], [`Lab::dnat_decisions`]: the rules' own count of
//!   DNAT decisions.
//! - Clients, each returning its own ground truth: [`http_fresh`], [`http_keepalive`],
//!   [`node_fetch`], [`udp_queries`], [`http_churn`].
//! - Pure rule generation, unit-tested without root: [`iptables::sync`], [`nftables::sync`].
//! - [`Observer`]: the observer binary started and `attached` (it is only run: this crate
//!   does not depend on the observer crate).
//! - [`down`] removes a lab by prefix (also a crashed one, with its private containerd);
//!   [`namespaces`] lists what exists.

mod admin;
mod clients;
mod conntrack;
mod containerd;
mod counting;
mod dns;
mod failures;
mod flood;
mod names;
mod node_container;
mod node_rules;
mod observer;
mod peer;
mod process;
mod sys;
mod topology;

pub mod cli;
pub mod iptables;
pub mod nftables;
pub mod runtime;
pub mod spec;
pub mod testing;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

pub use admin::{down, namespaces, status};
pub use clients::{
    Answer, Attempt, AttemptOutcome, ChurnReport, attempts, http_churn, http_fresh,
    http_fresh_from, http_keepalive, http_keepalive_paced, node_fetch, resolve, udp_queries,
};
pub use conntrack::{ConntrackWatch, CtEvent};
pub use containerd::{Containerd, UNPACKED_CONTAINERDS};
pub use dns::{DnsLab, KUBE_DNS_IP, RESOLV_CONF, ServerQuery};
pub use flood::{FloodKind, FloodReport};
pub use node_container::NodeContainer;
pub use observer::Observer;
pub use peer::{NODE_NET_IP, PEER_NODE_IP, PEER_POD_IP};
pub use spec::{Family, Pod, Proto, Service, Traffic};

use sys::{Tools, in_netns, is_lab_netns, list_netns, state_dir};

const POD_SERVER_PY: &str = include_str!("../scripts/pod_server.py");
const CLIENTS_PY: &str = include_str!("../scripts/clients.py");
const NODE_FETCH_MJS: &str = include_str!("../scripts/node_fetch.mjs");
const REPLY_DELAY_PY: &str = include_str!("../scripts/reply_delay.py");

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
    /// `nft -f` of `table ip kube-proxy` as kube-proxy 1.35 and before wrote it: verdict
    /// maps, `numgen random mod N vmap` to endpoint chains that `dnat to`.
    Nftables,
    /// kube-proxy 1.36 (kubernetes commit 475f9622c8): the Service chain DNATs through
    /// `numgen random mod N map { i : ip . port }`; no endpoint chains.
    #[value(name = "nftables-1.36")]
    #[serde(rename = "nftables-1.36")]
    Nftables136,
    /// kube-proxy 1.37 (kubernetes PR 140723): as 1.36, and a one-endpoint Service chain
    /// does `dnat to ip:port` itself. kind v0.33's default node image.
    #[value(name = "nftables-1.37")]
    #[serde(rename = "nftables-1.37")]
    Nftables137,
    /// The layout proposed for 1.38 (kubernetes PR 140362): ClusterIPs go to shared
    /// `dispatch-N` chains that DNAT through one `@endpoints` map keyed by ClusterIP,
    /// protocol, port and `ct mark set numgen random mod N`.
    #[value(name = "nftables-dispatch")]
    #[serde(rename = "nftables-dispatch")]
    NftablesDispatch,
}

impl RuleMode {
    /// The nftables layout kube-proxy writes in this mode; `None` for iptables.
    pub fn nft_layout(self) -> Option<nftables::Layout> {
        Some(match self {
            RuleMode::Iptables => return None,
            RuleMode::Nftables => nftables::Layout::V1_35,
            RuleMode::Nftables136 => nftables::Layout::V1_36,
            RuleMode::Nftables137 => nftables::Layout::V1_37,
            RuleMode::NftablesDispatch => nftables::Layout::Dispatch,
        })
    }
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
            RuleMode::Nftables136 => "nftables-1.36",
            RuleMode::Nftables137 => "nftables-1.37",
            RuleMode::NftablesDispatch => "nftables-dispatch",
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
    /// The IP families kube-proxy serves the Services in (a proxier and table each).
    families: Vec<Family>,
    /// nftables chains a sync left empty (by table), and when: deleted by the next sync
    /// a second later.
    stale_nft_chains: Vec<(Family, String, Instant)>,
    /// Set by `cargo xtask lab up`: the lab outlives this process.
    detached: bool,
    /// Whether the lab writes containerd-style bundles under [`Lab::runtime_root`].
    runtime_bundles: bool,
    /// Whether the pods' netns were made by a real runtime ([`Lab::up_in_sandboxes`]).
    sandboxed: bool,
    /// Whether the node runs in a node container ([`Lab::up_in_node_container`]).
    in_node_container: bool,
    /// That container, once started.
    node_container: Option<NodeContainer>,
    /// The peer node's pod, once [`Lab::add_peer_node`] made it (its `ns` the peer's).
    peer: Option<Pod>,
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

/// Makes one pod's netns at `/run/netns/<pod.ns>` ([`Lab::up_in_sandboxes`]).
type MakeNetns<'a> = dyn FnMut(&Pod) -> anyhow::Result<()> + 'a;

impl Lab {
    /// Builds the lab and returns once every server answers, directly and through its
    /// Service. Fails if a lab with the same prefix exists.
    pub fn up(config: LabConfig) -> anyhow::Result<Lab> {
        Lab::up_with(config, true, None, false, &[Family::V4])
    }

    /// As [`Lab::up`], with kube-proxy serving the Services in `families` (IPv6: the
    /// addresses [`Family::ip`] derives, in `table ip6 kube-proxy`; both: dual-stack
    /// Services). With IPv6, every namespace has IPv6 and every pod and the node both
    /// addresses (kind's `ipFamily: ipv6` and `dual`); nftables modes only.
    pub fn up_with_families(config: LabConfig, families: &[Family]) -> anyhow::Result<Lab> {
        Lab::up_with(config, true, None, false, families)
    }

    /// `make_netns`, if given, makes every pod's netns (see [`Lab::up_in_sandboxes`]);
    /// `in_node_container`: see [`Lab::up_in_node_container`]; `families`: see
    /// [`Lab::up_with_families`].
    pub(crate) fn up_with(
        config: LabConfig,
        runtime_bundles: bool,
        make_netns: Option<&mut MakeNetns<'_>>,
        in_node_container: bool,
        families: &[Family],
    ) -> anyhow::Result<Lab> {
        check_root()?;
        check_prefix(&config.prefix)?;
        if families.is_empty() {
            bail!("the lab's Services need an IP family");
        }
        if families.contains(&Family::V6) && config.rules.nft_layout().is_none() {
            bail!(
                "IPv6 Services in the lab need an nftables mode, not {}",
                config.rules
            );
        }
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
            families: families.to_vec(),
            stale_nft_chains: Vec::new(),
            detached: false,
            runtime_bundles,
            sandboxed: make_netns.is_some(),
            in_node_container,
            node_container: None,
            peer: None,
        };
        // From here on, dropping `lab` on an error removes whatever was built.
        if let Some(make_netns) = make_netns {
            for pod in lab.members() {
                make_netns(&pod).with_context(|| format!("no sandbox for pod {}", pod.name))?;
            }
        }
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

    /// The IP families kube-proxy serves the Services in.
    pub fn families(&self) -> &[Family] {
        &self.families
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
        all.extend(self.peer.iter().map(|p| p.ns.clone()));
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
        self.add_services(vec![service])
    }

    /// Adds many Service ports in one sync (one `iptables-restore` or `nft -f`), as
    /// kube-proxy's first sync on a big cluster writes them.
    pub fn add_services(&mut self, services: Vec<Service>) -> anyhow::Result<()> {
        let mut names: std::collections::HashSet<String> = self
            .services
            .iter()
            .map(Service::port_name_string)
            .collect();
        for service in &services {
            if !names.insert(service.port_name_string()) {
                bail!(
                    "the lab already has Service port `{}`",
                    service.port_name_string()
                );
            }
        }
        let previous = self.services.clone();
        self.services.extend(services);
        if let Err(e) = self.sync_rules(Some(&previous)) {
            self.services = previous;
            return Err(e);
        }
        Ok(())
    }

    /// Takes `pod_ip` out of a Service port's endpoints (`"ns/name:port"`) and rewrites
    /// the rules as kube-proxy does after the readiness flip: a partial sync through
    /// `iptables-restore --noflush` or one `nft -f` transaction, then, for UDP, deleting
    /// the conntrack entries that still point at the removed endpoint.
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
            for family in &self.families {
                let name = match family {
                    Family::V4 => "ipv4",
                    Family::V6 => "ipv6",
                };
                // conntrack exits 1 when no entry matched: that is fine.
                let _ = in_netns(&self.tools.ip, &self.node_ns, &self.tools.conntrack)
                    .args(["-D", "-f", name, "-p", "udp"])
                    .args(["--orig-dst", &family.ip(cluster_ip).to_string()])
                    .args(["--reply-src", &family.ip(pod_ip).to_string()])
                    .output();
            }
        }
        Ok(())
    }

    /// Puts the lab's pod `pod_ip` back into a Service port's endpoints (the pod became
    /// ready again), in the lab's pod order, through the same partial sync as
    /// [`Lab::remove_endpoint`].
    pub fn add_endpoint(&mut self, service: &str, pod_ip: Ipv4Addr) -> anyhow::Result<()> {
        let Some(pod) = self.pods.iter().find(|p| p.ip == pod_ip).cloned() else {
            bail!("{pod_ip} is not one of the lab's pods");
        };
        let Some(idx) = self
            .services
            .iter()
            .position(|s| s.port_name_string() == service)
        else {
            bail!("the lab has no Service port `{service}`");
        };
        let previous = self.services.clone();
        let order: Vec<Ipv4Addr> = self.pods.iter().map(|p| p.ip).collect();
        let svc = &mut self.services[idx];
        if svc.endpoints.iter().any(|p| p.ip == pod_ip) {
            bail!("{pod_ip} is already an endpoint of {service}");
        }
        svc.endpoints.push(pod);
        svc.endpoints
            .sort_by_key(|p| order.iter().position(|ip| *ip == p.ip));
        if let Err(e) = self.sync_rules(Some(&previous)) {
            self.services = previous;
            return Err(e);
        }
        Ok(())
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
        if self.in_node_container {
            self.start_node_container()?;
        }
        self.sync_rules(None)?;
        self.start_servers()?;
        self.wait_until_answering()
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
