//! The `observer` command line: the live view (no subcommand) and every subcommand, each
//! in its own file with its arguments and its entry function.
//!
//! One convention for all of them: exit status 0 on success, 1 when a condition the user
//! asked about failed (`check`), 2 when the command could not do what was asked (bad
//! usage, unreadable input, missing privileges, a kernel that refuses the programs). Every
//! error is one line on stderr: `observer: <what failed>: <why>`.

mod args;
mod check;
mod live;
mod mark;
mod record;
mod rules;
mod serve;
mod session;
mod span;
mod summary;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use args::{FormatArg, OutputFormat, parse_seconds};

#[derive(Parser)]
#[command(
    name = "observer",
    version,
    about = "Shows, live and per connection, how Kubernetes Service traffic is really spread across pods on this node",
    long_about = "Shows, live and per connection, how Kubernetes Service traffic is really spread across pods on this node.\n\n\
        kube-proxy's NAT rules pick a pod once, on a connection's first packet; conntrack then pins every later \
        packet of that connection to the same pod. observer catches each decision in the kernel and shows how \
        long connections stay pinned and how many requests each carries.\n\n\
        Exit status: 0 success, 1 a condition asked about failed (check), 2 bad usage, unreadable input, \
        or the command could not run.",
    // The live view's flags belong to the live view: `observer --no-names summary F` is a
    // usage error, not a silently ignored flag.
    args_conflicts_with_subcommands = true,
    allow_negative_numbers = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    live: live::LiveArgs,
}

/// Every subcommand takes `-5` as a value (to refuse it with the same sentence as
/// `--flag=-5`), never as an unknown flag.
#[derive(Subcommand)]
enum Command {
    /// Record every DNATed connection on this node as JSON Lines (needs root).
    #[command(allow_negative_numbers = true)]
    Record(record::RecordArgs),
    /// Print the Services, frontends and endpoints (with expected shares) that the node's
    /// kube-proxy rules define, per network namespace (needs root).
    #[command(allow_negative_numbers = true)]
    Rules(rules::RulesArgs),
    /// Per Service and backend: connections, requests, share vs expected, pinning
    /// lifetimes and skew, from a recorded log.
    #[command(allow_negative_numbers = true)]
    Summary(summary::SummaryArgs),
    /// Exit 0 when a recorded log meets every condition, 1 with one line per violation.
    #[command(allow_negative_numbers = true)]
    Check(check::CheckArgs),
    /// Write a named moment into a log that `observer record` is writing (`check` and
    /// `summary` take `--since-mark NAME` and `--until-mark NAME`).
    Mark(mark::MarkArgs),
    /// Serve Prometheus metrics per Service and backend at http://ADDR/metrics (needs
    /// root; for a DaemonSet).
    #[command(allow_negative_numbers = true)]
    Serve(serve::ServeArgs),
    /// Record for a while and compare with conntrack's own DNAT decisions: exit 0 when
    /// observer recorded every one, 1 below 100%, 2 when it could not tell (needs root).
    Verify(verify::VerifyArgs),
}

/// How a command that ran to the end came out.
#[derive(Debug)]
pub enum Outcome {
    /// Exit 0.
    Success,
    /// Exit 1: a condition the user asked about does not hold.
    ConditionFailed,
}

/// Exit status for anything that kept the command from doing what was asked.
const EXIT_CANNOT: u8 = 2;

/// Parses the command line, runs the command, prints an error as one line.
pub fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Record(args)) => record::run(args),
        Some(Command::Rules(args)) => rules::run(&args),
        Some(Command::Summary(args)) => summary::run(&args),
        Some(Command::Check(args)) => check::run(&args),
        Some(Command::Mark(args)) => mark::run(&args),
        Some(Command::Serve(args)) => serve::run(args),
        Some(Command::Verify(args)) => verify::run(args),
        None => live::run(cli.live),
    };
    match result {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(Outcome::ConditionFailed) => ExitCode::from(1),
        Err(err) => {
            // The error and its causes on one line, joined by `: ` (no error's message
            // repeats its source's), as printable text: it may quote the node's.
            let line = crate::naming::printable::printable(
                format!("{err:#}"),
                crate::naming::printable::MESSAGE_BYTES,
            );
            eprintln!("observer: {line}");
            ExitCode::from(EXIT_CANNOT)
        }
    }
}

/// Writes a report to stdout; a reader that went away (`| head`) is not an error.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(err).context("cannot write to stdout"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::{Cli, Command};

    /// `-w/--write PATH` writes a log in every command that can; `-o` is a format. The
    /// older names of the log flags keep working.
    #[test]
    fn logs_are_written_with_w_and_older_names_still_parse() {
        for args in [
            ["observer", "record", "-w", "x.jsonl"],
            ["observer", "record", "--write", "x.jsonl"],
            ["observer", "record", "--output", "x.jsonl"],
        ] {
            match Cli::try_parse_from(args).map(|cli| cli.command) {
                Ok(Some(Command::Record(record))) => assert_eq!(record.write, "x.jsonl"),
                _ => panic!("{args:?} does not parse"),
            }
        }
        for args in [["observer", "-w", "x"], ["observer", "--record", "x"]] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert_eq!(cli.live.write.as_deref(), Some("x"), "{args:?}");
        }
        for args in [
            ["observer", "serve", "-w", "-"],
            ["observer", "serve", "--log", "-"],
        ] {
            match Cli::try_parse_from(args).map(|cli| cli.command) {
                Ok(Some(Command::Serve(serve))) => assert_eq!(serve.write.as_deref(), Some("-")),
                _ => panic!("{args:?} does not parse"),
            }
        }
        match Cli::try_parse_from(["observer", "verify", "-w", "x", "-o", "json"])
            .map(|cli| cli.command)
        {
            Ok(Some(Command::Verify(verify))) => {
                assert_eq!(verify.write.as_deref(), Some(std::path::Path::new("x")));
                assert_eq!(verify.output.format, super::OutputFormat::Json);
            }
            _ => panic!("verify -w x -o json does not parse"),
        }
        assert!(Cli::try_parse_from(["observer", "record", "-o", "x.jsonl"]).is_err());
    }
}
