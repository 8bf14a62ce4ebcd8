//! The kernel edge: checks privileges and BTF, loads and attaches the programs, and
//! reads their maps. Everything above this works on plain data (`tracker`, `record`).

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        BtfTracePoint, CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, RawTracePoint,
        RawTracePointRunOptions, TestRun as _,
    },
};
use observer_common::{
    conn::{ConnEvent, ConnState, DialedKey, GONE_MARK},
    counters,
    dns::DnsEvent,
    reject::{RejectCount, RejectEvent, RejectKey},
};

use std::os::fd::AsFd as _;

use crate::kernel::host::{Caps, kernel_release, raise_memlock, too_old};
use crate::kernel::{btf::Btf, decode, mapped_array::MappedArray};

/// The compiled kernel programs, built by `build.rs` and embedded in the binary.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// The tracepoint the forwarding hook attaches to.
const DEV_QUEUE: &str = "net_dev_queue";

/// Why capture could not start. Each message is one sentence naming cause and fix.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "loading kernel programs needs root: this process lacks {missing}; run observer with sudo"
    )]
    NotPrivileged { missing: String },
    #[error("{0}")]
    KernelTooOld(String),
    #[error(
        "cannot read kernel BTF at {path} ({error}); observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (or --btf FILE) to find conntrack's structure offsets"
    )]
    NoBtf { path: String, error: std::io::Error },
    #[error(
        "cannot use kernel BTF at {path}: {error}; observer needs the kernel's BTF (or --btf FILE) to find conntrack's structure offsets"
    )]
    BadBtf {
        path: String,
        error: crate::kernel::btf::BtfError,
    },
    #[error("the kernel refused observer's programs: {0}")]
    Load(String),
    #[error("the kernel refused to attach to tracepoint {hook}: {reason}")]
    Attach { hook: &'static str, reason: String },
}

/// Options for `Capture::start`.
#[derive(Clone, Debug)]
pub struct CaptureOptions {
    /// Size of the kernel's connection table (`CONNS`).
    pub max_connections: u32,
    /// Where the kernel's BTF is (normally `/sys/kernel/btf/vmlinux`).
    pub btf_path: std::path::PathBuf,
    /// The connection events' ring buffer's size in bytes (a power of two, at least a
    /// page); `None` keeps the programs' default (4 MiB).
    pub ring_buffer_bytes: Option<u32>,
    /// The same for the DNS messages' ring buffer (default 2 MiB).
    pub dns_ring_buffer_bytes: Option<u32>,
}

/// Summed per-CPU counters (see `observer_common::counters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections entered in the kernel's table.
    pub tracked: u64,
    /// Connection events not written (their ring buffer full); no record missing.
    pub events_dropped: u64,
    pub read_errors: u64,
    /// DNAT decisions without a record: the table was full at their first packet.
    pub lost_table_full: u64,
    /// Tracked connections without a record (ended when neither reportable nor keepable).
    pub lost_unreported: u64,
    /// DNS message prefixes written, and not written, i.e. lost (their ring buffer
    /// full, or the payload not in the packet's linear part).
    pub dns_emitted: u64,
    pub dns_dropped: u64,
    /// Rejected-flow reports not written (their ring buffer was full).
    pub rejects_dropped: u64,
}

/// Attached programs and their maps. Dropping it detaches everything.
pub struct Capture {
    /// Owns the programs; `None` once detached.
    ebpf: Option<Ebpf>,
    /// Connections' open and close events.
    events: tokio::io::unix::AsyncFd<RingBuf<MapData>>,
    /// DNS message prefixes: a ring of their own (see observer-ebpf's `maps.rs`).
    dns_events: tokio::io::unix::AsyncFd<RingBuf<MapData>>,
    /// Rejected flows' reports: drained on the drain timer (never a wake-up of its own,
    /// so a flood of them costs user space no extra wake-ups).
    rejects: RingBuf<MapData>,
    /// Rejected flows' counts, by flow.
    rejected: HashMap<MapData, RejectKey, RejectCount>,
    conns: HashMap<MapData, u64, ConnState>,
    /// `conns`' descriptor again, for batch reads (aya 0.14 has none).
    conns_fd: std::os::fd::OwnedFd,
    dialed: HashMap<MapData, DialedKey, u64>,
    counters: PerCpuArray<MapData, u64>,
    lost_by_netns: HashMap<MapData, u32, u64>,
    dns_dropped_by_netns: HashMap<MapData, u32, u64>,
    hooks_attached: u32,
    /// The revalidation program's slots (see `gone_connections`).
    checked: MappedArray,
    /// Why the revalidation program could not load (then conntrack's destroy events
    /// must say when entries go); `None` when it loaded.
    revalidation_refused: Option<String>,
    /// What works less well than it could on this machine, one sentence each.
    pub warnings: Vec<String>,
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid systems), from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        // Fields: id parent major:minor root mount-point options ... - fstype source options
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next()? == "cgroup2")
            .then(|| {
                before
                    .split_whitespace()
                    .nth(4)
                    .map(std::path::PathBuf::from)
            })
            .flatten()
    })
}

/// What the programs need to know of the kernel, from its BTF: conntrack's structure
/// offsets, and how `kfree_skb` says netfilter dropped a packet (0: it does not say).
struct KernelLayout {
    offsets: observer_common::offsets::KernelOffsets,
    netfilter_drop_reason: u32,
}

/// The kernel's layout from its BTF at `btf_path`.
fn read_layout(btf_path: &std::path::Path) -> Result<KernelLayout, CaptureError> {
    let path = btf_path.display().to_string();
    let file = std::fs::File::open(btf_path).map_err(|error| CaptureError::NoBtf {
        path: path.clone(),
        error,
    })?;
    let bad = |error| CaptureError::BadBtf {
        path: path.clone(),
        error,
    };
    let btf = Btf::read(file).map_err(bad)?;
    let offsets = crate::kernel::offsets::kernel_offsets(&btf).map_err(bad)?;
    log::debug!(
        "kernel offsets from BTF: {}",
        crate::kernel::offsets::describe(&offsets)
    );
    Ok(KernelLayout {
        offsets,
        netfilter_drop_reason: crate::kernel::offsets::netfilter_drop_reason(&btf),
    })
}

/// Loads the embedded object with the offsets and table sizes filled in.
fn load(options: &CaptureOptions, layout: &KernelLayout) -> Result<Ebpf, CaptureError> {
    let tick_ns = tick_ns()?;
    let mut loader = EbpfLoader::new();
    loader
        .override_global("OFFSETS", &layout.offsets, true)
        .override_global("NETFILTER_DROP_REASON", &layout.netfilter_drop_reason, true)
        .override_global("TICK_NS", &tick_ns, true)
        .map_max_entries("CONNS", options.max_connections)
        .map_max_entries("DIALED", options.max_connections)
        .map_max_entries("CHECKED", options.max_connections);
    for (ring, bytes) in [
        ("EVENTS", options.ring_buffer_bytes),
        ("DNS_EVENTS", options.dns_ring_buffer_bytes),
    ] {
        if let Some(bytes) = bytes {
            loader.map_max_entries(ring, bytes);
        }
    }
    loader
        .load(PROGRAMS)
        .map_err(|err| CaptureError::Load(error_chain(&err)))
}

/// The length of the kernel's clock tick (a jiffy) in nanoseconds: the resolution of
/// the coarse clocks, which advance once per tick. The programs stamp most packets with
/// jiffies (`observer-ebpf/src/clock.rs`).
fn tick_ns() -> Result<u64, CaptureError> {
    let resolution =
        nix::time::clock_getres(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).map_err(|errno| {
            CaptureError::Load(format!(
                "cannot read the kernel's clock tick length: {errno}"
            ))
        })?;
    let nanos = resolution.tv_sec() as u64 * 1_000_000_000 + resolution.tv_nsec() as u64;
    if nanos == 0 || nanos > 100_000_000 {
        return Err(CaptureError::Load(format!(
            "the kernel's clock tick length is {nanos} ns, not a jiffy (1-10 ms)"
        )));
    }
    Ok(nanos)
}

/// Attaches the forwarding hook to `net_dev_queue`: the BTF tracepoint program
/// (`sk_buff` fields as plain loads) where the kernel takes it, else the raw tracepoint
/// program (fields through helper calls), saying so in `warnings`.
fn attach_dev_queue(ebpf: &mut Ebpf, warnings: &mut Vec<String>) -> Result<(), CaptureError> {
    let btf_refused = match attach_btf_tracepoint(ebpf) {
        Ok(()) => {
            log::debug!("net_dev_queue attached as a BTF tracepoint");
            return Ok(());
        }
        Err(reason) => reason,
    };
    let mut attach = || -> Result<(), String> {
        let program: &mut RawTracePoint = ebpf
            .program_mut("dev_queue_raw")
            .ok_or("program missing from the object")?
            .try_into()
            .map_err(|err| error_chain(&err))?;
        program.load().map_err(|err| error_chain(&err))?;
        program.attach(DEV_QUEUE).map_err(|err| error_chain(&err))?;
        Ok(())
    };
    attach().map_err(|reason| CaptureError::Attach {
        hook: DEV_QUEUE,
        reason,
    })?;
    log::debug!("net_dev_queue attached as a raw tracepoint");
    warnings.push(format!(
        "{btf_refused}; the raw tracepoint program runs instead, at a higher cost per packet"
    ));
    Ok(())
}

/// Loads and attaches `net_dev_queue` as a BTF tracepoint (the kernel's own BTF names
/// its argument types); on failure, a sentence saying why.
fn attach_btf_tracepoint(ebpf: &mut Ebpf) -> Result<(), String> {
    let btf = aya::Btf::from_sys_fs().map_err(|err| {
        format!(
            "the kernel's own BTF, which the BTF tracepoint program needs, is not readable at /sys/kernel/btf/vmlinux ({})",
            error_chain(&err)
        )
    })?;
    let refused = |err: &dyn std::error::Error| {
        format!(
            "the kernel refused the BTF tracepoint program ({})",
            error_chain(err)
        )
    };
    let program: &mut BtfTracePoint = ebpf
        .program_mut("net_dev_queue")
        .ok_or_else(|| "the BTF tracepoint program is missing from the object".to_owned())?
        .try_into()
        .map_err(|err| refused(&err))?;
    program.load(DEV_QUEUE, &btf).map_err(|err| refused(&err))?;
    program.attach().map_err(|err| refused(&err))?;
    Ok(())
}

/// Maps the revalidation program's `CHECKED` array, as large as the connection table.
fn map_checked(ebpf: &mut Ebpf, max_connections: u32) -> Result<MappedArray, CaptureError> {
    match take_map(ebpf, "CHECKED")? {
        aya::maps::Map::Array(data) => MappedArray::new(data, max_connections as usize),
        _ => Err(std::io::Error::other("it is not an array")),
    }
    .map_err(|err| CaptureError::Load(format!("cannot map the array CHECKED: {err}")))
}

/// The program that finds connections whose conntrack entry is gone.
const REVALIDATE: &str = "revalidate";

/// What observer logs (debug) once the revalidation program loaded: one more program
/// than it attaches (`cargo xtask kernels` counts them).
pub const REVALIDATION_LOADED: &str = "the revalidation program loaded (run, not attached)";

/// Loads the revalidation program (run, never attached); on failure, a sentence saying
/// why.
fn load_revalidate(ebpf: &mut Ebpf) -> Result<(), String> {
    let program: &mut RawTracePoint = ebpf
        .program_mut(REVALIDATE)
        .ok_or_else(|| "the program is missing from the object".to_owned())?
        .try_into()
        .map_err(|err| error_chain(&err))?;
    program.load().map_err(|err| error_chain(&err))
}

/// Loads and attaches the program on `skb:kfree_skb` (see observer-ebpf's
/// `hooks/netfilter_drop.rs`); on failure, a sentence saying why.
fn attach_netfilter_drop(ebpf: &mut Ebpf) -> Result<(), String> {
    let btf = aya::Btf::from_sys_fs().map_err(|err| {
        format!(
            "the kernel's own BTF is not readable at /sys/kernel/btf/vmlinux ({})",
            error_chain(&err)
        )
    })?;
    let refused = |err: &dyn std::error::Error| {
        format!(
            "the kernel refused the program on tracepoint skb:kfree_skb ({})",
            error_chain(err)
        )
    };
    let program: &mut BtfTracePoint = ebpf
        .program_mut("netfilter_drop")
        .ok_or_else(|| "the skb:kfree_skb program is missing from the object".to_owned())?
        .try_into()
        .map_err(|err| refused(&err))?;
    program
        .load("kfree_skb", &btf)
        .map_err(|err| refused(&err))?;
    program.attach().map_err(|err| refused(&err))?;
    log::debug!("skb:kfree_skb attached");
    Ok(())
}

/// Attaches `program` to the cgroup v2 root `root`: `local_delivery` to ingress (every
/// packet delivered to a local socket), `dns_egress` to egress (every packet a local
/// socket sends).
fn attach_cgroup(
    ebpf: &mut Ebpf,
    root: &std::path::Path,
    program: &str,
    attach_type: CgroupSkbAttachType,
    hook: &'static str,
) -> Result<(), CaptureError> {
    let mut attach = || -> Result<(), String> {
        let cgroup = std::fs::File::open(root)
            .map_err(|err| format!("cannot open {}: {err}", root.display()))?;
        let program: &mut CgroupSkb = ebpf
            .program_mut(program)
            .ok_or("program missing from the object")?
            .try_into()
            .map_err(|err| error_chain(&err))?;
        program.load().map_err(|err| error_chain(&err))?;
        // A BPF link (kernel 5.7+) takes no flags and never displaces programs others
        // attached to the same cgroup.
        program
            .attach(cgroup, attach_type, CgroupAttachMode::Single)
            .map_err(|err| error_chain(&err))?;
        Ok(())
    };
    attach().map_err(|reason| CaptureError::Attach { hook, reason })
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, CaptureError> {
    ebpf.take_map(name)
        .ok_or_else(|| CaptureError::Load(format!("map {name} missing from the object")))
}

/// Takes the ring buffer `name` and registers it with tokio, to wait for it to become
/// readable.
fn poll_ring_buffer(
    ebpf: &mut Ebpf,
    name: &str,
) -> Result<tokio::io::unix::AsyncFd<RingBuf<MapData>>, CaptureError> {
    let events = RingBuf::try_from(take_map(ebpf, name)?)
        .map_err(|err| CaptureError::Load(error_chain(&err)))?;
    // SAFETY: the ring buffer owns its descriptor and moves into the AsyncFd, which
    // deregisters it before dropping it, so the descriptor outlives the registration.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(events, tokio::io::Interest::READABLE)
    }
    .map_err(|err| {
        CaptureError::Load(format!(
            "cannot poll the ring buffer {name}: {}",
            err.into_parts().1
        ))
    })
}

/// Fails unless the kernel is new enough and the process may load and attach the
/// programs; checked before anything else so that a run that cannot work changes nothing.
pub fn check_host() -> Result<(), CaptureError> {
    if let Some(sentence) = kernel_release().as_deref().and_then(too_old) {
        return Err(CaptureError::KernelTooOld(sentence));
    }
    match Caps::effective().missing_for_capture() {
        Some(missing) => Err(CaptureError::NotPrivileged { missing }),
        None => Ok(()),
    }
}

impl Capture {
    /// Checks privileges and BTF, then loads and attaches every program.
    pub fn start(options: &CaptureOptions) -> Result<Capture, CaptureError> {
        check_host()?;
        raise_memlock();
        let layout = read_layout(&options.btf_path)?;
        let mut ebpf = load(options, &layout)?;
        let mut warnings = Vec::new();
        attach_dev_queue(&mut ebpf, &mut warnings)?;
        let mut hooks_attached = 1;
        match attach_netfilter_drop(&mut ebpf) {
            Ok(()) => hooks_attached += 1,
            Err(reason) => warnings.push(format!(
                "{reason}; connections rejected because a Service has no endpoints are not seen"
            )),
        }
        match cgroup2_mount() {
            Some(root) => {
                attach_cgroup(
                    &mut ebpf,
                    &root,
                    "local_delivery",
                    CgroupSkbAttachType::Ingress,
                    "cgroup_skb/ingress",
                )?;
                attach_cgroup(
                    &mut ebpf,
                    &root,
                    "dns_egress",
                    CgroupSkbAttachType::Egress,
                    "cgroup_skb/egress",
                )?;
                hooks_attached += 2;
            }
            None => warnings.push(
                "no cgroup v2 hierarchy is mounted: replies to clients on the node itself (host network) are not counted, and DNS over TCP is not decoded"
                    .to_owned(),
            ),
        }
        let revalidation_refused = load_revalidate(&mut ebpf).err();
        match &revalidation_refused {
            Some(reason) => log::debug!(
                "the kernel refused the revalidation program ({reason}): conntrack's destroy events say when entries go"
            ),
            None => log::debug!("{REVALIDATION_LOADED}"),
        }
        let load_error = |err: aya::maps::MapError| CaptureError::Load(error_chain(&err));
        let events = poll_ring_buffer(&mut ebpf, "EVENTS")?;
        let dns_events = poll_ring_buffer(&mut ebpf, "DNS_EVENTS")?;
        let rejects =
            RingBuf::try_from(take_map(&mut ebpf, "REJECT_EVENTS")?).map_err(load_error)?;
        let rejected = HashMap::try_from(take_map(&mut ebpf, "REJECTED")?).map_err(load_error)?;
        let conns = take_map(&mut ebpf, "CONNS")?;
        let conns_fd = match &conns {
            aya::maps::Map::HashMap(data) => data.fd().as_fd().try_clone_to_owned(),
            _ => Err(std::io::Error::other("CONNS is not a hash map")),
        }
        .map_err(|err| CaptureError::Load(format!("cannot read map CONNS: {err}")))?;
        Ok(Capture {
            events,
            dns_events,
            rejects,
            rejected,
            conns: HashMap::try_from(conns).map_err(load_error)?,
            conns_fd,
            dialed: HashMap::try_from(take_map(&mut ebpf, "DIALED")?).map_err(load_error)?,
            counters: PerCpuArray::try_from(take_map(&mut ebpf, "COUNTERS")?)
                .map_err(load_error)?,
            lost_by_netns: HashMap::try_from(take_map(&mut ebpf, "LOST_BY_NETNS")?)
                .map_err(load_error)?,
            dns_dropped_by_netns: HashMap::try_from(take_map(&mut ebpf, "DNS_DROPPED_BY_NETNS")?)
                .map_err(load_error)?,
            checked: map_checked(&mut ebpf, options.max_connections)?,
            ebpf: Some(ebpf),
            hooks_attached,
            revalidation_refused,
            warnings,
        })
    }

    /// Why the kernel refused the revalidation program (before Linux 5.17), if it did:
    /// then only conntrack's destroy events can say when entries go.
    pub fn revalidation_refused(&self) -> Option<&str> {
        self.revalidation_refused.as_deref()
    }

    /// Runs the revalidation program (observer-ebpf's `hooks/revalidate.rs`) once over
    /// `conntracks` (`nf_conn` addresses of tracked connections): those whose conntrack
    /// entry is gone. Nothing once detached, or where the program could not load.
    pub fn gone_connections(&mut self, conntracks: &[u64]) -> Result<Vec<u64>, String> {
        let Some(ebpf) = self.ebpf.as_ref() else {
            return Ok(Vec::new());
        };
        if self.revalidation_refused.is_some() || conntracks.is_empty() {
            return Ok(Vec::new());
        }
        let listed = conntracks.len().min(self.checked.len());
        for (index, conntrack) in conntracks[..listed].iter().enumerate() {
            self.checked.set(index, *conntrack);
        }
        let program: &RawTracePoint = ebpf
            .program(REVALIDATE)
            .ok_or("the revalidation program is missing")?
            .try_into()
            .map_err(|err| error_chain(&err))?;
        let mut options = RawTracePointRunOptions::new();
        options.args[0] = listed as u64;
        program
            .test_run(options)
            .map_err(|err| format!("cannot run the revalidation program: {}", error_chain(&err)))?;
        Ok((0..listed)
            .map(|index| self.checked.get(index))
            .filter(|slot| slot & GONE_MARK != 0)
            .map(|slot| slot & !GONE_MARK)
            .collect())
    }

    pub fn hooks_attached(&self) -> u32 {
        if self.ebpf.is_some() {
            self.hooks_attached
        } else {
            0
        }
    }

    /// Detaches every program; maps stay readable so the last events can be drained.
    pub fn detach(&mut self) {
        self.ebpf = None;
    }

    /// Waits until the connection events' or the DNS messages' ring buffer wakes user
    /// space (the programs do so only once a lot is waiting).
    pub async fn wait_for_events(&mut self) -> std::io::Result<()> {
        let mut guard = tokio::select! {
            guard = self.events.readable_mut() => guard?,
            guard = self.dns_events.readable_mut() => guard?,
        };
        guard.clear_ready();
        Ok(())
    }

    /// Moves every pending connection event into `out`; malformed ones are counted.
    pub fn drain_events(&mut self, out: &mut Vec<ConnEvent>) -> u64 {
        drain(self.events.get_mut(), out, usize::MAX)
    }

    /// Moves pending DNS message prefixes into `out`, at most `max` of them (so that a
    /// flood of DNS messages that arrive as fast as they are read cannot keep the
    /// caller from the connection events); malformed ones are counted.
    pub fn drain_dns(&mut self, out: &mut Vec<DnsEvent>, max: usize) -> u64 {
        drain(self.dns_events.get_mut(), out, max)
    }

    /// Moves every pending rejected-flow report into `out`; malformed ones are counted.
    pub fn drain_rejects(&mut self, out: &mut Vec<RejectEvent>) -> u64 {
        drain(&mut self.rejects, out, usize::MAX)
    }

    /// What the kernel counted of a rejected flow, if it still has it.
    pub fn rejected(&self, key: &RejectKey) -> Option<RejectCount> {
        self.rejected.get(key, 0).ok()
    }

    /// Forgets a rejected flow that user space has written.
    pub fn forget_rejected(&mut self, key: &RejectKey) {
        let _ = self.rejected.remove(key);
    }

    /// The kernel's connection table as it is now: read in batches, or entry by entry
    /// where the kernel cannot batch.
    pub fn connections(&self) -> Vec<(u64, ConnState)> {
        match crate::kernel::batch::lookup_all(self.conns_fd.as_fd()) {
            Ok(entries) => entries,
            Err(_) => self.conns.iter().filter_map(Result::ok).collect(),
        }
    }

    /// One connection of the kernel's table, if it is there.
    pub fn connection(&self, conntrack: u64) -> Option<ConnState> {
        self.conns.get(&conntrack, 0).ok()
    }

    /// Removes a connection from the kernel tables; false when the kernel removed it
    /// first (then its close event is on the way) or its key now holds a newer
    /// connection (the kernel reused the `nf_conn` since `state` was read).
    pub fn remove(&mut self, conntrack: u64, state: &ConnState) -> bool {
        if self
            .conns
            .get(&conntrack, 0)
            .map_or(true, |current| current.start_ns != state.start_ns)
        {
            return false;
        }
        let key = DialedKey::of(&state.original);
        if self
            .dialed
            .get(&key, 0)
            .is_ok_and(|owner| owner == conntrack)
        {
            let _ = self.dialed.remove(&key);
        }
        self.conns.remove(&conntrack).is_ok()
    }

    /// Lost connections per network namespace inode (the kernel's part of
    /// `Counters::lost_table_full + lost_unreported`).
    pub fn lost_by_netns(&self) -> std::collections::BTreeMap<u32, u64> {
        self.lost_by_netns.iter().filter_map(Result::ok).collect()
    }

    /// DNS messages the kernel did not copy, per network namespace inode.
    pub fn dns_dropped_by_netns(&self) -> std::collections::BTreeMap<u32, u64> {
        self.dns_dropped_by_netns
            .iter()
            .filter_map(Result::ok)
            .collect()
    }

    /// Connections ever entered in the kernel's table (`counters::TRACKED`): the table
    /// gains an entry only with this count.
    pub fn tracked(&self) -> u64 {
        self.counters
            .get(&counters::TRACKED, 0)
            .map(|values| values.iter().sum())
            .unwrap_or(0)
    }

    /// The programs' counters, summed over CPUs.
    pub fn counters(&self) -> Counters {
        let sum = |index: u32| -> u64 {
            self.counters
                .get(&index, 0)
                .map(|values| values.iter().sum())
                .unwrap_or(0)
        };
        Counters {
            tracked: sum(counters::TRACKED),
            events_dropped: sum(counters::EVENTS_DROPPED),
            read_errors: sum(counters::READ_ERRORS),
            lost_table_full: sum(counters::LOST_TABLE_FULL),
            lost_unreported: sum(counters::LOST_UNREPORTED),
            dns_emitted: sum(counters::DNS_EMITTED),
            dns_dropped: sum(counters::DNS_DROPPED),
            rejects_dropped: sum(counters::REJECTS_DROPPED),
        }
    }
}

/// Moves up to `max` pending records of `ring` into `out`; returns how many of them were
/// malformed (not a `T`).
fn drain<T: decode::KernelRecord>(
    ring: &mut RingBuf<MapData>,
    out: &mut Vec<T>,
    max: usize,
) -> u64 {
    let mut malformed = 0;
    let mut taken = 0;
    while taken < max
        && let Some(item) = ring.next()
    {
        taken += 1;
        if decode::push_record(&item, out).is_err() {
            malformed += 1;
        }
    }
    malformed
}

/// An error and its sources on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
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
