//! Builds `observer-ebpf` for the BPF target (aya-build runs `cargo +nightly build
//! --target bpfel-unknown-none -Z build-std=core`) so that `src/kernel/capture.rs` can
//! embed the object with `include_bytes_aligned!`.
//!
//! aya-build relays every line the nested cargo prints as a `cargo:warning`, so a first
//! build showed about 120 `warning: observer@0.1.0:    Compiling ...` lines. This script
//! therefore runs aya-build in a child process of its own (itself, marked by
//! `CHILD`) and reads what it prints: cargo's progress lines are dropped, the
//! directives are passed on, what the compiler said (warnings) is passed on, and the
//! build says one line (`warning: observer@0.1.0: built the eBPF programs ...`: a build
//! script's only way to be heard). When the eBPF build fails, everything but the progress
//! goes to stderr, which cargo shows in full under the failed build script.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, ExitCode, Stdio};

/// Set in the child that runs aya-build.
const CHILD: &str = "OBSERVER_BUILD_EBPF_CHILD";

const WARNING: &str = "cargo:warning=";

fn main() -> ExitCode {
    let result = if std::env::var_os(CHILD).is_some() {
        build_ebpf()
    } else {
        quietly_build_ebpf()
    };
    // The error alone, without the backtrace `anyhow` adds under RUST_BACKTRACE.
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `build_ebpf` in a child and passes on what matters of what it prints.
fn quietly_build_ebpf() -> anyhow::Result<()> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut said = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        match line.strip_prefix(WARNING) {
            Some(text) if is_progress(text) || text.trim().is_empty() => {}
            Some(text) => said.push(text.to_owned()),
            None => println!("{line}"),
        }
    }
    if !child.wait()?.success() {
        for text in &said {
            eprintln!("{text}");
        }
        anyhow::bail!("building the eBPF programs (observer-ebpf) failed");
    }
    for text in &said {
        println!("{WARNING}{text}");
    }
    println!("{WARNING}built the eBPF programs (observer-ebpf, nightly toolchain)");
    Ok(())
}

/// Whether a line of the nested cargo is one of its progress lines (`   Compiling core
/// v0.0.0 (...)`, `    Finished ...`): a verb right-aligned in 12 columns.
fn is_progress(text: &str) -> bool {
    let verb = text.trim_start();
    let indent = text.len() - verb.len();
    indent > 0
        && verb.split_once(' ').is_some_and(|(verb, _)| {
            indent + verb.len() == 12 && verb.starts_with(char::is_uppercase)
        })
}

fn build_ebpf() -> anyhow::Result<()> {
    // aya-build watches `observer-ebpf` only; the programs also compile the shared
    // types, so a change there must rebuild them too (aya refuses a map whose value
    // size no longer matches, but only at load time).
    println!("cargo:rerun-if-changed=../observer-common");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "observer-ebpf",
            root_dir: "../observer-ebpf",
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
