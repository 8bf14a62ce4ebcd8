//! `revalidate`: attached to no hook. User space runs it with `BPF_PROG_TEST_RUN` about
//! ten times a second to learn which tracked connections ended without a FIN or RST:
//! their conntrack entry was flushed (`conntrack -F`), deleted (`conntrack -D`), timed
//! out (once conntrack reaps it), or freed and its memory reused. That is what conntrack's destroy events would
//! say, without subscribing to them: while anyone listens to those, conntrack builds a
//! netlink message at the end of every connection of the node, Service or not
//! (docs/benchmarks.md prices it). Where this program cannot load (before Linux 5.17,
//! which added `bpf_loop`), user space subscribes to the events instead.
//!
//! It checks only the connections user space lists in `CHECKED` (their count is the
//! first argument), not the whole table: walking a hash map visits every bucket, and
//! `CONNS` has as many as conntrack's own table (262,144 by default), about 1.3 ms a
//! walk on the development VM however few connections there are.
//!
//! A raw tracepoint program, since Linux 5.10 can test-run those
//! (`bpf_prog_test_run_raw_tp`, whose context is an array of up to 12 `u64`). Helper
//! prototypes it relies on (include/uapi/linux/bpf.h):
//!
//! ```c
//! long bpf_loop(u32 nr_loops, void *callback_fn, void *callback_ctx, u64 flags);
//! long (*callback_fn)(u64 index, void *ctx);  /* 0: go on, 1: stop */
//! ```
//!
//! The `nf_conn` memory it reads stays an `nf_conn` after it is freed (conntrack's
//! slab is `SLAB_TYPESAFE_BY_RCU`), and every read is fault-safe.

use core::ffi::c_void;

use aya_ebpf::{helpers::bpf_loop, macros::raw_tracepoint, programs::RawTracePointContext};
use observer_common::{
    conn::{ConnState, FlowTuple, GONE_MARK},
    offsets::status,
};

use crate::{
    kernel::{ReadFailed, read, read_original},
    maps::{CHECKED, offset},
    state::{load, store},
    table::any_level,
};

#[raw_tracepoint]
pub fn revalidate(ctx: RawTracePointContext) -> i32 {
    if offset!(valid) == 0 {
        return 0;
    }
    // The first argument: how many slots of `CHECKED` user space filled.
    let listed: u64 = ctx.arg(0);
    // SAFETY: `check` has the callback's prototype and reads no context.
    unsafe {
        bpf_loop(
            listed as u32,
            check as *mut c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    0
}

/// Slot `index` of `CHECKED`: marks it when its connection's entry is gone. A
/// connection no longer in `CONNS` ended with a close event of its own.
#[inline(never)]
extern "C" fn check(index: u64, _context: *mut c_void) -> i64 {
    let Some(slot) = CHECKED.get_ptr_mut(index as u32) else {
        return 1;
    };
    // SAFETY: a live map value.
    let conntrack = unsafe { *slot };
    if conntrack == 0 || conntrack & GONE_MARK != 0 {
        return 0;
    }
    let Some(state) = any_level(conntrack) else {
        return 0;
    };
    // A failed read (counted) proves nothing: the connection stays.
    if matches!(gone(conntrack, state), Ok(true)) {
        // SAFETY: a live map value.
        unsafe { *slot = conntrack | GONE_MARK };
    }
    0
}

/// Whether the `nf_conn` at `conntrack` no longer holds the tracked connection: freed
/// (no references), dying (deleted: `conntrack -D`, a flush, or conntrack's garbage
/// collection of a timed-out entry, whose destroy event it would send then), or holding
/// another tuple (its memory was reused). An entry merely past its timeout is not gone
/// yet: conntrack reaps it lazily, and its destroy event would come then too. Ending it
/// earlier would race observer's own idle timeout, which conntrack's UDP timeout equals
/// by default (30 s), and turn a `timeout` into an `expired`.
#[inline(always)]
fn gone(conntrack: u64, state: *mut ConnState) -> Result<bool, ReadFailed> {
    let users: u32 = read(conntrack, offset!(ct_use))?;
    let flags: u64 = read(conntrack, offset!(ct_status))?;
    // A freed entry keeps its status bits until its memory is reused, so `CONFIRMED`
    // still says whether a connection first seen unconfirmed (`ConnState::unconfirmed`)
    // ever became one; an entry whose tuple changed (reused memory) says nothing.
    let mut current = FlowTuple::default();
    read_original(conntrack, &mut current)?;
    // SAFETY: a live map value; the tuples are written once, before insertion.
    let tracked = unsafe { &(*state).original };
    let same = current.src == tracked.src && current.dst == tracked.dst;
    if same && flags & (1 << status::CONFIRMED_BIT) != 0 && load!(state.unconfirmed) != 0 {
        store!(state.unconfirmed, 0);
    }
    if users == 0 || flags & (1 << status::DYING_BIT) != 0 {
        return Ok(true);
    }
    Ok(!same)
}
