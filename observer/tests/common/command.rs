//! Running a helper program whose failure fails the test.

use std::process::{Command, Output};

/// Runs `command` and returns its output; panics with both streams unless it succeeds.
pub fn run(command: &mut Command) -> Output {
    run_hinting(command, "")
}

/// Like [`run`], with `hint` (e.g. how to install the program) added when it cannot start.
pub fn run_hinting(command: &mut Command, hint: &str) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}{hint}"));
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
