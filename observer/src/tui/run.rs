//! The terminal loop: one `tokio::select!` over a redraw tick, terminal input, the
//! update channel and termination signals. Updates are applied as they come (in
//! bounded batches) and drawn on the tick, so a flood of them neither flickers nor
//! starves input.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use crossterm::event::{Event, EventStream};
use futures::StreamExt;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc::{Receiver, error::TryRecvError};
use tokio::time::MissedTickBehavior;

use super::export;
use super::state::{App, Effect, Msg, Screen, Shown, update};
use super::view::render;
use crate::model::update::Update;

/// Redraws per second: 4.
const TICK: Duration = Duration::from_millis(250);
/// Updates applied per wake-up before input and the tick get a turn.
const BATCH: usize = 4096;

pub struct TuiOptions {
    /// Shown in the header (e.g. the node, or the replayed file).
    pub title: String,
    /// The recording being written (live) or read (replay), if any.
    pub recording: Option<String>,
    /// The updates come from a recording, not from a running capture.
    pub replay: bool,
}

/// Fails unless stdin and stdout are a terminal.
pub fn check_terminal() -> anyhow::Result<()> {
    if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
        return Ok(());
    }
    anyhow::bail!(
        "observer's live view needs a terminal; use `observer record --write FILE` to record without one"
    )
}

/// Leaves raw mode and the alternate screen however `run` ends (errors included;
/// ratatui's panic hook covers panics).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// Shows `updates` until the user quits (q, Ctrl-C), SIGINT or SIGTERM arrives, or the
/// terminal goes away. The channel closing does not end the view.
pub async fn run(mut updates: Receiver<Update>, options: TuiOptions) -> anyhow::Result<()> {
    check_terminal()?;
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch for SIGINT")?;
    let mut terminal = ratatui::try_init().context("cannot put the terminal into raw mode")?;
    let _restore = Restore;

    let mut app = App::new(
        &options.title,
        options.recording,
        options.replay,
        Utc::now(),
    );
    let mut input = EventStream::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut open = true;
    loop {
        let mut redraw = false;
        let effect = tokio::select! {
            _ = tick.tick() => {
                redraw = true;
                update(&mut app, Msg::Tick(Utc::now()))
            }
            event = input.next() => match event {
                Some(Ok(Event::Key(key))) => {
                    redraw = true;
                    update(&mut app, Msg::Key(key))
                }
                Some(Ok(Event::Resize(..))) => {
                    redraw = true;
                    None
                }
                Some(Ok(_)) => None,
                Some(Err(err)) => return Err(err).context("cannot read from the terminal"),
                None => Some(Effect::Quit),
            },
            received = updates.recv(), if open => {
                open = apply_batch(&mut app, received, &mut updates);
                None
            }
            _ = sigterm.recv() => Some(Effect::Quit),
            _ = sigint.recv() => Some(Effect::Quit),
        };
        match effect {
            Some(Effect::Quit) => break,
            Some(Effect::Export {
                path,
                screen,
                shown,
            }) => {
                let result = write_export(&path, &screen, &shown).await;
                update(&mut app, Msg::Exported { path, result });
                redraw = true;
            }
            None => {}
        }
        if redraw {
            terminal
                .draw(|frame| render(&app, frame))
                .context("cannot draw to the terminal")?;
        }
    }
    Ok(())
}

/// Applies `first` and then what else is already queued, up to `BATCH`; returns whether
/// the channel is still open.
fn apply_batch(app: &mut App, first: Option<Update>, updates: &mut Receiver<Update>) -> bool {
    let Some(first) = first else {
        update(app, Msg::UpdatesClosed);
        return false;
    };
    update(app, Msg::Live(Box::new(first)));
    for _ in 1..BATCH {
        match updates.try_recv() {
            Ok(next) => {
                update(app, Msg::Live(Box::new(next)));
            }
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                update(app, Msg::UpdatesClosed);
                return false;
            }
        }
    }
    true
}

/// Writes the rows of `screen` to `path`; how many lines, or why not.
async fn write_export(path: &str, screen: &Screen, shown: &Shown) -> Result<usize, String> {
    let file = export::file(screen, shown);
    tokio::fs::write(path, file.contents)
        .await
        .map(|()| file.lines)
        .map_err(|err| err.to_string())
}
