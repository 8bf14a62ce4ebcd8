//! Frontend kinds per Service and pod names per backend.

use std::collections::BTreeMap;

use super::*;

fn via(frontend: Option<FrontendKind>, backend: &str, pod: Option<&str>) -> ConnRecord {
    let mut record = conn(Some("shop/checkout:http"), backend, 1, 10.0);
    record.frontend = frontend;
    record.backend_pod = pod.map(Into::into);
    record
}

fn id(n: u64) -> ConnId {
    ConnId {
        conntrack: n,
        start_ns: n,
    }
}

#[test]
fn connections_are_counted_per_frontend_and_replaced_records_count_once() {
    let mut aggregator = Aggregator::default();
    let a = "10.244.1.12:8080";
    aggregator.apply(id(1), &via(Some(FrontendKind::ClusterIp), a, None));
    aggregator.apply(id(2), &via(Some(FrontendKind::NodePort), a, None));
    aggregator.apply(id(3), &via(Some(FrontendKind::NodePort), a, None));
    // The final record of connection 3 replaces its open one: still one connection.
    let mut open = via(Some(FrontendKind::ClusterIp), a, None);
    open.close = Close::Open;
    aggregator.apply(id(4), &open);
    aggregator.apply(id(4), &via(Some(FrontendKind::ClusterIp), a, None));
    aggregator.apply(id(5), &via(None, a, None));
    let services = aggregator.services();
    assert_eq!(services[0].connections, 5);
    assert_eq!(
        services[0].by_frontend,
        BTreeMap::from([(FrontendKind::ClusterIp, 2), (FrontendKind::NodePort, 2)])
    );
    let json = serde_json::to_value(&services[0]).unwrap();
    assert_eq!(
        json["by_frontend"],
        serde_json::json!({"cluster_ip": 2, "node_port": 2})
    );
}

#[test]
fn backends_carry_the_pod_name_the_records_give() {
    let mut aggregator = Aggregator::default();
    let mut service = rules(
        "shop/checkout:http",
        &[
            ("10.244.1.12:8080", 0.4),
            ("10.244.1.13:8080", 0.3),
            ("10.244.1.14:8080", 0.3),
        ],
    );
    // The rules' line names an endpoint that got nothing, and one the records name too.
    service.endpoints[0].pod = Some("shop/old-name".to_owned());
    service.endpoints[1].pod = Some("shop/checkout-b".to_owned());
    aggregator.add_service(&service);
    aggregator.apply(
        id(1),
        &via(None, "10.244.1.12:8080", Some("shop/checkout-a")),
    );
    // A later record that could not name the pod does not forget the name.
    aggregator.apply(id(2), &via(None, "10.244.1.12:8080", None));
    let services = aggregator.services();
    let pods: Vec<Option<&str>> = services[0]
        .backends
        .iter()
        .map(|b| b.pod.as_deref())
        .collect();
    assert_eq!(
        pods,
        [Some("shop/checkout-a"), Some("shop/checkout-b"), None],
        "records first, then the rules' line"
    );
}
