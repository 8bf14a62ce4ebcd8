use chrono::{DateTime, TimeDelta, Utc};

use super::*;
use crate::model::record::Proto;

fn at(ms: i64) -> DateTime<Utc> {
    "2026-08-06T13:46:36Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::milliseconds(ms)
}

fn query(ms: i64, client: &str, name: &str, qtype: &str, rcode: Option<&str>) -> DnsRecord {
    DnsRecord {
        proto: Proto::Udp,
        client: client.parse().unwrap(),
        client_pod: Some("shop/client".into()),
        server: "10.96.0.10:53".parse().unwrap(),
        netns: 1,
        id: 1,
        name: name.into(),
        qtype: qtype.into(),
        rcode: rcode.map(str::to_owned),
        time: at(ms),
        latency_ms: rcode.map(|_| 0.2),
    }
}

const C: &str = "10.244.1.9:40000";
const NX: Option<&str> = Some("NXDOMAIN");
const OK: Option<&str> = Some("NOERROR");

/// What glibc sends for `getaddrinfo(name)` with kube's resolv.conf (A and AAAA per name).
fn walk(ms: i64, names: &[&str], answered: bool) -> Vec<DnsRecord> {
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let rcode = if answered && i == names.len() - 1 {
            OK
        } else {
            NX
        };
        out.push(query(ms + i as i64, C, name, "A", rcode));
        out.push(query(ms + i as i64, C, name, "AAAA", rcode));
    }
    out
}

#[test]
fn candidates_strip_each_search_suffix() {
    assert_eq!(
        candidates("checkout.shop.svc.cluster.local", CLUSTER_DOMAIN),
        [
            "checkout.shop.svc.cluster.local",
            "checkout.shop.svc",
            "checkout.shop",
            "checkout"
        ]
    );
    assert_eq!(
        candidates("www.example.com.cluster.local", CLUSTER_DOMAIN),
        ["www.example.com.cluster.local", "www.example.com"]
    );
    assert_eq!(
        candidates("www.example.com", CLUSTER_DOMAIN),
        ["www.example.com"]
    );
    assert_eq!(
        candidates("cluster.local", CLUSTER_DOMAIN),
        ["cluster.local"]
    );
}

#[test]
fn walks_group_into_lookups_with_their_bases() {
    let mut records = walk(0, &["checkout.shop.svc.cluster.local"], true);
    records.extend(walk(
        2000,
        &[
            "www.example.com.shop.svc.cluster.local",
            "www.example.com.svc.cluster.local",
            "www.example.com.cluster.local",
            "www.example.com",
        ],
        true,
    ));
    // The same FQDN right after the first lookup (within the window): a new lookup.
    records.extend(walk(2100, &["www.example.com"], true));
    records.extend(walk(
        4000,
        &[
            "nope.shop.svc.cluster.local",
            "nope.svc.cluster.local",
            "nope.cluster.local",
            "nope",
        ],
        false,
    ));
    records.push(query(6000, C, "lost.shop.svc.cluster.local", "A", None));
    let found = lookups(&records, CLUSTER_DOMAIN);
    let summary: Vec<(&str, Option<&str>, u64, u64, u64)> = found
        .iter()
        .map(|l| {
            (
                l.base.as_str(),
                l.answer.as_deref(),
                l.queries,
                l.nxdomain,
                l.unanswered,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("checkout", Some("checkout.shop.svc.cluster.local"), 2, 0, 0),
            ("www.example.com", Some("www.example.com"), 8, 6, 0),
            ("www.example.com", Some("www.example.com"), 2, 0, 0),
            ("nope", None, 8, 8, 0),
            ("lost", None, 1, 0, 1),
        ]
    );
    let clients = per_client(&records, CLUSTER_DOMAIN);
    assert_eq!(clients.len(), 1);
    let client = &clients[0];
    assert_eq!(client.client_pod.as_deref(), Some("shop/client"));
    assert_eq!(
        (
            client.lookups,
            client.queries,
            client.nxdomain,
            client.unanswered
        ),
        (5, 21, 14, 1)
    );
    assert_eq!(client.queries_per_lookup, 21.0 / 5.0);
    assert_eq!(client.nxdomain_share, 14.0 / 21.0);
    let walks: Vec<(&str, u64, u64, u64)> = client
        .walks
        .iter()
        .map(|w| (w.base.as_str(), w.lookups, w.queries, w.nxdomain))
        .collect();
    assert_eq!(
        walks,
        [
            ("www.example.com", 2, 10, 6),
            ("nope", 1, 8, 8),
            ("checkout", 1, 2, 0),
            ("lost", 1, 1, 0),
        ]
    );
    assert_eq!(client.walks[0].names.len(), 4);
}

#[test]
fn clients_and_windows_separate_lookups() {
    let records = vec![
        query(0, C, "a.shop.svc.cluster.local", "A", NX),
        // Another client, same name: its own lookup.
        query(1, "10.244.1.10:5000", "a.svc.cluster.local", "A", NX),
        // Same client, but past the window: a new lookup.
        query(1500, C, "a.svc.cluster.local", "A", NX),
    ];
    let found = lookups(&records, CLUSTER_DOMAIN);
    assert_eq!(found.len(), 3);
    assert!(per_client(&[], CLUSTER_DOMAIN).is_empty());
}
