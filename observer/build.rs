//! Builds `observer-ebpf` for the BPF target (aya-build runs `cargo +nightly build
//! --target bpfel-unknown-none -Z build-std=core`) so that `src/kernel/capture.rs` can
//! embed the object with `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "observer-ebpf",
            root_dir: "../observer-ebpf",
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
