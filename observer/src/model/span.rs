//! A time window of a recording (`check`/`summary` `--since`, `--until`, `--since-mark`,
//! `--until-mark`), so that one log can be judged "during the rollout" and "after it".
//!
//! A connection belongs to the window when it was open at some moment of it: it started
//! before `until` and had not ended before `since` (still open counts as open to the end).
//! Its counts are whole: the log has one total per connection, so a keep-alive connection
//! opened before the window and carrying requests in it counts with all of them (and is
//! exactly what "after the rollout, traffic is still pinned" is about). The rules are
//! those in force at `until`: the `service` lines written up to then (a Service first
//! defined later keeps its first line); endpoint changes up to `until` (earlier ones tell
//! which endpoints were missing when a connection opened); `dns` and `reject` lines dated
//! within the window. The summary line stays: it counts over the whole recording.

use chrono::{DateTime, Utc};

use super::record::{Recording, ServiceRecord};

/// `[since, until)`; either end open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

impl Span {
    fn before_until(&self, time: DateTime<Utc>) -> bool {
        self.until.is_none_or(|until| time < until)
    }

    fn within(&self, time: DateTime<Utc>) -> bool {
        self.since.is_none_or(|since| time >= since) && self.before_until(time)
    }

    /// The part of `recording` in the window (see the module doc).
    pub fn apply(&self, recording: &Recording) -> Recording {
        let conns = recording
            .conns
            .iter()
            .filter(|c| {
                self.before_until(c.start)
                    && self
                        .since
                        .is_none_or(|since| c.end.is_none_or(|end| end >= since))
            })
            .cloned()
            .collect();
        Recording {
            conns,
            services: self.rules(&recording.services),
            endpoints: recording
                .endpoints
                .iter()
                .filter(|e| self.before_until(e.time))
                .cloned()
                .collect(),
            dns: recording
                .dns
                .iter()
                .filter(|d| self.within(d.time))
                .cloned()
                .collect(),
            rejects: recording
                .rejects
                .iter()
                .filter(|r| self.within(r.time))
                .cloned()
                .collect(),
            marks: recording.marks.clone(),
            summary: recording.summary.clone(),
            cut: recording.cut,
        }
    }

    /// The `service` lines up to `until`, and the first line of a Service defined later.
    fn rules(&self, services: &[ServiceRecord]) -> Vec<ServiceRecord> {
        let key = |s: &ServiceRecord| (s.service.clone(), s.proto, s.netns);
        let in_force = |s: &ServiceRecord| self.until.is_none_or(|until| s.time <= until);
        let first = |index: usize, s: &ServiceRecord| {
            !services[..index]
                .iter()
                .any(|earlier| key(earlier) == key(s))
        };
        let defined_later = |s: &ServiceRecord| {
            !services
                .iter()
                .any(|other| key(other) == key(s) && in_force(other))
        };
        services
            .iter()
            .enumerate()
            .filter(|&(index, s)| in_force(s) || (first(index, s) && defined_later(s)))
            .map(|(_, s)| s.clone())
            .collect()
    }
}

#[cfg(test)]
#[path = "span_tests.rs"]
mod tests;
