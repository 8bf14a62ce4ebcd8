//! The `struct sk_buff` fields `net_dev_queue` reads, two ways: `BtfSkb` from a BTF
//! tracepoint (`tp_btf`), where each field is one plain load, and `ProbedSkb` from a raw
//! tracepoint, where each read is a `bpf_probe_read_kernel` helper call. User space
//! attaches the first and falls back to the second where the kernel refuses it.

use aya_ebpf::{bindings::bpf_dynptr, helpers::generated::bpf_dynptr_read};

use crate::{
    kernel::{Cast, EntryReads, Probed, ReadFailed, read},
    kfunc::dynptr_from_skb,
    maps::offset,
    packet::{Layers, cast_layers, read_layers},
    table::{Levels, Single, Table},
};

/// The `sk_buff` fields the forwarding hook needs.
pub trait SkbFields: Copy {
    /// How the program reads the conntrack entry `_nfct` points at.
    type Entry: EntryReads;
    /// Where the program keeps its connections (`table`).
    type Table: Table;
    /// `_nfct`, `len` and `data_len`.
    fn conntrack_and_lengths(self) -> Result<(u64, u32, u32), ReadFailed>;
    /// `head` and `data`.
    fn head_and_data(self) -> Result<(u64, u64), ReadFailed>;
    /// `network_header`, relative to `head`.
    fn network_header(self) -> Result<u16, ReadFailed>;
    /// `dev`, the device about to transmit it.
    fn dev(self) -> Result<u64, ReadFailed>;
    /// `sk`, the socket that sent it (0 for a forwarded packet).
    fn socket(self) -> Result<u64, ReadFailed>;
    /// The `sk_buff`'s own address.
    fn address(self) -> u64;
    /// The headers' fields accounting needs, from the IP header at kernel address `ip`.
    #[inline(always)]
    fn layers(self, ip: u64) -> Result<Option<Layers>, ReadFailed> {
        read_layers(ip)
    }
    /// Whether `copy_payload` reads the packet's page fragments: the netfilter program's
    /// `sk_buff`. Where it does, the program copies DNS over TCP itself and the
    /// socket-side programs are not attached; on `net_dev_queue` they are.
    const READS_FRAGMENTS: bool = false;
    /// Copies `len` bytes (at most what `dst` holds) of the packet from kernel address
    /// `from` (within its linear part or past it, in page fragments) into `dst`; `< 0`
    /// when it cannot. Only where `READS_FRAGMENTS`.
    #[inline(always)]
    fn copy_payload(self, _from: u64, _dst: *mut u8, _len: u32) -> i64 {
        -1
    }
}

/// An `sk_buff` the verifier knows by its BTF type (a `tp_btf` argument). With the
/// offsets constant (`OFFSETS` is in a frozen read-only map, so the verifier reads them
/// as known values), each load is checked against `sk_buff`'s layout at load time and
/// runs as one fault-handled load (`BPF_PROBE_MEM`) instead of a helper call. One load
/// per field: the verifier refuses a load that spans two members.
#[derive(Clone, Copy)]
pub struct BtfSkb(*const u8);

impl BtfSkb {
    /// From the tracepoint's `struct sk_buff *` argument.
    #[inline(always)]
    pub fn new(skb: *const u8) -> BtfSkb {
        BtfSkb(skb)
    }

    #[inline(always)]
    fn load<T>(self, offset: u32) -> T {
        // SAFETY: the verifier checks this load against `sk_buff`'s BTF (a member of
        // exactly `T`'s size at `offset`) and makes it fault-handled: it cannot read
        // outside the structure or fault.
        unsafe { core::ptr::read_volatile(self.0.add(offset as usize).cast::<T>()) }
    }
}

impl SkbFields for BtfSkb {
    type Entry = Probed;
    type Table = Single;

    #[inline(always)]
    fn conntrack_and_lengths(self) -> Result<(u64, u32, u32), ReadFailed> {
        Ok((
            self.load(offset!(skb_nfct)),
            self.load(offset!(skb_len)),
            self.load(offset!(skb_len) + 4),
        ))
    }

    #[inline(always)]
    fn head_and_data(self) -> Result<(u64, u64), ReadFailed> {
        Ok((self.load(offset!(skb_head)), self.load(offset!(skb_data))))
    }

    #[inline(always)]
    fn network_header(self) -> Result<u16, ReadFailed> {
        Ok(self.load(offset!(skb_network_header)))
    }

    #[inline(always)]
    fn dev(self) -> Result<u64, ReadFailed> {
        // `dev` is a pointer to a structure: a plain load would give the verifier a
        // typed pointer, which this only compares. Read it as a number.
        read(self.0 as u64, offset!(skb_dev))
    }

    #[inline(always)]
    fn socket(self) -> Result<u64, ReadFailed> {
        // A number, as `dev` above.
        read(self.0 as u64, offset!(skb_sk))
    }

    #[inline(always)]
    fn address(self) -> u64 {
        self.0 as u64
    }
}

/// An `sk_buff` at a kernel address (a raw tracepoint argument): fields are read with
/// `bpf_probe_read_kernel`, adjacent ones in one call (user space checked in BTF that
/// `len` and `data_len` follow `_nfct`, and `data` follows `head`).
#[derive(Clone, Copy)]
pub struct ProbedSkb(pub u64);

impl SkbFields for ProbedSkb {
    type Entry = Probed;
    type Table = Single;

    #[inline(always)]
    fn conntrack_and_lengths(self) -> Result<(u64, u32, u32), ReadFailed> {
        let [nfct, lengths]: [u64; 2] = read(self.0, offset!(skb_nfct))?;
        let bytes = lengths.to_ne_bytes();
        let len = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let data_len = u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        Ok((nfct, len, data_len))
    }

    #[inline(always)]
    fn head_and_data(self) -> Result<(u64, u64), ReadFailed> {
        let [head, data]: [u64; 2] = read(self.0, offset!(skb_head))?;
        Ok((head, data))
    }

    #[inline(always)]
    fn network_header(self) -> Result<u16, ReadFailed> {
        read(self.0, offset!(skb_network_header))
    }

    #[inline(always)]
    fn dev(self) -> Result<u64, ReadFailed> {
        read(self.0, offset!(skb_dev))
    }

    #[inline(always)]
    fn socket(self) -> Result<u64, ReadFailed> {
        read(self.0, offset!(skb_sk))
    }

    #[inline(always)]
    fn address(self) -> u64 {
        self.0
    }
}

/// The netfilter program's `sk_buff` (`bpf_nf_ctx.skb`, a trusted BTF pointer): fields
/// as `BtfSkb` reads them, and the packet's bytes through a dynamic pointer
/// (`bpf_dynptr_from_skb`, a kfunc netfilter programs may call since Linux 6.4), page
/// fragments included, which TCP payload usually lies in.
#[derive(Clone, Copy)]
pub struct NetfilterSkb(pub BtfSkb);

impl SkbFields for NetfilterSkb {
    type Entry = Cast;
    type Table = Levels;
    const READS_FRAGMENTS: bool = true;

    #[inline(always)]
    fn conntrack_and_lengths(self) -> Result<(u64, u32, u32), ReadFailed> {
        self.0.conntrack_and_lengths()
    }

    #[inline(always)]
    fn head_and_data(self) -> Result<(u64, u64), ReadFailed> {
        self.0.head_and_data()
    }

    #[inline(always)]
    fn network_header(self) -> Result<u16, ReadFailed> {
        self.0.network_header()
    }

    #[inline(always)]
    fn dev(self) -> Result<u64, ReadFailed> {
        self.0.dev()
    }

    #[inline(always)]
    fn socket(self) -> Result<u64, ReadFailed> {
        self.0.socket()
    }

    #[inline(always)]
    fn address(self) -> u64 {
        self.0.address()
    }

    #[inline(always)]
    fn layers(self, ip: u64) -> Result<Option<Layers>, ReadFailed> {
        Ok(cast_layers(ip))
    }

    #[inline(always)]
    fn copy_payload(self, from: u64, dst: *mut u8, len: u32) -> i64 {
        let Ok((_, data)) = self.0.head_and_data() else {
            return -1;
        };
        let mut packet = bpf_dynptr { __opaque: [0; 2] };
        // SAFETY: `self.0` holds the program's own `sk_buff` pointer; the dynamic pointer
        // lives on this stack frame for both calls. bpf_dynptr_read checks `from - data`
        // and `len` against the packet and writes at most `len` bytes to `dst`, which the
        // caller sized.
        unsafe {
            if dynptr_from_skb(self.0.0, &mut packet) != 0 {
                return -1;
            }
            bpf_dynptr_read(dst.cast(), len, &packet, from.wrapping_sub(data) as u32, 0)
        }
    }
}
