"""A lab pod's servers: an HTTP/1.1 keep-alive server and a UDP responder, both answering
with the pod's name. Writes --ready-file once both sockets listen."""

import argparse
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--udp-port", type=int, required=True)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--dual-stack", action="store_true", help="listen on IPv6 and IPv4")
    args = ap.parse_args()
    body = args.name.encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args) -> None:  # noqa: A002
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if args.dual_stack else socket.AF_INET

        def server_bind(self) -> None:
            if args.dual_stack:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    any_address = "::" if args.dual_stack else "0.0.0.0"
    httpd = Server((any_address, args.http_port), Handler)
    udp = socket.socket(Server.address_family, socket.SOCK_DGRAM)
    if args.dual_stack:
        udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    udp.bind((any_address, args.udp_port))

    def serve_udp() -> None:
        while True:
            _, peer = udp.recvfrom(2048)
            udp.sendto(body, peer)

    threading.Thread(target=serve_udp, daemon=True).start()
    tmp = args.ready_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(tmp, args.ready_file)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
