//! The session's state: what one capture session holds (the kernel's handle, the
//! tracker, each side, the naming stage and the output), how it is built from the
//! options, and what it counts (the live view's counters, the summary line).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use observer_common::conn::{ConnEvent, ConnState};
use tokio::sync::mpsc;

use super::output::Output;
use super::{ConntrackStart, dns, naming, pressure, reconcile, rejects};
use crate::kernel::capture::Capture;
use crate::model::record::{ConntrackEnds, ForwardingHook, SummaryRecord};
use crate::model::tracker::{Clock, Tracker};
use crate::model::update::{CaptureStats, Update};
use crate::naming::pods::PodNamer;
use crate::naming::services::Namer;
use crate::sinks::log::LogWriter;

pub struct SessionOptions {
    /// UDP (and unanswered TCP) connections end after this much silence.
    pub idle_timeout: Duration,
    /// How often the kernel's connection table is swept.
    pub sweep_interval: Duration,
    pub log: Option<LogWriter>,
    pub updates: Option<mpsc::Sender<Update>>,
    /// Names connections from the node's rules; `None` leaves `service` null.
    pub namer: Option<Namer>,
    /// Names client and backend addresses by pod; `None` leaves them null.
    pub pods: Option<PodNamer>,
    /// Where warnings go (e.g. rules that cannot be read): once each.
    pub warn: Box<dyn FnMut(String) + Send>,
    /// conntrack's own entries (found at start) and destroy events (while running).
    pub conntrack: Option<ConntrackStart>,
}

/// The kernel's monotonic clock (what `bpf_ktime_get_ns` reads), in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

pub(super) struct Session {
    pub(super) capture: Capture,
    pub(super) tracker: Tracker,
    /// The log, the live view and warnings: where every record leaves.
    pub(super) output: Output,
    /// Both namers and the queue where records wait for their rules to be read.
    pub(super) naming: naming::Naming,
    pub(super) follower: Option<reconcile::Follower>,
    pub(super) idle_timeout_ns: u64,
    /// Ring-buffer records (connection events, DNS messages) that could not be decoded
    /// (never seen: the sizes are asserted on both sides).
    pub(super) malformed: u64,
    /// Final records that could not be made (an unknown protocol): lost connections.
    pub(super) unrecordable: u64,
    /// Connections whose conntrack entry was never confirmed: no connection (see
    /// `NoRecord::NeverConfirmed`).
    pub(super) never_confirmed: u64,
    pub(super) events: u64,
    /// Drained ring-buffer records, reused from drain to drain: a fresh vector each
    /// time grew (copying) and faulted in new pages at every 50 ms drain.
    pub(super) drained: (Vec<ConnEvent>, Vec<observer_common::dns::DnsEvent>),
    pub(super) dns: dns::DnsSide,
    pub(super) rejects: rejects::RejectSide,
    /// conntrack's figures per namespace, for the summary line.
    pub(super) pressure: pressure::Pressure,
    /// When the revalidation program runs next.
    pub(super) revalidation: reconcile::Revalidation,
    /// What the sweeps' reads of the kernel's table found (see `table`).
    pub(super) table_reads: super::table::TableReads,
}

impl Session {
    pub(super) fn new(
        capture: Capture,
        options: SessionOptions,
        started: DateTime<Utc>,
    ) -> Session {
        let clock = Clock {
            monotonic_ns: monotonic_ns(),
            wall: started,
        };
        let mut tracker = Tracker::new(clock, options.idle_timeout);
        if capture.forwarding_hook() == crate::kernel::capture::ForwardingHook::NetDevQueue {
            tracker.losers_counted_by_winners();
        }
        Session {
            capture,
            tracker,
            output: Output::new(options.log, options.updates, options.warn),
            naming: naming::Naming::new(options.namer, options.pods),
            follower: None,
            idle_timeout_ns: options.idle_timeout.as_nanos() as u64,
            malformed: 0,
            unrecordable: 0,
            never_confirmed: 0,
            events: 0,
            drained: Default::default(),
            dns: dns::DnsSide::new(clock),
            rejects: rejects::RejectSide::new(crate::model::rejects::RejectTracker::new(
                clock,
                options.idle_timeout,
            )),
            pressure: Default::default(),
            revalidation: reconcile::Revalidation::new(Instant::now()),
            table_reads: Default::default(),
        }
    }

    /// The kernel's connection table: whole, or, while no connection entered it since
    /// the last whole read, the keys that read found (none when it was empty): see
    /// `table::TableReads`.
    pub(super) fn table(&mut self) -> Vec<(u64, ConnState)> {
        use super::table::Read;
        // Read before the table: an entry kept after it counts after it too.
        let tracked = self.capture.tracked();
        let by_key =
            match tracked.map(|at| self.table_reads.plan(at, self.capture.connection_buckets())) {
                Some(Read::Keys(keys)) => self.capture.connections_of(keys),
                Some(Read::Whole) | None => None,
            };
        let whole = by_key.is_none();
        let entries = by_key.unwrap_or_else(|| self.capture.connections());
        match tracked {
            Some(at) => self.table_reads.read(at, whole, &entries),
            None => self.table_reads = Default::default(),
        }
        entries
    }

    pub(super) fn stats(&self) -> CaptureStats {
        let counters = self.capture.counters();
        let lost_connections =
            counters.lost_table_full + counters.lost_unreported + self.unrecordable;
        CaptureStats {
            events: self.events,
            dnat_events: (counters.tracked + counters.lost_table_full)
                .saturating_sub(self.never_confirmed),
            lost_connections,
            lost_events: counters.events_dropped + self.malformed,
            read_errors: counters.read_errors,
            dns_malformed: self.dns.malformed,
            dns_lost: counters.dns_dropped,
            lost_rejects: counters.rejects_dropped + self.rejects.malformed,
            hooks_attached: self.capture.hooks_attached(),
            netns_seen: self.naming.netns_seen() as u32,
            blind_spots: self.naming.blind_spots().len() as u64,
            live_connections: self.tracker.open_count() as u64,
            recording: self.output.recording(),
        }
    }

    /// The summary line: what was written, seen and lost.
    pub(super) fn summary(
        &self,
        started: DateTime<Utc>,
        conntrack_ends: Option<ConntrackEnds>,
    ) -> SummaryRecord {
        let stats = self.stats();
        SummaryRecord {
            connections: self.output.connections(),
            dnat_events: stats.dnat_events,
            lost_connections: stats.lost_connections,
            lost_by_netns: by_netns(&self.capture.lost_by_netns()),
            lost_events: stats.lost_events,
            read_errors: stats.read_errors,
            dns_queries: self.output.dns_written(),
            dns_malformed: stats.dns_malformed,
            dns_malformed_by_netns: by_netns(&self.dns.malformed_by_netns),
            dns_lost: stats.dns_lost,
            dns_lost_by_netns: by_netns(&self.capture.dns_dropped_by_netns()),
            rejects: self.output.rejects_written(),
            lost_rejects: stats.lost_rejects,
            conntrack: self.pressure.summary(),
            conntrack_ends,
            never_confirmed: self.never_confirmed,
            forwarding_hook: Some(match self.capture.forwarding_hook() {
                crate::kernel::capture::ForwardingHook::NetDevQueue => ForwardingHook::NetDevQueue,
                crate::kernel::capture::ForwardingHook::Netfilter { .. } => {
                    ForwardingHook::Netfilter
                }
            }),
            blind_spots: self.naming.blind_spots().to_vec(),
            started,
            ended: Utc::now(),
        }
    }
}

/// Counts per network namespace inode, keyed by the inode as a string (the summary
/// line's keys).
fn by_netns(
    counts: &std::collections::BTreeMap<u32, u64>,
) -> std::collections::BTreeMap<String, u64> {
    counts
        .iter()
        .map(|(netns, count)| (netns.to_string(), *count))
        .collect()
}
