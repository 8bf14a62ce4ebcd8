//! kube-proxy's first sync: the table, its base chains and the maps every Service's
//! elements go into.

use std::collections::BTreeSet;

use super::{CONTAINERS, ENDPOINTS_MAP, Layout, MARK_MASQ_CHAIN, MASQ_MARK, REJECT_CHAIN, table};
use crate::spec::Family;

/// (name, type, hook, priority) of kube-proxy's base chains.
const BASE_CHAINS: [(&str, &str, &str, i32); 8] = [
    ("filter-prerouting", "filter", "prerouting", -110),
    ("filter-input", "filter", "input", -110),
    ("filter-forward", "filter", "forward", -110),
    ("filter-output", "filter", "output", -110),
    ("filter-output-post-dnat", "filter", "output", -90),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
];

/// (destination, source, extra match) of the jumps from the base chains.
const JUMP_CHAINS: [(&str, &str, &str); 11] = [
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

/// `setupNFTables` on kube-proxy's first sync (`flushed` still false).
pub(super) fn setup(out: &mut Vec<String>, family: Family, layout: Layout) {
    let t = table(family);
    out.push(format!(
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}"
    ));
    for (name, ..) in BASE_CHAINS {
        out.push(format!("add chain {t} {name}"));
        out.push(format!("delete chain {t} {name}"));
    }
    for (name, kind, hook, prio) in BASE_CHAINS {
        out.push(format!(
            "add chain {t} {name} {{ type {kind} hook {hook} priority {prio} ; }}"
        ));
        out.push(format!("flush chain {t} {name}"));
    }
    let mut created: BTreeSet<&str> = BTreeSet::new();
    let mut ensure = |out: &mut Vec<String>, chain: &'static str| {
        if created.insert(chain) {
            out.push(format!("add chain {t} {chain}"));
            out.push(format!("flush chain {t} {chain}"));
        }
    };
    for (dst, src, extra) in JUMP_CHAINS {
        ensure(out, dst);
        out.push(format!("add rule {t} {src} {extra}jump {dst}"));
    }
    for chain in ["services", "cluster-ips-check", "masquerading"] {
        ensure(out, chain);
    }
    if layout == Layout::V1_35 {
        ensure(out, MARK_MASQ_CHAIN);
        out.push(format!(
            "add rule {t} {MARK_MASQ_CHAIN} mark set mark or {MASQ_MARK}"
        ));
    }
    out.extend(masquerading_and_maps(family));
    for (kind, name) in CONTAINERS {
        out.push(format!("flush {kind} {t} {name}"));
    }
    if layout == Layout::Dispatch {
        let addr = addr_type(family);
        out.push(format!(
            "add map {t} {ENDPOINTS_MAP} {{ type {addr} . inet_proto . inet_service . mark : {addr} . inet_service ; comment \"endpoints of every Service, by ClusterIP, protocol, port and a random bucket\" ; }}"
        ));
        out.push(format!("flush map {t} {ENDPOINTS_MAP}"));
    }
}

/// proxier.go's `ipvX_addr`.
fn addr_type(family: Family) -> &'static str {
    match family {
        Family::V4 => "ipv4_addr",
        Family::V6 => "ipv6_addr",
    }
}

/// The masquerading rules, the ClusterIP checks and the sets and maps with the rules
/// that consult them.
fn masquerading_and_maps(family: Family) -> [String; 21] {
    let (t, ipx, addr) = (table(family), family.nft(), addr_type(family));
    // proxier.go's `noLocalhost`.
    let no_localhost = match family {
        Family::V4 => "ip daddr != 127.0.0.0/8",
        Family::V6 => "ip6 daddr != ::1",
    };
    let service_cidr = family.service_cidr();
    [
        format!("add rule {t} masquerading mark and {MASQ_MARK} == 0 return"),
        format!("add rule {t} masquerading mark set mark xor {MASQ_MARK}"),
        format!("add rule {t} masquerading masquerade fully-random"),
        format!("add set {t} cluster-ips {{ type {addr} ; comment \"Active ClusterIPs\" ; }}"),
        format!(
            "add rule {t} cluster-ips-check {ipx} daddr @ cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
        ),
        format!(
            "add rule {t} cluster-ips-check {ipx} daddr {{ {service_cidr} }} drop comment \"Drop traffic to unallocated ClusterIPs\""
        ),
        // NodePorts on every local address: the set is created and removed again.
        format!(
            "add set {t} nodeport-ips {{ type {addr} ; comment \"IPs that accept NodePort traffic\" ; }}"
        ),
        format!("delete set {t} nodeport-ips"),
        format!(
            "add map {t} no-endpoint-services {{ type {addr} . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}"
        ),
        format!(
            "add map {t} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}"
        ),
        format!(
            "add chain {t} {REJECT_CHAIN} {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"
        ),
        format!("flush chain {t} {REJECT_CHAIN}"),
        format!("add rule {t} {REJECT_CHAIN} reject"),
        format!(
            "add rule {t} service-endpoints-check {ipx} daddr . meta l4proto . th dport vmap @ no-endpoint-services"
        ),
        format!(
            "add rule {t} nodeport-endpoints-check {no_localhost} meta l4proto . th dport vmap @ no-endpoint-nodeports"
        ),
        format!(
            "add map {t} firewall-ips {{ type {addr} . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}"
        ),
        format!(
            "add rule {t} firewall-check {ipx} daddr . meta l4proto . th dport vmap @ firewall-ips"
        ),
        format!(
            "add map {t} service-ips {{ type {addr} . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}"
        ),
        format!(
            "add map {t} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}"
        ),
        format!("add rule {t} services {ipx} daddr . meta l4proto . th dport vmap @ service-ips"),
        format!(
            "add rule {t} services fib daddr type local {no_localhost} meta l4proto . th dport vmap @ service-nodeports"
        ),
    ]
}
