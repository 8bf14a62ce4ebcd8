//! `observer summary --dns FILE`: per client, its DNS lookups and the search walks
//! they took, as text (or one JSON line: [`DnsJson`]).

use std::fmt::Write as _;

use serde::Serialize;

use crate::model::record::SummaryRecord;
use crate::report::text::plural;
use crate::stats::dns::{ClientDns, Walk};

/// What `summary --dns -o json` prints (one line).
#[derive(Debug, Serialize)]
pub struct DnsJson<'a> {
    pub file: &'a str,
    /// `dns` lines in the recording.
    pub queries: u64,
    /// From the summary line; null when the recording did not end cleanly.
    pub malformed: Option<u64>,
    /// Messages the kernel could not copy (`dns_lost`), likewise.
    pub lost: Option<u64>,
    pub clients: &'a [ClientDns],
}

/// What the header says of the messages without lines: malformed ones always, lost ones
/// when there are any.
pub fn skipped(summary: &SummaryRecord) -> String {
    let mut text = format!(
        ", {} skipped",
        plural(summary.dns_malformed, "malformed message")
    );
    if summary.dns_lost > 0 {
        let _ = write!(
            text,
            ", {} (not copied: observer fell behind)",
            plural(summary.dns_lost, "lost message")
        );
    }
    text
}

/// The text report.
pub fn render(
    file: &str,
    summary: Option<&SummaryRecord>,
    queries: u64,
    clients: &[ClientDns],
) -> String {
    let mut out = String::new();
    let lookups: u64 = clients.iter().map(|c| c.lookups).sum();
    let _ = writeln!(
        out,
        "{file}: {} in {}{}",
        plural(queries, "DNS query").replace("querys", "queries"),
        plural(lookups, "lookup"),
        match summary {
            Some(s) => skipped(s),
            None => String::new(),
        }
    );
    if clients.is_empty() {
        let _ = writeln!(
            out,
            "\nno DNS queries to a port-53 Service in the recording"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<36} {:>7} {:>7} {:>9} {:>8} {:>10}",
        "CLIENT", "LOOKUPS", "QUERIES", "Q/LOOKUP", "NXDOMAIN", "UNANSWERED"
    );
    for client in clients {
        let name = match &client.client_pod {
            Some(pod) => format!("{pod} ({})", client.client),
            None => client.client.to_string(),
        };
        let _ = writeln!(
            out,
            "{name:<36} {:>7} {:>7} {:>9.2} {:>7.0}% {:>10}",
            client.lookups,
            client.queries,
            client.queries_per_lookup,
            client.nxdomain_share * 100.0,
            client.unanswered
        );
        for walk in &client.walks {
            let _ = writeln!(out, "  {}", walk_line(walk));
        }
    }
    out
}

/// `www.example.com -> www.example.com: 8 queries, 6 NXDOMAIN` (per lookup when there
/// were several: `2 lookups, 8 queries each`).
pub fn walk_line(walk: &Walk) -> String {
    let answer = walk.answer.as_deref().unwrap_or("no answer");
    let queries = |n: u64| if n == 1 { "query" } else { "queries" };
    let mut line = format!("{} -> {answer}: ", walk.base);
    if walk.lookups > 1
        && walk.queries.is_multiple_of(walk.lookups)
        && walk.nxdomain.is_multiple_of(walk.lookups)
    {
        let each = walk.queries / walk.lookups;
        let _ = write!(
            line,
            "{} lookups, {each} {} each",
            walk.lookups,
            queries(each)
        );
        if walk.nxdomain > 0 {
            let _ = write!(line, ", {} NXDOMAIN", walk.nxdomain / walk.lookups);
        }
        return line;
    }
    if walk.lookups > 1 {
        let _ = write!(line, "{} lookups, ", walk.lookups);
    }
    let _ = write!(line, "{} {}", walk.queries, queries(walk.queries));
    if walk.nxdomain > 0 {
        let _ = write!(line, ", {} NXDOMAIN", walk.nxdomain);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(base: &str, answer: Option<&str>, lookups: u64, queries: u64, nx: u64) -> Walk {
        Walk {
            base: base.into(),
            answer: answer.map(str::to_owned),
            lookups,
            queries,
            nxdomain: nx,
            names: vec![],
        }
    }

    #[test]
    fn walk_lines() {
        assert_eq!(
            walk_line(&walk(
                "checkout",
                Some("checkout.shop.svc.cluster.local"),
                1,
                1,
                0
            )),
            "checkout -> checkout.shop.svc.cluster.local: 1 query"
        );
        assert_eq!(
            walk_line(&walk("www.example.com", Some("www.example.com"), 1, 8, 6)),
            "www.example.com -> www.example.com: 8 queries, 6 NXDOMAIN"
        );
        assert_eq!(
            walk_line(&walk("www.example.com", Some("www.example.com"), 2, 16, 12)),
            "www.example.com -> www.example.com: 2 lookups, 8 queries each, 6 NXDOMAIN"
        );
        assert_eq!(
            walk_line(&walk("nope", None, 2, 9, 8)),
            "nope -> no answer: 2 lookups, 9 queries, 8 NXDOMAIN"
        );
    }

    #[test]
    fn the_report_names_clients_and_their_walks() {
        let clients = vec![ClientDns {
            client: "10.244.1.9".parse().unwrap(),
            client_pod: Some("shop/client".into()),
            lookups: 2,
            queries: 10,
            queries_per_lookup: 5.0,
            nxdomain: 6,
            nxdomain_share: 0.6,
            unanswered: 0,
            walks: vec![
                walk("www.example.com", Some("www.example.com"), 1, 8, 6),
                walk("checkout", Some("checkout.shop.svc.cluster.local"), 1, 2, 0),
            ],
        }];
        let mut summary = SummaryRecord {
            dns_malformed: 1,
            ..Default::default()
        };
        assert_eq!(
            render("x.jsonl", Some(&summary), 10, &clients),
            "x.jsonl: 10 DNS queries in 2 lookups, 1 malformed message skipped\n\
             \n\
             CLIENT                               LOOKUPS QUERIES  Q/LOOKUP NXDOMAIN UNANSWERED\n\
             shop/client (10.244.1.9)                   2      10      5.00      60%          0\n  \
             www.example.com -> www.example.com: 8 queries, 6 NXDOMAIN\n  \
             checkout -> checkout.shop.svc.cluster.local: 2 queries\n"
        );
        summary.dns_lost = 2;
        assert!(render("x.jsonl", Some(&summary), 10, &clients).starts_with(
            "x.jsonl: 10 DNS queries in 2 lookups, 1 malformed message skipped, \
                 2 lost messages (not copied: observer fell behind)\n"
        ));
        assert_eq!(
            render("x.jsonl", None, 0, &[]),
            "x.jsonl: 0 DNS queries in 0 lookups\n\nno DNS queries to a port-53 Service in the recording\n"
        );
    }
}
