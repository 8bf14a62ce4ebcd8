//! observer's kernel programs. They run on hooks this kernel allows without kprobes or
//! fentry (tracepoints), read conntrack's own decision from each packet's `skb->_nfct`,
//! and keep one entry per DNATed connection.
//!
//! Layout: `maps.rs` (maps, counters, the offsets global), `clock.rs` (a packet's time),
//! `kernel.rs` (reads of kernel memory), `skb.rs` (`sk_buff` fields, by BTF load or
//! helper), `kfunc.rs` (kernel functions), `packet.rs` (header parsing), `state.rs`
//! (field access to a connection's shared state), `table.rs` (where connections are
//! kept), `conn.rs` (per-connection accounting),
//! `dns.rs` (port-53 payload prefixes), `hooks/` (one file per hook family).
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
mod kfunc;
mod maps;
mod packet;
mod skb;
mod state;
mod table;

/// The license the kernel is told (the object's `license` section): the programs call a
/// GPL-only helper (`bpf_probe_read_kernel`), which the kernel allows only to
/// GPL-compatible programs. The kernel programs are dual licensed MIT or GPL-2.0
/// (observer-ebpf's Cargo.toml); the rest of observer is MIT or Apache-2.0.
// SAFETY: a unique symbol; the loader reads the section by its name.
#[unsafe(no_mangle)]
#[unsafe(link_section = "license")]
pub static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// A loop the verifier refuses (it rejects an infinite loop), so a panic that the
/// verifier cannot prove unreachable makes the object fail to load. With
/// `unreachable_unchecked` here, LLVM could assume no panic is ever reached and delete
/// the branches that lead to one (bounds checks included) before the verifier saw them.
#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    #[allow(clippy::empty_loop)]
    loop {}
}
