#!/usr/bin/env python3
"""Raw-socket AMQP 1.0 load generator: the same workloads as ``amqp_load.py``, spoken in AMQP 1.0.

No client library: the few performatives a sender and a receiver need are encoded here. A batch of transfer
frames is built once, and each message's delivery-id and delivery-tag are patched in place. Incoming frames
are parsed in one buffer. A client library costs more CPU per message than the broker does (python-qpid-proton's
engine about 38 us, its blocking API about 115 us): such a client, not the broker, would set the rate.

Queues are declared over AMQP 0-9-1 (``amqp_load.Connection``), so the script runs unchanged against
Warren, RabbitMQ 4.x and RabbitMQ 3.10 with ``rabbitmq_amqp1_0``.  ``--addresses v2`` (default) uses
``/queues/NAME`` (RabbitMQ 4.x, Warren).  ``--addresses v1`` uses ``/amq/queue/NAME`` (the 3.x plugin's form).

Workloads (``--size``-byte bodies in one data section):

``transient-settled``
    Pre-settled transfers both ways (at most once).
``transient-ack``
    Unsettled transfers: the broker answers each with ``accepted``. The receiver accepts in ranges
    (a settled disposition every ``ACK_EVERY`` deliveries) and tops up its credit as it goes.
``persistent-confirm``
    As ``transient-ack``, with durable messages (header section, ``durable`` true) to a durable queue: the broker's
    ``accepted`` comes after its fsync, as 0-9-1's confirm does.

The publisher keeps at most ``--window`` messages outstanding (sent minus received) and at most
``UNSETTLED`` unsettled, and sends only within the link credit the broker grants. ``--broker-pid`` adds the
broker's CPU time per message (user and system, from /proc).  Compare with ``amqp_load.py`` on the same
workload for 0-9-1 (``transient-noack``, ``transient-confirm`` and ``persistent-confirm`` are this script's three)::

    python benchmarks/amqp10_load.py --port 5672 --broker-pid PID --workload all
    python benchmarks/amqp_load.py --port 5672 --broker-pid PID \
        --workload transient-noack,transient-confirm,persistent-confirm
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import socket
import statistics
import struct
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from amqp_load import Connection, _cpu_seconds  # noqa: E402  (a sibling script, not a package)

WORKLOADS = ("transient-settled", "transient-ack", "persistent-confirm")
CREDIT = 1000  # what the receiver grants; topped up when half is used
ACK_EVERY = 100  # deliveries a receiver's disposition settles at once
UNSETTLED = 1000  # publishes awaiting their outcome at most
BATCH = 100  # transfers built and sent at once

# -- the AMQP 1.0 types used here -----------------------------------------------------------------------

NULL, TRUE, FALSE = b"\x40", b"\x41", b"\x42"


def uint(v: int) -> bytes:
    return b"\x70" + struct.pack(">I", v)


def ubyte(v: int) -> bytes:
    return b"\x50" + bytes((v,))


def string(s: str) -> bytes:
    data = s.encode()
    return b"\xa1" + bytes((len(data),)) + data if len(data) < 256 else b"\xb1" + struct.pack(">I", len(data)) + data


def symbol(s: str) -> bytes:
    return b"\xa3" + bytes((len(s),)) + s.encode()


def binary(b: bytes) -> bytes:
    return b"\xa0" + bytes((len(b),)) + b if len(b) < 256 else b"\xb0" + struct.pack(">I", len(b)) + b


def described(code: int, *fields: bytes) -> bytes:
    """A described list (a performative, a section, an outcome): list32 always, simple to patch and to read."""
    body = b"".join(fields)
    return b"\x00\x53" + bytes((code,)) + b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body


def frame(performative: bytes, channel: int = 0, payload: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">IBBH", 8 + len(performative) + len(payload), 2, kind, channel) + performative + payload


OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
ACCEPTED = described(0x24)


def read_value(buf: bytes | bytearray | memoryview, pos: int) -> tuple[object, int]:
    """The value at ``pos`` and where it ends: what a broker's flow, disposition, transfer and attach carry."""
    code = buf[pos]
    pos += 1
    if code == 0x00:  # described: the descriptor, then the value (returned as (code, value))
        descriptor, pos = read_value(buf, pos)
        value, pos = read_value(buf, pos)
        return (descriptor, value), pos
    if code in (0x40, 0x45):
        return None if code == 0x40 else [], pos
    if code in (0x41, 0x42):
        return code == 0x41, pos
    if code == 0x56:
        return bool(buf[pos]), pos + 1
    if code in (0x43, 0x44):
        return 0, pos
    if code in (0x50, 0x51, 0x52, 0x53, 0x54, 0x55):
        return buf[pos], pos + 1
    if code in (0x60, 0x61):
        return struct.unpack_from(">H", buf, pos)[0], pos + 2
    if code in (0x70, 0x71, 0x72, 0x73):
        return struct.unpack_from(">I", buf, pos)[0], pos + 4
    if code in (0x80, 0x81, 0x82, 0x83):
        return struct.unpack_from(">Q", buf, pos)[0], pos + 8
    if code in (0x98,):
        return bytes(buf[pos:pos + 16]), pos + 16
    if code in (0xa0, 0xa1, 0xa3):
        n = buf[pos]
        return bytes(buf[pos + 1:pos + 1 + n]), pos + 1 + n
    if code in (0xb0, 0xb1, 0xb3):
        n = struct.unpack_from(">I", buf, pos)[0]
        return bytes(buf[pos + 4:pos + 4 + n]), pos + 4 + n
    if code in (0xc0, 0xc1, 0xd0, 0xd1):  # list or map: its items (a map's as a flat list)
        wide = code >= 0xd0
        size, count = struct.unpack_from(">II" if wide else ">BB", buf, pos)
        pos += 8 if wide else 2
        items = []
        for _ in range(count):
            item, pos = read_value(buf, pos)
            items.append(item)
        return items, pos
    if code in (0xe0, 0xf0):  # array: skipped whole
        size = buf[pos] if code == 0xe0 else struct.unpack_from(">I", buf, pos)[0]
        return None, pos + (1 if code == 0xe0 else 4) + size
    raise ValueError(f"type 0x{code:02x} not read by this generator")


def transfer_ids(buf: bytearray, start: int) -> list:
    """A transfer's handle and delivery-id (None when absent), read without the generic decoder: a receiver's
    own CPU per message must stay well below the broker's, or it, not the broker, sets the rate."""
    list8 = buf[start + 3] == 0xC0
    count = buf[start + 5] if list8 else struct.unpack_from(">I", buf, start + 8)[0]
    at = start + (6 if list8 else 12)
    ids: list = [None, None]
    for i in range(min(count, 2)):
        code = buf[at]
        if code == 0x70:
            ids[i] = struct.unpack_from(">I", buf, at + 1)[0]
            at += 5
        elif code == 0x52:
            ids[i] = buf[at + 1]
            at += 2
        else:  # 0x43 (zero) or 0x40 (null)
            ids[i] = 0 if code == 0x43 else None
            at += 1
    return ids


class Client:
    """One AMQP 1.0 connection with one session (channel 0): SASL PLAIN, then links on it."""

    def __init__(self, host: str, port: int, user: str, password: str, vhost: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.sock.sendall(b"AMQP\x03\x01\x00\x00")
        self._expect_header(b"AMQP\x03\x01\x00\x00")
        self._next()  # sasl-mechanisms
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.sock.sendall(frame(described(0x41, symbol("PLAIN"), binary(response)), kind=1))
        code, fields = self._next()
        if code != 0x44 or fields[0] != 0:
            raise ConnectionError(f"SASL refused: {fields}")
        self.sock.sendall(b"AMQP\x00\x01\x00\x00")
        self._expect_header(b"AMQP\x00\x01\x00\x00")
        self.sock.sendall(frame(described(OPEN, string(f"bench-{uuid.uuid4().hex[:8]}"), string(f"vhost:{vhost}"),
                                          uint(1 << 20), b"\x60\x00\x01", NULL)))
        self.sock.sendall(frame(described(BEGIN, NULL, uint(0), uint(1 << 30), uint(1 << 30), uint(16))))
        self.wait_for(OPEN)
        self.wait_for(BEGIN)

    def _expect_header(self, header: bytes) -> None:
        while len(self.buf) < 8:
            self._fill()
        if bytes(self.buf[:8]) != header:
            raise ConnectionError(f"protocol header {bytes(self.buf[:8])!r}")
        del self.buf[:8]

    def _fill(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the broker closed the connection")
        self.buf += data

    def frames(self) -> list[tuple[int, list, int, int]]:
        """The complete frames read: (performative code, fields, payload start, frame end) in ``self.buf``."""
        out = []
        pos = self._pos = getattr(self, "_pos", 0)
        buf = self.buf
        while len(buf) - pos >= 8:
            size, doff = struct.unpack_from(">IB", buf, pos)
            if len(buf) - pos < size:
                break
            start = pos + doff * 4
            if start == pos + size:  # an empty frame (heartbeat)
                pos += size
                continue
            if buf[start + 2] == TRANSFER:  # a delivery: its handle and delivery-id alone are read
                out.append((TRANSFER, transfer_ids(buf, start), -1, pos + size))
            else:
                (code, fields), end = read_value(buf, start)
                out.append((code, fields, end, pos + size))
            pos += size
        self._pos = pos
        return out

    def consumed(self) -> None:
        """The frames returned by ``frames`` are done with: their bytes go."""
        del self.buf[:self._pos]
        self._pos = 0

    def _next(self) -> tuple[int, list]:
        while True:
            got = self.frames()
            if got:
                code, fields, _, end = got[0]
                del self.buf[:end]
                self._pos = 0
                if code in (CLOSE, END, DETACH) and fields and fields[-1]:
                    raise ConnectionError(f"refused: {fields}")
                return code, fields
            self._fill()

    def wait_for(self, code: int) -> list:
        while True:
            got, fields = self._next()
            if got == code:
                return fields

    def attach(self, name: str, handle: int, receiver: bool, address: str, settled: bool) -> None:
        source = described(0x28, string(address) if receiver else NULL)
        target = described(0x29, NULL if receiver else string(address))
        self.sock.sendall(frame(described(ATTACH, string(name), uint(handle), TRUE if receiver else FALSE,
                                          ubyte(1 if settled else 0), ubyte(0), source, target, NULL, FALSE,
                                          NULL if receiver else uint(0))))
        self.wait_for(ATTACH)


def flow(handle: int, delivery_count: int, credit: int, next_in: int) -> bytes:
    return frame(described(FLOW, uint(next_in), uint(1 << 30), uint(0), uint(1 << 30), uint(handle),
                           uint(delivery_count), uint(credit)))


def transfer_batch(handle: int, body: bytes, settled: bool, durable: bool) -> tuple[bytearray, list[int]]:
    """``BATCH`` transfer frames of one message each, and where each one's delivery-id and tag (u32s) sit."""
    sections = (described(0x70, TRUE) if durable else b"") + b"\x00\x53\x75" + binary(body)
    one = frame(described(TRANSFER, uint(handle), uint(0), binary(b"\0\0\0\0"), uint(0), TRUE if settled else FALSE),
                payload=sections)
    id_at = 8 + 3 + 9 + 5 + 1  # frame head, descriptor, list32 head, the handle's uint, the delivery-id's code
    tag_at = one.index(b"\xa0\x04\x00\x00\x00\x00") + 2
    return bytearray(one * BATCH), [i * len(one) for i in range(BATCH)] + [id_at, tag_at]


def publisher(cfg: dict, address: str, workload: str, counters: list, ready: Any, stop: Any,
              errors: Any) -> None:
    try:
        settled = workload == "transient-settled"
        client = Client(cfg["host"], cfg["port"], cfg["user"], cfg["password"], cfg["vhost"])
        client.attach("bench-sender", 0, False, address, settled)
        credit = 0
        batch, layout = transfer_batch(0, b"x" * cfg["size"], settled, workload == "persistent-confirm")
        starts, id_at, tag_at = layout[:BATCH], layout[BATCH], layout[BATCH + 1]
        sent = accepted = 0
        ready.value = 1
        client.sock.setblocking(False)
        pending = memoryview(b"")
        while not stop.value:
            if select.select([client.sock], [client.sock] if pending else [], [], 0.002)[0]:
                client._fill()
            for code, fields, _, _ in client.frames():  # (the attach may have left a flow read already)
                if code == FLOW and len(fields) > 6 and fields[4] == 0:
                    # the receiving end's delivery-count (none: ours, from 0) plus its credit, less what was sent
                    credit = (fields[5] or 0) + (fields[6] or 0) - sent
                elif code == DISPOSITION and fields[0]:  # the broker's, as the link's receiver
                    accepted += fields[2] - fields[1] + 1 if fields[2] is not None else 1
                elif code in (CLOSE, END, DETACH):
                    raise ConnectionError(f"the broker ended the link: {fields}")
            client.consumed()
            if pending:
                try:
                    pending = pending[client.sock.send(pending):]
                except BlockingIOError:
                    pass
                continue
            room = min(BATCH, credit, cfg["window"] - (sent - counters[0].value),
                       BATCH if settled else UNSETTLED - (sent - accepted))
            if room <= 0:
                continue
            for k in range(room):
                struct.pack_into(">I", batch, starts[k] + id_at, sent + k)
                struct.pack_into(">I", batch, starts[k] + tag_at, sent + k)
            sent += room
            credit -= room
            pending = memoryview(bytes(batch[:starts[1] * room]))
    except Exception as exc:  # told to the parent, which reports it
        errors.put(f"publisher: {type(exc).__name__}: {exc}")
        ready.value = -1


def receiver(cfg: dict, address: str, workload: str, counter: Any, ready: Any, stop: Any,
             errors: Any) -> None:
    try:
        settled = workload == "transient-settled"
        client = Client(cfg["host"], cfg["port"], cfg["user"], cfg["password"], cfg["vhost"])
        client.attach("bench-receiver", 1, True, address, settled)
        client.sock.sendall(flow(1, 0, CREDIT, 0))
        granted = CREDIT  # up to this delivery count
        count = first = 0
        ready.value = 1
        client.sock.settimeout(0.2)
        while not stop.value:
            try:
                client._fill()
            except socket.timeout:
                continue
            transfers = 0
            last = None
            for code, fields, _, _ in client.frames():
                if code == TRANSFER:
                    transfers += 1
                    if fields[1] is not None:
                        last = fields[1]
                elif code in (CLOSE, END, DETACH):
                    raise ConnectionError(f"the broker ended the link: {fields}")
            client.consumed()
            count += transfers
            counter.value = count
            out = b""
            if not settled and last is not None and last - first + 1 >= ACK_EVERY:
                out += frame(described(DISPOSITION, TRUE, uint(first), uint(last), TRUE, ACCEPTED))
                first = last + 1
            if granted - count < CREDIT // 2:
                out += flow(1, count, CREDIT, count)
                granted = count + CREDIT
            if out:
                client.sock.sendall(out)
    except Exception as exc:
        errors.put(f"receiver: {type(exc).__name__}: {exc}")
        ready.value = -1


def run(cfg: dict, workload: str) -> dict:
    name = f"warren-bench-amqp10.{workload}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    control = Connection(cfg["host"], cfg["port"], cfg["user"], cfg["password"], cfg["vhost"])
    control.channel_open(1)
    control.queue_declare(1, name, durable=workload == "persistent-confirm")
    address = f"/queues/{name}" if cfg["addresses"] == "v2" else f"/amq/queue/{name}"
    ctx = mp.get_context("fork")
    stop = ctx.Value("b", 0)
    errors: Any = ctx.Queue()
    counter = ctx.Value("q", 0)
    flags = [ctx.Value("b", 0), ctx.Value("b", 0)]
    procs = [ctx.Process(target=receiver, args=(cfg, address, workload, counter, flags[0], stop, errors)),
             ctx.Process(target=publisher, args=(cfg, address, workload, [counter], flags[1], stop, errors))]
    procs[0].start()
    while not flags[0].value and procs[0].is_alive():
        time.sleep(0.01)
    procs[1].start()
    deadline = time.monotonic() + 20
    while not all(f.value for f in flags) and time.monotonic() < deadline and all(p.is_alive() for p in procs):
        time.sleep(0.01)
    result: dict = {}
    try:
        if any(f.value != 1 for f in flags):
            raise RuntimeError("; ".join(_drained(errors)) or "a process did not start")
        time.sleep(1.0)  # warm-up
        c0, t0 = counter.value, time.monotonic()
        cpu0 = _cpu_seconds(cfg["broker_pid"]) if cfg["broker_pid"] else 0.0
        time.sleep(cfg["seconds"])
        c1, t1 = counter.value, time.monotonic()
        result["rate"] = (c1 - c0) / (t1 - t0)
        if cfg["broker_pid"]:
            result["broker_cpu_us"] = (_cpu_seconds(cfg["broker_pid"]) - cpu0) / max(1, c1 - c0) * 1e6
        failures = _drained(errors)
        if failures:
            raise RuntimeError("; ".join(failures))
    finally:
        stop.value = 1
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        control.queue_delete(1, name)
        control.close()
    return result


def _drained(errors: Any) -> list[str]:
    out = []
    while True:
        try:
            out.append(errors.get_nowait())
        except Exception:
            return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("--vhost", default="/")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (after 1 s warm-up)")
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", type=int, default=20000, help="messages outstanding (sent - received) at most")
    parser.add_argument("--workload", default="all", help=f"comma separated: {', '.join(WORKLOADS)}, or all")
    parser.add_argument("--addresses", choices=("v1", "v2"), default="v2",
                        help="v2: /queues/NAME (RabbitMQ 4.x, Warren); v1: /amq/queue/NAME (RabbitMQ 3.x)")
    parser.add_argument("--broker-pid", type=int, default=0, help="the broker's pid, for its CPU per message")
    args = parser.parse_args(argv)
    cfg = {"host": args.host, "port": args.port, "user": args.user, "password": args.password, "vhost": args.vhost,
           "seconds": args.seconds, "size": args.size, "window": args.window, "addresses": args.addresses,
           "broker_pid": args.broker_pid}
    workloads = WORKLOADS if args.workload == "all" else tuple(args.workload.split(","))
    print(f"AMQP 1.0 {args.host}:{args.port}  size={args.size}B seconds={args.seconds} runs={args.runs}")
    for workload in workloads:
        runs = [run(cfg, workload) for _ in range(args.runs)]
        line = f"{workload:24} {statistics.median(r['rate'] for r in runs):>12,.0f} msg/s"
        line += "  runs: " + ", ".join(f"{r['rate']:,.0f}" for r in runs)
        if args.broker_pid:
            line += f"  (broker CPU {statistics.median(r['broker_cpu_us'] for r in runs):.1f} us per message)"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
