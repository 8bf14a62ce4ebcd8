//! Where a tracked connection's `ConnState` lives, keyed by its `nf_conn` address.
//!
//! `CONNS` holds `--max-connections` entries. A kernel hash map has one 16-byte bucket per
//! entry (rounded up to a power of two) and hashes keys across all of them: at the default
//! 262,144 entries, 4 MiB of buckets, so a node's few hundred live connections sit on as
//! many pages, and a kept connection's packet, 10 ms after its last, pays a TLB miss
//! for its bucket (docs/perf-log.md, 2026-12-07, later). On the netfilter hooks
//! (`Levels`), new connections go first to `NEAR_CONNS` (16,384 entries, 256 KiB of
//! buckets, which the TLB keeps), and to `CONNS` only when it is full; connections adopted
//! established always go to `CONNS`. On `net_dev_queue` (`Single`) only `CONNS` is used.
//!
//! A key is never in both. On the netfilter hooks, a connection's first packet runs the
//! program before conntrack confirms its entry (`forward_netfilter.rs`), and no other
//! packet can carry an unconfirmed entry: so no two CPUs insert a new connection's key
//! at once, and where two adopt one established connection at once, both insert into
//! `CONNS` and one finds the key taken (`EEXIST`), as with one table. On `net_dev_queue`
//! a clash merges two CPUs' first datagrams onto one entry after confirmation, so a
//! new connection's key may be inserted twice at once: that hook keeps one table.

use aya_ebpf::{macros::map, maps::Array, maps::HashMap};
use observer_common::conn::ConnState;

use crate::maps::{BPF_NOEXIST, CONNS, atomic_add};

/// The first level on the netfilter hooks (see the module's doc). User space sizes it
/// (at most `--max-connections`).
#[map]
pub static NEAR_CONNS: HashMap<u64, ConnState> = HashMap::with_max_entries(16384, 0);

/// Slot 0: entries in `CONNS` put there by the netfilter program (spilled or adopted),
/// counted up before each insert and down after each removal, by the programs and by
/// user space (through a memory mapping). While it is 0, a key missing from
/// `NEAR_CONNS` is missing: no lookup in `CONNS`, whose bucket is a TLB miss.
#[map]
pub static FAR_ENTRIES: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// `BPF_F_MMAPABLE` (include/uapi/linux/bpf.h).
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// `-E2BIG`: a preallocated hash map's insert when no element is free.
const E2BIG: i32 = -7;

/// The table a program keeps its connections in.
pub trait Table {
    /// The connection at `conntrack`, if tracked.
    fn get(conntrack: u64) -> Option<*mut ConnState>;
    /// Enters a connection (`adopted`: established when first seen); `Err(-EEXIST)`
    /// when the key is taken, another error when the table is full.
    fn insert(conntrack: u64, state: &ConnState, adopted: bool) -> Result<(), i32>;
    /// Removes the connection at `conntrack`; false when it was not there (another CPU
    /// removed it first).
    fn remove(conntrack: u64) -> bool;
}

/// `CONNS` alone (`net_dev_queue` and the socket-side programs).
pub struct Single;

impl Table for Single {
    #[inline(always)]
    fn get(conntrack: u64) -> Option<*mut ConnState> {
        CONNS.get_ptr_mut(&conntrack)
    }

    #[inline(always)]
    fn insert(conntrack: u64, state: &ConnState, _adopted: bool) -> Result<(), i32> {
        CONNS.insert(&conntrack, state, BPF_NOEXIST)
    }

    #[inline(always)]
    fn remove(conntrack: u64) -> bool {
        CONNS.remove(&conntrack).is_ok()
    }
}

/// `NEAR_CONNS`, then `CONNS` (the netfilter program).
pub struct Levels;

impl Table for Levels {
    #[inline(always)]
    fn get(conntrack: u64) -> Option<*mut ConnState> {
        if let Some(state) = NEAR_CONNS.get_ptr_mut(&conntrack) {
            return Some(state);
        }
        if far_entries() == 0 {
            return None;
        }
        CONNS.get_ptr_mut(&conntrack)
    }

    #[inline(always)]
    fn insert(conntrack: u64, state: &ConnState, adopted: bool) -> Result<(), i32> {
        if !adopted {
            match NEAR_CONNS.insert(&conntrack, state, BPF_NOEXIST) {
                Err(E2BIG) => {}
                other => return other,
            }
        }
        // Counted first: a CPU that misses `NEAR_CONNS` from now on looks here too.
        add_far(1);
        let inserted = CONNS.insert(&conntrack, state, BPF_NOEXIST);
        if inserted.is_err() {
            add_far(u64::MAX);
        }
        inserted
    }

    #[inline(always)]
    fn remove(conntrack: u64) -> bool {
        if NEAR_CONNS.remove(&conntrack).is_ok() {
            return true;
        }
        if far_entries() == 0 || CONNS.remove(&conntrack).is_err() {
            return false;
        }
        add_far(u64::MAX);
        true
    }
}

/// The connection at `conntrack` in either level, for a program that runs under both
/// hooks (the revalidation): `CONNS` is looked up whatever `FAR_ENTRIES` says, since on
/// `net_dev_queue` it holds every connection uncounted.
#[inline(always)]
pub fn any_level(conntrack: u64) -> Option<*mut ConnState> {
    NEAR_CONNS
        .get_ptr_mut(&conntrack)
        .or_else(|| CONNS.get_ptr_mut(&conntrack))
}

#[inline(always)]
fn far_entries() -> u64 {
    FAR_ENTRIES.get_ptr(0).map_or(0, |count| {
        // SAFETY: a live array slot; a volatile load, since other CPUs change it.
        unsafe { core::ptr::read_volatile(count) }
    })
}

/// Adds `delta` (wrapping: `u64::MAX` subtracts one) to `FAR_ENTRIES`.
#[inline(always)]
fn add_far(delta: u64) {
    if let Some(count) = FAR_ENTRIES.get_ptr_mut(0) {
        atomic_add(count, delta);
    }
}
