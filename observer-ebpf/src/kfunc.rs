//! Calls of kernel functions (see `observer_common::kfunc`): each is a call of a
//! placeholder helper number that user space rewrites before loading, so only programs
//! user space loads itself (the netfilter program) may reach one.

use aya_ebpf::bindings::bpf_dynptr;
use observer_common::kfunc::{DYNPTR_FROM_SKB, RDONLY_CAST};

/// `bpf_dynptr_from_skb(skb, 0, ptr)`: `ptr`, on the program's stack, covers the packet
/// from `skb->data` to its end, page fragments included. 0 on success.
///
/// # Safety
/// `skb` is the `struct sk_buff *` the kernel gave the program (a trusted BTF pointer,
/// not a number), and the call is rewritten into the kfunc call before loading.
#[inline(always)]
pub unsafe fn dynptr_from_skb(skb: *const u8, ptr: *mut bpf_dynptr) -> i64 {
    // SAFETY: a helper-number "function pointer", as aya-ebpf's helpers are made; the
    // loader turns the call into the kfunc's (see the module's doc).
    let call: unsafe extern "C" fn(*const u8, u64, *mut bpf_dynptr) -> i64 =
        unsafe { core::mem::transmute(DYNPTR_FROM_SKB as usize) };
    // SAFETY: as the caller promises.
    unsafe { call(skb, 0, ptr) }
}

/// `bpf_rdonly_cast(obj, btf_id)`: `obj` as a read-only, untrusted pointer to the kernel
/// type `btf_id`, which must be a constant the verifier knows.
///
/// # Safety
/// The call is rewritten into the kfunc call before loading.
#[inline(always)]
pub unsafe fn rdonly_cast(obj: *const u8, btf_id: u32) -> *const u8 {
    // SAFETY: as in `dynptr_from_skb`.
    let call: unsafe extern "C" fn(*const u8, u32) -> *const u8 =
        unsafe { core::mem::transmute(RDONLY_CAST as usize) };
    // SAFETY: as the caller promises.
    unsafe { call(obj, btf_id) }
}
