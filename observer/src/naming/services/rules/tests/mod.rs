//! The rule parsers against kube-proxy dumps (`tests/data/rules/`): iptables-save text
//! (`iptables`), nft JSON (`nft`), and what the map answers for either.

mod iptables;
mod layouts;
mod nft;

use std::net::IpAddr;

use super::*;
use crate::naming::services::test_support::{fixture, sa};

/// The Service ports of kube-proxy's own TestOverallIPTablesRules (and its nftables
/// counterpart), as `names` lists them.
const K8S_OVERALL_NAMES: [&str; 6] = [
    "tcp ns1/svc1:p80",
    "tcp ns2/svc2:p80",
    "tcp ns3/svc3:p80",
    "tcp ns4/svc4:p80",
    "tcp ns5/svc5:p80",
    "tcp ns6/svc6:p80",
];

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

/// `map.lookup`, as (Service port name, backend still an endpoint).
fn looked_up<'a>(
    map: &'a ServiceMap,
    proto: Proto,
    dst: &str,
    backend: &str,
) -> Option<(&'a str, bool)> {
    map.lookup(proto, sa(dst), sa(backend))
        .map(|(port, current)| (port.name.as_str(), current.expect("rules followed")))
}

#[test]
fn lookup_by_protocol_address_and_node_port() {
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    let name = |proto, dst: &str, backend: &str| looked_up(&map, proto, dst, backend);
    assert_eq!(
        name(Proto::Udp, "10.96.0.10:53", "10.244.0.3:53"),
        Some(("kube-system/kube-dns:dns", true))
    );
    assert_eq!(
        name(Proto::Tcp, "10.96.0.10:53", "10.244.0.3:53"),
        Some(("kube-system/kube-dns:dns-tcp", true))
    );
    // NodePort: any local address.
    assert_eq!(
        name(Proto::Tcp, "172.18.0.3:30443", "10.244.3.20:8443"),
        Some(("web-team/front-end.v2:https-alt", true))
    );
    // A pod that left the rules: stale pin.
    assert_eq!(
        name(Proto::Tcp, "10.96.35.226:80", "10.244.1.99:3000"),
        Some(("shop/checkout:http", false))
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
fn lookup_tells_which_frontend_the_connection_came_through() {
    use FrontendKind::{ClusterIp, ExternalIp, LoadBalancer, NodePort};
    let map = ServiceMap::from_iptables_save(fixture!("iptables/mixed-v4-nat.saved")).unwrap();
    let frontend = |dst: &str| map.frontend_kind(Proto::Tcp, sa(dst));
    assert_eq!(frontend("10.96.77.7:443"), Some(ClusterIp));
    assert_eq!(frontend("172.18.0.3:30443"), Some(NodePort));
    assert_eq!(frontend("203.0.113.10:443"), Some(ExternalIp));
    assert_eq!(frontend("198.51.100.20:443"), Some(LoadBalancer));
    // A NodePort on an address that is also a ClusterIP: the ClusterIP's own port wins,
    // another port falls through to the NodePort by port.
    assert_eq!(frontend("10.96.77.7:30443"), Some(NodePort));
    assert_eq!(frontend("10.96.77.7:444"), None);
    assert_eq!(map.frontend_kind(Proto::Udp, sa("10.96.77.7:443")), None);
    let nft = ServiceMap::from_nft_json(fixture!("nftables/mixed-v4.json")).unwrap();
    let nft_frontend = |dst: &str| nft.frontend_kind(Proto::Tcp, sa(dst));
    assert_eq!(nft_frontend("10.96.35.226:80"), Some(ClusterIp));
    assert_eq!(nft_frontend("192.168.0.2:30443"), Some(NodePort));
    assert_eq!(nft_frontend("203.0.113.10:443"), Some(ExternalIp));
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
