//! The pipeline's naming stage: both namers (Services from kube-proxy's rules, pods from
//! the runtime) and the one queue where connections and rejected flows wait, briefly, for
//! the rules their name depends on. Records leave it named, through the session's output.

use std::time::{Duration, Instant};

use super::output::{Emitted, Output};
use crate::model::record::{ConnRecord, DnsRecord, RejectRecord};
use crate::model::update::ConnId;
use crate::naming::pods::PodNamer;
use crate::naming::services::held_connections::{Hold, Waiting, rename, set_policy};
use crate::naming::services::locality::Locality;
use crate::naming::services::{FIRST_READ, Namer};

/// How long a finished connection may wait for a re-read of its namespace's rules
/// before it is named from the rules read before.
const NAME_WAIT: Duration = Duration::from_secs(2);

/// How long it may wait for the first read of its namespace's rules before it is
/// written without a name (`nft -j` of 5,000 Services took 6 s on a busy lab machine).
/// Bounds the memory held: connections closing meanwhile.
const FIRST_NAME_WAIT: Duration = Duration::from_secs(15);

/// A record waiting in the queue.
enum Pending {
    Conn(ConnId, ConnRecord),
    /// Named when written (its refusal is looked up then): it only waits.
    Reject(RejectRecord),
}

impl Waiting for Pending {
    fn netns(&self) -> u32 {
        match self {
            Pending::Conn(_, record) => record.netns,
            Pending::Reject(record) => record.netns,
        }
    }

    fn rename(&mut self, namer: &Namer, locality: &mut Locality) {
        if let Pending::Conn(_, record) = self {
            rename(namer, locality, record);
        }
    }
}

pub(super) struct Naming {
    namer: Option<Namer>,
    pods: Option<PodNamer>,
    netns_seen: rustc_hash::FxHashSet<u32>,
    /// Whether backends are on the deciding node, and clients the node itself.
    locality: Locality,
    held: Hold<Pending>,
    /// The same moment on both clocks, taken once: records' wall-clock times come from
    /// the monotonic clock through a fixed pair too, so one fixed pair turns them back.
    anchor: Anchor,
}

/// An instant and the wall-clock time at it.
struct Anchor {
    instant: Instant,
    wall: chrono::DateTime<chrono::Utc>,
}

impl Anchor {
    fn now() -> Anchor {
        Anchor {
            instant: Instant::now(),
            wall: chrono::Utc::now(),
        }
    }

    /// The instant a record's wall-clock time stands for (`None` out of `Instant`'s
    /// range). A clock read per record cost more than the rest of its naming.
    fn instant(&self, wall: chrono::DateTime<chrono::Utc>) -> Option<Instant> {
        let after = wall - self.wall;
        match after.to_std() {
            Ok(after) => self.instant.checked_add(after),
            Err(_) => (-after)
                .to_std()
                .ok()
                .and_then(|before| self.instant.checked_sub(before)),
        }
    }
}

impl Naming {
    pub fn new(namer: Option<Namer>, pods: Option<PodNamer>) -> Naming {
        Naming {
            namer,
            pods,
            netns_seen: Default::default(),
            locality: Default::default(),
            held: Hold::new(NAME_WAIT, FIRST_NAME_WAIT),
            anchor: Anchor::now(),
        }
    }

    /// Network namespaces seen so far.
    pub fn netns_seen(&self) -> usize {
        self.netns_seen.len()
    }

    pub fn blind_spots(&self) -> &[String] {
        self.namer.as_ref().map_or(&[], |namer| namer.blind_spots())
    }

    /// Nothing waits to be named.
    pub fn is_idle(&self) -> bool {
        self.held.is_empty()
    }

    /// A namespace's rules are read (and watched) from its first connection on, so that
    /// their changes are seen as they happen.
    pub fn prime(&mut self, netns: u32) {
        if self.netns_seen.insert(netns)
            && let Some(namer) = self.namer.as_mut()
        {
            namer.prime(netns, Instant::now());
        }
    }

    /// Names a connection from the rules known now; returns the generation of its
    /// namespace's rules its name waits for, if any.
    pub fn name(
        &mut self,
        record: &mut ConnRecord,
        output: &mut Output,
    ) -> anyhow::Result<Option<u64>> {
        self.netns_seen.insert(record.netns);
        let now = Instant::now();
        if let Some(pods) = self.pods.as_mut() {
            record.client_pod = pods.name(record.client.ip(), now);
            record.backend_pod = pods.name(record.backend.ip(), now);
            for warning in pods.take_warnings() {
                output.warn(warning);
            }
        }
        let Some(namer) = self.namer.as_mut() else {
            return Ok(None);
        };
        let started = self.anchor.instant(record.start).filter(|at| *at <= now);
        let lookup = namer.lookup(
            record.netns,
            record.proto,
            record.original_dst,
            record.backend,
            started,
            now,
        );
        lookup.naming.apply_to(record);
        set_policy(namer, &mut self.locality, record);
        record.same_node = self
            .locality
            .backend_on_node(record.netns, record.backend.ip());
        self.publish(output)?;
        Ok(lookup.wait_for)
    }

    /// Names a finished connection and writes it, or holds it while the rules its name
    /// depends on are being read.
    pub fn finished(
        &mut self,
        id: ConnId,
        mut record: ConnRecord,
        output: &mut Output,
    ) -> anyhow::Result<()> {
        let wait_for = self.name(&mut record, output)?;
        self.write_or_hold(Pending::Conn(id, record), wait_for, output)
    }

    /// Writes a rejected flow, or holds it while its namespace's rules are read for the
    /// first time (its Service and reason come from them).
    pub fn rejected(&mut self, record: RejectRecord, output: &mut Output) -> anyhow::Result<()> {
        self.prime(record.netns);
        let first_read = self
            .namer
            .as_ref()
            .is_some_and(|namer| namer.generation(record.netns) == 0);
        self.write_or_hold(
            Pending::Reject(record),
            first_read.then_some(FIRST_READ),
            output,
        )
    }

    fn write_or_hold(
        &mut self,
        pending: Pending,
        wait_for: Option<u64>,
        output: &mut Output,
    ) -> anyhow::Result<()> {
        if self.held.must_wait(wait_for) {
            self.held.hold(pending, wait_for, Instant::now());
            return Ok(());
        }
        self.write(pending, output)
    }

    /// Names a DNS client by pod.
    pub fn name_dns(&mut self, record: &mut DnsRecord) {
        if let Some(pods) = self.pods.as_mut() {
            record.client_pod = pods
                .name(record.client.ip(), Instant::now())
                .map(|pod| pod.to_string());
        }
    }

    /// Writes the held records whose rules were read meanwhile, or whose wait is over.
    pub fn release(&mut self, output: &mut Output) -> anyhow::Result<()> {
        let Some(namer) = self.namer.as_mut() else {
            return Ok(());
        };
        namer.poll();
        let ready = self.held.release(namer, &mut self.locality, Instant::now());
        self.publish(output)?;
        for pending in ready {
            self.write(pending, output)?;
        }
        Ok(())
    }

    /// At the end of a session: waits for the rules held records wait for (each at most
    /// its own deadline), then writes them all.
    pub fn release_at_end(&mut self, output: &mut Output) -> anyhow::Result<()> {
        // A re-read is a moment; a first read of a big rule set may take seconds: say so.
        if let Some(deadline) = self.held.next_deadline()
            && deadline.saturating_duration_since(Instant::now()) > NAME_WAIT
        {
            let seconds = deadline
                .saturating_duration_since(Instant::now())
                .as_secs_f64();
            output.warn(format!(
                "waiting up to {seconds:.0} s for kube-proxy's rules to name the last {} connection(s)",
                self.held.len()
            ));
        }
        while let Some(deadline) = self.held.next_deadline() {
            let Some(namer) = self.namer.as_mut() else {
                break;
            };
            if !namer.wait(deadline) {
                break;
            }
            self.release(output)?;
        }
        let Some(namer) = self.namer.as_ref() else {
            return Ok(());
        };
        for pending in self.held.release_all(namer, &mut self.locality) {
            self.write(pending, output)?;
        }
        Ok(())
    }

    fn write(&mut self, pending: Pending, output: &mut Output) -> anyhow::Result<()> {
        match pending {
            Pending::Conn(id, record) => Ok(output.emit(Emitted::Conn { id, record })?),
            Pending::Reject(record) => self.write_reject(record, output),
        }
    }

    /// A rejected flow's line, with its Service and the reason from the rules; none when
    /// no rules are read or they do not turn this flow away.
    fn write_reject(
        &mut self,
        mut record: RejectRecord,
        output: &mut Output,
    ) -> anyhow::Result<()> {
        let now = Instant::now();
        if let Some(pods) = self.pods.as_mut() {
            record.client_pod = pods.name(record.client.ip(), now);
        }
        let Some(namer) = self.namer.as_mut() else {
            return Ok(());
        };
        let refusal = namer.lookup_refusal(
            record.netns,
            record.proto,
            record.original_dst,
            record.client,
            now,
        );
        self.publish(output)?;
        let Some(refusal) = refusal else {
            return Ok(());
        };
        record.service = refusal.service;
        record.frontend = refusal.frontend;
        record.reason = Some(refusal.reason);
        Ok(output.emit(Emitted::Reject(record))?)
    }

    /// Service definitions and endpoint changes the namer learnt, with pod names, and its
    /// warnings.
    fn publish(&mut self, output: &mut Output) -> anyhow::Result<()> {
        let Some(namer) = self.namer.as_mut() else {
            return Ok(());
        };
        let changes = namer.take_endpoint_changes();
        for warning in namer.take_warnings() {
            output.warn(warning);
        }
        for mut service in namer.take_service_updates() {
            if let Some(pods) = self.pods.as_mut() {
                let now = Instant::now();
                for endpoint in &mut service.endpoints {
                    endpoint.pod = pods
                        .name(endpoint.addr.ip(), now)
                        .map(|pod| pod.to_string());
                }
            }
            output.emit(Emitted::Service(service))?;
        }
        for change in changes {
            output.emit(Emitted::Endpoints(change))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_time_turns_back_into_the_instant_it_stands_for_either_side_of_the_anchor() {
        let anchor = Anchor::now();
        let after = anchor.wall + chrono::Duration::milliseconds(3_250);
        let before = anchor.wall - chrono::Duration::milliseconds(2_000);
        assert_eq!(
            anchor.instant(after),
            Some(anchor.instant + Duration::from_millis(3_250))
        );
        assert_eq!(
            anchor.instant(before),
            anchor.instant.checked_sub(Duration::from_secs(2))
        );
        assert_eq!(anchor.instant(anchor.wall), Some(anchor.instant));
    }
}
