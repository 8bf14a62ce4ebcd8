//! A packet's time. Reading the clock (`bpf_ktime_get_ns`) cost as much as the
//! connection's map lookup, a fifth of the forwarding hook's whole cost on a kept
//! connection's packets (docs/perf-log.md, 2026-12-02, late); reading jiffies
//! (`bpf_jiffies64`, which the verifier turns into one load) costs about nothing. So the clock is read where a time must be exact: a connection's
//! first packet, packets that close or report it, DNS packets. Other packets only move
//! `ConnState::last_ns`, which needs to be right to within a tick (idle timeouts of
//! seconds, the end of a connection that stopped without FIN or RST).
//! (`bpf_ktime_get_coarse_ns` would do, but the kernel refuses it in tracing programs.)

use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_ns};
use observer_common::conn::ConnState;

use crate::state::load;

/// The length of a jiffy in nanoseconds, as user space read it
/// (`clock_getres(CLOCK_MONOTONIC_COARSE)`) and wrote in before loading. Mutable, so
/// that it lives in `.data`: the compiler may merge an immutable global with any equal
/// constant of the object (a `&0u64` became this very address), and user space's value
/// would then replace that constant too.
// SAFETY: a unique symbol in this object; user space finds it by this name. Programs
// only read it.
#[unsafe(no_mangle)]
pub static mut TICK_NS: u64 = 4_000_000;

/// The exact time, and the jiffies it falls in.
#[inline(always)]
pub fn exact() -> (u64, u64) {
    // SAFETY: bpf_ktime_get_ns and bpf_jiffies64 have no preconditions.
    unsafe { (bpf_ktime_get_ns(), bpf_jiffies64()) }
}

/// The time of a packet of the tracked connection `state`, to within about a tick
/// either way: its start plus the jiffies since. Never before the start.
#[inline(always)]
pub fn estimated(state: *const ConnState) -> u64 {
    // SAFETY: a plain static no program writes; the volatile read keeps the compiler
    // from folding the initial value into the code.
    let tick = unsafe { core::ptr::read_volatile(&raw const TICK_NS) };
    // SAFETY: bpf_jiffies64 has no preconditions.
    let ticks = unsafe { bpf_jiffies64() }.saturating_sub(load!(state.start_jiffies));
    load!(state.start_ns) + ticks * tick
}
