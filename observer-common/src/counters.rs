//! Per-CPU counters the kernel programs keep (a `PerCpuArray<u64>` named `COUNTERS`).
//! Each is touched once per connection or per failure, never per packet (the DNS
//! counters: once per port-53 message).

/// Connections entered in the connection table (each yields exactly one record, or is
/// counted in `LOST_CONNECTIONS`).
pub const TRACKED: u32 = 0;
/// Connection events not written because their ring buffer (`EVENTS`) was full. No record is
/// missing because of them: the connection stays in the table, whose entry user space
/// turns into the record (an open event is only an early notice).
pub const EVENTS_DROPPED: u32 = 1;
/// Kernel memory reads (`bpf_probe_read_kernel`) that failed.
pub const READ_ERRORS: u32 = 2;
/// DNAT decisions that will have no record because the connection table was full at
/// the connection's first packet (counted once per connection; never in `TRACKED`).
pub const LOST_TABLE_FULL: u32 = 3;
/// Tracked connections that will have no record: they ended when they could neither
/// be reported (ring buffer full) nor kept (their key was needed for a new connection).
pub const LOST_UNREPORTED: u32 = 4;
/// DNS messages (port-53 payload prefixes; for TCP, segments) written to their ring buffer.
pub const DNS_EMITTED: u32 = 5;
/// DNS messages (TCP: segments) not written, i.e. lost: their ring buffer (`DNS_EVENTS`,
/// not the connection events') was full, the copy failed, or a UDP payload was not in
/// the packet's linear part (then there is nothing the forwarding hook can copy cheaply).
pub const DNS_DROPPED: u32 = 6;
/// Rejected-connection reports (`reject::RejectEvent`) not written: their ring buffer
/// was full. The flow's packets are still counted in its `REJECTED` entry.
pub const REJECTS_DROPPED: u32 = 7;
/// Number of counters.
pub const COUNT: u32 = 8;
