//! Follows conntrack's events for DNATed entries in many network namespaces: one tokio
//! task per namespace waits on its socket (`AsyncFd`) and hands the events over a
//! bounded channel, so that reading them never waits on the session loop, which drains
//! the channel. Another task reads conntrack's statistics in each namespace, when asked to.
//!
//! The channel is bounded. When it is full a namespace's task waits, and stops reading
//! its socket; events then gather in the socket's receive buffer (`socket::EVENT_BUFFER`),
//! and if that overflows too the kernel says so (`ENOBUFS`): a [`Note::Overrun`], which
//! the session counts and warns about, then asks conntrack about that namespace's
//! connections instead. No event is dropped uncounted.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::socket::{CtSocket, Received};
use super::{CtEntry, CtKind, CtMessage, CtStats};

/// After reading, a namespace's task lets events gather this long: under churn it (and
/// the session loop it hands them to) wakes about 20 times a second, not once per
/// connection. The sockets' buffers (`socket::EVENT_BUFFER`) hold far more.
const GATHER: Duration = Duration::from_millis(50);
/// Notes the channel holds before the namespaces' tasks wait for the session loop.
const CHANNEL: usize = 65536;

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

/// A namespace's event socket, registered with the runtime. The mutex is never held
/// across an await, so the listener can read it one last time when it stops.
struct EventSocket {
    socket: Mutex<CtSocket>,
    fd: RawFd,
}

impl AsRawFd for EventSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

/// A followed namespace: its socket and the task reading it.
struct Followed {
    socket: Arc<AsyncFd<EventSocket>>,
    task: tokio::task::JoinHandle<()>,
}

/// The listening tasks; stopping the listener (or dropping it) ends them, and
/// [`Listener::stop`] reads what is waiting first.
pub struct Listener {
    notes: mpsc::Receiver<Note>,
    send: mpsc::Sender<Note>,
    /// Notes made outside the tasks (a namespace's first statistics), delivered first.
    own: VecDeque<Note>,
    followed: HashMap<u32, Followed>,
    groups: Vec<u32>,
    buffer: i32,
    readings: Option<Arc<Mutex<Readings>>>,
    /// The statistics task, started with the first namespace.
    reading: Option<tokio::task::JoinHandle<()>>,
}

impl Listener {
    /// A listener that reads events of `groups` (`socket::GROUP_*`) from sockets with
    /// `buffer` bytes of receive buffer each (`socket::EVENT_BUFFER`), and with
    /// `stats_every`, conntrack's statistics in each namespace: when it is watched, that
    /// often after, and once more when the listener stops. Its tasks start with the
    /// first [`Listener::watch`], which must run inside the tokio runtime.
    pub fn start(groups: &[u32], buffer: i32, stats_every: Option<Duration>) -> Listener {
        let (send, notes) = mpsc::channel(CHANNEL);
        Listener {
            notes,
            send,
            own: VecDeque::new(),
            followed: HashMap::new(),
            groups: groups.to_vec(),
            buffer,
            readings: stats_every.map(|every| Arc::new(Mutex::new(Readings::new(every)))),
            reading: None,
        }
    }

    /// Subscribes in the namespace `path` refers to (inode `netns`); when this returns
    /// Ok, every later event there is reported.
    pub fn watch(&mut self, netns: u32, path: &Path) -> std::io::Result<()> {
        if self.followed.contains_key(&netns) {
            return Ok(());
        }
        let socket = CtSocket::open_in(path, &self.groups, self.buffer)?;
        let requests = match self.readings {
            Some(_) => Some(CtSocket::open_in(path, &[], 0)?),
            None => None,
        };
        let fd = socket.raw_fd();
        let socket = EventSocket {
            socket: Mutex::new(socket),
            fd,
        };
        // SAFETY: `fd` is the descriptor the CtSocket inside owns, which it never
        // changes or closes; the AsyncFd owns the EventSocket, so the descriptor stays
        // open until the registration ends.
        let socket =
            unsafe { AsyncFd::register_with_interest(socket, tokio::io::Interest::READABLE) }
                .map_err(|err| err.into_parts().1)?;
        let socket = Arc::new(socket);
        let task = tokio::spawn(follow(netns, Arc::clone(&socket), self.send.clone()));
        self.followed.insert(netns, Followed { socket, task });
        if let (Some(readings), Some(requests)) = (&self.readings, requests) {
            let first = lock(readings).add(netns, requests);
            self.own.extend(first);
            if self.reading.is_none() {
                let (readings, send) = (Arc::clone(readings), self.send.clone());
                self.reading = Some(tokio::spawn(read_stats(readings, send)));
            }
        }
        Ok(())
    }

    /// Stops following `netns` (its socket closes: a namespace is not kept alive).
    pub fn unwatch(&mut self, netns: u32) {
        if let Some(followed) = self.followed.remove(&netns) {
            followed.task.abort();
        }
        if let Some(readings) = &self.readings {
            lock(readings).sockets.remove(&netns);
        }
    }

    pub fn watches(&self, netns: u32) -> bool {
        self.followed.contains_key(&netns)
    }

    /// The next note; pending forever once every task is gone and all were read.
    pub async fn next(&mut self) -> Note {
        if let Some(note) = self.own.pop_front() {
            return note;
        }
        match self.notes.recv().await {
            Some(note) => note,
            None => std::future::pending().await,
        }
    }

    /// A note if one is waiting.
    pub fn try_next(&mut self) -> Option<Note> {
        self.own.pop_front().or_else(|| self.notes.try_recv().ok())
    }

    /// Ends the tasks, reads what the sockets hold now (and conntrack's statistics once
    /// more), and returns every note not yet taken.
    pub fn stop(mut self) -> Vec<Note> {
        self.halt();
        let mut rest: Vec<Note> = self.own.drain(..).collect();
        while let Ok(note) = self.notes.try_recv() {
            rest.push(note);
        }
        for (netns, followed) in &self.followed {
            if let Err(error) = read_waiting(*netns, &followed.socket, &mut rest) {
                rest.push(Note::Failed {
                    netns: *netns,
                    error: error.to_string(),
                });
            }
        }
        if let Some(readings) = &self.readings {
            rest.extend(lock(readings).read_all());
        }
        rest
    }

    fn halt(&mut self) {
        for followed in self.followed.values() {
            followed.task.abort();
        }
        if let Some(reading) = &self.reading {
            reading.abort();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.halt();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// One namespace's task: waits for events, reads all that are waiting, hands them over
/// (waiting while the channel is full), then lets more gather.
async fn follow(netns: u32, socket: Arc<AsyncFd<EventSocket>>, send: mpsc::Sender<Note>) {
    let mut notes = Vec::new();
    loop {
        let read = match socket.readable().await {
            Ok(mut ready) => {
                let read = read_waiting(netns, &socket, &mut notes);
                // Everything waiting was read (until EAGAIN): wait for the next edge.
                ready.clear_ready();
                read
            }
            Err(error) => Err(error),
        };
        let failed = read.is_err();
        if let Err(error) = read {
            notes.push(Note::Failed {
                netns,
                error: error.to_string(),
            });
        }
        for note in notes.drain(..) {
            if send.send(note).await.is_err() {
                return;
            }
        }
        if failed {
            return;
        }
        tokio::time::sleep(GATHER).await;
    }
}

/// Reads datagrams until none is waiting; reports DNATed entries only.
fn read_waiting(
    netns: u32,
    socket: &AsyncFd<EventSocket>,
    notes: &mut Vec<Note>,
) -> std::io::Result<()> {
    let mut socket = lock(&socket.get_ref().socket);
    loop {
        match socket.receive()? {
            Received::Empty => return Ok(()),
            Received::Overrun => notes.push(Note::Overrun { netns }),
            Received::Messages(messages) => {
                for message in messages {
                    notes.push(match message {
                        Ok(CtMessage::Conntrack(kind, entry)) if entry.dnat() => {
                            Note::Event { netns, kind, entry }
                        }
                        Ok(_) => continue,
                        Err(_) => Note::Malformed { netns },
                    });
                }
            }
        }
    }
}

/// The statistics task: every namespace's figures, every `Readings::every`.
async fn read_stats(readings: Arc<Mutex<Readings>>, send: mpsc::Sender<Note>) {
    let every = lock(&readings).every;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        ticks.tick().await;
        let notes = lock(&readings).read_all();
        for note in notes {
            if send.send(note).await.is_err() {
                return;
            }
        }
    }
}

/// The statistics side: a request socket per namespace, all read every `every`. Each
/// reading is two netlink round trips that the kernel answers as they are sent.
struct Readings {
    every: Duration,
    /// Per namespace: its request socket, and whether conntrack was ever used there
    /// (until it is, its readings are not reported: most pods' namespaces never are).
    sockets: BTreeMap<u32, (CtSocket, bool)>,
}

impl Readings {
    fn new(every: Duration) -> Readings {
        Readings {
            every,
            sockets: BTreeMap::new(),
        }
    }

    /// Reads a namespace's statistics when it is watched, then with all the others.
    fn add(&mut self, netns: u32, socket: CtSocket) -> Option<Note> {
        self.sockets.insert(netns, (socket, false));
        self.read(netns)
    }

    fn read_all(&mut self) -> Vec<Note> {
        let namespaces: Vec<u32> = self.sockets.keys().copied().collect();
        namespaces
            .into_iter()
            .filter_map(|netns| self.read(netns))
            .collect()
    }

    /// One reading, reported where conntrack was ever used; a namespace whose reading
    /// fails is said once and no longer read.
    fn read(&mut self, netns: u32) -> Option<Note> {
        let (socket, used) = self.sockets.get_mut(&netns)?;
        let stats = match socket.stats() {
            Ok(stats) => {
                *used |= stats.used();
                if !*used {
                    return None;
                }
                Ok(stats)
            }
            Err(err) => {
                self.sockets.remove(&netns);
                // Without nf_conntrack_netlink there are no statistics either; the one
                // sentence about the missing module (NETLINK_MISSING) already says so.
                if super::netlink_missing(&err) {
                    return None;
                }
                Err(err.to_string())
            }
        };
        Some(Note::Stats {
            netns,
            at: Utc::now(),
            stats,
        })
    }
}
