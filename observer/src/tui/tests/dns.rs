//! The DNS screen (`d`): empty, and a client's walks; Esc goes back; the status bar
//! counts malformed DNS messages.

use super::snapshots::{assert_snapshot, screen};
use super::*;
use crate::model::record::DnsRecord;
use crate::tui::state::Screen;

fn query(ms: i64, name: &str, qtype: &str, rcode: Option<&str>) -> Update {
    Update::Dns(DnsRecord {
        proto: Proto::Udp,
        client: addr("10.244.1.9:40000"),
        client_pod: Some("shop/client".into()),
        server: addr("10.96.0.10:53"),
        netns: 1,
        id: 1,
        name: name.into(),
        qtype: qtype.into(),
        rcode: rcode.map(str::to_owned),
        time: at(ms),
        latency_ms: None,
    })
}

#[test]
fn snapshot_dns_empty() {
    let mut app = new_app();
    tick(&mut app, 0);
    keys(&mut app, "d");
    assert_eq!(app.screen, Screen::Dns);
    assert_snapshot("dns_empty", &screen(&app, 80, 24));
    assert_eq!(key(&mut app, KeyCode::Esc), None);
    assert_eq!(app.screen, Screen::Services);
}

#[test]
fn snapshot_dns_walks() {
    let mut app = steady();
    for (name, qtype, rcode) in [
        ("checkout.shop.svc.cluster.local", "A", "NOERROR"),
        ("checkout.shop.svc.cluster.local", "AAAA", "NOERROR"),
    ] {
        live(&mut app, query(100, name, qtype, Some(rcode)));
    }
    let names = [
        "www.example.com.shop.svc.cluster.local",
        "www.example.com.svc.cluster.local",
        "www.example.com.cluster.local",
        "www.example.com",
    ];
    for (i, name) in names.iter().enumerate() {
        let rcode = if i == 3 { "NOERROR" } else { "NXDOMAIN" };
        for qtype in ["A", "AAAA"] {
            live(&mut app, query(2000 + i as i64, name, qtype, Some(rcode)));
        }
    }
    live(
        &mut app,
        query(4000, "lost.shop.svc.cluster.local", "A", None),
    );
    let mut stats = stats();
    stats.dns_malformed = 3;
    live(&mut app, Update::Stats(stats));
    // Clients by pod name, the default.
    keys(&mut app, "d");
    assert_snapshot("dns_walks", &screen(&app, 80, 24));
}
