//! Debian's packages, fetched with apt's own client into a private apt state (for the
//! kernels one per architecture under `target/kernels/apt/ARCH`, with bullseye as one
//! more suite; the host's apt sources stay untouched), unpacked with `dpkg-deb -x`; and the
//! kernel's BTF taken out of its `vmlinuz`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};

use crate::setup::run;

/// The suites the kernels come from: bookworm (6.1, 6.12, the guest's userland) and
/// bullseye (5.10), with their security updates. bullseye-security's arm64 kernels are
/// listed but their files answer 404 on deb.debian.org (measured 2026-12-02), so arm64
/// leaves that suite out and tests bullseye's own newest 5.10.
pub fn kernel_suites(arch: &str) -> Vec<&'static str> {
    [
        "debian bookworm",
        "debian-security bookworm-security",
        "debian bullseye",
        "debian-security bullseye-security",
    ]
    .into_iter()
    .filter(|suite| arch != "arm64" || !suite.ends_with("bullseye-security"))
    .collect()
}

/// apt's sources for `suites` (each `archive suite`, such as `debian-security
/// bookworm-security`), all signed by the keys in Debian's archive keyring.
fn sources(suites: &[&str]) -> String {
    let keyring = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]";
    suites
        .iter()
        .map(|suite| {
            let (archive, suite) = suite.split_once(' ').expect("archive and suite");
            format!("deb {keyring} http://deb.debian.org/{archive} {suite} main\n")
        })
        .collect()
}

/// Package lists younger than this are reused (reruns need no network).
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Longest one apt command may take (a kernel package is ~70 MB).
const APT_DEADLINE_SECONDS: &str = "600";

/// apt for Debian's architecture `arch`, with its own sources, lists and cache in `dir`.
pub struct Apt {
    dir: PathBuf,
    arch: String,
}

impl Apt {
    /// Prepares the private apt state for `suites` (see [`sources`]) and refreshes its
    /// package lists when they are old.
    pub fn new(dir: &Path, arch: &str, suites: &[&str]) -> anyhow::Result<Apt> {
        let apt = Apt {
            dir: dir.to_path_buf(),
            arch: arch.to_owned(),
        };
        for sub in ["lists/partial", "cache/archives/partial", "debs"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let list_file = dir.join("sources.list");
        let stamp = dir.join("lists/.updated");
        let fresh = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() < LISTS_MAX_AGE);
        let wanted = sources(suites);
        if fresh && std::fs::read_to_string(&list_file).is_ok_and(|s| s == wanted) {
            return Ok(apt);
        }
        std::fs::write(&list_file, wanted)?;
        let names: Vec<&str> = suites.iter().filter_map(|s| s.split(' ').nth(1)).collect();
        eprintln!(
            "updating the {arch} package lists of Debian {}",
            names.join(", ")
        );
        run(apt.command("apt-get").args(["update", "-qq"]))?;
        std::fs::write(&stamp, "")?;
        Ok(apt)
    }

    /// `program` with this private state, bounded: a mirror that stalls fails the stage
    /// within minutes instead of holding a CI run until its deadline.
    fn command(&self, program: &str) -> Command {
        let d = self.dir.display();
        let mut command = Command::new("timeout");
        command.args(["--kill-after=10", APT_DEADLINE_SECONDS, program]);
        for option in [
            "Acquire::http::Timeout=30".to_owned(),
            "Acquire::Retries=3".to_owned(),
            format!("Dir::Etc::SourceList={d}/sources.list"),
            "Dir::Etc::SourceParts=/nonexistent".to_owned(),
            format!("Dir::State::Lists={d}/lists"),
            format!("Dir::Cache={d}/cache"),
            format!("APT::Architecture={}", self.arch),
            // Root may not hand the download to the `_apt` user in a private directory.
            "APT::Sandbox::User=root".to_owned(),
        ] {
            command.args(["-o", &option]);
        }
        command
    }

    /// The newest package whose name matches `pattern` (a regular expression).
    pub fn newest(&self, pattern: &str) -> anyhow::Result<String> {
        let out = self
            .command("apt-cache")
            .args(["search", "--names-only", pattern])
            .output()
            .context("cannot run apt-cache")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|line| line.split_whitespace().next())
            .max_by_key(|name| numbers(name))
            .map(str::to_owned)
            .with_context(|| format!("no Debian package matches {pattern}"))
    }

    /// Downloads `packages` (once each) and unpacks them together (once) into a root of
    /// their own named `name`; returns that root.
    pub fn unpacked(&self, name: &str, packages: &[&str]) -> anyhow::Result<PathBuf> {
        let root = self.dir.join("unpacked").join(name);
        let complete = root.join(".complete");
        let list = packages.join("\n");
        if std::fs::read_to_string(&complete).is_ok_and(|done| done == list) {
            return Ok(root);
        }
        let debs = self.dir.join("debs");
        let find = |package: &str| -> anyhow::Result<Option<PathBuf>> {
            Ok(std::fs::read_dir(&debs)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| file_name(p).starts_with(&format!("{package}_"))))
        };
        let mut missing = Vec::new();
        for package in packages {
            if find(package)?.is_none() {
                missing.push(*package);
            }
        }
        if !missing.is_empty() {
            eprintln!("downloading {} ({})", missing.join(" "), self.arch);
            run(self
                .command("apt-get")
                .args(["download", "-qq"])
                .args(&missing)
                .current_dir(&debs))?;
        }
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        for package in packages {
            let deb = find(package)?
                .with_context(|| format!("apt-get download left no {package}_*.deb"))?;
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        }
        std::fs::write(&complete, list)?;
        Ok(root)
    }
}

/// Every run of digits in `name`, for ordering `linux-image-6.1.0-9-...` before `-10-`.
fn numbers(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The kernel release (`uname -r`) an unpacked package holds: its `lib/modules/` entry.
pub fn release(root: &Path) -> anyhow::Result<String> {
    let modules = root.join("lib/modules");
    let mut entries = std::fs::read_dir(&modules)
        .with_context(|| format!("cannot read {}", modules.display()))?
        .filter_map(Result::ok)
        .map(|e| file_name(&e.path()));
    match (entries.next(), entries.next()) {
        (Some(release), None) => Ok(release),
        _ => bail!("{} should hold exactly one kernel", modules.display()),
    }
}

/// Writes what bpftool reads the kernel's BTF from out of a `vmlinuz`: the ELF `vmlinux`
/// (with its `.BTF` section) inside an x86 bzImage, or the bare BTF blob of an arm64
/// `Image` (not an ELF file; Debian's is uncompressed, gzip is undone too).
pub fn extract_btf(vmlinuz: &Path, out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        return Ok(());
    }
    let mut image = std::fs::read(vmlinuz)?;
    if image.starts_with(&[0x1f, 0x8b]) {
        image = pipe("gzip", &["-dc"], &image)?;
    }
    let extracted = if image.get(0x202..0x206) == Some(b"HdrS") {
        vmlinux_of_bzimage(&image)
    } else if image.get(0x38..0x3c) == Some(b"ARM\x64") {
        btf_blob(&image)
            .map(<[u8]>::to_vec)
            .context("no BTF in the arm64 Image (is CONFIG_DEBUG_INFO_BTF set?)")
    } else {
        bail!("neither an x86 bzImage nor an arm64 Image")
    }
    .with_context(|| vmlinuz.display().to_string())?;
    let partial = out.with_extension("partial");
    std::fs::write(&partial, extracted)?;
    std::fs::rename(&partial, out)?;
    Ok(())
}

/// The ELF `vmlinux` of a bzImage: the payload that the boot protocol header locates
/// (`setup_sects`, `payload_offset`, `payload_length`), decompressed by its magic.
fn vmlinux_of_bzimage(image: &[u8]) -> anyhow::Result<Vec<u8>> {
    let u32_at = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let setup_sects = match image.get(0x1f1) {
        Some(0) | None => 4,
        Some(&n) => usize::from(n),
    };
    let start = (setup_sects + 1) * 512 + u32_at(0x248).context("not a bzImage")?;
    let payload = image
        .get(start..start + u32_at(0x24c).context("not a bzImage")?)
        .context("bzImage payload out of bounds")?;
    let tool = match payload.get(..4) {
        Some([0x02, 0x21, 0x4c, 0x18]) => "lz4",
        Some([0x28, 0xb5, 0x2f, 0xfd]) => "zstd",
        Some([0xfd, b'7', b'z', b'X']) => "xz",
        Some([0x1f, 0x8b, _, _]) => "gzip",
        other => bail!("unknown compression {other:02x?}"),
    };
    let decompressed = pipe(tool, &["-dc"], payload)?;
    if decompressed.get(..4) != Some(b"\x7fELF") {
        bail!("the payload is not an ELF vmlinux");
    }
    Ok(decompressed)
}

/// The largest well-formed BTF blob in `image`: a header (magic 0xeb9f, version 1, 24
/// bytes long) whose type section starts right after it and whose string section follows
/// the types, all inside `image`.
fn btf_blob(image: &[u8]) -> Option<&[u8]> {
    const MAGIC: [u8; 4] = [0x9f, 0xeb, 0x01, 0x00];
    const HEADER: usize = 24;
    let u32_at = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    image
        .windows(MAGIC.len())
        .enumerate()
        .filter(|(_, window)| *window == MAGIC)
        .filter_map(|(at, _)| {
            let fields: Vec<usize> = (1..6).map(|i| u32_at(at + 4 * i)).collect::<Option<_>>()?;
            let [hdr_len, type_off, type_len, str_off, str_len] = fields[..] else {
                return None;
            };
            let len = HEADER + str_off + str_len;
            (hdr_len == HEADER && type_off == 0 && str_off == type_len && type_len > 0)
                .then_some(())
                .and_then(|()| image.get(at..at.checked_add(len)?))
        })
        .max_by_key(|blob| blob.len())
}

/// Runs `program` with `input` on standard input; returns standard output. The exit
/// status is ignored: the kernel's payload carries trailing bytes that decompressors
/// complain about after writing everything.
pub fn pipe(program: &str, args: &[&str], input: &[u8]) -> anyhow::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output()?;
    let _ = writer.join();
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn btf_header(type_len: u32, str_len: u32) -> Vec<u8> {
        let mut blob = vec![0x9f, 0xeb, 0x01, 0x00, 24, 0, 0, 0];
        for field in [0, type_len, type_len, str_len] {
            blob.extend_from_slice(&field.to_le_bytes());
        }
        blob
    }

    #[test]
    fn the_btf_blob_is_cut_out_by_its_header() {
        let mut image = b"ARM\x64 code".to_vec();
        // A stray magic whose header does not hold together.
        image.extend_from_slice(&[0x9f, 0xeb, 0x01, 0x00, 7, 7, 7, 7]);
        let start = image.len();
        image.extend(btf_header(8, 4));
        image.extend_from_slice(b"TYPES...str\0");
        let end = image.len();
        image.extend_from_slice(b"more code");
        assert_eq!(btf_blob(&image), Some(&image[start..end]));
        // Lengths that run past the end of the image are no blob.
        let mut cut = btf_header(8, 400);
        cut.extend_from_slice(b"TYPES...");
        assert_eq!(btf_blob(&cut), None);
    }

    #[test]
    fn arm64_leaves_out_bullseye_security_only() {
        assert_eq!(sources(&kernel_suites("amd64")).lines().count(), 4);
        let arm64 = sources(&kernel_suites("arm64"));
        assert_eq!(arm64.lines().count(), 3);
        assert!(!arm64.contains("bullseye-security"));
        assert!(arm64.contains("http://deb.debian.org/debian bullseye main"));
    }

    #[test]
    fn newest_package_compares_numbers_not_text() {
        let names = [
            "linux-image-6.1.0-9-cloud-amd64-unsigned",
            "linux-image-6.1.0-57-cloud-amd64-unsigned",
            "linux-image-6.1.0-10-cloud-amd64-unsigned",
        ];
        let newest = names.iter().max_by_key(|n| numbers(n)).unwrap();
        assert_eq!(*newest, "linux-image-6.1.0-57-cloud-amd64-unsigned");
        assert_eq!(numbers("linux-image-6.12.117+deb12"), [6, 12, 117, 12]);
    }
}
