//! `cargo xtask kernels`: proves observer on Debian's own kernels, x86_64 (5.10, 6.1, 6.12)
//! and arm64 (5.10, 6.1, 6.12 with 4 KiB and with 16 KiB pages).
//!
//! For each kernel: the newest Debian package of that series for that architecture is
//! fetched (cached under `target/kernels/`), booted under qemu (TCG, no KVM needed) with
//! an initramfs holding the kernel's netfilter modules, Debian's networking userland of
//! the same architecture, the static observer and `guest.sh`. The guest runs an iptables
//! and an nftables kube-proxy DNAT scenario with known clients (one connection opened
//! before observer starts) and reports on its console; the host checks the records
//! exactly, the BTF offsets against the C compiler's reading for that architecture, a
//! clean detach, the refusal without BTF and the warning without conntrack's netlink
//! interface. Exits non-zero with one line per failure.

mod check;
pub mod debian;
mod initramfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use observer_lab::{iptables, nftables, spec};

use crate::dist::{ARCHES, Arch};
use crate::setup::run;

/// A guest architecture: the kernels proven on it and how qemu boots them.
struct Guest {
    /// Rust's static target and `uname -m`; its OCI name is Debian's too (amd64, arm64).
    arch: &'static Arch,
    kernels: &'static [Series],
    /// qemu's program and machine.
    qemu: &'static [&'static str],
    /// The kernel's name for the board's first serial port.
    console: &'static str,
    /// The C compiler that lays out this architecture's structures.
    cc: &'static str,
}

/// A kernel series proven: its name and the pattern of its Debian package names (the
/// newest match is used).
struct Series {
    name: &'static str,
    package: &'static str,
}

const fn series(name: &'static str, package: &'static str) -> Series {
    Series { name, package }
}

const GUESTS: [Guest; 2] = [
    Guest {
        arch: &ARCHES[0],
        kernels: &[
            series("5.10", r"^linux-image-5\.10\.0-[0-9]+-cloud-amd64$"),
            series("6.1", r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$"),
            series(
                "6.12",
                r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$",
            ),
        ],
        qemu: &["qemu-system-x86_64", "-accel", "tcg", "-smp", "1"],
        console: "ttyS0",
        cc: "gcc",
    },
    Guest {
        arch: &ARCHES[1],
        kernels: &[
            series("5.10", r"^linux-image-5\.10\.0-[0-9]+-arm64-unsigned$"),
            series("6.1", r"^linux-image-6\.1\.0-[0-9]+-arm64-unsigned$"),
            series("6.12", r"^linux-image-6\.12\.[0-9]+\+deb12-arm64-unsigned$"),
            series(
                "6.12-16k",
                r"^linux-image-6\.12\.[0-9]+\+deb12-arm64-16k-unsigned$",
            ),
        ],
        // Pointer authentication's QARMA algorithm costs TCG 2.4 times the run time;
        // the implementation-defined one is as good for a test.
        qemu: &[
            "qemu-system-aarch64",
            "-M",
            "virt",
            "-cpu",
            "max,pauth-impdef=on",
            "-smp",
            "2",
        ],
        console: "ttyAMA0",
        cc: "aarch64-linux-gnu-gcc",
    },
];

/// Connections each scenario opens while observer runs.
const CONNECTIONS: usize = 9;
/// Lines the connection opened before observer starts carries after observer attached.
const HELD_LINES: usize = 3;
/// The pods' line service: a Service port of its own (`shop/checkout:lines`), answered
/// by a server that keeps each connection open until the client closes it.
const LINES_PORT_NAME: &str = "lines";
const LINES_SERVICE_PORT: u16 = 81;
const LINES_POD_PORT: u16 = 8081;
/// A boot that has not powered off by then has hung.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const GUEST_SCRIPT: &str = include_str!("kernels/guest.sh");
const OFFSETS_C: &str = include_str!("kernels/offsets.c");
/// What starts a line of the guest's report on its console (kernel messages share it).
const REPORT_MARK: &str = "@@ ";

#[derive(Debug, Default, clap::Args)]
pub struct KernelsArgs {
    /// Only these architectures (`x86_64`, `aarch64`); both by default.
    #[arg(long, value_name = "ARCH")]
    arch: Vec<String>,
    /// Only these kernel series (e.g. `--only 6.1`, `--only 6.12-16k`); all by default.
    #[arg(long, value_name = "SERIES")]
    only: Vec<String>,
    /// A directory with the static binaries `observer-linux-ARCH` (`cargo xtask dist`'s
    /// `target/dist`) to test instead of building them.
    #[arg(long, value_name = "DIR")]
    dist: Option<PathBuf>,
}

impl KernelsArgs {
    /// Every kernel, testing the static binaries `cargo xtask dist` wrote to `dir`.
    pub fn with_dist(dir: PathBuf) -> KernelsArgs {
        KernelsArgs {
            dist: Some(dir),
            ..KernelsArgs::default()
        }
    }
}

pub fn kernels(args: KernelsArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let selected = select(&args.arch, &args.only)?;
    let cache = crate::workspace_root().join("target/kernels");
    let mut failures = Vec::new();
    for (guest, kernels) in selected {
        let name = guest.arch.name;
        let one_arch = Instant::now();
        let prepared = observer_binary(guest.arch, args.dist.as_deref()).and_then(|observer| {
            let arch = guest.arch.oci;
            let apt = debian::Apt::new(
                &cache.join("apt").join(arch),
                arch,
                &debian::kernel_suites(arch),
            )?;
            let userland = apt.unpacked("userland", &initramfs::USERLAND_PACKAGES)?;
            Ok((observer, apt, userland))
        });
        let (observer, apt, userland) = match prepared {
            Ok(prepared) => prepared,
            Err(err) => {
                failures.push(format!("{name}: {err:#}"));
                continue;
            }
        };
        for Series {
            name: series,
            package: pattern,
        } in kernels
        {
            let one = Instant::now();
            let result = apt.newest(pattern).and_then(|package| {
                let kernel = apt.unpacked(&package, &[package.as_str()])?;
                prove(guest, &kernel, &userland, &observer, &cache)
            });
            match result {
                Ok(found) => {
                    failures.extend(found.into_iter().map(|f| format!("{name} {series}: {f}")))
                }
                Err(err) => failures.push(format!("{name} {series}: {err:#}")),
            }
            eprintln!(
                "kernels: {name} {series} done in {:.1} s",
                one.elapsed().as_secs_f64()
            );
        }
        eprintln!(
            "kernels: {name} done in {:.1} s",
            one_arch.elapsed().as_secs_f64()
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

/// The guests and kernel series `--arch` and `--only` leave; an error when they leave none
/// or name something that is not tested.
fn select(
    arches: &[String],
    only: &[String],
) -> anyhow::Result<Vec<(&'static Guest, Vec<&'static Series>)>> {
    let known_arches: Vec<&str> = GUESTS.iter().map(|g| g.arch.name).collect();
    if let Some(unknown) = arches.iter().find(|a| !known_arches.contains(&a.as_str())) {
        bail!(
            "--arch {unknown}: the architectures tested are {}",
            known_arches.join(", ")
        );
    }
    let selected: Vec<_> = GUESTS
        .iter()
        .filter(|g| arches.is_empty() || arches.iter().any(|a| a == g.arch.name))
        .map(|g| {
            let kernels: Vec<_> = g
                .kernels
                .iter()
                .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
                .collect();
            (g, kernels)
        })
        .filter(|(_, kernels)| !kernels.is_empty())
        .collect();
    if selected.is_empty() {
        let series: Vec<String> = GUESTS
            .iter()
            .map(|g| {
                let names: Vec<&str> = g.kernels.iter().map(|s| s.name).collect();
                format!("{} {}", g.arch.name, names.join(", "))
            })
            .collect();
        bail!(
            "--arch and --only leave no kernel; the series tested are: {}",
            series.join("; ")
        );
    }
    Ok(selected)
}

/// The static observer for `arch`: from `dist` when given, else built.
fn observer_binary(arch: &Arch, dist: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = dist {
        let binary = dir.join(format!("observer-linux-{}", arch.name));
        if !binary.is_file() {
            bail!(
                "{} is missing; run `cargo xtask dist` first",
                binary.display()
            );
        }
        return Ok(binary);
    }
    run(Command::new("cargo")
        .args(["build", "--release", "--locked", "--target", arch.target])
        .args(["-p", "observer"])
        .current_dir(crate::workspace_root()))?;
    Ok(crate::dist::target_dir()
        .join(arch.target)
        .join("release/observer"))
}

/// Boots one unpacked kernel package and checks what its guest reports.
fn prove(
    guest: &Guest,
    kernel: &Path,
    userland: &Path,
    observer: &Path,
    cache: &Path,
) -> anyhow::Result<Vec<String>> {
    let release = debian::release(kernel)?;
    let work = cache.join("work").join(&release);
    std::fs::create_dir_all(&work)?;
    let vmlinuz = kernel.join("boot").join(format!("vmlinuz-{release}"));
    let btf = work.join("btf");
    debian::extract_btf(&vmlinuz, &btf)?;
    let offsets = c_offsets(guest.cc, &btf, &work)?;

    let multiarch = format!("{}-linux-gnu", guest.arch.name);
    let (scenario, expected) = scenario(release.clone(), &multiarch, offsets);
    let mut image = initramfs::Initramfs::default();
    image.add_bytes("/init", GUEST_SCRIPT.as_bytes().to_vec(), 0o755);
    image.add_userland(userland, &multiarch)?;
    image.add_modules(kernel, &release)?;
    image.add_file("/observer", observer, 0o755)?;
    for (path, text) in scenario {
        image.add_bytes(path, text.into_bytes(), 0o644);
    }
    let initrd = work.join("initramfs.cpio");
    image.write(&initrd)?;

    let booted = Instant::now();
    let report = boot(guest, &vmlinuz, &initrd, &work)?;
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
/// lab's own Service `shop/checkout:http` on three pods, plus its port `lines` (a server
/// that keeps connections open), in kube-proxy's formats.
fn scenario(
    release: String,
    multiarch: &str,
    offsets: BTreeMap<String, u64>,
) -> (Vec<(&'static str, String)>, check::Expected) {
    let pods: Vec<spec::Pod> = spec::pods("k")
        .into_iter()
        .filter(|p| p.name.starts_with("checkout-"))
        .collect();
    let http = spec::services(&pods)
        .into_iter()
        .find(|s| s.name == "checkout")
        .expect("the lab has a checkout Service");
    let lines = spec::Service {
        port_name: LINES_PORT_NAME.into(),
        port: LINES_SERVICE_PORT,
        target_port: LINES_POD_PORT,
        node_port: None,
        ..http.clone()
    };
    let env = format!(
        "PODS=\"{}\"\nNODE_IP={}\nCLIENT_IP={}\nVIP={}\nVPORT={}\nHTTP_PORT={}\nCONNS={CONNECTIONS}\n\
         LINES_VPORT={}\nLINES_PORT={}\nHELD_LINES={HELD_LINES}\nLIBRARY_PATH=/lib/{multiarch}\n",
        pods.iter()
            .map(|p| format!("{}:{}", p.name, p.ip))
            .collect::<Vec<_>>()
            .join(" "),
        spec::NODE_IP,
        spec::CLIENT_IP,
        http.cluster_ip,
        http.port,
        http.target_port,
        lines.port,
        lines.target_port,
    );
    let services = [http.clone(), lines.clone()];
    let files = vec![
        ("/scenario.env", env),
        ("/rules/iptables-setup", iptables::setup()),
        ("/rules/iptables-sync", iptables::sync(&services, None, &[])),
        (
            "/rules/nftables.nft",
            nftables::sync(&services, None, &[], nftables::Layout::V1_35).script,
        ),
    ];
    let port = |svc: &spec::Service| check::ServicePort {
        name: svc.port_name_string(),
        addr: svc.cluster_addr().to_string(),
        target_port: svc.target_port,
    };
    let expected = check::Expected {
        release,
        pods: pods.iter().map(|p| (p.name.clone(), p.ip)).collect(),
        client_ip: spec::CLIENT_IP.to_string(),
        http: port(&http),
        lines: port(&lines),
        connections: CONNECTIONS,
        held_lines: HELD_LINES,
        offsets,
    };
    (files, expected)
}

/// The offsets the C compiler `cc` lays out from `bpftool btf dump format c` of `btf`,
/// compiled only (`-S`), so a cross compiler needs no libraries.
fn c_offsets(cc: &str, btf: &Path, work: &Path) -> anyhow::Result<BTreeMap<String, u64>> {
    let header = work.join("vmlinux.h");
    let dump = Command::new("bpftool")
        .args(["btf", "dump", "file"])
        .arg(btf)
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
    let assembly = work.join("offsets.s");
    run(Command::new(cc)
        .args(["-w", "-S"])
        .arg(format!("-DVMLINUX_H=\"{}\"", header.display()))
        .arg(&source)
        .arg("-o")
        .arg(&assembly))?;
    let offsets = assembly_offsets(&std::fs::read_to_string(&assembly)?);
    if offsets.len() != OFFSETS_C.matches("    P(").count() {
        bail!("{cc}'s offsets are incomplete: {offsets:?}");
    }
    Ok(offsets)
}

/// The `->path value` markers `offsets.c` leaves in the assembly (an immediate is
/// written `$104` on x86_64, `#104` or `104` on arm64).
fn assembly_offsets(assembly: &str) -> BTreeMap<String, u64> {
    assembly
        .lines()
        .filter_map(|line| {
            let marker = line.split_once("\"->")?.1.trim_end().strip_suffix('"')?;
            let (path, value) = marker.split_once(' ')?;
            let value = value.trim_start_matches(['$', '#']).parse().ok()?;
            Some((path.to_owned(), value))
        })
        .collect()
}

/// Boots the kernel (no network card: nothing the guest does can leave it) and returns
/// the guest's report: the lines it marked on the board's one console (also written to
/// `report.txt`, the whole console to `console.txt`).
fn boot(guest: &Guest, vmlinuz: &Path, initrd: &Path, work: &Path) -> anyhow::Result<String> {
    let console = work.join("console.txt");
    let _ = std::fs::remove_file(&console);
    let (program, machine) = guest.qemu.split_first().context("no qemu program")?;
    let mut child = Command::new(program)
        .args(machine)
        .args(["-m", "1024", "-nic", "none"])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!("console={} panic=-1 loglevel=4", guest.console))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
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
            let text = std::fs::read(&console).unwrap_or_default();
            let report = marked_lines(&String::from_utf8_lossy(&text));
            bail!(
                "the guest did not power off within {} s (its last report line: {:?}); console in {}",
                BOOT_TIMEOUT.as_secs(),
                report.lines().last().unwrap_or("none"),
                console.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = std::fs::read(&console)
        .with_context(|| format!("no console output in {}", console.display()))?;
    let report = marked_lines(&String::from_utf8_lossy(&text));
    std::fs::write(work.join("report.txt"), &report)?;
    Ok(report)
}

/// The report lines of a console transcript: those that start with `REPORT_MARK`, without
/// it and without the terminal's carriage returns.
fn marked_lines(console: &str) -> String {
    console
        .lines()
        .filter_map(|line| line.trim_end_matches('\r').strip_prefix(REPORT_MARK))
        .map(|line| format!("{line}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_read_from_either_architectures_assembly() {
        let x86 = "\t.file\t\"offsets.c\"\n#APP\n\t.ascii \"->sk_buff._nfct $104\"\n#NO_APP\n";
        let arm = "#APP\n// 12 \"offsets.c\" 1\n\t.ascii \"->net.ns.inum #136\"\n\t.ascii \"->nf_conn.status 128\"\n";
        assert_eq!(
            assembly_offsets(x86),
            BTreeMap::from([("sk_buff._nfct".to_owned(), 104)])
        );
        assert_eq!(
            assembly_offsets(arm),
            BTreeMap::from([
                ("net.ns.inum".to_owned(), 136),
                ("nf_conn.status".to_owned(), 128)
            ])
        );
    }

    #[test]
    fn the_report_is_the_marked_console_lines() {
        let console = "[    1.2] Run /init as init process\r\n@@ RELEASE 6.1.0-57-arm64\r\n\
                       [    9.9] veth: loaded\r\n@@ DONE\r\n";
        assert_eq!(marked_lines(console), "RELEASE 6.1.0-57-arm64\nDONE\n");
    }

    #[test]
    fn selection_names_what_is_tested_when_it_leaves_nothing() {
        let all = select(&[], &[]).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].1.len(), 4);
        let arm_16k = select(&["aarch64".into()], &["6.12-16k".into()]).unwrap();
        assert_eq!(
            (arm_16k[0].0.arch.name, arm_16k[0].1[0].name),
            ("aarch64", "6.12-16k")
        );
        let Err(err) = select(&["x86_64".into()], &["6.12-16k".into()]) else {
            panic!("x86_64 has no 16 KiB page kernel")
        };
        assert!(
            err.to_string()
                .contains("aarch64 5.10, 6.1, 6.12, 6.12-16k"),
            "{err}"
        );
        let Err(err) = select(&["arm64".into()], &[]) else {
            panic!("arm64 is Debian's name, not uname's")
        };
        assert_eq!(
            err.to_string(),
            "--arch arm64: the architectures tested are x86_64, aarch64"
        );
    }
}
