//! The lab's namespaces and links: the node with a bridge or point-to-point veths, and
//! one veth per pod (the client is a pod too).

use std::process::Command;

use anyhow::{Context, bail};

use crate::spec::{Family, NODE_IP, Pod};
use crate::sys::{in_netns, run, run_with_input};
use crate::{Lab, Topology};

/// The host-side veth of a pod (interface names have at most 15 bytes).
fn veth_name(pod: &str) -> String {
    format!("veth-{pod}").chars().take(15).collect()
}

impl Lab {
    /// Every pod, the client too.
    pub(crate) fn members(&self) -> Vec<Pod> {
        let client = self.client_pod();
        self.pods
            .iter()
            .cloned()
            .chain(std::iter::once(client))
            .collect()
    }

    pub(crate) fn build_topology(&mut self) -> anyhow::Result<()> {
        let bridged = self.config.topology == Topology::Bridged;
        let v6 = self.families.contains(&Family::V6);
        let members = self.members();
        self.create_namespaces(v6)?;
        let node = self.node_ns.clone();
        let mut node_cmds = vec!["link set lo up".to_string()];
        if bridged {
            self.enable_bridge_netfilter(v6)?;
            node_cmds.extend([
                "link add cni0 type bridge".to_string(),
                format!("addr add {NODE_IP}/24 dev cni0"),
                "link set cni0 up".to_string(),
            ]);
            if v6 {
                node_cmds.push(format!("addr add {}/64 dev cni0 nodad", node_ip6()));
            }
        }
        for pod in &members {
            node_cmds.extend(node_side(pod, bridged, v6));
        }
        self.ip_batch(&node, &node_cmds)?;
        if self.runtime_bundles {
            crate::runtime::write(&self.state_dir, &self.config.prefix, &members)?;
        }
        for pod in &members {
            self.ip_batch(&pod.ns, &pod_side(pod, bridged, v6))?;
        }
        Ok(())
    }

    /// Every namespace, without IPv6 unless the Services have it (nothing but the lab's
    /// own traffic reaches conntrack), and the node forwarding. With IPv6, no router
    /// solicitations or advertisements: addresses and routes are the lab's alone.
    fn create_namespaces(&self, v6: bool) -> anyhow::Result<()> {
        let ipv6: &[(&str, &str)] = if v6 {
            &[
                ("net/ipv6/conf/all/disable_ipv6", "0"),
                ("net/ipv6/conf/default/disable_ipv6", "0"),
                ("net/ipv6/conf/all/accept_ra", "0"),
                ("net/ipv6/conf/default/accept_ra", "0"),
                ("net/ipv6/conf/default/router_solicitations", "0"),
            ]
        } else {
            &[
                ("net/ipv6/conf/all/disable_ipv6", "1"),
                ("net/ipv6/conf/default/disable_ipv6", "1"),
            ]
        };
        for ns in self.all_namespaces() {
            // A runtime made the pods' netns already (`Lab::up_in_sandboxes`).
            if !self.sandboxed || ns == self.node_ns {
                run(Command::new(&self.tools.ip).args(["netns", "add", &ns]))?;
            }
            self.sysctls(&ns, ipv6)?;
        }
        let mut node = vec![
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/route_localnet", "1"),
        ];
        if v6 {
            node.push(("net/ipv6/conf/all/forwarding", "1"));
        }
        self.sysctls(&self.node_ns, &node)
    }

    /// br_netfilter on in the node, so bridged traffic meets kube-proxy's rules.
    fn enable_bridge_netfilter(&self, v6: bool) -> anyhow::Result<()> {
        let node = &self.node_ns;
        let has_bridge_nf = in_netns(&self.tools.ip, node, "/bin/sh")
            .args(["-c", "test -d /proc/sys/net/bridge"])
            .status()
            .context("could not look for /proc/sys/net/bridge")?
            .success();
        if !has_bridge_nf {
            bail!(
                "the bridged topology needs br_netfilter, but /proc/sys/net/bridge does not exist in {node} (load the br_netfilter module, or use --topology routed)"
            );
        }
        self.sysctls(node, &[("net/bridge/bridge-nf-call-iptables", "1")])?;
        if v6 {
            self.sysctls(node, &[("net/bridge/bridge-nf-call-ip6tables", "1")])?;
        }
        Ok(())
    }

    pub(crate) fn ip_batch(&self, netns: &str, commands: &[String]) -> anyhow::Result<()> {
        let mut input = commands.join("\n");
        input.push('\n');
        run_with_input(
            Command::new(&self.tools.ip).args(["-n", netns, "-batch", "-"]),
            &input,
        )
        .with_context(|| format!("could not configure {netns}"))?;
        Ok(())
    }

    pub(crate) fn sysctls(&self, netns: &str, settings: &[(&str, &str)]) -> anyhow::Result<()> {
        let script: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("echo {v} > /proc/sys/{k}"))
            .collect();
        run(in_netns(&self.tools.ip, netns, "/bin/sh").args(["-c", &script.join(" && ")]))
            .with_context(|| format!("could not set sysctls in {netns}"))?;
        Ok(())
    }
}

/// The node's IPv6 address on the pod network (kind's `fd00:10:244:1::1`).
fn node_ip6() -> std::net::IpAddr {
    Family::V6.ip(NODE_IP)
}

/// `ip -batch` lines in the node for one pod's veth: a bridge port, or a /32 route (and
/// with `v6` a /128 one).
fn node_side(pod: &Pod, bridged: bool, v6: bool) -> Vec<String> {
    let veth = veth_name(&pod.name);
    let mut cmds = vec![format!(
        "link add {veth} type veth peer name eth0 netns {}",
        pod.ns
    )];
    if bridged {
        cmds.extend([
            format!("link set {veth} master cni0"),
            format!("link set {veth} type bridge_slave hairpin on"),
            format!("link set {veth} up"),
        ]);
    } else {
        cmds.extend([
            format!("addr add {NODE_IP}/32 dev {veth}"),
            format!("link set {veth} up"),
            format!("route add {}/32 dev {veth}", pod.ip),
        ]);
        if v6 {
            cmds.extend([
                format!("addr add {}/128 dev {veth} nodad", node_ip6()),
                format!("route add {}/128 dev {veth}", Family::V6.ip(pod.ip)),
            ]);
        }
    }
    cmds
}

/// `ip -batch` lines in a pod: its address and the default route via the node (and with
/// `v6` its IPv6 ones).
fn pod_side(pod: &Pod, bridged: bool, v6: bool) -> Vec<String> {
    let (len, len6, onlink) = if bridged {
        (24, 64, "")
    } else {
        (32, 128, " onlink")
    };
    let mut cmds = vec![
        "link set lo up".to_string(),
        format!("addr add {}/{len} dev eth0", pod.ip),
    ];
    if v6 {
        cmds.push(format!(
            "addr add {}/{len6} dev eth0 nodad",
            Family::V6.ip(pod.ip)
        ));
    }
    cmds.extend([
        "link set eth0 up".to_string(),
        format!("route add default via {NODE_IP} dev eth0{onlink}"),
    ]);
    if v6 {
        cmds.push(format!(
            "route add ::/0 via {} dev eth0{onlink}",
            node_ip6()
        ));
    }
    cmds
}
