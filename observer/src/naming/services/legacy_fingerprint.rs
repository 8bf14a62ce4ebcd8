//! A cheap fingerprint of a namespace's legacy iptables tables, which announce nothing
//! when they change: the kernel's own binary copy of the `nat` and `filter` tables
//! (`IPT_SO_GET_ENTRIES`, what `iptables-legacy-save` reads before formatting it),
//! hashed with the packet and byte counters left out (they change with traffic, the
//! rules do not). Comparing it every second costs a few milliseconds on a node with
//! thousands of Services, where `iptables-legacy-save` and parsing cost seconds.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};

use crate::netns::Kind;

use super::{WatchError, WatchFailure};

/// `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO` (`IPT_BASE_CTL`), and `..._GET_ENTRIES` after it.
const GET_INFO: libc::c_int = 64;
const GET_ENTRIES: libc::c_int = 65;
/// `struct ipt_getinfo`: name[32], valid_hooks, hook_entry[5], underflow[5],
/// num_entries, size.
const INFO_LEN: usize = 84;
const INFO_SIZE_AT: usize = 80;
/// `struct ipt_get_entries`: name[32], size, then the entries (8-byte aligned).
const ENTRIES_AT: usize = 40;
/// The tables kube-proxy writes. Only those that exist are read: asking for one that
/// does not would make the kernel create it (and hook it into every packet's path).
const TABLES: [&str; 2] = ["nat", "filter"];

/// Where `struct ipt_entry` / `struct ip6t_entry` keep `next_offset` and `counters`.
struct Layout {
    level: libc::c_int,
    next_offset_at: usize,
    counters_at: usize,
}

const IPV4: Layout = Layout {
    level: libc::SOL_IP,
    next_offset_at: 90,
    counters_at: 96,
};
const IPV6: Layout = Layout {
    level: libc::SOL_IPV6,
    next_offset_at: 142,
    counters_at: 152,
};

/// Raw sockets (IPv4, IPv6) inside the namespace `path` opens, to read its tables,
/// and which of [`TABLES`] exist there.
pub struct Sockets {
    v4: (OwnedFd, Vec<&'static str>),
    v6: Option<(OwnedFd, Vec<&'static str>)>,
}

/// The tables of [`TABLES`] a `/proc/net/*_tables_names` file lists.
fn existing(names: &str) -> Vec<&'static str> {
    let names = std::fs::read_to_string(names).unwrap_or_default();
    TABLES
        .into_iter()
        .filter(|table| names.lines().any(|line| line.trim() == *table))
        .collect()
}

/// Opens the sockets inside the namespace (on a short-lived thread).
pub fn open(path: &Path) -> Result<Sockets, WatchError> {
    let opened = crate::netns::run_in_file(path, Kind::Network, || {
        let raw = |family| {
            socket(
                family,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::Raw,
            )
        };
        let v4 = raw(AddressFamily::Inet).map_err(WatchFailure::RawSocket)?;
        // This thread's view of /proc/net is the namespace's.
        Ok(Sockets {
            v4: (v4, existing("/proc/thread-self/net/ip_tables_names")),
            v6: raw(AddressFamily::Inet6)
                .ok()
                .map(|v6| (v6, existing("/proc/thread-self/net/ip6_tables_names"))),
        })
    });
    super::watch::cannot_watch(path, opened)
}

impl Sockets {
    /// A hash of the legacy tables' rules; `None` when one could not be read
    /// consistently (it changed while read).
    pub fn fingerprint(&self) -> Option<u64> {
        let mut hasher = DefaultHasher::new();
        let families = [(Some(&self.v4), IPV4), (self.v6.as_ref(), IPV6)];
        for (family, layout) in families {
            let Some((fd, tables)) = family else { continue };
            for table in tables {
                table_rules(fd, &layout, table)?.hash(&mut hasher);
            }
        }
        Some(hasher.finish())
    }
}

/// getsockopt into `buffer`; returns whether it succeeded.
fn get(fd: &OwnedFd, level: libc::c_int, option: libc::c_int, buffer: &mut [u8]) -> bool {
    let mut len = buffer.len() as libc::socklen_t;
    // SAFETY: `buffer` is valid for writes of `len` bytes and `len` is a live local the
    // kernel updates; `fd` is an open socket.
    let done = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            option,
            buffer.as_mut_ptr().cast(),
            &mut len,
        )
    };
    done == 0
}

fn named(table: &str, len: usize) -> Vec<u8> {
    let mut buffer = vec![0u8; len];
    buffer[..table.len()].copy_from_slice(table.as_bytes());
    buffer
}

/// One table's entries with their counters zeroed.
fn table_rules(fd: &OwnedFd, layout: &Layout, table: &str) -> Option<Vec<u8>> {
    let mut info = named(table, INFO_LEN);
    if !get(fd, layout.level, GET_INFO, &mut info) {
        return None;
    }
    let size = u32::from_ne_bytes(info[INFO_SIZE_AT..INFO_SIZE_AT + 4].try_into().ok()?) as usize;
    let mut entries = named(table, ENTRIES_AT + size);
    entries[32..36].copy_from_slice(&(size as u32).to_ne_bytes());
    // Fails (EAGAIN) when the table changed size since GET_INFO.
    if !get(fd, layout.level, GET_ENTRIES, &mut entries) {
        return None;
    }
    let mut rules = entries.split_off(ENTRIES_AT);
    let mut at = 0;
    while at + layout.counters_at + 16 <= rules.len() {
        let next = &rules[at + layout.next_offset_at..at + layout.next_offset_at + 2];
        let next = usize::from(u16::from_ne_bytes([next[0], next[1]]));
        rules[at + layout.counters_at..at + layout.counters_at + 16].fill(0);
        if next == 0 {
            break;
        }
        at += next;
    }
    Some(rules)
}
