"""A small authoritative DNS server for the lab's kube-dns pods, UDP and TCP on one port.

Answers A for each --record NAME=IPV4 (NOERROR without answers for other types of those
names), NXDOMAIN for every other name. Logs every query it receives as one JSON line
(name lower-cased without the trailing dot, type, rcode, proto, client, id) to --log: the
ground truth the lab's tests compare observer against. Writes --ready-file once both
sockets listen. Python standard library only."""

import argparse
import json
import os
import socket
import socketserver
import struct
import threading

TYPES = {1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 12: "PTR", 15: "MX", 16: "TXT", 28: "AAAA",
         33: "SRV", 65: "HTTPS"}
RCODES = {0: "NOERROR", 1: "FORMERR", 3: "NXDOMAIN"}


def question(msg: bytes):
    """(id, flags, name, qtype, end of question); raises ValueError on bad input."""
    if len(msg) < 12:
        raise ValueError("short header")
    ident, flags, qdcount = struct.unpack("!HHH", msg[:6])
    if qdcount != 1:
        raise ValueError("not one question")
    labels, at = [], 12
    while True:
        n = msg[at]
        if n == 0:
            at += 1
            break
        if n > 63:
            raise ValueError("compressed or bad label in a question")
        labels.append(msg[at + 1:at + 1 + n].decode("ascii", "replace").lower())
        at += 1 + n
    qtype, _qclass = struct.unpack("!HH", msg[at:at + 4])
    return ident, flags, ".".join(labels) or ".", qtype, at + 4


def respond(msg: bytes, records: dict):
    """The response and what to log."""
    try:
        ident, flags, name, qtype, end = question(msg)
    except (ValueError, IndexError, struct.error):
        ident = struct.unpack("!H", msg[:2])[0] if len(msg) >= 2 else 0
        header = struct.pack("!HHHHHH", ident, 0x8000 | 1, 0, 0, 0, 0)
        return header, {"name": None, "qtype": None, "rcode": "FORMERR", "id": ident}
    answers = b""
    if name in records:
        rcode = 0
        if qtype == 1:
            answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 30, 4) + socket.inet_aton(records[name])
    else:
        rcode = 3
    # QR, the query's opcode and RD, AA, RA.
    out_flags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080 | rcode
    header = struct.pack("!HHHHHH", ident, out_flags, 1, 1 if answers else 0, 0, 0)
    entry = {"name": name, "qtype": TYPES.get(qtype, f"TYPE{qtype}"),
             "rcode": RCODES[rcode], "id": ident}
    return header + msg[12:end] + answers, entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=53)
    ap.add_argument("--record", action="append", default=[], help="NAME=IPV4")
    ap.add_argument("--log", required=True)
    ap.add_argument("--ready-file", required=True)
    args = ap.parse_args()
    records = {}
    for item in args.record:
        name, ip = item.split("=", 1)
        records[name.rstrip(".").lower()] = ip
    log = open(args.log, "a", buffering=1)
    lock = threading.Lock()

    def note(entry: dict, proto: str, peer) -> None:
        entry.update(proto=proto, client=f"{peer[0]}:{peer[1]}")
        with lock:
            log.write(json.dumps(entry) + "\n")

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", args.port))

    def serve_udp() -> None:
        while True:
            msg, peer = udp.recvfrom(4096)
            reply, entry = respond(msg, records)
            note(entry, "udp", peer)
            udp.sendto(reply, peer)

    class Tcp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            stream = self.request.makefile("rb")
            while True:
                size = stream.read(2)
                if len(size) < 2:
                    return
                msg = stream.read(struct.unpack("!H", size)[0])
                reply, entry = respond(msg, records)
                note(entry, "tcp", self.client_address)
                self.request.sendall(struct.pack("!H", len(reply)) + reply)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.daemon_threads = True
    tcp = socketserver.ThreadingTCPServer(("0.0.0.0", args.port), Tcp)
    threading.Thread(target=serve_udp, daemon=True).start()
    tmp = args.ready_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(tmp, args.ready_file)
    tcp.serve_forever()


if __name__ == "__main__":
    main()
