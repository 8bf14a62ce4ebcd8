//! The test VM's initramfs, an uncompressed `newc` cpio archive: static busybox, the
//! host's iproute2/nftables/iptables-nft/bpftool with the shared libraries they load, the
//! kernel's own netfilter and veth modules (with everything they depend on, in load
//! order), the static observer, the rules and the guest script.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use super::debian::{file_name, pipe};

/// Modules the scenarios need (what kube-proxy's iptables-nft and nftables rules use,
/// and veth); their dependencies come along. A name with no file is built in.
const MODULES: [&str; 24] = [
    "veth",
    "nf_conntrack",
    "nf_nat",
    "nf_tables",
    "nft_chain_nat",
    "nft_ct",
    "nft_nat",
    "nft_numgen",
    "nft_fib_ipv4",
    "nft_masq",
    "nft_reject_ipv4",
    "nft_compat",
    "nft_counter",
    "xt_conntrack",
    "xt_comment",
    "xt_mark",
    "xt_MASQUERADE",
    "xt_addrtype",
    "xt_statistic",
    "xt_nat",
    "xt_tcpudp",
    "ipt_REJECT",
    "nfnetlink",
    "nf_reject_ipv4",
];

/// Host programs copied in, with their libraries.
const PROGRAMS: [&str; 4] = [
    "/usr/sbin/ip",
    "/usr/sbin/nft",
    "/usr/sbin/xtables-nft-multi",
    "/usr/sbin/bpftool",
];
/// Names under which xtables-nft-multi works as iptables.
const XTABLES_NAMES: [&str; 5] = [
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
];
/// The iptables extensions (`libxt_*.so`) iptables-nft loads at run time.
const XTABLES_DIR: &str = "/usr/lib/x86_64-linux-gnu/xtables";

enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink(String),
}

/// Archive contents by path (without the leading `/`).
#[derive(Default)]
pub struct Initramfs {
    entries: BTreeMap<String, Entry>,
}

impl Initramfs {
    pub fn add_bytes(&mut self, path: &str, data: Vec<u8>, mode: u32) {
        self.add_parents(path);
        self.entries.insert(
            path.trim_start_matches('/').to_owned(),
            Entry::File { data, mode },
        );
    }

    pub fn add_file(&mut self, path: &str, from: &Path, mode: u32) -> anyhow::Result<()> {
        let data =
            std::fs::read(from).with_context(|| format!("cannot read {}", from.display()))?;
        self.add_bytes(path, data, mode);
        Ok(())
    }

    fn add_symlink(&mut self, path: &str, target: &str) {
        self.add_parents(path);
        self.entries.insert(
            path.trim_start_matches('/').to_owned(),
            Entry::Symlink(target.to_owned()),
        );
    }

    fn add_parents(&mut self, path: &str) {
        let path = Path::new(path.trim_start_matches('/'));
        for parent in path.ancestors().skip(1) {
            let name = parent.to_string_lossy();
            if !name.is_empty() {
                self.entries.entry(name.into_owned()).or_insert(Entry::Dir);
            }
        }
    }

    /// A program and every shared library `ldd` says it loads, at the same paths.
    pub fn add_program(&mut self, path: &str) -> anyhow::Result<()> {
        self.add_file(path, Path::new(path), 0o755)?;
        self.add_libraries(Path::new(path))
    }

    fn add_libraries(&mut self, binary: &Path) -> anyhow::Result<()> {
        let out = Command::new("ldd")
            .arg(binary)
            .output()
            .context("cannot run ldd")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(path) = path.filter(|p| p.starts_with('/'))
                && !self.entries.contains_key(path.trim_start_matches('/'))
            {
                self.add_file(path, Path::new(path), 0o755)?;
            }
        }
        Ok(())
    }

    /// The networking userland: iproute2, nftables, iptables-nft and its extensions, bpftool.
    pub fn add_userland(&mut self) -> anyhow::Result<()> {
        let busybox = Path::new("/bin/busybox");
        self.add_file("/bin/busybox", busybox, 0o755)?;
        for program in PROGRAMS {
            self.add_program(program)?;
        }
        for name in XTABLES_NAMES {
            self.add_symlink(&format!("/usr/sbin/{name}"), "xtables-nft-multi");
        }
        for entry in std::fs::read_dir(XTABLES_DIR)
            .with_context(|| format!("cannot read {XTABLES_DIR} (is iptables installed?)"))?
        {
            let path = entry?.path();
            self.add_file(&path.to_string_lossy(), &path, 0o644)?;
            self.add_libraries(&path)?;
        }
        for etc in ["/etc/protocols", "/etc/services"] {
            if Path::new(etc).exists() {
                self.add_file(etc, Path::new(etc), 0o644)?;
            }
        }
        Ok(())
    }

    /// The kernel's modules for `MODULES` and their dependencies, decompressed, with
    /// `/modules/order` listing them dependencies first.
    pub fn add_modules(&mut self, kernel_root: &Path, release: &str) -> anyhow::Result<()> {
        let dir = kernel_root.join("lib/modules").join(release).join("kernel");
        let mut files = BTreeMap::new();
        index_modules(&dir, &mut files)?;
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        for name in MODULES {
            load_order(name, &files, &mut seen, &mut order)?;
        }
        let mut list = String::new();
        for (name, data) in order {
            self.add_bytes(&format!("/modules/{name}.ko"), data, 0o644);
            list.push_str(&format!("{name}.ko\n"));
        }
        self.add_bytes("/modules/order", list.into_bytes(), 0o644);
        Ok(())
    }

    /// The archive in the kernel's `newc` format.
    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        let mut cpio = Vec::new();
        for (ino, (path, entry)) in self.entries.iter().enumerate() {
            let (mode, data): (u32, &[u8]) = match entry {
                Entry::Dir => (0o040_755, &[]),
                Entry::File { data, mode } => (0o100_000 | mode, data),
                Entry::Symlink(target) => (0o120_777, target.as_bytes()),
            };
            cpio_entry(&mut cpio, ino as u32 + 1, path, mode, data);
        }
        cpio_entry(&mut cpio, 0, "TRAILER!!!", 0, &[]);
        std::fs::write(out, cpio).with_context(|| format!("cannot write {}", out.display()))
    }
}

fn cpio_entry(out: &mut Vec<u8>, ino: u32, name: &str, mode: u32, data: &[u8]) {
    let nlink = if mode & 0o040_000 != 0 { 2 } else { 1 };
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        data.len() as u32,
        0,
        0,
        0,
        0,
        name.len() as u32 + 1,
        0,
    ];
    out.extend_from_slice(b"070701");
    for field in fields {
        out.extend_from_slice(format!("{field:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// Module name (dashes as underscores, as the kernel names them) to file.
fn index_modules(dir: &Path, files: &mut BTreeMap<String, PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            index_modules(&path, files)?;
        } else if let Some(name) = file_name(&path).split(".ko").next() {
            files.insert(name.replace('-', "_"), path);
        }
    }
    Ok(())
}

/// Appends `name`'s dependencies, then `name`, to `order` (each once).
fn load_order(
    name: &str,
    files: &BTreeMap<String, PathBuf>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<(String, Vec<u8>)>,
) -> anyhow::Result<()> {
    let name = name.replace('-', "_");
    if !seen.insert(name.clone()) {
        return Ok(());
    }
    let Some(path) = files.get(&name) else {
        return Ok(()); // built into the kernel (or into a module loaded anyway)
    };
    let raw = std::fs::read(path)?;
    let data = match file_name(path).rsplit('.').next() {
        Some("ko") => raw,
        Some("xz") => pipe("xz", &["-dc"], &raw)?,
        Some("zst") => pipe("zstd", &["-dc"], &raw)?,
        _ => bail!("{}: unknown module compression", path.display()),
    };
    for dep in depends(&data) {
        load_order(&dep, files, seen, order)?;
    }
    order.push((name, data));
    Ok(())
}

/// The `depends=` entry of a module's `.modinfo` section.
fn depends(module: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = module.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let value = &module[at + KEY.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_reads_the_modinfo_list() {
        let module = b"\x7fELF...\0license=GPL\0depends=nf_conntrack,libcrc32c\0retpoline=Y\0";
        assert_eq!(depends(module), ["nf_conntrack", "libcrc32c"]);
        assert!(depends(b"\0depends=\0name=x\0").is_empty());
    }

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut out = Vec::new();
        cpio_entry(&mut out, 1, "init", 0o100_755, b"#!/bin/sh\n");
        assert!(out.starts_with(b"07070100000001000081ed"));
        // 110-byte header + "init\0" padded to 116, then 10 bytes of data padded to 12.
        assert_eq!(out.len(), 128);
    }
}
