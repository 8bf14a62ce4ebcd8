"""Lab clients. Each runs in the client namespace and prints its own record as JSON:
which local port each request or query used and which pod answered.

  http-fresh HOST PORT COUNT      a new TCP connection per request, each from a client
                                  port not used before
  http-keepalive HOST PORT COUNT [PAUSE]  one connection (http.client), COUNT sequential
                                  requests, PAUSE seconds apart (default 0)
  udp HOST PORT COUNT             each query from a new socket and a client port not used before
  http-churn HOST PORT SECONDS THREADS  fresh `Connection: close` requests from THREADS
                                  threads for SECONDS: {"connections": N, "failed": N}
  attempts PROTO HOST PORT COUNT TIMEOUT [DATAGRAMS]
                                  COUNT connection attempts, each from a new socket and
                                  a client port not used before, each given TIMEOUT
                                  seconds: [port, "connected"|"refused"|"timeout", pod,
                                  connect_ms, datagrams sent]. TCP: connect, then one
                                  request; UDP: DATAGRAMS datagrams (default 1; a refusal
                                  stops the sending), then wait for an answer
  resolve NAME...                 look each name up with glibc (getaddrinfo, so the
                                  namespace's resolv.conf applies): [[name, [addr...]]...]
  probe PROTO:HOST:PORT...        wait until every target answers (lab start-up; an
                                  IPv6 HOST in brackets)

HOST is an IPv4 or IPv6 address.
"""

import http.client
import json
import errno
import socket
import sys
import threading
import time

TIMEOUT = 5.0


def http_fresh(host: str, port: int, count: int) -> list:
    out = []
    for _ in range(count):
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
        # A client port not used before (see `fresh_socket`): the kernel may give a
        # closed connection's port to the same address again, and then one port would
        # stand for two connections in the client's record.
        sock = fresh_socket(socket.SOCK_STREAM, host)
        sock.settimeout(TIMEOUT)
        sock.connect((host, port))
        conn.sock = sock
        local_port = sock.getsockname()[1]
        conn.request("GET", "/", headers={"Connection": "close"})
        body = conn.getresponse().read().decode()
        conn.close()
        out.append([local_port, body])
    return out


def http_keepalive(host: str, port: int, count: int, pause: float = 0.0) -> list:
    out = []
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    for i in range(count):
        if pause and i:
            time.sleep(pause)
        conn.request("GET", "/")
        # http.client reconnects silently if the server closed: record the port per request.
        local_port = conn.sock.getsockname()[1]
        body = conn.getresponse().read().decode()
        out.append([local_port, body])
    conn.close()
    return out


# Client ports not used before come from a counter kept beside this script (the lab's
# state directory), below the kernel's ephemeral range: a port the kernel picked could
# repeat one whose conntrack entry is still alive (a UDP query would then be no new DNAT
# decision), or one an earlier connection to the same address used.
CLIENT_PORTS = (20000, 30000)


def udp_socket(host: str) -> socket.socket:
    return fresh_socket(socket.SOCK_DGRAM, host)


def fresh_socket(kind: int, host: str) -> socket.socket:
    """A socket of `kind` for talking to `host` (IPv4, or IPv6 if it holds a `:`)."""
    import fcntl
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client_ports")
    with open(path, "a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        last = int(counter.read() or CLIENT_PORTS[0] - 1)
        for _ in range(CLIENT_PORTS[1] - CLIENT_PORTS[0]):
            last = last + 1 if last + 1 < CLIENT_PORTS[1] else CLIENT_PORTS[0]
            v6 = ":" in host
            sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, kind)
            try:
                sock.bind(("::" if v6 else "0.0.0.0", last))
            except OSError:
                sock.close()
                continue
            counter.seek(0)
            counter.truncate()
            counter.write(str(last))
            return sock
    raise OSError("no free client port")


def udp_query(host: str, port: int, tries: int = 3) -> list:
    sock = udp_socket(host)
    sock.settimeout(TIMEOUT / tries)
    try:
        for _ in range(tries):
            # Resending from the same socket keeps the same conntrack entry.
            sock.sendto(b"q", (host, port))
            try:
                data, _ = sock.recvfrom(2048)
                return [sock.getsockname()[1], data.decode()]
            except socket.timeout:
                continue
        raise TimeoutError(f"no UDP answer from {host}:{port}")
    finally:
        sock.close()


def udp(host: str, port: int, count: int) -> list:
    return [udp_query(host, port) for _ in range(count)]


def attempt(proto: str, host: str, port: int, timeout: float, datagrams: int) -> list:
    sock = fresh_socket(socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM, host)
    local_port = sock.getsockname()[1]
    sock.settimeout(timeout)
    started = time.monotonic()
    sent = 0
    try:
        sock.connect((host, port))
        if proto == "tcp":
            connect_ms = (time.monotonic() - started) * 1000.0
            sock.sendall(b"GET / HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
            pod = reply.split(b"\r\n\r\n", 1)[-1].decode()
        else:
            connect_ms = None
            for _ in range(datagrams):
                sock.send(b"q")
                sent += 1
            pod = sock.recv(2048).decode()
        return [local_port, "connected", pod, connect_ms, sent]
    except ConnectionRefusedError:
        return [local_port, "refused", None, None, sent]
    except socket.timeout:
        return [local_port, "timeout", None, None, sent]
    except OSError as error:
        # A REJECT answered with an ICMP network or host unreachable (nftables' `reject`
        # on a ClusterIP's unserved port, say).
        if error.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return [local_port, "unreachable", None, None, sent]
        raise
    finally:
        sock.close()


def attempts(proto: str, host: str, port: int, count: int, timeout: float, datagrams: int) -> list:
    return [attempt(proto, host, port, timeout, datagrams) for _ in range(count)]


def resolve(names: list) -> list:
    out = []
    for name in names:
        try:
            found = sorted({a[4][0] for a in socket.getaddrinfo(name, 80, proto=socket.IPPROTO_TCP)})
        except socket.gaierror:
            found = []
        out.append([name, found])
    return out


def http_churn(host: str, port: int, seconds: float, threads: int) -> dict:
    """Fresh connections as fast as the threads go; counts those that got an answer."""
    deadline = time.monotonic() + seconds
    counts = [[0, 0] for _ in range(threads)]

    def worker(mine: list) -> None:
        request = f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
                    sock.sendall(request)
                    while sock.recv(4096):
                        pass
                mine[0] += 1
            except OSError:
                mine[1] += 1

    workers = [threading.Thread(target=worker, args=(c,)) for c in counts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"connections": sum(c[0] for c in counts), "failed": sum(c[1] for c in counts)}


def probe(targets: list) -> dict:
    deadline = time.monotonic() + 10
    answers = {}
    for target in targets:
        # PROTO:HOST:PORT, an IPv6 HOST in brackets.
        proto, rest = target.split(":", 1)
        host, port = rest.rsplit(":", 1)
        host = host.strip("[]")
        while True:
            try:
                if proto == "tcp":
                    answers[target] = http_fresh(host, int(port), 1)[0][1]
                else:
                    answers[target] = udp_query(host, int(port), tries=1)[1]
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{target} does not answer: {e}") from e
                time.sleep(0.05)
    return answers


def main() -> None:
    mode, rest = sys.argv[1], sys.argv[2:]
    try:
        if mode == "probe":
            result = probe(rest)
        elif mode == "resolve":
            result = resolve(rest)
        elif mode == "attempts":
            datagrams = int(rest[5]) if len(rest) > 5 else 1
            result = attempts(rest[0], rest[1], int(rest[2]), int(rest[3]), float(rest[4]), datagrams)
        elif mode == "http-churn":
            result = http_churn(rest[0], int(rest[1]), float(rest[2]), int(rest[3]))
        else:
            host, port, count = rest[0], int(rest[1]), int(rest[2])
            if mode == "http-keepalive" and len(rest) > 3:
                result = http_keepalive(host, port, count, float(rest[3]))
            else:
                result = {"http-fresh": http_fresh, "http-keepalive": http_keepalive, "udp": udp}[mode](
                    host, port, count
                )
    except (OSError, http.client.HTTPException) as e:
        print(f"{mode}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
