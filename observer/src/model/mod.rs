//! Connection records: the log schema (`record`), the tracker that turns kernel events
//! and table sweeps into records (`tracker`, which adds a UDP clash's losing datagrams to
//! the winner's record: `clash`), and the updates the pipeline hands to its
//! consumers (`update`). Plain data, no aya or tokio types.

/// A hash map keyed by what the network chooses (addresses, ports): foldhash is fast and
/// seeded per process, so keys cannot be picked to collide. Keys the kernel chooses
/// (`nf_conn` addresses, namespace inodes) use the faster unseeded `rustc_hash`.
pub type NetMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod clash;
pub mod record;
pub mod rejects;
pub mod span;
pub mod tracker;
pub mod tuple;
pub mod update;
