//! Scraping `observer serve`'s `/metrics` and reading its samples.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

/// `GET path` from `addr` over HTTP/1.1 (one request, then the server closes); the body
/// of a 200 response.
pub fn scrape(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to observer serve");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: observer\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// [`scrape`] from inside the network namespace `/run/netns/<netns>` (on a thread that
/// enters it), e.g. a node's loopback.
pub fn scrape_in(netns: &str, addr: &str, path: &str) -> String {
    let file = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                scrape(addr, path)
            })
            .join()
            .unwrap()
    })
}

/// Prometheus' own linter (`promtool check metrics`: format and naming conventions)
/// accepts `metrics`; fails with its complaints and the text otherwise.
pub fn promtool_lint(metrics: &str) {
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `cargo xtask setup` installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{metrics}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The samples of `metric`: each one's labels and value.
pub fn samples(metrics: &str, metric: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix(metric)?.strip_prefix('{'))
        .map(|rest| {
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            (parse_labels(labels), value.parse().unwrap())
        })
        .collect()
}

/// `a="1",b="x"` as a map (values unescaped).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => value.extend(chars.next().map(|(_, c)| match c {
                    'n' => '\n',
                    other => other,
                })),
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {text}"),
            }
        };
        labels.insert(name.trim_start_matches(',').to_owned(), value);
        rest = &after[end + 1..];
    }
    labels
}

/// Per backend, the value of `metric` for one Service port and protocol.
pub fn per_backend(
    metrics: &str,
    metric: &str,
    service: &str,
    proto: &str,
) -> BTreeMap<String, u64> {
    samples(metrics, metric)
        .into_iter()
        .filter(|(labels, _)| labels["service"] == service && labels["proto"] == proto)
        .map(|(labels, value)| (labels["backend"].clone(), value as u64))
        .collect()
}

/// `promtool check metrics` (Prometheus' own linter: format and naming conventions)
/// accepts `metrics`.
pub fn assert_promtool_accepts(metrics: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `cargo xtask setup` installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{metrics}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}
