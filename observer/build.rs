//! Builds `observer-ebpf` for the BPF target (aya-build runs `cargo +nightly build
//! --target bpfel-unknown-none -Z build-std=core`) so that `src/kernel/capture.rs` can
//! embed the object with `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
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
