//! Connection records: the log schema (`record`), the tracker that turns kernel events
//! and table sweeps into records (`tracker`), and the updates the pipeline hands to its
//! consumers (`update`). Plain data, no aya or tokio types.

pub mod ctview;
pub mod record;
pub mod tracker;
pub mod update;
