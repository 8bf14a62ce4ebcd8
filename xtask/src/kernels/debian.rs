//! Debian's kernel packages, fetched with apt's own client into a private apt state under
//! `target/kernels/apt` (the host's apt sources stay untouched; bullseye is one more suite
//! there), unpacked with `dpkg-deb -x`, and the `vmlinux` (with its `.BTF` section) taken
//! out of the compressed `vmlinuz`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};

use crate::setup::run;

/// The suites searched: bookworm (6.1, 6.12) and bullseye (5.10), with their security
/// updates, all signed by the keys in Debian's archive keyring.
const SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bullseye-security main
";

/// Package lists younger than this are reused (reruns need no network).
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Longest one apt command may take (a kernel package is ~70 MB).
const APT_DEADLINE_SECONDS: &str = "600";

/// apt with its own sources, lists and cache in `dir`.
pub struct Apt {
    dir: PathBuf,
}

impl Apt {
    /// Prepares the private apt state and refreshes its package lists when they are old.
    pub fn new(dir: &Path) -> anyhow::Result<Apt> {
        let apt = Apt {
            dir: dir.to_path_buf(),
        };
        for sub in ["lists/partial", "cache/archives/partial", "debs"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let sources = dir.join("sources.list");
        let stamp = dir.join("lists/.updated");
        let fresh = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() < LISTS_MAX_AGE);
        if fresh && std::fs::read_to_string(&sources).is_ok_and(|s| s == SOURCES) {
            return Ok(apt);
        }
        std::fs::write(&sources, SOURCES)?;
        eprintln!("kernels: updating the package lists of Debian bookworm and bullseye");
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
            "APT::Architecture=amd64".to_owned(),
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

    /// Downloads `package` (once) and unpacks it (once); returns the unpacked root.
    pub fn unpacked(&self, package: &str) -> anyhow::Result<PathBuf> {
        let root = self.dir.join("unpacked").join(package);
        if root.join(".complete").exists() {
            return Ok(root);
        }
        let debs = self.dir.join("debs");
        let find = || -> anyhow::Result<Option<PathBuf>> {
            Ok(std::fs::read_dir(&debs)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| file_name(p).starts_with(&format!("{package}_"))))
        };
        let deb = match find()? {
            Some(deb) => deb,
            None => {
                eprintln!("kernels: downloading {package}");
                run(self
                    .command("apt-get")
                    .args(["download", "-qq", package])
                    .current_dir(&debs))?;
                find()?.with_context(|| format!("apt-get download left no {package}_*.deb"))?
            }
        };
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        std::fs::write(root.join(".complete"), "")?;
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

/// Writes `vmlinux` out of a bzImage: the payload that the boot protocol header locates
/// (`setup_sects`, `payload_offset`, `payload_length`), decompressed by its magic.
pub fn extract_vmlinux(vmlinuz: &Path, out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        return Ok(());
    }
    let image = std::fs::read(vmlinuz)?;
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
        other => bail!("{}: unknown compression {other:02x?}", vmlinuz.display()),
    };
    let decompressed = pipe(tool, &["-dc"], payload)?;
    if decompressed.get(..4) != Some(b"\x7fELF") {
        bail!("{}: the payload is not an ELF vmlinux", vmlinuz.display());
    }
    let partial = out.with_extension("partial");
    std::fs::write(&partial, decompressed)?;
    std::fs::rename(&partial, out)?;
    Ok(())
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
