#!/usr/bin/env python3
"""Raw-frame AMQP 1.0 load: one publishing and one consuming connection in one process, so that the client's own
CPU does not bound the figure (no client library: frames are pre-encoded, replies are scanned, not decoded).

Workload (the AMQP 1.0 twin of ``amqp_load.py``'s ``persistent-confirm``): ``--size``-byte data-section messages
with header ``durable=true`` to a durable queue ``/queues/NAME`` (declared over AMQP 0-9-1 with pika), sent
unsettled with at most ``--window`` awaiting their ``accepted`` disposition (sent once fsynced); the consumer
grants ``--credit`` and accepts every 50 deliveries with one ranged disposition.  Reports consumed msg/s and,
with ``--pid`` (the broker's process), the broker's CPU per message from /proc.

    python benchmarks/amqp10_load.py --port 5698 --seconds 10 --pid $(pgrep -f 'amqp_server --bind')
"""
from __future__ import annotations

import argparse
import os
import selectors
import socket
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amqp_server.stream.amqp10 import (  # noqa: E402
    NULL, binary, boolean, described, encode_list, symbol, uint, utf8, value_at)

HEAD = struct.Struct(">IBBH")


def frame(body: bytes, kind: int = 0) -> bytes:
    return HEAD.pack(8 + len(body), 2, kind, 0) + body


def performative(code: int, *fields: bytes) -> bytes:
    return described(code, encode_list(list(fields)))


def login(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"AMQP\x03\x01\x00\x00" + frame(performative(0x41, symbol("PLAIN"), binary(b"\0guest\0guest")), 1)
                 + b"AMQP\x00\x01\x00\x00" + frame(performative(0x10, utf8(str(uuid.uuid4()))))
                 + frame(performative(0x11, NULL, uint(0), uint(0x7FFFFFFF), uint(0x7FFFFFFF))))
    return sock


def frames(buf: bytearray) -> list[tuple[int, bytes]]:
    """(performative code, frame body) of the complete frames in ``buf``, taken out of it (headers skipped)."""
    found = []
    pos = 0
    while True:
        if buf[pos:pos + 4] == b"AMQP":
            pos += 8
            continue
        if len(buf) - pos < 8:
            break
        size, doff = struct.unpack_from(">IB", buf, pos)
        if len(buf) - pos < size:
            break
        body = bytes(buf[pos + doff * 4:pos + size])
        if len(body) >= 3 and body[0] == 0 and body[1] == 0x53:
            found.append((body[2], body))
        pos += size
    del buf[:pos]
    return found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--credit", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pid", type=int, default=0, help="the broker's pid: report its CPU per message")
    args = parser.parse_args()

    import pika

    queue = f"bench-amqp10-{uuid.uuid4().hex[:8]}"
    admin = pika.BlockingConnection(pika.ConnectionParameters(args.host, args.port))
    admin.channel().queue_declare(queue, durable=True)

    publisher, consumer = login(args.host, args.port), login(args.host, args.port)
    target = described(0x29, encode_list([utf8(f"/queues/{queue}")]))
    source = described(0x28, encode_list([utf8(f"/queues/{queue}")]))
    publisher.sendall(frame(performative(0x12, utf8("p"), uint(0), boolean(False), NULL, NULL, NULL, target)))
    consumer.sendall(frame(performative(0x12, utf8("c"), uint(0), boolean(True), NULL, NULL, source, NULL))
                     + frame(performative(0x13, uint(0), uint(0x7FFFFFFF), uint(0), uint(0x7FFFFFFF), uint(0),
                                          uint(0), uint(args.credit))))
    record = (described(0x70, encode_list([boolean(True)]))
              + described(0x75, binary(os.urandom(args.size))))
    credit = sent = accepted = consumed = settled_upto = 0
    delivery_count = 0
    pub_buf, con_buf = bytearray(), bytearray()
    selector = selectors.DefaultSelector()
    selector.register(publisher, selectors.EVENT_READ, "p")
    selector.register(consumer, selectors.EVENT_READ, "c")
    started = measured_at = time.monotonic()
    cpu_at = cpu_seconds(args.pid) if args.pid else 0.0
    consumed_at = 0
    warm = True
    while time.monotonic() - measured_at < args.seconds or warm:
        if warm and time.monotonic() - started > 1.0:
            warm, measured_at, consumed_at = False, time.monotonic(), consumed
            cpu_at = cpu_seconds(args.pid) if args.pid else 0.0
        batch = min(credit, args.window - (sent - accepted))
        if batch > 0:
            out = bytearray()
            for _ in range(batch):
                tag = struct.pack(">I", sent)
                out += frame(performative(0x14, uint(0), uint(sent), binary(tag), uint(0)) + record)
                sent += 1
            credit -= batch
            publisher.sendall(out)
        for key, _ in selector.select(timeout=0.5):
            sock, buf = (publisher, pub_buf) if key.data == "p" else (consumer, con_buf)
            data = sock.recv(1 << 20)
            if not data:
                raise SystemExit("the broker closed a connection")
            buf += data
            for code, body in frames(buf):
                if key.data == "p" and code == 0x13:  # a flow: the link's credit, if it names the link
                    credit = _link_credit(body, credit)
                elif key.data == "p" and code == 0x15:
                    first, last = _range(body)
                    accepted += last - first + 1
                elif key.data == "c" and code == 0x14:
                    consumed += 1
                    delivery_count += 1
            if key.data == "c" and consumed - settled_upto >= 50:
                consumer.sendall(frame(performative(0x15, boolean(True), uint(settled_upto), uint(consumed - 1),
                                                    boolean(True), described(0x24, b"\x45")))
                                 + frame(performative(0x13, uint(0), uint(0x7FFFFFFF), uint(0), uint(0x7FFFFFFF),
                                                      uint(0), uint(delivery_count), uint(args.credit))))
                settled_upto = consumed
    elapsed = time.monotonic() - measured_at
    count = consumed - consumed_at
    line = f"amqp10 persistent, {args.size} B, window {args.window}: {count / elapsed:,.0f} msg/s consumed"
    if args.pid:
        line += f", broker CPU {(cpu_seconds(args.pid) - cpu_at) / max(count, 1) * 1e6:.1f} us/msg"
    print(line)
    publisher.close()
    consumer.close()
    admin.channel().queue_delete(queue)
    admin.close()


def _range(body: bytes) -> tuple[int, int]:
    """first and last of a disposition the node sent."""
    value, _ = value_at(body)
    fields = value.value[1].value
    first = fields[1].value
    last = fields[2].value if len(fields) > 2 and fields[2].kind != "null" else first
    return first, last


def _link_credit(body: bytes, credit: int) -> int:
    value, _ = value_at(body)
    items = value.value[1].value
    return items[6].value if len(items) > 6 and items[4].kind != "null" else credit


if __name__ == "__main__":
    main()
