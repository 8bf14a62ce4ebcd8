//! The connections the live view keeps for display: every open one, plus the newest
//! closed ones up to a cap, so memory stays bounded at thousands of connections/s.

use std::collections::{BTreeMap, HashMap};

use crate::model::record::{Close, ConnRecord};
use crate::model::update::ConnId;

/// How an update changed the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// First sight of an open connection, or a later record of one already known.
    Progressed,
    /// The connection's final record arrived for the first time.
    Closed,
}

#[derive(Clone, Debug)]
pub struct ConnTable {
    open: HashMap<ConnId, ConnRecord>,
    /// Closed connections by arrival order, oldest first; evicted from the front.
    closed: BTreeMap<u64, (ConnId, ConnRecord)>,
    closed_seq: HashMap<ConnId, u64>,
    next_seq: u64,
    closed_cap: usize,
}

impl ConnTable {
    pub fn new(closed_cap: usize) -> ConnTable {
        ConnTable {
            open: HashMap::new(),
            closed: BTreeMap::new(),
            closed_seq: HashMap::new(),
            next_seq: 0,
            closed_cap,
        }
    }

    /// Stores `record` under `id`, replacing what was there.
    pub fn apply(&mut self, id: ConnId, record: ConnRecord) -> Change {
        if record.close == Close::Open {
            // A late progress record for a connection already closed changes nothing.
            if self.closed_seq.contains_key(&id) {
                return Change::Progressed;
            }
            self.open.insert(id, record);
            return Change::Progressed;
        }
        self.open.remove(&id);
        if let Some(seq) = self.closed_seq.get(&id) {
            self.closed.insert(*seq, (id, record));
            return Change::Progressed;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.closed.insert(seq, (id, record));
        self.closed_seq.insert(id, seq);
        while self.closed.len() > self.closed_cap {
            if let Some((_, (old, _))) = self.closed.pop_first() {
                self.closed_seq.remove(&old);
            }
        }
        Change::Closed
    }

    pub fn open(&self) -> impl Iterator<Item = (&ConnId, &ConnRecord)> {
        self.open.iter()
    }

    /// Closed connections kept, newest first.
    pub fn closed(&self) -> impl Iterator<Item = (&ConnId, &ConnRecord)> {
        self.closed.values().rev().map(|(id, record)| (id, record))
    }

    /// Forgets closed connections; open ones stay.
    pub fn clear_closed(&mut self) {
        self.closed.clear();
        self.closed_seq.clear();
    }
}
