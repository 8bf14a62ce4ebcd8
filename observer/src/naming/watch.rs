//! Learns when a namespace's rules change instead of re-reading them on a timer.
//! nf_tables announces every committed change (a rule, a set element, a chain...) on
//! the netlink multicast group `NFNLGRP_NFTABLES`; that covers nftables mode and
//! iptables-nft (what kind and Debian's iptables 1.8.9 use). One socket per namespace
//! is opened inside it (a socket keeps the namespace it was created in), and a thread
//! waits on all of them: after a burst of messages has been quiet for [`QUIET`] (a
//! transaction arrives at once, ending with `NFT_MSG_NEWGEN`), the namespace is
//! re-read. Legacy iptables announces nothing; the namer keeps re-reading such
//! namespaces on its timer.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
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

/// Room for a large transaction's announcements (5,000 Services rewritten at once).
const RECEIVE_BUFFER: usize = 8 << 20;

/// Opens a socket subscribed to nf_tables' announcements in the namespace `path` opens.
/// The namespace is entered on a short-lived thread, so no other thread changes
/// namespace.
pub fn subscribe(path: &Path) -> Result<OwnedFd, String> {
    let path: PathBuf = path.to_owned();
    let shown = path.display().to_string();
    std::thread::Builder::new()
        .name("observer-netns".to_owned())
        .spawn(move || -> Result<OwnedFd, String> {
            let namespace = std::fs::File::open(&path).map_err(|e| e.to_string())?;
            nix::sched::setns(namespace.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns: {e}"))?;
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                SockProtocol::NetlinkNetFilter,
            )
            .map_err(|e| format!("netlink socket: {e}"))?;
            // Root may exceed rmem_max; without it the default buffer still works.
            if setsockopt(&fd, sockopt::RcvBufForce, &RECEIVE_BUFFER).is_err() {
                let _ = setsockopt(&fd, sockopt::RcvBuf, &RECEIVE_BUFFER);
            }
            bind(
                fd.as_raw_fd(),
                &NetlinkAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1)),
            )
            .map_err(|e| format!("joining nf_tables' announcements: {e}"))?;
            Ok(fd)
        })
        .map_err(|e| e.to_string())?
        .join()
        .map_err(|_| "the namespace thread panicked".to_owned())?
        .map_err(|e| format!("cannot watch {shown}: {e}"))
}

/// Reads everything queued on `fd` without waiting. Returns whether anything (or an
/// overflow, which also means changes) was announced.
fn drain(fd: &OwnedFd, buffer: &mut [u8]) -> bool {
    let mut announced = false;
    loop {
        match recv(fd.as_raw_fd(), buffer, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => return announced,
            Ok(_) | Err(Errno::ENOBUFS) => announced = true,
            Err(Errno::EINTR) => {}
            Err(_) => return announced,
        }
    }
}

/// One watched namespace and its pending burst of announcements.
struct Feed {
    netns: u32,
    fd: OwnedFd,
    /// (first, last) announcement of a burst not yet answered by a re-read.
    burst: Option<(Instant, Instant)>,
}

impl Feed {
    fn due(&self) -> Option<Instant> {
        self.burst
            .map(|(first, last)| (last + QUIET).min(first + MAX_DELAY))
    }
}

/// Starts the thread that waits on the watched namespaces' sockets. New sockets
/// arrive on the returned sender; `changed` is called with a namespace whose rules
/// changed and returns false when nobody needs them any more. The thread ends then, or
/// when the sender is dropped.
pub fn spawn(
    mut changed: impl FnMut(u32) -> bool + Send + 'static,
) -> std::io::Result<mpsc::Sender<(u32, OwnedFd)>> {
    let (register, registered) = mpsc::channel::<(u32, OwnedFd)>();
    std::thread::Builder::new()
        .name("observer-watch".to_owned())
        .spawn(move || {
            let mut feeds: Vec<Feed> = Vec::new();
            let mut buffer = vec![0u8; 64 << 10];
            loop {
                loop {
                    match registered.try_recv() {
                        Ok((netns, fd)) => feeds.push(Feed {
                            netns,
                            fd,
                            burst: None,
                        }),
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => return,
                    }
                }
                wait(&mut feeds, &mut buffer);
                let now = Instant::now();
                for feed in &mut feeds {
                    if feed.due().is_some_and(|due| due <= now) {
                        feed.burst = None;
                        if !changed(feed.netns) {
                            return;
                        }
                    }
                }
            }
        })?;
    Ok(register)
}

/// Waits until a socket has announcements, a burst is due, or [`IDLE`] passes, and
/// records what arrived.
fn wait(feeds: &mut [Feed], buffer: &mut [u8]) {
    let now = Instant::now();
    let until = feeds
        .iter()
        .filter_map(Feed::due)
        .min()
        .unwrap_or(now + IDLE);
    let timeout = until.saturating_duration_since(now);
    if feeds.is_empty() {
        std::thread::sleep(timeout);
        return;
    }
    let mut fds: Vec<libc::pollfd> = feeds
        .iter()
        .map(|feed| libc::pollfd {
            fd: feed.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a live, writable array of `fds.len()` pollfd structs whose
    // descriptors `feeds` keeps open for the duration of the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    if ready <= 0 {
        return;
    }
    let now = Instant::now();
    for (feed, polled) in feeds.iter_mut().zip(&fds) {
        if polled.revents != 0 && drain(&feed.fd, buffer) {
            let first = feed.burst.map_or(now, |(first, _)| first);
            feed.burst = Some((first, now));
        }
    }
}

/// Which namespaces are watched, and the thread that watches them (started on first
/// use).
pub struct Watches {
    register: Option<mpsc::Sender<(u32, OwnedFd)>>,
    /// Whether each namespace tried is watched.
    tried: HashMap<u32, bool>,
}

impl Watches {
    pub fn new() -> Self {
        Watches {
            register: None,
            tried: HashMap::new(),
        }
    }

    /// Watches `netns` (once; `path` opens it), starting the thread with `changed` if
    /// needed. Returns whether its changes are announced.
    pub fn ensure(
        &mut self,
        netns: u32,
        path: Option<PathBuf>,
        changed: impl FnOnce() -> Box<dyn FnMut(u32) -> bool + Send>,
    ) -> bool {
        if let Some(&watched) = self.tried.get(&netns) {
            return watched;
        }
        let watched = path.is_some_and(|path| match subscribe(&path) {
            Ok(fd) => self.register(netns, fd, changed),
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
        fd: OwnedFd,
        changed: impl FnOnce() -> Box<dyn FnMut(u32) -> bool + Send>,
    ) -> bool {
        if self.register.is_none() {
            self.register = spawn(changed()).ok();
        }
        self.register
            .as_ref()
            .is_some_and(|register| register.send((netns, fd)).is_ok())
    }
}
