//! Whether a skew comes from a rollout window, live: the skewed backend's open and
//! recently closed connections (the latest `RECENT_CLOSED`) that opened while another
//! endpoint was out of the rules, judged as `summary` judges a whole recording
//! ([`story::rollout`](crate::stats::story::rollout)).

use super::Aggregator;
use crate::model::record::EndpointsRecord;
use crate::stats::ServiceStats;
use crate::stats::story::{Opened, Rollout, rollout};

impl Aggregator {
    /// Takes in one `endpoints` line (an endpoint left or joined a Service's rules).
    pub fn add_endpoints(&mut self, change: &EndpointsRecord) {
        self.timeline.change(change);
    }

    /// The rollout window behind `service`'s skew, when its connections opened in one.
    pub fn rollout(&self, service: &ServiceStats) -> Option<Rollout> {
        service.skew_detail()?;
        let timeline = self.timeline.service(&service.service, service.proto);
        // No endpoint ever left or joined: no window, and no connections to walk (a scrape
        // asks this of every Service).
        if timeline.departures.is_empty() && timeline.arrivals.is_empty() {
            return None;
        }
        let index = *self.index.get(&(service.service.clone(), service.proto))?;
        let opened: Vec<Opened> = self
            .open
            .values()
            .chain(self.closed.values().map(|(_, c)| c))
            .filter(|c| c.service == index)
            .map(|c| Opened {
                backend: c.backend,
                start: c.start,
                requests: c.requests,
            })
            .collect();
        rollout(service, &opened, &timeline)
    }
}
