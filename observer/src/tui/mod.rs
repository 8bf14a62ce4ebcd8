//! The live terminal view: Services, then one Service's backends and connections.
//!
//! `app` is pure state and `update`; `view` renders from `&App`; `run` owns the
//! terminal; `replay` turns a recording into the same updates a capture produces.

mod app;
mod conns;
mod export;
mod replay;
mod run;
mod view;

pub use app::{App, ConnRow, Detail, Effect, Msg, Screen, ServiceRow, SortKey, update};
pub use replay::replay_updates;
pub use run::{TuiOptions, check_terminal, run};
pub use view::render;

#[cfg(test)]
mod tests;
