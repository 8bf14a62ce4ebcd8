//! `conntrack -E -e NEW` in a namespace: the kernel's own record of which backend each new
//! connection was DNATed to, used as ground truth.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::sys::{in_netns, ip_and_conntrack, run};

/// One new conntrack entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtEvent {
    /// "tcp" or "udp".
    pub proto: String,
    /// Original source: the client's address and port.
    pub client: SocketAddrV4,
    /// Original destination: what the client dialed (ClusterIP:port, node IP:NodePort).
    pub original_dst: SocketAddrV4,
    /// Reply source: the backend the connection was DNATed to.
    pub backend: SocketAddrV4,
}

/// A `conntrack -E` line that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("conntrack event lacks `{field}`: {line}")]
    Missing { field: &'static str, line: String },
    #[error("conntrack event has a bad `{field}` value: {line}")]
    Bad { field: &'static str, line: String },
}

/// Parses one line of `conntrack -E` (plain or `-o extended`). Protocols other than TCP
/// and UDP give `None`.
pub fn parse_event(line: &str) -> Result<Option<CtEvent>, ParseError> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let Some(proto) = tokens
        .iter()
        .find(|t| **t == "tcp" || **t == "udp" || **t == "icmp")
    else {
        return Ok(None);
    };
    if *proto == "icmp" {
        return Ok(None);
    }
    // The first src/dst/sport/dport are the original tuple, the second the reply tuple.
    let values = |key: &str| -> Vec<&str> {
        tokens
            .iter()
            .filter_map(|t| t.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .collect()
    };
    let pick = |key: &'static str, nth: usize| -> Result<&str, ParseError> {
        values(key)
            .get(nth)
            .copied()
            .ok_or_else(|| ParseError::Missing {
                field: key,
                line: line.to_string(),
            })
    };
    let ip = |key: &'static str, nth: usize| -> Result<Ipv4Addr, ParseError> {
        pick(key, nth)?.parse().map_err(|_| ParseError::Bad {
            field: key,
            line: line.to_string(),
        })
    };
    let port = |key: &'static str, nth: usize| -> Result<u16, ParseError> {
        pick(key, nth)?.parse().map_err(|_| ParseError::Bad {
            field: key,
            line: line.to_string(),
        })
    };
    Ok(Some(CtEvent {
        proto: proto.to_string(),
        client: SocketAddrV4::new(ip("src", 0)?, port("sport", 0)?),
        original_dst: SocketAddrV4::new(ip("dst", 0)?, port("dport", 0)?),
        backend: SocketAddrV4::new(ip("src", 1)?, port("sport", 1)?),
    }))
}

/// Marker entries bracket a watch: loopback-only tuples, never sent as packets.
const MARKER_SRC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 250);
const MARKER_DST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 251);
static NEXT_MARKER_PORT: AtomicU16 = AtomicU16::new(40000);

/// `conntrack -E -e NEW -o extended` running in a namespace.
///
/// `start` returns once the watch provably sees events (a marker entry it inserts shows
/// up) and `stop` once every event before it was read (a second marker), so nothing that
/// happened in between is missed.
pub struct ConntrackWatch {
    ip: PathBuf,
    conntrack: PathBuf,
    netns: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: JoinHandle<()>,
    start_line: usize,
}

impl ConntrackWatch {
    pub fn start(netns: &str) -> anyhow::Result<Self> {
        let (ip, conntrack) = ip_and_conntrack()?;
        let mut child = in_netns(&ip, netns, &conntrack)
            .args(["-E", "-e", "NEW", "-f", "ipv4", "-o", "extended"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("could not start conntrack -E in {netns}"))?;
        let stdout = child.stdout.take().context("conntrack has no stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let mut watch = ConntrackWatch {
            ip,
            conntrack,
            netns: netns.to_string(),
            child,
            lines,
            reader,
            start_line: 0,
        };
        match watch.mark() {
            Ok(after) => {
                watch.start_line = after;
                Ok(watch)
            }
            Err(e) => {
                let _ = watch.child.kill();
                let _ = watch.child.wait();
                Err(e)
            }
        }
    }

    /// Inserts a marker entry until the watch reports it; returns the line count after it.
    fn mark(&mut self) -> anyhow::Result<usize> {
        let port = NEXT_MARKER_PORT.fetch_add(1, Ordering::Relaxed);
        let needle = format!("src={MARKER_SRC} dst={MARKER_DST} sport={port} dport={port}");
        let entry = |op: &str| {
            let mut cmd = in_netns(&self.ip, &self.netns, &self.conntrack);
            cmd.args([
                op,
                "-p",
                "udp",
                "-s",
                &MARKER_SRC.to_string(),
                "-d",
                &MARKER_DST.to_string(),
            ])
            .args(["--sport", &port.to_string(), "--dport", &port.to_string()]);
            if op == "-I" {
                cmd.args(["-t", "10"]);
            }
            cmd
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            run(&mut entry("-I")).context("could not insert a conntrack marker entry")?;
            let seen_by = Instant::now() + Duration::from_millis(200);
            while Instant::now() < seen_by {
                let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(i) = lines.iter().position(|l| l.contains(&needle)) {
                    drop(lines);
                    run(&mut entry("-D")).context("could not delete a conntrack marker entry")?;
                    return Ok(i + 1);
                }
                drop(lines);
                std::thread::sleep(Duration::from_millis(5));
            }
            run(&mut entry("-D")).context("could not delete a conntrack marker entry")?;
            if let Some(status) = self.child.try_wait()? {
                bail!("conntrack -E in {} exited ({status})", self.netns);
            }
            if Instant::now() > deadline {
                bail!("conntrack -E in {} showed no events within 5 s", self.netns);
            }
        }
    }

    /// Stops the watch and returns the TCP and UDP entries created since `start`.
    pub fn stop(mut self) -> anyhow::Result<Vec<CtEvent>> {
        let end = self.mark();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.reader.join();
        let end = end?;
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let mut events = Vec::new();
        for line in &lines[self.start_line..end] {
            if line.contains(&format!("src={MARKER_SRC} dst={MARKER_DST}")) {
                continue;
            }
            if let Some(ev) = parse_event(line)? {
                events.push(ev);
            }
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_extended_tcp_event() {
        let line = "    [NEW] ipv4     2 tcp      6 120 SYN_SENT src=10.244.1.9 dst=10.96.35.226 sport=40312 dport=80 [UNREPLIED] src=10.244.1.13 dst=10.244.1.9 sport=8080 dport=40312 mark=0 use=1";
        assert_eq!(
            parse_event(line).unwrap(),
            Some(CtEvent {
                proto: "tcp".into(),
                client: "10.244.1.9:40312".parse().unwrap(),
                original_dst: "10.96.35.226:80".parse().unwrap(),
                backend: "10.244.1.13:8080".parse().unwrap(),
            })
        );
    }

    #[test]
    fn parses_plain_udp_event_with_masquerade() {
        let line = "    [NEW] udp      17 30 src=10.244.1.9 dst=10.96.0.10 sport=51000 dport=53 [UNREPLIED] src=10.244.1.21 dst=10.244.1.1 sport=5353 dport=51000";
        let ev = parse_event(line).unwrap().unwrap();
        assert_eq!(ev.proto, "udp");
        assert_eq!(ev.backend, "10.244.1.21:5353".parse().unwrap());
        assert_eq!(ev.client, "10.244.1.9:51000".parse().unwrap());
    }

    #[test]
    fn other_protocols_are_skipped_and_broken_lines_are_errors() {
        let icmp = "    [NEW] icmp     1 30 src=10.244.1.9 dst=10.244.1.1 type=8 code=0 id=7 [UNREPLIED] src=10.244.1.1 dst=10.244.1.9 type=0 code=0 id=7";
        assert_eq!(parse_event(icmp).unwrap(), None);
        assert_eq!(
            parse_event("conntrack v1.4.7: 3 flow events").unwrap(),
            None
        );
        let cut =
            "    [NEW] tcp      6 120 SYN_SENT src=10.244.1.9 dst=10.96.35.226 sport=1 dport=80";
        assert_eq!(
            parse_event(cut),
            Err(ParseError::Missing {
                field: "src",
                line: cut.to_string()
            })
        );
        let bad = "    [NEW] tcp      6 120 SYN_SENT src=10.244.1.9 dst=10.96.35.226 sport=x dport=80 src=1.2.3.4 dst=1.2.3.5 sport=1 dport=2";
        assert_eq!(
            parse_event(bad),
            Err(ParseError::Bad {
                field: "sport",
                line: bad.to_string()
            })
        );
    }
}
