//! Where records go: the JSON Lines log (`log`, one line per record by `conn_line`) and
//! Prometheus metrics (`metrics`, served by `pipeline::serve`). The reports read from a log
//! (summary, check, verify, rules) are [`crate::report`].

pub mod conn_line;
pub mod log;
pub mod metrics;
