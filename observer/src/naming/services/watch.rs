//! Learns when a namespace's rules change instead of re-reading them on a timer.
//! nf_tables announces every committed change (a rule, a set element, a chain...) on
//! the netlink multicast group `NFNLGRP_NFTABLES`; that covers nftables mode and
//! iptables-nft (what kind and Debian's iptables 1.8.9 use). One socket per namespace
//! is opened inside it (a socket keeps the namespace it was created in), and a thread
//! waits on all of them. The announcements say which chains changed
//! ([`super::nft_changes`]); after a burst of them has been quiet for [`QUIET`] (a
//! transaction arrives at once, ending with `NFT_MSG_NEWGEN`), the namespace is
//! re-read: only those chains where they are iptables-nft's, everything otherwise.
//! Announcements about tables observer does not read are ignored. Legacy iptables
//! announces nothing: where kube-proxy's rules are in legacy tables, the same thread
//! compares a fingerprint of them every [`LEGACY_POLL`] ([`super::legacy_fingerprint`]) and
//! re-reads everything when it changes.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::netns::Kind;

use super::legacy_fingerprint::Sockets;
use super::nft_changes::Changes;
use super::{WatchError, WatchFailure};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, setsockopt,
    socket, sockopt,
};

/// nf_tables' multicast group (`enum nfnetlink_groups` in the kernel's uapi).
const NFNLGRP_NFTABLES: u32 = 7;

/// How long a namespace's announcements must be quiet before it is re-read.
pub const QUIET: Duration = Duration::from_millis(20);

/// A namespace changing without pause is still re-read this soon after its first
/// announcement.
const MAX_DELAY: Duration = Duration::from_millis(200);

/// How long the thread waits when nothing is pending: how soon it notices a newly
/// watched namespace (its socket queues announcements meanwhile) or its own end.
const IDLE: Duration = Duration::from_millis(200);

/// How often legacy iptables tables are fingerprinted.
pub const LEGACY_POLL: Duration = Duration::from_secs(1);

/// Room for a large transaction's announcements (5,000 Services rewritten at once).
const RECEIVE_BUFFER: usize = 8 << 20;

/// Opens a socket subscribed to nf_tables' announcements in the namespace `path` opens.
pub fn subscribe(path: &Path) -> Result<OwnedFd, WatchError> {
    let subscribed = crate::netns::run_in_file(path, Kind::Network, || {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(WatchFailure::NetlinkSocket)?;
        // Root may exceed rmem_max; without it the default buffer still works.
        if setsockopt(&fd, sockopt::RcvBufForce, &RECEIVE_BUFFER).is_err() {
            let _ = setsockopt(&fd, sockopt::RcvBuf, &RECEIVE_BUFFER);
        }
        bind(
            fd.as_raw_fd(),
            &NetlinkAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1)),
        )
        .map_err(WatchFailure::JoinAnnouncements)?;
        Ok(fd)
    });
    cannot_watch(path, subscribed)
}

/// What entering the namespace `path` opens gave, its errors saying that the namespace
/// cannot be watched.
pub(super) fn cannot_watch<T>(
    path: &Path,
    entered: Result<Result<T, WatchFailure>, crate::netns::EnterError>,
) -> Result<T, WatchError> {
    entered
        .map_err(WatchFailure::Enter)
        .flatten()
        .map_err(|failure| WatchError {
            path: path.to_owned(),
            failure,
        })
}

/// Reads everything queued on `fd` without waiting into `changes`. An overflow means
/// announcements were lost: a full read.
fn drain(fd: &OwnedFd, buffer: &mut [u8], changes: &mut Changes) {
    loop {
        match recv(fd.as_raw_fd(), buffer, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => return,
            Ok(length) => changes.read_datagram(&buffer[..length]),
            Err(Errno::ENOBUFS) => changes.merge(Changes::everything()),
            Err(Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// How many changes the watcher has seen per namespace, shared with the namer: a
/// lookup that misses waits for the re-read of a change seen since its rules were
/// read, instead of asking for a re-read of its own.
pub type Seen = Arc<Mutex<HashMap<u32, u64>>>;

/// How a namespace's changes are learnt.
pub enum Source {
    /// nf_tables' announcements arrive on this socket.
    Announced(OwnedFd),
    /// Legacy tables, fingerprinted every [`LEGACY_POLL`].
    Polled {
        sockets: Sockets,
        last: Option<u64>,
        next: Instant,
    },
}

/// One watched namespace and its pending burst of changes.
struct Feed {
    netns: u32,
    source: Source,
    /// (first, last) change of a burst not yet answered by a re-read.
    burst: Option<(Instant, Instant)>,
    /// What the burst changed.
    pending: Changes,
    /// Changes seen, and how many of them are published in [`Seen`].
    seen: u64,
    published: u64,
}

impl Feed {
    fn due(&self) -> Option<Instant> {
        self.burst
            .map(|(first, last)| (last + QUIET).min(first + MAX_DELAY))
    }

    /// When it needs attention next without a message: a burst due, or a poll.
    fn deadline(&self) -> Option<Instant> {
        let poll = match &self.source {
            Source::Polled { next, .. } => Some(*next),
            Source::Announced(_) => None,
        };
        self.due().into_iter().chain(poll).min()
    }

    fn saw_change(&mut self, now: Instant, changes: Changes) {
        self.pending.merge(changes);
        let first = self.burst.map_or(now, |(first, _)| first);
        self.burst = Some((first, now));
        self.seen += 1;
    }

    /// Fingerprints polled tables when their time has come.
    fn poll_legacy(&mut self, now: Instant) {
        let Source::Polled {
            sockets,
            last,
            next,
        } = &mut self.source
        else {
            return;
        };
        if *next > now {
            return;
        }
        let print = sockets.fingerprint();
        // Unreadable (changing while read) counts as a change; so does the first poll,
        // which has nothing to compare with (the rules may have changed since the read
        // that found them in legacy tables).
        let changed = print.is_none() || print != *last;
        *last = print;
        *next = now + LEGACY_POLL;
        if changed {
            self.saw_change(now, Changes::everything());
        }
    }
}

/// Starts the thread that waits on the watched namespaces' sockets. A thread, not a
/// task: it belongs to the rules worker (`reader::spawn`), which blocks on reads in
/// other namespaces and serves `observer rules` and replays, where no runtime runs; its
/// one blocking call is `poll` on the sockets. New sockets arrive on the returned sender; `changed` is called with a namespace whose rules
/// changed and what changed, and returns false when nobody needs them any more. The thread ends then, or
/// when the sender is dropped.
pub fn spawn(
    mut changed: impl FnMut(u32, Changes) -> bool + Send + 'static,
    seen: Seen,
) -> std::io::Result<mpsc::Sender<(u32, Source)>> {
    let (register, registered) = mpsc::channel::<(u32, Source)>();
    std::thread::Builder::new()
        .name("observer-watch".to_owned())
        .spawn(move || {
            let mut feeds: Vec<Feed> = Vec::new();
            let mut buffer = vec![0u8; 64 << 10];
            loop {
                loop {
                    match registered.try_recv() {
                        Ok((netns, source)) => feeds.push(Feed {
                            netns,
                            source,
                            burst: None,
                            pending: Changes::default(),
                            seen: 0,
                            published: 0,
                        }),
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => return,
                    }
                }
                wait(&mut feeds, &mut buffer);
                let now = Instant::now();
                for feed in &mut feeds {
                    feed.poll_legacy(now);
                }
                // Published before any re-read is asked for.
                publish(&mut feeds, &seen);
                for feed in &mut feeds {
                    if feed.due().is_some_and(|due| due <= now) {
                        feed.burst = None;
                        if !changed(feed.netns, std::mem::take(&mut feed.pending)) {
                            return;
                        }
                    }
                }
            }
        })?;
    Ok(register)
}

fn publish(feeds: &mut [Feed], seen: &Seen) {
    let mut fresh = feeds
        .iter_mut()
        .filter(|f| f.published != f.seen)
        .peekable();
    if fresh.peek().is_none() {
        return;
    }
    let Ok(mut seen) = seen.lock() else {
        return;
    };
    for feed in fresh {
        seen.insert(feed.netns, feed.seen);
        feed.published = feed.seen;
    }
}

/// Waits until a socket has announcements, a burst or a poll is due, or [`IDLE`]
/// passes, and records what arrived.
fn wait(feeds: &mut [Feed], buffer: &mut [u8]) {
    let now = Instant::now();
    let until = feeds
        .iter()
        .filter_map(Feed::deadline)
        .min()
        .unwrap_or(now + IDLE)
        .min(now + IDLE);
    let timeout = until.saturating_duration_since(now);
    let announced: Vec<(usize, &OwnedFd)> = feeds
        .iter()
        .enumerate()
        .filter_map(|(i, feed)| match &feed.source {
            Source::Announced(fd) => Some((i, fd)),
            Source::Polled { .. } => None,
        })
        .collect();
    if announced.is_empty() {
        std::thread::sleep(timeout);
        return;
    }
    let mut fds: Vec<PollFd<'_>> = announced
        .iter()
        .map(|(_, fd)| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
        .collect();
    let indexes: Vec<usize> = announced.iter().map(|(i, _)| *i).collect();
    let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
    let timeout = PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX);
    if !poll(&mut fds, timeout).is_ok_and(|ready| ready > 0) {
        return;
    }
    let ready: Vec<bool> = fds
        .iter()
        .map(|fd| fd.revents().is_some_and(|revents| !revents.is_empty()))
        .collect();
    drop(fds);
    let now = Instant::now();
    for (index, ready) in indexes.into_iter().zip(ready) {
        let feed = &mut feeds[index];
        if let Source::Announced(fd) = &feed.source
            && ready
        {
            let mut changes = Changes::default();
            drain(fd, buffer, &mut changes);
            // Announcements about tables observer does not read change nothing.
            if !changes.is_empty() {
                feed.saw_change(now, changes);
            }
        }
    }
}

/// Which namespaces are watched, and the thread that watches them (started on first
/// use).
pub struct Watches {
    register: Option<mpsc::Sender<(u32, Source)>>,
    /// Whether each namespace tried is watched.
    tried: HashMap<u32, bool>,
    /// Whether each namespace tried has its legacy tables polled.
    polled: HashMap<u32, bool>,
    /// Changes seen, for the namer.
    seen: Seen,
}

impl Watches {
    /// Watches that publish the changes they see in `seen`.
    pub fn new(seen: Seen) -> Self {
        Watches {
            register: None,
            tried: HashMap::new(),
            polled: HashMap::new(),
            seen,
        }
    }

    /// How many changes of `netns` were seen so far.
    pub fn seen(&self, netns: u32) -> u64 {
        self.seen
            .lock()
            .map_or(0, |seen| seen.get(&netns).copied().unwrap_or(0))
    }
    /// Polls the legacy tables of `netns` (once; `path` opens it). Returns whether
    /// their changes are seen.
    pub fn ensure_polled(
        &mut self,
        netns: u32,
        path: Option<PathBuf>,
        changed: impl FnOnce() -> Box<dyn FnMut(u32, Changes) -> bool + Send>,
    ) -> bool {
        if let Some(&polled) = self.polled.get(&netns) {
            return polled;
        }
        let polled = path.is_some_and(|path| match super::legacy_fingerprint::open(&path) {
            // Tables that cannot be fingerprinted stay on the timer.
            Ok(sockets) if sockets.fingerprint().is_some() => {
                let source = Source::Polled {
                    last: None,
                    sockets,
                    next: Instant::now() + LEGACY_POLL,
                };
                self.register(netns, source, changed)
            }
            Ok(_) => false,
            Err(err) => {
                log::debug!("{err}: its legacy rules are re-read on a timer");
                false
            }
        });
        self.polled.insert(netns, polled);
        polled
    }

    /// Watches `netns` (once; `path` opens it), starting the thread with `changed` if
    /// needed. Returns whether its changes are announced.
    pub fn ensure(
        &mut self,
        netns: u32,
        path: Option<PathBuf>,
        changed: impl FnOnce() -> Box<dyn FnMut(u32, Changes) -> bool + Send>,
    ) -> bool {
        if let Some(&watched) = self.tried.get(&netns) {
            return watched;
        }
        let watched = path.is_some_and(|path| match subscribe(&path) {
            Ok(fd) => self.register(netns, Source::Announced(fd), changed),
            Err(err) => {
                log::debug!("{err}: its rules are re-read on a timer");
                false
            }
        });
        self.tried.insert(netns, watched);
        watched
    }

    fn register(
        &mut self,
        netns: u32,
        source: Source,
        changed: impl FnOnce() -> Box<dyn FnMut(u32, Changes) -> bool + Send>,
    ) -> bool {
        if self.register.is_none() {
            self.register = spawn(changed(), self.seen.clone()).ok();
        }
        self.register
            .as_ref()
            .is_some_and(|register| register.send((netns, source)).is_ok())
    }
}
