//! Per-CPU counters the kernel programs keep (a `PerCpuArray<u64>` named `COUNTERS`).

/// Packets seen that belong to a DNATed conntrack entry.
pub const PACKETS: u32 = 0;
/// Events written to the ring buffer.
pub const EVENTS_EMITTED: u32 = 1;
/// Events lost because the ring buffer was full.
pub const RINGBUF_DROPS: u32 = 2;
/// Kernel memory reads (`bpf_probe_read_kernel`) that failed.
pub const READ_ERRORS: u32 = 3;
/// New connections not tracked because the connection table was full.
pub const TABLE_FULL: u32 = 4;
/// Number of counters.
pub const COUNT: u32 = 5;

/// Counter names, indexed like the constants above.
pub const NAMES: [&str; COUNT as usize] = [
    "packets",
    "events_emitted",
    "ringbuf_drops",
    "read_errors",
    "table_full",
];
