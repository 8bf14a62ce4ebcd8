//! kube-proxy's nftables layouts since 1.35, each as a fixture rewritten from
//! kubernetes' own TestOverallNFTablesRules dump (`tests/data/rules/nftables/layouts.py`):
//! every one must give what the 1.35 dump gives, Service port by Service port.

use super::*;

/// What a map says of each Service port: name, frontends, endpoints and shares, the
/// local policy's endpoints, affinity.
fn projection(map: &ServiceMap) -> Vec<String> {
    let shares = |endpoints: &[EndpointShare]| {
        endpoints
            .iter()
            .map(|e| format!("{}={:.4}", e.addr, e.expected_share))
            .collect::<Vec<_>>()
            .join(",")
    };
    map.services()
        .map(|p| {
            format!(
                "{} {} frontends={:?} endpoints=[{}] local={:?} affinity={:?}",
                p.proto,
                p.name,
                p.frontends
                    .iter()
                    .map(|f| format!("{}:{:?}:{}", f.kind.as_str(), f.ip, f.port))
                    .collect::<Vec<_>>(),
                shares(&p.endpoints),
                p.local_endpoints.as_deref().map(shares),
                p.affinity,
            )
        })
        .collect()
}

fn layout(json: &str) -> ServiceMap {
    let map = ServiceMap::from_nft_json(json).unwrap();
    assert_eq!(map.warnings(), &[] as &[String]);
    map
}

#[test]
fn every_nftables_layout_gives_what_1_35_gives() {
    let v1_35 = layout(fixture!("nftables/k8s-overall.json"));
    assert_eq!(names(&v1_35), K8S_OVERALL_NAMES);
    let expected = projection(&v1_35);
    for (name, json) in [
        ("1.36", fixture!("nftables/k8s-overall-1.36.json")),
        ("1.37", fixture!("nftables/k8s-overall-1.37.json")),
        (
            "dispatch",
            fixture!("nftables/k8s-overall-dispatch-named.json"),
        ),
    ] {
        assert_eq!(projection(&layout(json)), expected, "layout {name}");
    }
    let svc5 = port(&v1_35, Proto::Tcp, "ns5/svc5:p80");
    assert_eq!(
        svc5.affinity,
        Some(Affinity {
            timeout_s: Some(10800)
        })
    );
    let svc2 = port(&v1_35, Proto::Tcp, "ns2/svc2:p80");
    assert_eq!(
        svc2.local_endpoints,
        Some(Vec::new()),
        "eTP Local, no local endpoint"
    );
}

#[test]
fn every_layout_matches_backends_and_expects_per_client() {
    for json in [
        fixture!("nftables/k8s-overall.json"),
        fixture!("nftables/k8s-overall-1.36.json"),
        fixture!("nftables/k8s-overall-1.37.json"),
        fixture!("nftables/k8s-overall-dispatch-named.json"),
    ] {
        let map = layout(json);
        assert_eq!(
            looked_up(&map, Proto::Tcp, "172.30.0.44:80", "10.180.0.5:80"),
            Some(("ns4/svc4:p80", true))
        );
        assert_eq!(
            looked_up(&map, Proto::Tcp, "172.30.0.44:80", "10.180.0.9:80"),
            Some(("ns4/svc4:p80", false)),
            "a stale pin"
        );
        // ns2/svc2 (externalTrafficPolicy: Local, no local endpoint): a pod client of
        // its external IP is sent cluster-wide, an outside client is dropped.
        let pod = map
            .expect(
                Proto::Tcp,
                sa("192.168.99.22:80"),
                sa("10.0.1.5:40000"),
                Some(false),
            )
            .unwrap();
        assert_eq!(addrs(&pod.endpoints), ["10.180.0.2:80"]);
        assert_eq!(pod.policy, Policy::Cluster);
        let outside = map
            .expect(
                Proto::Tcp,
                sa("192.168.99.22:80"),
                sa("203.0.113.7:40000"),
                Some(false),
            )
            .unwrap();
        assert!(outside.endpoints.is_empty());
        assert_eq!(outside.turned_away, Some(RejectReason::NoLocalEndpoints));
        // ns5/svc5's load balancer admits 203.0.113.0/25 only.
        let denied = map
            .expect(
                Proto::Tcp,
                sa("5.6.7.8:80"),
                sa("198.51.100.1:40000"),
                Some(false),
            )
            .unwrap();
        assert_eq!(denied.turned_away, Some(RejectReason::SourceRange));
        let admitted = map
            .expect(
                Proto::Tcp,
                sa("5.6.7.8:80"),
                sa("203.0.113.9:40000"),
                Some(false),
            )
            .unwrap();
        assert_eq!(addrs(&admitted.endpoints), ["10.180.0.3:80"]);
        // ns6/svc6 has no endpoints: rejected.
        let empty = map
            .expect(Proto::Tcp, sa("172.30.0.46:80"), sa("10.0.1.5:40000"), None)
            .unwrap();
        assert_eq!(empty.turned_away, Some(RejectReason::NoEndpoints));
    }
}

/// The proposed 1.38 layout names the Service nowhere: its ClusterIPs are named by
/// address, with one warning, and still get their endpoints and shares.
#[test]
fn a_layout_that_names_nothing_is_named_by_address_with_a_warning() {
    let map =
        ServiceMap::from_nft_json(fixture!("nftables/k8s-overall-dispatch-unnamed.json")).unwrap();
    let svc4 = port(&map, Proto::Tcp, "172.30.0.44:80");
    assert_eq!(addrs(&svc4.endpoints), ["10.180.0.4:80", "10.180.0.5:80"]);
    assert_shares(&svc4.endpoints, &[0.5, 0.5]);
    assert_eq!(map.warnings().len(), 1, "{:?}", map.warnings());
    assert!(
        map.warnings()[0].contains("named by their address"),
        "{:?}",
        map.warnings()
    );
}

/// Why a connection that was never DNATed was turned away, in every layout: kube-proxy's
/// `cluster-ips-check` rejects a ClusterIP's other ports and drops unallocated ones.
#[test]
fn refusals_say_why() {
    for json in [
        fixture!("nftables/k8s-overall.json"),
        fixture!("nftables/k8s-overall-1.37.json"),
        fixture!("nftables/k8s-overall-dispatch-named.json"),
    ] {
        let map = layout(json);
        let reason = |dialed: &str, client: &str| {
            map.refusal(Proto::Tcp, sa(dialed), sa(client))
                .map(|(reason, port, _)| (reason, port.map(|p| p.name.clone())))
        };
        let pod = "10.0.1.5:40000";
        assert_eq!(
            reason("172.30.0.46:80", pod),
            Some((RejectReason::NoEndpoints, Some("ns6/svc6:p80".to_owned())))
        );
        assert_eq!(
            reason("172.30.0.41:81", pod),
            Some((RejectReason::InvalidPort, None))
        );
        assert_eq!(
            reason("172.30.0.99:80", pod),
            Some((RejectReason::UnallocatedIp, None))
        );
        assert_eq!(
            reason("5.6.7.8:80", "198.51.100.1:40000"),
            Some((RejectReason::SourceRange, Some("ns5/svc5:p80".to_owned())))
        );
        assert_eq!(reason("192.0.2.1:80", pod), None, "no Service traffic");
    }
    let iptables = ServiceMap::from_iptables_save(fixture!("iptables/k8s-overall.saved")).unwrap();
    assert_eq!(
        iptables
            .refusal(Proto::Tcp, sa("172.30.0.46:80"), sa("10.0.1.5:40000"))
            .map(|(reason, ..)| reason),
        Some(RejectReason::NoEndpoints)
    );
    assert_eq!(
        iptables
            .refusal(Proto::Tcp, sa("192.168.99.22:80"), sa("203.0.113.7:40000"))
            .map(|(reason, ..)| reason),
        Some(RejectReason::NoLocalEndpoints)
    );
}

/// A rule the evaluator cannot follow on a Service's way: one warning naming it, the
/// Service still named, and its backends neither in nor out of the rules (no false
/// stale pin).
#[test]
fn a_rule_that_cannot_be_followed_is_named_in_a_warning() {
    let mut dump: serde_json::Value =
        serde_json::from_str(fixture!("nftables/k8s-overall-1.37.json")).unwrap();
    let rules = dump["nftables"].as_array_mut().unwrap();
    let dnat = rules
        .iter_mut()
        .find(|o| {
            o["rule"]["chain"] == "service-LAUZTJTB-ns4/svc4/tcp/p80"
                && o["rule"]["expr"].to_string().contains("dnat")
        })
        .unwrap();
    dnat["rule"]["expr"] = serde_json::json!([{"tproxy": {"family": "ip", "port": 1}}]);
    let map = ServiceMap::from_nft_json(&dump.to_string()).unwrap();
    assert_eq!(map.warnings().len(), 1, "{:?}", map.warnings());
    assert!(
        map.warnings()[0].starts_with("cannot follow \"{\\\"tproxy\\\""),
        "{:?}",
        map.warnings()
    );
    assert!(
        map.warnings()[0].contains("172.30.0.44:80"),
        "{:?}",
        map.warnings()
    );
    let (port, current) = map
        .lookup(Proto::Tcp, sa("172.30.0.44:80"), sa("10.180.0.4:80"))
        .expect("still named");
    assert_eq!(port.name, "ns4/svc4:p80");
    assert_eq!(current, None, "neither in nor out of the rules");
}
