//! `externalTrafficPolicy: Local`, `internalTrafficPolicy: Local` and
//! `sessionAffinity: ClientIP` in kube-proxy's nftables
//! mode, as kube-proxy's (up to 1.35) pkg/proxy/nftables/proxier.go writes them (`syncProxyRules`,
//! `writeServiceToEndpointRules`): an `external-*` chain that short-circuits pod and node
//! traffic to the Service chain and sends the rest to a `local-*` chain over this node's
//! endpoints; per endpoint an `affinity-*` set that the Service (or local) chain checks
//! first and the endpoint chain updates.

use std::net::SocketAddr;

use super::MARK_MASQ_CHAIN;
use super::elements::Names;
use crate::spec::{Family, Service};

/// The endpoint chains (and affinity sets) of `svc` that lie on this node, in order.
pub(super) fn local_endpoints(svc: &Service, n: &Names, family: Family) -> Vec<usize> {
    let local: Vec<SocketAddr> = svc
        .local_endpoint_addrs()
        .into_iter()
        .map(|a| family.socket(a))
        .collect();
    (0..n.endpoints.len())
        .filter(|i| local.contains(&n.endpoints[*i].0))
        .collect()
}

/// `internalTrafficChain`: where ClusterIP traffic goes, the `local-*` chain with the
/// internal Local policy (the lab writes it only in the 1.35 layout).
pub(super) fn internal_chain(svc: &Service, n: &Names) -> String {
    match svc.traffic.internal_local {
        true => n.local.clone(),
        false => n.service.clone(),
    }
}

/// `add set` of each endpoint's affinity set, with the Service's timeout.
pub(super) fn affinity_sets(svc: &Service, n: &Names, family: Family, t: &str) -> Vec<String> {
    let Some(timeout) = svc.traffic.affinity_timeout_s else {
        return Vec::new();
    };
    let addr = match family {
        Family::V4 => "ipv4_addr",
        Family::V6 => "ipv6_addr",
    };
    n.affinity
        .iter()
        .map(|set| {
            format!(
                "add set {t} {set} {{ type {addr} ; flags dynamic,timeout ; timeout {timeout}s ; }}"
            )
        })
        .collect()
}

/// `writeServiceToEndpointRules`: with affinity, a `saddr @affinity-... goto endpoint-...`
/// rule per endpoint, then the `numgen random mod N vmap` to the endpoint chains.
pub(super) fn to_endpoints(
    svc: &Service,
    n: &Names,
    (t, ipx): (&str, &str),
    chain: &str,
    endpoints: &[usize],
    out: &mut Vec<String>,
) {
    if svc.traffic.affinity_timeout_s.is_some() {
        for &i in endpoints {
            out.push(format!(
                "add rule {t} {chain} {ipx} saddr @{} goto {}",
                n.affinity[i], n.endpoints[i].1
            ));
        }
    }
    let vmap: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(k, &i)| format!("{k} : goto {}", n.endpoints[i].1))
        .collect();
    out.push(format!(
        "add rule {t} {chain} numgen random mod {} vmap {{ {} }}",
        endpoints.len(),
        vmap.join(" , ")
    ));
}

/// The `external-*` chain of a Local-policy Service: pod traffic and the node's own go
/// to the Service chain (the node's masqueraded), the rest to the `local-*` chain.
pub(super) fn external_local(
    svc: &Service,
    n: &Names,
    family: Family,
    t: &str,
    out: &mut Vec<String>,
) {
    let (ext, service) = (&n.external, &n.service);
    out.extend([
        format!(
            "add rule {t} {ext} {} saddr {} goto {service} comment \"short-circuit pod traffic\"",
            family.nft(),
            family.cluster_cidr()
        ),
        format!(
            "add rule {t} {ext} fib saddr type local jump {MARK_MASQ_CHAIN} comment \"masquerade local traffic\""
        ),
        format!(
            "add rule {t} {ext} fib saddr type local goto {service} comment \"short-circuit local traffic\""
        ),
    ]);
    if svc.uses_local_chain() {
        out.push(format!("add rule {t} {ext} goto {}", n.local));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Layout, sync};
    use crate::spec::{Pod, pods, services};

    const SVC: &str = "service-2EUJKCR2-shop/checkout/tcp/http";

    /// An endpoint on another node.
    fn remote() -> Pod {
        Pod {
            name: "checkout-remote".into(),
            ns: "t-peer".into(),
            ip: "10.244.2.2".parse().unwrap(),
            http_port: 8080,
            udp_port: 5353,
        }
    }

    /// The `numgen` dispatch rule of `chain` in script `s`.
    fn vmap<'a>(s: &'a str, chain: &str) -> &'a str {
        s.lines()
            .find(|l| l.starts_with(&format!("add rule ip kube-proxy {chain} numgen")))
            .unwrap()
    }

    #[test]
    fn local_policy_external_chain_and_local_chain() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints.push(remote());
        svcs[0].traffic.external_local = true;
        let s = sync(&svcs, None, &[], Layout::V1_35).script;
        let ext = SVC.replacen("service-", "external-", 1);
        let local = SVC.replacen("service-", "local-", 1);
        for want in [
            format!("add chain ip kube-proxy {local}"),
            format!(
                "add rule ip kube-proxy {ext} ip saddr 10.244.0.0/16 goto {SVC} comment \"short-circuit pod traffic\""
            ),
            format!(
                "add rule ip kube-proxy {ext} fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\""
            ),
            format!(
                "add rule ip kube-proxy {ext} fib saddr type local goto {SVC} comment \"short-circuit local traffic\""
            ),
            format!("add rule ip kube-proxy {ext} goto {local}"),
        ] {
            assert!(s.lines().any(|l| l == want), "missing {want}\n{s}");
        }
        assert!(vmap(&s, SVC).contains("numgen random mod 4 vmap"), "{s}");
        assert!(vmap(&s, &local).contains("numgen random mod 3 vmap"), "{s}");
        assert!(!vmap(&s, &local).contains("10.244.2.2"), "{s}");
    }

    /// `internalTrafficPolicy: Local`: the ClusterIP's `service-ips` element goes to the
    /// `local-*` chain, which takes the ClusterIP's masquerade rule; the NodePort (Cluster
    /// policy) keeps the Service chain over every endpoint.
    #[test]
    fn internal_local_policy_sends_cluster_ip_traffic_to_the_local_chain() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints.push(remote());
        svcs[0].traffic.internal_local = true;
        let s = sync(&svcs, None, &[], Layout::V1_35).script;
        let (ext, local) = (
            SVC.replacen("service-", "external-", 1),
            SVC.replacen("service-", "local-", 1),
        );
        for want in [
            format!(
                "add element ip kube-proxy service-ips {{ 10.96.35.226 . tcp . 80 : goto {local} }}"
            ),
            format!(
                "add rule ip kube-proxy {local} ip daddr 10.96.35.226 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
            ),
            format!("add rule ip kube-proxy {ext} goto {SVC}"),
        ] {
            assert!(s.lines().any(|l| l == want), "missing {want}\n{s}");
        }
        assert!(vmap(&s, SVC).contains("numgen random mod 4 vmap"), "{s}");
        assert!(vmap(&s, &local).contains("numgen random mod 3 vmap"), "{s}");
        assert!(
            !s.contains(&format!("add rule ip kube-proxy {SVC} ip daddr")),
            "{s}"
        );
    }

    #[test]
    fn affinity_sets_checked_by_the_service_chain_and_updated_by_endpoints() {
        let mut svcs = services(&pods("t"));
        svcs[0].traffic.affinity_timeout_s = Some(10800);
        let s = sync(&svcs, None, &[], Layout::V1_35).script;
        let sets: Vec<&str> = s
            .lines()
            .filter(|l| l.starts_with("add set ip kube-proxy affinity-"))
            .collect();
        assert_eq!(sets.len(), 3, "{s}");
        assert!(sets[0].ends_with("-shop/checkout/tcp/http__10.244.1.12/8080 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }"), "{s}");
        let set = sets[0].split_whitespace().nth(4).unwrap();
        let chain = set.replacen("affinity-", "endpoint-", 1);
        assert!(
            s.contains(&format!(
                "add rule ip kube-proxy {SVC} ip saddr @{set} goto {chain}\n"
            )),
            "{s}"
        );
        assert!(
            s.contains(&format!(
                "add rule ip kube-proxy {chain} update @{set} {{ ip saddr }}\n"
            )),
            "{s}"
        );
        let checks = s.find(&format!("{SVC} ip saddr @")).unwrap();
        assert!(checks < s.find(&format!("{SVC} numgen")).unwrap());
    }
}
