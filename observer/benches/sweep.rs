//! A sweep of the kernel's connection table at 100k open connections (needs root): the
//! table read entry by entry (aya's iterator) and in batches, and the tracker's and
//! conntrack view's part. Also prints the resident memory those 100k connections take
//! in user space. At 100 open connections (a keep-alive load), the whole-table walk
//! against one lookup per known key, which the sweep uses while no connection entered
//! the table since its last walk (`pipeline::table`).
//! `sudo -E cargo bench -p observer --bench sweep`.

use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd};
use std::time::Duration;

use aya::maps::{HashMap, Map, MapData};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use observer::kernel::batch;
use observer::model::tracker::{Clock, Tracker};
use observer::pipeline::reconcile::matching::ConntrackMatcher;
use observer_common::conn::{ConnState, FAMILY_IPV4, PROTO_TCP};

const OPEN: u64 = 100_000;
const SECOND: u64 = 1_000_000_000;

/// `BPF_MAP_CREATE`'s first members of `union bpf_attr`.
#[repr(C)]
struct CreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// A kernel hash map shaped like observer's `CONNS` (262,144 entries).
fn conns_map() -> (HashMap<MapData, u64, ConnState>, OwnedFd) {
    let attr = CreateAttr {
        map_type: 1, // BPF_MAP_TYPE_HASH
        key_size: 8,
        value_size: std::mem::size_of::<ConnState>() as u32,
        max_entries: 262_144,
        map_flags: 0,
    };
    // SAFETY: BPF_MAP_CREATE (0) with the leading members of its attribute union.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0,
            &raw const attr,
            std::mem::size_of::<CreateAttr>(),
        )
    };
    assert!(
        fd >= 0,
        "cannot create a BPF map (run as root): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel just returned this descriptor to us alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let copy = fd.try_clone().expect("a second descriptor");
    let data = MapData::from_fd(fd).expect("map data");
    let map = HashMap::try_from(Map::HashMap(data)).expect("a u64 -> ConnState hash map");
    (map, copy)
}

fn state(n: u64) -> ConnState {
    let mut state = ConnState {
        start_ns: 100 * SECOND + n,
        last_ns: 100 * SECOND + n,
        netns: 4026532301,
        start_seen: 1,
        seq_known: [1, 1],
        ..Default::default()
    };
    for tuple in [&mut state.original, &mut state.reply] {
        tuple.family = FAMILY_IPV4;
        tuple.protocol = PROTO_TCP;
    }
    state.original.src.addr[..4].copy_from_slice(&[10, 244, (n >> 16) as u8, (n >> 8) as u8]);
    state.original.src.port = n as u16;
    state.original.dst.addr[..4].copy_from_slice(&[10, 96, 0, 10]);
    state.original.dst.port = 80;
    state.reply.src.addr[..4].copy_from_slice(&[10, 244, 1, 13]);
    state.reply.src.port = 8080;
    state
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn sweep(c: &mut Criterion) {
    let (mut map, fd) = conns_map();
    for n in 0..OPEN {
        map.insert(0xffff_8880_0000_0000 + n * 256, state(n), 0)
            .unwrap();
    }
    let mut reader = batch::BatchReader::<u64, ConnState>::default();
    let entries = reader.lookup_all(fd.as_fd()).unwrap();
    assert_eq!(entries.len() as u64, OPEN);
    let clock = Clock {
        monotonic_ns: 100 * SECOND,
        wall: "2026-08-06T13:46:00Z".parse().unwrap(),
    };
    let before = rss_kib();
    let mut tracker = Tracker::new(clock, Duration::from_secs(30));
    let mut view = ConntrackMatcher::default();
    tracker.sweep(&entries, 101 * SECOND, true);
    view.on_sweep(&entries);
    eprintln!(
        "user-space state of {OPEN} open connections (tracker + conntrack view + one sweep's table copy): {} KiB resident",
        rss_kib() - before
            + (entries.capacity() * std::mem::size_of::<(u64, ConnState)>()) as u64 / 1024
    );
    let mut group = c.benchmark_group("sweep_100k");
    group.throughput(Throughput::Elements(OPEN));
    group.sample_size(10);
    group.bench_function("read_entry_by_entry", |b| {
        b.iter(|| map.iter().filter_map(Result::ok).count())
    });
    group.bench_function("read_batched", |b| {
        b.iter(|| reader.lookup_all(fd.as_fd()).unwrap().len())
    });
    group.bench_function("tracker_and_view", |b| {
        b.iter(|| {
            let sweep = tracker.sweep(&entries, 101 * SECOND, true);
            view.on_sweep(&entries);
            sweep.progress.len()
        })
    });
    // Every connection carried traffic since the last sweep: its record is made only for
    // a live view; the log alone (`observer record`) takes finished connections.
    let mut moved = entries.clone();
    let mut second = 101;
    for (with_view, name) in [(true, "all_moved_live_view"), (false, "all_moved_log_only")] {
        group.bench_function(name, |b| {
            b.iter(|| {
                second += 1;
                for (_, state) in &mut moved {
                    state.last_ns += SECOND;
                }
                tracker
                    .sweep(&moved, second * SECOND, with_view)
                    .progress
                    .len()
            })
        });
    }
    group.finish();
}

/// 100 open connections: the walk of every bucket against a lookup per known key.
fn sweep_few(c: &mut Criterion) {
    const FEW: u64 = 100;
    let (mut map, fd) = conns_map();
    let keys: Vec<u64> = (0..FEW).map(|n| 0xffff_8880_0000_0000 + n * 256).collect();
    for (n, key) in keys.iter().enumerate() {
        map.insert(key, state(n as u64), 0).unwrap();
    }
    let mut reader = batch::BatchReader::<u64, ConnState>::default();
    let mut group = c.benchmark_group("sweep_100");
    group.throughput(Throughput::Elements(FEW));
    group.bench_function("read_batched", |b| {
        b.iter(|| reader.lookup_all(fd.as_fd()).unwrap().len())
    });
    group.bench_function("read_by_key", |b| {
        b.iter(|| keys.iter().filter(|key| map.get(key, 0).is_ok()).count())
    });
    group.finish();
}

criterion_group!(benches, sweep, sweep_few);
criterion_main!(benches);
