//! kube-proxy's nftables mode, as an `nft -f` transaction: what `syncProxyRules` in
//! pkg/proxy/nftables/proxier.go sends through knftables for our Services (traffic
//! policies and session affinity in the 1.35 layout: [`policies`], `--cluster-cidr` local detection, NodePorts on every
//! local address, kind's Service CIDR known), in the [`Layout`] of a kube-proxy version,
//! by the proxier of one IP family: `table ip kube-proxy`, or `table ip6 kube-proxy` with
//! proxier.go's IPv6 branches (`ip6` matches, `ipv6_addr` keys, `ip6 daddr != ::1`, an
//! endpoint chain named with its address's `:` as `.`, `dnat to [IP]:port`).

mod elements;
mod policies;
mod setup;

use std::collections::{BTreeMap, BTreeSet};

use crate::spec::{Family, Service};
use elements::{Element, Names, elements, names};

/// kube-proxy's table in `family`: `ip kube-proxy` or `ip6 kube-proxy`.
pub fn table(family: Family) -> String {
    format!("{} kube-proxy", family.nft())
}
/// `fmt.Sprintf("%#08x", 1<<14)`: kube-proxy's default masquerade bit.
const MASQ_MARK: &str = "0x004000";
const MARK_MASQ_CHAIN: &str = "mark-for-masquerade";
const REJECT_CHAIN: &str = "reject-chain";

/// How a kube-proxy version lays out a Service's dispatch to its endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layout {
    /// Up to 1.35: `numgen random mod N vmap { i : goto endpoint-... }`, each endpoint
    /// chain `dnat to ip:port`; masquerading through `jump mark-for-masquerade`.
    V1_35,
    /// 1.36 (kubernetes commit 475f9622c8): `dnat ip addr . port to numgen random mod N
    /// map { i : ip . port }` in the Service chain; the mark-for-masquerade chain is gone
    /// (commit 5cffb4d1f6): the mark is set in place.
    V1_36,
    /// 1.37 (kubernetes PR 140723): as 1.36, one endpoint `dnat to ip:port` directly.
    V1_37,
    /// Proposed for 1.38 (kubernetes PR 140362): ClusterIPs `goto dispatch-N`, which
    /// DNATs through `@endpoints` keyed by `ip daddr . meta l4proto . th dport . ct mark`
    /// after `ct mark set numgen random mod N`; the service-ips element carries the
    /// Service port's name as a comment. Other frontends as in 1.37.
    Dispatch,
}

/// The masquerade mark set in place, where 1.36 and later have no mark-for-masquerade chain.
const MARK_IN_PLACE: &str = "meta mark set meta mark or 0x004000";
/// The map the dispatch layout DNATs through.
const ENDPOINTS_MAP: &str = "endpoints";

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

/// kube-proxy's `syncProxyRules` transaction of its IPv4 proxier ([`sync_family`]).
pub fn sync(
    services: &[Service],
    previous: Option<&[Service]>,
    existing_chains: &[String],
    layout: Layout,
) -> NftSync {
    sync_family(Family::V4, services, previous, existing_chains, layout)
}

/// kube-proxy's `syncProxyRules` transaction of the proxier of `family`.
///
/// `previous` is the state the last sync wrote: `None` makes the first, full sync (table,
/// base chains, maps); otherwise a partial sync that rewrites only the chains of Services
/// that changed and adds or deletes only the map elements that changed.
/// `existing_chains` are the table's chains now (`nft list chains`): Service chains among
/// them that are no longer used are flushed and reported in [`NftSync::stale_chains`].
pub fn sync_family(
    family: Family,
    services: &[Service],
    previous: Option<&[Service]>,
    existing_chains: &[String],
    layout: Layout,
) -> NftSync {
    let t = table(family);
    let mut out = Vec::new();
    if previous.is_none() {
        setup::setup(&mut out, family, layout);
    }
    if layout == Layout::Dispatch {
        dispatch_chains(family, services, &mut out);
    }
    // What the element storages hold from the last sync.
    let mut leftover: Leftover = previous
        .unwrap_or_default()
        .iter()
        .flat_map(|svc| elements(svc, family, layout))
        .map(|e| ((e.container, e.key), e.value))
        .collect();
    let mut active: BTreeSet<String> = BTreeSet::new();
    for svc in services {
        let n = names(svc, family);
        let skip = previous.is_some_and(|prev| prev.contains(svc));
        ensure_chains(svc, &n, skip, (&t, layout), &mut active, &mut out);
        update_elements(svc, family, layout, &mut leftover, &mut out);
        if !skip {
            service_rules(svc, &n, family, layout, &mut out);
        }
    }
    // Service chains (their names have a "/") that nothing uses any more: flushed now.
    let mut stale_chains = Vec::new();
    for chain in existing_chains {
        if chain.contains('/') && !active.contains(chain) {
            out.push(format!("flush chain {t} {chain}"));
            stale_chains.push(chain.clone());
        }
    }
    for name in containers(layout) {
        for (container, key) in leftover.keys().filter(|(c, _)| *c == name) {
            out.push(Element::delete(&t, container, key));
        }
    }
    let mut script = out.join("\n");
    script.push('\n');
    NftSync {
        script,
        stale_chains,
    }
}

/// The containers whose leftover elements a sync deletes, in kube-proxy's order.
fn containers(layout: Layout) -> Vec<&'static str> {
    let mut out: Vec<&str> = CONTAINERS.iter().map(|(_, name)| *name).collect();
    if layout == Layout::Dispatch {
        out.push(ENDPOINTS_MAP);
    }
    out
}

/// The shared `dispatch-N` chains, one per endpoint count in use.
fn dispatch_chains(family: Family, services: &[Service], out: &mut Vec<String>) {
    let (t, ipx) = (table(family), family.nft());
    let counts: BTreeSet<usize> = services
        .iter()
        .map(|s| s.endpoints.len())
        .filter(|n| *n > 0)
        .collect();
    for n in counts {
        out.push(format!("add chain {t} dispatch-{n}"));
        out.push(format!("flush chain {t} dispatch-{n}"));
        out.push(format!(
            "add rule {t} dispatch-{n} ct mark set numgen random mod {n} dnat {ipx} addr . port to {ipx} daddr . meta l4proto . th dport . ct mark map @{ENDPOINTS_MAP}"
        ));
    }
}

/// Elements the last sync wrote, by (container, key), with their values.
type Leftover = BTreeMap<(&'static str, String), Option<String>>;

/// Creates (and empties) the Service port's chains, unless they are unchanged (`skip`);
/// either way they count as in use.
fn ensure_chains(
    svc: &Service,
    n: &Names,
    skip: bool,
    (t, layout): (&str, Layout),
    active: &mut BTreeSet<String>,
    out: &mut Vec<String>,
) {
    let has_endpoints = !svc.endpoints.is_empty();
    let mut ensure_chain = |out: &mut Vec<String>, chain: &str| {
        if active.insert(chain.to_string()) && !skip {
            out.push(format!("add chain {t} {chain}"));
            out.push(format!("flush chain {t} {chain}"));
        }
    };
    if layout == Layout::V1_35 {
        for (_, chain) in &n.endpoints {
            ensure_chain(out, chain);
        }
    }
    if svc.uses_cluster_chain() {
        ensure_chain(out, &n.service);
    }
    if svc.uses_local_chain() {
        ensure_chain(out, &n.local);
    }
    if has_endpoints && svc.node_port.is_some() {
        ensure_chain(out, &n.external);
    }
    if !skip && has_endpoints {
        out.extend(policies::affinity_sets(svc, n, family_of(t), t));
    }
}

/// The family of kube-proxy's table `t` (`ip kube-proxy` or `ip6 kube-proxy`).
fn family_of(t: &str) -> Family {
    match t.starts_with("ip6 ") {
        true => Family::V6,
        false => Family::V4,
    }
}

/// Adds the Service port's elements that are new or changed since the last sync; what
/// stays in `leftover` is deleted at the end.
fn update_elements(
    svc: &Service,
    family: Family,
    layout: Layout,
    leftover: &mut Leftover,
    out: &mut Vec<String>,
) {
    let t = table(family);
    for e in elements(svc, family, layout) {
        match leftover.remove(&(e.container, e.key.clone())) {
            Some(old) if old == e.value => {}
            Some(_) => {
                out.push(Element::delete(&t, e.container, &e.key));
                out.push(e.add(&t));
            }
            None => out.push(e.add(&t)),
        }
    }
}

/// The rules of a Service port's chains: masquerade, the numgen dispatch, the DNATs.
fn service_rules(svc: &Service, n: &Names, family: Family, layout: Layout, out: &mut Vec<String>) {
    let (t, ipx) = (table(family), family.nft());
    let proto = svc.proto.as_str();
    let has_endpoints = !svc.endpoints.is_empty();
    let masquerade = match layout {
        Layout::V1_35 => format!("jump {MARK_MASQ_CHAIN}"),
        _ => MARK_IN_PLACE.to_owned(),
    };
    if has_endpoints {
        out.push(format!(
            "add rule {t} {} {ipx} daddr {} {proto} dport {} {ipx} saddr != {} {masquerade}",
            policies::internal_chain(svc, n),
            family.ip(svc.cluster_ip),
            svc.port,
            family.cluster_cidr()
        ));
    }
    if has_endpoints && svc.node_port.is_some() && svc.traffic.external_local {
        policies::external_local(svc, n, family, &t, out);
    } else if has_endpoints && svc.node_port.is_some() {
        out.push(format!("add rule {t} {} {masquerade}", n.external));
        out.push(format!("add rule {t} {} goto {}", n.external, n.service));
    }
    if !has_endpoints {
        return;
    }
    let endpoints = svc.endpoint_addrs_in(family);
    match layout {
        Layout::V1_35 => {
            let all: Vec<usize> = (0..n.endpoints.len()).collect();
            if svc.uses_cluster_chain() {
                policies::to_endpoints(svc, n, (&t, ipx), &n.service, &all, out);
            }
            if svc.uses_local_chain() {
                let local = policies::local_endpoints(svc, n, family);
                policies::to_endpoints(svc, n, (&t, ipx), &n.local, &local, out);
            }
            for (i, (ep, chain)) in n.endpoints.iter().enumerate() {
                out.push(format!(
                    "add rule {t} {chain} {ipx} saddr {} jump {MARK_MASQ_CHAIN}",
                    ep.ip()
                ));
                if svc.traffic.affinity_timeout_s.is_some() {
                    out.push(format!(
                        "add rule {t} {chain} update @{} {{ {ipx} saddr }}",
                        n.affinity[i]
                    ));
                }
                out.push(format!(
                    "add rule {t} {chain} meta l4proto {proto} dnat to {ep}"
                ));
            }
        }
        Layout::V1_37 | Layout::Dispatch if endpoints.len() == 1 => {
            out.push(format!(
                "add rule {t} {} meta l4proto {proto} dnat to {}",
                n.service, endpoints[0]
            ));
        }
        _ => {
            let map: Vec<String> = endpoints
                .iter()
                .enumerate()
                .map(|(i, ep)| format!("{i} : {} . {}", ep.ip(), ep.port()))
                .collect();
            out.push(format!(
                "add rule {t} {} meta l4proto {proto} dnat {ipx} addr . port to numgen random mod {} map {{ {} }}",
                n.service,
                endpoints.len(),
                map.join(" , ")
            ));
        }
    }
}

/// The transaction that deletes stale chains (kube-proxy's next sync, a second later).
pub fn delete_chains(family: Family, chains: &[String]) -> String {
    let t = table(family);
    chains
        .iter()
        .map(|c| format!("delete chain {t} {c}\n"))
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
    use super::*;
    use crate::names::nft_endpoint_base;
    use crate::spec::{pods, services};

    const SVC: &str = "service-2EUJKCR2-shop/checkout/tcp/http";

    fn ep_chain(ip: &str) -> String {
        let endpoint: std::net::SocketAddrV4 = ip.parse().unwrap();
        let base = nft_endpoint_base("shop", "checkout", "tcp", "http", endpoint);
        format!("endpoint-{base}")
    }

    #[test]
    fn service_chain_name_has_hash_and_readable_name() {
        let svcs = services(&pods("t"));
        assert_eq!(names(&svcs[0], Family::V4).service, SVC);
        assert_eq!(
            names(&svcs[0], Family::V4).external,
            SVC.replacen("service-", "external-", 1)
        );
    }

    #[test]
    fn full_sync_dispatches_through_maps_numgen_and_dnat() {
        let svcs = services(&pods("t"));
        let s = sync(&svcs, None, &[], Layout::V1_35).script;
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
        assert_eq!(
            sync(&svcs, None, &[], Layout::V1_35).stale_chains,
            Vec::<String>::new()
        );
    }

    #[test]
    fn service_without_endpoints_rejects_via_commented_elements() {
        let mut svcs = services(&pods("t"));
        svcs[0].endpoints.clear();
        let s = sync(&svcs, None, &[], Layout::V1_35).script;
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
            let full = sync(&before, None, &[], Layout::V1_35).script;
            full.lines()
                .filter_map(|l| l.strip_prefix("add chain ip kube-proxy "))
                .filter(|c| !c.contains('{'))
                .map(str::to_string)
                .collect()
        };
        let flip = sync(&after, Some(&before), &existing, Layout::V1_35);
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
            delete_chains(Family::V4, &flip.stale_chains),
            format!("delete chain ip kube-proxy {b}\n")
        );
    }

    #[test]
    fn losing_the_last_endpoint_swaps_map_elements() {
        let before = services(&pods("t"));
        let mut after = before.clone();
        after[1].endpoints.clear();
        let s = sync(&after, Some(&before), &[], Layout::V1_35).script;
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

#[cfg(test)]
mod ipv6_tests;
