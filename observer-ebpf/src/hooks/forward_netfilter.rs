//! `forward_netfilter`: the forwarding hook as a netfilter program (Linux 6.4+), linked
//! by user space in each node network namespace at NF_INET_POST_ROUTING and
//! NF_INET_LOCAL_IN with priority `INT_MAX - 1`, just before conntrack confirms the
//! entry (`NF_IP_PRI_CONNTRACK_CONFIRM`, `INT_MAX`). Kernel entry
//! (net/netfilter/nf_bpf_link.c, include/net/netfilter/nf_bpf_link.h):
//!
//! ```c
//! struct bpf_nf_ctx { const struct nf_hook_state *state; struct sk_buff *skb; };
//! static unsigned int nf_hook_run_bpf(void *bpf_prog, struct sk_buff *skb,
//!                                     const struct nf_hook_state *s);
//! ```
//!
//! Unlike `net_dev_queue`, which fires on every device a packet crosses (a pod's veth,
//! the bridge, the bridge port), a netfilter hook runs once per packet and namespace.
//! Every NAT decision is made by then (DNAT at PREROUTING or OUTPUT, SNAT at
//! POSTROUTING below `INT_MAX - 1`). A connection's first packet reaches this program
//! before confirmation: its entry may still lose a clash or be dropped, which user
//! space settles (`ConnState::confirmed`).
//!
//! `aya-ebpf` has no macro for this program type, and aya 0.14 cannot load it: the
//! section name is one aya's object parser accepts (it never loads it), and user space
//! loads and links the program itself (observer's `kernel::netfilter`).

use core::ffi::c_void;

use crate::skb::{BtfSkb, NetfilterSkb};

/// `NF_ACCEPT`: the packet goes on. The verifier allows only `NF_ACCEPT` and `NF_DROP`.
const NF_ACCEPT: i32 = 1;

/// `offsetof(struct bpf_nf_ctx, skb)`.
const CTX_SKB: usize = 1;

// SAFETY: a unique symbol; user space finds the program by this name.
#[unsafe(no_mangle)]
#[unsafe(link_section = "classifier/forward_netfilter")]
pub extern "C" fn forward_netfilter(ctx: *const c_void) -> i32 {
    // SAFETY: the context is a `struct bpf_nf_ctx`; the verifier allows this 8-byte load
    // of its `skb` member and types the result as the `sk_buff` of its BTF.
    let skb = unsafe { core::ptr::read_volatile(ctx.cast::<*const u8>().add(CTX_SKB)) };
    let _ = super::dev_queue::handle(NetfilterSkb(BtfSkb::new(skb)));
    NF_ACCEPT
}
