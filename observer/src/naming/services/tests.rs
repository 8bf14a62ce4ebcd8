//! The namer against injected dumps, and the namespace listing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::test_support::fixture;
pub(super) use super::test_support::sa;
use super::*;

pub(super) const V4: &str = fixture!("iptables/mixed-v4-nat.saved");
const NFT_V6: &str = fixture!("nftables/mixed-v6.json");

/// Fixture text per namespace, swappable mid-test; counts reads.
#[derive(Clone, Default)]
pub(super) struct Fake {
    pub(super) answers: Arc<Mutex<HashMap<u32, Result<Dumps, String>>>>,
    pub(super) reads: Arc<Mutex<Vec<u32>>>,
}

impl Fake {
    pub(super) fn set(&self, netns: u32, answer: Result<Dumps, String>) {
        self.answers.lock().unwrap().insert(netns, answer);
    }
    pub(super) fn reads(&self) -> usize {
        self.reads.lock().unwrap().len()
    }
}

impl DumpSource for Fake {
    fn dump(&mut self, netns: u32) -> Result<Dumps, RulesReadError> {
        self.reads.lock().unwrap().push(netns);
        self.answers
            .lock()
            .unwrap()
            .get(&netns)
            .cloned()
            .unwrap_or_else(|| Err("no such namespace".to_owned()))
            .map_err(RulesReadError::Source)
    }
}

pub(super) fn iptables(text: &str) -> Result<Dumps, String> {
    Ok(Dumps {
        dumps: vec![Dump {
            command: "iptables-save".to_owned(),
            format: DumpFormat::IptablesSave,
            text: text.to_owned(),
        }],
        problems: Vec::new(),
    })
}

/// What the namer says of a TCP connection to `dst` that conntrack sent to `backend`.
fn name_tcp(namer: &mut Namer, netns: u32, dst: &str, backend: &str, at: Instant) -> Naming {
    namer.name(netns, Proto::Tcp, sa(dst), sa(backend), at)
}

/// A connection to a ClusterIP named `service`, its backend in the rules or not.
pub(super) fn named(service: &str, current: bool) -> Naming {
    Naming::named(service, current).via(FrontendKind::ClusterIp)
}

pub(super) const NS: u32 = 4026532301;

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
        name_tcp(&mut namer, NS, "10.96.35.226:80", "10.244.1.14:3000", t0),
        Naming::named("shop/checkout:http", true).via(FrontendKind::ClusterIp)
    );
    assert_eq!(
        name_tcp(
            &mut namer,
            NS,
            "[fd00:10:96::a]:80",
            "[fd00:10:244:2::7]:3000",
            t0
        ),
        Naming::named("shop/checkout:http", true).via(FrontendKind::ClusterIp)
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
    name_tcp(&mut namer, NS, "10.96.35.226:9090", "10.244.1.13:9100", t0);
    namer.take_service_updates();
    // The metrics endpoint moves to another pod.
    fake.set(
        NS,
        iptables(&V4.replace("10.244.1.13:9100", "10.244.7.7:9100")),
    );
    let young = t0 + Duration::from_secs(9);
    assert_eq!(
        name_tcp(
            &mut namer,
            NS,
            "10.96.35.226:9090",
            "10.244.1.13:9100",
            young
        ),
        Naming::named("shop/checkout:metrics", true).via(FrontendKind::ClusterIp),
        "rules younger than max_age and a hit: no re-read"
    );
    assert_eq!(fake.reads(), 1);
    let old = t0 + Duration::from_secs(10);
    assert_eq!(
        name_tcp(&mut namer, NS, "10.96.35.226:9090", "10.244.1.13:9100", old),
        Naming::named("shop/checkout:metrics", false).via(FrontendKind::ClusterIp),
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
    let unknown =
        |namer: &mut Namer, at| name_tcp(namer, NS, "10.96.99.99:80", "10.244.5.5:80", at);
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
        Naming::named("new/svc:web", true).via(FrontendKind::ClusterIp)
    );
    assert_eq!(fake.reads(), 2);
    // A stale pin is a miss too, but again rate-limited.
    let stale = name_tcp(
        &mut namer,
        NS,
        "10.96.35.226:80",
        "10.244.9.9:3000",
        t0 + Duration::from_secs(3),
    );
    assert_eq!(
        stale,
        Naming::named("shop/checkout:http", false).via(FrontendKind::ClusterIp)
    );
    assert_eq!(fake.reads(), 2);
    name_tcp(
        &mut namer,
        NS,
        "10.96.35.226:80",
        "10.244.9.9:3000",
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
        let naming = name_tcp(&mut namer, NS, "10.96.35.226:80", "10.244.1.14:3000", at);
        assert_eq!(naming, Naming::default());
        name_tcp(&mut namer, 7, "10.96.35.226:80", "10.244.1.14:3000", at);
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
    name_tcp(&mut namer, NS, "10.96.35.226:80", "10.244.1.14:3000", t0);
    fake.set(
        NS,
        Err("iptables-save, ip6tables-save, nft not found".to_owned()),
    );
    let later = t0 + Duration::from_secs(60);
    assert_eq!(
        name_tcp(&mut namer, NS, "10.96.35.226:80", "10.244.1.14:3000", later),
        Naming::named("shop/checkout:http", true).via(FrontendKind::ClusterIp)
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
    name_tcp(&mut namer, NS, "10.96.35.226:80", "10.244.1.14:3000", t0);
    name_tcp(&mut namer, 8, "10.96.35.226:80", "10.244.1.14:3000", t0);
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

/// A re-read that finds endpoints moved says which joined and which left; the first
/// read of a namespace is its initial state, not a change.
#[test]
fn endpoint_changes_are_reported_between_reads() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let mut namer = namer(&fake);
    let t0 = Instant::now();
    name_tcp(&mut namer, NS, "10.96.35.226:9090", "10.244.1.13:9100", t0);
    assert_eq!(namer.take_endpoint_changes(), vec![]);
    fake.set(
        NS,
        iptables(&V4.replace("10.244.1.13:9100", "10.244.7.7:9100")),
    );
    let before = chrono::Utc::now();
    name_tcp(
        &mut namer,
        NS,
        "10.96.35.226:9090",
        "10.244.1.13:9100",
        t0 + Duration::from_secs(10),
    );
    let changes = namer.take_endpoint_changes();
    assert_eq!(changes.len(), 1, "{changes:?}");
    let change = &changes[0];
    assert_eq!(
        (
            change.service.as_str(),
            change.proto,
            change.netns,
            change.added.clone(),
            change.removed.clone()
        ),
        (
            "shop/checkout:metrics",
            Proto::Tcp,
            NS,
            vec![sa("10.244.7.7:9100")],
            vec![sa("10.244.1.13:9100")]
        )
    );
    assert!(change.time >= before && change.time <= chrono::Utc::now());
    // Every Service gone (an empty dump): each one's endpoints all leave.
    fake.set(NS, iptables(""));
    name_tcp(
        &mut namer,
        NS,
        "10.96.35.226:9090",
        "10.244.7.7:9100",
        t0 + Duration::from_secs(20),
    );
    let gone = namer.take_endpoint_changes();
    let metrics = gone
        .iter()
        .find(|c| c.service == "shop/checkout:metrics")
        .unwrap();
    assert_eq!(
        (metrics.added.clone(), metrics.removed.clone()),
        (vec![], vec![sa("10.244.7.7:9100")])
    );
    assert!(
        gone.iter()
            .all(|c| c.added.is_empty() && !c.removed.is_empty())
    );
}

/// Serves one iptables-nft dump whole, and single chains of another text.
struct ChainSource {
    fake: Fake,
    chains: Arc<Mutex<Vec<String>>>,
    after: String,
}

impl DumpSource for ChainSource {
    fn dump(&mut self, netns: u32) -> Result<Dumps, RulesReadError> {
        self.fake.dump(netns)
    }

    fn chain(
        &mut self,
        _netns: u32,
        chain: &nft_changes::ChainRef,
    ) -> Result<String, RulesReadError> {
        self.chains.lock().unwrap().push(chain.chain.clone());
        test_support::listing(&self.after, chain.table.name(), &chain.chain)
            .ok_or_else(|| RulesReadError::Source(format!("no chain {}", chain.chain)))
    }
}

#[test]
fn announced_chains_are_read_alone_and_report_what_changed() {
    use test_support::{chain_changes, nat};
    let fake = Fake::default();
    fake.set(NS, iptables(test_support::FULL_V4));
    let chains = Arc::new(Mutex::new(Vec::new()));
    let mut reader = reader::RuleReader::new(Box::new(ChainSource {
        fake: fake.clone(),
        chains: chains.clone(),
        after: test_support::without_third_checkout_endpoint(),
    }));
    // Nothing read yet: even a chain's change needs a full read.
    let first = reader.read(
        NS,
        Instant::now(),
        &chain_changes(&[(nat("KUBE-SERVICES"), true)]),
    );
    assert_eq!((first.patched, fake.reads()), (0, 1));
    assert!(chains.lock().unwrap().is_empty());
    assert!(!first.updates.is_empty());

    let announced = chain_changes(&[
        (nat("KUBE-SVC-CHKHTTP0000000000"), true),
        (nat("KUBE-SEP-CHK3"), false),
    ]);
    let patched = reader.read(NS, Instant::now(), &announced);
    assert_eq!((patched.patched, fake.reads()), (2, 1), "no full read");
    assert_eq!(*chains.lock().unwrap(), ["KUBE-SVC-CHKHTTP0000000000"]);
    let updated: Vec<&str> = patched.updates.iter().map(|u| u.service.as_str()).collect();
    assert_eq!(updated, ["shop/checkout:http"]);
    let change: Vec<(&str, &[SocketAddr], &[SocketAddr])> = patched
        .changes
        .iter()
        .map(|c| (c.service.as_str(), &c.added[..], &c.removed[..]))
        .collect();
    assert_eq!(
        change,
        [("shop/checkout:http", &[][..], &[sa("10.244.2.7:3000")][..])]
    );
    assert!(patched.map.is_some() && patched.warnings.is_empty());

    // A chain that cannot be read alone: the whole namespace is read again.
    let again = reader.read(
        NS,
        Instant::now(),
        &chain_changes(&[(nat("KUBE-SEP-NONE"), true)]),
    );
    assert_eq!((again.patched, fake.reads()), (0, 2));
}
