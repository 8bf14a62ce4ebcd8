//! What the losing entry of a UDP clash carried, added to the record of the entry that
//! won.
//!
//! When two CPUs each make a conntrack entry for the first datagrams of one UDP flow,
//! the second to confirm loses the clash; if both chose the same backend, conntrack
//! sends its datagram on with the winner's entry and adds its counters there
//! (`nf_ct_resolve_clash`, `nf_ct_acct_merge`). The netfilter hook saw that datagram
//! before the clash, on the losing entry, which ends never confirmed: no connection of
//! its own. Its datagram was still the flow's, so its bytes (and request, if the winner's
//! datagram carried none) are kept here until the record of the entry with the same
//! original and reply tuple is written.
//!
//! Under `net_dev_queue` there is nothing to carry: it sees a loser only where the
//! datagram passed a device before confirmation (the bridge, after waiting for the
//! node to learn the pod's address), and the same datagram then passes the bridge port
//! on the winner's entry, counted there. Carrying it too counted it twice.

use observer_common::conn::{ConnState, FlowTuple, PROTO_UDP};

use crate::model::NetMap;

/// Namespace, original tuple and reply tuple: a loser merged into a winner has the same.
type Key = (u32, FlowTuple, FlowTuple);

/// Losers kept at most: a flood of clashes whose winners are never written (each
/// dropped at confirmation instead) cannot grow it without bound.
const MAX_LOSERS: usize = 65_536;

/// What losers carried, by the tuples of the winner they merged into.
#[derive(Debug, Default)]
pub struct ClashMerges {
    /// Keyed by tuples the network chooses: foldhash, seeded per process.
    losers: NetMap<Key, Carried>,
    /// The winners' entries count the losers' datagrams themselves (`net_dev_queue`).
    counted_by_winners: bool,
}

/// Requests and bytes (to, from the backend) of one or more losers: `requests` is 1
/// when any carried the client's payload (the first datagrams of a flow are one request).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    pub requests: u64,
    pub bytes: [u64; 2],
}

impl ClashMerges {
    /// A UDP entry ended without ever being confirmed: keep what it carried for the
    /// winner (TCP has no clash merge: a losing SYN is dropped and sent again).
    pub fn lost(&mut self, state: &ConnState) {
        if state.original.protocol != PROTO_UDP || self.counted_by_winners {
            return;
        }
        if self.losers.len() >= MAX_LOSERS {
            self.losers.clear();
        }
        let carried = self.losers.entry(key(state)).or_default();
        carried.requests = carried.requests.max(state.requests as u64);
        carried.bytes[0] += state.bytes[0];
        carried.bytes[1] += state.bytes[1];
    }

    /// From now on losers carry nothing: the hook sees their datagrams again on the
    /// winners' entries (`net_dev_queue`; see the module doc).
    pub fn counted_by_winners(&mut self) {
        self.counted_by_winners = true;
        self.losers.clear();
    }

    /// What losers merged into the connection `state` carried, if any.
    pub fn carried(&self, state: &ConnState) -> Option<Carried> {
        if self.losers.is_empty() {
            return None;
        }
        self.losers.get(&key(state)).copied()
    }

    /// Forgets what merged into `state`'s connection, once its final record is written.
    pub fn written(&mut self, state: &ConnState) {
        if !self.losers.is_empty() {
            self.losers.remove(&key(state));
        }
    }

    /// Keeps only what may still merge into a connection of the kernel table `entries`:
    /// a loser whose winner was written before it ended has nothing left to join.
    pub fn retain_live(&mut self, entries: &[(u64, ConnState)]) {
        if self.losers.is_empty() {
            return;
        }
        let live: std::collections::HashSet<Key, foldhash::fast::RandomState> =
            entries.iter().map(|(_, state)| key(state)).collect();
        self.losers.retain(|key, _| live.contains(key));
    }

    /// Losers kept.
    pub fn len(&self) -> usize {
        self.losers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.losers.is_empty()
    }
}

fn key(state: &ConnState) -> Key {
    (state.netns, state.original, state.reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use observer_common::conn::PROTO_TCP;

    fn state(protocol: u8, client_port: u16, backend_port: u16) -> ConnState {
        let mut state = ConnState {
            netns: 7,
            requests: 1,
            bytes: [40, 0],
            ..Default::default()
        };
        state.original.protocol = protocol;
        state.original.src.port = client_port;
        state.reply.protocol = protocol;
        state.reply.src.port = backend_port;
        state
    }

    #[test]
    fn a_udp_loser_joins_the_winner_with_the_same_tuples_once() {
        let mut merges = ClashMerges::default();
        let loser = state(PROTO_UDP, 5000, 53);
        merges.lost(&loser);
        let mut winner = loser;
        winner.bytes = [40, 20];
        assert_eq!(
            merges.carried(&winner),
            Some(Carried {
                requests: 1,
                bytes: [40, 0]
            })
        );
        assert_eq!(
            merges.carried(&state(PROTO_UDP, 5001, 53)),
            None,
            "another flow"
        );
        assert_eq!(
            merges.carried(&state(PROTO_UDP, 5000, 54)),
            None,
            "another backend: no merge, the loser was dropped"
        );
        merges.written(&winner);
        assert_eq!(merges.carried(&winner), None);
        merges.lost(&state(PROTO_TCP, 5000, 80));
        assert!(merges.is_empty(), "a losing SYN is dropped, not merged");
    }

    #[test]
    fn losers_carry_nothing_where_the_winners_count_their_datagrams() {
        let mut merges = ClashMerges::default();
        merges.counted_by_winners();
        let loser = state(PROTO_UDP, 5000, 53);
        merges.lost(&loser);
        assert_eq!(merges.carried(&loser), None);
    }

    #[test]
    fn losers_whose_winner_is_gone_from_the_table_are_forgotten() {
        let mut merges = ClashMerges::default();
        let (a, b) = (state(PROTO_UDP, 5000, 53), state(PROTO_UDP, 5002, 53));
        merges.lost(&a);
        merges.lost(&b);
        merges.retain_live(&[(1, a)]);
        assert_eq!(merges.len(), 1);
        assert!(merges.carried(&a).is_some());
        assert_eq!(merges.carried(&b), None);
    }
}
