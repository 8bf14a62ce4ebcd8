//! Bad input ends in one clear sentence and a non-zero exit, never a panic, and leaves
//! nothing behind (no log file created, no programs attached).

use std::process::{Command, Output};

fn observer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(args)
        .output()
        .expect("run observer")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_one_sentence(out: &Output, needle: &str) {
    let text = stderr(out);
    assert!(
        !out.status.success(),
        "expected failure, got {:?}: {text}",
        out.status
    );
    assert!(text.contains(needle), "stderr lacks {needle:?}: {text}");
    assert!(!text.contains("panicked"), "panic: {text}");
    assert_eq!(text.trim().lines().count(), 1, "one line expected: {text}");
}

#[test]
fn unwritable_output_path() {
    let out = observer(&[
        "record",
        "--output",
        "/nonexistent-dir/conns.jsonl",
        "--duration",
        "1",
    ]);
    assert_one_sentence(
        &out,
        "cannot write the connection log to /nonexistent-dir/conns.jsonl",
    );
}

#[test]
fn bad_durations() {
    for bad in ["0", "-3", "abc", "inf"] {
        let out = observer(&["record", "--output", "-", &format!("--duration={bad}")]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            stderr(&out).contains("is not a positive number of seconds"),
            "{bad}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn missing_btf() {
    // Needs root to get past the privilege check (CI runs as root).
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root; run the suite with `sudo -E cargo xtask test`"
    );
    let out = observer(&[
        "record",
        "--output",
        "-",
        "--duration",
        "1",
        "--btf",
        "/nonexistent/vmlinux",
    ]);
    assert_one_sentence(&out, "cannot read kernel BTF at /nonexistent/vmlinux");
}

#[test]
fn not_privileged() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test drops root to check the message; run it as root"
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("conns.jsonl");
    // The test binary's directory may not be reachable for nobody: run a copy.
    let binary = dir.path().join("observer");
    std::fs::copy(env!("CARGO_BIN_EXE_observer"), &binary).unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&binary)
        .args(["record", "--output"])
        .arg(&log)
        .args(["--duration", "1"])
        .output()
        .expect("setpriv (util-linux)");
    assert_one_sentence(
        &out,
        "needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN); run observer with sudo",
    );
    assert!(
        !log.exists(),
        "nothing is written when the privilege check fails"
    );
}
