//! Maps shared with user space, and the offsets global it fills in before load.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use observer_common::{
    conn::{ConnState, DialedKey, SETTING_OPENS_FROM_TABLE},
    counters,
    offsets::KernelOffsets,
    reject::{RejectCount, RejectKey},
};

/// Kernel structure offsets read from BTF by user space (`EbpfLoader::set_global`).
/// All zero (and `valid == 0`) until then, in which case the programs do nothing.
// SAFETY: `OFFSETS` is a unique symbol in this object; user space finds it by this name.
#[unsafe(no_mangle)]
pub static OFFSETS: KernelOffsets = KernelOffsets {
    skb_nfct: 0,
    skb_head: 0,
    skb_data: 0,
    skb_len: 0,
    skb_dev: 0,
    skb_network_header: 0,
    skb_sk: 0,
    ct_tuple_original: 0,
    ct_tuple_reply: 0,
    ct_status: 0,
    ct_net: 0,
    ct_tcp_state: 0,
    ct_use: 0,
    net_ns_inum: 0,
    tuple_src_addr: 0,
    tuple_src_port: 0,
    tuple_src_l3num: 0,
    tuple_dst_addr: 0,
    tuple_dst_port: 0,
    tuple_dst_protonum: 0,
    ct_btf_id: 0,
    iphdr_btf_id: 0,
    ipv6hdr_btf_id: 0,
    tcphdr_btf_id: 0,
    valid: 0,
};

/// One field of the offsets as user space set them: `offset!(skb_nfct)`. A volatile
/// read keeps the compiler from folding the all-zero initializer into the code; reading
/// field by field copies only what a packet needs.
macro_rules! offset {
    ($field:ident) => {
        // SAFETY: `OFFSETS` is a plain static of POD data; the read is aligned and valid.
        unsafe { core::ptr::read_volatile(&raw const crate::maps::OFFSETS.$field) }
    };
}

pub(crate) use offset;

/// A filter in front of `DIALED` for the local-delivery hook: byte `dialed_slot(...)`
/// is set before any connection with that dialed address, port and protocol whose
/// replies that hook handles (`conn::remember_dialed`) enters `DIALED`, and never
/// cleared. A delivered packet whose source has a clear byte is no such reply, which
/// the hook learns without a map lookup.
// SAFETY: a unique symbol; a global (.bss) both programs address directly.
#[unsafe(no_mangle)]
static mut DIALED_SEEN: [u8; DIALED_SLOTS] = [0; DIALED_SLOTS];

const DIALED_SLOTS: usize = 1 << 16;

/// The first level of the filter: byte `slot >> 4` is set with any of its 16
/// `DIALED_SEEN` slots. One page, whose 64 cache lines stay hot: on a node with few
/// dialed addresses most delivered packets stop here. A random byte of the 64 KiB array
/// costs a delivered packet cache and TLB misses, about twice a random byte of one page
/// (docs/perf-log.md, 2026-12-02, evening).
// SAFETY: a unique symbol; a global (.bss) both programs address directly.
#[unsafe(no_mangle)]
static mut DIALED_SUMMARY: PageOfBytes = PageOfBytes([0; SUMMARY_SLOTS]);

const SUMMARY_SLOTS: usize = 4096;
const SUMMARY_SHIFT: u32 = (DIALED_SLOTS / SUMMARY_SLOTS).trailing_zeros();

/// Page-aligned, so the summary spans one page.
#[repr(C, align(4096))]
struct PageOfBytes([u8; SUMMARY_SLOTS]);

/// The `DIALED_SEEN` slot of a dialed address (folded to one word by `fold_address`),
/// port (host order) and protocol.
#[inline(always)]
pub fn dialed_slot(folded_address: u32, port: u16, protocol: u8) -> usize {
    let folded = folded_address ^ ((port as u32) << 8) ^ protocol as u32;
    // Fibonacci hashing: the high bits of the product mix every input bit.
    (folded.wrapping_mul(0x9E37_79B1) >> 16) as usize & (DIALED_SLOTS - 1)
}

/// An address (IPv4: first 4 bytes, the rest zero) folded to one word for
/// `dialed_slot`: the XOR of its four native-order words, so an IPv4 address folds to
/// its own word.
#[inline(always)]
pub fn fold_address(addr: &[u8; 16]) -> u32 {
    let word = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
    word(0) ^ word(4) ^ word(8) ^ word(12)
}

/// Marks a dialed address in `DIALED_SUMMARY` and `DIALED_SEEN` (idempotent: plain
/// byte stores).
#[inline(always)]
pub fn mark_dialed(slot: usize) {
    let slot = slot & (DIALED_SLOTS - 1);
    // SAFETY: both indices are masked into their arrays; a byte store needs no
    // atomicity.
    unsafe {
        core::ptr::write_volatile(&raw mut DIALED_SEEN[slot], 1);
        core::ptr::write_volatile(&raw mut DIALED_SUMMARY.0[slot >> SUMMARY_SHIFT], 1);
    }
}

/// Whether a dialed address may be in `DIALED` (`mark_dialed` ran for its slot).
#[inline(always)]
pub fn maybe_dialed(slot: usize) -> bool {
    let slot = slot & (DIALED_SLOTS - 1);
    // SAFETY: as in `mark_dialed`.
    unsafe {
        core::ptr::read_volatile(&raw const DIALED_SUMMARY.0[slot >> SUMMARY_SHIFT]) != 0
            && core::ptr::read_volatile(&raw const DIALED_SEEN[slot]) != 0
    }
}

/// Tracked DNATed connections, keyed by the `struct nf_conn` address (on the netfilter
/// hooks, those that do not fit `table::NEAR_CONNS`). User space sizes it
/// (`--max-connections`) and removes entries that idle out.
#[map]
pub static CONNS: HashMap<u64, ConnState> = HashMap::with_max_entries(65536, 0);

/// The revalidation program's work (`hooks/revalidate.rs`): user space writes the
/// `nf_conn` addresses of the connections it tracks into the first slots, through a
/// memory mapping (no system call per address), and the program marks those whose
/// conntrack entry is gone (`GONE_MARK`). As large as both levels of the table together.
#[map]
pub static CHECKED: Array<u64> = Array::with_max_entries(65536, BPF_F_MMAPABLE);

/// What user space asks of the programs while they run; index `conn::SETTING_OPENS_FROM_TABLE`:
/// 1 once user space learns of new connections from its reads of `CONNS` (it revalidates
/// them, so no conntrack destroy event needs one known first). Then a connection whose
/// first packet was seen gets no open event (its close event carries all of it), and
/// only connections the socket-side hooks look up get a `DIALED` entry
/// (`conn::dialed_wanted`). Until then, on kernels that follow conntrack's destroy
/// events and where the forwarding program runs on `net_dev_queue`, every open has both.
#[map]
static SETTINGS: Array<u32> = Array::with_max_entries(1, 0);

/// Whether user space learns of new connections from the table (see `SETTINGS`).
#[inline(always)]
pub fn opens_from_table() -> bool {
    SETTINGS
        .get(SETTING_OPENS_FROM_TABLE)
        .is_some_and(|from_table| *from_table != 0)
}

/// `BPF_F_MMAPABLE` (include/uapi/linux/bpf.h): an array user space can `mmap`.
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Tracked connections by client and dialed address (value: the `nf_conn` address),
/// for the local-delivery hook. Same size as `CONNS`.
#[map]
pub static DIALED: HashMap<DialedKey, u64> = HashMap::with_max_entries(65536, 0);

/// Connections lost because `CONNS` was full, by `nf_conn` address, with the identity
/// of the connection (`conn::lost_identity`): every packet of a connection that does
/// not fit finds the table full, but the connection is counted lost once.
#[map]
static LOST: LruHashMap<u64, u64> = LruHashMap::with_max_entries(16384, 0);

/// Set, and never cleared, before the first `LOST` entry is written: until the table
/// has once been full, no packet pays a `LOST` lookup.
// SAFETY: a unique symbol; a global (.bss) the programs address directly.
#[unsafe(no_mangle)]
static mut LOST_ANY: u8 = 0;

/// Remembers that the connection at `conntrack` (identity `identity`) was lost.
#[inline(always)]
pub fn remember_lost(conntrack: u64, identity: u64) {
    // SAFETY: a byte store to a global; racing stores all write 1.
    unsafe { core::ptr::write_volatile(&raw mut LOST_ANY, 1) };
    let _ = LOST.insert(&conntrack, &identity, 0);
}

/// The identity of the lost connection remembered at `conntrack`, if any.
#[inline(always)]
pub fn lost_at(conntrack: u64) -> Option<u64> {
    if !lost_any() {
        return None;
    }
    // SAFETY: a live map value.
    LOST.get_ptr(&conntrack).map(|known| unsafe { *known })
}

/// Forgets the lost connection remembered at `conntrack`, if any.
#[inline(always)]
pub fn forget_lost(conntrack: u64) {
    if lost_any() {
        let _ = LOST.remove(&conntrack);
    }
}

#[inline(always)]
fn lost_any() -> bool {
    // SAFETY: a byte load from a global.
    unsafe { core::ptr::read_volatile(&raw const LOST_ANY) != 0 }
}

/// Lost connections (both kinds) per network namespace inode: which node lost them.
#[map]
pub static LOST_BY_NETNS: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// DNS messages not copied (`counters::DNS_DROPPED`) per network namespace inode: which
/// node's DNS went unread.
#[map]
pub static DNS_DROPPED_BY_NETNS: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// Connections' open and close events for user space, and nothing else: DNS copies
/// and rejected-flow reports have rings of their own, so that a flood of either cannot
/// cost one connection event.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES as u32, 0);

/// `EVENTS`' default size; user space may change it (`--ring-buffer-bytes`).
const EVENTS_BYTES: u64 = 4 * 1024 * 1024;

/// User space is woken early (before its next timed drain) once this much of `EVENTS`
/// is waiting: an eighth of the default ring, so a busy node does not cost a wake-up
/// per event.
pub const EVENTS_WAKEUP_BYTES: u64 = EVENTS_BYTES / 8;

/// DNS message prefixes (`dns::capture`, `dns::capture_segment`) for user space: a ring
/// of their own, so that a pod flooding port 53 fills only this one. Each message takes
/// 344 bytes (a `DnsEvent` and the record header): 6,096 messages, about 120 ms of a
/// 50,000-message/s flood while user space is busy elsewhere. A message that finds it
/// full is counted (`counters::DNS_DROPPED`), never waited for.
#[map]
pub static DNS_EVENTS: RingBuf = RingBuf::with_byte_size(DNS_EVENTS_BYTES as u32, 0);

/// `DNS_EVENTS`' default size; user space may change it (`--dns-ring-buffer-bytes`).
const DNS_EVENTS_BYTES: u64 = 2 * 1024 * 1024;

/// As `EVENTS_WAKEUP_BYTES`, for `DNS_EVENTS`.
pub const DNS_EVENTS_WAKEUP_BYTES: u64 = DNS_EVENTS_BYTES / 8;

/// `bpf_ringbuf_submit` flags and `bpf_ringbuf_query` selector.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// The flags to submit a record to `ring` with: user space drains the rings every few
/// milliseconds anyway, and is woken early only once `wakeup_bytes` are waiting.
#[inline(always)]
pub fn submit_flags(ring: &RingBuf, wakeup_bytes: u64) -> u64 {
    if ring.query(BPF_RB_AVAIL_DATA) >= wakeup_bytes {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// New connections netfilter dropped before any DNAT, one entry per client flow (see
/// `hooks/netfilter_drop.rs`); user space reads the counts and removes finished flows.
/// LRU: a flood of new flows evicts the oldest instead of filling it for good.
#[map]
pub static REJECTED: LruHashMap<RejectKey, RejectCount> = LruHashMap::with_max_entries(65536, 0);

/// Reports of rejected flows: a ring buffer of their own, so that a flood of rejected
/// connections cannot cost one connection event.
#[map]
pub static REJECT_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// `observer_common::counters` indices.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counters::COUNT, 0);

/// One `ConnState` per CPU to build a new entry in: too large for the 512-byte stack
/// together with everything else.
#[map]
pub static SCRATCH: PerCpuArray<ConnState> = PerCpuArray::with_max_entries(1, 0);

/// Counts a lost connection of namespace `netns` in `counter` and in `LOST_BY_NETNS`.
#[inline(always)]
pub fn count_lost(counter: u32, netns: u32) {
    count(counter);
    count_in(&LOST_BY_NETNS, netns);
}

/// Counts a DNS message of namespace `netns` that was not copied.
#[inline(always)]
pub fn count_dns_dropped(netns: u32) {
    count(counters::DNS_DROPPED);
    count_in(&DNS_DROPPED_BY_NETNS, netns);
}

/// Adds one to `map[netns]`.
#[inline(always)]
fn count_in(map: &HashMap<u32, u64>, netns: u32) {
    // Whichever CPU creates the slot, every CPU then adds to it.
    let _ = map.insert(&netns, &0, BPF_NOEXIST);
    if let Some(slot) = map.get_ptr_mut(&netns) {
        atomic_add(slot, 1);
    }
}

/// `bpf_map_update_elem` flag: fail if the key exists.
pub const BPF_NOEXIST: u64 = 1;

/// Adds to a u64 shared between CPUs. `core::sync::atomic` has no read-modify-write on
/// the BPF target, hence the intrinsic; its result unused, it compiles to BPF_XADD
/// (kernel 5.10 has it; fetching adds need 5.12).
#[inline(always)]
pub fn atomic_add(target: *mut u64, value: u64) {
    // SAFETY: `target` is an aligned u64 in a map value or scratch slot, written only by
    // atomic adds.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(target, value);
    }
}

/// Adds one to a per-CPU counter (once per connection, DNS message or failure, never
/// per packet). The add is atomic: only this CPU writes its slot, but not only one
/// program at a time. The `cgroup_skb` egress program runs in the sending task's
/// context with softirqs enabled and only migration disabled, so the softirq that
/// forwards or delivers packets can run the other hooks on this CPU in the middle of it
/// (and on a preemptible kernel another task's egress can); a plain read-modify-write
/// would then lose one of the two counts.
#[inline(always)]
pub fn count(index: u32) {
    if let Some(counter) = COUNTERS.get_ptr_mut(index) {
        atomic_add(counter, 1);
    }
}
