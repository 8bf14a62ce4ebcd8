//! The connection line written directly into a buffer, byte for byte what serde_json
//! writes for `record::LogLine::Conn` (tested against it): serde_json escapes every key
//! and formats addresses and times through `fmt`, which was most of a connection's CPU.
//! Only names that need escaping and the duration still go through serde_json.
//!
//! Pieces of varying length are appended as fixed-size blocks cut back to their length
//! (digits), or as one literal per match arm: a copy of unknown length is a `memcpy`
//! call, which in the static musl build is a `rep movsq` with a start-up cost of its
//! own, and a line had some thirty of them.

use std::io::Write as _;
use std::net::SocketAddr;

use chrono::{DateTime, Utc};

use crate::model::record::{
    Close, ConnRecord, FrontendKind, Proto, TIME_LEN, TrafficPolicy, format_time, write_time,
};

/// Writes connection lines, remembering the last second's date and time text.
#[derive(Default)]
pub struct ConnLine {
    /// The Unix second and its `2026-08-06T13:46:36.` prefix.
    second: Option<(i64, [u8; SECOND_PREFIX])>,
}

/// `2026-08-06T13:46:36.`
const SECOND_PREFIX: usize = 20;

impl ConnLine {
    /// Appends `record`'s line, without the newline, to `out`.
    pub fn write(&mut self, out: &mut Vec<u8>, record: &ConnRecord) -> serde_json::Result<()> {
        out.extend_from_slice(br#"{"type":"conn","proto":""#);
        match record.proto {
            Proto::Tcp => out.extend_from_slice(b"tcp"),
            Proto::Udp => out.extend_from_slice(b"udp"),
        }
        out.extend_from_slice(br#"","client":"#);
        write_addr(out, &record.client)?;
        out.extend_from_slice(br#","client_pod":"#);
        write_name(out, record.client_pod.as_deref())?;
        out.extend_from_slice(br#","original_dst":"#);
        write_addr(out, &record.original_dst)?;
        out.extend_from_slice(br#","backend":"#);
        write_addr(out, &record.backend)?;
        out.extend_from_slice(br#","backend_pod":"#);
        write_name(out, record.backend_pod.as_deref())?;
        out.extend_from_slice(br#","service":"#);
        write_name(out, record.service.as_deref())?;
        out.extend_from_slice(br#","frontend":"#);
        match record.frontend {
            Some(FrontendKind::ClusterIp) => out.extend_from_slice(br#""cluster_ip""#),
            Some(FrontendKind::NodePort) => out.extend_from_slice(br#""node_port""#),
            Some(FrontendKind::ExternalIp) => out.extend_from_slice(br#""external_ip""#),
            Some(FrontendKind::LoadBalancer) => out.extend_from_slice(br#""load_balancer""#),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","endpoint_in_rules":"#);
        match record.endpoint_in_rules {
            None => out.extend_from_slice(b"null"),
            Some(true) => out.extend_from_slice(b"true"),
            Some(false) => out.extend_from_slice(b"false"),
        }
        match record.policy {
            None => {}
            Some(TrafficPolicy::Cluster) => out.extend_from_slice(br#","policy":"cluster""#),
            Some(TrafficPolicy::Local) => out.extend_from_slice(br#","policy":"local""#),
        }
        match record.same_node {
            None => {}
            Some(true) => out.extend_from_slice(br#","same_node":true"#),
            Some(false) => out.extend_from_slice(br#","same_node":false"#),
        }
        out.extend_from_slice(br#","netns":"#);
        put_decimal(out, record.netns.into());
        out.extend_from_slice(br#","start":"#);
        self.write_time(out, &record.start);
        out.extend_from_slice(br#","end":"#);
        match &record.end {
            Some(end) => self.write_time(out, end),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","duration_ms":"#);
        serde_json::to_writer(&mut *out, &record.duration_ms)?;
        out.extend_from_slice(br#","requests":"#);
        put_decimal(out, record.requests);
        out.extend_from_slice(br#","bytes_to_backend":"#);
        put_decimal(out, record.bytes_to_backend);
        out.extend_from_slice(br#","bytes_from_backend":"#);
        put_decimal(out, record.bytes_from_backend);
        out.extend_from_slice(br#","close":""#);
        match record.close {
            Close::Fin => out.extend_from_slice(b"fin"),
            Close::Rst => out.extend_from_slice(b"rst"),
            Close::Timeout => out.extend_from_slice(b"timeout"),
            Close::Expired => out.extend_from_slice(b"expired"),
            Close::Open => out.extend_from_slice(b"open"),
            Close::Refused => out.extend_from_slice(b"refused"),
            Close::Unanswered => out.extend_from_slice(b"unanswered"),
        }
        out.extend_from_slice(br#"","connect_ms":"#);
        match record.connect_ms {
            Some(ms) => serde_json::to_writer(&mut *out, &ms)?,
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","start_seen":"#);
        if record.start_seen {
            out.extend_from_slice(b"true");
        } else {
            out.extend_from_slice(b"false");
        }
        out.push(b'}');
        Ok(())
    }

    /// A time as `record::format_time` writes it, quoted.
    fn write_time(&mut self, out: &mut Vec<u8>, time: &DateTime<Utc>) {
        let second = time.timestamp();
        let prefix = match self.second {
            Some((cached, prefix)) if cached == second => Some(prefix),
            _ => {
                let mut text = [0; TIME_LEN];
                let written = write_time(time, &mut text).is_some();
                let prefix = written.then(|| {
                    let mut prefix = [0; SECOND_PREFIX];
                    prefix.copy_from_slice(&text[..SECOND_PREFIX]);
                    prefix
                });
                self.second = prefix.map(|prefix| (second, prefix));
                prefix
            }
        };
        // Leap seconds and years chrono writes differently have no cached prefix.
        let micros = time.timestamp_subsec_nanos() / 1000;
        match prefix {
            Some(prefix) if micros < 1_000_000 => {
                out.push(b'"');
                out.extend_from_slice(&prefix);
                let mut digits = [b'0'; 6];
                let mut value = micros;
                for digit in digits.iter_mut().rev() {
                    *digit = b'0' + (value % 10) as u8;
                    value /= 10;
                }
                out.extend_from_slice(&digits);
                out.extend_from_slice(b"Z\"");
            }
            _ => {
                let _ = write!(out, "\"{}\"", format_time(time));
            }
        }
    }
}

/// A name as serde_json writes an `Option<String>`: quoted, or `null`. A name with
/// nothing to escape (every Kubernetes name) is copied as is.
fn write_name(out: &mut Vec<u8>, name: Option<&str>) -> serde_json::Result<()> {
    let Some(name) = name else {
        out.extend_from_slice(b"null");
        return Ok(());
    };
    if name
        .bytes()
        .any(|byte| byte < 0x20 || byte == b'"' || byte == b'\\')
    {
        return serde_json::to_writer(out, name);
    }
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.push(b'"');
    Ok(())
}

/// A socket address as serde writes it (`"10.244.1.9:45364"`, `"[fd00::1]:80"`).
fn write_addr(out: &mut Vec<u8>, addr: &SocketAddr) -> serde_json::Result<()> {
    let SocketAddr::V4(v4) = addr else {
        return serde_json::to_writer(out, addr);
    };
    // `"255.255.255.255:65535"` is 23 bytes.
    let mut text = [0; 24];
    text[0] = b'"';
    let mut at = 1;
    for (index, octet) in v4.ip().octets().into_iter().enumerate() {
        if index > 0 {
            text[at] = b'.';
            at += 1;
        }
        at += decimal_into(&mut text[at..], octet.into());
    }
    text[at] = b':';
    at += 1;
    at += decimal_into(&mut text[at..], v4.port().into());
    text[at] = b'"';
    put_prefix(out, &text, at + 1);
    Ok(())
}

/// Appends `value` in decimal.
fn put_decimal(out: &mut Vec<u8>, value: u64) {
    let mut digits = [0; 20];
    let len = decimal_into(&mut digits, value);
    put_prefix(out, &digits, len);
}

/// Writes `value` in decimal at the start of `text` (long enough: 20 bytes hold any
/// u64); returns its length.
fn decimal_into(text: &mut [u8], value: u64) -> usize {
    let mut len = 1;
    let mut rest = value / 10;
    while rest > 0 {
        len += 1;
        rest /= 10;
    }
    let mut value = value;
    for digit in text[..len].iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
    len
}

/// Appends the first `len` bytes of `block`: the whole block (a copy of known size),
/// then cut back.
fn put_prefix<const N: usize>(out: &mut Vec<u8>, block: &[u8; N], len: usize) {
    let end = out.len() + len;
    out.extend_from_slice(block);
    out.truncate(end);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::{LogLine, Recording};

    fn serde_line(record: &ConnRecord) -> String {
        serde_json::to_string(&LogLine::Conn(record.clone())).unwrap()
    }

    fn line(writer: &mut ConnLine, record: &ConnRecord) -> String {
        let mut out = Vec::new();
        writer.write(&mut out, record).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Every field's forms, written as serde_json writes them.
    #[test]
    fn writes_what_serde_json_writes() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logs/mixed.jsonl"
        ))
        .unwrap();
        let conns = Recording::parse("mixed.jsonl", &text).unwrap().conns;
        let mut record = conns[0].clone();
        let mut writer = ConnLine::default();
        for conn in &conns {
            assert_eq!(line(&mut writer, conn), serde_line(conn));
        }
        let addrs = [
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.96.0.10:53",
            "[fd00::1]:80",
        ];
        let times = [
            "2026-08-06T13:46:36.412345Z",
            "2026-08-06T13:46:36.000000999Z",
            "2026-08-06T13:46:37Z",
            "1970-01-01T00:00:00Z",
            "+10000-01-01T00:00:00Z",
        ];
        let services = [None, Some("shop/a \"quoted\" \\ name\u{1}:é".into())];
        let floats = [0.0, 4087.655, 1e-7, 1e21, f64::NAN];
        for (index, addr) in addrs.iter().enumerate() {
            record.client = addr.parse().unwrap();
            record.backend = addrs[addrs.len() - 1 - index].parse().unwrap();
            record.service = services[index % 2].clone();
            record.endpoint_in_rules = [None, Some(true), Some(false)][index % 3];
            record.policy = [
                None,
                Some(TrafficPolicy::Local),
                Some(TrafficPolicy::Cluster),
            ][index % 3];
            record.same_node = [Some(true), None, Some(false)][index % 3];
            record.proto = [Proto::Tcp, Proto::Udp][index % 2];
            record.start_seen = index % 2 == 0;
            record.requests = u64::MAX >> index;
            record.bytes_to_backend = index as u64;
            for (at, time) in times.iter().enumerate() {
                record.start = time.parse().unwrap();
                record.end = (at % 2 == 0).then(|| times[(at + 1) % times.len()].parse().unwrap());
                record.duration_ms = floats[at];
                for close in [
                    Close::Fin,
                    Close::Rst,
                    Close::Timeout,
                    Close::Expired,
                    Close::Open,
                    Close::Refused,
                    Close::Unanswered,
                ] {
                    record.close = close;
                    for connect_ms in [None, Some(0.0), Some(20.412), Some(1e-7)] {
                        record.connect_ms = connect_ms;
                        assert_eq!(line(&mut writer, &record), serde_line(&record));
                    }
                }
            }
        }
        // Names: plain ones are copied, anything serde_json escapes is left to it.
        let names = [
            "",
            "checkout-b",
            "shop/checkout:http",
            "a\"b",
            "a\\b",
            "tab\tx",
            "\u{1f}",
            "del\u{7f}",
            "é/ü",
            "x\u{2028}y",
        ];
        let frontends = [
            None,
            Some(FrontendKind::ClusterIp),
            Some(FrontendKind::NodePort),
            Some(FrontendKind::ExternalIp),
            Some(FrontendKind::LoadBalancer),
        ];
        for (index, name) in names.iter().enumerate() {
            record.service = Some((*name).into());
            record.client_pod = (index % 2 == 0).then(|| (*name).into());
            record.backend_pod = Some(names[names.len() - 1 - index].into());
            record.frontend = frontends[index % frontends.len()];
            assert_eq!(line(&mut writer, &record), serde_line(&record));
        }
        // Every decimal length, and its edges.
        for digits in 0..20 {
            let power = 10u64.pow(digits);
            for value in [power - 1, power, power + 1, power.saturating_mul(9)] {
                record.requests = value;
                record.netns = value as u32;
                assert_eq!(line(&mut writer, &record), serde_line(&record));
            }
        }
        record.requests = u64::MAX;
        assert_eq!(line(&mut writer, &record), serde_line(&record));
        let leap = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
            .unwrap()
            .and_utc();
        record.start = leap;
        assert_eq!(line(&mut writer, &record), serde_line(&record));
    }
}
