use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer tasks for observer.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// A simulated kind node (network namespaces, kube-proxy rules, pods, a client).
    Lab(xtask::lab::cli::LabArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Lab(args) => xtask::lab::cli::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
