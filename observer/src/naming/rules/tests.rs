use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::model::record::FrontendKind::{ClusterIp, ExternalIp, LoadBalancer, NodePort};

macro_rules! fixture {
    ($path:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/rules/",
            $path
        ))
    };
}

fn sa(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn fe(kind: FrontendKind, ip: Option<&str>, port: u16) -> Frontend {
    Frontend {
        kind,
        ip: ip.map(|ip| ip.parse::<IpAddr>().unwrap()),
        port,
    }
}

fn port<'a>(map: &'a ServiceMap, proto: Proto, name: &str) -> &'a ServicePort {
    map.services()
        .find(|p| p.proto == proto && p.name == name)
        .unwrap_or_else(|| panic!("{proto} {name} missing; have {:?}", names(map)))
}

fn names(map: &ServiceMap) -> Vec<String> {
    map.services()
        .map(|p| format!("{} {}", p.proto, p.name))
        .collect()
}

fn addrs(endpoints: &[EndpointShare]) -> Vec<String> {
    endpoints.iter().map(|e| e.addr.to_string()).collect()
}

fn assert_shares(endpoints: &[EndpointShare], expected: &[f64]) {
    assert_eq!(endpoints.len(), expected.len(), "{endpoints:?}");
    for (endpoint, want) in endpoints.iter().zip(expected) {
        assert!(
            (endpoint.expected_share - want).abs() < 1e-9,
            "{}: share {} != {want}",
            endpoint.addr,
            endpoint.expected_share
        );
    }
}

// ---- iptables ----

#[test]
fn iptables_nat_dump_names_every_service_port() {
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    assert_eq!(
        names(&map),
        [
            "tcp kube-system/kube-dns:dns-tcp",
            "tcp shop/checkout:http",
            "tcp shop/checkout:metrics",
            "tcp web-team/front-end.v2:https-alt",
            "udp kube-system/kube-dns:dns",
        ]
    );
    let metrics = port(&map, Proto::Tcp, "shop/checkout:metrics");
    assert_eq!(
        metrics.frontends,
        [fe(ClusterIp, Some("10.96.35.226"), 9090)]
    );
    assert_eq!(addrs(&metrics.endpoints), ["10.244.1.13:9100"]);
    assert_shares(&metrics.endpoints, &[1.0]);
    let dns = port(&map, Proto::Udp, "kube-system/kube-dns:dns");
    assert_eq!(dns.frontends, [fe(ClusterIp, Some("10.96.0.10"), 53)]);
    assert_eq!(addrs(&dns.endpoints), ["10.244.0.2:53", "10.244.0.3:53"]);
    assert_shares(&dns.endpoints, &[0.5, 0.5]);
}

#[test]
fn iptables_waterfall_is_multiplied_out_exactly() {
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    // iptables-save prints kube-proxy's 0.3333333333 as 0.33333333349 (2^32 fixed point).
    let p0 = 0.33333333349;
    let checkout = port(&map, Proto::Tcp, "shop/checkout:http");
    assert_eq!(
        addrs(&checkout.endpoints),
        ["10.244.1.13:3000", "10.244.1.14:3000", "10.244.2.7:3000"]
    );
    assert_shares(
        &checkout.endpoints,
        &[p0, (1.0 - p0) * 0.5, (1.0 - p0) * (1.0 - 0.5)],
    );
    let front = port(&map, Proto::Tcp, "web-team/front-end.v2:https-alt");
    let (a, b, c) = (0.25, p0, 0.5);
    assert_shares(
        &front.endpoints,
        &[
            a,
            (1.0 - a) * b,
            (1.0 - a) * (1.0 - b) * c,
            (1.0 - a) * (1.0 - b) * (1.0 - c),
        ],
    );
    let total: f64 = front.endpoints.iter().map(|e| e.expected_share).sum();
    assert!((total - 1.0).abs() < 1e-12);
}

#[test]
fn iptables_nodeport_external_lb_and_local_chain() {
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    let front = port(&map, Proto::Tcp, "web-team/front-end.v2:https-alt");
    assert_eq!(
        front.frontends,
        [
            fe(ClusterIp, Some("10.96.77.7"), 443),
            fe(NodePort, None, 30443),
            fe(ExternalIp, Some("203.0.113.10"), 443),
            fe(LoadBalancer, Some("198.51.100.20"), 443),
        ]
    );
    assert_eq!(
        addrs(&front.endpoints),
        [
            "10.244.1.20:8443",
            "10.244.1.21:8443",
            "10.244.2.20:8443",
            "10.244.3.20:8443"
        ]
    );
    let local = front.local_endpoints.as_ref().unwrap();
    assert_eq!(addrs(local), ["10.244.1.20:8443", "10.244.1.21:8443"]);
    assert_shares(local, &[0.5, 0.5]);
}

#[test]
fn iptables_service_without_endpoints_comes_from_the_filter_table() {
    let nat_only = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    assert!(!names(&nat_only).contains(&"tcp shop/empty:http".to_owned()));
    let full = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-full.saved")).unwrap();
    let empty = port(&full, Proto::Tcp, "shop/empty:http");
    assert_eq!(
        empty.frontends,
        [
            fe(ClusterIp, Some("10.96.200.1"), 80),
            fe(NodePort, None, 30200)
        ]
    );
    assert!(empty.endpoints.is_empty());
    assert_eq!(
        full.lookup(Proto::Tcp, sa("10.96.200.1:80"), sa("10.244.9.9:80"))
            .map(|(p, ok)| (p.name.as_str(), ok)),
        Some(("shop/empty:http", false))
    );
}

#[test]
fn kubernetes_expected_dump_parses_the_same_before_and_after_iptables_save() {
    // proxier_test.go's TestOverallIPTablesRules dump as kube-proxy writes it, and the
    // same rules after iptables-restore + iptables-save (reordered options, /32, quotes).
    let written =
        ServiceMap::from_iptables_save(fixture!("iptables/k8s-overall-test-format.txt")).unwrap();
    let saved = ServiceMap::from_iptables_save(fixture!("iptables/k8s-overall.saved")).unwrap();
    assert_eq!(written, saved);
    assert_eq!(
        names(&saved),
        [
            "tcp ns1/svc1:p80",
            "tcp ns2/svc2:p80",
            "tcp ns3/svc3:p80",
            "tcp ns4/svc4:p80",
            "tcp ns5/svc5:p80",
            "tcp ns6/svc6:p80"
        ]
    );
    let svc2 = port(&saved, Proto::Tcp, "ns2/svc2:p80");
    assert_eq!(
        svc2.frontends,
        [
            fe(ClusterIp, Some("172.30.0.42"), 80),
            fe(NodePort, None, 3001),
            fe(ExternalIp, Some("192.168.99.22"), 80),
            fe(LoadBalancer, Some("1.2.3.4"), 80),
        ]
    );
    // Session affinity's `--rcheck` rule is a shortcut, not part of the waterfall.
    let svc5 = port(&saved, Proto::Tcp, "ns5/svc5:p80");
    assert_eq!(addrs(&svc5.endpoints), ["10.180.0.3:80"]);
    assert_shares(&svc5.endpoints, &[1.0]);
    assert!(
        svc5.frontends
            .contains(&fe(LoadBalancer, Some("5.6.7.8"), 80))
    );
    let svc4 = port(&saved, Proto::Tcp, "ns4/svc4:p80");
    assert_shares(&svc4.endpoints, &[0.5, 0.5]);
    let svc6 = port(&saved, Proto::Tcp, "ns6/svc6:p80");
    assert_eq!(svc6.frontends, [fe(ClusterIp, Some("172.30.0.46"), 80)]);
    assert!(svc6.endpoints.is_empty());
}

#[test]
fn iptables_ipv6_and_merge_with_ipv4() {
    let v6 = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v6-nat.saved")).unwrap();
    let checkout = port(&v6, Proto::Tcp, "shop/checkout:http");
    assert_eq!(
        checkout.frontends,
        [fe(ClusterIp, Some("fd00:10:96::a"), 80)]
    );
    assert_eq!(
        addrs(&checkout.endpoints),
        ["[fd00:10:244:1::d]:3000", "[fd00:10:244:2::7]:3000"]
    );
    assert_shares(&checkout.endpoints, &[0.5, 0.5]);

    let mut map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    map.merge(v6);
    let merged = port(&map, Proto::Tcp, "shop/checkout:http");
    assert_eq!(merged.frontends.len(), 2);
    assert_eq!(merged.endpoints.len(), 5);
    let (found, current) = map
        .lookup(
            Proto::Tcp,
            sa("[fd00:10:96::a]:80"),
            sa("[fd00:10:244:2::7]:3000"),
        )
        .unwrap();
    assert_eq!((found.name.as_str(), current), ("shop/checkout:http", true));
    let (found, current) = map
        .lookup(Proto::Tcp, sa("10.96.35.226:80"), sa("10.244.2.7:3000"))
        .unwrap();
    assert_eq!((found.name.as_str(), current), ("shop/checkout:http", true));
}

#[test]
fn lookup_by_protocol_address_and_node_port() {
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    let name = |proto, dst: &str, backend: &str| {
        map.lookup(proto, sa(dst), sa(backend))
            .map(|(p, current)| (p.name.clone(), current))
    };
    assert_eq!(
        name(Proto::Udp, "10.96.0.10:53", "10.244.0.3:53"),
        Some(("kube-system/kube-dns:dns".to_owned(), true))
    );
    assert_eq!(
        name(Proto::Tcp, "10.96.0.10:53", "10.244.0.3:53"),
        Some(("kube-system/kube-dns:dns-tcp".to_owned(), true))
    );
    // NodePort: any local address.
    assert_eq!(
        name(Proto::Tcp, "172.18.0.3:30443", "10.244.3.20:8443"),
        Some(("web-team/front-end.v2:https-alt".to_owned(), true))
    );
    // A pod that left the rules: stale pin.
    assert_eq!(
        name(Proto::Tcp, "10.96.35.226:80", "10.244.1.99:3000"),
        Some(("shop/checkout:http".to_owned(), false))
    );
    assert_eq!(
        name(Proto::Udp, "10.96.35.226:80", "10.244.1.13:3000"),
        None
    );
    assert_eq!(
        name(Proto::Tcp, "10.96.35.227:80", "10.244.1.13:3000"),
        None
    );
}

#[test]
fn lookup_tells_which_door_the_connection_came_through() {
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    let door = |dst: &str| map.frontend_kind(Proto::Tcp, sa(dst));
    assert_eq!(door("10.96.77.7:443"), Some(ClusterIp));
    assert_eq!(door("172.18.0.3:30443"), Some(NodePort));
    assert_eq!(door("203.0.113.10:443"), Some(ExternalIp));
    assert_eq!(door("198.51.100.20:443"), Some(LoadBalancer));
    // A NodePort on an address that is also a ClusterIP: the ClusterIP's own port wins,
    // another port falls through to the NodePort by port.
    assert_eq!(door("10.96.77.7:30443"), Some(NodePort));
    assert_eq!(door("10.96.77.7:444"), None);
    assert_eq!(map.frontend_kind(Proto::Udp, sa("10.96.77.7:443")), None);
    let nft = ServiceMap::from_nft_json(fixture!("nftables/mixed-v4.json")).unwrap();
    let nft_door = |dst: &str| nft.frontend_kind(Proto::Tcp, sa(dst));
    assert_eq!(nft_door("10.96.35.226:80"), Some(ClusterIp));
    assert_eq!(nft_door("192.168.0.2:30443"), Some(NodePort));
    assert_eq!(nft_door("203.0.113.10:443"), Some(ExternalIp));
}

#[test]
fn service_records_carry_frontends_and_shares() {
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    let time = chrono::DateTime::parse_from_rfc3339("2026-08-06T13:46:36Z")
        .unwrap()
        .with_timezone(&Utc);
    let records = map.service_records(4026532301, time);
    assert_eq!(records.len(), 5);
    let metrics = records
        .iter()
        .find(|r| r.service == "shop/checkout:metrics")
        .unwrap();
    assert_eq!(
        serde_json::to_string(&crate::model::record::LogLine::Service(metrics.clone())).unwrap(),
        r#"{"type":"service","service":"shop/checkout:metrics","proto":"tcp","netns":4026532301,"frontends":[{"kind":"cluster_ip","ip":"10.96.35.226","port":9090}],"endpoints":[{"addr":"10.244.1.13:9100","expected_share":1.0}],"time":"2026-08-06T13:46:36.000000Z"}"#
    );
}

#[test]
fn iptables_truncated_dump_is_an_error_naming_the_line() {
    let text = fixture!("iptables/mixed-v4-nat.saved");
    let line = text
        .lines()
        .position(|l| l.contains("10.244.1.14:3000\" -m statistic"))
        .unwrap();
    let kept: Vec<&str> = text.lines().take(line + 1).collect();
    let mut cut = kept.join("\n");
    // Cut inside the quoted comment of line `line + 1`.
    cut.truncate(cut.rfind("10.244.1.14:3000").unwrap() + 8);
    assert!(cut.ends_with("-> 10.244.1"), "{cut}");
    let err = ServiceMap::from_iptables_save(&cut).unwrap_err();
    assert_eq!(
        err,
        RulesError::Iptables {
            line: line + 1,
            message: "unterminated quoted string (truncated dump?)".to_owned()
        }
    );

    // Cut at a line end: the table never gets its COMMIT.
    let whole_lines = kept[..kept.len() - 1].join("\n");
    let err = ServiceMap::from_iptables_save(&whole_lines).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("iptables-save line {line}: table nat has no COMMIT (truncated dump?)")
    );
}

#[test]
fn iptables_garbage_is_an_error_naming_the_line() {
    let err = ServiceMap::from_iptables_save("*nat\n:KUBE-SERVICES - [0:0]\nhello world\nCOMMIT\n")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "iptables-save line 3: not an iptables-save line: hello world"
    );
    let err = ServiceMap::from_iptables_save("{\"nftables\": []}").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("iptables-save line 1: not iptables-save output"),
        "{err}"
    );
    let bad_probability = "*nat\n-A KUBE-SVC-X -m comment --comment \"a/b:c -> 10.0.0.1:80\" -m statistic --mode random --probability 1.5 -j KUBE-SEP-A\nCOMMIT\n";
    let err = ServiceMap::from_iptables_save(bad_probability).unwrap_err();
    assert_eq!(
        err.to_string(),
        "iptables-save line 2: --probability 1.5: not a probability"
    );
    let bad_dnat = "*nat\n-A KUBE-SEP-A -p tcp -j DNAT --to-destination nowhere\nCOMMIT\n";
    assert!(
        ServiceMap::from_iptables_save(bad_dnat).is_ok(),
        "unreferenced SEP chains are not read"
    );
    let referenced = "*nat\n-A KUBE-SVC-X -m comment --comment \"a/b:c -> 10.0.0.1:80\" -j KUBE-SEP-A\n-A KUBE-SEP-A -p tcp -j DNAT --to-destination nowhere\nCOMMIT\n";
    let err = ServiceMap::from_iptables_save(referenced).unwrap_err();
    assert_eq!(
        err.to_string(),
        "iptables-save line 3: --to-destination nowhere: not ip:port"
    );
    let no_value = "*nat\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp --dport\nCOMMIT\n";
    let err = ServiceMap::from_iptables_save(no_value).unwrap_err();
    assert_eq!(
        err.to_string(),
        "iptables-save line 2: option --dport has no value (truncated dump?)"
    );
}

#[test]
fn empty_or_foreign_tables_give_an_empty_map() {
    assert!(ServiceMap::from_iptables_save("").unwrap().is_empty());
    let docker = "*nat\n:DOCKER - [0:0]\n-A DOCKER -d 172.17.0.0/16 -p tcp -j DNAT --to-destination 172.17.0.2-172.17.0.4:80-90\nCOMMIT\n";
    assert!(ServiceMap::from_iptables_save(docker).unwrap().is_empty());
}

// ---- nftables ----

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
    assert_eq!(
        names(&map),
        [
            "tcp ns1/svc1:p80",
            "tcp ns2/svc2:p80",
            "tcp ns3/svc3:p80",
            "tcp ns4/svc4:p80",
            "tcp ns5/svc5:p80",
            "tcp ns6/svc6:p80"
        ]
    );
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
        map.lookup(Proto::Tcp, sa("10.1.2.3:3001"), sa("10.180.0.2:80"))
            .map(|(p, ok)| (p.name.as_str(), ok)),
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
    let (found, current) = map
        .lookup(
            Proto::Udp,
            sa("[fd00:1::2]:30053"),
            sa("[fd00:10:244::2]:53"),
        )
        .unwrap();
    assert_eq!(
        (found.name.as_str(), current),
        ("kube-system/kube-dns:dns", true)
    );
}

/// A minimal kube-proxy table in nft's JSON shape.
fn nft_doc(vmap_set: &str, service_ips_key: &str) -> String {
    format!(
        r#"{{"nftables": [{{"metainfo": {{"version": "1.0.6"}}}}, {{"table": {{"family": "ip", "name": "kube-proxy"}}}},
{{"map": {{"family": "ip", "name": "service-ips", "table": "kube-proxy", "map": "verdict", "elem": [[{{"concat": [{service_ips_key}, "tcp", 80]}}, {{"goto": {{"target": "service-H-a/b/tcp/"}}}}]]}}}},
{{"flowtable": {{"name": "unknown-object"}}}},
{{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "service-H-a/b/tcp/", "expr": [{{"vmap": {{"key": {{"numgen": {{"mode": "random", "mod": 4, "offset": 0}}}}, "data": {{"set": {vmap_set}}}}}}}]}}}},
{{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "endpoint-E1-a/b/tcp/__10.0.0.1/80", "expr": [{{"dnat": {{"addr": "10.0.0.1", "port": 80}}}}]}}}},
{{"rule": {{"family": "ip", "table": "kube-proxy", "chain": "endpoint-E2-a/b/tcp/__10.0.0.2/80", "expr": [{{"dnat": {{"addr": "10.0.0.2", "port": 80}}}}]}}}}]}}"#
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
