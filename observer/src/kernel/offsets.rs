//! The kernel structure offsets the programs need, found in BTF by name.

use observer_common::offsets::KernelOffsets;

use crate::kernel::btf::{Btf, BtfError};

/// Looks up every offset in `KernelOffsets`.
pub fn kernel_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let tuple = |path: &str| btf.offset_of("nf_conntrack_tuple", path);
    Ok(KernelOffsets {
        skb_nfct: btf.offset_of("sk_buff", "_nfct")?,
        skb_head: btf.offset_of("sk_buff", "head")?,
        skb_data: btf.offset_of("sk_buff", "data")?,
        skb_len: btf.offset_of("sk_buff", "len")?,
        skb_network_header: btf.offset_of("sk_buff", "network_header")?,
        ct_tuple_original: btf.offset_of("nf_conn", "tuplehash[0].tuple")?,
        ct_tuple_reply: btf.offset_of("nf_conn", "tuplehash[1].tuple")?,
        ct_status: btf.offset_of("nf_conn", "status")?,
        ct_net: btf.offset_of("nf_conn", "ct_net.net")?,
        ct_tcp_state: btf.offset_of("nf_conn", "proto.tcp.state")?,
        net_ns_inum: btf.offset_of("net", "ns.inum")?,
        tuple_src_addr: tuple("src.u3")?,
        tuple_src_port: tuple("src.u.all")?,
        tuple_src_l3num: tuple("src.l3num")?,
        tuple_dst_addr: tuple("dst.u3")?,
        tuple_dst_port: tuple("dst.u.all")?,
        tuple_dst_protonum: tuple("dst.protonum")?,
        valid: 1,
    })
}

/// Every offset as `struct.member.path=bytes`, in C's notation, space-separated: what
/// `observer` logs at debug level so other tools can check it against their own reading.
pub fn describe(o: &KernelOffsets) -> String {
    let pairs: [(&str, u32); 17] = [
        ("sk_buff._nfct", o.skb_nfct),
        ("sk_buff.head", o.skb_head),
        ("sk_buff.data", o.skb_data),
        ("sk_buff.len", o.skb_len),
        ("sk_buff.network_header", o.skb_network_header),
        ("nf_conn.tuplehash[0].tuple", o.ct_tuple_original),
        ("nf_conn.tuplehash[1].tuple", o.ct_tuple_reply),
        ("nf_conn.status", o.ct_status),
        ("nf_conn.ct_net.net", o.ct_net),
        ("nf_conn.proto.tcp.state", o.ct_tcp_state),
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

    /// On the running kernel (BTF is world-readable): the offsets FACTS.md measured on
    /// Linux 6.18 must come out of BTF. Other kernels may differ, so only the
    /// structural relations are asserted there.
    #[test]
    fn running_kernel_offsets() {
        let data = std::fs::read(Btf::SYS_FS).expect("this kernel exposes /sys/kernel/btf/vmlinux");
        let btf = Btf::parse(&data).unwrap();
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
        }
    }

    #[test]
    fn describe_names_every_offset_in_c_notation() {
        let data = std::fs::read(Btf::SYS_FS).expect("this kernel exposes /sys/kernel/btf/vmlinux");
        let off = kernel_offsets(&Btf::parse(&data).unwrap()).unwrap();
        let text = describe(&off);
        assert_eq!(text.split(' ').count(), 17);
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
