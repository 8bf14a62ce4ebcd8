//! Reads of kernel memory, one `bpf_probe_read_kernel` per contiguous block. Every
//! failed read is counted (`counters::READ_ERRORS`).

use aya_ebpf::helpers::bpf_probe_read_kernel;
use observer_common::{
    conn::{Endpoint, FlowTuple},
    counters,
    offsets::RawTuplePair,
};

use crate::{
    kfunc::rdonly_cast,
    maps::{count, offset},
};

/// A failed kernel read; already counted.
pub struct ReadFailed;

/// Reads a `T` at `base + offset`.
#[inline(always)]
pub fn read<T>(base: u64, offset: u32) -> Result<T, ReadFailed> {
    // SAFETY: bpf_probe_read_kernel copies with fault handling: an invalid address
    // returns an error instead of faulting.
    match unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) } {
        Ok(value) => Ok(value),
        Err(_) => {
            count(counters::READ_ERRORS);
            Err(ReadFailed)
        }
    }
}

/// Reads both of a conntrack entry's tuples (`tuplehash[0..2].tuple`) in one read.
/// User space checked at start-up that the kernel's layout is `RawTuplePair`'s.
#[inline(always)]
pub fn read_tuples(conntrack: u64) -> Result<RawTuplePair, ReadFailed> {
    read(conntrack, offset!(ct_tuple_original))
}

/// The original tuple alone (one read).
#[inline(always)]
pub fn read_original(conntrack: u64, out: &mut FlowTuple) -> Result<(), ReadFailed> {
    let raw: observer_common::offsets::RawTuple = read(conntrack, offset!(ct_tuple_original))?;
    convert(&raw, out);
    Ok(())
}

/// A kernel tuple as observer keeps it (ports in host order).
#[inline(always)]
pub fn convert(raw: &observer_common::offsets::RawTuple, out: &mut FlowTuple) {
    out.src = Endpoint {
        addr: raw.src_addr,
        port: u16::from_be_bytes(raw.src_port),
        _pad: [0; 2],
    };
    out.dst = Endpoint {
        addr: raw.dst_addr,
        port: u16::from_be_bytes(raw.dst_port),
        _pad: [0; 2],
    };
    out.family = raw.src_l3num;
    out.protocol = raw.dst_protonum;
    out._pad = 0;
}

/// The inode of the network namespace a conntrack entry belongs to.
#[inline(always)]
pub fn read_netns(conntrack: u64) -> Result<u32, ReadFailed> {
    let net: u64 = read(conntrack, offset!(ct_net))?;
    read(net, offset!(net_ns_inum))
}

/// How a program reads a conntrack entry (`struct nf_conn`, at the address
/// `skb->_nfct` holds): `Probed`, a `bpf_probe_read_kernel` per block, or, in the
/// netfilter program, `Cast`, plain loads.
pub trait EntryReads {
    /// `status` (the `IPS_*` bits).
    fn status(conntrack: u64) -> Result<u64, ReadFailed>;
    /// `proto.tcp.state`.
    fn tcp_state(conntrack: u64) -> Result<u8, ReadFailed>;
    /// The inode of the network namespace it belongs to (`ct_net.net->ns.inum`).
    fn netns(conntrack: u64) -> Result<u32, ReadFailed>;
    /// Both tuples, as observer keeps them.
    fn tuples(
        conntrack: u64,
        original: &mut FlowTuple,
        reply: &mut FlowTuple,
    ) -> Result<(), ReadFailed>;
    /// The original tuple alone.
    fn original(conntrack: u64, out: &mut FlowTuple) -> Result<(), ReadFailed>;
}

/// Entries read with `bpf_probe_read_kernel`, one call per contiguous block.
pub struct Probed;

impl EntryReads for Probed {
    #[inline(always)]
    fn status(conntrack: u64) -> Result<u64, ReadFailed> {
        read(conntrack, offset!(ct_status))
    }

    #[inline(always)]
    fn tcp_state(conntrack: u64) -> Result<u8, ReadFailed> {
        read(conntrack, offset!(ct_tcp_state))
    }

    #[inline(always)]
    fn netns(conntrack: u64) -> Result<u32, ReadFailed> {
        read_netns(conntrack)
    }

    #[inline(always)]
    fn tuples(
        conntrack: u64,
        original: &mut FlowTuple,
        reply: &mut FlowTuple,
    ) -> Result<(), ReadFailed> {
        let tuples = read_tuples(conntrack)?;
        convert(&tuples.original, original);
        convert(&tuples.reply, reply);
        Ok(())
    }

    #[inline(always)]
    fn original(conntrack: u64, out: &mut FlowTuple) -> Result<(), ReadFailed> {
        read_original(conntrack, out)
    }
}

/// `address` as a read-only pointer to the kernel type `btf_id` (`bpf_rdonly_cast`), whose
/// members are then plain loads. Only the netfilter program, whose loader rewrites the
/// kfunc call, may use it.
#[inline(always)]
pub fn typed(address: u64, btf_id: u32) -> *const u8 {
    // SAFETY: the kfunc only retypes the address (the verifier turns the call into a
    // move); loads through the result are fault-safe.
    unsafe { rdonly_cast(address as *const u8, btf_id) }
}

/// The `T` at `base + offset`: one member (or the bytes of bitfields, from the first) of
/// the type `base` points at.
#[inline(always)]
pub fn member<T>(base: *const u8, offset: u32) -> T {
    // SAFETY: `base` is a pointer from `typed` (or a pointer member read through one):
    // the verifier checks the load against the type's layout and makes it fault-safe.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

/// Entries read as a typed pointer: `bpf_rdonly_cast` to `struct nf_conn` (its id in the
/// kernel's BTF, `KernelOffsets::ct_btf_id`, a constant of the frozen `OFFSETS`), after
/// which each field is one load the verifier checks against the type's layout (one
/// member per load) and makes fault-safe. Only the netfilter program, whose loader
/// rewrites the kfunc call, reads entries so.
pub struct Cast;

impl Cast {
    /// The entry as a typed, read-only pointer.
    #[inline(always)]
    fn entry(conntrack: u64) -> *const u8 {
        typed(conntrack, offset!(ct_btf_id))
    }

    /// The tuple at `base` (`RawTuple`'s layout, which user space checked), member by
    /// member: the verifier refuses a load that spans two members.
    #[inline(always)]
    fn tuple(base: *const u8, out: &mut FlowTuple) {
        let src: [u64; 2] = [member(base, 0), member(base, 8)];
        let dst: [u32; 4] = [
            member(base, 20),
            member(base, 24),
            member(base, 28),
            member(base, 32),
        ];
        let mut src_addr = [0u8; 16];
        src_addr[..8].copy_from_slice(&src[0].to_ne_bytes());
        src_addr[8..].copy_from_slice(&src[1].to_ne_bytes());
        let mut dst_addr = [0u8; 16];
        for (chunk, word) in dst_addr.chunks_exact_mut(4).zip(dst) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        out.src = Endpoint {
            addr: src_addr,
            port: u16::from_be(member(base, 16)),
            _pad: [0; 2],
        };
        out.dst = Endpoint {
            addr: dst_addr,
            port: u16::from_be(member(base, 36)),
            _pad: [0; 2],
        };
        out.family = member(base, 18);
        out.protocol = member(base, 38);
        out._pad = 0;
    }
}

impl EntryReads for Cast {
    #[inline(always)]
    fn status(conntrack: u64) -> Result<u64, ReadFailed> {
        Ok(member(Self::entry(conntrack), offset!(ct_status)))
    }

    #[inline(always)]
    fn tcp_state(conntrack: u64) -> Result<u8, ReadFailed> {
        Ok(member(Self::entry(conntrack), offset!(ct_tcp_state)))
    }

    #[inline(always)]
    fn netns(conntrack: u64) -> Result<u32, ReadFailed> {
        let net: *const u8 = member(Self::entry(conntrack), offset!(ct_net));
        Ok(member(net, offset!(net_ns_inum)))
    }

    #[inline(always)]
    fn tuples(
        conntrack: u64,
        original: &mut FlowTuple,
        reply: &mut FlowTuple,
    ) -> Result<(), ReadFailed> {
        let entry = Self::entry(conntrack);
        Self::tuple(
            entry.wrapping_add(offset!(ct_tuple_original) as usize),
            original,
        );
        Self::tuple(entry.wrapping_add(offset!(ct_tuple_reply) as usize), reply);
        Ok(())
    }

    #[inline(always)]
    fn original(conntrack: u64, out: &mut FlowTuple) -> Result<(), ReadFailed> {
        let entry = Self::entry(conntrack);
        Self::tuple(entry.wrapping_add(offset!(ct_tuple_original) as usize), out);
        Ok(())
    }
}
