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

    ThreadingHTTPServer.daemon_threads = True
    httpd = ThreadingHTTPServer(("0.0.0.0", args.http_port), Handler)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", args.udp_port))

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
