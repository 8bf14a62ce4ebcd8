//! A second kind node beside the lab's, for traffic policies: `{prefix}-peer` is that
//! node on the nodes' network (kind's docker network, 172.18.0.0/16), reached from the
//! lab's node through a veth, with the node's route to its pod CIDR (10.244.2.0/24) as
//! kindnet writes it. It runs one pod of its own (its address on the peer's loopback), so
//! that a Service has an endpoint on another node; and being outside the cluster CIDR, it
//! is also the external client of the lab's NodePorts.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::spec::{HTTP_PORT, Pod, UDP_PORT};
use crate::{Lab, sys::run};

/// The lab's node on the nodes' network (its NodePorts answer there too).
pub const NODE_NET_IP: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 2);
/// The peer node on the nodes' network: the external client's address.
pub const PEER_NODE_IP: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 3);
/// The peer node's pod.
pub const PEER_POD_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);

impl Lab {
    /// Adds the peer node and starts its pod `checkout-remote` ([`PEER_POD_IP`]); returns
    /// that pod, to be made an endpoint of a Service ([`Lab::add_service`]). IPv4 only.
    pub fn add_peer_node(&mut self) -> anyhow::Result<Pod> {
        if self.peer.is_some() {
            bail!("the lab has its peer node already");
        }
        let ns = format!("{}-peer", self.config.prefix);
        let pod = Pod {
            name: "checkout-remote".into(),
            ns: ns.clone(),
            ip: PEER_POD_IP,
            http_port: HTTP_PORT,
            udp_port: UDP_PORT,
        };
        run(std::process::Command::new(&self.tools.ip).args(["netns", "add", &ns]))?;
        // From here on, dropping the lab removes the namespace.
        self.peer = Some(pod.clone());
        self.sysctls(
            &ns,
            &[
                ("net/ipv6/conf/all/disable_ipv6", "1"),
                ("net/ipv6/conf/default/disable_ipv6", "1"),
            ],
        )?;
        let node = self.node_ns.clone();
        self.ip_batch(
            &node,
            &[
                format!("link add veth-peer type veth peer name eth0 netns {ns}"),
                format!("addr add {NODE_NET_IP}/16 dev veth-peer"),
                "link set veth-peer up".into(),
                format!("route add 10.244.2.0/24 via {PEER_NODE_IP} dev veth-peer"),
            ],
        )?;
        self.ip_batch(
            &ns,
            &[
                "link set lo up".into(),
                format!("addr add {PEER_POD_IP}/32 dev lo"),
                format!("addr add {PEER_NODE_IP}/16 dev eth0"),
                "link set eth0 up".into(),
                format!("route add 10.244.0.0/16 via {NODE_NET_IP} dev eth0"),
            ],
        )?;
        let server = self.spawn_server(&pod)?;
        self.servers.push(server);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.ready_file(&pod).exists() {
            if Instant::now() > deadline {
                bail!("the server of the peer's pod did not start within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(pod)
    }

    /// The peer node's namespace, once [`Lab::add_peer_node`] made it.
    pub fn peer_ns(&self) -> Option<&str> {
        self.peer.as_ref().map(|p| p.ns.as_str())
    }
}
