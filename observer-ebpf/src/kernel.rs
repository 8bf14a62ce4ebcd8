//! Reads of kernel memory. Every failed read is counted (`counters::READ_ERRORS`).

use aya_ebpf::helpers::bpf_probe_read_kernel;
use observer_common::{
    conn::{Endpoint, FlowTuple},
    counters,
    offsets::KernelOffsets,
};

use crate::maps::count;

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

/// Reads one direction's `struct nf_conntrack_tuple` at `tuple` into `out`.
#[inline(always)]
pub fn read_tuple(tuple: u64, off: &KernelOffsets, out: &mut FlowTuple) -> Result<(), ReadFailed> {
    out.src = Endpoint {
        addr: read(tuple, off.tuple_src_addr)?,
        port: u16::from_be(read(tuple, off.tuple_src_port)?),
        _pad: [0; 2],
    };
    out.dst = Endpoint {
        addr: read(tuple, off.tuple_dst_addr)?,
        port: u16::from_be(read(tuple, off.tuple_dst_port)?),
        _pad: [0; 2],
    };
    out.family = read(tuple, off.tuple_src_l3num)?;
    out.protocol = read(tuple, off.tuple_dst_protonum)?;
    out._pad = 0;
    Ok(())
}

/// The inode of the network namespace a conntrack entry belongs to.
#[inline(always)]
pub fn read_netns(conntrack: u64, off: &KernelOffsets) -> Result<u32, ReadFailed> {
    let net: u64 = read(conntrack, off.ct_net)?;
    read(net, off.net_ns_inum)
}
