//! `observer check FILE`: asserts how a recording's traffic was spread, for CI (see
//! [`crate::report::check`] for the conditions and a worked example).

use std::path::PathBuf;

use super::args::count;
use super::span::SpanArgs;
use super::{Outcome, emit};
use crate::model::record::Recording;
use crate::report::check::{Conditions, judge_recording, render_json};
use crate::report::junit::render_junit;
use crate::report::text::plural;

/// How `check` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckFormat {
    /// One line per violation, for people.
    #[default]
    Table,
    /// One JSON line per condition and subject, then the verdict.
    Json,
    /// JUnit XML: a test case per condition and subject, for CI test reports.
    Junit,
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct CheckArgs {
    /// Connection log written by `observer record` (JSON Lines).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// `table`: one line per violation for people; `json`: one line per condition and
    /// Service, then the verdict; `junit`: JUnit XML, a test case per condition and Service.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FORMAT",
        value_enum,
        default_value_t
    )]
    pub format: CheckFormat,
    #[command(flatten)]
    pub span: SpanArgs,
    /// Check only this Service (`ns/name:port`, or `IP:port` for unnamed ones); repeatable.
    #[arg(long, value_name = "NAME")]
    pub service: Vec<String>,
    /// Fail when a backend got more than R times its expected share of requests beyond
    /// chance (a fair DNAT of the same connections would rarely give as much; see
    /// --confidence), or when even a fair DNAT of these connections would usually
    /// exceed R (requests ride too few connections).
    #[arg(long, value_name = "R", value_parser = skew_ratio)]
    pub max_skew: Option<f64>,
    /// How sure --max-skew must be that a skew above R is not chance: a fair DNAT fails
    /// it at most 1 - C of the time [default: 0.99].
    #[arg(long, value_name = "C", value_parser = confidence)]
    pub confidence: Option<f64>,
    /// Fail when fewer than N backends got at least one request.
    #[arg(long, value_name = "N", value_parser = count)]
    pub min_backends: Option<u64>,
    /// Fail when more than N connections were pinned to a backend no longer in the rules.
    #[arg(long, value_name = "N", value_parser = count)]
    pub max_stale: Option<u64>,
    /// Fail when a Service has fewer than N connections.
    #[arg(long, value_name = "N", value_parser = count)]
    pub min_connections: Option<u64>,
    /// Fail when more than N connections were lost (DNAT decisions without a record; or
    /// when the log has no summary line).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = count)]
    pub max_lost: u64,
    /// Fail when a Service got fewer than N requests.
    #[arg(long, value_name = "N", value_parser = count)]
    pub min_requests: Option<u64>,
    /// Fail when more than N connections were refused (the backend answered with an RST
    /// or an ICMP port unreachable: nothing listens).
    #[arg(long, value_name = "N", value_parser = count)]
    pub max_refused: Option<u64>,
    /// Fail when more than N connections got no answer at all from their backend.
    #[arg(long, value_name = "N", value_parser = count)]
    pub max_unanswered: Option<u64>,
    /// Fail when more than N answered connections ended with an RST (a backend that
    /// crashed or reset mid-exchange; refused connections are --max-refused).
    #[arg(long, value_name = "N", value_parser = count)]
    pub max_resets: Option<u64>,
    /// Fail when more than N connections went to a backend on another node than the one
    /// that decided them (for trafficDistribution: PreferSameNode and Local traffic
    /// policies; connections whose backend's node is unknown do not count).
    #[arg(long, value_name = "N", value_parser = count)]
    pub max_cross_node: Option<u64>,
    /// Fail when more than N connections were rejected before reaching any backend (the
    /// Service port had no endpoints; UDP: client sockets).
    #[arg(long, value_name = "N", value_parser = count)]
    pub max_rejected: Option<u64>,
    /// Fail when a Service's connect-time p99 (first SYN to the backend's SYN-ACK, TCP)
    /// is above MS milliseconds.
    #[arg(long, value_name = "MS", value_parser = milliseconds)]
    pub max_connect_p99: Option<f64>,
}

impl CheckArgs {
    fn conditions(&self) -> Conditions {
        Conditions {
            service: self.service.clone(),
            max_skew: self.max_skew,
            confidence: self.confidence,
            min_backends: self.min_backends,
            max_stale: self.max_stale,
            min_connections: self.min_connections,
            max_lost: self.max_lost,
            min_requests: self.min_requests,
            max_refused: self.max_refused,
            max_unanswered: self.max_unanswered,
            max_resets: self.max_resets,
            max_cross_node: self.max_cross_node,
            max_rejected: self.max_rejected,
            max_connect_p99: self.max_connect_p99,
        }
    }
}

/// Skew is a max over ratios whose expected values sum to 1, so it is never below 1.
fn skew_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 1.0 => Ok(r),
        _ => Err(format!("{text:?} is not a ratio >= 1 (1 = perfectly even)")),
    }
}

/// A probability strictly between 0 and 1.
fn confidence(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(c) if c > 0.0 && c < 1.0 => Ok(c),
        _ => Err(format!(
            "`{text}` is not a confidence between 0 and 1 (0.99: 1% false alarms)"
        )),
    }
}

/// A time bound in milliseconds: a positive number (`10`, `0.5`).
fn milliseconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms > 0.0 => Ok(ms),
        _ => Err(format!("`{text}` is not a positive number of milliseconds")),
    }
}

/// Exit 0 when every condition holds, 1 with one line per violation on stdout (`-o
/// json`: every condition checked, then the verdict); an unreadable file is an error
/// (exit 2).
pub fn run(args: &CheckArgs) -> anyhow::Result<Outcome> {
    let file = args.file.display().to_string();
    let mut recording = Recording::read(&args.file)?;
    if let Some(span) = args.span.span(&recording, &file)? {
        recording = span.apply(&recording);
    }
    let (services, verdicts) = judge_recording(&recording, &args.conditions());
    let holds = verdicts.iter().all(|v| v.violation.is_none());
    let report = match args.format {
        CheckFormat::Json => render_json(&file, &verdicts, &services),
        CheckFormat::Junit => render_junit(&file, &verdicts, chrono::Utc::now()),
        CheckFormat::Table if holds => {
            let connections: u64 = services.iter().map(|s| s.connections).sum();
            format!(
                "ok: {file}: {}, {}, every condition holds\n",
                plural(services.len() as u64, "Service"),
                plural(connections, "connection"),
            )
        }
        CheckFormat::Table => verdicts
            .iter()
            .filter_map(|v| Some(format!("{}: {}\n", v.subject, v.violation.as_ref()?)))
            .collect(),
    };
    emit(&report)?;
    Ok(if holds {
        Outcome::Success
    } else {
        Outcome::ConditionFailed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(name: &str) -> CheckArgs {
        CheckArgs {
            file: format!("{}/tests/data/logs/{name}", env!("CARGO_MANIFEST_DIR")).into(),
            ..CheckArgs::default()
        }
    }

    #[test]
    fn exit_codes() {
        let failing = CheckArgs {
            max_skew: Some(1.5),
            ..args("keepalive.jsonl")
        };
        assert!(matches!(run(&failing).unwrap(), Outcome::ConditionFailed));
        let passing = CheckArgs {
            max_skew: Some(1.5),
            ..args("balanced.jsonl")
        };
        assert!(matches!(run(&passing).unwrap(), Outcome::Success));
        for broken in ["missing.jsonl", "empty.jsonl", "corrupt.jsonl"] {
            assert!(run(&args(broken)).is_err(), "{broken}");
        }
    }

    #[test]
    fn max_skew_below_one_is_rejected() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            check: CheckArgs,
        }
        let parsed = Cli::try_parse_from(["observer", "--max-skew", "0.5", "x.jsonl"]);
        let err = parsed.err().unwrap();
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string().contains("\"0.5\" is not a ratio >= 1"),
            "{err}"
        );
        let parsed = Cli::try_parse_from([
            "observer",
            "--service",
            "a",
            "--service",
            "b",
            "--max-skew",
            "1.5",
            "x.jsonl",
        ])
        .unwrap();
        assert_eq!(parsed.check.service, ["a", "b"]);
        assert_eq!(
            (parsed.check.max_skew, parsed.check.max_lost),
            (Some(1.5), 0)
        );
        let parsed = Cli::try_parse_from([
            "observer",
            "--max-refused",
            "0",
            "--max-unanswered",
            "2",
            "--max-rejected",
            "3",
            "--max-connect-p99",
            "0.5",
            "x.jsonl",
        ])
        .unwrap();
        let conditions = parsed.check.conditions();
        assert_eq!(
            (
                conditions.max_refused,
                conditions.max_unanswered,
                conditions.max_rejected,
                conditions.max_connect_p99
            ),
            (Some(0), Some(2), Some(3), Some(0.5))
        );
        let parsed = Cli::try_parse_from(["observer", "--confidence", "0.999", "x.jsonl"]).unwrap();
        assert_eq!(parsed.check.conditions().confidence, Some(0.999));
        for bad in ["1", "0", "1.5", "x"] {
            let flag = format!("--confidence={bad}");
            let err = Cli::try_parse_from(["observer", &flag, "x.jsonl"])
                .err()
                .unwrap();
            assert!(
                err.to_string()
                    .contains(&format!("`{bad}` is not a confidence between 0 and 1")),
                "{err}"
            );
        }
        for bad in ["0", "-1", "abc", "inf"] {
            let flag = format!("--max-connect-p99={bad}");
            let err = Cli::try_parse_from(["observer", &flag, "x.jsonl"])
                .err()
                .unwrap();
            assert_eq!(err.exit_code(), 2);
            assert!(
                err.to_string()
                    .contains(&format!("`{bad}` is not a positive number of milliseconds")),
                "{err}"
            );
        }
    }
}
