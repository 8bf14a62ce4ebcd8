//! A running observer binary (`record`, `serve`, ...), as the root tests and the benchmark
//! start it: stderr piped, and handed back once observer says it is `attached`. Only the
//! binary is run; this crate does not depend on the observer crate.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long loading and attaching the eBPF programs may take.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);

/// An observer process that has attached; killed on drop.
pub struct Observer {
    child: Child,
    /// Every stderr line so far.
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Observer {
    /// Spawns `command` (the observer binary with its arguments) with stderr piped and
    /// waits for the stderr line that contains `attached`. Stderr is read until observer
    /// exits, so it never blocks on a full pipe; with `echo`, every line is copied to this
    /// process's stderr as `[observer] LINE`.
    pub fn start(command: Command, echo: bool) -> anyhow::Result<Observer> {
        Observer::start_with(command, echo, |command| {
            command
                .spawn()
                .with_context(|| format!("could not start {:?}", command.get_program()))
        })
    }

    /// [`Observer::start`], with `spawn` starting the command (e.g.
    /// [`crate::NodeContainer::exec`], inside a node container).
    pub fn start_with(
        mut command: Command,
        echo: bool,
        spawn: impl FnOnce(&mut Command) -> anyhow::Result<Child>,
    ) -> anyhow::Result<Observer> {
        let mut child = spawn(command.stderr(Stdio::piped()))?;
        let pipe = child.stderr.take().context("observer's stderr")?;
        // From here on, dropping `observer` on an error kills the process.
        let observer = Observer {
            child,
            stderr: Arc::default(),
        };
        let (send, lines) = mpsc::channel();
        let kept = observer.stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[observer] {line}");
                }
                if let Ok(mut kept) = kept.lock() {
                    kept.push(line.clone());
                }
                // Nobody listens after `attached`: the line is only drained.
                let _ = send.send(line);
            }
        });
        loop {
            match lines.recv_timeout(ATTACH_TIMEOUT) {
                Ok(line) if line.contains("attached") => return Ok(observer),
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "observer did not say `attached` within {} s",
                    ATTACH_TIMEOUT.as_secs()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("observer exited before saying `attached`")
                }
            }
        }
    }

    /// The stderr lines observer wrote so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr
            .lock()
            .map(|kept| kept.clone())
            .unwrap_or_default()
    }

    /// The process id: to signal it (SIGSTOP/SIGCONT) or read its CPU and memory.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM (observer's clean shutdown), then waits for it to exit.
    pub fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        let pid = i32::try_from(self.child.id()).context("observer's pid")?;
        kill(Pid::from_raw(pid), Signal::SIGTERM).context("could not signal observer")?;
        self.child.wait().context("could not wait for observer")
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        // After `terminate` the child is reaped: std then sends no signal.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    /// A stand-in for the observer binary.
    fn sh(script: &str) -> Command {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn returns_once_attached_and_terminates_with_sigterm() {
        let mut observer = Observer::start(
            sh("echo loading >&2; echo '2 programs attached' >&2; exec sleep 30"),
            false,
        )
        .unwrap();
        let status = observer.terminate().unwrap();
        assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
        // The reader thread has seen the end of the pipe once the process is reaped.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while observer.stderr().len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(observer.stderr(), ["loading", "2 programs attached"]);
    }

    #[test]
    fn exiting_before_attached_is_an_error() {
        let err = Observer::start(sh("echo 'cannot load programs' >&2; exit 2"), true)
            .err()
            .expect("no `attached` line");
        assert_eq!(err.to_string(), "observer exited before saying `attached`");
    }

    #[test]
    fn a_missing_binary_is_an_error() {
        let err = Observer::start(Command::new("/nonexistent/observer"), false)
            .err()
            .expect("spawn fails");
        assert_eq!(err.to_string(), "could not start \"/nonexistent/observer\"");
    }
}
