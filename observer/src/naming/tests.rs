//! The namer against injected dumps, and the namespace listing.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::*;

const V4: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/rules/iptables/mixed-v4-nat.saved"
));
const NFT_V6: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/rules/nftables/mixed-v6.json"
));

/// Fixture text per namespace, swappable mid-test; counts reads.
#[derive(Clone, Default)]
struct Fake {
    answers: Arc<Mutex<HashMap<u32, Result<Dumps, String>>>>,
    reads: Arc<Mutex<Vec<u32>>>,
}

impl Fake {
    fn set(&self, netns: u32, answer: Result<Dumps, String>) {
        self.answers.lock().unwrap().insert(netns, answer);
    }
    fn reads(&self) -> usize {
        self.reads.lock().unwrap().len()
    }
}

impl DumpSource for Fake {
    fn dump(&mut self, netns: u32) -> Result<Dumps, String> {
        self.reads.lock().unwrap().push(netns);
        self.answers
            .lock()
            .unwrap()
            .get(&netns)
            .cloned()
            .unwrap_or_else(|| Err("no such namespace".to_owned()))
    }
}

fn iptables(text: &str) -> Result<Dumps, String> {
    Ok(Dumps {
        dumps: vec![Dump {
            command: "iptables-save".to_owned(),
            format: DumpFormat::IptablesSave,
            text: text.to_owned(),
        }],
        problems: Vec::new(),
    })
}

fn sa(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn named(service: &str, current: bool) -> Naming {
    Naming {
        service: Some(service.to_owned()),
        endpoint_in_rules: Some(current),
    }
}

const NS: u32 = 4026532301;

fn namer(fake: &Fake) -> Namer {
    Namer::new(NamerConfig::default(), Box::new(fake.clone()))
}

#[test]
fn names_from_injected_dumps_and_publishes_services_once() {
    let fake = Fake::default();
    let mut both = iptables(V4).unwrap();
    both.dumps.push(Dump {
        command: "nft -j list table ip6 kube-proxy".to_owned(),
        format: DumpFormat::NftJson,
        text: NFT_V6.to_owned(),
    });
    fake.set(NS, Ok(both));
    let mut namer = namer(&fake);
    let t0 = Instant::now();
    assert_eq!(
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            t0
        ),
        named("shop/checkout:http", true)
    );
    assert_eq!(
        namer.name(
            NS,
            Proto::Tcp,
            sa("[fd00:10:96::a]:80"),
            sa("[fd00:10:244:2::7]:3000"),
            t0
        ),
        named("shop/checkout:http", true)
    );
    assert_eq!(fake.reads(), 1);
    let updates = namer.take_service_updates();
    let mut names: Vec<_> = updates
        .iter()
        .map(|r| format!("{} {}", r.proto, r.service))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "tcp kube-system/kube-dns:dns-tcp",
            "tcp shop/checkout:http",
            "tcp shop/checkout:metrics",
            "tcp web-team/front-end.v2:https-alt",
            "udp kube-system/kube-dns:dns"
        ]
    );
    assert!(updates.iter().all(|r| r.netns == NS));
    assert!(namer.take_service_updates().is_empty());
    assert!(namer.take_warnings().is_empty());
}

#[test]
fn rules_are_reread_when_old_and_changes_are_published() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let mut namer = namer(&fake);
    let t0 = Instant::now();
    namer.name(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:9090"),
        sa("10.244.1.13:9100"),
        t0,
    );
    namer.take_service_updates();
    // The metrics endpoint moves to another pod.
    fake.set(
        NS,
        iptables(&V4.replace("10.244.1.13:9100", "10.244.7.7:9100")),
    );
    let young = t0 + Duration::from_secs(9);
    assert_eq!(
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:9090"),
            sa("10.244.1.13:9100"),
            young
        ),
        named("shop/checkout:metrics", true),
        "rules younger than max_age and a hit: no re-read"
    );
    assert_eq!(fake.reads(), 1);
    let old = t0 + Duration::from_secs(10);
    assert_eq!(
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:9090"),
            sa("10.244.1.13:9100"),
            old
        ),
        named("shop/checkout:metrics", false),
        "the old pod is now a stale pin"
    );
    assert_eq!(fake.reads(), 2);
    let updates = namer.take_service_updates();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].service, "shop/checkout:metrics");
    assert_eq!(updates[0].endpoints[0].addr, sa("10.244.7.7:9100"));
}

#[test]
fn a_miss_rereads_at_most_every_min_interval() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let mut namer = namer(&fake);
    let t0 = Instant::now();
    let unknown = |namer: &mut Namer, at| {
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.99.99:80"),
            sa("10.244.5.5:80"),
            at,
        )
    };
    assert_eq!(unknown(&mut namer, t0), Naming::default());
    assert_eq!(fake.reads(), 1);
    assert_eq!(
        unknown(&mut namer, t0 + Duration::from_millis(1999)),
        Naming::default()
    );
    assert_eq!(fake.reads(), 1, "within min_interval of the last read");
    // A new Service appears; the next miss after min_interval finds it.
    let added = V4.replace(
        "-A KUBE-SERVICES -m comment",
        "-A KUBE-SERVICES -d 10.96.99.99/32 -p tcp -m comment --comment \"new/svc:web cluster IP\" -m tcp --dport 80 -j KUBE-SVC-NEW\n-A KUBE-SVC-NEW -m comment --comment \"new/svc:web -> 10.244.5.5:80\" -j KUBE-SEP-NEW\n-A KUBE-SEP-NEW -p tcp -m tcp -j DNAT --to-destination 10.244.5.5:80\n-A KUBE-SERVICES -m comment",
    );
    fake.set(NS, iptables(&added));
    assert_eq!(
        unknown(&mut namer, t0 + Duration::from_secs(2)),
        named("new/svc:web", true)
    );
    assert_eq!(fake.reads(), 2);
    // A stale pin is a miss too, but again rate-limited.
    let stale = namer.name(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.9.9:3000"),
        t0 + Duration::from_secs(3),
    );
    assert_eq!(stale, named("shop/checkout:http", false));
    assert_eq!(fake.reads(), 2);
    namer.name(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.9.9:3000"),
        t0 + Duration::from_secs(4),
    );
    assert_eq!(fake.reads(), 3);
}

#[test]
fn unreadable_rules_warn_once_per_namespace_and_cause() {
    let fake = Fake::default();
    fake.set(NS, Err("iptables-save, nft not found".to_owned()));
    fake.set(7, iptables("*nat\n-A KUBE-SERVICES -d\n"));
    let mut namer = namer(&fake);
    let t0 = Instant::now();
    for step in 0..5 {
        let at = t0 + Duration::from_secs(3 * step);
        let naming = namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            at,
        );
        assert_eq!(naming, Naming::default());
        namer.name(
            7,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            at,
        );
    }
    assert_eq!(fake.reads(), 10);
    assert_eq!(
        namer.take_warnings(),
        [
            "cannot name connections in netns 4026532301: iptables-save, nft not found; records get service null",
            "cannot name connections in netns 7: iptables-save: iptables-save line 2: option -d has no value (truncated dump?); records get service null",
        ]
    );
    assert!(namer.take_warnings().is_empty());
}

#[test]
fn a_failed_reread_keeps_the_last_good_rules() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let mut namer = namer(&fake);
    let t0 = Instant::now();
    namer.name(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.14:3000"),
        t0,
    );
    fake.set(NS, Err("nsenter not found".to_owned()));
    let later = t0 + Duration::from_secs(60);
    assert_eq!(
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            later
        ),
        named("shop/checkout:http", true)
    );
    assert_eq!(namer.take_warnings().len(), 1);
}

#[test]
fn missing_tools_warn_only_when_nothing_was_found() {
    let fake = Fake::default();
    let mut with_problem = iptables(V4).unwrap();
    with_problem.problems.push("nft not found".to_owned());
    fake.set(NS, Ok(with_problem));
    fake.set(
        8,
        Ok(Dumps {
            dumps: Vec::new(),
            problems: vec!["iptables-save not found".to_owned()],
        }),
    );
    let mut namer = namer(&fake);
    let t0 = Instant::now();
    namer.name(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.14:3000"),
        t0,
    );
    namer.name(
        8,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.14:3000"),
        t0,
    );
    assert_eq!(
        namer.take_warnings(),
        ["cannot name connections in netns 8: iptables-save not found; records get service null"]
    );
}

#[test]
fn own_namespace_is_listed() {
    let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap();
    assert!(list_namespaces().iter().any(|info| info.inode == own));
}

/// A source whose every read waits for a token: a stuck `nsenter`, under the test's
/// control. Counts reads as they start.
struct Gated {
    fake: Fake,
    tokens: std::sync::mpsc::Receiver<()>,
}

impl DumpSource for Gated {
    fn dump(&mut self, netns: u32) -> Result<Dumps, String> {
        self.fake.reads.lock().unwrap().push(netns);
        self.tokens.recv().map_err(|_| "closed".to_owned())?;
        self.fake.answers.lock().unwrap()[&netns].clone()
    }
}

fn gated(fake: &Fake) -> (Namer, std::sync::mpsc::Sender<()>) {
    let (open, tokens) = std::sync::mpsc::channel();
    let source = Gated {
        fake: fake.clone(),
        tokens,
    };
    (Namer::spawn(NamerConfig::default(), Box::new(source)), open)
}

fn finished(netns: u32, original_dst: &str, backend: &str) -> crate::model::record::ConnRecord {
    crate::model::record::ConnRecord {
        proto: Proto::Tcp,
        client: sa("10.244.1.9:40000"),
        original_dst: sa(original_dst),
        backend: sa(backend),
        service: None,
        endpoint_in_rules: None,
        netns,
        start: chrono::Utc::now(),
        end: Some(chrono::Utc::now()),
        duration_ms: 1.0,
        requests: 1,
        bytes_to_backend: 1,
        bytes_from_backend: 1,
        close: crate::model::record::Close::Fin,
        start_seen: true,
    }
}

#[test]
fn with_a_worker_lookups_never_wait_and_finished_connections_wait_for_their_rules() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let (mut namer, open) = gated(&fake);
    let t0 = Instant::now();
    // The read is stuck: the lookup answers at once, unnamed, and says what it waits for.
    let first = namer.lookup(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.14:3000"),
        t0,
    );
    assert_eq!(
        first,
        Lookup {
            naming: Naming::default(),
            wait_for: Some(1)
        }
    );
    let again = namer.lookup(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.12:3000"),
        t0,
    );
    assert_eq!(again.wait_for, Some(1));
    let mut hold = hold::Hold::new(Duration::from_secs(2), Duration::from_secs(10));
    let record = finished(NS, "10.96.35.226:80", "10.244.1.14:3000");
    assert!(hold.push(1, record, first.wait_for, t0).is_none());
    // A connection with nothing to wait for keeps its place behind it.
    let other = finished(9, "10.96.0.1:443", "10.244.1.1:6443");
    assert!(hold.push(2, other, None, t0).is_none());
    assert!(hold.release(&namer, t0).is_empty());
    // One read for both lookups, however many ask while it runs.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(fake.reads(), 1);

    open.send(()).unwrap();
    assert!(namer.wait(Instant::now() + Duration::from_secs(10)));
    assert_eq!(namer.generation(NS), 1);
    let released = hold.release(&namer, t0);
    let named: Vec<(i32, Option<&str>, Option<bool>)> = released
        .iter()
        .map(|(id, r)| (*id, r.service.as_deref(), r.endpoint_in_rules))
        .collect();
    assert_eq!(
        named,
        [(1, Some("shop/checkout:http"), Some(true)), (2, None, None)]
    );
    assert!(hold.is_empty());
    assert_eq!(namer.take_service_updates().len(), 5);
    // Fresh rules that name it: nothing to wait for, no read.
    let hit = namer.lookup(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.14:3000"),
        t0 + Duration::from_secs(1),
    );
    assert_eq!(hit.wait_for, None);
    assert_eq!(fake.reads(), 1);
}

#[test]
fn a_held_connection_is_written_unnamed_once_its_wait_is_over() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let (mut namer, _open) = gated(&fake);
    let t0 = Instant::now();
    let lookup = namer.lookup(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.14:3000"),
        t0,
    );
    let mut hold = hold::Hold::new(Duration::from_secs(2), Duration::from_secs(10));
    let record = finished(NS, "10.96.35.226:80", "10.244.1.14:3000");
    // The first read of a namespace: the longer limit.
    assert_eq!(lookup.wait_for, Some(1));
    assert!(hold.push("a", record, lookup.wait_for, t0).is_none());
    assert_eq!(hold.next_deadline(), Some(t0 + Duration::from_secs(10)));
    assert!(
        hold.release(&namer, t0 + Duration::from_millis(9999))
            .is_empty()
    );
    let released = hold.release(&namer, t0 + Duration::from_secs(10));
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].1.service, None);
    // Nothing held and a final name: handed straight back.
    let record = finished(NS, "10.96.35.226:80", "10.244.1.14:3000");
    assert!(hold.push("b", record, None, t0).is_some());
}
