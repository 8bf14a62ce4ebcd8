//! kube-proxy's nftables mode, as an `nft -f` transaction: what `syncProxyRules` in
//! pkg/proxy/nftables/proxier.go sends through knftables for our Services (Cluster traffic
//! policies, no session affinity, `--cluster-cidr` local detection, NodePorts on every
//! local address, kind's Service CIDR known).

use std::collections::{BTreeMap, BTreeSet};

use super::names::{nft_endpoint_base, nft_service_base};
use super::spec::{CLUSTER_CIDR, SERVICE_CIDR, Service};

/// kube-proxy's table, in the `ip` family.
pub const TABLE: &str = "ip kube-proxy";
/// `fmt.Sprintf("%#08x", 1<<14)`: kube-proxy's default masquerade bit.
const MASQ_MARK: &str = "0x004000";
const MARK_MASQ_CHAIN: &str = "mark-for-masquerade";
const REJECT_CHAIN: &str = "reject-chain";

/// The maps and sets kube-proxy keeps element by element (its `nftElementStorage`s), in the
/// order it cleans up their leftovers.
const CONTAINERS: [(&str, &str); 6] = [
    ("set", "cluster-ips"),
    ("map", "service-ips"),
    ("map", "firewall-ips"),
    ("map", "no-endpoint-services"),
    ("map", "no-endpoint-nodeports"),
    ("map", "service-nodeports"),
];

/// One sync's transaction and the Service chains it left empty: kube-proxy deletes those
/// in a later sync, at least a second afterwards ([`delete_chains`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftSync {
    pub script: String,
    pub stale_chains: Vec<String>,
}

/// One element of a set or map: what kube-proxy's `ensureElem` is handed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Element {
    container: &'static str,
    key: String,
    value: Option<String>,
    comment: Option<String>,
}

impl Element {
    fn add(&self) -> String {
        let comment = self
            .comment
            .as_ref()
            .map(|c| format!(" comment \"{c}\""))
            .unwrap_or_default();
        let value = self
            .value
            .as_ref()
            .map(|v| format!(" : {v}"))
            .unwrap_or_default();
        format!(
            "add element {TABLE} {} {{ {}{comment}{value} }}",
            self.container, self.key
        )
    }

    fn delete(container: &str, key: &str) -> String {
        format!("delete element {TABLE} {container} {{ {key} }}")
    }
}

/// The chain names kube-proxy derives for one Service port.
struct Names {
    service: String,
    external: String,
    endpoints: Vec<(std::net::SocketAddrV4, String)>,
}

fn names(svc: &Service) -> Names {
    let proto = svc.proto.as_str();
    let base = nft_service_base(&svc.namespace, &svc.name, proto, &svc.port_name);
    Names {
        service: format!("service-{base}"),
        external: format!("external-{base}"),
        endpoints: svc
            .endpoint_addrs()
            .into_iter()
            .map(|ep| {
                let b = nft_endpoint_base(&svc.namespace, &svc.name, proto, &svc.port_name, ep);
                (ep, format!("endpoint-{b}"))
            })
            .collect(),
    }
}

/// The elements a Service port puts into kube-proxy's sets and maps.
fn elements(svc: &Service) -> Vec<Element> {
    let n = names(svc);
    let proto = svc.proto.as_str();
    let has_endpoints = !svc.endpoints.is_empty();
    let spn = svc.port_name_string();
    let ip_key = format!("{} . {proto} . {}", svc.cluster_ip, svc.port);
    let mut out = vec![Element {
        container: "cluster-ips",
        key: svc.cluster_ip.to_string(),
        value: None,
        comment: None,
    }];
    if has_endpoints {
        out.push(Element {
            container: "service-ips",
            key: ip_key,
            value: Some(format!("goto {}", n.service)),
            comment: None,
        });
    } else {
        out.push(Element {
            container: "no-endpoint-services",
            key: ip_key,
            value: Some(format!("goto {REJECT_CHAIN}")),
            comment: Some(spn.clone()),
        });
    }
    if let Some(np) = svc.node_port {
        let key = format!("{proto} . {np}");
        if has_endpoints {
            out.push(Element {
                container: "service-nodeports",
                key,
                value: Some(format!("goto {}", n.external)),
                comment: None,
            });
        } else {
            out.push(Element {
                container: "no-endpoint-nodeports",
                key,
                value: Some(format!("goto {REJECT_CHAIN}")),
                comment: Some(spn),
            });
        }
    }
    out
}

/// `setupNFTables` on kube-proxy's first sync (`flushed` still false).
fn setup(out: &mut Vec<String>) {
    let base_chains: [(&str, &str, &str, i32); 8] = [
        ("filter-prerouting", "filter", "prerouting", -110),
        ("filter-input", "filter", "input", -110),
        ("filter-forward", "filter", "forward", -110),
        ("filter-output", "filter", "output", -110),
        ("filter-output-post-dnat", "filter", "output", -90),
        ("nat-prerouting", "nat", "prerouting", -100),
        ("nat-output", "nat", "output", -100),
        ("nat-postrouting", "nat", "postrouting", 100),
    ];
    let jump_chains: [(&str, &str, &str); 11] = [
        ("nodeport-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-forward", "ct state new "),
        ("service-endpoints-check", "filter-output", "ct state new "),
        ("firewall-check", "filter-prerouting", "ct state new "),
        ("firewall-check", "filter-output", "ct state new "),
        ("services", "nat-output", ""),
        ("services", "nat-prerouting", ""),
        ("masquerading", "nat-postrouting", ""),
        ("cluster-ips-check", "filter-forward", "ct state new "),
        (
            "cluster-ips-check",
            "filter-output-post-dnat",
            "ct state new ",
        ),
    ];
    out.push(format!(
        "add table {TABLE} {{ comment \"rules for kube-proxy\" ; }}"
    ));
    for (name, ..) in base_chains {
        out.push(format!("add chain {TABLE} {name}"));
        out.push(format!("delete chain {TABLE} {name}"));
    }
    for (name, kind, hook, prio) in base_chains {
        out.push(format!(
            "add chain {TABLE} {name} {{ type {kind} hook {hook} priority {prio} ; }}"
        ));
        out.push(format!("flush chain {TABLE} {name}"));
    }
    let mut created: BTreeSet<&str> = BTreeSet::new();
    let mut ensure = |out: &mut Vec<String>, chain: &'static str| {
        if created.insert(chain) {
            out.push(format!("add chain {TABLE} {chain}"));
            out.push(format!("flush chain {TABLE} {chain}"));
        }
    };
    for (dst, src, extra) in jump_chains {
        ensure(out, dst);
        out.push(format!("add rule {TABLE} {src} {extra}jump {dst}"));
    }
    for chain in [
        "services",
        "cluster-ips-check",
        "masquerading",
        MARK_MASQ_CHAIN,
    ] {
        ensure(out, chain);
    }
    out.extend([
        format!("add rule {TABLE} {MARK_MASQ_CHAIN} mark set mark or {MASQ_MARK}"),
        format!("add rule {TABLE} masquerading mark and {MASQ_MARK} == 0 return"),
        format!("add rule {TABLE} masquerading mark set mark xor {MASQ_MARK}"),
        format!("add rule {TABLE} masquerading masquerade fully-random"),
        format!("add set {TABLE} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}"),
        format!("add rule {TABLE} cluster-ips-check ip daddr @ cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""),
        format!("add rule {TABLE} cluster-ips-check ip daddr {{ {SERVICE_CIDR} }} drop comment \"Drop traffic to unallocated ClusterIPs\""),
        // NodePorts on every local address: the set is created and removed again.
        format!("add set {TABLE} nodeport-ips {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}"),
        format!("delete set {TABLE} nodeport-ips"),
        format!("add map {TABLE} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}"),
        format!("add map {TABLE} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}"),
        format!("add chain {TABLE} {REJECT_CHAIN} {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"),
        format!("flush chain {TABLE} {REJECT_CHAIN}"),
        format!("add rule {TABLE} {REJECT_CHAIN} reject"),
        format!("add rule {TABLE} service-endpoints-check ip daddr . meta l4proto . th dport vmap @ no-endpoint-services"),
        format!("add rule {TABLE} nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @ no-endpoint-nodeports"),
        format!("add map {TABLE} firewall-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}"),
        format!("add rule {TABLE} firewall-check ip daddr . meta l4proto . th dport vmap @ firewall-ips"),
        format!("add map {TABLE} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}"),
        format!("add map {TABLE} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}"),
        format!("add rule {TABLE} services ip daddr . meta l4proto . th dport vmap @ service-ips"),
        format!("add rule {TABLE} services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @ service-nodeports"),
    ]);
    for (kind, name) in CONTAINERS {
        out.push(format!("flush {kind} {TABLE} {name}"));
    }
}

/// kube-proxy's `syncProxyRules` transaction.
///
/// `previous` is the state the last sync wrote: `None` makes the first, full sync (table,
/// base chains, maps); otherwise a partial sync that rewrites only the chains of Services
/// that changed and adds or deletes only the map elements that changed.
/// `existing_chains` are the table's chains now (`nft list chains`): Service chains among
/// them that are no longer used are flushed and reported in [`NftSync::stale_chains`].
pub fn sync(
    services: &[Service],
    previous: Option<&[Service]>,
    existing_chains: &[String],
) -> NftSync {
    let mut out = Vec::new();
    if previous.is_none() {
        setup(&mut out);
    }
    // What the element storages hold from the last sync.
    let mut leftover: BTreeMap<(&'static str, String), Option<String>> = previous
        .unwrap_or_default()
        .iter()
        .flat_map(elements)
        .map(|e| ((e.container, e.key), e.value))
        .collect();
    let mut active: BTreeSet<String> = BTreeSet::new();

    for svc in services {
        let n = names(svc);
        let proto = svc.proto.as_str();
        let has_endpoints = !svc.endpoints.is_empty();
        let uses_ext_chain = has_endpoints && svc.node_port.is_some();
        let skip = previous.is_some_and(|prev| prev.contains(svc));

        let mut ensure_chain = |out: &mut Vec<String>, chain: &str| {
            if active.insert(chain.to_string()) && !skip {
                out.push(format!("add chain {TABLE} {chain}"));
                out.push(format!("flush chain {TABLE} {chain}"));
            }
        };
        for (_, chain) in &n.endpoints {
            ensure_chain(&mut out, chain);
        }
        if has_endpoints {
            ensure_chain(&mut out, &n.service);
        }
        if uses_ext_chain {
            ensure_chain(&mut out, &n.external);
        }

        for e in elements(svc) {
            match leftover.remove(&(e.container, e.key.clone())) {
                Some(old) if old == e.value => {}
                Some(_) => {
                    out.push(Element::delete(e.container, &e.key));
                    out.push(e.add());
                }
                None => out.push(e.add()),
            }
        }

        if skip {
            continue;
        }
        if has_endpoints {
            out.push(format!(
                "add rule {TABLE} {} ip daddr {} {proto} dport {} ip saddr != {CLUSTER_CIDR} jump {MARK_MASQ_CHAIN}",
                n.service, svc.cluster_ip, svc.port
            ));
        }
        if uses_ext_chain {
            out.push(format!(
                "add rule {TABLE} {} jump {MARK_MASQ_CHAIN}",
                n.external
            ));
            out.push(format!(
                "add rule {TABLE} {} goto {}",
                n.external, n.service
            ));
        }
        if has_endpoints {
            let vmap: Vec<String> = n
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, (_, c))| format!("{i} : goto {c}"))
                .collect();
            out.push(format!(
                "add rule {TABLE} {} numgen random mod {} vmap {{ {} }}",
                n.service,
                n.endpoints.len(),
                vmap.join(" , ")
            ));
        }
        for (ep, chain) in &n.endpoints {
            out.push(format!(
                "add rule {TABLE} {chain} ip saddr {} jump {MARK_MASQ_CHAIN}",
                ep.ip()
            ));
            out.push(format!(
                "add rule {TABLE} {chain} meta l4proto {proto} dnat to {ep}"
            ));
        }
    }

    // Service chains (their names have a "/") that nothing uses any more: flushed now.
    let mut stale_chains = Vec::new();
    for chain in existing_chains {
        if chain.contains('/') && !active.contains(chain) {
            out.push(format!("flush chain {TABLE} {chain}"));
            stale_chains.push(chain.clone());
        }
    }
    for (_, name) in CONTAINERS {
        for (container, key) in leftover.keys().filter(|(c, _)| *c == name) {
            out.push(Element::delete(container, key));
        }
    }

    let mut script = out.join("\n");
    script.push('\n');
    NftSync {
        script,
        stale_chains,
    }
}

/// The transaction that deletes stale chains (kube-proxy's next sync, a second later).
pub fn delete_chains(chains: &[String]) -> String {
    chains
        .iter()
        .map(|c| format!("delete chain {TABLE} {c}\n"))
        .collect()
}

/// The names of kube-proxy's chains in `nft -j list chains ip` (every table's chains; as
/// knftables does, since nft before 1.0.7 cannot list one table's chains).
pub fn chains_in_json(json: &str) -> Result<Vec<String>, serde_json::Error> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    let ours = |chain: &serde_json::Value| {
        chain
            .get("table")?
            .as_str()
            .filter(|t| *t == "kube-proxy")?;
        chain.get("name")?.as_str().map(str::to_string)
    };
    Ok(v.get("nftables")
        .and_then(|a| a.as_array())
        .map(|items| items.iter().filter_map(|i| ours(i.get("chain")?)).collect())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::super::spec::{pods, services};
    use super::*;

    const SVC: &str = "service-2EUJKCR2-shop/checkout/tcp/http";

    fn ep_chain(ip: &str) -> String {
        let base = nft_endpoint_base("shop", "checkout", "tcp", "http", ip.parse().unwrap());
        format!("endpoint-{base}")
    }

    #[test]
    fn service_chain_name_has_hash_and_readable_name() {
        let svcs = services(&pods("t"));
        assert_eq!(names(&svcs[0]).service, SVC);
        assert_eq!(
            names(&svcs[0]).external,
            SVC.replacen("service-", "external-", 1)
        );
    }

    #[test]
    fn full_sync_dispatches_through_maps_numgen_and_dnat() {
        let svcs = services(&pods("t"));
        let s = sync(&svcs, None, &[]).script;
        let l: Vec<&str> = s.lines().collect();
        assert_eq!(
            l[0],
            "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }"
        );
        let ext = SVC.replacen("service-", "external-", 1);
        let (a, b, c) = (
            ep_chain("10.244.1.12:8080"),
            ep_chain("10.244.1.13:8080"),
            ep_chain("10.244.1.14:8080"),
        );
        for want in [
            "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }"
                .to_string(),
            "add rule ip kube-proxy nat-prerouting jump services".to_string(),
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @ service-ips"
                .to_string(),
            "add element ip kube-proxy cluster-ips { 10.96.35.226 }".to_string(),
            format!(
                "add element ip kube-proxy service-ips {{ 10.96.35.226 . tcp . 80 : goto {SVC} }}"
            ),
            format!("add element ip kube-proxy service-nodeports {{ tcp . 30080 : goto {ext} }}"),
            format!(
                "add rule ip kube-proxy {SVC} ip daddr 10.96.35.226 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
            ),
            format!("add rule ip kube-proxy {ext} jump mark-for-masquerade"),
            format!("add rule ip kube-proxy {ext} goto {SVC}"),
            format!(
                "add rule ip kube-proxy {SVC} numgen random mod 3 vmap {{ 0 : goto {a} , 1 : goto {b} , 2 : goto {c} }}"
            ),
            format!("add rule ip kube-proxy {a} ip saddr 10.244.1.12 jump mark-for-masquerade"),
            format!("add rule ip kube-proxy {a} meta l4proto tcp dnat to 10.244.1.12:8080"),
            "add element ip kube-proxy service-ips { 10.96.0.10 . udp . 53 : goto service-"
                .to_string(),
        ] {
            assert!(
                l.iter().any(|x| x.starts_with(want.as_str())),
                "missing: {want}\n{s}"
            );
        }
        assert!(
            a.starts_with("endpoint-") && a.ends_with("-shop/checkout/tcp/http__10.244.1.12/8080")
        );
        assert!(!s.contains("no-endpoint-services {  "));
        assert!(!s.contains("add element ip kube-proxy no-endpoint"));
        assert_eq!(sync(&svcs, None, &[]).stale_chains, Vec::<String>::new());
    }

    #[test]
    fn service_without_endpoints_rejects_via_commented_elements() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints.clear();
        let s = sync(&svcs, None, &[]).script;
        assert!(s.contains("add element ip kube-proxy no-endpoint-services { 10.96.35.226 . tcp . 80 comment \"shop/checkout:http\" : goto reject-chain }\n"));
        assert!(s.contains("add element ip kube-proxy no-endpoint-nodeports { tcp . 30080 comment \"shop/checkout:http\" : goto reject-chain }\n"));
        assert!(s.contains("add element ip kube-proxy cluster-ips { 10.96.35.226 }\n"));
        assert!(!s.contains(SVC));
        assert!(!s.contains("service-nodeports { tcp . 30080"));
    }

    #[test]
    fn readiness_flip_rewrites_the_service_chain_and_flushes_the_stale_endpoint() {
        let before = services(&pods("t"));
        let mut after = before.clone();
        after[0].endpoints.retain(|p| p.name != "checkout-b");
        let existing: Vec<String> = {
            let full = sync(&before, None, &[]).script;
            full.lines()
                .filter_map(|l| l.strip_prefix("add chain ip kube-proxy "))
                .filter(|c| !c.contains('{'))
                .map(str::to_string)
                .collect()
        };
        let flip = sync(&after, Some(&before), &existing);
        let (a, b, c) = (
            ep_chain("10.244.1.12:8080"),
            ep_chain("10.244.1.13:8080"),
            ep_chain("10.244.1.14:8080"),
        );
        let want = [
            format!("add chain ip kube-proxy {a}"),
            format!("flush chain ip kube-proxy {a}"),
            format!("add chain ip kube-proxy {c}"),
            format!("flush chain ip kube-proxy {c}"),
            format!("add chain ip kube-proxy {SVC}"),
            format!("flush chain ip kube-proxy {SVC}"),
        ];
        let l: Vec<&str> = flip.script.lines().collect();
        assert_eq!(
            l[..6],
            want.iter().map(String::as_str).collect::<Vec<_>>()[..]
        );
        assert!(l.contains(&format!("add rule ip kube-proxy {SVC} numgen random mod 2 vmap {{ 0 : goto {a} , 1 : goto {c} }}").as_str()));
        assert_eq!(*l.last().unwrap(), format!("flush chain ip kube-proxy {b}"));
        assert_eq!(flip.stale_chains, vec![b.clone()]);
        // Unchanged map elements and the untouched kube-dns chains are not rewritten.
        assert!(!flip.script.contains("element"));
        assert!(!flip.script.contains("kube-dns"));
        assert!(!flip.script.contains("add table"));
        assert_eq!(
            delete_chains(&flip.stale_chains),
            format!("delete chain ip kube-proxy {b}\n")
        );
    }

    #[test]
    fn losing_the_last_endpoint_swaps_map_elements() {
        let before = services(&pods("t"));
        let mut after = before.clone();
        after[1].endpoints.clear();
        let s = sync(&after, Some(&before), &[]).script;
        assert!(s.contains("add element ip kube-proxy no-endpoint-services { 10.96.0.10 . udp . 53 comment \"kube-system/kube-dns:dns\" : goto reject-chain }\n"));
        assert!(
            s.ends_with("delete element ip kube-proxy service-ips { 10.96.0.10 . udp . 53 }\n")
        );
    }

    #[test]
    fn chains_are_read_from_nft_json() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 3}}, {"chain": {"family": "ip", "table": "other", "name": "input", "handle": 1}}, {"chain": {"family": "ip", "table": "kube-proxy", "name": "service-X-a/b/tcp/c", "handle": 9}}]}"#;
        assert_eq!(
            chains_in_json(json).unwrap(),
            ["services", "service-X-a/b/tcp/c"]
        );
        assert!(chains_in_json("not json").is_err());
    }
}
