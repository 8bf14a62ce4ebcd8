//! Bad input ends in one clear sentence and a non-zero exit, never a panic, and leaves
//! nothing behind (no log file created, no programs attached).

mod common;

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
#[ignore = "root: run by cargo xtask test"]
fn unwritable_output_path() {
    let out = observer(&[
        "record",
        "--write",
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
        let out = observer(&["record", "--write", "-", &format!("--duration={bad}")]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            stderr(&out).contains("is not a positive number of seconds"),
            "{bad}: {}",
            stderr(&out)
        );
    }
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn missing_btf() {
    // Needs root to get past the privilege check (CI runs as root).
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root; run the suite with `sudo -E cargo xtask test`"
    );
    let out = observer(&[
        "record",
        "--write",
        "-",
        "--duration",
        "1",
        "--btf",
        "/nonexistent/vmlinux",
    ]);
    assert_one_sentence(&out, "cannot read kernel BTF at /nonexistent/vmlinux");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
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
    // Runs the copy as `nobody`, without capabilities.
    let as_nobody = |args: &[&std::ffi::OsStr]| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(&binary)
            .args(args)
            .output()
            .expect("setpriv (util-linux)")
    };
    let out = as_nobody(&[
        "record".as_ref(),
        "--write".as_ref(),
        log.as_os_str(),
        "--duration".as_ref(),
        "1".as_ref(),
    ]);
    assert_one_sentence(
        &out,
        "loading kernel programs needs root: this process lacks CAP_SYS_ADMIN (or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN); run observer with sudo",
    );
    assert!(
        !log.exists(),
        "nothing is written when the privilege check fails"
    );
    // The live view says so before it would take over the screen.
    let out = as_nobody(&[]);
    assert_one_sentence(
        &out,
        "loading kernel programs needs root: this process lacks CAP_SYS_ADMIN (or CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN)",
    );
}

#[test]
fn corrupt_replay_file_names_the_line() {
    let corrupt = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/logs/corrupt.jsonl");
    let out = observer(&["--replay", corrupt]);
    assert_one_sentence(&out, "corrupt.jsonl:3: not a connection log line");
}

#[test]
fn live_view_without_a_terminal_suggests_record() {
    let log = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/logs/keepalive.jsonl"
    );
    let out = observer(&["--replay", log]);
    assert_one_sentence(
        &out,
        "observer's live view needs a terminal; use `observer record --write FILE`",
    );
}

#[test]
fn missing_replay_file() {
    let out = observer(&["--replay", "/nonexistent/conns.jsonl"]);
    assert_one_sentence(&out, "/nonexistent/conns.jsonl: cannot read");
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn a_failed_start_leaves_an_existing_log_intact() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root to get past the privilege check"
    );
    let dir = tempfile::tempdir().unwrap();
    let keep = dir.path().join("keep.jsonl");
    let before = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/logs/mixed.jsonl"
    ))
    .unwrap();
    std::fs::write(&keep, &before).unwrap();
    let keep_arg = keep.to_str().unwrap();
    let out = observer(&[
        "record",
        "-w",
        keep_arg,
        "--duration",
        "1",
        "--btf",
        "/nonexistent",
    ]);
    assert_one_sentence(&out, "cannot read kernel BTF at /nonexistent");
    assert_eq!(std::fs::read(&keep).unwrap(), before, "the log was touched");
    // Nothing else was left beside it (the writability probe is removed).
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // An unwritable path still fails before anything is attached.
    let out = observer(&[
        "record",
        "-w",
        dir.path().to_str().unwrap(),
        "--btf",
        "/nonexistent",
    ]);
    assert_one_sentence(&out, "cannot write the connection log to");
}

#[test]
fn a_cut_log_is_summarized_with_a_warning() {
    let cut = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/logs/cut.jsonl");
    let out = observer(&["summary", cut]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(
        text.trim(),
        format!(
            "observer: warning: {cut}:3: the log was cut at line 3 (observer did not exit cleanly): read up to the line before it; counts are incomplete"
        )
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("shop/checkout:http"));
    let out = observer(&["check", cut]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "recording: the log was cut at line 3 (observer did not exit cleanly): counts are incomplete\n"
    );
    // The replay reads it too (and then stops at the missing terminal).
    let out = observer(&["--replay", cut]);
    assert!(stderr(&out).contains("cut.jsonl:3: the log was cut at line 3"));
    assert!(stderr(&out).contains("needs a terminal"));
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn btf_that_is_not_btf_fails_at_once() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root to get past the privilege check"
    );
    // /dev/zero never ends: the reader must look at the header, not read it all.
    let mut child = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args([
            "record",
            "-w",
            "-",
            "--duration",
            "60",
            "--btf",
            "/dev/zero",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("observer kept reading /dev/zero for 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_one_sentence(
        &out,
        "cannot use kernel BTF at /dev/zero: not BTF (starts with 00 00",
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn kernel_too_old() {
    // Runs as root (CI does) so that only the kernel release stands in the way; the
    // UNAME26 personality makes uname(2) report a 2.6 release.
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root; run the suite with `sudo -E cargo xtask test`"
    );
    let out = Command::new("setarch")
        .args([std::env::consts::ARCH, "--uname-2.6"])
        .arg(env!("CARGO_BIN_EXE_observer"))
        .args(["record", "--write", "-", "--duration", "1"])
        .output()
        .expect("setarch (util-linux)");
    assert_eq!(out.status.code(), Some(2));
    assert_one_sentence(
        &out,
        "observer needs Linux 5.8 or newer (it reports through a BPF ring buffer); this kernel is 2.6.",
    );
}

#[test]
#[ignore = "root: run by cargo xtask test"]
fn without_cgroup_v2_it_says_what_goes_uncounted() {
    // A mount namespace of its own without the cgroup hierarchy: observer still records
    // (forwarded traffic needs no cgroup). On `net_dev_queue` it says in one sentence
    // what it cannot count; the netfilter hooks (Linux 6.12+) need no socket-side
    // programs and so no cgroup.
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root; run the suite with `sudo -E cargo xtask test`"
    );
    let cgroup_warning = "observer: warning: no cgroup v2 hierarchy is mounted: replies to clients on the node itself (host network) are not counted, and DNS over TCP is not decoded";
    let mut hooks = vec![("dev-queue", vec![cgroup_warning])];
    if common::netfilter_hook() {
        hooks.push(("netfilter", vec![]));
    }
    for (hook, expected) in hooks {
        let script = format!(
            "umount -l /sys/fs/cgroup && exec {} record --hook {hook} --write /dev/null --duration 1",
            env!("CARGO_BIN_EXE_observer")
        );
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .output()
            .expect("unshare (util-linux)");
        let text = stderr(&out);
        assert!(out.status.success(), "{hook}: {text}");
        // Other labs on this machine may add naming warnings; the cgroup one is checked.
        let warnings: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("warning") && l.contains("cgroup"))
            .collect();
        assert_eq!(warnings, expected, "{hook}");
        // The forwarding program and skb:kfree_skb's, without socket-side ones.
        assert!(
            text.contains("attached 2 kernel program(s)"),
            "{hook}: {text}"
        );
    }
}
