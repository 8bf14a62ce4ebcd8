//! The kernel's connection table as user space reads and trims it: `CONNS`, and on the
//! netfilter hooks the small first level `NEAR_CONNS` in front of it (observer-ebpf's
//! `table.rs`: a key is in one level at most; `FAR_ENTRIES` counts the netfilter
//! program's entries in `CONNS`, and user space counts its own removals there down).

use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use aya::maps::{HashMap, MapData, MapError};
use observer_common::conn::ConnState;

use crate::kernel::batch::BatchReader;
use crate::kernel::load::{self, LoadError};
use crate::kernel::mapped_array::MappedArray;

/// Entries of the first level on the netfilter hooks (at most `--max-connections`):
/// 256 KiB of hash buckets, which a kept connection's packet finds in the TLB where
/// `CONNS`' 4 MiB (at its default size) cost a miss (docs/perf-log.md, 2026-12-07, later).
pub const NEAR_CONNECTIONS: u32 = 16_384;

/// One kernel hash map of connections.
struct Level {
    map: HashMap<MapData, u64, ConnState>,
    /// The map's descriptor again, for batch reads (aya 0.14 has none).
    fd: OwnedFd,
    reader: BatchReader<u64, ConnState>,
    /// Its hash buckets (its size rounded up to a power of two), which a whole read walks.
    buckets: usize,
}

impl Level {
    fn take(ebpf: &mut aya::Ebpf, name: &'static str, entries: u32) -> Result<Level, LoadError> {
        let map = load::take_map(ebpf, name)?;
        let fd = match &map {
            aya::maps::Map::HashMap(data) => data.fd().as_fd().try_clone_to_owned(),
            _ => Err(std::io::Error::other(format!("{name} is not a hash map"))),
        }
        .map_err(LoadError::ConnsFd)?;
        Ok(Level {
            map: HashMap::try_from(map).map_err(LoadError::Map)?,
            fd,
            reader: BatchReader::default(),
            buckets: (entries as usize).next_power_of_two(),
        })
    }

    fn all(&mut self, out: &mut Vec<(u64, ConnState)>) {
        match self.reader.lookup_all(self.fd.as_fd()) {
            Ok(entries) => out.extend(entries),
            Err(_) => out.extend(self.map.iter().filter_map(Result::ok)),
        }
    }

    /// `Ok(None)` when the key is not there.
    fn get(&self, key: u64) -> Result<Option<ConnState>, MapError> {
        match self.map.get(&key, 0) {
            Ok(state) => Ok(Some(state)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(err) => Err(err),
        }
    }
}

pub struct ConnTable {
    /// `NEAR_CONNS`, where the netfilter program keeps connections.
    near: Option<Level>,
    /// `CONNS`.
    far: Level,
    /// `FAR_ENTRIES`: `far`'s entries, where `near` is used.
    far_entries: MappedArray,
}

impl ConnTable {
    /// Takes the maps out of the loaded object (`near_entries` as sized at load);
    /// `levels`: the netfilter program runs, which uses `NEAR_CONNS`.
    pub fn take(
        ebpf: &mut aya::Ebpf,
        (near_entries, far_entries): (u32, u32),
        levels: bool,
    ) -> Result<ConnTable, LoadError> {
        Ok(ConnTable {
            near: levels
                .then(|| Level::take(ebpf, "NEAR_CONNS", near_entries))
                .transpose()?,
            far: Level::take(ebpf, "CONNS", far_entries)?,
            far_entries: load::mapped_array(ebpf, "FAR_ENTRIES", 1)?,
        })
    }

    /// Whether `CONNS` may hold entries: always where it is the only level.
    fn far_used(&self) -> bool {
        self.near.is_none() || self.far_entries.get(0) != 0
    }

    /// Every entry: read in batches, or entry by entry where the kernel cannot batch.
    pub fn all(&mut self) -> Vec<(u64, ConnState)> {
        let mut out = Vec::new();
        if let Some(near) = &mut self.near {
            near.all(&mut out);
        }
        if self.far_used() {
            self.far.all(&mut out);
        }
        out
    }

    /// The hash buckets `all` walks now.
    pub fn buckets(&self) -> usize {
        self.near.as_ref().map_or(0, |near| near.buckets)
            + if self.far_used() { self.far.buckets } else { 0 }
    }

    /// The entry at `key`; `Err` when a lookup failed for another reason than a
    /// missing key.
    pub fn get(&self, key: u64) -> Result<Option<ConnState>, MapError> {
        if let Some(state) = self
            .near
            .as_ref()
            .map(|near| near.get(key))
            .transpose()?
            .flatten()
        {
            return Ok(Some(state));
        }
        if !self.far_used() {
            return Ok(None);
        }
        self.far.get(key)
    }

    /// Removes the entry at `key` if it still holds the connection that started at
    /// `start_ns`; false when it is gone or holds a newer connection.
    pub fn remove(&mut self, key: u64, start_ns: u64) -> bool {
        let matches = |state: Option<ConnState>| state.is_some_and(|s| s.start_ns == start_ns);
        if let Some(near) = &mut self.near
            && matches(near.get(key).ok().flatten())
        {
            return near.map.remove(&key).is_ok();
        }
        if !self.far_used() || !matches(self.far.get(key).ok().flatten()) {
            return false;
        }
        let removed = self.far.map.remove(&key).is_ok();
        if removed && self.near.is_some() {
            // SAFETY: slot 0 of the mapping, an aligned u64 the programs change only with
            // atomic adds; this one is atomic too.
            let count = unsafe { AtomicU64::from_ptr(self.far_entries.slot_ptr(0)) };
            count.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }
}
