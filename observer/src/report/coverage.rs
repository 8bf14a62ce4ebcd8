//! `observer verify`'s report: conntrack's own DNAT decisions (its NEW events) next to
//! the connections observer recorded, matched by network namespace, protocol, client,
//! dialed address and backend.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use super::text::thousands;
use crate::model::record::{ConnRecord, ConntrackEnds, ForwardingHook, Proto};

/// One DNAT decision as conntrack reported it (a NEW event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    pub netns: u32,
    pub proto: Proto,
    pub client: SocketAddr,
    pub dialed: SocketAddr,
    pub backend: SocketAddr,
}

impl Decision {
    fn of(record: &ConnRecord) -> Decision {
        Decision {
            netns: record.netns,
            proto: record.proto,
            client: record.client,
            dialed: record.original_dst,
            backend: record.backend,
        }
    }
}

/// Decisions and how many of them observer recorded, for the node or one Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub decisions: u64,
    pub recorded: u64,
}

impl Counts {
    pub fn lost(&self) -> u64 {
        self.decisions - self.recorded
    }

    pub fn complete(&self) -> bool {
        self.recorded == self.decisions
    }

    fn percent(&self) -> f64 {
        if self.decisions == 0 {
            100.0
        } else {
            self.recorded as f64 * 100.0 / self.decisions as f64
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Coverage {
    pub total: Counts,
    /// By Service name (`ns/name:port`), or the dialed address when no rule names it.
    pub services: BTreeMap<String, Counts>,
    /// Records with `start_seen: true` that match no decision conntrack reported (begun
    /// just before the listener subscribed, or in a namespace it did not follow).
    pub unmatched_records: u64,
    /// The first decisions without a record, to look for.
    pub lost: Vec<Decision>,
    /// How the recording learned of entries conntrack removed without a FIN or RST.
    pub conntrack_ends: Option<ConntrackEnds>,
    /// Where the recording's forwarding program ran.
    pub forwarding_hook: Option<ForwardingHook>,
}

/// How many lost decisions the report names.
const LOST_SHOWN: usize = 5;

/// Matches each decision to at most one record with `start_seen: true`.
pub fn coverage(decisions: &[Decision], records: &[ConnRecord]) -> Coverage {
    let mut available: HashMap<Decision, u64> = HashMap::new();
    let mut names: HashMap<(u32, Proto, SocketAddr), String> = HashMap::new();
    for record in records.iter().filter(|r| r.start_seen) {
        *available.entry(Decision::of(record)).or_default() += 1;
        if let Some(service) = &record.service {
            names.insert(
                (record.netns, record.proto, record.original_dst),
                service.to_string(),
            );
        }
    }
    let mut coverage = Coverage::default();
    for decision in decisions {
        let name = names
            .get(&(decision.netns, decision.proto, decision.dialed))
            .cloned()
            .unwrap_or_else(|| format!("{} ({})", decision.dialed, decision.proto));
        let service = coverage.services.entry(name).or_default();
        service.decisions += 1;
        coverage.total.decisions += 1;
        if let Some(left) = available.get_mut(decision).filter(|left| **left > 0) {
            *left -= 1;
            service.recorded += 1;
            coverage.total.recorded += 1;
        } else if coverage.lost.len() < LOST_SHOWN {
            coverage.lost.push(*decision);
        }
    }
    coverage.unmatched_records = available.values().sum();
    coverage
}

/// The report as JSON Lines (`verify -o json`): one `{"type":"node",...}` line, one
/// `{"type":"service","service":NAME,...}` line per Service, then one `{"type":"lost",...}`
/// line per lost decision named. Counts are `decisions`, `recorded`, `lost`.
pub fn render_json(coverage: &Coverage) -> String {
    let node = JsonLine::Node {
        counts: JsonCounts::of(&coverage.total),
        unmatched_records: coverage.unmatched_records,
        conntrack_ends: coverage.conntrack_ends,
        forwarding_hook: coverage.forwarding_hook,
    };
    let services = coverage
        .services
        .iter()
        .map(|(service, counts)| JsonLine::Service {
            service,
            counts: JsonCounts::of(counts),
        });
    let lost = coverage.lost.iter().map(|lost| JsonLine::Lost {
        proto: lost.proto,
        client: lost.client,
        dialed: lost.dialed,
        backend: lost.backend,
        netns: lost.netns,
    });
    [node]
        .into_iter()
        .chain(services)
        .chain(lost)
        .map(|line| serde_json::to_string(&line).expect("plain data serializes") + "\n")
        .collect()
}

/// One line of `verify -o json`.
#[derive(serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum JsonLine<'a> {
    Node {
        #[serde(flatten)]
        counts: JsonCounts,
        unmatched_records: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        conntrack_ends: Option<ConntrackEnds>,
        #[serde(skip_serializing_if = "Option::is_none")]
        forwarding_hook: Option<ForwardingHook>,
    },
    Service {
        service: &'a str,
        #[serde(flatten)]
        counts: JsonCounts,
    },
    Lost {
        proto: Proto,
        client: SocketAddr,
        dialed: SocketAddr,
        backend: SocketAddr,
        netns: u32,
    },
}

#[derive(serde::Serialize)]
struct JsonCounts {
    decisions: u64,
    recorded: u64,
    lost: u64,
}

impl JsonCounts {
    fn of(counts: &Counts) -> JsonCounts {
        JsonCounts {
            decisions: counts.decisions,
            recorded: counts.recorded,
            lost: counts.lost(),
        }
    }
}

/// The report: one line for the node, one per Service.
pub fn render(coverage: &Coverage) -> String {
    let total = &coverage.total;
    let mut out = format!(
        "conntrack saw {} DNAT decisions; observer recorded {} ({:.3}%); {} lost\n",
        thousands(total.decisions),
        thousands(total.recorded),
        total.percent(),
        thousands(total.lost())
    );
    let width = coverage.services.keys().map(String::len).max().unwrap_or(0);
    for (name, counts) in &coverage.services {
        out.push_str(&format!(
            "  {name:<width$}  {:>9} decisions  {:>9} recorded ({:.3}%)  {} lost\n",
            thousands(counts.decisions),
            thousands(counts.recorded),
            counts.percent(),
            thousands(counts.lost())
        ));
    }
    for lost in &coverage.lost {
        out.push_str(&format!(
            "  lost: {} {} -> {} -> {} (netns {})\n",
            lost.proto, lost.client, lost.dialed, lost.backend, lost.netns
        ));
    }
    if coverage.unmatched_records > 0 {
        out.push_str(&format!(
            "  ({} recorded connections match no decision conntrack reported while verifying)\n",
            thousands(coverage.unmatched_records)
        ));
    }
    match coverage.conntrack_ends {
        Some(ConntrackEnds::Revalidated) => out.push_str(
            "  (entries conntrack removed without a FIN or RST were found by checking the tracked entries from the kernel)\n",
        ),
        Some(ConntrackEnds::DestroyEvents) => out.push_str(
            "  (entries conntrack removed without a FIN or RST were found by its destroy events: this kernel refused the check observer prefers)\n",
        ),
        None => {}
    }
    if let Some(hook) = coverage.forwarding_hook {
        out.push_str(&format!(
            "  (forwarded packets were followed at {})\n",
            hook.described()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(client: &str, start_seen: bool) -> ConnRecord {
        ConnRecord {
            client: client.parse().unwrap(),
            service: Some("shop/checkout:http".into()),
            endpoint_in_rules: Some(true),
            policy: None,
            same_node: None,
            netns: 7,
            end: None,
            duration_ms: 1.0,
            bytes_to_backend: 1,
            bytes_from_backend: 1,
            start_seen,
            ..ConnRecord::example("10.244.1.13:8080")
        }
    }

    fn decision(client: &str, dialed: &str) -> Decision {
        Decision {
            netns: 7,
            proto: Proto::Tcp,
            client: client.parse().unwrap(),
            dialed: dialed.parse().unwrap(),
            backend: "10.244.1.13:8080".parse().unwrap(),
        }
    }

    #[test]
    fn each_decision_matches_one_record_at_most() {
        // The same client port twice (reused), recorded once; a record that began before
        // observer (start_seen false) matches nothing; one decision to an unnamed address.
        let decisions = [
            decision("10.0.0.1:1000", "10.96.35.226:80"),
            decision("10.0.0.1:1000", "10.96.35.226:80"),
            decision("10.0.0.1:1001", "10.96.35.226:80"),
            decision("10.0.0.1:1002", "10.96.0.9:53"),
        ];
        let records = [
            record("10.0.0.1:1000", true),
            record("10.0.0.1:1001", false),
            record("10.0.0.1:1003", true),
        ];
        let coverage = coverage(&decisions, &records);
        assert_eq!(
            coverage.total,
            Counts {
                decisions: 4,
                recorded: 1
            }
        );
        assert_eq!(coverage.unmatched_records, 1);
        assert_eq!(
            render(&coverage),
            "conntrack saw 4 DNAT decisions; observer recorded 1 (25.000%); 3 lost\n\
             \x20 10.96.0.9:53 (tcp)          1 decisions          0 recorded (0.000%)  1 lost\n\
             \x20 shop/checkout:http          3 decisions          1 recorded (33.333%)  2 lost\n\
             \x20 lost: tcp 10.0.0.1:1000 -> 10.96.35.226:80 -> 10.244.1.13:8080 (netns 7)\n\
             \x20 lost: tcp 10.0.0.1:1001 -> 10.96.35.226:80 -> 10.244.1.13:8080 (netns 7)\n\
             \x20 lost: tcp 10.0.0.1:1002 -> 10.96.0.9:53 -> 10.244.1.13:8080 (netns 7)\n\
             \x20 (1 recorded connections match no decision conntrack reported while verifying)\n"
        );
        let json = render_json(&coverage);
        let lines: Vec<serde_json::Value> = json
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            serde_json::json!({"type": "node", "decisions": 4, "recorded": 1, "lost": 3, "unmatched_records": 1})
        );
        assert_eq!(
            lines[2],
            serde_json::json!({"type": "service", "service": "shop/checkout:http", "decisions": 3, "recorded": 1, "lost": 2})
        );
        assert_eq!(
            lines[3],
            serde_json::json!({"type": "lost", "proto": "tcp", "client": "10.0.0.1:1000", "dialed": "10.96.35.226:80", "backend": "10.244.1.13:8080", "netns": 7})
        );
        assert_eq!(lines.len(), 6);
    }
}
