//! The namer with its reads on a worker thread, and finished connections held for them.

use std::time::{Duration, Instant};

use super::tests::{Fake, NS, V4, iptables, named, sa};
use super::*;
use locality::Locality;

/// A source whose every read waits for a token: a stuck `nsenter`, under the test's
/// control. Counts reads as they start.
struct Gated {
    fake: Fake,
    tokens: std::sync::mpsc::Receiver<()>,
}

impl DumpSource for Gated {
    fn dump(&mut self, netns: u32) -> Result<Dumps, RulesReadError> {
        self.fake.reads.lock().unwrap().push(netns);
        self.tokens
            .recv()
            .map_err(|_| RulesReadError::Source("closed".to_owned()))?;
        self.fake.answers.lock().unwrap()[&netns]
            .clone()
            .map_err(RulesReadError::Source)
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
        client: sa("10.244.1.9:40000"),
        original_dst: sa(original_dst),
        netns,
        start: chrono::Utc::now(),
        end: Some(chrono::Utc::now()),
        duration_ms: 1.0,
        bytes_to_backend: 1,
        bytes_from_backend: 1,
        ..crate::model::record::ConnRecord::example(backend)
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
        None,
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
        None,
        t0,
    );
    assert_eq!(again.wait_for, Some(1));
    let mut hold = held_connections::Hold::new(Duration::from_secs(2), Duration::from_secs(10));
    let record = finished(NS, "10.96.35.226:80", "10.244.1.14:3000");
    assert!(hold.must_wait(first.wait_for));
    hold.hold((1, record), first.wait_for, t0);
    // A connection with nothing to wait for keeps its place behind it.
    let other = finished(9, "10.96.0.1:443", "10.244.1.1:6443");
    assert!(hold.must_wait(None));
    hold.hold((2, other), None, t0);
    assert!(
        hold.release(&namer, &mut Locality::default(), t0)
            .is_empty()
    );
    // One read for both lookups, however many ask while it runs.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(fake.reads(), 1);

    open.send(()).unwrap();
    assert!(namer.wait(Instant::now() + Duration::from_secs(10)));
    assert_eq!(namer.generation(NS), 1);
    let released = hold.release(&namer, &mut Locality::default(), t0);
    let named: Vec<(i32, Option<&str>, Option<bool>)> = released
        .iter()
        .map(|(id, r)| (*id, r.service.as_deref(), r.endpoint_in_rules))
        .collect();
    assert_eq!(
        named,
        [(1, Some("shop/checkout:http"), Some(true)), (2, None, None)]
    );
    // A held connection learns its frontend with its name.
    let frontends: Vec<_> = released.iter().map(|(_, r)| r.frontend).collect();
    assert_eq!(
        frontends,
        [Some(crate::model::record::FrontendKind::ClusterIp), None]
    );
    assert!(hold.is_empty());
    assert_eq!(namer.take_service_updates().len(), 5);
    // Fresh rules that name it: nothing to wait for, no read.
    let hit = namer.lookup(
        NS,
        Proto::Tcp,
        sa("10.96.35.226:80"),
        sa("10.244.1.14:3000"),
        None,
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
        None,
        t0,
    );
    let mut hold = held_connections::Hold::new(Duration::from_secs(2), Duration::from_secs(10));
    let record = finished(NS, "10.96.35.226:80", "10.244.1.14:3000");
    // The first read of a namespace: the longer limit.
    assert_eq!(lookup.wait_for, Some(1));
    assert!(hold.must_wait(lookup.wait_for));
    hold.hold(("a", record), lookup.wait_for, t0);
    assert_eq!(hold.next_deadline(), Some(t0 + Duration::from_secs(10)));
    assert!(
        hold.release(
            &namer,
            &mut Locality::default(),
            t0 + Duration::from_millis(9999)
        )
        .is_empty()
    );
    let released = hold.release(
        &namer,
        &mut Locality::default(),
        t0 + Duration::from_secs(10),
    );
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].1.service, None);
    // Nothing held and a final name: written straight away.
    assert!(!hold.must_wait(None));
}

/// A source that takes `delay` per read.
struct Slow {
    fake: Fake,
    delay: Duration,
}

impl DumpSource for Slow {
    fn dump(&mut self, netns: u32) -> Result<Dumps, RulesReadError> {
        std::thread::sleep(self.delay);
        self.fake.dump(netns)
    }
}

#[test]
fn rules_that_take_long_to_read_are_reread_less_often() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let config = NamerConfig {
        max_age: Duration::from_millis(10),
        min_interval: Duration::from_millis(10),
        ..NamerConfig::default()
    };
    let source = Slow {
        fake: fake.clone(),
        delay: Duration::from_millis(50),
    };
    let mut namer = Namer::new(config, Box::new(source));
    let t0 = Instant::now();
    let hit = |namer: &mut Namer, at| {
        namer.name(
            NS,
            Proto::Tcp,
            sa("10.96.35.226:80"),
            sa("10.244.1.14:3000"),
            at,
        )
    };
    hit(&mut namer, t0);
    // Older than max_age, but younger than 4 reads' time (at least 200 ms).
    hit(&mut namer, t0 + Duration::from_millis(100));
    assert_eq!(fake.reads(), 1);
    hit(&mut namer, t0 + Duration::from_secs(10));
    assert_eq!(fake.reads(), 2);
}

#[test]
fn a_reread_that_does_not_come_in_time_leaves_the_earlier_name() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let (mut namer, open) = gated(&fake);
    let t0 = Instant::now();
    let (dst, backend) = (sa("10.96.35.226:80"), sa("10.244.1.14:3000"));
    namer.lookup(NS, Proto::Tcp, dst, backend, None, t0);
    open.send(()).unwrap();
    assert!(namer.wait(Instant::now() + Duration::from_secs(10)));
    // Rules older than max_age: a re-read is asked for, and it is stuck.
    let later = t0 + Duration::from_secs(11);
    let lookup = namer.lookup(NS, Proto::Tcp, dst, backend, None, later);
    assert_eq!(lookup.wait_for, Some(2));
    assert_eq!(lookup.naming, named("shop/checkout:http", true));
    let mut hold = held_connections::Hold::new(Duration::from_secs(2), Duration::from_secs(10));
    let record = finished(NS, "10.96.35.226:80", "10.244.1.14:3000");
    assert!(hold.must_wait(lookup.wait_for));
    hold.hold((7, record), lookup.wait_for, later);
    assert!(
        hold.release(
            &namer,
            &mut Locality::default(),
            later + Duration::from_millis(1999)
        )
        .is_empty()
    );
    let released = hold.release(
        &namer,
        &mut Locality::default(),
        later + Duration::from_secs(2),
    );
    assert_eq!(released[0].1.service.as_deref(), Some("shop/checkout:http"));
}

/// A connection held for its namespace's first read gets its traffic policy with its
/// name: an external client of an `externalTrafficPolicy: Local` NodePort is `local`,
/// a pod client of the same NodePort (short-circuited to the cluster-wide chain) is not.
#[test]
fn a_held_connection_learns_its_traffic_policy_with_its_name() {
    let fake = Fake::default();
    fake.set(NS, iptables(V4));
    let (mut namer, open) = gated(&fake);
    let t0 = Instant::now();
    let node_port = "172.18.0.2:30443";
    let lookup = namer.lookup(
        NS,
        Proto::Tcp,
        sa(node_port),
        sa("10.244.1.20:8443"),
        None,
        t0,
    );
    assert_eq!(lookup.wait_for, Some(FIRST_READ));
    let mut hold = held_connections::Hold::new(Duration::from_secs(2), Duration::from_secs(10));
    let external = crate::model::record::ConnRecord {
        client: sa("192.0.2.7:5000"),
        ..finished(NS, node_port, "10.244.1.20:8443")
    };
    let pod = finished(NS, node_port, "10.244.3.20:8443");
    hold.hold((1, external), lookup.wait_for, t0);
    hold.hold((2, pod), lookup.wait_for, t0);
    open.send(()).unwrap();
    assert!(namer.wait(Instant::now() + Duration::from_secs(10)));
    let released = hold.release(&namer, &mut Locality::default(), t0);
    let named: Vec<_> = released
        .iter()
        .map(|(id, r)| (*id, r.service.as_deref(), r.endpoint_in_rules, r.policy))
        .collect();
    let service = Some("web-team/front-end.v2:https-alt");
    assert_eq!(
        named,
        [
            (
                1,
                service,
                Some(true),
                Some(crate::model::record::TrafficPolicy::Local)
            ),
            (2, service, Some(true), None),
        ]
    );
}
