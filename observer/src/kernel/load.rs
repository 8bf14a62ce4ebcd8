//! Loading: the kernel's BTF read once, the embedded object loaded with the offsets
//! and sizes filled in, and its maps taken out of it.

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, RingBuf},
};
use observer_common::offsets::KernelOffsets;

use crate::kernel::{
    btf::{Btf, BtfError},
    mapped_array::MappedArray,
    offsets,
};

/// The compiled kernel programs, built by `build.rs` and embedded in the binary.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// The object's bytes (the netfilter program is loaded from them again, `netfilter`).
pub fn object() -> &'static [u8] {
    PROGRAMS
}

/// Why the object or its maps could not be loaded. Each message names what failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}", error_chain(.0))]
    Object(aya::EbpfError),
    #[error("cannot read the kernel's clock tick length: {0}")]
    Tick(nix::errno::Errno),
    #[error("the kernel's clock tick length is {0} ns, not a jiffy (1-10 ms)")]
    NotAJiffy(u64),
    #[error("map {0} missing from the object")]
    MissingMap(&'static str),
    #[error("{}", error_chain(.0))]
    Map(aya::maps::MapError),
    #[error("cannot map the array {name}: {error}")]
    MappedArray {
        name: &'static str,
        error: std::io::Error,
    },
    #[error("cannot read the connection table: {0}")]
    ConnsFd(std::io::Error),
    #[error("cannot poll the ring buffer {name}: {error}")]
    Poll {
        name: &'static str,
        error: std::io::Error,
    },
}

/// Why the BTF at the given path cannot give the kernel's layout.
#[derive(Debug, thiserror::Error)]
pub enum BtfFileError {
    #[error(
        "cannot read kernel BTF at {path} ({error}); observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (or --btf FILE) to find conntrack's structure offsets"
    )]
    Unreadable { path: String, error: std::io::Error },
    #[error(
        "cannot use kernel BTF at {path}: {error}; observer needs the kernel's BTF (or --btf FILE) to find conntrack's structure offsets"
    )]
    Unusable { path: String, error: BtfError },
}

/// What the programs need to know of the kernel, from its BTF: conntrack's structure
/// offsets, and how `kfree_skb` says netfilter dropped a packet (0: it does not say).
pub struct KernelLayout {
    offsets: observer_common::offsets::KernelOffsets,
    netfilter_drop_reason: u32,
}

/// The kernel's BTF, read once: the layout observer's own reader finds in it, and aya's
/// parse of the running kernel's BTF, which the loader and the BTF tracepoint programs
/// share (or, when it is not readable, why).
pub struct KernelBtf {
    pub layout: KernelLayout,
    pub vmlinux: Result<aya::Btf, String>,
}

impl KernelBtf {
    /// Reads the layout from `btf_path`, and the running kernel's BTF for aya: from the
    /// same bytes when `btf_path` is the kernel's own.
    pub fn read(btf_path: &std::path::Path) -> Result<KernelBtf, BtfFileError> {
        let path = btf_path.display().to_string();
        let file = std::fs::File::open(btf_path).map_err(|error| BtfFileError::Unreadable {
            path: path.clone(),
            error,
        })?;
        let unusable = |error| BtfFileError::Unusable {
            path: path.clone(),
            error,
        };
        let data = Btf::read_data(file).map_err(unusable)?;
        let btf = Btf::parse(&data).map_err(unusable)?;
        let offsets = offsets::kernel_offsets(&btf).map_err(unusable)?;
        log::debug!("kernel offsets from BTF: {}", offsets::describe(&offsets));
        let layout = KernelLayout {
            offsets,
            netfilter_drop_reason: offsets::netfilter_drop_reason(&btf),
        };
        let vmlinux = if btf_path == std::path::Path::new(Btf::SYS_FS) {
            aya::Btf::parse(&data, aya::Endianness::default())
        } else {
            aya::Btf::from_sys_fs()
        };
        Ok(KernelBtf {
            layout,
            vmlinux: vmlinux.map_err(|err| error_chain(&err)),
        })
    }
}

/// Table and ring sizes for the object (see `CaptureOptions`).
pub struct Sizes {
    pub max_connections: u32,
    /// `NEAR_CONNS`' entries: at least 1, the map's minimum, where it is not used.
    pub near_connections: u32,
    pub ring_buffer_bytes: Option<u32>,
    pub dns_ring_buffer_bytes: Option<u32>,
}

impl Sizes {
    /// `CHECKED`'s slots: one per connection both levels of the table can hold.
    pub fn checked(&self) -> u32 {
        self.max_connections.saturating_add(self.near_connections)
    }
}

/// The id of `struct name` in the kernel's BTF; 0 where it is not there (the kernel then
/// refuses the netfilter program, which casts to it: `--hook auto` falls back to
/// `net_dev_queue`).
fn struct_id(kernel: &KernelBtf, name: &str) -> u32 {
    kernel.vmlinux.as_ref().map_or(0, |vmlinux| {
        vmlinux
            .id_by_type_name_kind(name, aya_obj::btf::BtfKind::Struct)
            .unwrap_or(0)
    })
}

/// Loads the embedded object with the offsets and table sizes filled in.
pub fn load(sizes: &Sizes, kernel: &KernelBtf) -> Result<Ebpf, LoadError> {
    let tick_ns = tick_ns()?;
    let layout = &kernel.layout;
    let offsets = KernelOffsets {
        // From the same BTF as the kernel functions' ids (`kernel::netfilter`).
        ct_btf_id: struct_id(kernel, "nf_conn"),
        iphdr_btf_id: struct_id(kernel, "iphdr"),
        ipv6hdr_btf_id: struct_id(kernel, "ipv6hdr"),
        tcphdr_btf_id: struct_id(kernel, "tcphdr"),
        ..layout.offsets
    };
    // aya 0.14's `EbpfLoader::new` parses the kernel's BTF itself, with no way around
    // it; the loader is then given the parse the attach routines use, so both agree.
    let mut loader = EbpfLoader::new();
    loader
        .btf(kernel.vmlinux.as_ref().ok())
        .override_global("OFFSETS", &offsets, true)
        .override_global("NETFILTER_DROP_REASON", &layout.netfilter_drop_reason, true)
        .override_global("TICK_NS", &tick_ns, true)
        .map_max_entries("CONNS", sizes.max_connections)
        .map_max_entries("NEAR_CONNS", sizes.near_connections)
        .map_max_entries("DIALED", sizes.max_connections)
        .map_max_entries("CHECKED", sizes.checked());
    for (ring, bytes) in [
        ("EVENTS", sizes.ring_buffer_bytes),
        ("DNS_EVENTS", sizes.dns_ring_buffer_bytes),
    ] {
        if let Some(bytes) = bytes {
            loader.map_max_entries(ring, bytes);
        }
    }
    loader.load(PROGRAMS).map_err(LoadError::Object)
}

/// The length of the kernel's clock tick (a jiffy) in nanoseconds: the resolution of
/// the coarse clocks, which advance once per tick. The programs stamp most packets with
/// jiffies (`observer-ebpf/src/clock.rs`).
fn tick_ns() -> Result<u64, LoadError> {
    let resolution = nix::time::clock_getres(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map_err(LoadError::Tick)?;
    let nanos = resolution.tv_sec() as u64 * 1_000_000_000 + resolution.tv_nsec() as u64;
    if nanos == 0 || nanos > 100_000_000 {
        return Err(LoadError::NotAJiffy(nanos));
    }
    Ok(nanos)
}

/// Takes the map `name` out of the object.
pub fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, LoadError> {
    ebpf.take_map(name).ok_or(LoadError::MissingMap(name))
}

/// Takes the map `name` as the map type `M`.
pub fn take<M>(ebpf: &mut Ebpf, name: &'static str) -> Result<M, LoadError>
where
    M: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    M::try_from(take_map(ebpf, name)?).map_err(LoadError::Map)
}

/// Maps the first `slots` of the mmapable array `name` (the revalidation program's
/// `CHECKED`, the table's `FAR_ENTRIES`).
pub fn mapped_array(
    ebpf: &mut Ebpf,
    name: &'static str,
    slots: u32,
) -> Result<MappedArray, LoadError> {
    match take_map(ebpf, name)? {
        aya::maps::Map::Array(data) => MappedArray::new(data, slots as usize),
        _ => Err(std::io::Error::other("it is not an array")),
    }
    .map_err(|error| LoadError::MappedArray { name, error })
}

/// Takes the ring buffer `name` and registers it with tokio, to wait for it to become
/// readable.
pub fn poll_ring_buffer(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<tokio::io::unix::AsyncFd<RingBuf<MapData>>, LoadError> {
    let events: RingBuf<MapData> = take(ebpf, name)?;
    // SAFETY: the ring buffer owns its descriptor and moves into the AsyncFd, which
    // deregisters it before dropping it, so the descriptor outlives the registration.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(events, tokio::io::Interest::READABLE)
    }
    .map_err(|err| LoadError::Poll {
        name,
        error: err.into_parts().1,
    })
}

/// An error and its sources on one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = one_line(&err.to_string());
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&one_line(&cause.to_string()));
        source = cause.source();
    }
    text
}

/// How many of a verifier log's last lines an error keeps: the verdict is at its end.
const VERIFIER_LINES_KEPT: usize = 3;

/// A message folded onto one line. Aya's load errors carry the verifier's log, one
/// line per instruction; only its last lines, which give the verdict, are kept.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    match lines.split_first() {
        None => String::new(),
        Some((first, rest)) if rest.len() > VERIFIER_LINES_KEPT => format!(
            "{first} ... {}",
            rest[rest.len() - VERIFIER_LINES_KEPT..].join(" / ")
        ),
        Some(_) => lines.join(" / "),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_verifier_log_is_folded_onto_one_line_keeping_its_verdict() {
        let log = "the BPF_PROG_LOAD syscall failed. Verifier output: 0: (b7) r0 = 0\n1: (95) exit\n2: x\nprocessed 2 insns\nnumber of funcs in func_info doesn't match number of subprogs\n";
        assert_eq!(
            super::one_line(log),
            "the BPF_PROG_LOAD syscall failed. Verifier output: 0: (b7) r0 = 0 ... 2: x / processed 2 insns / number of funcs in func_info doesn't match number of subprogs"
        );
        assert_eq!(super::one_line("a\n\nb\n"), "a / b");
        assert_eq!(super::one_line("plain"), "plain");
    }

    #[test]
    fn the_tick_is_a_jiffy() {
        // HZ is 100 to 1000 on every kernel configuration.
        let tick = super::tick_ns().unwrap();
        assert!((1_000_000..=10_000_000).contains(&tick), "{tick} ns");
    }
}
