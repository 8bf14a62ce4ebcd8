//! observer: how Kubernetes Service traffic is really spread across pods on a node.
//!
//! Pure logic lives here, free of aya and tokio types so it is unit-testable without
//! root; `main.rs` and `capture` are the edges that touch the kernel.

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
pub mod session;
pub mod stats;
pub mod tracker;
pub mod tui;
