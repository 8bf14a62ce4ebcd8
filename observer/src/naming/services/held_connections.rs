//! Finished connections held back, briefly, until the rules their name depends on are
//! read. A connection's line is written when it ends; when its namespace is brand new
//! (or its rules are old, or do not have it) the worker is still reading them, and a
//! moment's wait gives a name where writing at once would give `service: null`.
//!
//! The queue keeps the order in which records finished (connections, and rejected flows
//! through [`Waiting`]): one that needs no wait but ends behind a held one waits its turn. Nothing is held longer than the limits
//! given, whatever the worker does; the drain loop never blocks on it. A re-read gets a
//! short limit (the rules read before still give a name); the first read of a
//! namespace a longer one, since without it the name is null (on a loaded node,
//! `iptables-save` of thousands of Services takes seconds).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::locality::Locality;
use super::{FIRST_READ, Namer};
use crate::model::record::ConnRecord;

/// Sets a named connection's `policy` from the rules known now: whether its client's
/// case picks from the node's own endpoints.
pub fn set_policy(namer: &Namer, locality: &mut Locality, record: &mut ConnRecord) {
    if record.service.is_none() {
        return;
    }
    let client_is_node = locality.client_is_node(record.netns, record.client.ip());
    record.policy = namer
        .policy(
            record.netns,
            record.proto,
            record.original_dst,
            record.client,
            client_is_node,
        )
        .filter(|policy| *policy == super::rules::Policy::Local)
        .map(|_| crate::model::record::TrafficPolicy::Local);
}

/// A record that may wait in the queue: connections, and rejected flows (which are
/// named when written, so waiting is all they need).
pub trait Waiting {
    /// The network namespace whose rules its name depends on.
    fn netns(&self) -> u32;
    /// Names it again from the rules known now (its name waited for a read).
    fn rename(&mut self, namer: &Namer, locality: &mut Locality);
}

/// A connection (with what the caller keys it by): named again from the cached rules,
/// policy included.
impl<T> Waiting for (T, ConnRecord) {
    fn netns(&self) -> u32 {
        self.1.netns
    }

    fn rename(&mut self, namer: &Namer, locality: &mut Locality) {
        rename(namer, locality, &mut self.1);
    }
}

/// Names a held connection again from the cached rules, policy included.
pub fn rename(namer: &Namer, locality: &mut Locality, record: &mut ConnRecord) {
    namer
        .cached(
            record.netns,
            record.proto,
            record.original_dst,
            record.backend,
        )
        .apply_to(record);
    set_policy(namer, locality, record);
}

struct Held<T> {
    item: T,
    /// The generation of the namespace's rules the name waits for.
    wait_for: Option<u64>,
    until: Instant,
}

pub struct Hold<T> {
    queue: VecDeque<Held<T>>,
    limit: Duration,
    first_read_limit: Duration,
}

impl<T: Waiting> Hold<T> {
    /// Holds a record at most `limit` for a re-read (after which the rules read
    /// before name it), or `first_read_limit` for the first read of its namespace's rules
    /// (after which it has no name).
    pub fn new(limit: Duration, first_read_limit: Duration) -> Self {
        Hold {
            queue: VecDeque::new(),
            limit,
            first_read_limit,
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a named, finished connection must wait (be held): its name is not final,
    /// or connections that finished before it are held. Otherwise it is written now.
    pub fn must_wait(&self, wait_for: Option<u64>) -> bool {
        wait_for.is_some() || !self.queue.is_empty()
    }

    /// Queues a finished record that `must_wait`.
    pub fn hold(&mut self, item: T, wait_for: Option<u64>, now: Instant) {
        let limit = if wait_for == Some(FIRST_READ) {
            self.first_read_limit
        } else {
            self.limit
        };
        self.queue.push_back(Held {
            item,
            wait_for,
            until: now + limit,
        });
    }

    /// The held connections that may be written now, in the order they finished: those
    /// whose rules were read since (named again from them, policy included) or that
    /// waited long enough.
    pub fn release(&mut self, namer: &Namer, locality: &mut Locality, now: Instant) -> Vec<T> {
        let mut ready = Vec::new();
        while let Some(front) = self.queue.front() {
            let read = front
                .wait_for
                .is_none_or(|wanted| namer.generation(front.item.netns()) >= wanted);
            if !read && now < front.until {
                break;
            }
            if let Some(held) = self.queue.pop_front() {
                ready.push(Self::renamed(held, namer, locality));
            }
        }
        ready
    }

    /// Everything held, named from what is known now (the end of a session).
    pub fn release_all(&mut self, namer: &Namer, locality: &mut Locality) -> Vec<T> {
        self.queue
            .drain(..)
            .map(|held| Self::renamed(held, namer, locality))
            .collect()
    }

    /// When the first held connection must be written at the latest.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.queue.front().map(|held| held.until)
    }

    fn renamed(mut held: Held<T>, namer: &Namer, locality: &mut Locality) -> T {
        if held.wait_for.is_some() {
            held.item.rename(namer, locality);
        }
        held.item
    }
}
