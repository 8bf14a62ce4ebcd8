//! `cargo xtask setup`: installs what building and testing observer needs on a fresh
//! Debian machine, and nothing when it is already there (so it is fast to re-run).
//!
//! - Debian packages the lab and tests use (iproute2, iptables, nftables, conntrack, tmux),
//!   and what `cargo xtask kernels` needs (qemu-system-x86 and qemu-system-arm, bpftool,
//!   gcc and gcc-aarch64-linux-gnu, the decompressors of Debian's kernel images and modules).
//! - The `x86_64-unknown-linux-musl` Rust target (the static observer the VMs run).
//! - The nightly toolchain's `rust-src` (the eBPF crate builds `core` from source).
//! - `bpf-linker`, built against the nightly toolchain's own LLVM (Debian has no LLVM
//!   matching rustc's), as docs/kernel-facts.md describes.
//! - For `cargo xtask dist` and its tests: the musl targets (rust-lld, which rustup ships,
//!   links them: see .cargo/config.toml), qemu user emulation for the aarch64 binary,
//!   skopeo, umoci and containerd (OCI images), promtool, and kubernetes-validate (Kubernetes
//!   schemas, from PyPI) in a virtual environment of its own; xmlschema (PyPI) there too,
//!   for the test that validates `check -o junit` against a JUnit schema.
//! - For the pod-name tests in real pod sandboxes: containerd, runc, the CNI plugins and
//!   python3-grpcio (the lab's CRI client); and Debian trixie's containerd 1.7 and forky's
//!   2.x, fetched with apt's own client into a private apt state and unpacked under
//!   `/opt/observer-lab/` (bookworm has only 1.6; their binaries need glibc 2.34).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::kernels::debian::Apt;

/// Command a package provides, and the Debian package.
const PACKAGES: [(&str, &str); 22] = [
    ("ip", "iproute2"),
    ("iptables", "iptables"),
    ("nft", "nftables"),
    ("conntrack", "conntrack"),
    ("tmux", "tmux"),
    ("nsenter", "util-linux"),
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("bpftool", "bpftool"),
    ("gcc", "gcc"),
    ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    ("lz4", "lz4"),
    ("zstd", "zstd"),
    ("xz", "xz-utils"),
    ("file", "file"),
    ("qemu-aarch64-static", "qemu-user-static"),
    ("skopeo", "skopeo"),
    ("umoci", "umoci"),
    ("promtool", "prometheus"),
    ("unshare", "util-linux"),
    ("containerd", "containerd"),
    ("runc", "runc"),
];

/// Packages known by name only: the guest (and the lab's pause image) needs busybox linked
/// statically, which the `busybox` package (same command) is not; the lab's private
/// containerd needs Debian's python3 to speak CRI (gRPC) and the CNI loopback plugin.
const PACKAGES_BY_NAME: [&str; 3] = [
    "busybox-static",
    "python3-grpcio",
    "containernetworking-plugins",
];

const MUSL_TARGETS: [&str; 2] = ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"];

const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// XML Schema validation for `check -o junit`'s test (observer/tests/junit_schema.rs).
const XMLSCHEMA: &str = "xmlschema==4.3.2";

const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn setup() -> anyhow::Result<()> {
    debian_packages()?;
    unpacked_containerds()?;
    nightly_rust_src()?;
    bpf_linker()?;
    musl_targets()?;
    kubernetes_validate()?;
    xmlschema()?;
    for program in ["python3", "node"] {
        if which(program).is_none() {
            bail!(
                "{program} is not installed; the lab's servers and clients need it (Python 3 and Node.js 20 come with this machine image)"
            );
        }
    }
    Ok(())
}

pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

pub fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

pub fn output(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("cannot start {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn debian_packages() -> anyhow::Result<()> {
    let mut missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(program, _)| which(program).is_none())
        .map(|(_, package)| *package)
        .collect();
    missing.extend(PACKAGES_BY_NAME.iter().filter(|package| {
        output(Command::new("dpkg-query").args(["-W", "-f", "${Status}", package]))
            .map_or(true, |status| !status.ends_with(" installed"))
    }));
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing Debian packages: {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Each of `observer_lab::UNPACKED_CONTAINERDS` not unpacked yet: the suite's newest
/// `containerd` package, through a private apt state next to it that is removed after.
fn unpacked_containerds() -> anyhow::Result<()> {
    for (suite, root) in observer_lab::UNPACKED_CONTAINERDS {
        let root = Path::new(root);
        if root.join(".complete").exists() {
            continue;
        }
        let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
        let apt_dir = root.with_extension("apt");
        let apt = Apt::new(&apt_dir, &arch, &[&format!("debian {suite}")])?;
        let unpacked = apt.unpacked("containerd", &["containerd"])?;
        let _ = std::fs::remove_dir_all(root);
        std::fs::rename(&unpacked, root)
            .with_context(|| format!("cannot move {} to {}", unpacked.display(), root.display()))?;
        std::fs::remove_dir_all(&apt_dir)
            .with_context(|| format!("cannot remove {}", apt_dir.display()))?;
    }
    Ok(())
}

fn musl_targets() -> anyhow::Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    let missing: Vec<&str> = MUSL_TARGETS
        .into_iter()
        .filter(|target| !installed.lines().any(|line| line == *target))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: adding Rust targets {}", missing.join(" "));
    run(Command::new("rustup")
        .args(["target", "add"])
        .args(&missing))
}

/// The virtual environment kubernetes-validate lives in (its `bin/kubernetes-validate`
/// is what the manifest test runs).
pub fn python_venv() -> anyhow::Result<PathBuf> {
    Ok(home()?.join(".local/share/observer-venv"))
}

fn kubernetes_validate() -> anyhow::Result<()> {
    let venv = python_venv()?;
    let version = KUBERNETES_VALIDATE.split_once("==").map_or("", |(_, v)| v);
    if let Ok(out) = output(Command::new(venv.join("bin/kubernetes-validate")).arg("--version"))
        && out.contains(version)
    {
        return Ok(());
    }
    eprintln!(
        "setup: installing {KUBERNETES_VALIDATE} (PyPI) into {}",
        venv.display()
    );
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", KUBERNETES_VALIDATE]))
}

/// xmlschema (PyPI) in the same virtual environment.
fn xmlschema() -> anyhow::Result<()> {
    let python = python_venv()?.join("bin/python");
    let version = XMLSCHEMA.split_once("==").map_or("", |(_, v)| v);
    let check = "import xmlschema; print(xmlschema.__version__)";
    if let Ok(out) = output(Command::new(&python).args(["-c", check]))
        && out == version
    {
        return Ok(());
    }
    eprintln!("setup: installing {XMLSCHEMA} (PyPI) into the same environment");
    run(Command::new(python).args(["-m", "pip", "install", "--quiet", XMLSCHEMA]))
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .map(PathBuf::from)
        .context("the nightly Rust toolchain is needed to build the eBPF programs; install it with `rustup toolchain install nightly`")
}

fn nightly_rust_src() -> anyhow::Result<()> {
    let sysroot = nightly_sysroot()?;
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    eprintln!("setup: adding rust-src to the nightly toolchain");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn bpf_linker() -> anyhow::Result<()> {
    if let Ok(version) = output(Command::new("bpf-linker").arg("--version"))
        && version.contains(BPF_LINKER_VERSION)
    {
        return Ok(());
    }
    let sysroot = nightly_sysroot()?;
    let llvm = std::fs::read_dir(sysroot.join("lib"))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| file_name(path).starts_with("libLLVM.so."))
        .context(
            "the nightly toolchain ships no libLLVM.so.*; cannot build bpf-linker against it",
        )?;
    let llvm_major = file_name(&llvm)
        .trim_start_matches("libLLVM.so.")
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();
    // bpf-linker links against `libLLVM.so` and finds `libLLVM.so.<full name>` at run time.
    let prefix = home()?.join(".local/share/observer-llvm");
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib)?;
    for name in ["libLLVM.so".to_owned(), file_name(&llvm)] {
        let link = lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm, &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM {llvm_major} from the nightly toolchain (about a minute)"
    );
    run(Command::new("cargo")
        .args([
            "install",
            // bpf-linker's own lock file: versions known to build together.
            "--locked",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
        ])
        .arg(format!("llvm-{llvm_major}"))
        .env("LLVM_PREFIX", &prefix))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn home() -> anyhow::Result<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .context("HOME is not set")
}
