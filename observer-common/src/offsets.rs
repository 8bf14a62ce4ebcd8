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
    /// `struct sk_buff`: `sk` (struct sock *): set on packets a local socket sent
    pub skb_sk: u32,
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
    /// `struct nf_conn`: `ct_general.use` (refcount_t, 4 bytes): 0 once the entry is freed
    pub ct_use: u32,
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
    /// The type id of `struct nf_conn` in the running kernel's BTF (0 where it is not
    /// readable): the netfilter program reads entries through `bpf_rdonly_cast` to it.
    pub ct_btf_id: u32,
    /// The type ids of `struct iphdr`, `struct ipv6hdr` and `struct tcphdr` in the same
    /// BTF (0 where it is not readable): the netfilter program reads a packet's headers
    /// through `bpf_rdonly_cast` to them.
    pub iphdr_btf_id: u32,
    pub ipv6hdr_btf_id: u32,
    pub tcphdr_btf_id: u32,
    /// Non-zero once user space filled the structure in (programs do nothing until then).
    pub valid: u32,
}

const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 25 * 4);

/// `struct nf_conntrack_tuple` as every kernel since 2.6 lays it out: the programs read
/// a tuple with one read into this. User space refuses to load on a kernel whose BTF
/// says otherwise (`RawTuple::matches`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawTuple {
    /// `src.u3` (IPv4: the first 4 bytes)
    pub src_addr: [u8; 16],
    /// `src.u.all` (network order)
    pub src_port: [u8; 2],
    /// `src.l3num`
    pub src_l3num: u16,
    /// `dst.u3`
    pub dst_addr: [u8; 16],
    /// `dst.u.all` (network order)
    pub dst_port: [u8; 2],
    /// `dst.protonum`
    pub dst_protonum: u8,
    /// `dst.dir`
    pub dst_dir: u8,
}

/// `nf_conn.tuplehash[0].tuple` up to the end of `tuplehash[1].tuple`: both tuples in
/// one read. Between them lies `tuplehash[1].hnnode`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawTuplePair {
    pub original: RawTuple,
    pub _hnnode: [u8; 16],
    pub reply: RawTuple,
}

const _: () = assert!(core::mem::size_of::<RawTuple>() == 40);
const _: () = assert!(core::mem::size_of::<RawTuplePair>() == 96);

impl RawTuple {
    /// Whether the kernel's tuple layout (from BTF) is this one, and the reply tuple
    /// follows the original one where `RawTuplePair` expects it.
    pub fn matches(o: &KernelOffsets) -> bool {
        o.tuple_src_addr == 0
            && o.tuple_src_port == 16
            && o.tuple_src_l3num == 18
            && o.tuple_dst_addr == 20
            && o.tuple_dst_port == 36
            && o.tuple_dst_protonum == 38
            && o.ct_tuple_reply == o.ct_tuple_original + 56
    }
}

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
    /// `IPS_SEEN_REPLY_BIT`: the entry has seen a packet in the reply direction.
    pub const SEEN_REPLY_BIT: u64 = 1;
    /// `IPS_CONFIRMED_BIT`: the entry is in conntrack's table (set by confirmation,
    /// at the end of a new connection's first packet's path through the namespace).
    pub const CONFIRMED_BIT: u64 = 3;
    pub const DST_NAT_BIT: u64 = 5;
    /// `IPS_DYING_BIT`: the entry was deleted (flush, delete, garbage collection).
    pub const DYING_BIT: u64 = 9;
}

/// `enum tcp_conntrack` values.
pub mod tcp_state {
    pub const ESTABLISHED: u8 = 3;
}

#[cfg(feature = "user")]
// SAFETY: plain old data: `#[repr(C)]`, all `u32`, no padding (size asserted above).
unsafe impl aya::Pod for KernelOffsets {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tuple layout of every kernel observer was tried on (5.10 to 6.18:
    /// docs/kernel-facts.md).
    fn known() -> KernelOffsets {
        KernelOffsets {
            ct_tuple_original: 16,
            ct_tuple_reply: 72,
            tuple_src_addr: 0,
            tuple_src_port: 16,
            tuple_src_l3num: 18,
            tuple_dst_addr: 20,
            tuple_dst_port: 36,
            tuple_dst_protonum: 38,
            ..KernelOffsets::default()
        }
    }

    #[test]
    fn the_known_tuple_layout_is_read_in_one_block() {
        assert!(RawTuple::matches(&known()));
    }

    #[test]
    fn another_tuple_layout_is_refused() {
        let moved_port = KernelOffsets {
            tuple_dst_port: 40,
            ..known()
        };
        assert!(!RawTuple::matches(&moved_port));
        let apart = KernelOffsets {
            ct_tuple_reply: 80,
            ..known()
        };
        assert!(!RawTuple::matches(&apart));
    }
}
