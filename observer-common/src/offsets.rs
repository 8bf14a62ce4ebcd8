//! Kernel structure offsets, read from BTF (`/sys/kernel/btf/vmlinux`) by user space at
//! start-up and written into the programs' `OFFSETS` global before load. Rust eBPF gets
//! no CO-RE relocations today, so nothing here is compiled in for one kernel.

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `struct sk_buff`
    pub skb_nfct: u32,
    pub skb_head: u32,
    pub skb_data: u32,
    pub skb_len: u32,
    /// `struct sk_buff`: `dev` (struct net_device *)
    pub skb_dev: u32,
    pub skb_network_header: u32,
    /// `struct nf_conn`: `tuplehash[0].tuple`
    pub ct_tuple_original: u32,
    /// `struct nf_conn`: `tuplehash[1].tuple`
    pub ct_tuple_reply: u32,
    /// `struct nf_conn`: `status` (unsigned long)
    pub ct_status: u32,
    /// `struct nf_conn`: `ct_net.net` (struct net *)
    pub ct_net: u32,
    /// `struct nf_conn`: `proto.tcp.state` (u8)
    pub ct_tcp_state: u32,
    /// `struct net`: `ns.inum`
    pub net_ns_inum: u32,
    /// `struct nf_conntrack_tuple`: `src.u3`, `src.u.all`, `src.l3num`
    pub tuple_src_addr: u32,
    pub tuple_src_port: u32,
    pub tuple_src_l3num: u32,
    /// `struct nf_conntrack_tuple`: `dst.u3`, `dst.u.all`, `dst.protonum`
    pub tuple_dst_addr: u32,
    pub tuple_dst_port: u32,
    pub tuple_dst_protonum: u32,
    /// Non-zero once user space filled the structure in (programs do nothing until then).
    pub valid: u32,
}

const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 19 * 4);

/// `enum ip_conntrack_info` values (`skb->_nfct & 7`).
pub mod ctinfo {
    pub const ESTABLISHED: u64 = 0;
    pub const RELATED: u64 = 1;
    pub const NEW: u64 = 2;
    /// Values at or above this are the reply direction.
    pub const IS_REPLY: u64 = 3;
    pub const UNTRACKED: u64 = 7;
    pub const MASK: u64 = 7;
}

/// `enum ip_conntrack_status` bit numbers.
pub mod status {
    pub const DST_NAT_BIT: u64 = 5;
}

/// `enum tcp_conntrack` values.
pub mod tcp_state {
    pub const ESTABLISHED: u8 = 3;
}

#[cfg(feature = "user")]
// SAFETY: plain old data: `#[repr(C)]`, all `u32`, no padding (size asserted above).
unsafe impl aya::Pod for KernelOffsets {}
