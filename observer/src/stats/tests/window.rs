//! The recent-closed window, open connections kept by id, and lifetime sampling.

use super::*;
use crate::stats::aggregator::RECENT_CLOSED;
use crate::stats::quantiles::{EXACT_VALUES, Reservoir};

fn open(backend: &str, requests: u64, duration_ms: f64) -> ConnRecord {
    let mut record = conn(Some(CHECKOUT), backend, requests, duration_ms);
    record.close = Close::Open;
    record.end = None;
    record
}

fn lifetimes<'a>(agg: &'a Aggregator, backend: &str) -> &'a Reservoir {
    &agg.accs[0].backends[&addr(backend)].lifetimes
}

#[test]
fn memory_stays_bounded_over_many_connections() {
    const PAIRS: u64 = 200_000;
    let mut agg = Aggregator::default();
    for n in 1..=PAIRS {
        let duration = n as f64;
        agg.apply(id(n), &open("10.244.1.12:8080", 0, duration / 2.0));
        agg.apply(
            id(n),
            &conn(Some(CHECKOUT), "10.244.1.12:8080", 2, duration),
        );
    }
    assert_eq!(agg.open.len(), 0);
    assert_eq!(
        (agg.closed.len(), agg.closed_order.len()),
        (RECENT_CLOSED, RECENT_CLOSED)
    );
    let folded = lifetimes(&agg, "10.244.1.12:8080");
    assert_eq!(folded.values.len(), EXACT_VALUES);
    assert_eq!(folded.seen, PAIRS - RECENT_CLOSED as u64);

    // An open connection still counts, with its duration so far.
    agg.apply(id(0), &open("10.244.1.12:8080", 1, 1e9));
    let s = &agg.services()[0];
    assert_eq!(
        (s.connections, s.active, s.requests),
        (PAIRS + 1, 1, 2 * PAIRS + 1)
    );
    let b = &s.backends[0];
    assert_eq!(
        (b.bytes_to_backend, b.longest_pinned_ms),
        ((2 * PAIRS + 1) * 93, 1e9)
    );
    // Durations are uniform over 1..=200000: the sample's estimates land near the
    // true values (100000 and 180000); the seed is fixed, so this is reproducible.
    let p = b.lifetime_ms.unwrap();
    assert!((95_000.0..=105_000.0).contains(&p.p50), "{p:?}");
    assert!((175_000.0..=185_000.0).contains(&p.p90), "{p:?}");
    assert_eq!(p.max, 1e9);
}

#[test]
fn open_connections_stay_replaceable_by_id_while_others_come_and_go() {
    let mut agg = Aggregator::default();
    agg.apply(id(0), &open("10.244.1.12:8080", 1, 100.0));
    for n in 1..=5000 {
        agg.apply(id(n), &conn(Some(CHECKOUT), "10.244.1.13:8080", 1, 1.0));
    }
    agg.apply(id(0), &open("10.244.1.12:8080", 7, 90_000.0));
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.active, s.requests), (5001, 1, 5007));
    let b = &s.backends[0];
    assert_eq!((b.connections, b.active, b.requests), (1, 1, 7));
    assert_eq!(
        b.lifetime_ms,
        Some(Percentiles {
            p50: 90_000.0,
            p90: 90_000.0,
            max: 90_000.0
        })
    );
    agg.apply(
        id(0),
        &conn(Some(CHECKOUT), "10.244.1.12:8080", 9, 95_000.0),
    );
    assert!(agg.open.is_empty());
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.active, s.requests), (5001, 0, 5009));
    assert_eq!(s.backends[0].lifetime_ms.unwrap().max, 95_000.0);
}

#[test]
fn a_final_record_never_seen_open_is_counted_once() {
    let mut agg = Aggregator::default();
    agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 4, 250.0));
    // Repeated while recent: replaces. A late progress record changes nothing.
    agg.apply(id(1), &conn(Some(CHECKOUT), "10.244.1.12:8080", 5, 300.0));
    agg.apply(id(1), &open("10.244.1.12:8080", 1, 10.0));
    let s = &agg.services()[0];
    assert_eq!((s.connections, s.active, s.requests), (1, 0, 5));
    assert_eq!(
        s.backends[0].lifetime_ms,
        Some(Percentiles {
            p50: 300.0,
            p90: 300.0,
            max: 300.0
        })
    );
    // Pushed out of the recent window, it is folded in exactly once.
    for n in 2..=RECENT_CLOSED as u64 + 1 {
        agg.apply(id(n), &conn(Some(CHECKOUT), "10.244.1.13:8080", 1, 1.0));
    }
    assert!(!agg.closed.contains_key(&id(1)));
    let folded = lifetimes(&agg, "10.244.1.12:8080");
    assert_eq!((folded.seen, folded.values.as_slice()), (1, &[300.0][..]));
    let s = &agg.services()[0];
    let b = &s.backends[0];
    assert_eq!((b.connections, b.active, b.requests), (1, 0, 5));
    assert_eq!(b.lifetime_ms.unwrap().p50, 300.0);
    assert_eq!(s.connections, RECENT_CLOSED as u64 + 1);
}

#[test]
fn percentiles_are_exact_up_to_the_limit_then_keep_an_exact_max() {
    // Every closed lifetime is kept exactly: the folded ones and the recent window.
    let closed = (EXACT_VALUES + RECENT_CLOSED) as u64;
    let mut agg = Aggregator::default();
    for n in 0..closed {
        // 1..=closed in a scrambled order (2029 is prime and is coprime with it).
        let duration = (n * 2029 % closed + 1) as f64;
        agg.apply(
            id(n),
            &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, duration),
        );
    }
    for (n, duration) in [
        (closed, 0.5),
        (closed + 1, 10_000.0),
        (closed + 2, 20_000.0),
    ] {
        agg.apply(id(n), &open("10.244.1.12:8080", 1, duration));
    }
    assert!(!lifetimes(&agg, "10.244.1.12:8080").sampled());
    // 5123 values: 0.5, 1..=5120, 10000, 20000; ranks ceil(2561.5) and ceil(4610.7).
    let exact = Percentiles {
        p50: 2561.0,
        p90: 4610.0,
        max: 20_000.0,
    };
    assert_eq!(agg.services()[0].backends[0].lifetime_ms, Some(exact));

    // One more closed connection starts sampling; the maximum stays exact.
    agg.apply(
        id(closed + 3),
        &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 30_000.0),
    );
    for n in closed + 4..closed + 4 + RECENT_CLOSED as u64 {
        agg.apply(id(n), &conn(Some(CHECKOUT), "10.244.1.12:8080", 1, 2.0));
    }
    let folded = lifetimes(&agg, "10.244.1.12:8080");
    assert!(folded.sampled());
    assert_eq!((folded.values.len(), folded.max), (EXACT_VALUES, 30_000.0));
    assert_eq!(agg.services()[0].backends[0].longest_pinned_ms, 30_000.0);
}
