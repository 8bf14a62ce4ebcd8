//! How a sweep reads the kernel's connection table. A whole read walks every hash bucket
//! (262,144 by default: 205-364 us at 100 open connections, `benches/sweep.rs`),
//! however few connections are open. But the table gains entries only with the kernel's
//! `tracked` count (its programs count each entry they keep): while that count stands
//! where it stood at the last whole read, the table holds no key that read did not find,
//! and a lookup per known key (0.33-0.52 us each) reads the same entries. A keep-alive
//! load, whose connections stay open for minutes, is read that way.

/// A lookup per key costs about as much as walking 400 buckets (0.33 us against 0.78 ns
/// a bucket, 0.52 against 1.4 on a slower run of `benches/sweep.rs`): above one key per
/// `KEY_COST_BUCKETS` buckets, the whole read is about as cheap, and reads every key.
const KEY_COST_BUCKETS: usize = 512;

/// What the last reads found.
#[derive(Debug, Default)]
pub(super) struct TableReads {
    /// The `tracked` count read just before the last whole read; `None` before the first.
    walked_at: Option<u64>,
    /// The keys the last read found.
    keys: Vec<u64>,
}

/// How to read the table now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read<'a> {
    /// Every bucket.
    Whole,
    /// Only these keys (none: the table is known to be empty).
    Keys(&'a [u64]),
}

impl TableReads {
    /// How to read a table of `buckets` hash buckets whose `tracked` count is `tracked`
    /// (read before the table is).
    pub(super) fn plan(&self, tracked: u64, buckets: usize) -> Read<'_> {
        let few = self.keys.len() <= buckets / KEY_COST_BUCKETS;
        match self.walked_at {
            Some(at) if at == tracked && few => Read::Keys(&self.keys),
            _ => Read::Whole,
        }
    }

    /// A read (`whole` or by key) at `tracked` found `found`.
    pub(super) fn read<V>(&mut self, tracked: u64, whole: bool, found: &[(u64, V)]) {
        if whole {
            self.walked_at = Some(tracked);
        }
        self.keys.clear();
        self.keys.extend(found.iter().map(|(key, _)| *key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKETS: usize = 262_144;

    #[test]
    fn known_keys_are_looked_up_until_the_table_gains_an_entry() {
        let mut reads = TableReads::default();
        assert_eq!(reads.plan(0, BUCKETS), Read::Whole);
        reads.read(7, true, &[(10, ()), (20, ())]);
        assert_eq!(reads.plan(7, BUCKETS), Read::Keys(&[10, 20]));
        // One of them went: the next lookups skip it.
        reads.read(7, false, &[(20, ())]);
        assert_eq!(reads.plan(7, BUCKETS), Read::Keys(&[20]));
        // A program kept a new entry since: read everything.
        assert_eq!(reads.plan(8, BUCKETS), Read::Whole);
        reads.read(8, true, &[(20, ()), (30, ())]);
        assert_eq!(reads.plan(8, BUCKETS), Read::Keys(&[20, 30]));
    }

    #[test]
    fn an_empty_table_is_not_read_again_until_it_gains_an_entry() {
        let mut reads = TableReads::default();
        reads.read::<()>(3, true, &[]);
        assert_eq!(reads.plan(3, BUCKETS), Read::Keys(&[]));
        assert_eq!(reads.plan(4, BUCKETS), Read::Whole);
    }

    #[test]
    fn many_keys_are_cheaper_to_read_whole() {
        let mut reads = TableReads::default();
        let found: Vec<(u64, ())> = (0..=(BUCKETS / KEY_COST_BUCKETS) as u64)
            .map(|key| (key, ()))
            .collect();
        reads.read(1, true, &found[1..]);
        assert!(matches!(reads.plan(1, BUCKETS), Read::Keys(keys) if keys.len() == 512));
        reads.read(1, true, &found);
        assert_eq!(reads.plan(1, BUCKETS), Read::Whole);
        // A smaller table's walk is cheaper still.
        reads.read(1, true, &found[..5]);
        assert_eq!(reads.plan(1, 2048), Read::Whole);
        assert_eq!(reads.plan(1, 4096), Read::Keys(&[0, 1, 2, 3, 4][..]));
    }
}
