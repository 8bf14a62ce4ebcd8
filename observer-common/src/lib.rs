//! Types shared by the kernel programs (`observer-ebpf`) and user space (`observer`).
//!
//! Every type that crosses the kernel/user boundary is `#[repr(C)]` with explicit
//! padding, holds no `bool` and no Rust enum, and has its size asserted at compile
//! time so that both sides agree byte for byte. User space decodes ring-buffer
//! records with a length check and `read_unaligned` (see `observer::decode`).
#![no_std]

pub mod accounting;
pub mod conn;
pub mod counters;
pub mod dns;
pub mod kfunc;
pub mod offsets;
pub mod reject;
