//! A real DNS server behind kube-dns's ClusterIP, and a client namespace that resolves
//! through it with a kube-style resolv.conf.
//!
//! Each dns pod runs `scripts/dns_server.py` on port 53 (UDP and TCP): A records for the
//! lab's Services (`<svc>.<ns>.svc.cluster.local`) and any extra names, NXDOMAIN for
//! everything else, and a log of every query it received. kube-dns's Service then
//! targets port 53 (`kube-system/kube-dns:dns` UDP, plus `kube-system/kube-dns:dns-tcp`).
//!
//! The client namespace gets `/etc/netns/<client ns>/resolv.conf`, which `ip netns exec`
//! bind-mounts over `/etc/resolv.conf` in the command's own mount namespace: the host's
//! `/etc/resolv.conf` is never touched. Dropping [`DnsLab`] removes that directory.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::spec::{Proto, Service};
use crate::{Lab, sys::in_netns};

const DNS_SERVER_PY: &str = include_str!("../scripts/dns_server.py");

/// kube-dns's ClusterIP in kind.
pub const KUBE_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// The client's resolv.conf: what kubelet writes for a pod in namespace `shop`.
pub const RESOLV_CONF: &str = "nameserver 10.96.0.10\n\
    search shop.svc.cluster.local svc.cluster.local cluster.local\n\
    options ndots:5\n";

/// The same with `options use-vc`: glibc's resolver then sends every query over TCP.
pub const RESOLV_CONF_TCP: &str = "nameserver 10.96.0.10\n\
    search shop.svc.cluster.local svc.cluster.local cluster.local\n\
    options ndots:5 use-vc\n";

/// One query the DNS server received (a line of its log).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct ServerQuery {
    pub name: Option<String>,
    pub qtype: Option<String>,
    pub rcode: String,
    pub proto: String,
    pub client: String,
    pub id: u16,
}

/// The DNS side of a lab: the servers' logs and the client's resolv.conf.
pub struct DnsLab {
    logs: Vec<PathBuf>,
    netns_etc: PathBuf,
}

impl DnsLab {
    /// Every query the servers received so far, per server in arrival order, servers
    /// one after the other.
    pub fn queries(&self) -> anyhow::Result<Vec<ServerQuery>> {
        let mut out = Vec::new();
        for log in &self.logs {
            let text = std::fs::read_to_string(log)
                .with_context(|| format!("could not read {}", log.display()))?;
            for line in text.lines() {
                out.push(
                    serde_json::from_str(line)
                        .with_context(|| format!("{}: bad line {line:?}", log.display()))?,
                );
            }
        }
        Ok(out)
    }
}

impl DnsLab {
    /// Makes the client's resolver query over TCP (`RESOLV_CONF_TCP`) or UDP.
    pub fn over_tcp(&self, tcp: bool) -> anyhow::Result<()> {
        let text = if tcp { RESOLV_CONF_TCP } else { RESOLV_CONF };
        std::fs::write(self.netns_etc.join("resolv.conf"), text)
            .context("could not write the client's resolv.conf")
    }
}

impl Drop for DnsLab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.netns_etc);
    }
}

impl Lab {
    /// Serves DNS from the lab's dns pods behind kube-dns's ClusterIP (see the module
    /// doc). `extra` adds A records (e.g. an external name an upstream would resolve).
    pub fn serve_dns(&mut self, extra: &[(&str, Ipv4Addr)]) -> anyhow::Result<DnsLab> {
        let script = self.state_dir.join("dns_server.py");
        std::fs::write(&script, DNS_SERVER_PY)
            .with_context(|| format!("could not write {}", script.display()))?;
        let mut records: Vec<String> = self
            .services
            .iter()
            .map(|s| {
                format!(
                    "{}.{}.svc.cluster.local={}",
                    s.name, s.namespace, s.cluster_ip
                )
            })
            .collect();
        records.extend(extra.iter().map(|(name, ip)| format!("{name}={ip}")));
        let dns_pods: Vec<_> = self
            .pods
            .iter()
            .filter(|p| p.name.starts_with("dns-"))
            .cloned()
            .collect();
        let mut logs = Vec::new();
        for pod in &dns_pods {
            let log = self.state_dir.join(format!("{}.queries.jsonl", pod.name));
            let ready = self.state_dir.join(format!("{}.dns.ready", pod.name));
            let output =
                std::fs::File::create(self.state_dir.join(format!("{}.dns.log", pod.name)))?;
            let mut cmd = in_netns(&self.tools.ip, &pod.ns, &self.tools.python3);
            cmd.arg("-u").arg(&script).arg("--log").arg(&log);
            cmd.arg("--ready-file").arg(&ready);
            for record in &records {
                cmd.args(["--record", record]);
            }
            let child = cmd
                .stdin(Stdio::null())
                .stdout(output.try_clone()?)
                .stderr(output)
                .process_group(0)
                .spawn()
                .with_context(|| format!("could not start the DNS server of pod {}", pod.name))?;
            self.servers.push(child);
            wait_for(&ready, &pod.name)?;
            logs.push(log);
        }
        self.target_dns_port()?;
        let netns_etc = netns_etc(&self.client_ns);
        std::fs::create_dir_all(&netns_etc)
            .with_context(|| format!("could not create {}", netns_etc.display()))?;
        let dns = DnsLab { logs, netns_etc };
        std::fs::write(dns.netns_etc.join("resolv.conf"), RESOLV_CONF)
            .context("could not write the client's resolv.conf")?;
        Ok(dns)
    }

    /// kube-dns's Service ports to the DNS servers' port 53: UDP `dns` retargeted, TCP
    /// `dns-tcp` added, in one sync of the rules.
    fn target_dns_port(&mut self) -> anyhow::Result<()> {
        let previous = self.services.clone();
        let Some(udp) = self
            .services
            .iter_mut()
            .find(|s| s.port_name_string() == "kube-system/kube-dns:dns")
        else {
            bail!("the lab has no kube-system/kube-dns:dns Service");
        };
        udp.target_port = 53;
        let tcp = Service {
            port_name: "dns-tcp".into(),
            proto: Proto::Tcp,
            ..udp.clone()
        };
        self.services.push(tcp);
        if let Err(e) = self.sync_rules(Some(&previous)) {
            self.services = previous;
            return Err(e);
        }
        Ok(())
    }
}

/// Where `ip netns exec` finds the files it bind-mounts over `/etc` for `netns`.
pub(crate) fn netns_etc(netns: &str) -> PathBuf {
    PathBuf::from("/etc/netns").join(netns)
}

fn wait_for(ready: &std::path::Path, pod: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        if Instant::now() > deadline {
            bail!("the DNS server of pod {pod} did not start within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
