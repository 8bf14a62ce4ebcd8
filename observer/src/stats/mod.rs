//! Per-Service and per-backend statistics over connection records, shared by
//! `observer summary`, `observer check` and the live view.
//!
//! Definitions:
//! - A connection belongs to the Service named by `record.service`; unnamed connections
//!   (the rules did not name a Service) are grouped by `original_dst` ("10.96.35.226:80").
//!   Services are keyed by (name, proto).
//! - Expected share: the backend's `expected_share` in the latest `ServiceRecord` of its
//!   Service (`None` when the backend is not listed there). When a Service has no
//!   `ServiceRecord` at all (unnamed, or an old recording), every backend seen gets 1/N,
//!   N = backends seen, and `in_rules` is `true` (nothing says the pin is stale).
//! - Percentiles are nearest-rank: the p-th percentile of N sorted values is the value
//!   at rank ceil(p/100 * N) (1-based), so it is always a value that occurred.
//! - Skew: max over backends of `share / expected_share`, over backends with a positive
//!   expected share, where `share` is the backend's part of the requests to those
//!   backends (equal to `request_share` unless backends outside the rules got requests:
//!   those are reported as stale pins instead of dragging skew below 1). 1.00 is a
//!   perfect spread, 3.00 is "one backend of three got everything". `None` when no such
//!   backend got a request.
//! - Lifetime percentiles are exact while a backend has at most `EXACT_VALUES` (4096)
//!   closed connections, not counting the latest `RECENT_CLOSED` (1024) final records,
//!   which are always exact. Beyond that a backend's older closed connections are
//!   represented by a uniform sample of 4096 lifetimes (reservoir sampling, seeded per
//!   backend so results are reproducible), each standing for closed/4096 connections:
//!   p50/p90 are then estimates, `max` stays exact. Open connections count with their
//!   exact duration so far.
//! - Outcomes: each connection counts once, under its record's latest
//!   [`ConnRecord::outcome`](crate::model::record::ConnRecord::outcome) (answered,
//!   refused, unanswered, or pending while open without an answer).
//! - Connect times (`connect_ms`, TCP only) get p50/p99 the same way as lifetimes
//!   (exact, then from a reservoir per backend; a Service's over all its backends'), and
//!   are also counted in fixed histogram buckets (`CONNECT_BUCKETS_MS`) for metrics.
//! - Rejected connections (`reject` lines) count per Service, keyed like connections;
//!   they have no backend. A Service that only ever got rejects is listed too.
//! - Each backend keeps its connections by request count (`mix::RequestMix`): whether a
//!   skew is chance or cause is judged against a fair DNAT of the same connections
//!   (`chance`, `spread`; docs/statistics.md), and `story` finds the connections behind it.
//! - Resets: connections whose record says `close: rst` (answered, then reset; refused
//!   connections are an outcome of their own).
//!
//! [`Aggregator::apply`] keeps running totals, so an update costs a few hash look-ups;
//! percentiles are computed only when [`Aggregator::services`] is called. Memory stays
//! bounded in a long live session: per connection id only open connections and the latest
//! `RECENT_CLOSED` final records are kept (so a repeated final record replaces instead of
//! adding); older closed connections live on as per-backend totals and lifetime and
//! connect-time samples.

mod aggregator;
pub mod chance;
pub mod dns;
pub mod expectation;
pub mod mix;
mod outcomes;
mod quantiles;
mod service;
pub mod spread;
pub mod stickiness;
pub mod story;
#[cfg(test)]
pub(crate) mod tests;
pub mod timeline;

pub use aggregator::Aggregator;
pub use outcomes::{CONNECT_BUCKETS_MS, ConnectHistogram, OutcomeCounts};
pub use quantiles::{ConnectTimes, Percentiles, percentiles};
pub use service::{BackendStats, ServiceStats, SkewDetail};
