//! `observer check FILE`: asserts how a recording's traffic was spread, for CI.
//!
//! Exit status: 0 when every condition holds; 1 with one line per violated condition;
//! 2 when the file cannot be read (missing, empty, or a line that is not a log line:
//! the message names the line) or the arguments are wrong.
//!
//! ```text
//! $ observer check --max-skew 1.5 --min-backends 3 observer/tests/data/logs/keepalive.jsonl
//! shop/checkout:http: 1 backend got requests < --min-backends 3 (none to 10.244.1.13:8080, 10.244.1.14:8080)
//! shop/checkout:http: skew 3.00 > --max-skew 1.5 (10.244.1.12:8080 got 100% of requests, expected 33%)
//! $ echo $?
//! 1
//! $ observer check --max-skew 1.5 --min-backends 3 observer/tests/data/logs/balanced.jsonl
//! ok: observer/tests/data/logs/balanced.jsonl: 1 Service, 6 connections, every condition holds
//! $ echo $?
//! 0
//! $ observer check --service shop/cart:http observer/tests/data/logs/mixed.jsonl
//! recording: 2 lost connections > --max-lost 0 (DNAT decisions without a record: counts are incomplete)
//! $ observer check observer/tests/data/logs/corrupt.jsonl
//! error: observer/tests/data/logs/corrupt.jsonl:3: not a connection log line: EOF while parsing an object at line 1 column 52
//! $ echo $?
//! 2
//! ```
//!
//! Conditions on Services apply to each Service selected with `--service` (all of them
//! by default); a `--service` the recording does not have is a violation. Skew and stale
//! pins are defined in [`crate::stats`].

use std::fmt;

use crate::model::record::{Recording, SummaryRecord};
use crate::sinks::summary::skew_cause;
use crate::sinks::text::plural;
use crate::stats::{Aggregator, ServiceStats};

/// What `observer check` asserts; `None` leaves a condition out.
#[derive(Debug, Clone, Default)]
pub struct Conditions {
    /// Only these Services (all when empty); a name the recording lacks is a violation.
    pub service: Vec<String>,
    pub max_skew: Option<f64>,
    pub min_backends: Option<u64>,
    pub max_stale: Option<u64>,
    pub min_connections: Option<u64>,
    pub max_lost: u64,
    pub min_requests: Option<u64>,
}

/// One violated condition: `subject: text`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The Service, or `recording` for whole-file conditions.
    pub subject: String,
    pub text: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.text)
    }
}

/// Evaluates the conditions on a recording: the Services checked and the violations.
pub fn check_recording(
    recording: &Recording,
    args: &Conditions,
) -> (Vec<ServiceStats>, Vec<Violation>) {
    let mut services = Aggregator::from_recording(recording).services();
    let found = violations(args, recording.summary.as_ref(), &services);
    if !args.service.is_empty() {
        services.retain(|s| args.service.contains(&s.service));
    }
    (services, found)
}

fn label(service: &ServiceStats) -> String {
    if service.named {
        service.service.clone()
    } else {
        format!("{}/{}", service.service, service.proto)
    }
}

/// Every violated condition, whole-file ones first, then per Service in name order.
pub fn violations(
    args: &Conditions,
    summary: Option<&SummaryRecord>,
    services: &[ServiceStats],
) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut violation = |subject: String, text: String| found.push(Violation { subject, text });
    let recording = || "recording".to_owned();
    match summary {
        None => violation(
            recording(),
            format!(
                "no summary line, so lost connections are unknown (the recording did not end cleanly) and --max-lost {} cannot hold",
                args.max_lost
            ),
        ),
        Some(s) if s.lost_connections > args.max_lost => violation(
            recording(),
            format!(
                "{} > --max-lost {} (DNAT decisions without a record: counts are incomplete)",
                plural(s.lost_connections, "lost connection"),
                args.max_lost
            ),
        ),
        Some(_) => {}
    }

    let selected: Vec<&ServiceStats> = if args.service.is_empty() {
        services.iter().collect()
    } else {
        services
            .iter()
            .filter(|s| args.service.contains(&s.service))
            .collect()
    };
    for name in &args.service {
        if !services.iter().any(|s| &s.service == name) {
            let known: Vec<&str> = services.iter().map(|s| s.service.as_str()).collect();
            let known = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            violation(
                name.clone(),
                format!("not in the recording (it has: {known})"),
            );
        }
    }
    let per_service = args.max_skew.is_some()
        || args.min_backends.is_some()
        || args.max_stale.is_some()
        || args.min_connections.is_some()
        || args.min_requests.is_some();
    if per_service && services.is_empty() && args.service.is_empty() {
        violation(
            recording(),
            "no Services or connections to check".to_owned(),
        );
    }

    for s in selected {
        let subject = || label(s);
        if let Some(min) = args.min_connections
            && s.connections < min
        {
            violation(
                subject(),
                format!(
                    "{} < --min-connections {min}",
                    plural(s.connections, "connection")
                ),
            );
        }
        if let Some(min) = args.min_requests
            && s.requests < min
        {
            violation(
                subject(),
                format!("{} < --min-requests {min}", plural(s.requests, "request")),
            );
        }
        if let Some(min) = args.min_backends {
            let served = s.backends.iter().filter(|b| b.requests > 0).count() as u64;
            if served < min {
                let idle: Vec<String> = s
                    .backends
                    .iter()
                    .filter(|b| b.requests == 0 && b.in_rules)
                    .map(|b| b.backend.to_string())
                    .collect();
                let detail = if idle.is_empty() {
                    String::new()
                } else {
                    format!(" (none to {})", idle.join(", "))
                };
                violation(
                    subject(),
                    format!(
                        "{} got requests < --min-backends {min}{detail}",
                        plural(served, "backend")
                    ),
                );
            }
        }
        if let Some(max) = args.max_skew
            && let Some(detail) = s.skew_detail()
            && detail.skew > max
        {
            violation(
                subject(),
                format!(
                    "skew {:.2} > --max-skew {max} ({})",
                    detail.skew,
                    skew_cause(&detail)
                ),
            );
        }
        if let Some(max) = args.max_stale
            && s.stale_pins > max
        {
            let pinned: Vec<String> = s
                .backends
                .iter()
                .filter(|b| b.stale_pins > 0)
                .map(|b| format!("{}: {}", b.backend, b.stale_pins))
                .collect();
            violation(
                subject(),
                format!(
                    "{} > --max-stale {max} ({})",
                    plural(s.stale_pins, "stale pin"),
                    pinned.join(", ")
                ),
            );
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::model::record::ReadError;

    /// A check as the command line states it: the file and the conditions.
    #[derive(Clone, Default)]
    struct CheckArgs {
        file: PathBuf,
        service: Vec<String>,
        max_skew: Option<f64>,
        min_backends: Option<u64>,
        max_stale: Option<u64>,
        min_connections: Option<u64>,
        max_lost: u64,
        min_requests: Option<u64>,
    }

    impl CheckArgs {
        fn conditions(&self) -> Conditions {
            Conditions {
                service: self.service.clone(),
                max_skew: self.max_skew,
                min_backends: self.min_backends,
                max_stale: self.max_stale,
                min_connections: self.min_connections,
                max_lost: self.max_lost,
                min_requests: self.min_requests,
            }
        }
    }

    fn check_file(args: &CheckArgs) -> Result<(Vec<ServiceStats>, Vec<Violation>), ReadError> {
        Ok(check_recording(
            &Recording::read(&args.file)?,
            &args.conditions(),
        ))
    }

    fn path(name: &str) -> PathBuf {
        format!("{}/tests/data/logs/{name}", env!("CARGO_MANIFEST_DIR")).into()
    }

    fn args(name: &str) -> CheckArgs {
        CheckArgs {
            file: path(name),
            ..CheckArgs::default()
        }
    }

    /// The violation lines `observer check` would print.
    fn lines(args: &CheckArgs) -> Vec<String> {
        let (_, found) = check_file(args).unwrap();
        found.iter().map(Violation::to_string).collect()
    }

    const CHECKOUT: &str = "shop/checkout:http";

    #[test]
    fn worked_example_in_the_module_doc_is_exact() {
        let keepalive = CheckArgs {
            max_skew: Some(1.5),
            min_backends: Some(3),
            ..args("keepalive.jsonl")
        };
        assert_eq!(
            lines(&keepalive),
            [
                "shop/checkout:http: 1 backend got requests < --min-backends 3 (none to 10.244.1.13:8080, 10.244.1.14:8080)",
                "shop/checkout:http: skew 3.00 > --max-skew 1.5 (10.244.1.12:8080 got 100% of requests, expected 33%)",
            ]
        );
        let balanced = CheckArgs {
            file: path("balanced.jsonl"),
            ..keepalive.clone()
        };
        assert_eq!(lines(&balanced), Vec::<String>::new());
        let mixed = CheckArgs {
            service: vec!["shop/cart:http".to_owned()],
            ..args("mixed.jsonl")
        };
        assert_eq!(
            lines(&mixed),
            [
                "recording: 2 lost connections > --max-lost 0 (DNAT decisions without a record: counts are incomplete)"
            ]
        );
    }

    #[test]
    fn unreadable_files_name_the_cause_and_line() {
        let err = |name: &str| check_file(&args(name)).unwrap_err().to_string();
        let dir = path("");
        let dir = dir.display();
        assert_eq!(
            err("corrupt.jsonl"),
            format!(
                "{dir}corrupt.jsonl:3: not a connection log line: EOF while parsing an object at line 1 column 52"
            )
        );
        assert_eq!(
            err("empty.jsonl"),
            format!(
                "{dir}empty.jsonl: the file is empty; expected JSON Lines written by `observer record`"
            )
        );
        assert!(
            err("missing.jsonl")
                .starts_with(&format!("{dir}missing.jsonl: cannot read: No such file"))
        );
    }

    #[test]
    fn max_skew_passes_at_the_limit_and_fails_above() {
        let at = CheckArgs {
            max_skew: Some(3.0),
            ..args("keepalive.jsonl")
        };
        // 1 / 0.33333333349 = 2.9999999986: within 3.
        assert_eq!(lines(&at), Vec::<String>::new());
        let below = CheckArgs {
            max_skew: Some(2.99),
            ..at
        };
        assert_eq!(
            lines(&below),
            [
                "shop/checkout:http: skew 3.00 > --max-skew 2.99 (10.244.1.12:8080 got 100% of requests, expected 33%)"
            ]
        );
    }

    #[test]
    fn min_backends_counts_backends_with_a_request() {
        let pass = CheckArgs {
            min_backends: Some(3),
            ..args("balanced.jsonl")
        };
        assert_eq!(lines(&pass), Vec::<String>::new());
        let fail = CheckArgs {
            min_backends: Some(4),
            ..pass
        };
        // Every endpoint got requests, so no idle ones to name.
        assert_eq!(
            lines(&fail),
            ["shop/checkout:http: 3 backends got requests < --min-backends 4"]
        );
    }

    #[test]
    fn min_connections_and_min_requests() {
        let pass = CheckArgs {
            min_connections: Some(6),
            min_requests: Some(30),
            ..args("balanced.jsonl")
        };
        assert_eq!(lines(&pass), Vec::<String>::new());
        let fail = CheckArgs {
            min_connections: Some(7),
            min_requests: Some(31),
            ..pass
        };
        assert_eq!(
            lines(&fail),
            [
                "shop/checkout:http: 6 connections < --min-connections 7",
                "shop/checkout:http: 30 requests < --min-requests 31",
            ]
        );
    }

    #[test]
    fn max_stale_and_unnamed_services_are_labelled_with_proto() {
        let check = |max_stale| CheckArgs {
            max_stale: Some(max_stale),
            min_connections: Some(2),
            max_lost: 2,
            ..args("mixed.jsonl")
        };
        assert_eq!(
            lines(&check(0)),
            [
                "10.96.0.10:53/udp: 1 connection < --min-connections 2",
                "shop/cart:http: 1 stale pin > --max-stale 0 (10.244.2.99:8080: 1)",
            ]
        );
        assert_eq!(
            lines(&check(1)),
            ["10.96.0.10:53/udp: 1 connection < --min-connections 2"]
        );
    }

    #[test]
    fn max_lost_and_a_missing_summary_line() {
        let lost = |max_lost| CheckArgs {
            max_lost,
            ..args("mixed.jsonl")
        };
        assert_eq!(lines(&lost(2)), Vec::<String>::new());
        assert_eq!(lines(&lost(1)).len(), 1);
        assert_eq!(
            lines(&args("nosummary.jsonl")),
            [
                "recording: no summary line, so lost connections are unknown (the recording did not end cleanly) and --max-lost 0 cannot hold"
            ]
        );
    }

    #[test]
    fn a_service_missing_from_the_recording_is_a_violation() {
        let check = CheckArgs {
            service: vec![CHECKOUT.to_owned(), "shop/cart:http".to_owned()],
            min_connections: Some(1),
            ..args("keepalive.jsonl")
        };
        assert_eq!(
            lines(&check),
            ["shop/cart:http: not in the recording (it has: shop/checkout:http)"]
        );
        // `observer check` exits 1 exactly when there are violations.
        assert!(!check_file(&check).unwrap().1.is_empty());
    }

    #[test]
    fn conditions_on_a_recording_without_services_fail() {
        let summary = SummaryRecord::default();
        let check = CheckArgs {
            min_requests: Some(1),
            ..CheckArgs::default()
        };
        let found: Vec<String> = violations(&check.conditions(), Some(&summary), &[])
            .iter()
            .map(Violation::to_string)
            .collect();
        assert_eq!(found, ["recording: no Services or connections to check"]);
        // Without per-Service conditions an empty, loss-free recording passes.
        assert_eq!(violations(&Conditions::default(), Some(&summary), &[]), []);
    }

    #[test]
    fn service_filter_limits_the_conditions_to_the_named_services() {
        let check = CheckArgs {
            service: vec!["shop/cart:http".to_owned()],
            min_connections: Some(2),
            max_lost: 2,
            ..args("mixed.jsonl")
        };
        // The unnamed DNS service has 1 connection but is not selected.
        assert_eq!(lines(&check), Vec::<String>::new());
        let (services, _) = check_file(&check).unwrap();
        assert_eq!(services.len(), 1);
    }
}
