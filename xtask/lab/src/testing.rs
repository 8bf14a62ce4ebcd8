//! What every root test shares, in observer's tests and the lab's own: the root check and
//! a namespace prefix per test. The root tests are `#[ignore = "root: ..."]`, so a plain
//! `cargo test` leaves them out; `cargo xtask test` runs them as root with
//! `--include-ignored`.

/// Root tests fail, never skip, without root: CI runs them as root and must run them.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (eBPF programs, network namespaces, netfilter rules); run the suite with `sudo -E cargo xtask test`, or one test with `sudo -E cargo test --test NAME -- --include-ignored`"
    );
}

/// A lab prefix unique per test and per test process, so that labs of tests running
/// side by side never share namespaces. At most 16 characters for tags of up to 7.
pub fn prefix(test: &str) -> String {
    format!("ot{test}{}", std::process::id())
}
