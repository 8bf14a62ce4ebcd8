//! iptables-save text: waterfalls, frontends, the filter table, errors.

use super::*;
use crate::model::record::FrontendKind::{ClusterIp, ExternalIp, LoadBalancer, NodePort};

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
        looked_up(&full, Proto::Tcp, "10.96.200.1:80", "10.244.9.9:80"),
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
    assert_eq!(names(&saved), K8S_OVERALL_NAMES);
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
    assert_eq!(
        looked_up(
            &map,
            Proto::Tcp,
            "[fd00:10:96::a]:80",
            "[fd00:10:244:2::7]:3000"
        ),
        Some(("shop/checkout:http", true))
    );
    assert_eq!(
        looked_up(&map, Proto::Tcp, "10.96.35.226:80", "10.244.2.7:3000"),
        Some(("shop/checkout:http", true))
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

/// A comment (the Service's name) or a line holding a terminal escape: every name and
/// error message is printable text.
#[test]
fn escapes_in_comments_and_lines_become_printable_text() {
    let hostile = fixture!("iptables/mixed-v4-nat.saved")
        .replace("shop/checkout:http", "shop/\u{1b}[2Jcheckout:http");
    let map = ServiceMap::from_iptables_save(&hostile).unwrap();
    let checkout = port(&map, Proto::Tcp, "shop/\\x1b[2Jcheckout:http");
    assert_eq!(checkout.endpoints.len(), 3);
    assert!(names(&map).iter().all(|n| !n.contains('\u{1b}')));
    let err = ServiceMap::from_iptables_save("*nat\n\u{1b}]0;owned\u{7}\nCOMMIT\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "iptables-save line 2: not an iptables-save line: \\x1b]0;owned\\x07"
    );
}

#[test]
fn dnat_rules_of_others_are_followed_but_are_no_kube_proxy_service() {
    // Docker's embedded DNS rules in a container on a user-defined network (a CI
    // runner, a kind node): followed, named by address, not kube-proxy's.
    let docker =
        ServiceMap::from_iptables_save(fixture!("iptables/docker-embedded-dns.saved")).unwrap();
    assert_eq!(names(&docker), ["tcp 127.0.0.11:53", "udp 127.0.0.11:53"]);
    assert!(!docker.has_kube_proxy_services());
    let kube_proxy =
        ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    assert!(kube_proxy.has_kube_proxy_services());
    let mut both = docker.clone();
    both.merge(kube_proxy);
    assert!(both.has_kube_proxy_services());
}
