//! Checks what the guest reported (tagged lines from `guest.sh`) against what must be
//! true: every record matches one client's own observation exactly, the offsets observer
//! read equal the C compiler's, observer detached cleanly, and a missing BTF is refused.

use std::collections::BTreeMap;

use serde_json::Value;

/// What the guest's clients were pointed at.
pub struct Expected {
    pub release: String,
    /// `ip:port` of each pod, by pod name (what its server answers).
    pub backends: BTreeMap<String, String>,
    pub client_ip: String,
    /// ClusterIP:port.
    pub service_addr: String,
    pub service: String,
    pub connections: usize,
    /// `path=bytes` as the C compiler laid the kernel's structures out.
    pub offsets: BTreeMap<String, u64>,
}

/// The scenarios `guest.sh` runs, in order.
pub const SCENARIOS: [&str; 2] = ["iptables", "nftables"];

/// One line per failure; empty when everything holds.
pub fn check(report: &str, expected: &Expected) -> Vec<String> {
    let mut failures = Vec::new();
    let tagged = |tag: &str| -> Vec<&str> {
        report
            .lines()
            .filter_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
            .collect()
    };
    if !report.lines().any(|l| l == "DONE") {
        failures.push("the guest did not finish its scenarios".to_owned());
    }
    match tagged("RELEASE").first() {
        Some(release) if *release == expected.release => {}
        other => failures.push(format!(
            "booted kernel {other:?}, expected {}",
            expected.release
        )),
    }
    failures.extend(tagged("FAIL").iter().map(|l| format!("guest: {l}")));
    for scenario in SCENARIOS {
        let lines = |tag: &str| -> Vec<&str> {
            tagged(tag)
                .into_iter()
                .filter_map(|l| l.strip_prefix(scenario)?.strip_prefix(' '))
                .collect()
        };
        let mut fail = |what: String| failures.push(format!("{scenario}: {what}"));
        match lines("EXIT").first() {
            Some(&"0") => {}
            other => fail(format!("observer record exited with {other:?}, expected 0")),
        }
        check_offsets(&lines("STDERR"), expected, &mut fail);
        if !lines("STDERR")
            .iter()
            .any(|l| l.ends_with("net_dev_queue attached as a BTF tracepoint"))
        {
            fail("net_dev_queue was not attached as a BTF tracepoint".to_owned());
        }
        check_records(&lines("CLIENT"), &lines("LOG"), expected, &mut fail);
        check_detach(&lines("PROGS"), &lines("STDERR"), &mut fail);
    }
    match tagged("NOBTF").first() {
        Some(line) if line.starts_with("2 ") && line.contains("CONFIG_DEBUG_INFO_BTF") => {}
        other => failures.push(format!(
            "--btf /nonexistent: expected exit 2 and one sentence naming CONFIG_DEBUG_INFO_BTF, got {other:?}"
        )),
    }
    failures
}

/// `bpftool prog show` counted the programs observer said it attached while it ran, and
/// none of them afterwards; nothing stays pinned.
fn check_detach(progs: &[&str], stderr: &[&str], fail: &mut impl FnMut(String)) {
    let attached: Option<u64> = stderr.iter().find_map(|l| {
        l.strip_prefix("observer: attached ")?
            .split(' ')
            .next()?
            .parse()
            .ok()
    });
    let counts: Vec<u64> = progs
        .first()
        .map(|l| l.split(' ').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default();
    match (attached, counts.as_slice()) {
        (Some(n), [before, during, after, 0])
            if during.checked_sub(*before) == Some(n) && after == before => {}
        _ => fail(format!(
            "not attached and detached cleanly: observer attached {attached:?} programs; bpftool counted before, during, after, pinned objects: {counts:?}"
        )),
    }
}

fn check_offsets(stderr: &[&str], expected: &Expected, fail: &mut impl FnMut(String)) {
    let Some(line) = stderr
        .iter()
        .find_map(|l| l.split_once("kernel offsets from BTF: ").map(|(_, o)| o))
    else {
        return fail("observer logged no offsets".to_owned());
    };
    let read: BTreeMap<&str, u64> = line
        .split_whitespace()
        .filter_map(|pair| {
            let (path, value) = pair.split_once('=')?;
            Some((path, value.parse().ok()?))
        })
        .collect();
    for (path, want) in &expected.offsets {
        match read.get(path.as_str()) {
            Some(got) if got == want => {}
            got => fail(format!(
                "offset {path}: observer read {got:?}, the C compiler says {want}"
            )),
        }
    }
    if read.len() != expected.offsets.len() {
        fail(format!(
            "observer logged {} offsets, the C compiler computed {}",
            read.len(),
            expected.offsets.len()
        ));
    }
}

/// A client's own view of one connection: `i req_bytes resp_bytes body`.
struct Seen {
    sent: u64,
    received: u64,
    backend: String,
}

fn check_records(
    clients: &[&str],
    log: &[&str],
    expected: &Expected,
    fail: &mut impl FnMut(String),
) {
    let mut seen = answered_clients(clients, expected, fail);
    if seen.len() != expected.connections {
        fail(format!(
            "{} clients were answered, expected {}",
            seen.len(),
            expected.connections
        ));
    }
    let records: Vec<Value> = log
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if records.len() != log.len() {
        fail(format!(
            "{} log lines are not JSON",
            log.len() - records.len()
        ));
    }
    let conns: Vec<&Value> = records.iter().filter(|r| r["type"] == "conn").collect();
    if conns.len() != seen.len() {
        fail(format!(
            "{} conn records for {} client connections",
            conns.len(),
            seen.len()
        ));
    }
    for conn in conns {
        let sent = conn["bytes_to_backend"].as_u64().unwrap_or(u64::MAX);
        match seen.remove(&sent) {
            Some(client) => check_conn(conn, &client, expected, fail),
            None => fail(format!("a record matches no client's request size: {conn}")),
        }
    }
    check_summary(&records, expected.connections, fail);
}

/// The clients that got an answer from a known pod, by request size.
fn answered_clients(
    clients: &[&str],
    expected: &Expected,
    fail: &mut impl FnMut(String),
) -> BTreeMap<u64, Seen> {
    let mut seen = BTreeMap::new();
    for line in clients {
        let fields: Vec<&str> = line.split(' ').collect();
        let parsed = match fields.as_slice() {
            [_, sent, received, body] => (|| {
                Some(Seen {
                    sent: sent.parse().ok()?,
                    received: received.parse().ok()?,
                    backend: expected.backends.get(*body)?.clone(),
                })
            })(),
            _ => None,
        };
        match parsed {
            Some(s) => drop(seen.insert(s.sent, s)),
            None => fail(format!("client got no answer from a known pod: {line}")),
        }
    }
    seen
}

/// Checks one conn record against the client connection it belongs to.
fn check_conn(conn: &Value, client: &Seen, expected: &Expected, fail: &mut impl FnMut(String)) {
    let port = conn["client"]
        .as_str()
        .and_then(|c| c.strip_prefix(&format!("{}:", expected.client_ip)));
    let checks: [(&str, bool); 10] = [
        ("proto", conn["proto"] == "tcp"),
        ("client", port.is_some_and(|p| p.parse::<u16>().is_ok())),
        (
            "original_dst",
            conn["original_dst"] == expected.service_addr.as_str(),
        ),
        ("backend", conn["backend"] == client.backend.as_str()),
        ("service", conn["service"] == expected.service.as_str()),
        ("endpoint_in_rules", conn["endpoint_in_rules"] == true),
        ("requests", conn["requests"] == 1),
        (
            "bytes_from_backend",
            conn["bytes_from_backend"] == client.received,
        ),
        ("close", conn["close"] == "fin" && conn["end"].is_string()),
        ("start_seen", conn["start_seen"] == true),
    ];
    for (field, ok) in checks {
        if !ok {
            fail(format!(
                "{field} wrong for the connection that sent {} bytes to {} and got {}: {conn}",
                client.sent, client.backend, client.received
            ));
        }
    }
}

/// The summary record counts every connection and DNAT event, with nothing lost.
fn check_summary(records: &[Value], n: usize, fail: &mut impl FnMut(String)) {
    let summary = records.iter().find(|r| r["type"] == "summary");
    match summary {
        Some(s)
            if s["connections"] == n
                && s["dnat_events"] == n
                && s["lost_events"] == 0
                && s["read_errors"] == 0 => {}
        other => fail(format!(
            "summary should count {n} connections and DNAT events, nothing lost or failed: {other:?}"
        )),
    }
}

#[cfg(test)]
mod tests;
