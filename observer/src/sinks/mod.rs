//! Where records go: the JSON Lines log (`log`), Prometheus metrics (`metrics`, served by
//! `pipeline::serve`), the text report (`summary`), CI verdicts (`check`) and the rules table
//! (`rules_table`).

pub mod check;
pub mod conn_line;
pub mod coverage;
pub mod dns;
pub mod junit;
pub mod log;
pub mod metrics;
pub mod rules_table;
pub mod summary;
pub mod text;
pub mod timeline;
pub mod why;
