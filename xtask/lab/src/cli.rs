//! `cargo xtask lab up|down|status`.

use std::fmt::Write;

use super::spec::{CLIENT_IP, NODE_IP};
use super::{Lab, LabConfig, RuleMode, Topology};

#[derive(Debug, clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: LabCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Build a simulated kind node with kube-proxy's rules, pods and a client, and leave it running.
    Up {
        #[arg(long, value_enum, default_value_t = Topology::Bridged)]
        topology: Topology,
        #[arg(long, value_enum, default_value_t = RuleMode::Iptables)]
        rules: RuleMode,
        /// Namespace name prefix ([a-z0-9], at most 16 characters).
        #[arg(long, default_value = "obs")]
        prefix: String,
    },
    /// Remove everything the lab made, also what a crashed run left.
    Down {
        #[arg(long, default_value = "obs")]
        prefix: String,
    },
    /// Show what exists of the lab.
    Status {
        #[arg(long, default_value = "obs")]
        prefix: String,
    },
}

pub fn run(args: LabArgs) -> anyhow::Result<()> {
    match args.command {
        LabCommand::Up {
            topology,
            rules,
            prefix,
        } => {
            let lab = Lab::up(LabConfig {
                topology,
                rules,
                prefix,
            })?;
            print!("{}", describe(&lab));
            lab.detach();
        }
        LabCommand::Down { prefix } => {
            let removed = super::down(&prefix)?;
            if removed.is_empty() {
                println!("no lab with prefix `{prefix}`: nothing to remove");
            } else {
                println!("removed {}", removed.join(", "));
            }
        }
        LabCommand::Status { prefix } => print!("{}", super::status(&prefix)?),
    }
    Ok(())
}

/// What `lab up` built, and commands to try it.
fn describe(lab: &Lab) -> String {
    let c = lab.config();
    let (p, node, client) = (&c.prefix, lab.node_ns(), lab.client_ns());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "lab `{p}` is up: {} topology, kube-proxy {} rules",
        c.topology, c.rules
    );
    let attach = match c.topology {
        Topology::Bridged => format!("bridge cni0 {NODE_IP}/24, br_netfilter on"),
        Topology::Routed => format!("{NODE_IP}/32 on every veth, /32 route per pod"),
    };
    let _ = writeln!(s, "  node    {node:<24} {attach}, ip_forward=1, no uplink");
    let _ = writeln!(s, "  client  {client:<24} {CLIENT_IP}");
    for pod in lab.pods() {
        let _ = writeln!(
            s,
            "  pod     {:<24} {} (http :{}, udp :{})",
            pod.ns, pod.ip, pod.http_port, pod.udp_port
        );
    }
    for svc in lab.services() {
        let eps: Vec<String> = svc
            .endpoint_addrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        let np = svc
            .node_port
            .map(|n| format!(", NodePort {n}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  service {} {} {} -> {}{np}",
            svc.port_name_string(),
            svc.proto,
            svc.cluster_addr(),
            eps.join(" ")
        );
    }
    let rules = match c.rules {
        RuleMode::Iptables => "iptables-save -t nat",
        _ => "nft list table ip kube-proxy",
    };
    let _ = writeln!(s, "try it:");
    let _ = writeln!(
        s,
        "  ip netns exec {client} curl -s http://10.96.35.226/          # a checkout pod's name"
    );
    let _ = writeln!(
        s,
        "  ip netns exec {client} curl -s http://{NODE_IP}:30080/       # through the NodePort"
    );
    let _ = writeln!(
        s,
        "  ip netns exec {client} python3 -c 'import socket; s=socket.socket(2,2); s.sendto(b\"q\",(\"10.96.0.10\",53)); print(s.recv(99))'"
    );
    let _ = writeln!(
        s,
        "  ip netns exec {node} conntrack -E -e NEW            # watch the DNAT decisions"
    );
    let _ = writeln!(s, "  ip netns exec {node} {rules}");
    let _ = writeln!(
        s,
        "  cargo xtask lab down{}",
        if p == "obs" {
            String::new()
        } else {
            format!(" --prefix {p}")
        }
    );
    s
}
