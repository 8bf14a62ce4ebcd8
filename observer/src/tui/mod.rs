//! The live terminal view: Services, then one Service's backends and connections.
//!
//! `state` is pure state and `update`; `view` renders from `&App`; `export` turns what
//! is shown into JSON Lines; `run` owns the terminal and performs what `update` asks;
//! `replay` turns a recording into the same updates a capture produces. `view` and
//! `export` depend on `state`, `run` on all of them; nothing depends back.

mod export;
mod replay;
mod run;
mod state;
mod view;

pub use replay::replay_updates;
pub use run::{TuiOptions, check_terminal, run};
pub use state::{App, ConnRow, Detail, Effect, Msg, Screen, ServiceRow, Shown, SortKey, update};
pub use view::render;

#[cfg(test)]
mod tests;
