"""Peers that never log in, against a throwaway node in cluster mode (with its own etcd): what each attack
costs the node in memory, and how long its HTTP API takes to answer meanwhile.

    .venv/bin/python benchmarks/preauth_probe.py [--root DIR] [--connections N]

``--root`` runs the node from another checkout (e.g. an export of an older commit) with this interpreter, so
the same probes measure two versions in one sitting.  Each attack reports the node's RSS growth (VmRSS after,
less before), the slowest of the HTTP requests sent one after another while it ran, and what became of its
connections.  Attacks: a proof carrying a 64 KiB node name; three cluster-port connections declaring 256 MiB
frames and sending 20 MiB each; 5,000 wrong proofs in one packet; a byte a second on the cluster port; N AMQP
connections each holding a partial 4 KiB frame; N HTTP connections each holding four 7,900-byte headers of a
head (within every limit aiohttp has); an
unauthenticated HTTP request sending a 256 MiB body.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

from cluster import free_port, wait_port  # (this folder is on the path of a script run from it)

ROOT = Path(__file__).resolve().parent.parent
FRAME = struct.Struct(">IB")  # the cluster link's frame head: payload length, type
AUTH = 2
AUTHORIZATION = "Basic " + base64.b64encode(b"guest:guest").decode()


class Node:
    def __init__(self, root: Path, tmp: Path) -> None:
        self.etcd_port, peer = free_port(), free_port()
        self.amqp, self.http, self.link = free_port(), free_port(), free_port()
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        self.etcd = subprocess.Popen(
            [etcd, "--name", "probe", "--data-dir", str(tmp / "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
             f"http://127.0.0.1:{peer}", "--initial-cluster", f"probe=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.etcd_port)
        self.log_path = tmp / "node.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.amqp),
                 "--mgmt-port", str(self.http), "--data-dir", str(tmp / "data"), "--node-name", "probe@localhost",
                 "--cluster-etcd", f"127.0.0.1:{self.etcd_port}", "--cluster-secret", "probe-secret",
                 "--cluster-port", str(self.link)], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                env=dict(os.environ, COLUMNS="200"))
        wait_port(self.amqp)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

    def http_get(self) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{self.http}/api/overview",
                                         headers={"Authorization": AUTHORIZATION})
        with urllib.request.urlopen(request, timeout=120) as reply:
            reply.read()

    def stop(self) -> None:
        for proc in (self.proc, self.etcd):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def link_socket(node: Node) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", node.link), timeout=5)
    sock.recv(FRAME.size + 16)  # the challenge
    return sock


def closed(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def attack_long_name(node: Node, _n: int) -> str:
    sock = link_socket(node)
    sock.sendall(FRAME.pack(48 + 65536, AUTH) + os.urandom(48) + b"ab12cd34" * 8192)
    return "closed" if closed(sock, 60) else "open after 60 s"


def attack_large_frames(node: Node, _n: int) -> str:
    socks = [link_socket(node) for _ in range(3)]
    refused = 0
    for sock in socks:
        try:
            sock.sendall(FRAME.pack(256 * 1024 * 1024 - 1, AUTH))
            for _ in range(20):
                sock.sendall(b"\0" * (1024 * 1024))
        except OSError:
            refused += 1
    time.sleep(1)
    return f"{refused} of 3 cut off while sending; {sum(closed(s, 0.5) for s in socks)} closed"


def attack_proofs(node: Node, _n: int) -> str:
    before = node.log_path.read_text(errors="replace").count("refused")
    sock = link_socket(node)
    sock.sendall((FRAME.pack(48 + 13, AUTH) + os.urandom(48) + b"probe9@stolen") * 5000)
    closed(sock, 10)
    time.sleep(1)
    return f"{node.log_path.read_text(errors='replace').count('refused') - before} log lines"


def attack_trickle(node: Node, _n: int) -> str:
    sock = link_socket(node)
    started = time.monotonic()
    for byte in FRAME.pack(200, AUTH) + b"x" * 200:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break
        if closed(sock, 1.0):
            break
        if time.monotonic() - started > 30:
            return "open after 30 s"
    return f"closed after {time.monotonic() - started:.1f} s"


def attack_amqp(node: Node, n: int) -> str:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", node.amqp), timeout=5)
        sock.sendall(b"AMQP\x00\x00\x09\x01" + struct.pack(">BHI", 1, 0, 4096) + b"s" * 4000)
        socks.append(sock)
    time.sleep(2)
    return f"{sum(closed(s, 0.01) for s in socks)} of {n} closed"


def attack_http(node: Node, n: int) -> str:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", node.http), timeout=5)
        sock.sendall(b"GET / HTTP/1.1\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (n, b"p" * 7900) for n in range(4)))
        socks.append(sock)
    time.sleep(2)
    return f"{sum(closed(s, 0.01) for s in socks)} of {n} closed"


def attack_http_body(node: Node, _n: int) -> str:
    sock = socket.create_connection(("127.0.0.1", node.http), timeout=5)
    size = 256 * 1024 * 1024
    sock.sendall(b"POST /api/definitions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % size)
    sent = 0
    try:
        while sent < size:
            sock.sendall(b" " * (1024 * 1024))
            sent += 1024 * 1024
    except OSError:
        pass
    return f"{sent // (1024 * 1024)} of 256 MiB sent before the node closed the connection"


ATTACKS: list[tuple[str, Callable[[Node, int], str]]] = [
    ("cluster port: a proof naming a 64 KiB node", attack_long_name),
    ("cluster port: 3 x a 256 MiB frame, 20 MiB sent", attack_large_frames),
    ("cluster port: 5,000 wrong proofs in one packet", attack_proofs),
    ("cluster port: a byte a second", attack_trickle),
    ("AMQP: N connections, a partial 4 KiB frame each", attack_amqp),
    ("HTTP: N connections, 31.7 KB of a head each", attack_http),
    ("HTTP: an unauthenticated 256 MiB body", attack_http_body),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout the node runs from")
    parser.add_argument("--connections", type=int, default=1000, help="N of the AMQP and HTTP attacks")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="warren-probe.") as tmp:
        node = Node(args.root.resolve(), Path(tmp))
        try:
            for name, attack in ATTACKS:
                node.http_get()
                time.sleep(1)
                before = node.rss()
                times: list[float] = []
                halt = threading.Event()

                def sample(halt: threading.Event, times: list[float]) -> None:
                    while not halt.is_set():
                        started = time.monotonic()
                        try:
                            node.http_get()
                        except OSError:
                            pass
                        times.append(time.monotonic() - started)
                        time.sleep(0.05)

                sampler = threading.Thread(target=sample, args=(halt, times), daemon=True)
                sampler.start()
                outcome = attack(node, args.connections)
                grown = node.rss() - before
                halt.set()
                sampler.join(130)
                results.append({"attack": name, "rss_growth_mib": round(grown / 2 ** 20, 1),
                                "http_worst_s": round(max(times), 2), "outcome": outcome})
                time.sleep(6)  # what is left of the attack times out before the next one
        finally:
            node.stop()
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for row in results:
        print(f"{row['attack']:<50} RSS {row['rss_growth_mib']:>7} MiB  HTTP worst {row['http_worst_s']:>6} s  "
              f"{row['outcome']}")


if __name__ == "__main__":
    main()
