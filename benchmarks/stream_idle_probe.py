"""Stream-protocol clients that do not read, against a throwaway node: what each costs the node in memory.

    .venv/bin/python benchmarks/stream_idle_probe.py [--root DIR] [--seconds S] [--connections N]

``--root`` runs the node from another checkout (e.g. a worktree of an older commit) with this interpreter, so the
same probes measure two versions in one sitting.  Attacks: one connection that never logs in sending
``peer_properties`` for S seconds (at most 9.5: the handshake deadline is 10 s) and reading nothing; one logged-in
connection sending ``metadata`` requests for S seconds and reading nothing; N idle connections to the stream port
that never log in, after which an AMQP client logs in or not.  Each reports the node's RSS growth (VmRSS at the
end, less before) and what was sent.
"""
from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cluster import free_port, wait_port  # (this folder is on the path of a script run from it)

ROOT = Path(__file__).resolve().parent.parent


def frame(key: int, body: bytes) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, 1) + body


def string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


PEER_PROPERTIES = frame(0x11, struct.pack(">I", 1) + struct.pack(">i", 1) + string("product") + string("probe"))


class Node:
    def __init__(self, root: Path, tmp: Path, handshakes_max: int) -> None:
        self.amqp, self.stream = free_port(), free_port()
        self.log = open(tmp / "node.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.amqp),
             "--mgmt-enabled", "false", "--data-dir", str(tmp / "data"), "--stream-enabled", "true",
             "--stream-port", str(self.stream), "--handshakes-max", str(handshakes_max), "--log-level", "ERROR"],
            cwd=root, stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(self.amqp)
        wait_port(self.stream)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def flood(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Send ``data`` over and over for ``seconds`` without reading; the bytes the node took."""
    sock.setblocking(False)
    sent = 0
    payload = data * max(1, 65536 // len(data))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sent += sock.send(payload)
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            break
    return sent


def connect(node: Node) -> socket.socket:
    """A connection to the stream port whose receive buffer is small: what the node sends waits in the node."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", node.stream))
    return sock


def logged_in(node: Node) -> socket.socket:
    sock = connect(node)
    sock.sendall(PEER_PROPERTIES + frame(0x12, struct.pack(">I", 2)))
    sock.sendall(frame(0x13, struct.pack(">I", 3) + string("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest"))
    time.sleep(0.3)
    sock.sendall(frame(0x14, struct.pack(">II", 1048576, 0)) + frame(0x15, struct.pack(">I", 4) + string("/")))
    time.sleep(0.3)
    return sock


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def amqp_login(node: Node) -> bool:
    """Whether an AMQP client gets connection.open-ok within 5 s."""
    try:
        import pika
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp, blocked_connection_timeout=5,
                                                          socket_timeout=5, connection_attempts=1)).close()
        return True
    except Exception:  # noqa: BLE001 - any failure is the answer
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout the node runs from")
    parser.add_argument("--seconds", type=float, default=9.5)
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--handshakes-max", type=int, default=256)
    args = parser.parse_args()
    for attack in ("prelogin", "metadata", "idle"):
        with tempfile.TemporaryDirectory() as tmp:
            node = Node(args.root, Path(tmp), args.handshakes_max)
            try:
                time.sleep(0.5)
                before = node.rss()
                started = time.monotonic()
                if attack == "prelogin":
                    sock = connect(node)
                    what = f"{flood(sock, PEER_PROPERTIES, min(args.seconds, 9.5)) >> 20} MiB taken"
                elif attack == "metadata":
                    sock = logged_in(node)
                    request = frame(0x0F, struct.pack(">I", 9) + struct.pack(">i", 1) + string("s"))
                    what = f"{flood(sock, request, args.seconds) >> 20} MiB taken"
                else:
                    socks = [socket.create_connection(("127.0.0.1", node.stream)) for _ in range(args.connections)]
                    time.sleep(2)
                    open_ = sum(still_open(sock) for sock in socks)
                    what = f"{open_} of {args.connections} still open after 2 s; AMQP login: {amqp_login(node)}"
                elapsed = time.monotonic() - started
                print(f"{attack}: RSS {before >> 20} -> {node.rss() >> 20} MiB in {elapsed:.1f} s; {what}",
                      flush=True)
            finally:
                node.stop()


if __name__ == "__main__":
    main()
