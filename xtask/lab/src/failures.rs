//! What goes wrong on real nodes, made on purpose: a node with a default route (so that
//! kube-proxy's REJECT of a Service without endpoints is reached, as on a kind node), a
//! pod whose server stopped (and started again), a pod that drops SYNs, a pod whose replies are late.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::Lab;
use crate::spec::{HTTP_PORT, Pod};
use crate::sys::{end_process, in_netns, run};

/// The NFQUEUE queue number [`Lab::delay_replies`] uses in a pod's namespace.
const DELAY_QUEUE: u16 = 7;

impl Lab {
    /// Gives the node a default route, as a kind node's `eth0` has (traffic to an
    /// address no rule DNATs, a ClusterIP without endpoints, is then routed and reaches
    /// the filter table's REJECT, instead of failing the route lookup first). There is
    /// still no uplink: `eth0` is one end of a veth pair whose other end stays in the
    /// node's namespace without an address, so the gateway's ARP is never answered and
    /// nothing leaves.
    pub fn add_default_route(&self) -> anyhow::Result<()> {
        self.ip_batch(
            self.node_ns(),
            &[
                "link add eth0 type veth peer name eth0-stub".to_owned(),
                "link set eth0-stub up".to_owned(),
                "addr add 172.18.0.2/16 dev eth0".to_owned(),
                "link set eth0 up".to_owned(),
                "route add default via 172.18.0.1 dev eth0".to_owned(),
            ],
        )
    }

    /// Stops a pod's server: the pod stays an endpoint in the rules, but nothing
    /// listens (its kernel answers SYNs with RST, datagrams with ICMP port unreachable).
    pub fn stop_server(&mut self, pod_ip: Ipv4Addr) -> anyhow::Result<()> {
        let index = self.pod_index(pod_ip)?;
        let server = &mut self.servers[index];
        if let Ok(pid) = i32::try_from(server.id()) {
            end_process(pid);
        }
        server
            .wait()
            .with_context(|| format!("the server of {pod_ip} did not end"))?;
        Ok(())
    }

    /// Starts a stopped pod's server again ([`Lab::stop_server`]) and waits until it
    /// listens.
    pub fn restart_server(&mut self, pod_ip: Ipv4Addr) -> anyhow::Result<()> {
        let index = self.pod_index(pod_ip)?;
        let pod = self.pods[index].clone();
        let ready = self.ready_file(&pod);
        let _ = std::fs::remove_file(&ready);
        let mut server = self.spawn_server(&pod)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            if server.try_wait()?.is_some() || Instant::now() > deadline {
                let _ = server.kill();
                bail!("the server of pod {} did not start again", pod.name);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.servers[index] = server;
        Ok(())
    }

    /// Makes a pod drop every SYN to its HTTP port: a hung or firewalled pod, whose
    /// clients get no answer at all.
    pub fn drop_syns(&self, pod_ip: Ipv4Addr) -> anyhow::Result<()> {
        let pod = self.pod(pod_ip)?;
        let port = HTTP_PORT.to_string();
        let rule = [
            "-A", "INPUT", "-p", "tcp", "--syn", "--dport", &port, "-j", "DROP",
        ];
        run(in_netns(&self.tools.ip, &pod.ns, &self.tools.iptables).args(rule))?;
        Ok(())
    }

    /// Delays every packet a pod's HTTP server sends by `delay`, as `tc netem delay` on
    /// the pod's link would (this machine's kernel has no netem qdisc): an NFQUEUE rule
    /// in the pod's namespace and `reply_delay.py` releasing each packet `delay` after it
    /// was queued. The delayer is a lab process, ended with the lab.
    pub fn delay_replies(&mut self, pod_ip: Ipv4Addr, delay: Duration) -> anyhow::Result<()> {
        let pod = self.pod(pod_ip)?.clone();
        let ready = self.state_dir.join(format!("{}.delay", pod.name));
        let script = self.state_dir.join("reply_delay.py");
        std::fs::write(&script, crate::REPLY_DELAY_PY)
            .with_context(|| format!("could not write {}", script.display()))?;
        let mut delayer = in_netns(&self.tools.ip, &pod.ns, &self.tools.python3);
        delayer
            .arg(&script)
            .arg(DELAY_QUEUE.to_string())
            .arg(delay.as_millis().to_string())
            .arg(&ready)
            .stdin(Stdio::null())
            .process_group(0);
        let child = self
            .spawn_pod_process(&mut delayer)
            .with_context(|| format!("could not start the reply delayer of pod {}", pod.name))?;
        self.servers.push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            if Instant::now() > deadline {
                bail!(
                    "the reply delayer of pod {} did not bind its queue within 10 s",
                    pod.name
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let port = HTTP_PORT.to_string();
        let queue = DELAY_QUEUE.to_string();
        let rule = [
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "--sport",
            &port,
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue,
        ];
        run(in_netns(&self.tools.ip, &pod.ns, &self.tools.iptables).args(rule))?;
        Ok(())
    }

    fn pod_index(&self, pod_ip: Ipv4Addr) -> anyhow::Result<usize> {
        self.pods
            .iter()
            .position(|p| p.ip == pod_ip)
            .with_context(|| format!("{pod_ip} is not one of the lab's pods"))
    }

    fn pod(&self, pod_ip: Ipv4Addr) -> anyhow::Result<&Pod> {
        Ok(&self.pods[self.pod_index(pod_ip)?])
    }
}
