//! The live view in tmux, as a person sees it: the real binary in a terminal of known
//! size, driven with keys, its screen read back.

use std::process::Command;
use std::time::{Duration, Instant};

/// A tmux session running one command; killed on drop.
pub struct Tmux {
    session: String,
}

impl Tmux {
    pub fn start(session: &str, command: &str) -> Tmux {
        let status = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                session,
                "-x",
                "110",
                "-y",
                "40",
                command,
            ])
            .status()
            .expect("tmux");
        assert!(status.success(), "tmux new-session failed");
        Tmux {
            session: session.to_owned(),
        }
    }

    pub fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn keys(&self, keys: &[&str]) {
        for key in keys {
            let status = Command::new("tmux")
                .args(["send-keys", "-t", &self.session, key])
                .status()
                .unwrap();
            assert!(status.success());
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Waits until the screen satisfies `ready`, returning it.
    pub fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Quits the live view (Escape, then q) and waits until it has ended.
    pub fn quit(&self) {
        self.keys(&["Escape", "q"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!self.alive(), "observer did not quit on q");
    }

    fn alive(&self) -> bool {
        Command::new("tmux")
            .args(["has-session", "-t", &self.session])
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .stderr(std::process::Stdio::null())
            .status();
    }
}
