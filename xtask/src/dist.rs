//! `cargo xtask dist`: static (musl) `observer` binaries for x86_64 and aarch64, each
//! embedding the eBPF object, a scratch OCI image for both architectures (one archive),
//! and SHA256SUMS, in `target/dist/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use crate::oci;
use crate::setup::run;

/// A release architecture: Rust's target, ELF machine number, OCI's name for it.
pub struct Arch {
    pub target: &'static str,
    pub name: &'static str,
    elf_machine: u16,
    pub oci: &'static str,
}

pub const ARCHES: [Arch; 2] = [
    Arch {
        target: "x86_64-unknown-linux-musl",
        name: "x86_64",
        elf_machine: 62,
        oci: "amd64",
    },
    Arch {
        target: "aarch64-unknown-linux-musl",
        name: "aarch64",
        elf_machine: 183,
        oci: "arm64",
    },
];

/// The image reference the DaemonSet in deploy/ runs.
pub const IMAGE_NAME: &str = "docker.io/library/observer";

/// The OCI archive of the image, for every architecture at once.
pub const IMAGE_ARCHIVE: &str = "observer-image.tar";

/// Cargo's target directory (CARGO_TARGET_DIR, or `target/` in the workspace).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"))
}

pub fn dist_dir() -> PathBuf {
    target_dir().join("dist")
}

fn version() -> anyhow::Result<String> {
    let manifest = std::fs::read_to_string(crate::workspace_root().join("observer/Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .map(str::to_owned)
        .context("no version in observer/Cargo.toml")
}

/// Builds everything into `target/dist/` and returns that directory.
pub fn dist() -> anyhow::Result<PathBuf> {
    let mut build = Command::new("cargo");
    build.args(["build", "--locked", "--release", "-p", "observer"]);
    for arch in &ARCHES {
        build.args(["--target", arch.target]);
    }
    run(&mut build)?;
    let dir = dist_dir();
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let mut files = Vec::new();
    let mut binaries = Vec::new();
    for arch in &ARCHES {
        let built = target_dir().join(arch.target).join("release/observer");
        let binary =
            std::fs::read(&built).with_context(|| format!("cannot read {}", built.display()))?;
        check_static_elf(&binary, arch.elf_machine)
            .with_context(|| format!("{} is not a static {} binary", built.display(), arch.name))?;
        let name = format!("observer-linux-{}", arch.name);
        write_executable(&dir.join(&name), &binary)?;
        files.push(name);
        binaries.push((arch.oci, binary));
    }
    let platforms: Vec<(&str, &[u8])> = binaries
        .iter()
        .map(|(arch, binary)| (*arch, binary.as_slice()))
        .collect();
    let reference = format!("{IMAGE_NAME}:{}", version()?);
    std::fs::write(
        dir.join(IMAGE_ARCHIVE),
        oci::image_archive(&platforms, &reference)?,
    )?;
    files.push(IMAGE_ARCHIVE.to_owned());
    let sums: String = files
        .iter()
        .map(|name| {
            let bytes = std::fs::read(dir.join(name))?;
            Ok(format!("{:x}  {name}\n", Sha256::digest(&bytes)))
        })
        .collect::<anyhow::Result<_>>()?;
    std::fs::write(dir.join("SHA256SUMS"), sums)?;
    eprintln!("dist: wrote {} ({})", dir.display(), files.join(", "));
    Ok(dir)
}

fn write_executable(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Fails unless `elf` is a 64-bit little-endian executable for `machine` that needs no
/// program interpreter (no dynamic loader: it runs alone in an empty root).
fn check_static_elf(elf: &[u8], machine: u16) -> anyhow::Result<()> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        bail!("not a 64-bit little-endian ELF file");
    }
    if u16_at(18) != Some(machine) {
        bail!("ELF machine {:?}, expected {machine}", u16_at(18));
    }
    let phoff = u64_at(32).context("truncated")? as usize;
    let phentsize = usize::from(u16_at(54).context("truncated")?);
    let phnum = usize::from(u16_at(56).context("truncated")?);
    for index in 0..phnum {
        let kind = u32_at(phoff + index * phentsize).context("truncated program headers")?;
        if kind == PT_INTERP {
            bail!("it asks for a program interpreter (dynamically linked)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_is_refused() {
        // This test binary is dynamically linked against glibc on the host.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let err = check_static_elf(&me, 62).unwrap_err().to_string();
        assert!(err.contains("dynamically linked"), "{err}");
        assert!(check_static_elf(&me, 183).is_err());
        assert!(check_static_elf(b"#!/bin/sh\n", 62).is_err());
    }
}
