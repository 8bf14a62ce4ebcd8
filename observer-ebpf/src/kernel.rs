//! Reads of kernel memory, one `bpf_probe_read_kernel` per contiguous block. Every
//! failed read is counted (`counters::READ_ERRORS`).

use aya_ebpf::helpers::bpf_probe_read_kernel;
use observer_common::{
    conn::{Endpoint, FlowTuple},
    counters,
    offsets::RawTuplePair,
};

use crate::maps::{count, offset};

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
