//! What each key does. While the filter is being typed, keys are text; while help is
//! open, any key but `q` closes it.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::{App, Effect, Screen};

impl App {
    pub(super) fn key(&mut self, key: KeyEvent) -> Option<Effect> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Some(Effect::Quit);
        }
        if self.editing_filter {
            self.edit_filter(key.code);
            return None;
        }
        if self.help {
            match key.code {
                KeyCode::Char('q') => return Some(Effect::Quit),
                _ => self.help = false,
            }
            return None;
        }
        self.command(key.code)
    }

    fn edit_filter(&mut self, code: KeyCode) {
        match code {
            KeyCode::Char(c) => self.filter.push(c),
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Enter => self.editing_filter = false,
            KeyCode::Esc => {
                self.filter.clear();
                self.editing_filter = false;
            }
            _ => return,
        }
        self.selected = 0;
        self.refilter();
        self.clamp_selection();
    }

    fn command(&mut self, code: KeyCode) -> Option<Effect> {
        let on_service = matches!(self.screen, Screen::Service(_) | Screen::Dns);
        match code {
            KeyCode::Char('q') => return Some(Effect::Quit),
            KeyCode::Char('?') => self.help = true,
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-20),
            KeyCode::PageDown => self.move_selection(20),
            KeyCode::Home | KeyCode::Char('g') => self.move_selection(isize::MIN),
            KeyCode::End | KeyCode::Char('G') => self.move_selection(isize::MAX),
            KeyCode::Enter if !on_service => {
                if let Some(row) = self.selected_row() {
                    self.screen = Screen::Service(row.key());
                    self.conn_selected = 0;
                    self.refresh_detail();
                }
            }
            KeyCode::Esc if on_service => {
                self.screen = Screen::Services;
                self.refresh_detail();
            }
            KeyCode::Esc => {
                self.filter.clear();
                self.refilter();
                self.clamp_selection();
            }
            KeyCode::Char('/') if !on_service => {
                self.editing_filter = true;
            }
            KeyCode::Char('s') if !on_service => {
                self.sort = self.sort.next();
                self.refilter();
            }
            KeyCode::Char('p') => {
                self.paused = !self.paused;
                if !self.paused {
                    self.refresh(true);
                }
            }
            KeyCode::Char('r') => {
                self.reset();
                self.refresh(true);
            }
            KeyCode::Char('d') => {
                self.screen = Screen::Dns;
                self.refresh_detail();
            }
            KeyCode::Char('e') => return Some(self.export()),
            KeyCode::Char('n') => {
                self.pod_names = !self.pod_names;
                self.message = Some(
                    if self.pod_names {
                        "showing pod names where known"
                    } else {
                        "showing IP addresses"
                    }
                    .to_owned(),
                );
            }
            _ => {}
        }
        None
    }

    fn move_selection(&mut self, by: isize) {
        let (current, len) = match &self.shown.detail {
            Some(detail) if matches!(self.screen, Screen::Service(_)) => {
                (&mut self.conn_selected, detail.conns.len())
            }
            _ => (&mut self.selected, self.shown.visible.len()),
        };
        let target = current.saturating_add_signed(by);
        *current = target.min(len.saturating_sub(1));
    }

    /// `run` writes what is shown (see `export`); the name says when.
    fn export(&self) -> Effect {
        Effect::Export {
            path: format!(
                "observer-export-{}.jsonl",
                self.now.format("%Y%m%dT%H%M%SZ")
            ),
            screen: self.screen.clone(),
            shown: Box::new(self.shown.clone()),
        }
    }
}
