//! The test VM's initramfs, an uncompressed `newc` cpio archive: Debian's static busybox,
//! iproute2, nftables, iptables-nft and bpftool of the guest's architecture with the shared
//! libraries they load, the kernel's own netfilter and veth modules (with everything they
//! depend on, in load order), the static observer, the rules and the guest script.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use object::read::elf::{FileHeader as _, ProgramHeader as _};

use super::debian::{file_name, pipe};

/// Modules the scenarios need (what kube-proxy's iptables-nft and nftables rules use,
/// and veth); their dependencies come along. A name with no file is built in.
/// `crc32c_generic` first: where crc32c is a module (arm64), libcrc32c (nf_nat,
/// nf_tables) asks the crypto API for it, and a bare initramfs has no modprobe to load it.
const NETFILTER_MODULES: [&str; 26] = [
    "crc32c_generic",
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
    // An nftables flowtable (the flowtable scenario's).
    "nf_flow_table_inet",
];

/// The guest loads these groups of modules in this order, each listed in
/// `/modules/GROUP` (file names, dependencies first): conntrack's netlink interface
/// after the rest, so that observer is first checked without it.
const MODULE_GROUPS: [(&str, &[&str]); 2] = [
    ("netfilter", &NETFILTER_MODULES),
    ("ctnetlink", &["nf_conntrack_netlink"]),
];

/// Debian packages of the guest's userland, unpacked together: the programs below and
/// every library they (and iptables' extensions) link, with glibc's loader.
pub const USERLAND_PACKAGES: [&str; 23] = [
    "busybox-static",
    "iproute2",
    "nftables",
    "iptables",
    "bpftool",
    "netbase",
    "libc6",
    "libnftables1",
    "libxtables12",
    "libnftnl11",
    "libmnl0",
    "libnetfilter-conntrack3",
    "libnfnetlink0",
    "libjansson4",
    "libgmp10",
    "libedit2",
    "libbsd0",
    "libmd0",
    "libtinfo6",
    "libbpf1",
    "libelf1",
    "libcap2",
    "zlib1g",
];

/// Programs taken from the userland packages, installed in `/usr/sbin`.
const PROGRAMS: [&str; 4] = ["ip", "nft", "xtables-nft-multi", "bpftool"];
/// Where the packages install programs.
const PROGRAM_DIRS: [&str; 4] = ["usr/sbin", "sbin", "usr/bin", "bin"];
/// Names under which xtables-nft-multi works as iptables.
const XTABLES_NAMES: [&str; 5] = [
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
];
/// Symbolic links followed at most this deep inside the unpacked userland.
const SYMLINK_DEPTH: usize = 16;

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

    /// The networking userland from Debian's packages unpacked in `root` (the guest's
    /// architecture, `multiarch` its library directory name): busybox, iproute2,
    /// nftables, iptables-nft and its extensions, bpftool, every library they link (in
    /// `/lib/MULTIARCH`) and the loader they name.
    pub fn add_userland(&mut self, root: &Path, multiarch: &str) -> anyhow::Result<()> {
        self.add_file("/bin/busybox", &resolve(root, "/bin/busybox")?, 0o755)?;
        let mut linked = Vec::new();
        for program in PROGRAMS {
            let path = PROGRAM_DIRS
                .iter()
                .map(|dir| format!("/{dir}/{program}"))
                .find(|path| resolve(root, path).is_ok())
                .with_context(|| {
                    format!("{program} is in none of the userland packages' program directories")
                })?;
            let data = std::fs::read(resolve(root, &path)?)?;
            linked.push((path, data.clone()));
            self.add_bytes(&format!("/usr/sbin/{program}"), data, 0o755);
        }
        for name in XTABLES_NAMES {
            self.add_symlink(&format!("/usr/sbin/{name}"), "xtables-nft-multi");
        }
        let extensions = format!("/usr/lib/{multiarch}/xtables");
        let dir = root.join(extensions.trim_start_matches('/'));
        for entry in std::fs::read_dir(&dir)
            .with_context(|| format!("cannot read {} (iptables' extensions)", dir.display()))?
        {
            let name = file_name(&entry?.path());
            let path = format!("{extensions}/{name}");
            let data = std::fs::read(resolve(root, &path)?)?;
            linked.push((path.clone(), data.clone()));
            self.add_bytes(&path, data, 0o644);
        }
        self.add_libraries(root, multiarch, linked)?;
        for etc in ["/etc/protocols", "/etc/services"] {
            self.add_file(etc, &resolve(root, etc)?, 0o644)?;
        }
        Ok(())
    }

    /// Every library `linked` (path, ELF file) needs, transitively, found in the
    /// packages' library directories and installed in `/lib/MULTIARCH`, and each loader
    /// they name at its own path.
    fn add_libraries(
        &mut self,
        root: &Path,
        multiarch: &str,
        mut linked: Vec<(String, Vec<u8>)>,
    ) -> anyhow::Result<()> {
        let library_dirs = [format!("/lib/{multiarch}"), format!("/usr/lib/{multiarch}")];
        let mut added = BTreeSet::new();
        while let Some((path, elf)) = linked.pop() {
            let (loader, needed) =
                dynamic_links(&elf).with_context(|| format!("cannot read the ELF file {path}"))?;
            if let Some(loader) = loader
                && added.insert(loader.clone())
            {
                self.add_file(&loader, &resolve(root, &loader)?, 0o755)?;
            }
            for library in needed {
                if !added.insert(library.clone()) {
                    continue;
                }
                let found = library_dirs
                    .iter()
                    .find_map(|dir| resolve(root, &format!("{dir}/{library}")).ok())
                    .with_context(|| {
                        format!(
                            "{library} (needed by {path}) is in none of the userland packages; add its Debian package to USERLAND_PACKAGES"
                        )
                    })?;
                let data = std::fs::read(&found)?;
                linked.push((library.clone(), data.clone()));
                self.add_bytes(&format!("/lib/{multiarch}/{library}"), data, 0o755);
            }
        }
        Ok(())
    }

    /// The kernel's modules of each of `MODULE_GROUPS` and their dependencies not loaded
    /// by an earlier group, decompressed, with `/modules/GROUP` listing them dependencies
    /// first.
    pub fn add_modules(&mut self, kernel_root: &Path, release: &str) -> anyhow::Result<()> {
        let dir = kernel_root.join("lib/modules").join(release).join("kernel");
        let mut files = BTreeMap::new();
        index_modules(&dir, &mut files)?;
        let mut seen = BTreeSet::new();
        for (group, modules) in MODULE_GROUPS {
            let mut order = Vec::new();
            for name in modules {
                load_order(name, &files, &mut seen, &mut order)?;
            }
            let mut list = String::new();
            for (name, data) in order {
                self.add_bytes(&format!("/modules/{name}.ko"), data, 0o644);
                list.push_str(&format!("{name}.ko\n"));
            }
            self.add_bytes(&format!("/modules/{group}"), list.into_bytes(), 0o644);
        }
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

/// The file at `path` (absolute, as the guest sees it) in the unpacked tree `root`, its
/// symbolic links followed inside `root` (a package's absolute links name the guest's
/// paths, never the host's).
fn resolve(root: &Path, path: &str) -> anyhow::Result<PathBuf> {
    let mut path = PathBuf::from(path);
    for _ in 0..SYMLINK_DEPTH {
        let inside = root.join(path.strip_prefix("/").unwrap_or(&path));
        let meta = std::fs::symlink_metadata(&inside)
            .with_context(|| format!("{} is in no userland package", path.display()))?;
        if !meta.file_type().is_symlink() {
            return Ok(inside);
        }
        let target = std::fs::read_link(&inside)?;
        path = match path.parent() {
            Some(parent) if target.is_relative() => parent.join(target),
            _ => target,
        };
    }
    bail!("{}: too many symbolic links", path.display())
}

/// The loader (`PT_INTERP`) and the libraries (`DT_NEEDED`) an ELF file names.
fn dynamic_links(elf: &[u8]) -> anyhow::Result<(Option<String>, Vec<String>)> {
    let header = object::elf::FileHeader64::<object::Endianness>::parse(elf)?;
    let endian = header.endian()?;
    let mut loader = None;
    for segment in header.program_headers(endian, elf)? {
        if let Some(path) = segment.interpreter(endian, elf)? {
            loader = Some(String::from_utf8_lossy(path).into_owned());
        }
    }
    let dynamic = header.sections(endian, elf)?.dynamic_table(endian, elf)?;
    let mut needed = Vec::new();
    for entry in dynamic.iter() {
        if entry.tag == object::elf::DT_NEEDED {
            needed.push(String::from_utf8_lossy(dynamic.string(entry)?).into_owned());
        }
    }
    Ok((loader, needed))
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
    fn dynamic_links_name_the_loader_and_libraries() {
        // This test binary: dynamically linked against glibc on the host.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let (loader, needed) = dynamic_links(&me).unwrap();
        assert!(loader.unwrap().starts_with("/lib"));
        assert!(needed.iter().any(|l| l == "libc.so.6"), "{needed:?}");
        assert!(dynamic_links(b"#!/bin/sh\n").is_err());
    }

    #[test]
    fn links_resolve_inside_the_unpacked_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("lib/x86_64-linux-gnu")).unwrap();
        std::fs::create_dir_all(root.join("lib64")).unwrap();
        std::fs::write(root.join("lib/x86_64-linux-gnu/libz.so.1.2.13"), "z").unwrap();
        let link =
            |target: &str, at: &str| std::os::unix::fs::symlink(target, root.join(at)).unwrap();
        link("libz.so.1.2.13", "lib/x86_64-linux-gnu/libz.so.1");
        // Absolute: names the guest's path, which must not be read from the host.
        link("/lib/x86_64-linux-gnu/libz.so.1", "lib64/libz.so");
        link("/lib64/loop", "lib64/loop");
        assert_eq!(
            resolve(root, "/lib64/libz.so").unwrap(),
            root.join("lib/x86_64-linux-gnu/libz.so.1.2.13")
        );
        assert!(resolve(root, "/lib64/loop").is_err());
        assert!(resolve(root, "/etc/passwd").is_err());
    }

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
