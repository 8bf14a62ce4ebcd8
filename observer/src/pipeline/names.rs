//! Naming a finished connection: its Service from the rules of the namespace that made
//! the decision, its client and backend pods from the runtime state; and passing on
//! the namer's new Service definitions and endpoint changes.

use std::time::Instant;

use super::Session;
use super::output::Emitted;
use crate::model::record::ConnRecord;
pub(super) use crate::naming::services::held_connections::set_policy;

impl Session {
    /// Fills in `service` and `endpoint_in_rules` from the rules of the namespace that
    /// made the decision, as known now; writes new or changed Service definitions first.
    /// Returns the generation of the rules the name waits for, if a re-read is under way.
    pub(super) fn name(&mut self, record: &mut ConnRecord) -> anyhow::Result<Option<u64>> {
        self.netns_seen.insert(record.netns);
        // One clock read serves both namers.
        let now = Instant::now();
        self.name_pods(record, now);
        let Some(namer) = self.namer.as_mut() else {
            return Ok(None);
        };
        // A lookup is a map access: rules are read on the namer's worker thread, so the
        // ring buffer keeps being drained while `iptables-save`/`nft` run.
        // When the kernel decided the connection, on the namer's clock.
        let started = (chrono::Utc::now() - record.start)
            .to_std()
            .ok()
            .and_then(|ago| now.checked_sub(ago));
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
        self.publish_naming()?;
        Ok(lookup.wait_for)
    }

    /// Fills in `client_pod` and `backend_pod`: map look-ups; an unknown address asks the
    /// pod namer's own thread to re-read the runtime state.
    fn name_pods(&mut self, record: &mut ConnRecord, now: Instant) {
        let Some(pods) = self.pods.as_mut() else {
            return;
        };
        record.client_pod = pods.name(record.client.ip(), now);
        record.backend_pod = pods.name(record.backend.ip(), now);
        for warning in pods.take_warnings() {
            self.output.warn(warning);
        }
    }

    /// Passes on the namer's warnings and writes its new or changed Services.
    pub(super) fn publish_naming(&mut self) -> anyhow::Result<()> {
        let Some(namer) = self.namer.as_mut() else {
            return Ok(());
        };
        let changes = namer.take_endpoint_changes();
        for warning in namer.take_warnings() {
            self.output.warn(warning);
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
            self.output.emit(Emitted::Service(service))?;
        }
        for change in changes {
            self.output.emit(Emitted::Endpoints(change))?;
        }
        Ok(())
    }
}
