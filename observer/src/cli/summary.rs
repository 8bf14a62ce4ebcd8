//! `observer summary FILE`: per Service and per backend, how a recording's traffic was
//! spread (the report itself is [`crate::sinks::summary`]).

use std::path::PathBuf;

use anyhow::bail;

use super::{Outcome, OutputFormat, emit};
use crate::model::record::Recording;
use crate::sinks::summary::{SummaryJson, render};
use crate::stats::Aggregator;

#[derive(Debug, Clone, clap::Args)]
pub struct SummaryArgs {
    /// Connection log written by `observer record` (JSON Lines).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// `table` for people, `json` for one JSON object (the summary and every Service).
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FORMAT",
        value_enum,
        default_value_t
    )]
    pub format: OutputFormat,
    /// Only this Service (`ns/name:port`, or `IP:port` for unnamed ones).
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
}

pub fn run(args: &SummaryArgs) -> anyhow::Result<Outcome> {
    let recording = Recording::read(&args.file)?;
    let file = args.file.display().to_string();
    // A cut log is still worth a report: say so, on stderr so that JSON stays JSON.
    if let Some(warning) = recording.cut_warning(&file) {
        eprintln!("observer: warning: {warning}");
    }
    let mut services = Aggregator::from_recording(&recording).services();
    if let Some(name) = &args.service {
        let known: Vec<String> = services.iter().map(|s| s.service.clone()).collect();
        services.retain(|s| &s.service == name);
        if services.is_empty() {
            bail!(
                "{file} has no Service {name:?}; it has: {}",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            );
        }
    }
    match args.format {
        OutputFormat::Json => {
            let json = SummaryJson {
                file: &file,
                summary: recording.summary.as_ref(),
                services: &services,
            };
            emit(&(serde_json::to_string(&json)? + "\n"))?;
        }
        OutputFormat::Table => emit(&render(&file, recording.summary.as_ref(), &services))?,
    }
    Ok(Outcome::Success)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_service_filter_is_an_error_naming_the_known_ones() {
        let args = SummaryArgs {
            file: format!(
                "{}/tests/data/logs/keepalive.jsonl",
                env!("CARGO_MANIFEST_DIR")
            )
            .into(),
            format: OutputFormat::Table,
            service: Some("shop/cart:http".to_owned()),
        };
        let err = run(&args).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "keepalive.jsonl has no Service \"shop/cart:http\"; it has: shop/checkout:http"
            ),
            "{err}"
        );
    }

    #[test]
    fn unreadable_files_are_errors_naming_the_cause() {
        let dir = format!("{}/tests/data/logs", env!("CARGO_MANIFEST_DIR"));
        let run_on = |name: &str| {
            let args = SummaryArgs {
                file: format!("{dir}/{name}").into(),
                format: OutputFormat::Table,
                service: None,
            };
            run(&args).unwrap_err().to_string()
        };
        assert!(
            run_on("corrupt.jsonl")
                .starts_with(&format!("{dir}/corrupt.jsonl:3: not a connection log line"))
        );
        assert!(run_on("empty.jsonl").ends_with(
            "empty.jsonl: the file is empty; expected JSON Lines written by `observer record`"
        ));
        assert!(
            run_on("missing.jsonl").starts_with(&format!("{dir}/missing.jsonl: cannot read: "))
        );
    }
}
