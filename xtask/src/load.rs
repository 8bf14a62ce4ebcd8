//! The benchmark's two ends, run inside lab namespaces: a sink that accepts and drops
//! connections, and a client that opens new connections at a fixed rate (or as fast as
//! it can) and resets them, so that every connection is a fresh DNAT decision and no
//! TIME_WAIT limits the rate. The sink also echoes on a second port, for a client that
//! keeps a few connections and exchanges small messages on them: the packets of
//! established connections, without any connection's first or last packet.

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::OwnedFd,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, setsockopt, socket,
    sockopt::ReuseAddr,
};
use serde::{Deserialize, Serialize};

/// Size of the accept queue. std's `TcpListener` asks for 128: at the rates the client
/// reaches, that queue overflows, the kernel drops SYNs, and each drop stalls a client
/// thread for a 1-second retransmission, which made single rounds swing by a factor of
/// ten. The kernel caps it at `net.core.somaxconn` (4096 by default).
const BACKLOG: i32 = 4096;

/// Bytes each way in one echo exchange.
const ECHO_BYTES: usize = 64;

/// Accepts and drops connections on `port`, and echoes on `echo_port`, until killed.
pub fn sink(port: u16, echo_port: Option<u16>, threads: usize) -> anyhow::Result<()> {
    let drop_listener = listener(port)?;
    let echo = echo_port.map(listener).transpose()?;
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                for stream in drop_listener.incoming() {
                    drop(stream);
                }
            });
        }
        if let Some(echo) = &echo {
            scope.spawn(move || {
                for stream in echo.incoming().flatten() {
                    std::thread::spawn(move || echo_back(stream));
                }
            });
        }
    });
    Ok(())
}

/// A listening socket on `port` with a `BACKLOG`-deep accept queue.
fn listener(port: u16) -> anyhow::Result<TcpListener> {
    let fd: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("socket")?;
    setsockopt(&fd, ReuseAddr, &true).context("SO_REUSEADDR")?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)),
    )
    .with_context(|| format!("binding port {port}"))?;
    listen(&fd, Backlog::new(BACKLOG).context("backlog")?).context("listen")?;
    Ok(TcpListener::from(fd))
}

/// Sends back what arrives until the peer closes.
fn echo_back(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; ECHO_BYTES];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 || stream.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// What one client run achieved.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct LoadReport {
    pub connected: u64,
    pub failed: u64,
    pub seconds: f64,
}

impl LoadReport {
    pub fn rate(&self) -> f64 {
        self.connected as f64 / self.seconds
    }
}

/// Opens connections to `target` for `duration`: `rate` per second in total, paced
/// evenly across `threads` (0 = as fast as possible). Each is closed with RST.
pub fn client(target: SocketAddr, rate: u64, duration: Duration, threads: usize) -> LoadReport {
    let connected = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let threads = threads.max(1) as u64;
    let start = Instant::now();
    let deadline = start + duration;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (connected, failed) = (&connected, &failed);
            scope.spawn(move || {
                // Thread t sends its i-th connection at (i * threads + t) / rate.
                let interval =
                    (rate > 0).then(|| Duration::from_secs_f64(threads as f64 / rate as f64));
                let mut next = start
                    + interval.map_or(Duration::ZERO, |i| {
                        i.mul_f64(thread as f64 / threads as f64)
                    });
                loop {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    if let Some(interval) = interval {
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                        next += interval;
                    }
                    match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                        Ok(stream) => {
                            let linger = nix::sys::socket::sockopt::Linger;
                            let _ =
                                nix::sys::socket::setsockopt(&stream, linger, &libc_linger_zero());
                            connected.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    LoadReport {
        connected: connected.into_inner(),
        failed: failed.into_inner(),
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// `SO_LINGER` on with a zero timeout: `close` sends RST.
fn libc_linger_zero() -> nix::libc::linger {
    nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    }
}

/// What one echo run achieved: request-response exchanges of `ECHO_BYTES` each way.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct EchoReport {
    pub exchanges: u64,
    pub seconds: f64,
}

/// Keeps `connections` connections to `target` (one per thread) and exchanges messages
/// on them as fast as it can for `duration`; the connections are opened before the
/// clock starts and reset after it stops, so the run holds no first or last packet.
pub fn echo_client(
    target: SocketAddr,
    duration: Duration,
    connections: usize,
) -> anyhow::Result<EchoReport> {
    let streams = (0..connections.max(1))
        .map(|_| {
            let stream = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
            stream.set_nodelay(true)?;
            Ok(stream)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("connecting to {target}"))?;
    let exchanges = AtomicU64::new(0);
    let start = Instant::now();
    let deadline = start + duration;
    std::thread::scope(|scope| {
        for stream in &streams {
            let exchanges = &exchanges;
            scope.spawn(move || {
                let mut stream = stream;
                let mut buf = [7u8; ECHO_BYTES];
                while Instant::now() < deadline {
                    if stream.write_all(&buf).is_err() || stream.read_exact(&mut buf).is_err() {
                        return;
                    }
                    exchanges.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    for stream in &streams {
        let _ = nix::sys::socket::setsockopt(
            stream,
            nix::sys::socket::sockopt::Linger,
            &libc_linger_zero(),
        );
    }
    Ok(EchoReport {
        exchanges: exchanges.into_inner(),
        seconds,
    })
}

/// What one paced echo run achieved: exchanges done, and the client's latency
/// percentiles, each exchange measured from when it was due (so a stall that delays
/// the next ones counts against them too, not only against the one that stalled).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct PacedReport {
    pub exchanges: u64,
    pub seconds: f64,
    /// Exchanges that were due but not done by the end (the client fell behind).
    pub behind: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Keeps `connections` connections to `target` and exchanges `ECHO_BYTES`-byte
/// messages on them at `rate` per second in all, evenly spread over the connections and
/// staggered between them, for `duration`; one connection has at most one exchange in
/// flight. One thread drives them all with `ppoll` (100 blocking threads on a 2-CPU VM
/// measured their own scheduling: a p99 of 12-38 ms). Like `echo_client`, the
/// connections are opened before the clock starts and reset after it stops.
pub fn paced_echo_client(
    target: SocketAddr,
    duration: Duration,
    connections: usize,
    rate: u64,
) -> anyhow::Result<PacedReport> {
    use std::os::fd::AsRawFd as _;
    let connections = connections.max(1);
    let mut streams = (0..connections)
        .map(|_| {
            let stream = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
            stream.set_nodelay(true)?;
            stream.set_nonblocking(true)?;
            Ok(stream)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("connecting to {target}"))?;
    let period = Duration::from_secs_f64(connections as f64 / rate.max(1) as f64);
    let stagger = period / connections as u32;
    let start = Instant::now() + Duration::from_millis(50);
    let deadline = start + duration;
    // Per connection: when its next exchange is due, when the one in flight was due,
    // and how many bytes of its answer arrived.
    let mut due: Vec<Instant> = (0..connections)
        .map(|index| start + stagger * index as u32)
        .collect();
    let mut in_flight: Vec<Option<Instant>> = vec![None; connections];
    let mut received = vec![0usize; connections];
    let mut latencies: Vec<u32> = Vec::new();
    let mut buf = [7u8; ECHO_BYTES];
    let give_up = deadline + Duration::from_secs(2);
    loop {
        let now = Instant::now();
        for index in 0..connections {
            if in_flight[index].is_none() && due[index] <= now && due[index] < deadline {
                streams[index]
                    .write_all(&buf)
                    .context("sending an exchange")?;
                in_flight[index] = Some(due[index]);
                received[index] = 0;
                due[index] += period;
            }
        }
        let waiting = in_flight.iter().any(Option::is_some);
        let next_due = (0..connections)
            .filter(|&index| in_flight[index].is_none() && due[index] < deadline)
            .map(|index| due[index])
            .min();
        if (!waiting && next_due.is_none()) || now >= give_up {
            break;
        }
        let wake = next_due.unwrap_or(give_up).min(give_up);
        let timeout = wake.saturating_duration_since(Instant::now());
        let timespec = nix::libc::timespec {
            tv_sec: timeout.as_secs() as nix::libc::time_t,
            tv_nsec: timeout.subsec_nanos() as nix::libc::c_long,
        };
        let mut fds: Vec<nix::libc::pollfd> = streams
            .iter()
            .map(|stream| nix::libc::pollfd {
                fd: stream.as_raw_fd(),
                events: nix::libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of the length passed; `timespec` a valid timeout.
        let ready = unsafe {
            nix::libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as nix::libc::nfds_t,
                &timespec,
                std::ptr::null(),
            )
        };
        if ready <= 0 {
            continue;
        }
        for (index, pollfd) in fds.iter().enumerate() {
            if pollfd.revents == 0 {
                continue;
            }
            match streams[index].read(&mut buf[received[index]..]) {
                Ok(0) => anyhow::bail!("the echo server closed a connection"),
                Ok(n) => received[index] += n,
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(err) => return Err(err).context("reading an answer"),
            }
            if received[index] == ECHO_BYTES
                && let Some(was_due) = in_flight[index].take()
            {
                latencies.push(was_due.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
        }
    }
    let seconds = duration.as_secs_f64();
    let behind = due
        .iter()
        .map(|next| {
            let late = deadline.saturating_duration_since(*next);
            (late.as_secs_f64() / period.as_secs_f64()).ceil() as u64
        })
        .sum::<u64>()
        + in_flight.iter().filter(|f| f.is_some()).count() as u64;
    for stream in &streams {
        let _ = nix::sys::socket::setsockopt(
            stream,
            nix::sys::socket::sockopt::Linger,
            &libc_linger_zero(),
        );
    }
    latencies.sort_unstable();
    let percentile = |p: f64| -> f64 {
        match latencies.len() {
            0 => 0.0,
            n => f64::from(latencies[(((n - 1) as f64) * p).round() as usize]),
        }
    };
    Ok(PacedReport {
        exchanges: latencies.len() as u64,
        seconds,
        behind,
        p50_us: percentile(0.50),
        p99_us: percentile(0.99),
    })
}

/// conntrack's multicast group of destroy events (`NFNLGRP_CONNTRACK_DESTROY`).
const CONNTRACK_DESTROY_GROUP: u32 = 3;

/// Subscribes to conntrack's destroy events in this namespace and never reads them,
/// until killed: what following conntrack costs the kernel, whoever listens. While
/// anyone is subscribed, the kernel builds a netlink message for every entry it
/// destroys (and then drops it here, the receive queue full), before any socket filter
/// could refuse it.
pub fn destroy_listener() -> anyhow::Result<()> {
    let socket = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        nix::sys::socket::SockProtocol::NetlinkNetFilter,
    )
    .context("netlink socket")?;
    let groups = 1 << (CONNTRACK_DESTROY_GROUP - 1);
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&socket),
        &nix::sys::socket::NetlinkAddr::new(0, groups),
    )
    .context("subscribing to conntrack's destroy events")?;
    loop {
        std::thread::park();
    }
}
