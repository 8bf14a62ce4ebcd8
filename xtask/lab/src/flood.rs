//! Floods from a lab pod, as a hostile pod sends them through a Service: DNS queries to
//! port 53 from a few sockets (many messages, few connections), and UDP datagrams or TCP
//! SYNs each from another client port (a new conntrack entry, so a DNAT decision, per
//! packet until the ports wrap; what `hping3 --flood` sends). Sent by threads of this
//! process that enter the pod's network namespace, as fast as they go, each counting
//! what it sent; a DNS flood also counts the responses that came back.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, sendto, socket,
};

use crate::Lab;

/// What a flood sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloodKind {
    /// DNS queries (A, RD set, ids counting up) from `DNS_SOCKETS` UDP sockets per thread:
    /// one conntrack entry per socket, one DNS message per datagram.
    Dns,
    /// UDP datagrams of 8 bytes, each from the next client port.
    UdpFlows,
    /// TCP SYNs, each from the next client port (a raw socket: the pod's kernel answers
    /// the SYN-ACKs with RSTs, as it has no socket for them).
    Syns,
}

/// What a flood sent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FloodReport {
    /// Datagrams or SYNs the pod's kernel accepted (`send` succeeded).
    pub sent: u64,
    /// DNS: responses that reached the flooding sockets (read while sending, and for
    /// `LATE_RESPONSES` after).
    pub received: u64,
    pub seconds: f64,
}

impl FloodReport {
    /// Packets sent per second.
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.seconds
    }
}

/// UDP sockets per DNS flood thread.
const DNS_SOCKETS: usize = 16;
/// Datagrams sent between two reads of the responses.
const BURST: u64 = 64;
/// How long a DNS flood keeps reading responses after it stopped sending.
const LATE_RESPONSES: Duration = Duration::from_millis(500);
/// The longest a flood lasts.
const LONGEST: Duration = Duration::from_secs(120);
/// The client ports the UDP and SYN floods cycle through (each thread its own share).
const PORTS: std::ops::Range<u32> = 1024..65536;
/// The name the DNS flood asks for (the lab's DNS server answers NXDOMAIN).
const FLOOD_NAME: &str = "flood.hostile.svc.cluster.local";

impl Lab {
    /// Floods `target` from pod `pod`'s network namespace with `threads` threads, as
    /// fast as they go, until `stop` is set (or for `LONGEST` at most, so that a test
    /// that never sets it still ends).
    pub fn flood(
        &self,
        pod: &str,
        kind: FloodKind,
        target: SocketAddrV4,
        threads: usize,
        stop: &AtomicBool,
    ) -> anyhow::Result<FloodReport> {
        let Some(pod) = self.pods.iter().find(|p| p.name == pod) else {
            bail!("the lab has no pod {pod}");
        };
        let netns = std::fs::File::open(format!("/run/netns/{}", pod.ns))
            .with_context(|| format!("cannot open the network namespace of pod {}", pod.name))?;
        let threads = threads.max(1);
        let start = Instant::now();
        let until = Until {
            stop,
            deadline: start + LONGEST,
        };
        let reports = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|thread| {
                    let (netns, until) = (&netns, &until);
                    scope.spawn(move || -> anyhow::Result<FloodReport> {
                        // Only this thread enters the pod's namespace; it ends with the flood.
                        nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET)
                            .context("cannot enter the pod's network namespace")?;
                        match kind {
                            FloodKind::Dns => dns_flood(target, until),
                            FloodKind::UdpFlows | FloodKind::Syns => {
                                raw_flood(kind, pod.ip, target, until, thread, threads)
                            }
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| {
                    worker
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a flood thread panicked")))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        Ok(FloodReport {
            sent: reports.iter().map(|r| r.sent).sum(),
            received: reports.iter().map(|r| r.received).sum(),
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

/// When a flood ends: when told to, or at its deadline.
struct Until<'a> {
    stop: &'a AtomicBool,
    deadline: Instant,
}

impl Until<'_> {
    fn reached(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// Sends DNS queries round the sockets until told to stop, reading responses after every
/// burst, then for `LATE_RESPONSES`.
fn dns_flood(target: SocketAddrV4, until: &Until<'_>) -> anyhow::Result<FloodReport> {
    let sockets = (0..DNS_SOCKETS)
        .map(|_| {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            socket.connect(target)?;
            socket.set_nonblocking(true)?;
            Ok(socket)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .context("cannot open the DNS flood's sockets")?;
    let mut report = FloodReport::default();
    let mut query = dns_query(0, FLOOD_NAME);
    let mut attempts: u64 = 0;
    while !until.reached() {
        for _ in 0..BURST {
            query[..2].copy_from_slice(&(attempts as u16).to_be_bytes());
            let socket = &sockets[attempts as usize % sockets.len()];
            attempts += 1;
            if socket.send(&query).is_ok() {
                report.sent += 1;
            }
        }
        report.received += read_responses(&sockets);
    }
    let late = Instant::now() + LATE_RESPONSES;
    while Instant::now() < late {
        report.received += read_responses(&sockets);
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(report)
}

/// Reads every response waiting on `sockets`; returns how many there were.
fn read_responses(sockets: &[UdpSocket]) -> u64 {
    let mut buf = [0u8; 512];
    let mut count = 0;
    for socket in sockets {
        while socket.recv(&mut buf).is_ok() {
            count += 1;
        }
    }
    count
}

/// A DNS query (RFC 1035 4.1) for the A record of `name`, recursion desired.
fn dns_query(id: u16, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    // RD; one question, no records.
    out.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|label| !label.is_empty()) {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    // The root label, QTYPE A, QCLASS IN.
    out.extend_from_slice(&[0, 0, 1, 0, 1]);
    out
}

/// Sends UDP datagrams or SYNs from `source`, each from this thread's next client port,
/// through a raw socket until told to stop.
fn raw_flood(
    kind: FloodKind,
    source: Ipv4Addr,
    target: SocketAddrV4,
    until: &Until<'_>,
    thread: usize,
    threads: usize,
) -> anyhow::Result<FloodReport> {
    // IPPROTO_RAW: the program writes the IP header (IP_HDRINCL).
    let socket: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Raw,
    )
    .context("cannot open a raw socket")?;
    let destination = SockaddrIn::from(target);
    let span = PORTS.end - PORTS.start;
    let mut report = FloodReport::default();
    let mut n: u32 = 0;
    while !until.reached() {
        for _ in 0..BURST {
            let port = (PORTS.start
                + n.wrapping_mul(threads as u32).wrapping_add(thread as u32) % span)
                as u16;
            n = n.wrapping_add(1);
            let packet = match kind {
                FloodKind::Syns => syn(source, port, target, n.wrapping_mul(2_654_435_761)),
                _ => udp(source, port, target),
            };
            if sendto(socket.as_raw_fd(), &packet, &destination, MsgFlags::empty()).is_ok() {
                report.sent += 1;
            }
        }
    }
    Ok(report)
}

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// An IPv4 header of a packet with `payload` bytes after it (the kernel fills in the
/// checksum, and the id where it is 0).
fn ipv4_header(protocol: u8, source: Ipv4Addr, target: Ipv4Addr, payload: usize) -> [u8; 20] {
    let mut header = [0u8; 20];
    header[0] = 0x45;
    header[2..4].copy_from_slice(&((20 + payload) as u16).to_be_bytes());
    header[8] = 64;
    header[9] = protocol;
    header[12..16].copy_from_slice(&source.octets());
    header[16..20].copy_from_slice(&target.octets());
    header
}

/// A UDP datagram of 8 payload bytes from `source:port` to `target` (checksum 0: none,
/// which IPv4 allows).
fn udp(source: Ipv4Addr, port: u16, target: SocketAddrV4) -> Vec<u8> {
    let mut packet = ipv4_header(IPPROTO_UDP, source, *target.ip(), 16).to_vec();
    packet.extend_from_slice(&port.to_be_bytes());
    packet.extend_from_slice(&target.port().to_be_bytes());
    packet.extend_from_slice(&16u16.to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(b"flooding");
    packet
}

/// A TCP SYN from `source:port` to `target` with initial sequence number `isn`.
fn syn(source: Ipv4Addr, port: u16, target: SocketAddrV4, isn: u32) -> Vec<u8> {
    let mut segment = Vec::with_capacity(20);
    segment.extend_from_slice(&port.to_be_bytes());
    segment.extend_from_slice(&target.port().to_be_bytes());
    segment.extend_from_slice(&isn.to_be_bytes());
    segment.extend_from_slice(&0u32.to_be_bytes());
    // Data offset 5 words; SYN; window 64240; checksum (below); no urgent pointer.
    segment.extend_from_slice(&[0x50, 0x02, 0xfa, 0xf0, 0, 0, 0, 0]);
    let checksum = tcp_checksum(source, *target.ip(), &segment);
    segment[16..18].copy_from_slice(&checksum.to_be_bytes());
    let mut packet = ipv4_header(IPPROTO_TCP, source, *target.ip(), segment.len()).to_vec();
    packet.extend_from_slice(&segment);
    packet
}

/// The TCP checksum of `segment` (its checksum field zero) over the IPv4 pseudo-header
/// (RFC 793 3.1).
fn tcp_checksum(source: Ipv4Addr, target: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(12 + segment.len());
    pseudo.extend_from_slice(&source.octets());
    pseudo.extend_from_slice(&target.octets());
    pseudo.extend_from_slice(&[0, IPPROTO_TCP]);
    pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(segment);
    internet_checksum(&pseudo)
}

/// RFC 1071: the ones' complement of the ones' complement sum of 16-bit words.
fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dns_query_is_what_a_resolver_sends() {
        assert_eq!(
            dns_query(0x1234, "a.bc"),
            [
                0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 2, b'b', b'c', 0, 0, 1, 0,
                1
            ]
        );
    }

    #[test]
    fn the_checksum_is_rfc_1071s() {
        // RFC 1071 section 3's example: the sum of these words is 0xddf2.
        assert_eq!(
            internet_checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
        // A segment whose checksum is filled in sums to 0xffff with its pseudo-header.
        let source = Ipv4Addr::new(10, 244, 1, 20);
        let target = SocketAddrV4::new(Ipv4Addr::new(10, 96, 1, 1), 80);
        let packet = syn(source, 40000, target, 7);
        assert_eq!(packet.len(), 40);
        assert_eq!(tcp_checksum(source, *target.ip(), &packet[20..]), 0);
        assert_eq!(&packet[20..22], &40000u16.to_be_bytes());
        assert_eq!(packet[33], 0x02, "SYN only");
        assert_eq!(&packet[2..4], &40u16.to_be_bytes());
    }

    #[test]
    fn a_udp_datagram_carries_its_length() {
        let packet = udp(
            Ipv4Addr::new(10, 244, 1, 20),
            1024,
            SocketAddrV4::new(Ipv4Addr::new(10, 96, 1, 1), 5353),
        );
        assert_eq!(packet.len(), 36);
        assert_eq!(packet[9], IPPROTO_UDP);
        assert_eq!(&packet[22..24], &5353u16.to_be_bytes());
        assert_eq!(&packet[24..26], &16u16.to_be_bytes());
    }
}
