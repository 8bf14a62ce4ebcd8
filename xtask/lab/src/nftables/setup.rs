//! kube-proxy's first sync: the table, its base chains and the maps every Service's
//! elements go into.

use std::collections::BTreeSet;

use super::{CONTAINERS, ENDPOINTS_MAP, Layout, MARK_MASQ_CHAIN, MASQ_MARK, REJECT_CHAIN, TABLE};
use crate::spec::SERVICE_CIDR;

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
pub(super) fn setup(out: &mut Vec<String>, layout: Layout) {
    out.push(format!(
        "add table {TABLE} {{ comment \"rules for kube-proxy\" ; }}"
    ));
    for (name, ..) in BASE_CHAINS {
        out.push(format!("add chain {TABLE} {name}"));
        out.push(format!("delete chain {TABLE} {name}"));
    }
    for (name, kind, hook, prio) in BASE_CHAINS {
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
    for (dst, src, extra) in JUMP_CHAINS {
        ensure(out, dst);
        out.push(format!("add rule {TABLE} {src} {extra}jump {dst}"));
    }
    for chain in ["services", "cluster-ips-check", "masquerading"] {
        ensure(out, chain);
    }
    if layout == Layout::V1_35 {
        ensure(out, MARK_MASQ_CHAIN);
        out.push(format!(
            "add rule {TABLE} {MARK_MASQ_CHAIN} mark set mark or {MASQ_MARK}"
        ));
    }
    out.extend(masquerading_and_maps());
    for (kind, name) in CONTAINERS {
        out.push(format!("flush {kind} {TABLE} {name}"));
    }
    if layout == Layout::Dispatch {
        out.push(format!(
            "add map {TABLE} {ENDPOINTS_MAP} {{ type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service ; comment \"endpoints of every Service, by ClusterIP, protocol, port and a random bucket\" ; }}"
        ));
        out.push(format!("flush map {TABLE} {ENDPOINTS_MAP}"));
    }
}

/// The masquerading rules, the ClusterIP checks and the sets and maps with the rules
/// that consult them.
fn masquerading_and_maps() -> [String; 21] {
    [
        format!("add rule {TABLE} masquerading mark and {MASQ_MARK} == 0 return"),
        format!("add rule {TABLE} masquerading mark set mark xor {MASQ_MARK}"),
        format!("add rule {TABLE} masquerading masquerade fully-random"),
        format!(
            "add set {TABLE} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}"
        ),
        format!(
            "add rule {TABLE} cluster-ips-check ip daddr @ cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
        ),
        format!(
            "add rule {TABLE} cluster-ips-check ip daddr {{ {SERVICE_CIDR} }} drop comment \"Drop traffic to unallocated ClusterIPs\""
        ),
        // NodePorts on every local address: the set is created and removed again.
        format!(
            "add set {TABLE} nodeport-ips {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}"
        ),
        format!("delete set {TABLE} nodeport-ips"),
        format!(
            "add map {TABLE} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}"
        ),
        format!(
            "add map {TABLE} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}"
        ),
        format!(
            "add chain {TABLE} {REJECT_CHAIN} {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"
        ),
        format!("flush chain {TABLE} {REJECT_CHAIN}"),
        format!("add rule {TABLE} {REJECT_CHAIN} reject"),
        format!(
            "add rule {TABLE} service-endpoints-check ip daddr . meta l4proto . th dport vmap @ no-endpoint-services"
        ),
        format!(
            "add rule {TABLE} nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @ no-endpoint-nodeports"
        ),
        format!(
            "add map {TABLE} firewall-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}"
        ),
        format!(
            "add rule {TABLE} firewall-check ip daddr . meta l4proto . th dport vmap @ firewall-ips"
        ),
        format!(
            "add map {TABLE} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}"
        ),
        format!(
            "add map {TABLE} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}"
        ),
        format!("add rule {TABLE} services ip daddr . meta l4proto . th dport vmap @ service-ips"),
        format!(
            "add rule {TABLE} services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @ service-nodeports"
        ),
    ]
}
