//! observer: how Kubernetes Service traffic is really spread across pods on a node.
//!
//! Pure logic lives here, free of aya and tokio types so it is unit-testable without
//! root; `main.rs` and `capture` are the edges that touch the kernel.

pub mod record;
pub mod live;
pub mod stats;
pub mod btf;
pub mod offsets;
pub mod decode;
pub mod tracker;
pub mod tui;
pub mod capture;
pub mod output;
pub mod session;
pub mod rules; pub mod naming; pub mod rules_cmd;
