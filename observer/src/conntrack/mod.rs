//! conntrack's own view of the node, read through ctnetlink (`NETLINK_NETFILTER`): a dump
//! of the entries that exist, and the entries conntrack creates and destroys.
//!
//! `parse` is pure (netlink messages in, [`CtMessage`] out, and the requests observer
//! sends); `socket` opens ctnetlink sockets inside a network namespace; `listener` runs
//! one thread that follows events in many namespaces.

pub mod filter;
pub mod listener;
pub mod parse;
pub mod socket;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;

use crate::model::record::CtStats;

/// What observer says, once, when the kernel has no conntrack netlink interface.
pub const NETLINK_MISSING: &str = "conntrack's netlink interface is missing (module nf_conntrack_netlink is not loaded): observer cannot adopt connections that began before it, nor see conntrack remove entries (timeouts, flushes, deletes), nor read conntrack's table fill and drops; load it with `modprobe nf_conntrack_netlink`";

/// Whether `err`, from opening a ctnetlink socket or dumping conntrack through it, means
/// that the kernel has no conntrack netlink interface: no `NETLINK_NETFILTER` protocol
/// at all (`EPROTONOSUPPORT`: nfnetlink is not loaded), or nfnetlink without its
/// conntrack subsystem (`EINVAL`: nfnetlink answers so for a subsystem that is not
/// registered once it failed to load `nf_conntrack_netlink` itself, as where no
/// modprobe can run).
pub fn netlink_missing(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EPROTONOSUPPORT | libc::EINVAL)
    )
}

/// `IPS_DST_NAT`: the entry's destination was rewritten (a kube-proxy DNAT decision).
pub const IPS_DST_NAT: u32 = 1 << 5;

/// conntrack's TCP states (`enum tcp_conntrack`).
pub mod tcp_state {
    pub const ESTABLISHED: u8 = 3;
    pub const FIN_WAIT: u8 = 4;
    pub const CLOSE_WAIT: u8 = 5;
    pub const LAST_ACK: u8 = 6;
    pub const TIME_WAIT: u8 = 7;
    pub const CLOSE: u8 = 8;
}

/// One direction of an entry: protocol number and both ends (ports 0 for protocols
/// without ports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtTuple {
    pub protocol: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// A conntrack entry as ctnetlink describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtEntry {
    pub original: CtTuple,
    pub reply: CtTuple,
    /// `IPS_*` bits.
    pub status: u32,
    /// conntrack's id for the entry (`CTA_ID`), when sent.
    pub id: Option<u32>,
    /// When conntrack created the entry, in nanoseconds since the Unix epoch; only with
    /// `nf_conntrack_timestamp=1` (and only in dumps and destroy events).
    pub start_ns: Option<u64>,
    /// TCP state, when sent (dumps and single-entry replies).
    pub tcp_state: Option<u8>,
}

impl CtEntry {
    /// Whether NAT rewrote the destination: a Service DNAT decision.
    pub fn dnat(&self) -> bool {
        self.status & IPS_DST_NAT != 0
    }
}

/// What a ctnetlink message says about an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtKind {
    /// Created (an event of group `NFNLGRP_CONNTRACK_NEW`).
    New,
    /// Destroyed (flush, delete, timeout).
    Destroy,
    /// As it is now (a dump or a single-entry reply, or an update event).
    Entry,
}

/// One CPU's share of conntrack's statistics in a namespace (`IPCTNL_MSG_CT_GET_STATS_CPU`;
/// `conntrack -S` prints one line per CPU): the counters observer reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtCpuStats {
    pub insert_failed: u32,
    pub drop: u32,
    pub early_drop: u32,
}

/// The table's figures with every CPU's counters added up.
pub fn table_stats(entries: u32, max_entries: u32, cpus: &[CtCpuStats]) -> CtStats {
    let sum = |counter: fn(&CtCpuStats) -> u32| cpus.iter().map(|c| u64::from(counter(c))).sum();
    CtStats {
        entries,
        max_entries,
        insert_failed: sum(|c| c.insert_failed),
        drop: sum(|c| c.drop),
        early_drop: sum(|c| c.early_drop),
    }
}

/// One parsed ctnetlink message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CtMessage {
    Conntrack(CtKind, CtEntry),
    /// The table's size (the answer to `parse::table_request`).
    Table {
        entries: u32,
        max_entries: u32,
    },
    /// One CPU's statistics (a message of the dump `parse::cpu_stats_request` asks for).
    CpuStats(CtCpuStats),
    /// The end of a dump.
    Done,
    /// An acknowledgement (0) or an error (a negative errno) for a request.
    Error(i32),
    /// Anything else (other subsystems, no-ops).
    Other,
}
