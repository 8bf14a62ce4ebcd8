//! The benchmark's two ends, run inside lab namespaces: a sink that accepts and drops
//! connections, and a client that opens new connections at a fixed rate (or as fast as
//! it can) and resets them, so that every connection is a fresh DNAT decision and no
//! TIME_WAIT limits the rate.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

/// Accepts and drops connections on `port` until killed.
pub fn sink(port: u16, threads: usize) -> anyhow::Result<()> {
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                for stream in listener.incoming() {
                    drop(stream);
                }
            });
        }
    });
    Ok(())
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
