//! observer: how Kubernetes Service traffic is really spread across pods on a node.
//!
//! Pure logic, free of aya and tokio types and unit-tested without root:
//! `record` (the log schema), `decode`, `tracker`, `btf` and `offsets`, `rules` and
//! `naming`, `stats` (aggregates, `summary`, `check`), `metrics`, and the view's state in
//! `tui`. The edges that touch the kernel, the terminal or the network: `capture` (load,
//! attach, maps), `session` (the capture loop), `serve` (the metrics endpoint),
//! `tui::run`, `output`, and `main.rs`.

pub mod btf;
pub mod capture;
pub mod decode;
pub mod live;
pub mod metrics;
pub mod naming;
pub mod offsets;
pub mod output;
pub mod record;
pub mod rules;
pub mod rules_cmd;
pub mod serve;
pub mod session;
pub mod stats;
pub mod tracker;
pub mod tui;
