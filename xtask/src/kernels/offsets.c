/* The offsets observer reads from BTF, computed by the C compiler from `bpftool btf dump
 * format c` of the same kernel: an independent reading (bpftool parses the BTF, gcc lays
 * the structures out for the kernel's architecture). Compiled to assembly only (`-S`),
 * which carries one `.ascii "->path bytes"` line per offset, in observer's notation, as
 * the kernel's own asm-offsets does: a cross compiler needs neither libraries nor a way to
 * run what it builds. */
#define BPF_NO_PRESERVE_ACCESS_INDEX
#include VMLINUX_H
#define P(t, m) asm volatile("\n.ascii \"->" #t "." #m " %0\"" : : "i"(__builtin_offsetof(struct t, m)))
void offsets(void) {
    P(sk_buff, _nfct);
    P(sk_buff, head);
    P(sk_buff, data);
    P(sk_buff, len);
    P(sk_buff, dev);
    P(sk_buff, network_header);
    P(sk_buff, sk);
    P(nf_conn, tuplehash[0].tuple);
    P(nf_conn, tuplehash[1].tuple);
    P(nf_conn, status);
    P(nf_conn, ct_net.net);
    P(nf_conn, proto.tcp.state);
    P(nf_conn, ct_general.use);
    P(net, ns.inum);
    P(nf_conntrack_tuple, src.u3);
    P(nf_conntrack_tuple, src.u.all);
    P(nf_conntrack_tuple, src.l3num);
    P(nf_conntrack_tuple, dst.u3);
    P(nf_conntrack_tuple, dst.u.all);
    P(nf_conntrack_tuple, dst.protonum);
}
