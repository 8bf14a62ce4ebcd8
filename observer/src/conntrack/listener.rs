//! Follows conntrack's events for DNATed entries in many network namespaces on one
//! thread of its own, so that reading them never waits on (or stalls) the session loop.
//! The same thread reads conntrack's statistics in each namespace, when asked to.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::socket::{CtSocket, Received};
use super::{CtEntry, CtKind, CtMessage, CtStats};

/// How long the thread waits for events before looking for new namespaces or a stop,
/// where it has no `Waker` (no eventfd): with one it sleeps until woken, so an idle
/// observer does not wake 20 times a second.
const POLL_MS: i32 = 50;
/// After reading, the thread lets events gather this long: under churn it (and the
/// session loop it hands them to) wakes about 20 times a second, not once per
/// connection. The sockets' buffers (`socket::EVENT_BUFFER`) hold far more.
const GATHER: Duration = Duration::from_millis(50);

/// What the listener reports.
#[derive(Debug)]
pub enum Note {
    /// A DNATed entry created or destroyed in namespace `netns` (inode).
    Event {
        netns: u32,
        kind: CtKind,
        entry: CtEntry,
    },
    /// The kernel dropped events for this socket (`ENOBUFS`): the listener's own loss.
    Overrun { netns: u32 },
    /// A message that could not be read.
    Malformed { netns: u32 },
    /// The socket failed and is no longer read.
    Failed { netns: u32, error: String },
    /// conntrack's figures in `netns` at `at` (only where conntrack was ever used, see
    /// [`CtStats::used`]), or why they could not be read (then they no longer are there).
    Stats {
        netns: u32,
        at: DateTime<Utc>,
        stats: Result<CtStats, String>,
    },
}

/// Sockets handed to the thread (the event socket, and a request socket for statistics
/// when they are read), or taken away.
enum Control {
    Add(u32, CtSocket, Option<CtSocket>),
    Remove(u32),
}

/// An eventfd that wakes the thread from `poll` when a socket is added or taken away,
/// or when it is told to stop.
struct Waker(OwnedFd);

impl Waker {
    fn new() -> Option<Waker> {
        // SAFETY: eventfd(2) takes no pointers; a non-negative result is a new
        // descriptor that nothing else owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        // SAFETY: as above: `fd` is open and owned by nothing else.
        (fd >= 0).then(|| Waker(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live array to an open descriptor. A full counter
        // (EAGAIN) still leaves it readable, which is all a wake-up needs.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Resets the counter after a wake-up.
    fn clear(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live array of 8.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    }
}

/// The listening thread; stopping it (or dropping it) reads what is waiting first.
pub struct Listener {
    notes: mpsc::UnboundedReceiver<Note>,
    control: std::sync::mpsc::Sender<Control>,
    waker: Option<Arc<Waker>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    groups: Vec<u32>,
    buffer: i32,
    reads_stats: bool,
    watched: rustc_hash::FxHashSet<u32>,
}

impl Listener {
    /// Starts a thread that reads events of `groups` (`socket::GROUP_*`) from sockets
    /// with `buffer` bytes of receive buffer each (`socket::EVENT_BUFFER`), and with
    /// `stats_every`, conntrack's statistics in each namespace: when it is watched, that
    /// often after, and once more when the listener stops.
    pub fn start(groups: &[u32], buffer: i32, stats_every: Option<Duration>) -> Listener {
        let (send, notes) = mpsc::unbounded_channel();
        let (control, controls) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let waker = Waker::new().map(Arc::new);
        let woken = waker.clone();
        let thread = std::thread::Builder::new()
            .name("conntrack-events".into())
            .spawn(move || {
                let readings = stats_every.map(Readings::new);
                listen(&controls, &send, &stopping, woken.as_deref(), readings)
            })
            .ok();
        Listener {
            notes,
            control,
            waker,
            stop,
            thread,
            groups: groups.to_vec(),
            buffer,
            reads_stats: stats_every.is_some(),
            watched: Default::default(),
        }
    }

    /// Subscribes in the namespace `path` refers to (inode `netns`); when this returns
    /// Ok, every later event there is reported.
    pub fn watch(&mut self, netns: u32, path: &Path) -> std::io::Result<()> {
        if self.watched.contains(&netns) {
            return Ok(());
        }
        let socket = CtSocket::open_in(path, &self.groups, self.buffer)?;
        let requests = match self.reads_stats {
            true => Some(CtSocket::open_in(path, &[], 0)?),
            false => None,
        };
        self.watched.insert(netns);
        self.control
            .send(Control::Add(netns, socket, requests))
            .map_err(|_| std::io::Error::other("the conntrack listener thread is gone"))?;
        self.wake();
        Ok(())
    }

    fn wake(&self) {
        if let Some(waker) = &self.waker {
            waker.wake();
        }
    }

    /// Stops following `netns` (its socket closes: a namespace is not kept alive).
    pub fn unwatch(&mut self, netns: u32) {
        if self.watched.remove(&netns) {
            let _ = self.control.send(Control::Remove(netns));
            self.wake();
        }
    }

    pub fn watches(&self, netns: u32) -> bool {
        self.watched.contains(&netns)
    }

    /// The next note; pending forever once the thread is gone and all were read.
    pub async fn next(&mut self) -> Note {
        match self.notes.recv().await {
            Some(note) => note,
            None => std::future::pending().await,
        }
    }

    /// A note if one is waiting.
    pub fn try_next(&mut self) -> Option<Note> {
        self.notes.try_recv().ok()
    }

    /// Reads what the sockets hold now, ends the thread, and returns every note not yet
    /// taken.
    pub fn stop(mut self) -> Vec<Note> {
        self.halt();
        let mut rest = Vec::new();
        while let Ok(note) = self.notes.try_recv() {
            rest.push(note);
        }
        rest
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.halt();
    }
}

fn listen(
    controls: &std::sync::mpsc::Receiver<Control>,
    send: &mpsc::UnboundedSender<Note>,
    stop: &AtomicBool,
    waker: Option<&Waker>,
    mut readings: Option<Readings>,
) {
    let mut sockets: HashMap<RawFd, (u32, CtSocket)> = HashMap::new();
    loop {
        while let Ok(control) = controls.try_recv() {
            match control {
                Control::Add(netns, socket, requests) => {
                    sockets.insert(socket.raw_fd(), (netns, socket));
                    if let (Some(readings), Some(requests)) = (readings.as_mut(), requests) {
                        readings.add(netns, requests, send);
                    }
                }
                Control::Remove(netns) => {
                    sockets.retain(|_, (ns, _)| *ns != netns);
                    if let Some(readings) = readings.as_mut() {
                        readings.sockets.remove(&netns);
                    }
                }
            }
        }
        let stopping = stop.load(Ordering::SeqCst);
        // The waker first (when there is one), then the sockets.
        let woken_at = waker.map(|waker| waker.0.as_raw_fd());
        let mut fds: Vec<libc::pollfd> = woken_at
            .into_iter()
            .chain(sockets.keys().copied())
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // Stopping: one more pass without waiting. Otherwise wait until woken.
        let timeout = match (stopping, waker) {
            (true, _) => 0,
            (false, Some(_)) => -1,
            (false, None) => POLL_MS,
        };
        // Woken for the next reading of statistics too.
        let timeout = readings.as_ref().map_or(timeout, |r| r.bound(timeout));
        // SAFETY: `fds` is a live array of the length passed.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if ready < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            std::thread::sleep(Duration::from_millis(POLL_MS as u64));
        }
        if let Some(waker) = waker
            && fds[0].revents != 0
        {
            waker.clear();
        }
        let fds = &fds[usize::from(waker.is_some())..];
        // After a stop, one more pass reads everything already queued.
        let mut read = false;
        for pollfd in fds.iter().filter(|p| stopping || p.revents != 0) {
            read = true;
            let Some((netns, socket)) = sockets.get_mut(&pollfd.fd) else {
                continue;
            };
            if let Err(error) = read_all(*netns, socket, send) {
                let _ = send.send(Note::Failed {
                    netns: *netns,
                    error: error.to_string(),
                });
                sockets.remove(&pollfd.fd);
            }
        }
        if let Some(readings) = readings.as_mut()
            && (stopping || readings.due())
        {
            readings.read_all(send);
        }
        if stopping {
            return;
        }
        if read {
            std::thread::sleep(GATHER);
        }
    }
}

/// Reads datagrams until none is waiting; reports DNATed entries only.
fn read_all(
    netns: u32,
    socket: &mut CtSocket,
    send: &mpsc::UnboundedSender<Note>,
) -> std::io::Result<()> {
    loop {
        match socket.receive()? {
            Received::Empty => return Ok(()),
            Received::Overrun => {
                let _ = send.send(Note::Overrun { netns });
            }
            Received::Messages(messages) => {
                for message in messages {
                    let note = match message {
                        Ok(CtMessage::Conntrack(kind, entry)) if entry.dnat() => {
                            Note::Event { netns, kind, entry }
                        }
                        Ok(_) => continue,
                        Err(_) => Note::Malformed { netns },
                    };
                    let _ = send.send(note);
                }
            }
        }
    }
}

/// The thread's statistics side: a request socket per namespace, all read every `every`.
/// Each reading is two netlink round trips that the kernel answers as they are sent.
struct Readings {
    every: Duration,
    next: Instant,
    /// Per namespace: its request socket, and whether conntrack was ever used there
    /// (until it is, its readings are not reported: most pods' namespaces never are).
    sockets: BTreeMap<u32, (CtSocket, bool)>,
}

impl Readings {
    fn new(every: Duration) -> Readings {
        Readings {
            every,
            next: Instant::now() + every,
            sockets: BTreeMap::new(),
        }
    }

    /// Reads a namespace's statistics when it is watched, then with all the others.
    fn add(&mut self, netns: u32, socket: CtSocket, send: &mpsc::UnboundedSender<Note>) {
        self.sockets.insert(netns, (socket, false));
        self.read(netns, send);
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// `timeout` (poll's milliseconds, -1 for none) shortened to the next reading.
    fn bound(&self, timeout: i32) -> i32 {
        let until = self.next.saturating_duration_since(Instant::now());
        let until = i32::try_from(until.as_millis() + 1).unwrap_or(i32::MAX);
        if timeout < 0 {
            until
        } else {
            timeout.min(until)
        }
    }

    fn read_all(&mut self, send: &mpsc::UnboundedSender<Note>) {
        self.next = Instant::now() + self.every;
        let namespaces: Vec<u32> = self.sockets.keys().copied().collect();
        for netns in namespaces {
            self.read(netns, send);
        }
    }

    /// One reading, reported where conntrack was ever used; a namespace whose reading
    /// fails is said once and no longer read.
    fn read(&mut self, netns: u32, send: &mpsc::UnboundedSender<Note>) {
        let Some((socket, used)) = self.sockets.get_mut(&netns) else {
            return;
        };
        let stats = match socket.stats() {
            Ok(stats) => {
                *used |= stats.used();
                if !*used {
                    return;
                }
                Ok(stats)
            }
            Err(err) => {
                self.sockets.remove(&netns);
                // Without nf_conntrack_netlink there are no statistics either; the one
                // sentence about the missing module (NETLINK_MISSING) already says so.
                if super::netlink_missing(&err) {
                    return;
                }
                Err(err.to_string())
            }
        };
        let _ = send.send(Note::Stats {
            netns,
            at: Utc::now(),
            stats,
        });
    }
}
