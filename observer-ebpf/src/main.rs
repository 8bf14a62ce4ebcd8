//! observer's kernel programs. They run on hooks this kernel allows without kprobes or
//! fentry (tracepoints), read conntrack's own decision from each packet's `skb->_nfct`,
//! and keep one entry per DNATed connection.
//!
//! Layout: `maps.rs` (maps, counters, the offsets global), `clock.rs` (a packet's time),
//! `kernel.rs` (reads of kernel memory), `skb.rs` (`sk_buff` fields, by BTF load or
//! helper), `packet.rs` (header parsing), `conn.rs` (per-connection accounting), `dns.rs`
//! (port-53 payload prefixes), `hooks/` (one file per hook family).
#![no_std]
#![no_main]
// Atomic adds (`conn::account`): core's atomic types lack them on the BPF target.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod clock;
mod conn;
mod dns;
mod hooks;
mod kernel;
mod maps;
mod packet;
mod skb;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // SAFETY: eBPF programs cannot unwind; the verifier rejects a program that could
    // reach this, it only exists because `no_std` binaries need a panic handler.
    unsafe { core::hint::unreachable_unchecked() }
}
