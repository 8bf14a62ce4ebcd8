//! Real clients running in the lab's client namespace, each returning its own record.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::Context;
use serde::de::DeserializeOwned;

use super::Lab;
use super::sys::{find_tool, in_netns, run};

/// One answer as the client saw it: its local port and the pod name in the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub client_port: u16,
    pub pod: String,
}

fn run_json<T: DeserializeOwned>(
    lab: &Lab,
    program: &std::path::Path,
    args: &[String],
) -> anyhow::Result<T> {
    run_json_in(lab, lab.client_ns(), program, args)
}

fn run_json_in<T: DeserializeOwned>(
    lab: &Lab,
    netns: &str,
    program: &std::path::Path,
    args: &[String],
) -> anyhow::Result<T> {
    let out = run(in_netns(&lab.tools.ip, netns, program).args(args))?;
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "unexpected client output: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn python_client(
    lab: &Lab,
    mode: &str,
    target: SocketAddr,
    count: usize,
    extra: &[String],
) -> anyhow::Result<Vec<Answer>> {
    python_client_in(lab, lab.client_ns(), mode, target, count, extra)
}

fn python_client_in(
    lab: &Lab,
    netns: &str,
    mode: &str,
    target: SocketAddr,
    count: usize,
    extra: &[String],
) -> anyhow::Result<Vec<Answer>> {
    let script = lab.state_dir.join("clients.py");
    let mut args = vec![
        script.to_string_lossy().into_owned(),
        mode.to_string(),
        target.ip().to_string(),
        target.port().to_string(),
        count.to_string(),
    ];
    args.extend_from_slice(extra);
    let raw: Vec<(u16, String)> = run_json_in(lab, netns, &lab.tools.python3, &args)?;
    Ok(raw
        .into_iter()
        .map(|(client_port, pod)| Answer { client_port, pod })
        .collect())
}

/// What one connection attempt came to, as the client saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum AttemptOutcome {
    /// Connected and answered by `pod` (TCP: after `connect_ms`, the client's own
    /// measure from its SYN to the SYN-ACK's arrival).
    Connected {
        pod: String,
        connect_ms: Option<f64>,
    },
    /// `ECONNREFUSED`: an RST, or an ICMP port unreachable.
    Refused,
    /// No answer within the attempt's timeout.
    Timeout,
    /// `ENETUNREACH`/`EHOSTUNREACH`: an ICMP network or host unreachable (a REJECT).
    Unreachable,
}

/// One connection attempt: the client port it used (never used before in the lab) and
/// what came of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    pub client_port: u16,
    pub outcome: AttemptOutcome,
    /// UDP: datagrams sent (an ICMP port unreachable makes the next send fail); TCP: 0.
    pub datagrams_sent: u64,
}

/// Python: `count` connection attempts to `target`, each from a new socket and client
/// port, each given `timeout`. TCP attempts that connect send one HTTP request; UDP
/// attempts send `datagrams` datagrams, then wait for an answer.
pub fn attempts(
    lab: &Lab,
    proto: crate::Proto,
    target: impl Into<SocketAddr>,
    count: usize,
    timeout: std::time::Duration,
    datagrams: usize,
) -> anyhow::Result<Vec<Attempt>> {
    let target = target.into();
    let script = lab.state_dir.join("clients.py");
    let args = vec![
        script.to_string_lossy().into_owned(),
        "attempts".to_owned(),
        proto.to_string(),
        target.ip().to_string(),
        target.port().to_string(),
        count.to_string(),
        timeout.as_secs_f64().to_string(),
        datagrams.to_string(),
    ];
    /// `[port, outcome, pod, connect_ms, datagrams sent]`, as clients.py prints it.
    type RawAttempt = (u16, String, Option<String>, Option<f64>, u64);
    let raw: Vec<RawAttempt> = run_json(lab, &lab.tools.python3, &args)?;
    raw.into_iter()
        .map(|(client_port, outcome, pod, connect_ms, datagrams_sent)| {
            let outcome = match (outcome.as_str(), pod) {
                ("connected", Some(pod)) => AttemptOutcome::Connected { pod, connect_ms },
                ("refused", _) => AttemptOutcome::Refused,
                ("timeout", _) => AttemptOutcome::Timeout,
                ("unreachable", _) => AttemptOutcome::Unreachable,
                (other, _) => anyhow::bail!("the attempts client reported `{other}`"),
            };
            Ok(Attempt {
                client_port,
                outcome,
                datagrams_sent,
            })
        })
        .collect()
}

/// Python's `getaddrinfo` of each name in the client namespace, so that its
/// resolv.conf ([`Lab::serve_dns`]: kube's, `ndots:5`) applies: each name and the
/// addresses found (none when it does not resolve).
pub fn resolve(lab: &Lab, names: &[&str]) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let mut args = vec![
        lab.state_dir
            .join("clients.py")
            .to_string_lossy()
            .into_owned(),
        "resolve".to_owned(),
    ];
    args.extend(names.iter().map(|name| (*name).to_owned()));
    run_json(lab, &lab.tools.python3, &args)
}

/// Python: `count` HTTP requests, each on a new TCP connection from a client port never
/// used before in the lab (so a client port names one connection).
pub fn http_fresh(
    lab: &Lab,
    target: impl Into<SocketAddr>,
    count: usize,
) -> anyhow::Result<Vec<Answer>> {
    python_client(lab, "http-fresh", target.into(), count, &[])
}

/// [`http_fresh`] from another of the lab's namespaces (e.g. [`Lab::peer_ns`]: an
/// external client).
pub fn http_fresh_from(
    lab: &Lab,
    netns: &str,
    target: impl Into<SocketAddr>,
    count: usize,
) -> anyhow::Result<Vec<Answer>> {
    python_client_in(lab, netns, "http-fresh", target.into(), count, &[])
}

/// Python `http.client`: one connection, `count` sequential requests on it.
pub fn http_keepalive(
    lab: &Lab,
    target: impl Into<SocketAddr>,
    count: usize,
) -> anyhow::Result<Vec<Answer>> {
    python_client(lab, "http-keepalive", target.into(), count, &[])
}

/// Python `http.client`: one connection, `count` requests `pause` apart (a pinned,
/// long-lived keep-alive client for the demo).
pub fn http_keepalive_paced(
    lab: &Lab,
    target: impl Into<SocketAddr>,
    count: usize,
    pause: std::time::Duration,
) -> anyhow::Result<Vec<Answer>> {
    python_client(
        lab,
        "http-keepalive",
        target.into(),
        count,
        &[pause.as_secs_f64().to_string()],
    )
}

/// What a churn run achieved: connections answered and connections that failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct ChurnReport {
    pub connections: u64,
    pub failed: u64,
}

/// Python: fresh `Connection: close` HTTP requests, one per TCP connection, from
/// `threads` threads for `duration` (as fast as they go): the churn that reuses client
/// ports while conntrack still holds their earlier entries.
pub fn http_churn(
    lab: &Lab,
    target: impl Into<SocketAddr>,
    duration: std::time::Duration,
    threads: usize,
) -> anyhow::Result<ChurnReport> {
    let target = target.into();
    let script = lab.state_dir.join("clients.py");
    let args = [
        script.to_string_lossy().into_owned(),
        "http-churn".to_owned(),
        target.ip().to_string(),
        target.port().to_string(),
        duration.as_secs_f64().to_string(),
        threads.to_string(),
    ];
    run_json(lab, &lab.tools.python3, &args)
}

/// Python: `count` UDP queries, each from a new socket.
pub fn udp_queries(
    lab: &Lab,
    target: impl Into<SocketAddr>,
    count: usize,
) -> anyhow::Result<Vec<Answer>> {
    python_client(lab, "udp", target.into(), count, &[])
}

/// Node's `fetch` (undici keep-alive) in a loop in one process: answers per pod.
pub fn node_fetch(
    lab: &Lab,
    target: impl Into<SocketAddr>,
    count: usize,
) -> anyhow::Result<BTreeMap<String, usize>> {
    let node = find_tool("node", "nodejs")?;
    let script = lab.state_dir.join("node_fetch.mjs");
    let args = [
        script.to_string_lossy().into_owned(),
        format!("http://{}/", target.into()),
        count.to_string(),
    ];
    run_json(lab, &node, &args)
}
