//! The per-connection user-space path without the kernel: an open and a close ring-buffer
//! record decoded, tracked (and matched with conntrack's view, as `record` does), named from a realistic rule set, and one JSON line written.
//! Throughput is in connections: `cargo bench -p observer --bench user_path`.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use observer::kernel::decode;
use observer::model::tracker::{Clock, Tracker};
use observer::naming::services::{
    Dump, DumpFormat, DumpSource, Dumps, Namer, NamerConfig, RulesReadError,
};
use observer::pipeline::reconcile::matching::ConntrackMatcher;
use observer::sinks::log::LogWriter;
use observer_common::conn::{
    CLOSE_RST, ConnEvent, ConnState, EVENT_CLOSE, EVENT_OPEN, Endpoint, FAMILY_IPV4, FlowTuple,
    PROTO_TCP,
};

const NETNS: u32 = 4026532301;
const SECOND: u64 = 1_000_000_000;
const RULES: &str = include_str!("../tests/data/rules/iptables/k8s-overall.saved");

/// The rules of every namespace: kube-proxy's iptables-save output.
struct Rules;

impl DumpSource for Rules {
    fn dump(&mut self, _netns: u32) -> Result<Dumps, RulesReadError> {
        Ok(Dumps {
            dumps: vec![Dump {
                command: "iptables-save".to_owned(),
                format: DumpFormat::IptablesSave,
                text: RULES.to_owned(),
            }],
            problems: Vec::new(),
        })
    }
}

fn endpoint(addr: std::net::SocketAddr) -> Endpoint {
    let std::net::SocketAddr::V4(v4) = addr else {
        panic!("an IPv4 address: {addr}");
    };
    let mut bytes = [0; 16];
    bytes[..4].copy_from_slice(&v4.ip().octets());
    Endpoint {
        addr: bytes,
        port: v4.port(),
        _pad: [0; 2],
    }
}

/// A Service address and one of its endpoints, from the rules.
fn service_and_backend() -> (std::net::SocketAddr, std::net::SocketAddr) {
    let (map, errors) = observer::naming::services::parse_dumps(&Rules.dump(NETNS).unwrap());
    assert!(errors.is_empty(), "{errors:?}");
    let record = map
        .service_records(NETNS, chrono::Utc::now())
        .into_iter()
        .find(|record| {
            record.proto == observer::model::record::Proto::Tcp
                && !record.endpoints.is_empty()
                && record.frontends.iter().any(|f| f.ip.is_some())
        })
        .expect("a TCP Service with endpoints");
    let frontend = record.frontends.iter().find(|f| f.ip.is_some()).unwrap();
    let dialed = std::net::SocketAddr::new(frontend.ip.unwrap(), frontend.port);
    (dialed, record.endpoints[0].addr)
}

fn state(dialed: std::net::SocketAddr, backend: std::net::SocketAddr, port: u16) -> ConnState {
    let client: std::net::SocketAddr = format!("10.244.1.9:{port}").parse().unwrap();
    ConnState {
        start_ns: 100 * SECOND,
        last_ns: 100 * SECOND,
        bytes: [93, 180],
        requests: 1,
        netns: NETNS,
        start_seen: 1,
        seq_known: [1, 1],
        original: FlowTuple {
            src: endpoint(client),
            dst: endpoint(dialed),
            family: FAMILY_IPV4,
            protocol: PROTO_TCP,
            _pad: 0,
        },
        reply: FlowTuple {
            src: endpoint(backend),
            dst: endpoint(client),
            family: FAMILY_IPV4,
            protocol: PROTO_TCP,
            _pad: 0,
        },
        ..Default::default()
    }
}

/// The ring-buffer record of `event`.
fn bytes(event: &ConnEvent) -> &[u8] {
    // SAFETY: `ConnEvent` is `#[repr(C)]` plain data; its bytes are what the kernel sends.
    unsafe {
        std::slice::from_raw_parts(
            (event as *const ConnEvent).cast::<u8>(),
            std::mem::size_of::<ConnEvent>(),
        )
    }
}

fn user_path(c: &mut Criterion) {
    let (dialed, backend) = service_and_backend();
    let clock = Clock {
        monotonic_ns: 100 * SECOND,
        wall: "2026-08-06T13:46:00Z".parse().unwrap(),
    };
    let mut tracker = Tracker::new(clock, Duration::from_secs(30));
    let mut namer = Namer::new(NamerConfig::default(), Box::new(Rules));
    // conntrack's view (on in `observer record`): every event passes it.
    let mut view = ConntrackMatcher::default();
    let mut log = LogWriter::new(Box::new(std::io::sink()), "bench");
    // Records as the ring buffer hands them over: a new connection (and client port)
    // each time, opened and then reset 1.5 ms later.
    let mut open = ConnEvent {
        kind: EVENT_OPEN,
        conntrack: 0xffff_8880_1234_5600,
        time_ns: 100 * SECOND,
        state: state(dialed, backend, 40000),
        ..Default::default()
    };
    let mut n: u64 = 0;
    let mut group = c.benchmark_group("user_path");
    group.throughput(Throughput::Elements(1));
    group.bench_function("open_close_named_logged", |b| {
        b.iter(|| {
            n += 1;
            open.conntrack = 0xffff_8880_0000_0000 + (n % 65536) * 256;
            open.state.start_ns = 100 * SECOND + n * 1000;
            open.time_ns = open.state.start_ns;
            open.state.original.src.port = (n % 28000) as u16 + 32768;
            open.state.reply.dst.port = open.state.original.src.port;
            let mut close = open;
            close.kind = EVENT_CLOSE;
            close.close = CLOSE_RST;
            close.state.last_ns = open.state.start_ns + 1_500_000;
            for raw in [bytes(&open), bytes(&close)] {
                let event = decode::record::<ConnEvent>(raw).unwrap();
                view.on_kernel_event(&event);
                // Without a live view an open event makes no record (`Session::on_events`).
                if event.kind == EVENT_OPEN {
                    tracker.opened(&event);
                    continue;
                }
                let (mut id, mut record) = tracker.on_event(&event).unwrap();
                view.rewrite(&mut id, &mut record);
                let lookup = namer.lookup(
                    record.netns,
                    record.proto,
                    record.original_dst,
                    record.backend,
                    None,
                    Instant::now(),
                );
                lookup.naming.apply_to(&mut record);
                assert_eq!(record.endpoint_in_rules, Some(true));
                log.conn(&record).unwrap();
            }
        })
    });
    // Its parts, for where the time goes.
    let record = {
        tracker.on_event(&open).unwrap();
        let mut close = open;
        close.kind = EVENT_CLOSE;
        tracker.on_event(&close).unwrap().1
    };
    group.bench_function("name_lookup", |b| {
        b.iter(|| {
            namer.lookup(
                record.netns,
                record.proto,
                record.original_dst,
                record.backend,
                None,
                Instant::now(),
            )
        })
    });
    group.bench_function("log_line", |b| b.iter(|| log.conn(&record).unwrap()));
    group.bench_function("decode_track", |b| {
        b.iter(|| {
            let event = decode::record::<ConnEvent>(bytes(&open)).unwrap();
            view.on_kernel_event(&event);
            tracker.on_event(&event).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, user_path);
criterion_main!(benches);
