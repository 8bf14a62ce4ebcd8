//! The `observer` binary: everything is in [`observer::cli`].

fn main() -> std::process::ExitCode {
    observer::cli::main()
}
