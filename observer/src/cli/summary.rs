//! `observer summary FILE`: per Service and per backend, how a recording's traffic was
//! spread (the report itself is [`crate::report::summary`]).

use std::path::PathBuf;

use anyhow::bail;

use super::span::SpanArgs;
use super::{FormatArg, Outcome, OutputFormat, emit};
use crate::model::record::Recording;
use crate::report::summary::{SummaryJson, render_with, without_pod_names};
use crate::report::why::stories;
use crate::stats::Aggregator;
use crate::stats::timeline::Timeline;

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("format", |a| a.help(
    "`table` for people, `json` for one JSON object (the summary and every Service)"
)))]
pub struct SummaryArgs {
    /// Connection log written by `observer record` (JSON Lines).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub output: FormatArg,
    #[command(flatten)]
    pub span: SpanArgs,
    /// Only this Service (`ns/name:port`, or `IP:port` for unnamed ones).
    #[arg(long, value_name = "NAME", conflicts_with = "dns")]
    pub service: Option<String>,
    /// DNS instead: per client, lookups, queries per lookup, NXDOMAIN share and the
    /// search walks (`checkout -> checkout.shop.svc.cluster.local: 2 queries`).
    #[arg(long)]
    pub dns: bool,
    /// IP addresses only: no pod names in the table (by default each backend's pod is
    /// shown beside its address where the recording names it; JSON always has both).
    #[arg(long)]
    pub addresses: bool,
}

pub fn run(args: &SummaryArgs) -> anyhow::Result<Outcome> {
    let mut recording = Recording::read(&args.file)?;
    let file = args.file.display().to_string();
    if let Some(span) = args.span.span(&recording, &file)? {
        recording = span.apply(&recording);
    }
    // A cut log is still worth a report: say so, on stderr so that JSON stays JSON.
    if let Some(warning) = recording.cut_warning(&file) {
        eprintln!("observer: warning: {warning}");
    }
    if args.dns {
        return dns(args, &file, &recording);
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
    let stories = stories(&services, &recording);
    match args.output.format {
        OutputFormat::Json => {
            let json = SummaryJson::new(&file, recording.summary.as_ref(), &services, &stories);
            emit(&(serde_json::to_string(&json)? + "\n"))?;
        }
        OutputFormat::Table => {
            // Pins still open at the end are counted until the recording's end.
            let end = recording.summary.as_ref().map(|s| s.ended).or_else(|| {
                recording
                    .conns
                    .iter()
                    .map(|c| c.end.unwrap_or(c.start))
                    .max()
            });
            let timeline = crate::report::timeline::render(
                &Timeline::from_recording(&recording),
                args.service.as_deref(),
                end.unwrap_or_else(chrono::Utc::now),
            );
            if args.addresses {
                without_pod_names(&mut services);
            }
            let report = render_with(&file, recording.summary.as_ref(), &services, &stories);
            emit(&(report + &timeline))?
        }
    }
    Ok(Outcome::Success)
}

/// `summary --dns`.
fn dns(args: &SummaryArgs, file: &str, recording: &Recording) -> anyhow::Result<Outcome> {
    use crate::stats::dns::{CLUSTER_DOMAIN, per_client};
    let clients = per_client(&recording.dns, CLUSTER_DOMAIN);
    let queries = recording.dns.len() as u64;
    let text = match args.output.format {
        OutputFormat::Json => {
            let json = crate::report::dns::DnsJson {
                file,
                queries,
                malformed: recording.summary.as_ref().map(|s| s.dns_malformed),
                lost: recording.summary.as_ref().map(|s| s.dns_lost),
                clients: &clients,
            };
            serde_json::to_string(&json)? + "\n"
        }
        OutputFormat::Table => {
            crate::report::dns::render(file, recording.summary.as_ref(), queries, &clients)
        }
    };
    emit(&text)?;
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
            output: FormatArg::default(),
            span: SpanArgs::default(),
            service: Some("shop/cart:http".to_owned()),
            dns: false,
            addresses: false,
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
                output: FormatArg::default(),
                span: SpanArgs::default(),
                addresses: false,
                service: None,
                dns: false,
            };
            format!("{:#}", run(&args).unwrap_err())
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
