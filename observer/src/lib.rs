//! observer: how Kubernetes Service traffic is really spread across pods on a node.
//!
//! The tree follows the data:
//! - [`kernel`]: BTF offsets, loading and attaching the programs, decoding their events.
//! - [`conntrack`]: conntrack's own view through ctnetlink: a dump of its entries at start,
//!   its destroy events (connections it removed end `expired`), its NEW events (`verify`).
//! - [`model`]: the connection-log schema, the tracker that turns events into records,
//!   and the updates the pipeline hands on. [`pipeline`] runs kernel -> model -> naming -> sinks.
//! - [`naming`]: [`naming::services`] names Services from kube-proxy's rules (iptables-save,
//!   nft JSON) read per network namespace; [`naming::pods`] names pods from the runtime's
//!   sandbox bundles.
//! - [`stats`]: per-Service and per-backend aggregates; [`sinks`]: the log writer and
//!   metrics; [`report`]: the summary, check verdicts, why, verify's coverage, the rules
//!   table; [`tui`]: the live view.
//! - [`netns`]: runs a closure inside another network or UTS namespace, on a thread of its own.
//! - [`cli`]: every subcommand's arguments and entry point, and the exit-code convention.
//!
//! Pure, unit-tested without root: `model`, `naming` (but its edges), `stats`, `sinks`,
//! `report`, `tui` (but `run`), `kernel::{btf, offsets, decode}`, `conntrack::parse`.
//! The edges that touch the kernel, the terminal, the network or the node's tools:
//! `kernel::capture`, `conntrack::{socket, listener}`, `pipeline` (`pipeline::serve` too),
//! `naming::services::source`, `naming::pods::{runtime, hostnames}`, `tui::run`, `cli`.

pub mod cli;
pub mod conntrack;
pub mod dns;
pub mod kernel;
pub mod model;
pub mod naming;
pub mod netlink;
pub mod netns;
pub mod pipeline;
pub mod report;
pub mod sinks;
pub mod stats;
pub mod tui;
