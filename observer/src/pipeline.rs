//! One capture session: reads kernel events and sweeps the connection table until told
//! to stop, writing the connection log and/or feeding the live view.

use std::{future::Future, time::Duration};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use observer_common::conn::{ConnEvent, ConnState, EVENT_CLOSE, EVENT_OPEN};

mod dns;
mod naming;
mod output;
mod pressure;
pub mod reconcile;
mod rejects;
pub mod serve;
mod session;
mod table;

pub use reconcile::{ConntrackStart, follow_conntrack};
use session::Session;
pub use session::{SessionOptions, monotonic_ns};

use crate::conntrack::listener::Note;
use crate::kernel::capture::Capture;
use crate::model::record::{Close, ConnRecord, ConntrackEnds, SummaryRecord};
use crate::model::tracker::NoRecord;
use crate::model::update::{ConnId, Update};
use crate::naming::services::FIRST_READ;

/// How often the ring buffers are drained without a wake-up: the live view's latency.
const DRAIN_INTERVAL: Duration = Duration::from_millis(50);

/// The same with no live view (`record`): as often as the revalidation runs at its
/// fastest, so that one wake-up does both (records carry the kernel's timestamps, so a
/// later drain changes no record; the kernel wakes user space when much is waiting).
const RECORD_DRAIN_INTERVAL: Duration = reconcile::Revalidation::FASTEST;

/// The same while nothing happens (no event at the last drain, nothing open, nothing
/// waiting): an idle observer wakes twice a second instead of 20 times, and the first event
/// after a quiet spell is read within this.
const QUIET_DRAIN_INTERVAL: Duration = Duration::from_millis(500);

/// DNS messages decoded at most per drain: a whole default DNS ring buffer (2 MiB of
/// 344-byte records). Connection events are drained first and whole each time, so a DNS
/// flood that arrives as fast as user space decodes it delays them by one batch at most.
const DNS_DRAIN_MAX: usize = 6096;

/// Runs until `stop` completes, then detaches, drains, writes connections still open
/// and the summary line. Returns the summary.
pub async fn run(
    capture: Capture,
    mut options: SessionOptions,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<SummaryRecord> {
    let started = Utc::now();
    let conntrack = options.conntrack.take();
    let sweep_interval = options.sweep_interval;
    let mut session = Session::new(capture, options, started);
    let drain_interval = if session.output.has_view() {
        DRAIN_INTERVAL
    } else {
        RECORD_DRAIN_INTERVAL
    };
    // The kernel wakes user space only when a lot is waiting (see observer-ebpf's
    // `conn::submit_flags`): drain on a short timer as well.
    let mut drain_at = tokio::time::Instant::now() + drain_interval;
    let mut sweep = tokio::time::interval(sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if let Some(conntrack) = conntrack {
        session.start_following(conntrack);
    }
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            note = next_note(&mut session.follower) => session.on_conntrack(note)?,
            ready = session.capture.wait_for_events() => {
                ready.context("cannot poll the kernel's ring buffer")?;
                session.drain(DNS_DRAIN_MAX)?;
            }
            () = tokio::time::sleep_until(drain_at) => {
                let before = session.events;
                session.drain(DNS_DRAIN_MAX)?;
                session.revalidate_if_due()?;
                let quiet = session.events == before && session.quiet();
                drain_at = tokio::time::Instant::now()
                    + if quiet { QUIET_DRAIN_INTERVAL } else { drain_interval };
            }
            _ = sweep.tick() => session.sweep()?,
        }
    }
    session.finish(started)
}

impl Session {
    /// Detaches, writes every connection still open and the summary line.
    fn finish(mut self, started: DateTime<Utc>) -> anyhow::Result<SummaryRecord> {
        // Entries gone since the last sweep end as expired, not as open at the end.
        if self
            .follower
            .as_ref()
            .is_some_and(|f| f.ends == ConntrackEnds::Revalidated)
        {
            self.drain(usize::MAX)?;
            let entries = self.capture.connections();
            self.end_never_confirmed(entries)?;
            self.end_revalidated()?;
        }
        self.capture.detach();
        // Nothing is added any more: every DNS message left is read.
        self.drain(usize::MAX)?;
        let now = monotonic_ns();
        for result in self.tracker.finish(&self.capture.connections(), now) {
            match result {
                Ok((id, record)) => self.finished(id, record)?,
                Err(NoRecord::NeverConfirmed) => self.never_confirmed += 1,
                Err(_) => self.unrecordable += 1,
            }
        }
        let found = self.follower.as_mut().map(|f| f.matcher.finish(Utc::now()));
        for (id, record) in found.into_iter().flatten() {
            self.finished(id, record)?;
        }
        let dns = self.dns.finish();
        self.write_dns(dns)?;
        for record in self.rejects.finish(&self.capture) {
            self.naming.rejected(record, &mut self.output)?;
        }
        self.naming.release_at_end(&mut self.output)?;
        let conntrack_ends = self.follower.as_ref().map(|f| f.ends);
        self.stop_following();
        let summary = self.summary(started, conntrack_ends);
        self.output.summary(&summary)?;
        Ok(summary)
    }
}

impl Session {
    /// Reads the connection events, at most `dns_max` DNS messages and the rejected
    /// flows' reports the kernel wrote since the last drain.
    fn drain(&mut self, dns_max: usize) -> anyhow::Result<()> {
        let (mut events, mut dns) = std::mem::take(&mut self.drained);
        events.clear();
        dns.clear();
        self.malformed += self.capture.drain_events(&mut events);
        self.malformed += self.capture.drain_dns(&mut dns, dns_max);
        self.events += (events.len() + dns.len()) as u64;
        let result = self.on_events(&events, &dns);
        self.drained = (events, dns);
        result?;
        let (rejected, seen) = self.rejects.drain(&mut self.capture);
        seen.into_iter().for_each(|netns| self.naming.prime(netns));
        for record in rejected {
            self.naming.rejected(record, &mut self.output)?;
        }
        self.end_superseded()?;
        self.release_held()
    }

    fn on_events(
        &mut self,
        events: &[ConnEvent],
        dns: &[observer_common::dns::DnsEvent],
    ) -> anyhow::Result<()> {
        let answered = self.dns.on_events(dns);
        self.write_dns(answered)?;
        for event in events {
            if let Some(follower) = self.follower.as_mut() {
                follower.matcher.on_kernel_event(event);
                follower.watch(event.state.netns);
            }
            // Only the live view shows connections before they end: without it, an open
            // event makes no record. One whose entry is not confirmed yet is shown from
            // the sweep that finds it confirmed.
            if event.kind == EVENT_OPEN && (!self.output.has_view() || event.state.unconfirmed != 0)
            {
                self.tracker.opened(event);
                self.naming.prime(event.state.netns);
                continue;
            }
            match self.tracker.on_event(event) {
                Ok((id, record)) if record.end.is_some() => self.finished(id, record)?,
                Ok((id, record)) => self.progress(id, record),
                Err(NoRecord::NeverConfirmed) => self.never_confirmed += 1,
                Err(_) if event.kind == EVENT_CLOSE => self.unrecordable += 1,
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Nothing open, followed or waiting: the drain timer may slow down.
    fn quiet(&self) -> bool {
        self.tracker.open_count() == 0
            && self
                .follower
                .as_ref()
                .is_none_or(|f| !f.matcher.follows_kernel_connections())
            && self.naming.is_idle()
            && self.rejects.is_quiet()
    }

    fn sweep(&mut self) -> anyhow::Result<()> {
        // The netfilter hook: node namespaces that appeared since (or went).
        for warning in self.capture.link_new_namespaces() {
            self.output.warn(warning);
        }
        // Their rules are read and watched from the start, not from a first connection
        // that only a sweep may report (`Capture::learn_opens_from_table`): a Service's
        // change right after it is seen as it happens.
        for netns in self.capture.node_namespaces() {
            self.naming.prime(netns);
        }
        // Every event first: the sweep asks conntrack about entries found at start, and
        // one the kernel programs adopted and saw close since must be matched to that
        // adoption (whose open event may still wait in the ring buffer while the drain
        // timer is slow), not ended on its own as a second record.
        self.drain(DNS_DRAIN_MAX)?;
        let entries = self.table();
        let entries = self.end_never_confirmed(entries)?;
        let now = monotonic_ns();
        let expired = self.dns.expire(now);
        self.write_dns(expired)?;
        let sweep = self.tracker.sweep(&entries, now, self.output.has_view());
        let checked = self.follower.as_mut().map(|follower| {
            follower.matcher.on_sweep(&entries);
            let gone = follower.rescan();
            follower.check_flowtables(&entries, std::time::Instant::now());
            (follower.check(Utc::now()), follower.take_warnings(), gone)
        });
        let (checked, warnings, gone) = checked.unwrap_or_default();
        for warning in warnings {
            self.output.warn(warning);
        }
        self.conntrack_gone(gone);
        for (id, record) in checked {
            self.finished(id, record)?;
        }
        self.end_unreported(&entries)?;
        self.end_superseded()?;
        for (id, record) in sweep.progress {
            self.progress(id, record);
        }
        for (conntrack, state, close) in self.confirmed_now(sweep.ended) {
            self.end(conntrack, &state, close)?;
        }
        self.release_held()?;
        for record in self.rejects.sweep(&mut self.capture, now) {
            self.naming.rejected(record, &mut self.output)?;
        }
        self.output.flush()?;
        let stats = self.stats();
        self.output.show(Update::Stats(stats));
        Ok(())
    }

    /// `ended` with the states of those still `unconfirmed` read again after the
    /// revalidation program looked at them: a flow of one datagram gets no later packet
    /// to see its entry confirmed, and the revalidation may not have reached it yet (it
    /// runs less often over a large table). Those never confirmed come first: a clash's
    /// loser before its winner, so that what it carried joins the winner's record
    /// (`model::clash`) when both idle out in one sweep.
    fn confirmed_now(
        &mut self,
        mut ended: Vec<(u64, ConnState, Close)>,
    ) -> Vec<(u64, ConnState, Close)> {
        let unconfirmed: Vec<u64> = ended
            .iter()
            .filter(|(_, state, _)| state.unconfirmed != 0)
            .map(|(conntrack, ..)| *conntrack)
            .collect();
        if !unconfirmed.is_empty() && self.capture.gone_connections(&unconfirmed).is_ok() {
            for (conntrack, state, _) in &mut ended {
                if state.unconfirmed != 0
                    && let Some(now) = self.capture.connection(*conntrack)
                    && now.start_ns == state.start_ns
                {
                    state.unconfirmed = now.unconfirmed;
                }
            }
        }
        ended.sort_by_key(|(_, state, _)| state.unconfirmed == 0);
        ended
    }

    /// Ends a tracked connection from user space: removes it from the kernel tables and
    /// writes its final record with `close`. When the kernel removed it first, its
    /// close event is on the way and nothing is written here (exactly once).
    pub fn end(&mut self, conntrack: u64, state: &ConnState, close: Close) -> anyhow::Result<()> {
        if !self.capture.remove(conntrack, state) {
            return Ok(());
        }
        match self.tracker.end(conntrack, state, close) {
            Ok((id, record)) => self.finished(id, record),
            Err(NoRecord::NeverConfirmed) => {
                self.never_confirmed += 1;
                Ok(())
            }
            Err(_) => {
                self.unrecordable += 1;
                Ok(())
            }
        }
    }

    fn progress(&mut self, mut id: ConnId, mut record: ConnRecord) {
        self.naming.prime(record.netns);
        // Only the live view shows connections before they end.
        if !self.output.has_view() {
            return;
        }
        if let Some(follower) = self.follower.as_mut() {
            follower.matcher.rewrite(&mut id, &mut record);
        }
        match self.naming.name(&mut record, &mut self.output) {
            // Its namespace's rules are being read for the first time: rather than a row
            // without a name, the view gets it named from a later sweep.
            Ok(Some(FIRST_READ)) => return,
            Ok(_) => {}
            Err(err) => self.output.warn(format!("{err:#}")),
        }
        self.output.progress(id, record);
    }

    /// Names a finished connection and writes it (or holds it while its rules are read).
    fn finished(&mut self, mut id: ConnId, mut record: ConnRecord) -> anyhow::Result<()> {
        if let Some(follower) = self.follower.as_mut() {
            follower.matcher.rewrite(&mut id, &mut record);
        }
        self.naming.finished(id, record, &mut self.output)
    }

    fn write_dns(&mut self, records: Vec<crate::model::record::DnsRecord>) -> anyhow::Result<()> {
        for mut record in records {
            self.naming.name_dns(&mut record);
            self.output.emit(output::Emitted::Dns(record))?;
        }
        Ok(())
    }

    fn release_held(&mut self) -> anyhow::Result<()> {
        self.naming.release(&mut self.output)
    }
}

/// The next note of the conntrack follower; pending forever without one.
async fn next_note(follower: &mut Option<reconcile::Follower>) -> Note {
    match follower {
        Some(follower) => follower.next().await,
        None => std::future::pending().await,
    }
}
