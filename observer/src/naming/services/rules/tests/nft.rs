//! nft JSON: numgen shares, maps, errors.

use super::*;
use crate::model::record::FrontendKind::{ClusterIp, ExternalIp, LoadBalancer, NodePort};

#[test]
fn nft_dump_names_every_service_port_with_equal_shares() {
    let map = ServiceMap::from_nft_json(fixture!("nftables/mixed-v4.json")).unwrap();
    assert_eq!(
        names(&map),
        [
            "tcp kube-system/kube-dns:dns-tcp",
            "tcp shop/checkout:http",
            "tcp shop/checkout:metrics",
            "tcp shop/empty:http",
            "tcp web-team/front-end.v2:https-alt",
            "udp kube-system/kube-dns:dns",
        ]
    );
    let checkout = port(&map, Proto::Tcp, "shop/checkout:http");
    assert_eq!(
        checkout.frontends,
        [fe(ClusterIp, Some("10.96.35.226"), 80)]
    );
    assert_eq!(
        addrs(&checkout.endpoints),
        ["10.244.1.13:3000", "10.244.1.14:3000", "10.244.2.7:3000"]
    );
    assert_shares(&checkout.endpoints, &[1.0 / 3.0; 3]);
    let dns = port(&map, Proto::Udp, "kube-system/kube-dns:dns");
    assert_eq!(addrs(&dns.endpoints), ["10.244.0.2:53", "10.244.0.3:53"]);

    let front = port(&map, Proto::Tcp, "web-team/front-end.v2:https-alt");
    assert_eq!(
        front.frontends,
        [
            fe(ClusterIp, Some("10.96.77.7"), 443),
            fe(NodePort, None, 30443),
            // Without a firewall-ips entry nft cannot tell a load-balancer IP from an external IP.
            fe(ExternalIp, Some("198.51.100.20"), 443),
            fe(ExternalIp, Some("203.0.113.10"), 443),
        ]
    );
    assert_shares(&front.endpoints, &[0.25; 4]);
    let local = front.local_endpoints.as_ref().unwrap();
    assert_eq!(addrs(local), ["10.244.1.20:8443", "10.244.1.21:8443"]);
    assert_shares(local, &[0.5, 0.5]);

    let empty = port(&map, Proto::Tcp, "shop/empty:http");
    assert_eq!(
        empty.frontends,
        [
            fe(ClusterIp, Some("10.96.200.1"), 80),
            fe(NodePort, None, 30200)
        ]
    );
    assert!(empty.endpoints.is_empty());
}

#[test]
fn nft_kubernetes_overall_dump() {
    let map = ServiceMap::from_nft_json(fixture!("nftables/k8s-overall.json")).unwrap();
    assert_eq!(names(&map), K8S_OVERALL_NAMES);
    let svc5 = port(&map, Proto::Tcp, "ns5/svc5:p80");
    assert_eq!(
        svc5.frontends,
        [
            fe(ClusterIp, Some("172.30.0.45"), 80),
            fe(NodePort, None, 3002),
            fe(LoadBalancer, Some("5.6.7.8"), 80),
        ]
    );
    assert_eq!(addrs(&svc5.endpoints), ["10.180.0.3:80"]);
    let svc4 = port(&map, Proto::Tcp, "ns4/svc4:p80");
    assert_eq!(addrs(&svc4.endpoints), ["10.180.0.4:80", "10.180.0.5:80"]);
    assert_shares(&svc4.endpoints, &[0.5, 0.5]);
    // ns2/svc2's drop elements (no local endpoints) do not create a second entry.
    let svc2 = port(&map, Proto::Tcp, "ns2/svc2:p80");
    assert_eq!(addrs(&svc2.endpoints), ["10.180.0.2:80"]);
    let svc6 = port(&map, Proto::Tcp, "ns6/svc6:p80");
    assert_eq!(svc6.frontends, [fe(ClusterIp, Some("172.30.0.46"), 80)]);
    assert!(svc6.endpoints.is_empty());
    assert_eq!(
        looked_up(&map, Proto::Tcp, "10.1.2.3:3001", "10.180.0.2:80"),
        Some(("ns2/svc2:p80", true))
    );
}

#[test]
fn nft_ipv6_table() {
    let map = ServiceMap::from_nft_json(fixture!("nftables/mixed-v6.json")).unwrap();
    let checkout = port(&map, Proto::Tcp, "shop/checkout:http");
    assert_eq!(
        checkout.frontends,
        [fe(ClusterIp, Some("fd00:10:96::a"), 80)]
    );
    assert_eq!(
        addrs(&checkout.endpoints),
        ["[fd00:10:244:1::d]:3000", "[fd00:10:244:2::7]:3000"]
    );
    let dns = port(&map, Proto::Udp, "kube-system/kube-dns:dns");
    assert_eq!(
        dns.frontends,
        [
            fe(ClusterIp, Some("fd00:10:96::10"), 53),
            fe(NodePort, None, 30053)
        ]
    );
    assert_eq!(
        looked_up(&map, Proto::Udp, "[fd00:1::2]:30053", "[fd00:10:244::2]:53"),
        Some(("kube-system/kube-dns:dns", true))
    );
}

/// A minimal kube-proxy table in nft's JSON shape: its hook chain dispatches by
/// `service-ips`, whose map declares no type (the rule's key types it).
fn nft_doc(vmap_set: &str, service_ips_key: &str) -> String {
    format!(
        r#"{{"nftables": [{{"metainfo": {{"version": "1.0.6"}}}}, {{"table": {{"family": "ip", "name": "kube-proxy"}}}},
{{"map": {{"family": "ip", "name": "service-ips", "table": "kube-proxy", "map": "verdict", "elem": [[{{"concat": [{service_ips_key}, "tcp", 80]}}, {{"goto": {{"target": "service-H-a/b/tcp/"}}}}]]}}}},
{{"flowtable": {{"name": "unknown-object"}}}},
{{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "service-H-a/b/tcp/", "expr": [{{"vmap": {{"key": {{"numgen": {{"mode": "random", "mod": 4, "offset": 0}}}}, "data": {{"set": {vmap_set}}}}}}}]}}}},
{{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "endpoint-E1-a/b/tcp/__10.0.0.1/80", "expr": [{{"dnat": {{"addr": "10.0.0.1", "port": 80}}}}]}}}},
{{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "endpoint-E2-a/b/tcp/__10.0.0.2/80", "expr": [{{"dnat": {{"addr": "10.0.0.2", "port": 80}}}}]}}}},
{{"chain": {{"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "type": "nat", "hook": "prerouting", "prio": -100}}}},
{{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "nat-prerouting", "expr": [{{"vmap": {{"key": {{"concat": [{{"payload": {{"protocol": "ip", "field": "daddr"}}}}, {{"meta": {{"key": "l4proto"}}}}, {{"payload": {{"protocol": "th", "field": "dport"}}}}]}}, "data": "@service-ips"}}}}]}}}}]}}"#
    )
}

#[test]
fn nft_shares_count_vmap_keys_and_ranges() {
    let set = r#"[[{"range": [0, 2]}, {"goto": {"target": "endpoint-E1-a/b/tcp/__10.0.0.1/80"}}], [3, {"goto": {"target": "endpoint-E2-a/b/tcp/__10.0.0.2/80"}}]]"#;
    let map = ServiceMap::from_nft_json(&nft_doc(set, r#""10.96.0.1""#)).unwrap();
    // An unnamed Service port is `ns/name`.
    let service = port(&map, Proto::Tcp, "a/b");
    assert_eq!(addrs(&service.endpoints), ["10.0.0.1:80", "10.0.0.2:80"]);
    assert_shares(&service.endpoints, &[0.75, 0.25]);
}

#[test]
fn nft_errors_name_the_position_or_path() {
    let good = fixture!("nftables/mixed-v4.json");
    let err = ServiceMap::from_nft_json(&good[..good.len() / 2]).unwrap_err();
    assert!(
        matches!(err, RulesError::NftSyntax { line: 1, column, .. } if column == good.len() / 2),
        "{err}"
    );
    let err = ServiceMap::from_nft_json("iptables-save v1.8.9\n").unwrap_err();
    assert!(
        err.to_string().starts_with("nft JSON at line 1 column 1: "),
        "{err}"
    );
    let set = r#"[[0, {"goto": {"target": "endpoint-E1-a/b/tcp/__10.0.0.1/80"}}]]"#;
    let err = ServiceMap::from_nft_json(&nft_doc(set, r#""10.96.0.300""#)).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"nft JSON at nftables[2].map(service-ips).elem[0]: "10.96.0.300": not an IP address"#
    );
    let err = ServiceMap::from_nft_json(&nft_doc(r#"[[0, "x"]]"#, r#""10.96.0.1""#)).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "nft JSON at nftables[4].rule(service-H-a/b/tcp/).expr[0].vmap.data.set[0]: "
        ),
        "{err}"
    );
}

/// A chain name (which names the Service) holding a terminal escape: the name is
/// printable text.
#[test]
fn nft_escapes_in_chain_names_become_printable_text() {
    let set = r#"[[0, {"goto": {"target": "endpoint-E1-a/b/tcp/__10.0.0.1/80"}}]]"#;
    let hostile =
        nft_doc(set, r#""10.96.0.1""#).replace("service-H-a/b/", "service-H-a\\u001b[2J/b/");
    let map = ServiceMap::from_nft_json(&hostile).unwrap();
    assert_eq!(names(&map), ["tcp a\\x1b[2J/b"]);
}
