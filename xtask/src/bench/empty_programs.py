"""Loads empty BPF programs on observer's hooks, to measure the floor of
`kernel.bpf_stats_enabled`: what a program that does nothing costs per run on this
machine (the run-time accounting's own clock reads included).

Usage: empty_programs.py CGROUP2_ROOT [all|dev_queue|netfilter]
Prints one line `ids ID...` once every program is attached, then holds them until
stdin closes. Programs: `all` (the default): floor_dev_queue (raw tracepoint
net_dev_queue, returns 0), floor_ingress and floor_egress (cgroup_skb on the cgroup v2
root, return 1: allow); `dev_queue`: floor_dev_queue alone; `netfilter`: floor_nf, a
BPF_PROG_TYPE_NETFILTER program (Linux 6.4+, returns 1: NF_ACCEPT) linked at IPv4's
POSTROUTING and LOCAL_IN in the calling process's network namespace with priority
INT_MAX - 1 (INT_MAX itself is refused), as net/netfilter/nf_bpf_link.c links it.
"""

import ctypes
import os
import platform
import struct
import sys

SYS_BPF = {"x86_64": 321, "aarch64": 280}[platform.machine()]
BPF_PROG_LOAD = 5
BPF_RAW_TRACEPOINT_OPEN = 17
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_LINK_CREATE = 28
PROG_TYPE_CGROUP_SKB = 8
PROG_TYPE_RAW_TRACEPOINT = 17
CGROUP_INET_INGRESS = 0
CGROUP_INET_EGRESS = 1
# include/uapi/linux/bpf.h (6.4+): BPF_PROG_TYPE_NETFILTER, BPF_NETFILTER.
PROG_TYPE_NETFILTER = 32
ATTACH_NETFILTER = 45
NFPROTO_IPV4 = 2
NF_INET_LOCAL_IN = 1
NF_INET_POST_ROUTING = 4
NF_PRIORITY = 2**31 - 2

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def bpf(cmd: int, attr: bytearray) -> int:
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    ret = libc.syscall(SYS_BPF, cmd, buf, len(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    attr[:] = buf.raw
    return ret


def load(prog_type: int, name: str, ret: int, expected_attach: int = 0) -> int:
    # mov64 r0, ret; exit
    insns = struct.pack("<BBhi", 0xB7, 0, 0, ret) + struct.pack("<BBhi", 0x95, 0, 0, 0)
    insns_buf = ctypes.create_string_buffer(insns, len(insns))
    license = ctypes.create_string_buffer(b"GPL")
    attr = bytearray(128)
    struct.pack_into("<II", attr, 0, prog_type, len(insns) // 8)
    struct.pack_into("<QQ", attr, 8, ctypes.addressof(insns_buf), ctypes.addressof(license))
    attr[48:64] = name.encode()[:15].ljust(16, b"\0")
    struct.pack_into("<I", attr, 68, expected_attach)
    return bpf(BPF_PROG_LOAD, attr)


def prog_id(fd: int) -> int:
    info = ctypes.create_string_buffer(256)
    attr = bytearray(16)
    struct.pack_into("<IIQ", attr, 0, fd, 256, ctypes.addressof(info))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return struct.unpack_from("<I", info.raw, 4)[0]


def dev_queue(fds: list, ids: list) -> None:
    prog = load(PROG_TYPE_RAW_TRACEPOINT, "floor_dev_queue", 0)
    name = ctypes.create_string_buffer(b"net_dev_queue")
    attr = bytearray(16)
    struct.pack_into("<QI", attr, 0, ctypes.addressof(name), prog)
    fds.append(bpf(BPF_RAW_TRACEPOINT_OPEN, attr))
    ids.append(prog_id(prog))


def cgroup_skb(cgroup: int, fds: list, ids: list) -> None:
    for prog_name, attach in (("floor_ingress", CGROUP_INET_INGRESS), ("floor_egress", CGROUP_INET_EGRESS)):
        prog = load(PROG_TYPE_CGROUP_SKB, prog_name, 1, attach)
        attr = bytearray(32)
        struct.pack_into("<IIII", attr, 0, prog, cgroup, attach, 0)
        fds.append(bpf(BPF_LINK_CREATE, attr))
        ids.append(prog_id(prog))


def netfilter(fds: list, ids: list) -> None:
    prog = load(PROG_TYPE_NETFILTER, "floor_nf", 1, ATTACH_NETFILTER)
    for hook in (NF_INET_POST_ROUTING, NF_INET_LOCAL_IN):
        # link_create: prog_fd, target_fd, attach_type, flags, then netfilter's pf,
        # hooknum, priority, flags.
        attr = bytearray(64)
        struct.pack_into("<IIII", attr, 0, prog, 0, ATTACH_NETFILTER, 0)
        struct.pack_into("<IIiI", attr, 16, NFPROTO_IPV4, hook, NF_PRIORITY, 0)
        fds.append(bpf(BPF_LINK_CREATE, attr))
    ids.append(prog_id(prog))


def main() -> None:
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    fds, ids = [], []
    if which in ("all", "dev_queue"):
        dev_queue(fds, ids)
    if which == "all":
        cgroup_skb(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY), fds, ids)
    if which == "netfilter":
        netfilter(fds, ids)
    print("ids " + " ".join(map(str, ids)), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
