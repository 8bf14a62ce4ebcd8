//! `cargo xtask kernels`: proves observer on Debian's own kernels (5.10, 6.1, 6.12).
//!
//! For each kernel: the newest Debian package of that series is fetched (cached under
//! `target/kernels/`), booted under `qemu-system-x86_64` (TCG, no KVM needed) with an
//! initramfs holding the kernel's netfilter modules, the networking userland, the static
//! observer and `guest.sh`. The guest runs an iptables and an nftables kube-proxy DNAT
//! scenario with known clients and reports on a second serial port; the host checks the
//! records exactly, the BTF offsets against the C compiler's reading, a clean detach and
//! the refusal without BTF. Exits non-zero with one line per failure.

mod check;
mod debian;
mod initramfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use observer_lab::{iptables, nftables, spec};

use crate::setup::run;

/// The kernels proven, as (series, Debian package name pattern); the newest match is used.
const KERNELS: [(&str, &str); 3] = [
    ("5.10", r"^linux-image-5\.10\.0-[0-9]+-cloud-amd64$"),
    ("6.1", r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$"),
    (
        "6.12",
        r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$",
    ),
];

/// Connections each scenario opens.
const CONNECTIONS: usize = 9;
/// A boot that has not powered off by then has hung.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const GUEST_SCRIPT: &str = include_str!("kernels/guest.sh");
const OFFSETS_C: &str = include_str!("kernels/offsets.c");
const MUSL: &str = "x86_64-unknown-linux-musl";

#[derive(Debug, Default, clap::Args)]
pub struct KernelsArgs {
    /// Only these kernel series (e.g. `--only 6.1`); all by default.
    #[arg(long, value_name = "SERIES")]
    only: Vec<String>,
    /// A static x86_64 observer binary to test instead of building one.
    #[arg(long, value_name = "PATH")]
    observer: Option<PathBuf>,
}

impl KernelsArgs {
    /// Every kernel, testing a static observer that is already built.
    pub fn with_observer(observer: PathBuf) -> KernelsArgs {
        KernelsArgs {
            only: Vec::new(),
            observer: Some(observer),
        }
    }
}

pub fn kernels(args: KernelsArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let selected: Vec<(&str, &str)> = KERNELS
        .into_iter()
        .filter(|(series, _)| args.only.is_empty() || args.only.iter().any(|o| o == series))
        .collect();
    if selected.is_empty() {
        bail!("--only names no kernel series this tests (5.10, 6.1, 6.12)");
    }
    let observer = match args.observer {
        Some(path) => path,
        None => build_static_observer()?,
    };
    let cache = crate::workspace_root().join("target/kernels");
    let apt = debian::Apt::new(&cache.join("apt"))?;
    let mut failures = Vec::new();
    for (series, pattern) in selected {
        let one = Instant::now();
        let result = apt
            .newest(pattern)
            .and_then(|package| prove(&apt, &package, &observer, &cache));
        match result {
            Ok(found) => failures.extend(found.into_iter().map(|f| format!("{series}: {f}"))),
            Err(err) => failures.push(format!("{series}: {err:#}")),
        }
        eprintln!(
            "kernels: {series} done in {:.1} s",
            one.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "kernels: all done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for failure in &failures {
        println!("{failure}");
    }
    if !failures.is_empty() {
        bail!("{} check(s) failed on Debian's kernels", failures.len());
    }
    Ok(())
}

fn build_static_observer() -> anyhow::Result<PathBuf> {
    run(Command::new("cargo")
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            MUSL,
            "-p",
            "observer",
        ])
        .current_dir(crate::workspace_root()))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"));
    Ok(target.join(MUSL).join("release/observer"))
}

/// Boots one kernel package and checks what its guest reports.
fn prove(
    apt: &debian::Apt,
    package: &str,
    observer: &Path,
    cache: &Path,
) -> anyhow::Result<Vec<String>> {
    let root = apt.unpacked(package)?;
    let release = debian::release(&root)?;
    let work = cache.join("work").join(&release);
    std::fs::create_dir_all(&work)?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    let vmlinux = work.join("vmlinux");
    debian::extract_vmlinux(&vmlinuz, &vmlinux)?;
    let offsets = c_offsets(&vmlinux, &work)?;

    let (scenario, expected) = scenario(release.clone(), offsets);
    let mut image = initramfs::Initramfs::default();
    image.add_bytes("/init", GUEST_SCRIPT.as_bytes().to_vec(), 0o755);
    image.add_userland()?;
    image.add_modules(&root, &release)?;
    image.add_file("/observer", observer, 0o755)?;
    for (path, text) in scenario {
        image.add_bytes(path, text.into_bytes(), 0o644);
    }
    let initrd = work.join("initramfs.cpio");
    image.write(&initrd)?;

    let booted = Instant::now();
    let report = boot(&vmlinuz, &initrd, &work)?;
    eprintln!(
        "kernels: {release}: boot, scenarios and power-off took {:.1} s",
        booted.elapsed().as_secs_f64()
    );
    let failures = check::check(&report, &expected);
    if !failures.is_empty() {
        eprintln!(
            "kernels: {release}: guest report in {}, console in {}",
            work.join("report.txt").display(),
            work.join("console.txt").display()
        );
    }
    Ok(failures)
}

/// The guest's files (`/scenario.env` and the rules) and what the host expects, from the
/// lab's own Service: `shop/checkout:http` on three pods, in kube-proxy's formats.
fn scenario(
    release: String,
    offsets: BTreeMap<String, u64>,
) -> (Vec<(&'static str, String)>, check::Expected) {
    let pods: Vec<spec::Pod> = spec::pods("k")
        .into_iter()
        .filter(|p| p.name.starts_with("checkout-"))
        .collect();
    let services: Vec<spec::Service> = spec::services(&pods)
        .into_iter()
        .filter(|s| s.name == "checkout")
        .collect();
    let svc = &services[0];
    let env = format!(
        "PODS=\"{}\"\nNODE_IP={}\nCLIENT_IP={}\nVIP={}\nVPORT={}\nHTTP_PORT={}\nCONNS={CONNECTIONS}\n",
        pods.iter()
            .map(|p| format!("{}:{}", p.name, p.ip))
            .collect::<Vec<_>>()
            .join(" "),
        spec::NODE_IP,
        spec::CLIENT_IP,
        svc.cluster_ip,
        svc.port,
        svc.target_port,
    );
    let files = vec![
        ("/scenario.env", env),
        ("/rules/iptables-setup", iptables::setup()),
        ("/rules/iptables-sync", iptables::sync(&services, None, &[])),
        (
            "/rules/nftables.nft",
            nftables::sync(&services, None, &[]).script,
        ),
    ];
    let expected = check::Expected {
        release,
        backends: pods
            .iter()
            .map(|p| (p.name.clone(), format!("{}:{}", p.ip, svc.target_port)))
            .collect(),
        client_ip: spec::CLIENT_IP.to_string(),
        service_addr: svc.cluster_addr().to_string(),
        service: svc.port_name_string(),
        connections: CONNECTIONS,
        offsets,
    };
    (files, expected)
}

/// The offsets the C compiler lays out from `bpftool btf dump format c` of `vmlinux`.
fn c_offsets(vmlinux: &Path, work: &Path) -> anyhow::Result<BTreeMap<String, u64>> {
    let header = work.join("vmlinux.h");
    let dump = Command::new("bpftool")
        .args(["btf", "dump", "file"])
        .arg(vmlinux)
        .args(["format", "c"])
        .output()
        .context("cannot run bpftool")?;
    if !dump.status.success() {
        bail!(
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&dump.stderr).trim()
        );
    }
    std::fs::write(&header, &dump.stdout)?;
    let source = work.join("offsets.c");
    std::fs::write(&source, OFFSETS_C)?;
    let program = work.join("offsets");
    run(Command::new("gcc")
        .arg("-w")
        .arg(format!("-DVMLINUX_H=\"{}\"", header.display()))
        .arg(&source)
        .arg("-o")
        .arg(&program))?;
    let out = Command::new(&program).output()?;
    let offsets: BTreeMap<String, u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (path, value) = l.split_once('=')?;
            Some((path.to_owned(), value.parse().ok()?))
        })
        .collect();
    if offsets.len() != OFFSETS_C.matches("    P(").count() {
        bail!("the C compiler's offsets are incomplete: {offsets:?}");
    }
    Ok(offsets)
}

/// Boots the kernel (no network card: nothing the guest does can leave it) and returns
/// what the guest wrote to its second serial port.
fn boot(vmlinuz: &Path, initrd: &Path, work: &Path) -> anyhow::Result<String> {
    let report = work.join("report.txt");
    let console = work.join("console.txt");
    let _ = std::fs::remove_file(&report);
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-m", "1024", "-smp", "1", "-nic", "none"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 panic=-1 loglevel=4"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", report.display()))
        .stdin(std::process::Stdio::null())
        .spawn()
        .context("cannot start qemu-system-x86_64")?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("qemu failed ({status}); console in {}", console.display());
            }
            break;
        }
        if started.elapsed() > BOOT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the guest did not power off within {} s; console in {}",
                BOOT_TIMEOUT.as_secs(),
                console.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::read_to_string(&report).with_context(|| format!("no report in {}", report.display()))
}
