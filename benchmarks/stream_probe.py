"""Hostile input on the stream protocol and the stream store, against a throwaway node: what each input costs the
node (RSS growth, file descriptors), the longest another client waits meanwhile (a stream-protocol metadata
request sent again and again), and what the client that sent it gets.

    .venv/bin/python benchmarks/stream_probe.py [--root DIR] [--ulimit 1024] [--only NAME ...]

``--root`` runs the node from another checkout with this interpreter (e.g. ``--root /work/main``), so the same
probes measure two versions in one sitting.  Probes: ``fds`` (a stream with ``stream-max-segment-size-bytes: 1``
and 2,000 one-message publish frames, under ``--ulimit``), ``fds-amqp`` (500 confirmed AMQP publishes to such a
stream), ``bomb`` (a 25-byte record holding an array of 20M nulls, read by an AMQP consumer and by HTTP peek),
``offsets`` (10,000 store_offset of new 255-byte references in one burst), ``writers`` (``--writers`` named
publishers, then one publishing for 3 s), ``gzip`` (a 510 KiB gzip sub-batch inflating to 512 MiB, read by an
AMQP consumer), ``timestamp`` (subscribe at the timestamp i64 max).
"""
from __future__ import annotations

import argparse
import base64
import gzip
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def frame(key: int, body: bytes, version: int = 1) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, version) + body


def string(value: str) -> bytes:
    return struct.pack(">h", len(value.encode())) + value.encode()


class Raw:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> tuple[int, bytes]:
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack_from(">I", self.buf)[0]:
            data = self.sock.recv(1 << 16)
            if not data:
                return -1, b""
            self.buf += data
        size = struct.unpack_from(">I", self.buf)[0]
        data, self.buf = self.buf[4:4 + size], self.buf[4 + size:]
        return struct.unpack_from(">H", data)[0], data[4:]

    def login(self) -> None:
        self.send(frame(0x11, struct.pack(">Ii", 1, 0)))
        self.receive()
        self.send(frame(0x12, struct.pack(">I", 2)))
        self.receive()
        self.send(frame(0x13, struct.pack(">I", 3) + string("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest"))
        self.receive()
        _, tune = self.receive()
        self.send(frame(0x14, tune))
        self.send(frame(0x15, struct.pack(">I", 4) + string("/")))
        self.receive()

    def request(self, key: int, body: bytes) -> int:
        self.send(frame(key, struct.pack(">I", 9) + body))
        while True:
            got, rest = self.receive()
            if got == key | 0x8000 or got < 0:
                return struct.unpack_from(">IH", rest)[1] if got >= 0 else -1


class Node:
    def __init__(self, root: Path, tmp: Path, ulimit: int | None) -> None:
        self.amqp, self.http, self.stream = free_port(), free_port(), free_port()
        self.log_path = tmp / "node.log"

        def limit() -> None:
            if ulimit:
                resource.setrlimit(resource.RLIMIT_NOFILE, (ulimit, ulimit))

        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.amqp),
                 "--mgmt-port", str(self.http), "--data-dir", str(tmp / "data"), "--stream-enabled", "true",
                 "--stream-port", str(self.stream)], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=limit)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.stream), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the node did not start")

    def rss(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    @property
    def up(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Watch:
    """The longest round trip of another client while a probe runs."""

    def __init__(self, node: Node) -> None:
        self.raw = Raw(node.stream)
        self.raw.login()
        self.longest = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.raw.request(0x0F, struct.pack(">i", 1) + string("none"))
            except OSError:
                return
            self.longest = max(self.longest, time.monotonic() - started)
            time.sleep(0.01)

    def __enter__(self) -> "Watch":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def new_stream(raw: Raw, *arguments: tuple[str, str]) -> str:
    stream = f"p-{uuid.uuid4().hex[:8]}"
    body = struct.pack(">i", len(arguments)) + b"".join(string(k) + string(v) for k, v in arguments)
    code = raw.request(0x0D, string(stream) + body)
    if code != 1:
        raise Refused(f"create refused with response code {code:#x}")
    return stream


class Refused(Exception):
    """The node refused the probe's input at once: the protection a newer node has in place of bounded work."""


def simple(record: bytes) -> bytes:
    return struct.pack(">I", len(record)) + record


def publish_frame(publisher: int, entries: list[bytes], first_id: int) -> bytes:
    body = b"".join(struct.pack(">Q", first_id + k) + entry for k, entry in enumerate(entries))
    return frame(0x02, bytes([publisher]) + struct.pack(">i", len(entries)) + body)


def amqp_read(node: Node, stream: str, wanted: int, within: float) -> str:
    connection = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.amqp}/"))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    got: list[bytes] = []
    deadline = time.monotonic() + within
    try:
        channel.basic_consume(stream, lambda ch, m, p, body: (got.append(body), ch.basic_ack(m.delivery_tag)),
                              arguments={"x-stream-offset": "first"})
        while len(got) < wanted and time.monotonic() < deadline:
            connection.process_data_events(0.1)
    except pika.exceptions.AMQPError as exc:
        return f"{len(got)} delivered, then {type(exc).__name__} {exc}"[:160]
    connection.close()
    return f"{len(got)} delivered"


def peek(node: Node, stream: str) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{node.http}/api/queues/%2F/{stream}/peek?count=5",
                                     headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status = response.status
            response.read()
    except urllib.error.HTTPError as exc:
        status = exc.code
    return f"HTTP peek {status} in {time.monotonic() - started:.2f} s"


def probe_fds(node: Node, args: argparse.Namespace) -> str:
    raw = Raw(node.stream)
    raw.login()
    stream = new_stream(raw, ("stream-max-segment-size-bytes", "1"))
    raw.request(0x01, b"\x01" + string("") + string(stream))
    frames = 2000
    confirmed = 0
    for start in range(0, frames, 100):
        raw.send(b"".join(publish_frame(1, [simple(b"\x00\x53\x75\xa0\x01x")], k + 1)
                          for k in range(start, start + 100)))
    deadline = time.monotonic() + 60
    while confirmed < frames and time.monotonic() < deadline:
        key, rest = raw.receive()
        if key < 0:
            break
        if key == 0x03:
            confirmed += struct.unpack_from(">BI", rest)[1]
    return f"{confirmed}/{frames} confirmed"


def probe_fds_amqp(node: Node, args: argparse.Namespace) -> str:
    connection = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.amqp}/"))
    channel = connection.channel()
    stream = f"p-{uuid.uuid4().hex[:8]}"
    try:
        channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream",
                                                               "x-stream-max-segment-size-bytes": 1})
    except pika.exceptions.ChannelClosedByBroker as refused:
        raise Refused(f"declare refused: {refused.reply_code} {refused.reply_text}") from None
    channel.confirm_delivery()
    for k in range(500):
        channel.basic_publish("", stream, b"m%d" % k)
    connection.close()
    return "500 confirmed"


def probe_bomb(node: Node, args: argparse.Namespace) -> str:
    raw = Raw(node.stream)
    raw.login()
    stream = new_stream(raw)
    raw.request(0x01, b"\x01" + string("") + string(stream))
    pair = b"\xa1\x01k" + b"\xf0" + struct.pack(">II", 5, 20_000_000) + b"\x40"
    record = b"\x00\x53\x74\xc1" + bytes([len(pair) + 1, 2]) + pair + b"\x00\x53\x75\xa0\x01x"
    raw.send(publish_frame(1, [simple(record)], 1))
    raw.receive()
    started = time.monotonic()
    consumer = amqp_read(node, stream, 1, 30)
    return f"AMQP consumer: {consumer} after {time.monotonic() - started:.2f} s; {peek(node, stream)}"


def probe_offsets(node: Node, args: argparse.Namespace) -> str:
    raw = Raw(node.stream)
    raw.login()
    stream = new_stream(raw)
    references = [f"{k:0255d}" for k in range(10_000)]
    started = time.monotonic()
    for begin in range(0, len(references), 2000):
        raw.send(b"".join(frame(0x0A, string(r) + string(stream) + struct.pack(">Q", k))
                          for k, r in enumerate(references[begin:begin + 2000], begin)))
    code = raw.request(0x0B, string(references[-1]) + string(stream))
    return f"query of the last answered {code:#x} after {time.monotonic() - started:.2f} s"


def probe_writers(node: Node, args: argparse.Namespace) -> str:
    raw = Raw(node.stream)
    raw.login()
    stream = new_stream(raw)
    entry = simple(b"\x00\x53\x75\xa0\x01x")
    for begin in range(0, args.writers, 1000):
        raw.send(b"".join(frame(0x01, struct.pack(">IB", 9, 1) + string(f"w{k}") + string(stream))
                          + publish_frame(1, [entry], 1) + frame(0x06, struct.pack(">IB", 9, 1))
                          for k in range(begin, min(begin + 1000, args.writers))))
        answers = 2 * (min(begin + 1000, args.writers) - begin)  # declared, deleted (a deleted one is not confirmed)
        while answers:
            key, _ = raw.receive()
            answers -= key in (0x8001, 0x8006)
    raw.request(0x01, b"\x01" + string("last") + string(stream))
    time.sleep(1)
    with Watch(node) as watch:  # (what the table costs once it is there: a snapshot a second)
        ends = time.monotonic() + 3
        k = 1
        while time.monotonic() < ends:
            raw.send(publish_frame(1, [entry], k))
            raw.receive()
            k += 1
    return (f"{args.writers} named publishers, then {k - 1} confirmed publishes by one in 3 s, others waiting "
            f"{watch.longest:.2f} s at most meanwhile")


def probe_gzip(node: Node, args: argparse.Namespace) -> str:
    raw = Raw(node.stream)
    raw.login()
    stream = new_stream(raw)
    raw.request(0x01, b"\x01" + string("") + string(stream))
    inflated = 512 << 20
    packed = gzip.compress(b"\0" * inflated, 9)
    sub_batch = struct.pack(">BHII", 0x80 | 1 << 4, 1, inflated, len(packed)) + packed
    raw.send(publish_frame(1, [sub_batch, simple(b"\x00\x53\x75\xa0\x05after")], 1))
    raw.receive()
    started = time.monotonic()
    consumer = amqp_read(node, stream, 2, 30)
    return f"{len(packed) >> 10} KiB sub-batch; AMQP consumer: {consumer} after {time.monotonic() - started:.2f} s"


def probe_timestamp(node: Node, args: argparse.Namespace) -> str:
    raw = Raw(node.stream)
    raw.login()
    stream = new_stream(raw)
    code = raw.request(0x07, b"\x01" + string(stream) + struct.pack(">Hq", 5, 2**63 - 1) + struct.pack(">Hi", 10, 0))
    return f"subscribe answered {code:#x}"


PROBES = {"fds": probe_fds, "fds-amqp": probe_fds_amqp, "bomb": probe_bomb, "offsets": probe_offsets,
          "writers": probe_writers, "gzip": probe_gzip, "timestamp": probe_timestamp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--ulimit", type=int, default=1024)
    parser.add_argument("--writers", type=int, default=100_000)
    parser.add_argument("--only", nargs="*", default=list(PROBES))
    args = parser.parse_args()
    print(f"root {args.root}, ulimit -n {args.ulimit}, load {os.getloadavg()[0]:.1f}")
    for name in args.only:
        with tempfile.TemporaryDirectory() as tmp:
            node = Node(args.root, Path(tmp), args.ulimit)
            try:
                time.sleep(1)
                rss, fds = node.rss(), node.fds()
                with Watch(node) as watch:
                    try:
                        outcome = PROBES[name](node, args)
                    except Refused as refused:
                        outcome = f"refused: {refused}"
                    except (OSError, AssertionError, pika.exceptions.AMQPError) as exc:
                        outcome = f"probe failed: {type(exc).__name__} {exc}"[:160]
                up = node.up
                after = (node.rss(), node.fds()) if up else (rss, fds)
                print(f"{name:10} others waited {watch.longest:6.2f} s  RSS {rss:6.0f} -> {after[0]:6.0f} MiB  "
                      f"fds {fds} -> {after[1]}  node {'up' if up else 'EXITED'}  load {os.getloadavg()[0]:.1f}"
                      f"\n           {outcome}", flush=True)
            finally:
                node.stop()


if __name__ == "__main__":
    main()
