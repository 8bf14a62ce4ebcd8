//! The simulated cluster: which pods and Services the lab builds. Addresses are kind's:
//! pod CIDR 10.244.1.0/24 on the node, Service CIDR 10.96.0.0/16, cluster CIDR 10.244.0.0/16;
//! with IPv6 ([`Family::V6`]), those of kind's `ipFamily: ipv6`/`dual` clusters (pods
//! fd00:10:244::/56, Services fd00:10:96::/112), each derived from the IPv4 one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

/// The node's address on the pod network: the bridge (bridged) or every host-side veth
/// (routed), the pods' gateway, and the address NodePorts answer on.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);
/// The client pod's address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 9);
/// kube-proxy's `--cluster-cidr` in kind: its local-traffic detector matches it.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// kind's Service CIDR (kube-proxy learns it from the ServiceCIDR objects).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// Every pod's HTTP server port.
pub const HTTP_PORT: u16 = 8080;
/// Every pod's UDP responder port.
pub const UDP_PORT: u16 = 5353;

/// kind's IPv6 cluster CIDR (`podSubnet`) and Service CIDR (`serviceSubnet`).
pub const CLUSTER_CIDR_V6: &str = "fd00:10:244::/56";
pub const SERVICE_CIDR_V6: &str = "fd00:10:96::/112";

/// An IP family kube-proxy runs a proxier for (one `ip` or `ip6` table each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// nftables' family and address match prefix (`ip daddr`, `ip6 daddr`).
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    /// The family's address in the lab: the IPv4 one itself, or the IPv6 one derived
    /// from it. 10.244.X.Y (pods) is fd00:10:244:X::Y, 10.96.A.B (ClusterIPs)
    /// fd00:10:96::AB (its low 16 bits); anything else fd00:ffff:: and its 32 bits.
    pub fn ip(self, v4: Ipv4Addr) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(v4),
            Family::V6 => IpAddr::V6(v6_of(v4)),
        }
    }

    pub fn socket(self, v4: SocketAddrV4) -> SocketAddr {
        SocketAddr::new(self.ip(*v4.ip()), v4.port())
    }

    /// kube-proxy's `--cluster-cidr` for this family (its local-traffic detector).
    pub fn cluster_cidr(self) -> &'static str {
        match self {
            Family::V4 => CLUSTER_CIDR,
            Family::V6 => CLUSTER_CIDR_V6,
        }
    }

    pub fn service_cidr(self) -> &'static str {
        match self {
            Family::V4 => SERVICE_CIDR,
            Family::V6 => SERVICE_CIDR_V6,
        }
    }
}

fn v6_of(v4: Ipv4Addr) -> Ipv6Addr {
    let [a, b, c, d] = v4.octets();
    match (a, b) {
        (10, 244) => Ipv6Addr::new(0xfd00, 0x10, 0x244, c.into(), 0, 0, 0, d.into()),
        (10, 96) => Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, u16::from_be_bytes([c, d])),
        _ => {
            let [hi, lo] = [u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d])];
            Ipv6Addr::new(0xfd00, 0xffff, 0, 0, 0, 0, hi, lo)
        }
    }
}

/// Transport protocol of a Service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    /// Lower case, as kube-proxy writes it into rules and hashes.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pod: its own network namespace with `eth0` on the pod network, running an HTTP/1.1
/// keep-alive server and a UDP responder that both answer with the pod's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pod {
    pub name: String,
    /// The network namespace's name (`{prefix}-pod-{name}`).
    pub ns: String,
    pub ip: Ipv4Addr,
    pub http_port: u16,
    pub udp_port: u16,
}

impl Pod {
    /// Whether the pod runs on the lab's node (its pod CIDR, 10.244.1.0/24); other pods
    /// of the cluster (10.244.2.0/24: [`Lab::add_peer_node`](crate::Lab::add_peer_node))
    /// are reached through another node.
    pub fn on_node(&self) -> bool {
        self.ip.octets()[..3] == NODE_IP.octets()[..3]
    }
}

/// One Service port with its ready endpoints, as kube-proxy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Kubernetes namespace (not a network namespace).
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub proto: Proto,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    /// The endpoints' port (the pods' containerPort).
    pub target_port: u16,
    pub node_port: Option<u16>,
    pub endpoints: Vec<Pod>,
    /// Traffic policy and session affinity (kube-proxy's defaults: Cluster, None).
    pub traffic: Traffic,
}

/// What a Service's spec tells kube-proxy beyond its ports: `externalTrafficPolicy`,
/// `internalTrafficPolicy` and `sessionAffinity`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// `externalTrafficPolicy: Local`: NodePort traffic from outside the cluster goes to
    /// this node's endpoints only ([`Pod::on_node`]).
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`: ClusterIP traffic goes to this node's endpoints only.
    /// The lab writes it with at least one endpoint on the node.
    pub internal_local: bool,
    /// `sessionAffinity: ClientIP` with `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub affinity_timeout_s: Option<u32>,
}

impl Service {
    /// `ns/name:port`, kube-proxy's `ServicePortName.String()` (no `:` when the port is unnamed).
    pub fn port_name_string(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }

    /// ClusterIP:port.
    pub fn cluster_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.cluster_ip, self.port)
    }

    /// The endpoints as `ip:targetPort`, in kube-proxy's order (sorted by their string form).
    pub fn endpoint_addrs(&self) -> Vec<SocketAddrV4> {
        let mut addrs: Vec<SocketAddrV4> = self
            .endpoints
            .iter()
            .map(|p| SocketAddrV4::new(p.ip, self.target_port))
            .collect();
        addrs.sort_by_key(|a| a.to_string());
        addrs
    }

    /// The endpoints in `family`, in kube-proxy's order (by their string form,
    /// `[fd00:10:244:1::c]:8080` for IPv6).
    pub fn endpoint_addrs_in(&self, family: Family) -> Vec<SocketAddr> {
        let mut addrs: Vec<SocketAddr> = self
            .endpoints
            .iter()
            .map(|p| SocketAddr::new(family.ip(p.ip), self.target_port))
            .collect();
        addrs.sort_by_key(|a| a.to_string());
        addrs
    }

    /// The endpoints on the lab's node ([`Pod::on_node`]), in kube-proxy's order.
    /// kube-proxy's `usesClusterPolicyChain`: some of the port's traffic picks from every
    /// endpoint (KUBE-SVC, `service-*`).
    pub fn uses_cluster_chain(&self) -> bool {
        !self.endpoints.is_empty()
            && (!self.traffic.internal_local
                || self.node_port.is_some() && !self.traffic.external_local)
    }

    /// kube-proxy's `usesLocalPolicyChain`: some of it picks from this node's endpoints
    /// (KUBE-SVL, `local-*`).
    pub fn uses_local_chain(&self) -> bool {
        (self.traffic.internal_local || self.traffic.external_local && self.node_port.is_some())
            && !self.local_endpoint_addrs().is_empty()
    }

    pub fn local_endpoint_addrs(&self) -> Vec<SocketAddrV4> {
        let local: Vec<Ipv4Addr> = self
            .endpoints
            .iter()
            .filter(|p| p.on_node())
            .map(|p| p.ip)
            .collect();
        self.endpoint_addrs()
            .into_iter()
            .filter(|a| local.contains(a.ip()))
            .collect()
    }

    /// The ClusterIP in `family`, and the port.
    pub fn cluster_addr_in(&self, family: Family) -> SocketAddr {
        family.socket(self.cluster_addr())
    }
}

/// The pods that serve (the client is not among them), in namespaces named after `prefix`.
pub fn pods(prefix: &str) -> Vec<Pod> {
    [
        ("checkout-a", 12),
        ("checkout-b", 13),
        ("checkout-c", 14),
        ("dns-a", 20),
        ("dns-b", 21),
    ]
    .into_iter()
    .map(|(name, last)| Pod {
        name: name.to_string(),
        ns: format!("{prefix}-pod-{name}"),
        ip: Ipv4Addr::new(10, 244, 1, last),
        http_port: HTTP_PORT,
        udp_port: UDP_PORT,
    })
    .collect()
}

/// `shop/checkout:http` (TCP, NodePort 30080) on the checkout pods and `kube-system/kube-dns:dns`
/// (UDP) on the dns pods.
pub fn services(pods: &[Pod]) -> Vec<Service> {
    let with_prefix = |p: &str| -> Vec<Pod> {
        pods.iter()
            .filter(|pod| pod.name.starts_with(p))
            .cloned()
            .collect()
    };
    vec![
        Service {
            namespace: "shop".into(),
            name: "checkout".into(),
            port_name: "http".into(),
            proto: Proto::Tcp,
            cluster_ip: Ipv4Addr::new(10, 96, 35, 226),
            port: 80,
            target_port: HTTP_PORT,
            node_port: Some(30080),
            endpoints: with_prefix("checkout-"),
            traffic: Traffic::default(),
        },
        Service {
            namespace: "kube-system".into(),
            name: "kube-dns".into(),
            port_name: "dns".into(),
            proto: Proto::Udp,
            cluster_ip: Ipv4Addr::new(10, 96, 0, 10),
            port: 53,
            target_port: UDP_PORT,
            node_port: None,
            endpoints: with_prefix("dns-"),
            traffic: Traffic::default(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_have_kind_addresses_and_their_pods() {
        let pods = pods("obs");
        let svcs = services(&pods);
        assert_eq!(svcs[0].port_name_string(), "shop/checkout:http");
        assert_eq!(svcs[0].cluster_addr().to_string(), "10.96.35.226:80");
        let eps: Vec<String> = svcs[0]
            .endpoint_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(
            eps,
            ["10.244.1.12:8080", "10.244.1.13:8080", "10.244.1.14:8080"]
        );
        assert_eq!(svcs[1].port_name_string(), "kube-system/kube-dns:dns");
        let eps: Vec<String> = svcs[1]
            .endpoint_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(eps, ["10.244.1.20:5353", "10.244.1.21:5353"]);
        assert_eq!(pods[0].ns, "obs-pod-checkout-a");
    }

    #[test]
    fn endpoints_sort_as_strings_like_kube_proxy() {
        let mut svc = services(&pods("x")).remove(0);
        svc.endpoints[0].ip = Ipv4Addr::new(10, 244, 1, 100);
        let eps: Vec<String> = svc.endpoint_addrs().iter().map(|a| a.to_string()).collect();
        // "10.244.1.100" < "10.244.1.13" as strings.
        assert_eq!(
            eps,
            ["10.244.1.100:8080", "10.244.1.13:8080", "10.244.1.14:8080"]
        );
    }

    #[test]
    fn ipv6_addresses_are_kinds_and_derived_from_ipv4() {
        let svc = services(&pods("x")).remove(0);
        assert_eq!(
            svc.cluster_addr_in(Family::V6).to_string(),
            "[fd00:10:96::23e2]:80"
        );
        let eps: Vec<String> = svc
            .endpoint_addrs_in(Family::V6)
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(
            eps,
            [
                "[fd00:10:244:1::c]:8080",
                "[fd00:10:244:1::d]:8080",
                "[fd00:10:244:1::e]:8080"
            ]
        );
        assert_eq!(Family::V6.ip(NODE_IP).to_string(), "fd00:10:244:1::1");
        assert_eq!(
            Family::V6.ip(Ipv4Addr::new(192, 0, 2, 1)).to_string(),
            "fd00:ffff::c000:201"
        );
        assert_eq!(
            svc.endpoint_addrs_in(Family::V4),
            svc.endpoint_addrs()
                .into_iter()
                .map(SocketAddr::V4)
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn unnamed_port_has_no_colon() {
        let mut svc = services(&pods("x")).remove(0);
        svc.port_name.clear();
        assert_eq!(svc.port_name_string(), "shop/checkout");
    }
}
