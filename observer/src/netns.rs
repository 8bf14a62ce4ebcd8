//! Runs a closure inside another namespace (network or UTS) on a short-lived thread of
//! its own: `setns` changes only the calling thread's namespace, so no other thread of
//! observer ever sees it change, and the thread ends with the closure. What the closure
//! opens there (a socket) keeps that namespace.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use nix::errno::Errno;
use nix::sched::CloneFlags;

/// Which kind of namespace a file opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Network,
    Uts,
}

impl Kind {
    fn flag(self) -> CloneFlags {
        match self {
            Kind::Network => CloneFlags::CLONE_NEWNET,
            Kind::Uts => CloneFlags::CLONE_NEWUTS,
        }
    }
}

/// Why the closure did not run, or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    /// The namespace file could not be opened.
    #[error("{0}")]
    Open(#[source] io::Error),
    /// No thread could be started to enter the namespace.
    #[error("cannot start a thread: {0}")]
    Spawn(#[source] io::Error),
    /// `setns` refused (not a namespace file of that kind, or no privilege).
    #[error("setns: {0}")]
    Enter(#[source] Errno),
    /// The closure panicked.
    #[error("the namespace thread panicked")]
    Panicked,
}

impl From<EnterError> for io::Error {
    fn from(err: EnterError) -> io::Error {
        match err {
            EnterError::Open(err) | EnterError::Spawn(err) => err,
            EnterError::Enter(errno) => errno.into(),
            EnterError::Panicked => io::Error::other(err.to_string()),
        }
    }
}

/// Runs `task` inside the namespace `namespace` (an open nsfs file: `/proc/PID/ns/net`,
/// `/run/netns/X`) of `kind`, on a thread that enters it and then ends.
pub fn run_in<T: Send>(
    namespace: impl AsFd,
    kind: Kind,
    task: impl FnOnce() -> T + Send,
) -> Result<T, EnterError> {
    let namespace = namespace.as_fd();
    // A thread that must stay a thread: setns(2) moves the calling thread, and a tokio
    // worker (or any thread that goes on to other work) must never change namespace. A
    // socket made here stays bound to the namespace and is read from anywhere after.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("observer-netns".to_owned())
            .spawn_scoped(scope, move || {
                nix::sched::setns(namespace, kind.flag()).map_err(EnterError::Enter)?;
                Ok(task())
            })
            .map_err(EnterError::Spawn)?
            .join()
            .unwrap_or(Err(EnterError::Panicked))
    })
}

/// [`run_in`] for the namespace file at `path`.
pub fn run_in_file<T: Send>(
    path: &Path,
    kind: Kind,
    task: impl FnOnce() -> T + Send,
) -> Result<T, EnterError> {
    let namespace = std::fs::File::open(path).map_err(EnterError::Open)?;
    run_in(&namespace, kind, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_no_namespace_is_refused_before_the_task_runs() {
        let not_a_namespace = std::fs::File::open("/dev/null").unwrap();
        let result = run_in(&not_a_namespace, Kind::Network, || 1);
        assert!(matches!(result, Err(EnterError::Enter(Errno::EINVAL))));
    }
}
