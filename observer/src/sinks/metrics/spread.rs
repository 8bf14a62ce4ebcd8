//! The metrics that say why a Service is skewed ([`crate::stats::spread`]): how
//! concentrated its requests are, how its skew splits between the DNAT's picks and
//! requests per connection, what a fair DNAT of the same connections would give, and the
//! cause `check --max-skew 1.5` would name.

use prometheus_client::metrics::MetricType;

use super::{Family, Labels, Sample};
use crate::report::check::DEFAULT_CONFIDENCE;
use crate::report::summary::SKEW_MARK;
use crate::stats::ServiceStats;
use crate::stats::spread::{Finding, Spread, judge};
use crate::stats::story::Rollout;

pub(super) struct SpreadFamilies {
    effective: Family,
    busiest: Family,
    connection_factor: Family,
    requests_factor: Family,
    fair_median: Family,
    chance: Family,
    cause: Family,
    rollout_requests: Family,
    rollout_explains: Family,
}

/// The `cause` label: what `check --max-skew 1.5` would say of the Service.
fn cause(finding: &Finding) -> &'static str {
    match finding {
        Finding::Holds => "even",
        Finding::WithinChance(_) => "within_chance",
        Finding::Pinning { .. } => "pinning",
        Finding::TooFewConnections { .. } => "too_few_connections",
        Finding::RulesUneven(_) => "rules_uneven",
        Finding::BusierConnections { .. } => "busier_connections",
    }
}

impl SpreadFamilies {
    pub(super) fn new() -> SpreadFamilies {
        SpreadFamilies {
            effective: Family::new(
                "observer_service_effective_connections",
                MetricType::Gauge,
                "How many equally busy connections would spread the Service's requests as evenly as its connections did (requests squared over the sum of each connection's requests squared); 1 when one connection carried all.",
            ),
            busiest: Family::new(
                "observer_service_busiest_connection_requests",
                MetricType::Gauge,
                "Requests carried by the Service's busiest connection.",
            ),
            connection_factor: Family::new(
                "observer_service_skew_connection_factor",
                MetricType::Gauge,
                "The skewed backend's share of connections over its expected share: the part of the skew the DNAT's picks make.",
            ),
            requests_factor: Family::new(
                "observer_service_skew_requests_per_connection_factor",
                MetricType::Gauge,
                "The skewed backend's requests per connection over the Service's: the part of the skew its connections' load makes (pinning).",
            ),
            fair_median: Family::new(
                "observer_service_fair_skew_median",
                MetricType::Gauge,
                "A skew that a fair DNAT of the Service's connections (each keeping its requests) reaches at least half the time.",
            ),
            chance: Family::new(
                "observer_service_skew_chance",
                MetricType::Gauge,
                "The chance that a fair DNAT of the Service's connections gives its skew or more (a p-value; small means a cause, not chance).",
            ),
            cause: Family::new(
                "observer_service_skew_cause",
                MetricType::Gauge,
                "1 for what check --max-skew 1.5 would say of the Service's skew: even, within_chance, pinning, too_few_connections, rules_uneven or busier_connections.",
            ),
            rollout_requests: Family::new(
                "observer_service_rollout_window_requests",
                MetricType::Gauge,
                "Requests on the skewed backend's open and latest closed connections that opened while the endpoint `missing` was out of the rules (a rollout or readiness window).",
            ),
            rollout_explains: Family::new(
                "observer_service_skew_explained_by_rollout",
                MetricType::Gauge,
                "1 when the connections opened in that window carried at least the skewed backend's excess requests: the rollout window explains the skew; 0 when they did not.",
            ),
        }
    }

    pub(super) fn add(&mut self, service: &ServiceStats, rollout: Option<&Rollout>) {
        if let Some(rollout) = rollout {
            let labels: Labels = vec![
                ("service", service.service.clone()),
                ("proto", service.proto.to_string()),
            ];
            let mut window = labels.clone();
            window.push(("backend", rollout.backend.to_string()));
            window.push(("missing", rollout.missing.to_string()));
            self.rollout_requests
                .add(window, Sample::Ratio(rollout.requests as f64));
            self.rollout_explains.add(
                labels,
                Sample::Ratio(if rollout.explains { 1.0 } else { 0.0 }),
            );
        }
        let Some(spread) = Spread::of(service) else {
            return;
        };
        let labels: Labels = vec![
            ("service", service.service.clone()),
            ("proto", service.proto.to_string()),
        ];
        self.effective
            .add(labels.clone(), Sample::Ratio(spread.effective_connections));
        self.busiest.add(
            labels.clone(),
            Sample::Ratio(spread.busiest_connection as f64),
        );
        self.connection_factor
            .add(labels.clone(), Sample::Ratio(spread.connection_factor));
        self.requests_factor.add(
            labels.clone(),
            Sample::Ratio(spread.requests_per_connection_factor),
        );
        self.fair_median
            .add(labels.clone(), Sample::Ratio(spread.fair_median));
        self.chance
            .add(labels.clone(), Sample::Ratio(spread.chance.value));
        if let Some(finding) = judge(service, SKEW_MARK, 1.0 - DEFAULT_CONFIDENCE) {
            let mut with_cause = labels;
            with_cause.push(("cause", cause(&finding).to_owned()));
            self.cause.add(with_cause, Sample::Ratio(1.0));
        }
    }

    /// In exposition order.
    pub(super) fn into_families(self) -> [Family; 9] {
        [
            self.effective,
            self.busiest,
            self.connection_factor,
            self.requests_factor,
            self.fair_median,
            self.chance,
            self.cause,
            self.rollout_requests,
            self.rollout_explains,
        ]
    }
}
