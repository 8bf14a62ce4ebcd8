"""Holds a pod's outgoing packets for a fixed time, like `tc netem delay` on its link
(this machine's kernel has no netem qdisc). The packets come from an iptables NFQUEUE
rule in the pod's namespace; each is released DELAY_MS after it was queued, through
nfnetlink_queue's verdict messages (NF_ACCEPT), in arrival order.

  reply_delay.py QUEUE_NUM DELAY_MS READY_FILE
"""

import heapq
import os
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2


def attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def message(kind: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    # nfgenmsg: family AF_UNSPEC, version 0, res_id = queue number (big-endian).
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0, 0) + body


def config(sock: socket.socket, queue: int) -> None:
    cmd = attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0))
    sock.send(message(NFQNL_MSG_CONFIG, queue, cmd, NLM_F_REQUEST | NLM_F_ACK))
    check_ack(sock)
    params = attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
    sock.send(message(NFQNL_MSG_CONFIG, queue, params, NLM_F_REQUEST | NLM_F_ACK))
    check_ack(sock)


def check_ack(sock: socket.socket) -> None:
    data = sock.recv(65536)
    _, kind = struct.unpack_from("=IH", data)
    if kind == NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", data, 16)
        if error:
            raise OSError(-error, os.strerror(-error))


def packet_ids(data: bytes):
    at = 0
    while at + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, at)
        if length < 16:
            return
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            attr_at = at + 20
            while attr_at + 4 <= at + length:
                alen, akind = struct.unpack_from("=HH", data, attr_at)
                if alen < 4:
                    break
                if akind & 0x7FFF == NFQA_PACKET_HDR:
                    (packet_id,) = struct.unpack_from(">I", data, attr_at + 4)
                    yield packet_id
                attr_at += (alen + 3) & ~3
        at += (length + 3) & ~3


def main() -> None:
    queue, delay = int(sys.argv[1]), float(sys.argv[2]) / 1000.0
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    config(sock, queue)
    open(sys.argv[3], "w").close()
    held = []
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        readable, _, _ = select.select([sock], [], [], timeout)
        if readable:
            for packet_id in packet_ids(sock.recv(65536)):
                heapq.heappush(held, (time.monotonic() + delay, packet_id))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet_id = heapq.heappop(held)
            verdict = attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))
            sock.send(message(NFQNL_MSG_VERDICT, queue, verdict))


if __name__ == "__main__":
    main()
