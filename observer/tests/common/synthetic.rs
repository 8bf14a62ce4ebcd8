//! Synthetic recordings in the log's documented format: connections a DNAT spread over a
//! Service's pods at random with given probabilities, each carrying a number of requests
//! from a request mix. Shared by the verdict tests and `cargo xtask skew-table`.

#![allow(dead_code)]

use observer::model::record::{ConnRecord, LogLine, Recording, ServiceRecord, SummaryRecord};
use observer::report::check::{Conditions, violations};
use observer::stats::mix::RequestMix;
use observer::stats::{Aggregator, ServiceStats};

pub const SERVICE: &str = "shop/checkout:http";

/// How many requests each connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// One request per connection (a client that connects per request).
    Light,
    /// 1 + a geometric number of further requests, 5 on average, up to 50 (keep-alive
    /// clients that reuse their connection for a while).
    KeepAlive,
}

impl Mix {
    pub fn name(self) -> &'static str {
        match self {
            Mix::Light => "light",
            Mix::KeepAlive => "keep-alive",
        }
    }

    fn requests(self, rng: &mut Rng) -> u64 {
        match self {
            Mix::Light => 1,
            Mix::KeepAlive => {
                let mut requests = 1;
                while requests < 50 && rng.unit() < 0.8 {
                    requests += 1;
                }
                requests
            }
        }
    }
}

/// SplitMix64: the same logs from the same seed everywhere.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index drawn with the given probabilities.
    pub fn pick(&mut self, probabilities: &[f64]) -> usize {
        let mut u = self.unit();
        for (index, p) in probabilities.iter().enumerate() {
            if u < *p {
                return index;
            }
            u -= p;
        }
        probabilities.len() - 1
    }
}

/// The pods' addresses: 10.244.1.10, .11, ... port 8080.
pub fn pod(index: usize) -> std::net::SocketAddr {
    format!("10.244.1.{}:8080", 10 + index).parse().unwrap()
}

fn service_line(pods: usize) -> ServiceRecord {
    let endpoints: Vec<String> = (0..pods)
        .map(|i| {
            format!(
                r#"{{"addr":"{}","expected_share":{}}}"#,
                pod(i),
                1.0 / pods as f64
            )
        })
        .collect();
    serde_json::from_str(&format!(
        r#"{{"service":"{SERVICE}","proto":"tcp","netns":4026532301,"frontends":[{{"kind":"cluster_ip","ip":"10.96.35.226","port":80}}],"endpoints":[{}],"time":"2026-08-06T13:46:30.000000Z"}}"#,
        endpoints.join(",")
    ))
    .unwrap()
}

fn conn_template() -> ConnRecord {
    serde_json::from_str(&format!(
        r#"{{"proto":"tcp","client":"10.244.2.9:40000","client_pod":"shop/client","original_dst":"10.96.35.226:80","backend":"10.244.1.10:8080","backend_pod":null,"service":"{SERVICE}","frontend":"cluster_ip","endpoint_in_rules":true,"netns":4026532301,"start":"2026-08-06T13:46:31.000000Z","end":"2026-08-06T13:46:32.000000Z","duration_ms":1000.0,"requests":1,"bytes_to_backend":93,"bytes_from_backend":180,"close":"fin","connect_ms":0.2,"start_seen":true}}"#
    ))
    .unwrap()
}

/// What a DNAT did with `connections` connections to `pods` pods: each connection's pod
/// (picked with the probabilities `dnat`, equal when empty: a fair DNAT) and requests.
pub fn draw(
    rng: &mut Rng,
    pods: usize,
    connections: usize,
    mix: Mix,
    dnat: &[f64],
) -> Vec<(usize, u64)> {
    let even = vec![1.0 / pods as f64; pods];
    let dnat = if dnat.is_empty() { &even[..] } else { dnat };
    (0..connections)
        .map(|_| (rng.pick(dnat), mix.requests(rng)))
        .collect()
}

/// The recording of a draw over `pods` pods whose rules give each an equal share.
pub fn recording_of(pods: usize, draw: &[(usize, u64)]) -> Recording {
    let template = conn_template();
    let conns = draw
        .iter()
        .enumerate()
        .map(|(i, &(pod_index, requests))| {
            let mut conn = template.clone();
            conn.client = format!("10.244.2.9:{}", 40_000 + i).parse().unwrap();
            conn.backend = pod(pod_index);
            conn.requests = requests;
            conn.start += chrono::TimeDelta::milliseconds(i as i64);
            conn.end = Some(conn.start + chrono::TimeDelta::seconds(1));
            conn
        })
        .collect();
    Recording {
        conns,
        services: vec![service_line(pods)],
        summary: Some(SummaryRecord {
            connections: draw.len() as u64,
            dnat_events: draw.len() as u64,
            ..serde_json::from_str(
                r#"{"connections":0,"dnat_events":0,"lost_events":0,"read_errors":0,"started":"2026-08-06T13:46:30.000000Z","ended":"2026-08-06T13:50:00.000000Z"}"#,
            )
            .unwrap()
        }),
        ..Recording::default()
    }
}

/// A recording of a fresh draw.
pub fn recording(
    rng: &mut Rng,
    pods: usize,
    connections: usize,
    mix: Mix,
    dnat: &[f64],
) -> Recording {
    recording_of(pods, &draw(rng, pods, connections, mix, dnat))
}

/// The recording as `observer record` writes it: JSON Lines.
pub fn jsonl(recording: &Recording) -> String {
    let lines = recording
        .services
        .iter()
        .cloned()
        .map(LogLine::Service)
        .chain(recording.endpoints.iter().cloned().map(LogLine::Endpoints))
        .chain(recording.conns.iter().cloned().map(LogLine::Conn))
        .chain(recording.marks.iter().cloned().map(LogLine::Mark))
        .chain(recording.summary.iter().cloned().map(LogLine::Summary));
    lines
        .map(|line| serde_json::to_string(&line).unwrap() + "\n")
        .collect()
}

/// The Service's figures for `pods` pods, from the aggregator, to fill with draws.
pub fn service_template(pods: usize) -> ServiceStats {
    let mut rng = Rng(0);
    Aggregator::from_recording(&recording(&mut rng, pods, pods, Mix::Light, &[]))
        .services()
        .remove(0)
}

/// The violation of `conditions` by a draw, without building each connection's record:
/// the Service's figures are `template`'s with the draw's counts (what the aggregator
/// counts from the records; the tests compare the two).
pub fn violation_of(
    template: &ServiceStats,
    draw: &[(usize, u64)],
    conditions: &Conditions,
) -> Option<String> {
    let mut service = template.clone();
    for backend in &mut service.backends {
        backend.connections = 0;
        backend.requests = 0;
        backend.request_mix = RequestMix::default();
    }
    for &(pod, requests) in draw {
        let backend = &mut service.backends[pod];
        backend.connections += 1;
        backend.requests += requests;
        backend.request_mix.add(requests);
    }
    service.connections = draw.len() as u64;
    service.requests = draw.iter().map(|(_, r)| r).sum();
    for backend in &mut service.backends {
        backend.request_share = backend.requests as f64 / service.requests as f64;
    }
    service.skew = service.skew_detail().map(|d| d.skew);
    violations(conditions, None, None, &[service])
        .into_iter()
        .find(|v| v.subject == SERVICE)
        .map(|v| v.text)
}

/// What a violation of `--max-skew` says the cause is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    /// Above the limit beyond chance.
    BeyondChance,
    /// A fair DNAT of these connections usually exceeds the limit.
    UsuallyAbove,
}

impl Verdict {
    pub fn of(violation: Option<&str>) -> Verdict {
        match violation {
            None => Verdict::Passed,
            Some(text)
                if text.contains(": too few connections: ") || text.contains(": pinning: ") =>
            {
                Verdict::UsuallyAbove
            }
            Some(_) => Verdict::BeyondChance,
        }
    }
}
