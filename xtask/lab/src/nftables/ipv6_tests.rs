//! The IPv6 proxier's transaction: proxier.go's IPv6 branches (`ip6` matches, `ipv6_addr`
//! keys, `ip6 daddr != ::1`, endpoint chains named with `.` for `:`, `dnat to [IP]:port`)
//! in every layout, and nothing of IPv4 left in it.

use super::*;
use crate::names::{nft_endpoint_base, nft_service_base};
use crate::spec::{pods, services};

fn v6_sync(layout: Layout) -> String {
    sync_family(Family::V6, &services(&pods("t")), None, &[], layout).script
}

fn has(script: &str, line: &str) {
    assert!(
        script.lines().any(|l| l == line),
        "missing: {line}\n{script}"
    );
}

#[test]
fn the_ipv6_table_has_no_ipv4_in_any_layout() {
    for layout in [
        Layout::V1_35,
        Layout::V1_36,
        Layout::V1_37,
        Layout::Dispatch,
    ] {
        let s = v6_sync(layout);
        assert!(
            s.lines().all(|l| l.contains(" ip6 kube-proxy ")),
            "{layout:?}\n{s}"
        );
        for v4 in [
            " ip daddr",
            " ip saddr",
            "ipv4_addr",
            "127.0.0.0/8",
            " 10.",
            "dnat ip ",
        ] {
            assert!(!s.contains(v4), "{layout:?}: {v4}\n{s}");
        }
    }
}

#[test]
fn setup_and_maps_follow_proxier_gos_ipv6_branches() {
    let s = v6_sync(Layout::V1_35);
    for line in [
        "add table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }",
        "add set ip6 kube-proxy cluster-ips { type ipv6_addr ; comment \"Active ClusterIPs\" ; }",
        "add rule ip6 kube-proxy cluster-ips-check ip6 daddr @ cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
        "add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
        "add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr != ::1 meta l4proto . th dport vmap @ no-endpoint-nodeports",
        "add map ip6 kube-proxy service-ips { type ipv6_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }",
        "add rule ip6 kube-proxy services ip6 daddr . meta l4proto . th dport vmap @ service-ips",
        "add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @ service-nodeports",
        "add element ip6 kube-proxy cluster-ips { fd00:10:96::23e2 }",
    ] {
        has(&s, line);
    }
}

#[test]
fn each_layout_dnats_to_ipv6_endpoints() {
    let svc = format!(
        "service-{}",
        nft_service_base("shop", "checkout", "tcp", "http")
    );
    let endpoint = |ip: &str| {
        let addr: std::net::SocketAddr = format!("[{ip}]:8080").parse().unwrap();
        format!(
            "endpoint-{}",
            nft_endpoint_base("shop", "checkout", "tcp", "http", addr)
        )
    };
    let a = endpoint("fd00:10:244:1::c");
    assert!(
        a.ends_with("-shop/checkout/tcp/http__fd00.10.244.1..c/8080"),
        "{a}"
    );
    let s = v6_sync(Layout::V1_35);
    has(
        &s,
        &format!(
            "add rule ip6 kube-proxy {svc} ip6 daddr fd00:10:96::23e2 tcp dport 80 ip6 saddr != fd00:10:244::/56 jump mark-for-masquerade"
        ),
    );
    has(
        &s,
        &format!("add rule ip6 kube-proxy {a} ip6 saddr fd00:10:244:1::c jump mark-for-masquerade"),
    );
    has(
        &s,
        &format!("add rule ip6 kube-proxy {a} meta l4proto tcp dnat to [fd00:10:244:1::c]:8080"),
    );
    let squashed = format!(
        "add rule ip6 kube-proxy {svc} meta l4proto tcp dnat ip6 addr . port to numgen random mod 3 map {{ 0 : fd00:10:244:1::c . 8080 , 1 : fd00:10:244:1::d . 8080 , 2 : fd00:10:244:1::e . 8080 }}"
    );
    has(&v6_sync(Layout::V1_36), &squashed);
    has(&v6_sync(Layout::V1_37), &squashed);
    let dispatch = v6_sync(Layout::Dispatch);
    has(
        &dispatch,
        "add rule ip6 kube-proxy dispatch-3 ct mark set numgen random mod 3 dnat ip6 addr . port to ip6 daddr . meta l4proto . th dport . ct mark map @endpoints",
    );
    has(
        &dispatch,
        "add element ip6 kube-proxy endpoints { fd00:10:96::23e2 . tcp . 80 . 0 : fd00:10:244:1::c . 8080 }",
    );
    assert!(dispatch.contains("add map ip6 kube-proxy endpoints { type ipv6_addr . inet_proto . inet_service . mark : ipv6_addr . inet_service ;"));

    // 1.37: one endpoint left is DNATed from the Service chain itself.
    let mut one = services(&pods("t"));
    one[0].endpoints.truncate(1);
    let s = sync_family(Family::V6, &one, None, &[], Layout::V1_37).script;
    has(
        &s,
        &format!("add rule ip6 kube-proxy {svc} meta l4proto tcp dnat to [fd00:10:244:1::c]:8080"),
    );
}

#[test]
fn a_partial_ipv6_sync_flushes_and_later_deletes_its_own_tables_chains() {
    let before = services(&pods("t"));
    let mut after = before.clone();
    after[0].endpoints.truncate(2);
    let existing: Vec<String> = sync_family(Family::V6, &before, None, &[], Layout::V1_35)
        .script
        .lines()
        .filter_map(|l| l.strip_prefix("add chain ip6 kube-proxy "))
        .filter(|c| !c.contains('{'))
        .map(str::to_string)
        .collect();
    let flip = sync_family(Family::V6, &after, Some(&before), &existing, Layout::V1_35);
    assert_eq!(flip.stale_chains.len(), 1, "{flip:?}");
    assert!(flip.stale_chains[0].ends_with("__fd00.10.244.1..e/8080"));
    assert_eq!(
        delete_chains(Family::V6, &flip.stale_chains),
        format!("delete chain ip6 kube-proxy {}\n", flip.stale_chains[0])
    );
}
