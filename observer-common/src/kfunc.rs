//! Kernel functions (kfuncs) the eBPF programs call. A kfunc call is a `call`
//! instruction marked `BPF_PSEUDO_KFUNC_CALL` whose immediate is the function's type id
//! in the running kernel's BTF: rustc cannot write one, and the id differs between
//! kernels. So a program calls a helper number no kernel has (`KFUNCS`), and user space
//! rewrites each such call into the kfunc call before it loads the program (observer's
//! `kernel::netfilter`). A program loaded without that rewrite is refused, never wrong.

/// `int bpf_dynptr_from_skb(struct __sk_buff *skb, u64 flags, struct bpf_dynptr *ptr__uninit)`
/// (net/core/filter.c; netfilter programs since Linux 6.4): a dynamic pointer over the
/// packet from `skb->data`, page fragments included, for `bpf_dynptr_read`.
pub const DYNPTR_FROM_SKB: i32 = 0x0bf0_0001;

/// `void *bpf_rdonly_cast(const void *obj, u32 btf_id)` (kernel/bpf/helpers.c, Linux 6.2+;
/// the verifier replaces the call by a move): `obj` as a read-only, untrusted pointer to
/// the type `btf_id` (a constant), whose fields are then plain loads checked against
/// that type's layout and made fault-safe (`BPF_PROBE_MEM`), where
/// `bpf_probe_read_kernel` costs a helper call each.
pub const RDONLY_CAST: i32 = 0x0bf0_0002;

/// Each placeholder call number and the kfunc it stands for.
pub const KFUNCS: [(i32, &str); 2] = [
    (DYNPTR_FROM_SKB, "bpf_dynptr_from_skb"),
    (RDONLY_CAST, "bpf_rdonly_cast"),
];
