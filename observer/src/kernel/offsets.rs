//! The kernel structure offsets the programs need, found in BTF by name.

use observer_common::offsets::{KernelOffsets, RawTuple};

use crate::kernel::btf::{Btf, BtfError};

/// Finds `reads` (member path, bytes the kernel programs read there) in struct `name`
/// and checks each width: a member whose size is not what observer-ebpf reads would be
/// read wrongly, so it is an error naming it. Returns the struct's size and the offsets.
fn offsets<const N: usize>(
    btf: &Btf,
    name: &str,
    reads: [(&str, u32); N],
) -> Result<(u32, [u32; N]), BtfError> {
    let paths = reads.map(|(path, _)| path);
    let (size, fields) = btf.fields(name, &paths)?;
    let mut found = [0; N];
    for (index, ((path, expected), field)) in reads.iter().zip(fields).enumerate() {
        if field.size != *expected {
            return Err(BtfError::Width {
                name: name.to_owned(),
                path: (*path).to_owned(),
                found: field.size,
                expected: *expected,
            });
        }
        found[index] = field.offset;
    }
    Ok((size, found))
}

/// Looks up every offset in `KernelOffsets`, with the width of each read in
/// observer-ebpf (`kernel.rs`, `packet.rs`, `hooks/dev_queue.rs`).
pub fn kernel_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let skb = skb_offsets(btf)?;
    let (
        tuple_size,
        [
            src_addr,
            src_port,
            src_l3num,
            dst_addr,
            dst_port,
            dst_protonum,
        ],
    ) = offsets(
        btf,
        "nf_conntrack_tuple",
        [
            // union nf_inet_addr: 16 bytes (IPv4 in the first 4).
            ("src.u3", 16),
            ("src.u.all", 2),
            ("src.l3num", 2),
            ("dst.u3", 16),
            ("dst.u.all", 2),
            ("dst.protonum", 1),
        ],
    )?;
    let (
        _,
        [
            tuple_original,
            tuple_reply,
            status,
            net,
            tcp_state,
            use_count,
        ],
    ) = offsets(
        btf,
        "nf_conn",
        [
            ("tuplehash[0].tuple", tuple_size),
            ("tuplehash[1].tuple", tuple_size),
            ("status", 8),
            ("ct_net.net", 8),
            ("proto.tcp.state", 1),
            // refcount_t (hooks/revalidate.rs).
            ("ct_general.use", 4),
        ],
    )?;
    let (_, [ns_inum]) = offsets(btf, "net", [("ns.inum", 4)])?;
    let found = KernelOffsets {
        ct_tuple_original: tuple_original,
        ct_tuple_reply: tuple_reply,
        ct_status: status,
        ct_net: net,
        ct_tcp_state: tcp_state,
        ct_use: use_count,
        net_ns_inum: ns_inum,
        tuple_src_addr: src_addr,
        tuple_src_port: src_port,
        tuple_src_l3num: src_l3num,
        tuple_dst_addr: dst_addr,
        tuple_dst_port: dst_port,
        tuple_dst_protonum: dst_protonum,
        valid: 1,
        ..skb
    };
    // The programs read both tuples, and `head` with `data`, in one read each.
    if !RawTuple::matches(&found) {
        return Err(BtfError::UnexpectedLayout("nf_conn.tuplehash"));
    }
    if found.skb_data != found.skb_head + 8 {
        return Err(BtfError::UnexpectedLayout("sk_buff.head, data"));
    }
    Ok(found)
}

/// The `sk_buff` members; the rest of the returned offsets are 0.
fn skb_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let (
        _,
        [
            skb_nfct,
            skb_head,
            skb_data,
            skb_len,
            skb_data_len,
            skb_dev,
            skb_network_header,
            skb_sk,
        ],
    ) = offsets(
        btf,
        "sk_buff",
        [
            // unsigned long: the nf_conn pointer and ctinfo in the low 3 bits.
            ("_nfct", 8),
            ("head", 8),
            ("data", 8),
            ("len", 4),
            // Bytes in page fragments: read together with `_nfct` and `len`.
            ("data_len", 4),
            // struct net_device *: the device a datagram passes (UDP de-duplication).
            ("dev", 8),
            ("network_header", 2),
            // struct sock *: whether a local socket sent the packet.
            ("sk", 8),
        ],
    )?;
    // The forwarding hook reads `_nfct`, `len` and `data_len` in one 16-byte read.
    if skb_len != skb_nfct + 8 || skb_data_len != skb_len + 4 {
        return Err(BtfError::UnexpectedLayout("sk_buff._nfct, len, data_len"));
    }
    Ok(KernelOffsets {
        skb_nfct,
        skb_head,
        skb_data,
        skb_len,
        skb_dev,
        skb_network_header,
        skb_sk,
        ..KernelOffsets::default()
    })
}

/// `SKB_DROP_REASON_NETFILTER_DROP` as the kernel numbers it, when its `kfree_skb`
/// tracepoint passes a drop reason (Linux 5.17 and later); 0 otherwise, and the program
/// on that tracepoint then looks at every drop (see observer-ebpf's
/// `hooks/netfilter_drop.rs`).
pub fn netfilter_drop_reason(btf: &Btf) -> u32 {
    if btf.tracepoint_args("kfree_skb").unwrap_or(0) < 3 {
        return 0;
    }
    btf.enum_value("skb_drop_reason", "SKB_DROP_REASON_NETFILTER_DROP")
        .and_then(|value| u32::try_from(value).ok())
        .unwrap_or(0)
}

/// Every offset as `struct.member.path=bytes`, in C's notation, space-separated: what
/// `observer` logs at debug level so other tools can check it against their own reading.
pub fn describe(o: &KernelOffsets) -> String {
    let pairs: [(&str, u32); 20] = [
        ("sk_buff._nfct", o.skb_nfct),
        ("sk_buff.head", o.skb_head),
        ("sk_buff.data", o.skb_data),
        ("sk_buff.len", o.skb_len),
        ("sk_buff.dev", o.skb_dev),
        ("sk_buff.network_header", o.skb_network_header),
        ("sk_buff.sk", o.skb_sk),
        ("nf_conn.tuplehash[0].tuple", o.ct_tuple_original),
        ("nf_conn.tuplehash[1].tuple", o.ct_tuple_reply),
        ("nf_conn.status", o.ct_status),
        ("nf_conn.ct_net.net", o.ct_net),
        ("nf_conn.proto.tcp.state", o.ct_tcp_state),
        ("nf_conn.ct_general.use", o.ct_use),
        ("net.ns.inum", o.net_ns_inum),
        ("nf_conntrack_tuple.src.u3", o.tuple_src_addr),
        ("nf_conntrack_tuple.src.u.all", o.tuple_src_port),
        ("nf_conntrack_tuple.src.l3num", o.tuple_src_l3num),
        ("nf_conntrack_tuple.dst.u3", o.tuple_dst_addr),
        ("nf_conntrack_tuple.dst.u.all", o.tuple_dst_port),
        ("nf_conntrack_tuple.dst.protonum", o.tuple_dst_protonum),
    ];
    let text: Vec<String> = pairs
        .iter()
        .map(|(path, offset)| format!("{path}={offset}"))
        .collect();
    text.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::tests::Builder;

    /// BTF with just `struct sk_buff`, its `_nfct` `nfct_bytes` wide.
    fn skb_only(nfct_bytes: u32) -> Btf {
        skb_with_len_at(nfct_bytes, 64)
    }

    /// The same with `len` at bit `len_bits` (`data_len` right after it).
    fn skb_with_len_at(nfct_bytes: u32, len_bits: u32) -> Btf {
        let mut b = Builder::new();
        let nfct = b.int("nfct_t", nfct_bytes);
        let (int, short, pointer) = (b.int("u32", 4), b.int("__u16", 2), b.pointer());
        b.structure(
            "sk_buff",
            64,
            &[
                ("_nfct", nfct, 0),
                ("len", int, len_bits),
                ("data_len", int, len_bits + 32),
                ("head", pointer, 128),
                ("data", pointer, 192),
                ("network_header", short, 256),
                ("dev", pointer, 320),
                ("sk", pointer, 448),
            ],
        );
        Btf::parse(&b.finish()).unwrap()
    }

    /// A kernel whose `sk_buff._nfct` were 4 bytes wide: the programs read 8 there, so
    /// the offsets are refused, naming the member.
    #[test]
    fn a_member_of_another_width_is_an_error_naming_it() {
        assert_eq!(
            kernel_offsets(&skb_only(4)).unwrap_err().to_string(),
            "BTF member `sk_buff._nfct` is 4 bytes; observer's kernel programs read 8"
        );
        // With the right width the skb passes; the next struct is missing.
        assert_eq!(
            kernel_offsets(&skb_only(8)),
            Err(BtfError::NoStruct("nf_conntrack_tuple".into()))
        );
    }

    /// `_nfct`, `len` and `data_len` are read in one piece: a kernel where `len` does not
    /// follow `_nfct` is refused, naming the members.
    #[test]
    fn len_apart_from_nfct_is_refused() {
        assert_eq!(
            kernel_offsets(&skb_with_len_at(8, 384)),
            Err(BtfError::UnexpectedLayout("sk_buff._nfct, len, data_len"))
        );
    }

    /// On the running kernel (BTF is world-readable): the offsets docs/kernel-facts.md
    /// lists for Linux 6.18 must come out of BTF. Other kernels may differ, so only the
    /// structural relations are asserted there. Its `kfree_skb` takes a drop reason
    /// (Linux 5.17+), which 5.10 hosts' does not: so not a plain `cargo test`.
    #[test]
    #[ignore = "this machine's kernel: run by cargo xtask test"]
    fn running_kernel_offsets() {
        let file = std::fs::File::open(Btf::SYS_FS).expect("this kernel exposes its BTF");
        let btf = Btf::read(file).unwrap();
        let off = kernel_offsets(&btf).unwrap();
        assert_eq!(off.ct_tuple_reply - off.ct_tuple_original, 56);
        assert_eq!(off.tuple_src_port, 16);
        assert_eq!(off.tuple_dst_addr, 20);
        assert_eq!(off.tuple_dst_port, 36);
        assert_eq!(off.tuple_dst_protonum, 38);
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        if release.starts_with("6.18.") {
            assert_eq!(
                (
                    off.skb_nfct,
                    off.ct_tuple_original,
                    off.ct_status,
                    off.ct_net,
                    off.ct_tcp_state
                ),
                (104, 32, 128, 136, 224)
            );
            assert_eq!(off.ct_use, 0);
        }
        assert_eq!(btf.tracepoint_args("kfree_skb"), Some(4));
        assert!(netfilter_drop_reason(&btf) > 0);
    }

    #[test]
    fn describe_names_every_offset_in_c_notation() {
        let off = KernelOffsets {
            skb_nfct: 104,
            ct_tuple_reply: 88,
            tuple_dst_protonum: 38,
            ..KernelOffsets::default()
        };
        let text = describe(&off);
        assert_eq!(text.split(' ').count(), 20);
        assert!(text.starts_with(&format!("sk_buff._nfct={} ", off.skb_nfct)));
        assert!(text.contains(&format!(
            " nf_conn.tuplehash[1].tuple={} ",
            off.ct_tuple_reply
        )));
        assert!(text.ends_with(&format!(
            " nf_conntrack_tuple.dst.protonum={}",
            off.tuple_dst_protonum
        )));
    }
}
