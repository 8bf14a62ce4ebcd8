//! Per-CPU counters the kernel programs keep (a `PerCpuArray<u64>` named `COUNTERS`).
//! Each is touched once per connection or per failure, never per packet.

/// Connections entered in the connection table (each yields exactly one record, or is
/// counted in `LOST_CONNECTIONS`).
pub const TRACKED: u32 = 0;
/// Ring-buffer records not written because the ring buffer was full. No record is
/// missing because of them: the connection stays in the table, whose entry user space
/// turns into the record (an open event is only an early notice).
pub const EVENTS_DROPPED: u32 = 1;
/// Kernel memory reads (`bpf_probe_read_kernel`) that failed.
pub const READ_ERRORS: u32 = 2;
/// DNAT decisions that will have no record: the connection table was full at the
/// connection's first packet (counted once per connection), or a connection ended
/// that could neither be reported nor kept for user space.
pub const LOST_CONNECTIONS: u32 = 3;
/// Number of counters.
pub const COUNT: u32 = 4;
