//! `cargo xtask test`: sets up, then runs every test: unit tests and the root
//! integration tests (real conntrack, NAT and eBPF in network namespaces the tests
//! create). Root tests fail rather than skip when not run as root. Then `cargo xtask
//! kernels`: the same observer on Debian's 5.10, 6.1 and 6.12 kernels under qemu
//! (about 2-4 minutes; `--no-kernels` leaves it out).

use std::process::Command;

use anyhow::bail;

use crate::setup::{run, setup};

pub fn test(extra: &[String], kernels: bool) -> anyhow::Result<()> {
    setup()?;
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the test suite includes root tests (eBPF programs, network namespaces); run it as root: sudo -E cargo xtask test"
        );
    }
    // One test binary at a time, one test at a time: root tests each build a lab of
    // network namespaces and attach kernel programs that see every namespace.
    // The workspace's default members: everything but the eBPF crate, which only builds
    // for the BPF target (observer's build.rs builds it).
    let tests = run(Command::new("cargo")
        .args(["test", "--locked", "--no-fail-fast"])
        .args(extra)
        .args(["--", "--test-threads=1"]));
    // Run on Debian's kernels even when a test failed: both results are worth having.
    let kernels = if kernels {
        crate::kernels::kernels(crate::kernels::KernelsArgs::default())
    } else {
        Ok(())
    };
    match (tests, kernels) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(tests), Err(kernels)) => bail!("{tests:#}; and {kernels:#}"),
    }
}
