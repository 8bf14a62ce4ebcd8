//! ctnetlink sockets, opened inside a network namespace: conntrack is per namespace, and
//! a netlink socket talks to the namespace it was created in.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use super::parse::{self, ParseError};
use super::{CtEntry, CtKind, CtMessage, CtStats, CtTuple};
use crate::netns::{self, Kind};

const NETLINK_NETFILTER: i32 = 12;
const SOL_NETLINK: i32 = 270;
const NETLINK_ADD_MEMBERSHIP: i32 = 1;
/// Multicast groups of conntrack's events (`enum nfnetlink_groups`).
pub const GROUP_NEW: u32 = 1;
pub const GROUP_DESTROY: u32 = 3;
/// Receive buffer of an event socket: conntrack sends events whether or not anyone
/// reads, so a burst must fit while the reader is busy.
pub const EVENT_BUFFER: i32 = 32 << 20;
/// Largest datagram ctnetlink sends (dumps fill up to a page or a few).
pub const DATAGRAM: usize = 64 << 10;
/// A request that gets no answer in this time failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A ctnetlink socket in one network namespace.
pub struct CtSocket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

/// What one read of an event socket gave.
pub enum Received {
    Messages(Vec<Result<CtMessage, ParseError>>),
    /// Nothing waiting.
    Empty,
    /// The kernel dropped events because the receive buffer was full (`ENOBUFS`).
    Overrun,
}

impl CtSocket {
    /// Opens a socket in the namespace `netns` refers to (`/run/netns/X`,
    /// `/proc/PID/ns/net`), joined to the multicast `groups` with a receive buffer of
    /// `buffer` bytes (the kernel doubles it). The namespace is entered on a
    /// thread of its own, so no other thread's namespace ever changes.
    pub fn open_in(netns: &Path, groups: &[u32], buffer: i32) -> io::Result<CtSocket> {
        let groups = groups.to_vec();
        let fd = netns::run_in_file(netns, Kind::Network, || open_socket(&groups, buffer))??;
        Ok(CtSocket {
            fd,
            seq: 0,
            buf: vec![0; DATAGRAM],
        })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Every entry in the namespace's table, and how many messages could not be read.
    pub fn dump(&mut self) -> io::Result<(Vec<CtEntry>, u64)> {
        let (mut entries, mut malformed) = (Vec::new(), 0);
        self.ask(parse::dump_request, |message| {
            match message {
                Ok(CtMessage::Conntrack(_, entry)) => entries.push(entry),
                Ok(CtMessage::Done) => return Some(Ok(())),
                Ok(CtMessage::Error(code)) if code < 0 => return Some(Err(errno(code))),
                Ok(_) => {}
                Err(_) => malformed += 1,
            }
            None
        })?;
        Ok((entries, malformed))
    }

    /// The entry whose original tuple is `tuple`; `None` when conntrack has none.
    pub fn get(&mut self, tuple: &CtTuple) -> io::Result<Option<CtEntry>> {
        let mut found = None;
        self.ask(
            |seq| parse::get_request(seq, tuple),
            |message| match message {
                Ok(CtMessage::Conntrack(CtKind::Entry, entry)) => {
                    found = Some(entry);
                    None
                }
                Ok(CtMessage::Error(0)) => Some(Ok(found.take())),
                Ok(CtMessage::Error(code)) if -code == libc::ENOENT => Some(Ok(None)),
                other => unawaited(other),
            },
        )
    }

    /// conntrack's figures in this namespace, as `conntrack -C` and `conntrack -S` read
    /// them: two requests, each answered while it is sent (nothing waits on traffic).
    pub fn stats(&mut self) -> io::Result<CtStats> {
        let mut table = None;
        let (entries, max_entries) = self.ask(parse::table_request, |message| match message {
            Ok(CtMessage::Table {
                entries,
                max_entries,
            }) => {
                table = Some((entries, max_entries));
                None
            }
            Ok(CtMessage::Error(0)) => Some(table.ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "no table size in the answer")
            })),
            other => unawaited(other),
        })?;
        let mut cpus = Vec::new();
        self.ask(parse::cpu_stats_request, |message| match message {
            Ok(CtMessage::CpuStats(cpu)) => {
                cpus.push(cpu);
                None
            }
            Ok(CtMessage::Done) => Some(Ok(())),
            other => unawaited(other),
        })?;
        Ok(super::table_stats(entries, max_entries, &cpus))
    }

    /// Sends the request `make` builds with the next sequence number, and hands each
    /// message of the answer to `each` until it returns the result.
    fn ask<T>(
        &mut self,
        make: impl FnOnce(u32) -> Vec<u8>,
        mut each: impl FnMut(Result<CtMessage, ParseError>) -> Option<io::Result<T>>,
    ) -> io::Result<T> {
        self.seq += 1;
        self.send(&make(self.seq))?;
        loop {
            for message in self.receive_blocking()? {
                if let Some(result) = each(message) {
                    return result;
                }
            }
        }
    }

    /// Reads one datagram without waiting.
    pub fn receive(&mut self) -> io::Result<Received> {
        match self.recv(libc::MSG_DONTWAIT) {
            Ok(len) => Ok(Received::Messages(parse::messages(&self.buf[..len]))),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Ok(Received::Empty),
            Err(err) if err.raw_os_error() == Some(libc::ENOBUFS) => Ok(Received::Overrun),
            Err(err) => Err(err),
        }
    }

    fn receive_blocking(&mut self) -> io::Result<Vec<Result<CtMessage, ParseError>>> {
        let len = self.recv(0)?;
        Ok(parse::messages(&self.buf[..len]))
    }

    fn recv(&mut self, flags: i32) -> io::Result<usize> {
        // SAFETY: `buf` is a live, writable buffer of the length passed.
        let len = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                flags | libc::MSG_TRUNC,
            )
        };
        if len < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = len as usize;
        if len > self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("ctnetlink datagram of {len} bytes exceeds the {DATAGRAM}-byte buffer"),
            ));
        }
        Ok(len)
    }

    fn send(&self, request: &[u8]) -> io::Result<()> {
        // SAFETY: `request` is a live buffer of the length passed.
        let sent = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(-code)
}

/// What a request makes of a message it does not wait for: an error from netlink, or a
/// message that cannot be read, ends it; any other is passed over.
fn unawaited<T>(message: Result<CtMessage, ParseError>) -> Option<io::Result<T>> {
    match message {
        Ok(CtMessage::Error(code)) if code < 0 => Some(Err(errno(code))),
        Ok(_) => None,
        Err(err) => Some(Err(io::Error::new(io::ErrorKind::InvalidData, err))),
    }
}

/// A bound `NETLINK_NETFILTER` socket in the calling thread's namespace.
fn open_socket(groups: &[u32], buffer: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned right below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_nl is plain data; zeroed is a valid value (pid 0: the kernel
    // assigns one, no groups via the legacy bitmask).
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: `addr` is a valid sockaddr_nl of the size passed.
    let bound = unsafe {
        libc::bind(
            raw,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if bound < 0 {
        return Err(io::Error::last_os_error());
    }
    let timeout = libc::timeval {
        tv_sec: REQUEST_TIMEOUT.as_secs() as _,
        tv_usec: 0,
    };
    set_option(raw, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)?;
    if !groups.is_empty() {
        // Needs CAP_NET_ADMIN; without it, the default limit is what we get.
        if set_option(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &buffer).is_err() {
            set_option(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &buffer)?;
        }
    }
    if groups.contains(&GROUP_DESTROY) {
        super::filter::attach(raw)?;
    }
    for group in groups {
        set_option(raw, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)?;
    }
    Ok(fd)
}

fn set_option<T>(fd: RawFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live T of the size passed.
    let done = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
