//! The kernel edge's runtime handle: starts capture (host checks, `load`, `attach`),
//! then reads the programs' maps and runs the revalidation program. Everything above
//! this works on plain data (`tracker`, `record`).

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _},
};
use observer_common::{
    conn::{ConnEvent, ConnState, DialedKey, GONE_MARK, SETTING_OPENS_FROM_TABLE},
    counters,
    dns::DnsEvent,
    reject::{RejectCount, RejectEvent, RejectKey},
};

use crate::kernel::attach::{self, AttachError, Forwarding, HookChoice, HookError, REVALIDATE};
use crate::kernel::conn_table::ConnTable;
use crate::kernel::host::{Caps, kernel_release, parse_release, raise_memlock, too_old};
use crate::kernel::load::{self, BtfFileError, KernelBtf, LoadError, error_chain};
use crate::kernel::node_links::NodeLinks;
use crate::kernel::{decode, mapped_array::MappedArray};

/// Why capture could not start. Each message is one sentence naming cause and fix.
/// (No variant has a `source`: the sentence already says it, once.)
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "loading kernel programs needs root: this process lacks {missing}; run observer with sudo"
    )]
    NotPrivileged { missing: String },
    #[error("{0}")]
    KernelTooOld(String),
    #[error("{0}")]
    Btf(BtfFileError),
    #[error("the kernel refused observer's programs: {0}")]
    Load(LoadError),
    #[error("{0}")]
    Attach(HookError),
}

/// Why the revalidation program could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the revalidation program is missing")]
    Missing,
    #[error("{}", error_chain(.0))]
    NotRawTracepoint(aya::programs::ProgramError),
    #[error("cannot run the revalidation program: {}", error_chain(.0))]
    Run(aya::programs::ProgramError),
}

/// Options for `Capture::start`.
#[derive(Clone, Debug)]
pub struct CaptureOptions {
    /// Size of the kernel's connection table (`CONNS`).
    pub max_connections: u32,
    /// Size of its first level on the netfilter hooks (`NEAR_CONNS`), at most
    /// `max_connections`.
    pub near_connections: u32,
    /// Where the kernel's BTF is (normally `/sys/kernel/btf/vmlinux`).
    pub btf_path: std::path::PathBuf,
    /// The connection events' ring buffer's size in bytes (a power of two, at least a
    /// page); `None` keeps the programs' default (4 MiB).
    pub ring_buffer_bytes: Option<u32>,
    /// The same for the DNS messages' ring buffer (default 2 MiB).
    pub dns_ring_buffer_bytes: Option<u32>,
    /// Where the forwarding program runs (`--hook`).
    pub hook: HookChoice,
    /// The network namespaces the netfilter program is linked in (`--node-netns`);
    /// empty: found (`node_links`).
    pub node_netns: Vec<std::path::PathBuf>,
}

/// Where the forwarding program ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardingHook {
    NetDevQueue,
    /// Linked at the netfilter hooks of this many namespaces.
    Netfilter {
        namespaces: usize,
    },
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
    /// `CONNS`, and `NEAR_CONNS` where the netfilter program runs.
    table: ConnTable,
    dialed: HashMap<MapData, DialedKey, u64>,
    counters: PerCpuArray<MapData, u64>,
    /// observer-ebpf's `SETTINGS`.
    settings: Array<MapData, u32>,
    lost_by_netns: HashMap<MapData, u32, u64>,
    dns_dropped_by_netns: HashMap<MapData, u32, u64>,
    hooks_attached: u32,
    /// The netfilter program and its links; `None` where the forwarding program runs
    /// on `net_dev_queue`.
    node_links: Option<NodeLinks>,
    /// The revalidation program's slots (see `gone_connections`).
    checked: MappedArray,
    /// Why the revalidation program could not load (then conntrack's destroy events
    /// must say when entries go); `None` when it loaded.
    revalidation_refused: Option<AttachError>,
    /// What works less well than it could on this machine, one sentence each.
    pub warnings: Vec<String>,
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
        let kernel = KernelBtf::read(&options.btf_path).map_err(CaptureError::Btf)?;
        let release = kernel_release().as_deref().and_then(parse_release);
        let sizes = load::Sizes {
            max_connections: options.max_connections,
            near_connections: if attach::netfilter_planned(options.hook, release) {
                options.near_connections.min(options.max_connections)
            } else {
                1
            },
            ring_buffer_bytes: options.ring_buffer_bytes,
            dns_ring_buffer_bytes: options.dns_ring_buffer_bytes,
        };
        let mut ebpf = load::load(&sizes, &kernel).map_err(CaptureError::Load)?;
        let attached = attach::attach_all(
            &mut ebpf,
            kernel.vmlinux.as_ref().map_err(String::as_str),
            (options.hook, load::object(), release),
        )
        .map_err(CaptureError::Attach)?;
        let mut capture = Capture::new(ebpf, &sizes, attached, options.node_netns.clone())
            .map_err(CaptureError::Load)?;
        if capture.node_links.is_some() {
            // Namespaces that do not exist yet are linked when they appear; but when
            // every one there is refused, nothing would ever be seen.
            let refusals = capture.link_new_namespaces();
            let linked = capture.node_links.as_ref().map_or(0, NodeLinks::namespaces);
            if linked == 0 && !refusals.is_empty() {
                return Err(CaptureError::Attach(HookError::NoNamespace(
                    refusals.join("; "),
                )));
            }
            capture.warnings.extend(refusals);
        }
        Ok(capture)
    }

    /// Links the netfilter program in node namespaces that appeared since the last call
    /// (none where it runs on `net_dev_queue`); one sentence per namespace that refused.
    pub fn link_new_namespaces(&mut self) -> Vec<String> {
        match (&mut self.node_links, &self.ebpf) {
            (Some(links), Some(_)) => links.link_new(),
            _ => Vec::new(),
        }
    }

    /// The node namespaces the netfilter program is linked in (none on `net_dev_queue`),
    /// as `ConnState::netns` names them.
    pub fn node_namespaces(&self) -> Vec<u32> {
        self.node_links.as_ref().map_or_else(Vec::new, |links| {
            links.inodes().map(|inode| inode as u32).collect()
        })
    }

    /// Where the forwarding program runs.
    pub fn forwarding_hook(&self) -> ForwardingHook {
        match &self.node_links {
            Some(links) => ForwardingHook::Netfilter {
                namespaces: links.namespaces(),
            },
            None => ForwardingHook::NetDevQueue,
        }
    }

    /// Takes the maps out of the attached object.
    fn new(
        mut ebpf: Ebpf,
        sizes: &load::Sizes,
        attached: attach::Attached,
        node_netns: Vec<std::path::PathBuf>,
    ) -> Result<Capture, LoadError> {
        let levels = matches!(attached.forwarding, Forwarding::Netfilter(_));
        Ok(Capture {
            table: ConnTable::take(
                &mut ebpf,
                (sizes.near_connections, sizes.max_connections),
                levels,
            )?,
            events: load::poll_ring_buffer(&mut ebpf, "EVENTS")?,
            dns_events: load::poll_ring_buffer(&mut ebpf, "DNS_EVENTS")?,
            rejects: load::take(&mut ebpf, "REJECT_EVENTS")?,
            rejected: load::take(&mut ebpf, "REJECTED")?,
            dialed: load::take(&mut ebpf, "DIALED")?,
            counters: load::take(&mut ebpf, "COUNTERS")?,
            settings: load::take(&mut ebpf, "SETTINGS")?,
            lost_by_netns: load::take(&mut ebpf, "LOST_BY_NETNS")?,
            dns_dropped_by_netns: load::take(&mut ebpf, "DNS_DROPPED_BY_NETNS")?,
            checked: load::mapped_array(&mut ebpf, "CHECKED", sizes.checked())?,
            ebpf: Some(ebpf),
            hooks_attached: attached.hooks,
            node_links: match attached.forwarding {
                Forwarding::Netfilter(program) => Some(NodeLinks::new(program, node_netns)),
                Forwarding::DevQueue => None,
            },
            revalidation_refused: attached.revalidation_refused,
            warnings: attached.warnings,
        })
    }

    /// Why the kernel refused the revalidation program (before Linux 5.17), if it did:
    /// then only conntrack's destroy events can say when entries go.
    pub fn revalidation_refused(&self) -> Option<&AttachError> {
        self.revalidation_refused.as_ref()
    }

    /// Runs the revalidation program (observer-ebpf's `hooks/revalidate.rs`) once over
    /// `conntracks` (`nf_conn` addresses of tracked connections): those whose conntrack
    /// entry is gone. Nothing once detached, or where the program could not load.
    pub fn gone_connections(&mut self, conntracks: &[u64]) -> Result<Vec<u64>, RunError> {
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
            .ok_or(RunError::Missing)?
            .try_into()
            .map_err(RunError::NotRawTracepoint)?;
        let mut options = RawTracePointRunOptions::new();
        options.args[0] = listed as u64;
        program.test_run(options).map_err(RunError::Run)?;
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
        if let Some(links) = &mut self.node_links {
            links.unlink();
        }
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
    pub fn connections(&mut self) -> Vec<(u64, ConnState)> {
        self.table.all()
    }

    /// Those of `keys` in the kernel's connection table now, one lookup each (cheaper
    /// than walking every bucket when the keys are few); `None` when a lookup failed
    /// for another reason than a missing key (then read the whole table).
    pub fn connections_of(&self, keys: &[u64]) -> Option<Vec<(u64, ConnState)>> {
        let mut out = Vec::with_capacity(keys.len());
        for &key in keys {
            if let Some(state) = self.table.get(key).ok()? {
                out.push((key, state));
            }
        }
        Some(out)
    }

    /// The hash buckets a whole read of the connection table walks.
    pub fn connection_buckets(&self) -> usize {
        self.table.buckets()
    }

    /// One connection of the kernel's table, if it is there.
    pub fn connection(&self, conntrack: u64) -> Option<ConnState> {
        self.table.get(conntrack).ok().flatten()
    }

    /// Removes a connection from the kernel tables; false when the kernel removed it
    /// first (then its close event is on the way) or its key now holds a newer
    /// connection (the kernel reused the `nf_conn` since `state` was read).
    pub fn remove(&mut self, conntrack: u64, state: &ConnState) -> bool {
        if !self.table.remove(conntrack, state.start_ns) {
            return false;
        }
        let key = DialedKey::of(&state.original);
        if state.dialed != 0
            && self
                .dialed
                .get(&key, 0)
                .is_ok_and(|owner| owner == conntrack)
        {
            let _ = self.dialed.remove(&key);
        }
        true
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

    /// From now on user space learns of new connections from its reads of the table (and
    /// revalidates them): the programs write no open event for a connection whose first
    /// packet they saw, only for those they adopt established.
    pub fn learn_opens_from_table(&mut self) -> Result<(), aya::maps::MapError> {
        self.settings.set(SETTING_OPENS_FROM_TABLE, 1, 0)
    }

    /// Connections ever entered in the kernel's table (`counters::TRACKED`): the table
    /// gains an entry only with this count.
    pub fn tracked(&self) -> Option<u64> {
        self.counters
            .get(&counters::TRACKED, 0)
            .ok()
            .map(|values| values.iter().sum())
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
