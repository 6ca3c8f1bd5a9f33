#!/usr/bin/env python3
"""Streams (``x-queue-type: stream``) on one node: publish rate with confirms, and the rate at which a consumer
reads the whole stream back from ``x-stream-offset: first`` (from disk, the stream being far deeper than what
Warren keeps in memory), then the same read by a second consumer (the reads take nothing).

Against any broker on ``--port`` (a Warren node, or RabbitMQ 3.10 for comparison); ``--messages`` 100-byte
persistent messages, ``--in-flight`` unconfirmed at most, consumers with prefetch ``--prefetch`` acking every
100.  Usage: ``python benchmarks/stream.py --port 5672 --messages 300000 --runs 3``

``--broker-pid`` adds the broker's CPU time per message of each phase (its process's user and system time).

``--stream-port P`` measures RabbitMQ's stream protocol instead (a Warren node with ``--stream-enabled``, or
RabbitMQ with rabbitmq_stream): ``--clients`` processes each publish their share in frames of ``--batch``
messages with confirms (``--in-flight`` unconfirmed at most), then each reads the whole stream from ``first``
(one credit per chunk, 10 ahead).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amqp_load  # noqa: E402 (after sys.path takes this folder)

BODY = b"x" * 100


def connect(port: int) -> amqp_load.Connection:
    conn = amqp_load.Connection("127.0.0.1", port, "guest", "guest")
    conn.channel_open(1)
    return conn


def run(port: int, messages: int, in_flight: int, prefetch: int, pid: int) -> tuple[float, ...]:
    """(publish rate, its broker CPU per message in us, read rate, its CPU per message, second read rate)."""
    name = f"bench-stream-{uuid.uuid4().hex[:8]}"
    conn = connect(port)
    conn.queue_declare(1, name, durable=True, arguments={"x-queue-type": "stream"})
    conn.confirm_select(1)
    cpu = _cpu(pid)
    result = amqp_load.publish_confirmed(conn, name, BODY, messages, max_unconfirmed=in_flight, timeout=600)
    publish_cpu = _cpu(pid) - cpu
    conn.close()
    if result["nacks"]:
        raise RuntimeError(f"{result['nacks']} nacks")
    reads = []
    for _ in range(2):
        conn = connect(port)
        cpu = _cpu(pid)
        seconds = amqp_load.consume_count(conn, 1, name, messages, prefetch=prefetch, timeout=600,
                                          arguments={"x-stream-offset": "first"})
        reads.append((messages / seconds, (_cpu(pid) - cpu) / messages * 1e6))
        conn.close()
    conn = connect(port)
    conn.queue_delete(1, name)
    conn.close()
    return (messages / result["confirmed_s"], publish_cpu / messages * 1e6, reads[0][0], reads[0][1], reads[1][0])


# -- the stream protocol ----------------------------------------------------------------------------------------

def _frame(key: int, body: bytes) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, 1) + body


def _string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


class StreamClient:
    """A raw stream-protocol client: just what the benchmark sends and reads."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pending: list[tuple[int, bytes]] = []  # frames read past the one expect() waited for
        self.send(_frame(0x11, struct.pack(">Ii", 1, 0)))
        self.expect(0x8011)
        self.send(_frame(0x12, struct.pack(">I", 2)))
        self.expect(0x8012)
        self.send(_frame(0x13, struct.pack(">I", 3) + _string("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest"))
        self.expect(0x8013)
        tune = self.expect(0x14)
        self.send(_frame(0x14, tune))
        self.send(_frame(0x15, struct.pack(">I", 4) + _string("/")))
        self.expect(0x8015)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frames(self):
        """Frames as (key, payload after key and version), from one recv."""
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        self.buf += data
        pos = 0
        out = []
        while len(self.buf) - pos >= 4:
            size = struct.unpack_from(">I", self.buf, pos)[0]
            if len(self.buf) - pos - 4 < size:
                break
            out.append((struct.unpack_from(">H", self.buf, pos + 4)[0], bytes(self.buf[pos + 8:pos + 4 + size])))
            pos += 4 + size
        del self.buf[:pos]
        return out

    def expect(self, key: int) -> bytes:
        while True:
            frames, self.pending = self.pending or self.frames(), []
            for i, (got, payload) in enumerate(frames):
                if got == key:
                    self.pending = frames[i + 1:]
                    return payload

    def request(self, key: int, body: bytes) -> int:
        self.send(_frame(key, struct.pack(">I", 7) + body))
        return struct.unpack_from(">IH", self.expect(key | 0x8000))[1]


def _publisher(port: int, stream: str, count: int, batch: int, in_flight: int, ready, go) -> None:
    client = StreamClient(port)
    assert client.request(0x01, b"\x01" + _string("") + _string(stream)) == 1
    record = struct.pack(">I", len(BODY)) + BODY
    ready.wait()
    go.wait()
    sent = confirmed = 0
    while confirmed < count:
        while sent < count and sent - confirmed < in_flight:
            n = min(batch, count - sent)
            body = b"\x01" + struct.pack(">i", n) + b"".join(struct.pack(">Q", sent + i + 1) + record for i in range(n))
            client.send(_frame(0x02, body))
            sent += n
        for key, payload in client.frames():
            if key == 0x03:
                confirmed += struct.unpack_from(">I", payload, 1)[0]
            elif key == 0x04:
                raise RuntimeError("publish error")


def _reader(port: int, stream: str, count: int, ready, go) -> None:
    client = StreamClient(port)
    subscribe = b"\x01" + _string(stream) + struct.pack(">HHi", 1, 10, 0)
    ready.wait()
    go.wait()
    assert client.request(0x07, subscribe) == 1
    got = 0
    while got < count:
        chunks = 0
        frames, client.pending = client.pending or client.frames(), []
        for key, payload in frames:
            if key == 0x08:
                got += struct.unpack_from(">I", payload, 5)[0]  # the chunk's record count
                chunks += 1
        if chunks:
            client.send(_frame(0x09, b"\x01" + struct.pack(">H", chunks)))


def _cpu(pid: int) -> float:
    if not pid:
        return 0.0
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _phase(target, args_of, clients: int, pid: int) -> tuple[float, float]:
    """Run ``clients`` processes at once: (seconds from the start signal until all ended, broker CPU seconds)."""
    ready = multiprocessing.Barrier(clients + 1)
    go = multiprocessing.Event()
    procs = [multiprocessing.Process(target=target, args=(*args_of(i), ready, go)) for i in range(clients)]
    for proc in procs:
        proc.start()
    ready.wait()
    cpu, started = _cpu(pid), time.monotonic()
    go.set()
    for proc in procs:
        proc.join(600)
        if proc.exitcode != 0:
            raise RuntimeError(f"client exited with {proc.exitcode}")
    return time.monotonic() - started, _cpu(pid) - cpu


def run_stream(port: int, messages: int, clients: int, batch: int, in_flight: int, pid: int) -> tuple[float, ...]:
    stream = f"bench-stream-{uuid.uuid4().hex[:8]}"
    admin = StreamClient(port)
    assert admin.request(0x0D, _string(stream) + struct.pack(">i", 0)) == 1
    share = messages // clients
    publish_s, publish_cpu = _phase(_publisher, lambda i: (port, stream, share, batch, in_flight), clients, pid)
    total = share * clients
    read_s, read_cpu = _phase(_reader, lambda i: (port, stream, total), clients, pid)
    admin.request(0x0E, _string(stream))
    return (total / publish_s, publish_cpu / total * 1e6, total * clients / read_s, read_cpu / (total * clients) * 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--stream-port", type=int, default=0, help="measure the stream protocol on this port")
    parser.add_argument("--clients", type=int, default=4, help="stream protocol: client processes per phase")
    parser.add_argument("--batch", type=int, default=500, help="stream protocol: messages per publish frame")
    parser.add_argument("--broker-pid", type=int, default=0, help="the broker's pid, for its CPU per message")
    args = parser.parse_args()
    if args.stream_port:
        figures = [run_stream(args.stream_port, args.messages, args.clients, args.batch, args.in_flight,
                              args.broker_pid) for _ in range(args.runs)]
        for label, values in zip(("publish, confirmed", "  broker CPU us/msg", "read from first (all readers)",
                                  "  broker CPU us/msg"), zip(*figures)):
            print(f"{label:30s} median {statistics.median(values):>11,.2f}   runs: "
                  + ", ".join(f"{v:,.2f}" for v in values))
        return 0
    figures = [run(args.port, args.messages, args.in_flight, args.prefetch, args.broker_pid) for _ in range(args.runs)]
    for label, values in zip(("publish, confirmed", "  broker CPU us/msg", "read from first", "  broker CPU us/msg",
                              "read again"), zip(*figures)):
        print(f"{label:30s} median {statistics.median(values):>11,.2f}   runs: "
              + ", ".join(f"{v:,.2f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
