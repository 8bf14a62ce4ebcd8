use which::which;

/// Rebuild the eBPF object when bpf-linker changes (aya-template does the same): the
/// linker is not a cargo dependency, so cargo cannot see it otherwise.
fn main() {
    let bpf_linker = which("bpf-linker").expect(
        "bpf-linker is not on PATH; run `cargo xtask setup` (it builds bpf-linker against the nightly toolchain's LLVM)",
    );
    println!(
        "cargo:rerun-if-changed={}",
        bpf_linker.to_str().unwrap_or_default()
    );
}
