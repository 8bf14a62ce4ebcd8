//! `cargo xtask test`: sets up, builds the release artifacts (`cargo xtask dist`), runs
//! the aarch64 unit tests under qemu user emulation, then every test: unit tests and the
//! root integration tests (real conntrack, NAT and eBPF in network namespaces the tests
//! create), which a plain `cargo test` leaves out (`#[ignore = "root: ..."]`) and this
//! runs with `--include-ignored`. Root tests fail rather than skip when not run as root.
//! Then `cargo xtask kernels` with the dist binaries: the same observer on Debian's 5.10,
//! 6.1 and 6.12 kernels, x86_64 and arm64, under qemu (`--no-kernels` leaves it out).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::dist::{ARCHES, dist};
use crate::setup::{output, run, setup};

pub fn test(extra: &[String], kernels: bool) -> anyhow::Result<()> {
    setup()?;
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the test suite includes root tests (eBPF programs, network namespaces); run it as root: sudo -E cargo xtask test"
        );
    }
    enough_disk(&crate::workspace_root().join("target"))?;
    let dist_dir = dist()?;
    aarch64_under_qemu(&dist_dir)?;
    // One test binary at a time, one test at a time: root tests each build a lab of
    // network namespaces and attach kernel programs that see every namespace.
    // The workspace's default members: everything but the eBPF crate, which only builds
    // for the BPF target (observer's build.rs builds it). Tests of the release artifacts
    // find them through OBSERVER_DIST. The root tests, and those that need the release
    // artifacts or what `setup` installs, are `#[ignore]`d so that a plain `cargo test`
    // passes for a normal user; `--include-ignored` runs them here, with everything else.
    let tests = run(Command::new("cargo")
        .args(["test", "--locked", "--no-fail-fast"])
        .args(extra)
        .args(["--", "--include-ignored", "--test-threads=1"])
        .env("OBSERVER_DIST", &dist_dir));
    let tests = tests.and(second_passes(extra, &dist_dir));
    // Run on Debian's kernels even when a test failed: both results are worth having.
    let kernels = if kernels {
        crate::kernels::kernels(crate::kernels::KernelsArgs::with_dist(dist_dir.clone()))
    } else {
        Ok(())
    };
    match (tests, kernels) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(tests), Err(kernels)) => bail!("{tests:#}; and {kernels:#}"),
    }
}

/// The root tests that follow forwarded packets, run again with the forwarding program on
/// `net_dev_queue` (`OBSERVER_HOOK=dev-queue`, which observer reads for `--hook`) where
/// the first pass ran it on the netfilter hooks (`--hook auto`, Linux 6.12+): churn,
/// floods and overload, conntrack's own flushes, deletes and reuse, long UDP flows,
/// host-network clients, DNS, outcomes, IPv6, the policies' expected shares, and the
/// programs observer holds.
const SECOND_HOOK_TESTS: [&str; 12] = [
    "churn",
    "hostile",
    "overload",
    "conntrack_lab",
    "udp_stream",
    "host_network",
    "dns_lab",
    "outcomes",
    "ipv6",
    "traffic_policies",
    "last_packet",
    "record_lab",
];

/// The root tests that exercise the kernel's connection table, run again on the netfilter
/// hooks with a first level (`NEAR_CONNS`) of 2 entries (`OBSERVER_NEAR_CONNECTIONS`, which
/// observer reads for its hidden `--near-connections`): nearly every connection spills into
/// `CONNS`, so both levels carry the churn, floods, overload, conntrack's own flushes,
/// deletes and reuse, clashes, long UDP flows and outcomes.
const SPILL_TESTS: [&str; 11] = [
    "churn",
    "hostile",
    "overload",
    "conntrack_lab",
    "flush",
    "netfilter_hook",
    "stale_pin",
    "udp_stream",
    "outcomes",
    "last_packet",
    "record_lab",
];

/// `SECOND_HOOK_TESTS` under `--hook dev-queue`, where the first pass used the netfilter
/// hooks, then `SPILL_TESTS` with a first level of 2 entries (on older kernels both
/// passes would be the same as the first).
fn second_passes(extra: &[String], dist_dir: &std::path::Path) -> anyhow::Result<()> {
    let release = nix::sys::utsname::uname()?
        .release()
        .to_string_lossy()
        .into_owned();
    let version: Vec<u32> = release
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|part| part.parse().ok())
        .collect();
    if version.as_slice() < [6, 12].as_slice() {
        println!("Linux {release}: the tests ran on net_dev_queue (the netfilter hook needs 6.12)");
        return Ok(());
    }
    let dev_queue = pass(
        &SECOND_HOOK_TESTS,
        extra,
        dist_dir,
        ("OBSERVER_HOOK", "dev-queue"),
    );
    let spill = pass(
        &SPILL_TESTS,
        extra,
        dist_dir,
        ("OBSERVER_NEAR_CONNECTIONS", "2"),
    );
    match (dev_queue, spill) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(dev_queue), Err(spill)) => bail!("{dev_queue:#}; and {spill:#}"),
    }
}

/// `tests` again, one at a time, with `variable` set.
fn pass(
    tests: &[&str],
    extra: &[String],
    dist_dir: &std::path::Path,
    (name, value): (&str, &str),
) -> anyhow::Result<()> {
    println!("again with {name}={value}: {}", tests.join(", "));
    let mut command = Command::new("cargo");
    command.args(["test", "--locked", "--no-fail-fast", "-p", "observer"]);
    for test in tests {
        command.args(["--test", test]);
    }
    run(command
        .args(extra)
        .args(["--", "--include-ignored", "--test-threads=1"])
        .env("OBSERVER_DIST", dist_dir)
        .env(name, value))
}

/// The whole run writes about 5 GB (release builds for two targets, ~30 test binaries,
/// Debian's x86_64 and arm64 kernels, 2 GB of them); asking first turns a disk that fills
/// half way into one sentence.
const DISK_NEEDED: u64 = 6 << 30;

fn enough_disk(target: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(target)
        .with_context(|| format!("cannot create {}", target.display()))?;
    let stat = nix::sys::statvfs::statvfs(target)
        .with_context(|| format!("cannot read the free space of {}", target.display()))?;
    let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    if free < DISK_NEEDED {
        bail!(
            "{} has {:.1} GB free; the test run needs about {} GB (builds, test binaries, Debian kernels)",
            target.display(),
            free as f64 / 1e9,
            DISK_NEEDED >> 30
        );
    }
    Ok(())
}

/// The aarch64 build's unit tests and the aarch64 binary's `--help`, run by
/// qemu-aarch64-static (no binfmt registration needed). The tests build with the
/// release profile so they share their dependencies with the dist build.
fn aarch64_under_qemu(dist_dir: &std::path::Path) -> anyhow::Result<()> {
    let target = ARCHES[1].target;
    let messages = output(Command::new("cargo").args([
        "test",
        "--locked",
        "--release",
        "--no-run",
        "--message-format=json",
        "-p",
        "observer",
        "--lib",
        "--target",
        target,
    ]))?;
    let executable: PathBuf = messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo built no aarch64 unit-test executable")?;
    eprintln!("test: aarch64 unit tests under qemu-aarch64-static");
    run(Command::new("qemu-aarch64-static")
        .arg(&executable)
        .arg("--quiet"))?;
    let help = output(
        Command::new("qemu-aarch64-static")
            .arg(dist_dir.join("observer-linux-aarch64"))
            .arg("--help"),
    )?;
    if !help.contains("Usage: observer") {
        bail!("the aarch64 binary's --help printed no usage line:\n{help}");
    }
    Ok(())
}
