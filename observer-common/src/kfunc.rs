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

/// Each placeholder call number and the kfunc it stands for.
pub const KFUNCS: [(i32, &str); 1] = [(DYNPTR_FROM_SKB, "bpf_dynptr_from_skb")];
