//! Checks what the guest reported (tagged lines from `guest.sh`) against what must be
//! true: every record matches one client's own observation exactly (the connection opened
//! before observer too: adopted, counted from observer's start), the offsets observer read
//! equal the C compiler's, observer detached cleanly, a missing BTF is refused, and a
//! kernel without conntrack's netlink interface gets the one sentence that says so.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::Value;

/// One Service port the guest's clients dial.
pub struct ServicePort {
    /// `ns/name:port`.
    pub name: String,
    /// ClusterIP:port.
    pub addr: String,
    /// The pods' port.
    pub target_port: u16,
}

impl ServicePort {
    fn backend(&self, pod: Ipv4Addr) -> String {
        format!("{pod}:{}", self.target_port)
    }
}

/// What the guest's clients were pointed at.
pub struct Expected {
    pub release: String,
    /// Each pod's address by name (what its servers answer).
    pub pods: BTreeMap<String, Ipv4Addr>,
    pub client_ip: String,
    /// The HTTP port: a connection per request.
    pub http: ServicePort,
    /// The line port: the connection opened before observer.
    pub lines: ServicePort,
    /// HTTP connections per scenario.
    pub connections: usize,
    /// Lines the connection opened before observer carries after observer attached.
    pub held_lines: usize,
    /// `path=bytes` as the C compiler laid the kernel's structures out.
    pub offsets: BTreeMap<String, u64>,
}

/// The scenarios `guest.sh` runs with conntrack's netlink interface, in order.
pub const SCENARIOS: [&str; 2] = ["iptables", "nftables"];

/// The run of `observer record` before `nf_conntrack_netlink` is loaded.
pub const WITHOUT_CTNETLINK: &str = "without-ctnetlink";

/// The run of `observer record` with an nftables flowtable on the node.
pub const FLOWTABLE: &str = "flowtable";

/// The warning it must print once: the guest's flowtable, named with its device.
const FLOWTABLE_SAID: &str = "has nftables flowtable inet fast/ft on v-client: ";

/// What observer says without conntrack's netlink interface (observer's
/// `conntrack::NETLINK_MISSING`, as a user reads it).
const NETLINK_MISSING: &str = "observer: warning: conntrack's netlink interface is missing (module nf_conntrack_netlink is not loaded): observer cannot adopt connections that began before it";

/// What observer logs at debug level once its revalidation program loaded (observer's
/// `kernel::attach::REVALIDATION_LOADED`): a program it loads and runs but attaches to
/// nothing, which bpftool counts too.
const REVALIDATION_LOADED: &str = "the revalidation program loaded (run, not attached)";

/// One line per failure; empty when everything holds.
pub fn check(report: &str, expected: &Expected) -> Vec<String> {
    let mut failures = Vec::new();
    let tagged = |tag: &str| -> Vec<&str> {
        report
            .lines()
            .filter_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
            .collect()
    };
    let of = |tag: &str, scenario: &str| -> Vec<&str> {
        tagged(tag)
            .into_iter()
            .filter_map(|l| l.strip_prefix(scenario)?.strip_prefix(' '))
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
    check_without_ctnetlink(
        &of("EXIT", WITHOUT_CTNETLINK),
        &of("STDERR", WITHOUT_CTNETLINK),
        &mut |what| failures.push(format!("{WITHOUT_CTNETLINK}: {what}")),
    );
    for scenario in SCENARIOS {
        let lines = |tag: &str| of(tag, scenario);
        let mut fail = |what: String| failures.push(format!("{scenario}: {what}"));
        match lines("EXIT").first() {
            Some(&"0") => {}
            other => fail(format!("observer record exited with {other:?}, expected 0")),
        }
        let stderr = lines("STDERR");
        check_offsets(&stderr, expected, &mut fail);
        // `--hook auto`: the netfilter hooks from Linux 6.12, net_dev_queue before.
        let (forwarding, hook) = if netfilter_kernel(&expected.release) {
            (
                "the forwarding program loaded as a netfilter program",
                "the netfilter program was not loaded",
            )
        } else {
            (
                "net_dev_queue attached as a BTF tracepoint",
                "net_dev_queue was not attached as a BTF tracepoint",
            )
        };
        if !stderr.iter().any(|l| l.ends_with(forwarding)) {
            fail(hook.to_owned());
        }
        for warning in stderr
            .iter()
            .filter(|l| l.starts_with("observer: warning:"))
        {
            fail(format!("observer warned: {warning}"));
        }
        check_records(
            &lines("CLIENT"),
            &lines("HELD"),
            &lines("LOG"),
            expected,
            &mut fail,
        );
        check_detach(&lines("PROGS"), &stderr, &mut fail);
    }
    check_flowtable(
        &of("EXIT", FLOWTABLE),
        &of("STDERR", FLOWTABLE),
        &mut |what| failures.push(format!("{FLOWTABLE}: {what}")),
    );
    match tagged("NOBTF").first() {
        Some(line) if line.starts_with("2 ") && line.contains("CONFIG_DEBUG_INFO_BTF") => {}
        other => failures.push(format!(
            "--btf /nonexistent: expected exit 2 and one sentence naming CONFIG_DEBUG_INFO_BTF, got {other:?}"
        )),
    }
    failures
}

/// Without `nf_conntrack_netlink`, observer runs and says so once, in its sentence, and
/// never with the bare errno.
fn check_without_ctnetlink(exit: &[&str], stderr: &[&str], fail: &mut impl FnMut(String)) {
    if exit.first() != Some(&"0") {
        fail(format!(
            "observer record exited with {:?}, expected 0",
            exit.first()
        ));
    }
    let said = stderr
        .iter()
        .filter(|l| l.starts_with(NETLINK_MISSING))
        .count();
    if said != 1 {
        fail(format!(
            "observer said {said} times that conntrack's netlink interface is missing, expected once: {stderr:?}"
        ));
    }
    // Debug lines (`RUST_LOG=debug`) may quote the kernel's own errors, such as the
    // verifier refusing the revalidation program on 5.10.
    if let Some(bare) = stderr
        .iter()
        .find(|l| l.contains("Invalid argument") && !l.contains(" DEBUG "))
    {
        fail(format!("observer printed a bare errno: {bare}"));
    }
}

/// With a flowtable on the node, observer says it once, in a warning naming it (under
/// either hook), and warns about nothing else.
fn check_flowtable(exit: &[&str], stderr: &[&str], fail: &mut impl FnMut(String)) {
    if exit.first() != Some(&"0") {
        fail(format!(
            "observer record exited with {:?}, expected 0",
            exit.first()
        ));
    }
    let warnings: Vec<&&str> = stderr
        .iter()
        .filter(|l| l.starts_with("observer: warning:"))
        .collect();
    let said = warnings
        .iter()
        .filter(|l| l.contains(FLOWTABLE_SAID))
        .count();
    if said != 1 || warnings.len() != 1 {
        fail(format!(
            "expected one warning naming the flowtable ({FLOWTABLE_SAID:?}), got {warnings:?}"
        ));
    }
}

/// `bpftool prog show` counted the programs observer said it attached while it ran
/// (and the revalidation program, loaded but attached to nothing, where observer said it
/// loaded), and none of them afterwards; nothing stays pinned.
fn check_detach(progs: &[&str], stderr: &[&str], fail: &mut impl FnMut(String)) {
    let revalidation = u64::from(stderr.iter().any(|l| l.contains(REVALIDATION_LOADED)));
    let attached: Option<u64> = stderr.iter().find_map(|l| {
        l.strip_prefix("observer: attached ")?
            .split(' ')
            .next()?
            .parse::<u64>()
            .ok()
    });
    let loaded = attached.map(|n| n + revalidation);
    let counts: Vec<u64> = progs
        .first()
        .map(|l| l.split(' ').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default();
    match (attached, counts.as_slice()) {
        (Some(_), [before, during, after, 0])
            if during.checked_sub(*before) == loaded && after == before => {}
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

/// A client's own view of one connection: what it sent and received, and the pod that
/// answered.
struct Seen {
    sent: u64,
    received: u64,
    backend: String,
}

/// What the client of the connection opened before observer saw after observer attached.
struct Held {
    seen: Seen,
    lines: u64,
}

fn check_records(
    clients: &[&str],
    held: &[&str],
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
    let (held_conns, conns): (Vec<&Value>, Vec<&Value>) = records
        .iter()
        .filter(|r| r["type"] == "conn")
        .partition(|r| r["original_dst"] == expected.lines.addr.as_str());
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
            Some(client) => check_fields(conn, &client, &expected.http, 1, true, expected, fail),
            None => fail(format!("a record matches no client's request size: {conn}")),
        }
    }
    let held = held_client(held, expected, fail);
    match held_conns.as_slice() {
        // Adopted from conntrack's dump, then counted by the kernel programs from
        // observer's start.
        [conn] => {
            if let Some(held) = held {
                let lines = held.lines;
                check_fields(
                    conn,
                    &held.seen,
                    &expected.lines,
                    lines,
                    false,
                    expected,
                    fail,
                );
            }
        }
        conns => fail(format!(
            "{} records of the connection opened before observer, expected 1",
            conns.len()
        )),
    }
    check_summary(&records, expected.connections + 1, fail);
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
                    backend: expected.http.backend(*expected.pods.get(*body)?),
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

/// The client of the connection opened before observer: `sent received lines pod`, all
/// counted from observer's start, the pod named by every answer.
fn held_client(held: &[&str], expected: &Expected, fail: &mut impl FnMut(String)) -> Option<Held> {
    let parsed = match held {
        [line] => match line.split(' ').collect::<Vec<_>>().as_slice() {
            [sent, received, lines, pod] => (|| {
                Some(Held {
                    seen: Seen {
                        sent: sent.parse().ok()?,
                        received: received.parse().ok()?,
                        backend: expected.lines.backend(*expected.pods.get(*pod)?),
                    },
                    lines: lines.parse().ok()?,
                })
            })(),
            _ => None,
        },
        _ => None,
    };
    if parsed
        .as_ref()
        .is_none_or(|h| h.lines != expected.held_lines as u64)
    {
        fail(format!(
            "the connection opened before observer was not answered {} times by one known pod: {held:?}",
            expected.held_lines
        ));
        return None;
    }
    parsed
}

/// Checks one conn record against the client connection it belongs to, dialed at `port`:
/// `requests` requests, and whether observer saw it begin.
fn check_fields(
    conn: &Value,
    client: &Seen,
    port: &ServicePort,
    requests: u64,
    start_seen: bool,
    expected: &Expected,
    fail: &mut impl FnMut(String),
) {
    let client_port = conn["client"]
        .as_str()
        .and_then(|c| c.strip_prefix(&format!("{}:", expected.client_ip)));
    let checks: [(&str, bool); 11] = [
        ("proto", conn["proto"] == "tcp"),
        (
            "client",
            client_port.is_some_and(|p| p.parse::<u16>().is_ok()),
        ),
        ("original_dst", conn["original_dst"] == port.addr.as_str()),
        ("backend", conn["backend"] == client.backend.as_str()),
        ("service", conn["service"] == port.name.as_str()),
        ("endpoint_in_rules", conn["endpoint_in_rules"] == true),
        ("requests", conn["requests"] == requests),
        ("bytes_to_backend", conn["bytes_to_backend"] == client.sent),
        (
            "bytes_from_backend",
            conn["bytes_from_backend"] == client.received,
        ),
        ("close", conn["close"] == "fin" && conn["end"].is_string()),
        ("start_seen", conn["start_seen"] == start_seen),
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

/// Whether observer's `--hook auto` links the netfilter program on kernel `release`
/// (6.12 and later).
fn netfilter_kernel(release: &str) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse::<u32>().ok());
    matches!((numbers.next(), numbers.next()), (Some(major), Some(minor)) if (major, minor) >= (6, 12))
}
