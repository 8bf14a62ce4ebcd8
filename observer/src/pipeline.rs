//! One capture session: reads kernel events and sweeps the connection table until told
//! to stop, writing the connection log and/or feeding the live view.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use chrono::Utc;
use observer_common::conn::ConnEvent;
use tokio::sync::mpsc;

use crate::kernel::capture::Capture;
use crate::model::record::{ConnRecord, SummaryRecord};
use crate::model::tracker::{Clock, Tracker};
use crate::model::update::{CaptureStats, ConnId, Update};
use crate::naming::Namer;
use crate::naming::pod_source::PodNamer;
use crate::sinks::log::LogWriter;

/// How often the ring buffer is drained without a wake-up: the live view's latency.
const DRAIN_INTERVAL: Duration = Duration::from_millis(50);

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
}

/// The kernel's monotonic clock (what `bpf_ktime_get_ns` reads), in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

struct Session {
    capture: Capture,
    tracker: Tracker,
    log: Option<LogWriter>,
    updates: Option<mpsc::Sender<Update>>,
    namer: Option<Namer>,
    pods: Option<PodNamer>,
    warn: Box<dyn FnMut(String) + Send>,
    netns_seen: std::collections::HashSet<u32>,
    /// Final records and Service definitions the live view has not taken yet: they are
    /// never dropped (progress updates are, the next sweep repeats them).
    pending: std::collections::VecDeque<Update>,
    malformed: u64,
    events: u64,
}

/// Runs until `stop` completes, then detaches, drains, writes connections still open
/// and the summary line. Returns the summary.
pub async fn run(
    capture: Capture,
    options: SessionOptions,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<SummaryRecord> {
    let started = Utc::now();
    let clock = Clock {
        monotonic_ns: monotonic_ns(),
        wall: started,
    };
    let mut session = Session {
        capture,
        tracker: Tracker::new(clock, options.idle_timeout),
        log: options.log,
        updates: options.updates,
        namer: options.namer,
        pods: options.pods,
        warn: options.warn,
        netns_seen: Default::default(),
        pending: Default::default(),
        malformed: 0,
        events: 0,
    };
    // The kernel wakes user space only when a lot is waiting (see observer-ebpf's
    // `conn::submit_flags`): drain on a short timer as well.
    let mut drain = tokio::time::interval(DRAIN_INTERVAL);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(options.sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            ready = session.capture.wait_for_events() => {
                ready.context("cannot poll the kernel's ring buffer")?;
                session.drain()?;
            }
            _ = drain.tick() => session.drain()?,
            _ = sweep.tick() => session.sweep()?,
        }
    }
    session.capture.detach();
    session.drain()?;
    let now = monotonic_ns();
    for (id, record) in session
        .tracker
        .finish(&session.capture.connections(), now)
        .into_iter()
        .flatten()
    {
        session.finished(id, record)?;
    }
    let counters = session.capture.counters();
    let summary = SummaryRecord {
        connections: session.log.as_ref().map_or(0, LogWriter::connections),
        dnat_events: session.tracker.dnat_events(),
        lost_events: counters.lost() + session.malformed,
        read_errors: counters.read_errors,
        started,
        ended: Utc::now(),
    };
    if let Some(log) = session.log.as_mut() {
        log.summary(&summary)
            .with_context(|| format!("cannot write the connection log to {}", log.name))?;
    }
    Ok(summary)
}

impl Session {
    fn drain(&mut self) -> anyhow::Result<()> {
        let mut events: Vec<ConnEvent> = Vec::new();
        self.malformed += self.capture.drain_events(&mut events);
        self.events += events.len() as u64;
        for event in &events {
            match self.tracker.on_event(event) {
                Ok((id, record)) if record.end.is_some() => self.finished(id, record)?,
                Ok((id, record)) => self.progress(id, record),
                Err(_) => self.malformed += 1,
            }
        }
        Ok(())
    }

    fn sweep(&mut self) -> anyhow::Result<()> {
        let entries = self.capture.connections();
        let sweep = self.tracker.sweep(&entries, monotonic_ns());
        for (id, record) in sweep.progress {
            self.progress(id, record);
        }
        for (conntrack, state) in sweep.idle {
            // When the kernel removed it first, its close event is on the way.
            if self.capture.remove(conntrack, &state)
                && let Ok((id, record)) = self.tracker.expired(conntrack, &state)
            {
                self.finished(id, record)?;
            }
        }
        if let Some(log) = self.log.as_mut() {
            log.flush()
                .with_context(|| format!("cannot write the connection log to {}", log.name))?;
        }
        let stats = self.stats();
        self.send(Update::Stats(stats));
        Ok(())
    }

    fn stats(&self) -> CaptureStats {
        let counters = self.capture.counters();
        CaptureStats {
            events: self.events,
            dnat_events: self.tracker.dnat_events(),
            lost_events: counters.lost() + self.malformed,
            read_errors: counters.read_errors,
            hooks_attached: self.capture.hooks_attached(),
            netns_seen: self.netns_seen.len() as u32,
            live_connections: self.tracker.open_count() as u64,
            recording: self.log.as_ref().map(|log| log.name.clone()),
        }
    }

    fn progress(&mut self, id: ConnId, mut record: ConnRecord) {
        // Only the live view shows connections before they end.
        if self.updates.is_none() {
            self.netns_seen.insert(record.netns);
            return;
        }
        if let Err(err) = self.name(&mut record) {
            (self.warn)(format!("{err:#}"));
        }
        // A full channel means the view is behind: it gets this connection's counters
        // from the next sweep.
        self.flush_pending();
        if self.pending.is_empty()
            && let Some(updates) = &self.updates
        {
            let _ = updates.try_send(Update::Conn { id, record });
        }
    }

    fn finished(&mut self, id: ConnId, mut record: ConnRecord) -> anyhow::Result<()> {
        self.name(&mut record)?;
        if let Some(log) = self.log.as_mut() {
            log.conn(&record)
                .with_context(|| format!("cannot write the connection log to {}", log.name))?;
        }
        self.send(Update::Conn { id, record });
        Ok(())
    }

    /// Fills in `service` and `endpoint_in_rules` from the rules of the namespace that
    /// made the decision; writes new or changed Service definitions first.
    fn name(&mut self, record: &mut ConnRecord) -> anyhow::Result<()> {
        self.netns_seen.insert(record.netns);
        if let Some(pods) = self.pods.as_mut() {
            // Map look-ups; an unknown address asks the background thread to re-read.
            let now = Instant::now();
            record.client_pod = pods.name(record.client.ip(), now);
            record.backend_pod = pods.name(record.backend.ip(), now);
            for warning in pods.take_warnings() {
                (self.warn)(warning);
            }
        }
        let Some(namer) = self.namer.as_mut() else {
            return Ok(());
        };
        // A lookup is a map access; at most every 2 s per namespace it re-reads the rules
        // (a few milliseconds of iptables-save/nft), during which the ring buffer holds
        // the kernel's events.
        let naming = namer.name(
            record.netns,
            record.proto,
            record.original_dst,
            record.backend,
            Instant::now(),
        );
        record.service = naming.service;
        record.endpoint_in_rules = naming.endpoint_in_rules;
        record.frontend = naming.frontend;
        for warning in namer.take_warnings() {
            (self.warn)(warning);
        }
        for service in namer.take_service_updates() {
            if let Some(log) = self.log.as_mut() {
                log.service(&service)
                    .with_context(|| format!("cannot write the connection log to {}", log.name))?;
            }
            self.send(Update::Service(service));
        }
        Ok(())
    }

    /// Sends an update the live view must not miss, in order, queueing it while the
    /// channel is full.
    fn send(&mut self, update: Update) {
        if self.updates.is_some() {
            self.pending.push_back(update);
            self.flush_pending();
        }
    }

    fn flush_pending(&mut self) {
        let Some(updates) = &self.updates else {
            return;
        };
        while let Some(update) = self.pending.pop_front() {
            match updates.try_send(update) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(update)) => {
                    self.pending.push_front(update);
                    return;
                }
                // The view has quit; the session is about to be stopped.
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.pending.clear();
                    return;
                }
            }
        }
    }
}
