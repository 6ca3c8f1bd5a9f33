#!/usr/bin/env python3
"""Raw-socket AMQP 0-9-1 load generator for Warren (and any RabbitMQ-compatible broker).

No client library is used: every frame is hand-encoded with ``struct`` and the
frame parser works on a single growing ``bytearray`` with a read offset (frames
are never sliced out of the buffer on the hot path, and the unread tail is only
moved to the front once per ``recv_into``, so parsing is linear).

Publisher and consumer(s) run in separate processes (``multiprocessing``, fork).
Every run declares its own uniquely named queues / exchange and deletes them at
the end, so runs never interfere with each other.

Workloads
---------
``transient-noack``
    ``--size``-byte (default 100) transient messages to one queue via the
    default exchange; one consumer process with ``no_ack``.  Reports consumed
    msg/s.
``transient-ack``
    Same, but the consumer uses manual acks (prefetch 200) and acks with
    ``multiple=true`` every 50 deliveries.
``transient-confirm``
    As ``transient-ack``, the publisher in confirm mode (at most 1000 unconfirmed): what ``amqp10_load.py``'s
    ``transient-ack`` does with outcomes.  Not part of ``all``.
``fanout4``
    Publish to a fanout exchange bound to 4 queues; 4 consumer processes (one
    per queue), ``no_ack``.  Reports deliveries/s (sum over the 4 queues).
``priority``
    As ``transient-ack``, through a priority queue (``x-max-priority`` 10) with
    each message's ``priority`` drawn at random from 0..10.
``persistent-confirm``
    Persistent (delivery_mode 2) messages to a durable queue; the publisher
    uses publisher confirms with at most 1000 unconfirmed messages in flight;
    the consumer acks manually (prefetch 200).  Reports consumed msg/s.  With large bodies, what is in flight
    is bounded in bytes as well: a send batch and the deliveries between two acks to 4 MiB, the unconfirmed
    and the outstanding messages to 64 MiB.
``latency``
    One message at a time: publish on one connection, wait for the delivery on
    a second connection (both in the same process, ``no_ack``), measure the
    round trip.  Reports p50 / p99 in microseconds over up to 5000 samples
    (bounded by ``--seconds``), after 200 warm-up round trips.

Throughput method: the publisher pipelines batches of messages as fast as the
socket accepts them, but keeps at most ``--window`` (default 20000) messages
outstanding (published minus consumed, the consumers publish their counts in
shared memory), so no unbounded backlog builds up inside the broker.  Broker
flow control (TCP back-pressure) is honoured as well, since the publisher uses
a non-blocking socket.  After all processes are connected the generator runs
for 1 s of warm-up, then measures the consumed count over ``--seconds``.  Each
workload is repeated ``--runs`` times and the median is reported.  A workload
given as ``NAME@SIZE`` (e.g. ``persistent-confirm@4096``) sends ``SIZE``-byte
bodies instead of ``--size``.

Running Warren and RabbitMQ side by side
---------------------------------------
Start Warren on its port (e.g. 5672) and a throwaway RabbitMQ on another
loopback port (``benchmarks/run_rabbitmq.sh`` does this on 5699), then run the
same command against both::

    python benchmarks/amqp_load.py --host 127.0.0.1 --port 5672 --workload all --runs 3
    python benchmarks/amqp_load.py --host 127.0.0.1 --port 5699 --workload all --runs 3

or simply ``benchmarks/run_rabbitmq.sh --workload all --runs 3``.  Add
``--json`` for machine-readable output.  Run the two brokers one after the
other, not concurrently: the load generator and the broker share the CPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import random
import socket
import ssl
import statistics
import struct
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = b"\xce"

WORKLOADS = ["transient-noack", "transient-ack", "priority", "fanout4", "persistent-confirm", "latency"]
NAMED = WORKLOADS + ["transient-confirm"]  # (not in 'all': AMQP 1.0's transient-ack, for amqp10_load.py)

_HDR = struct.Struct("!BHI")
_CM = struct.Struct("!HH")
_U64 = struct.Struct("!Q")

PREFETCH = 200
ACK_EVERY = 50
MAX_UNCONFIRMED = 1000
MAX_PRIORITY = 10
PRIORITY_BATCHES = 16  # distinct pre-encoded batches of random priorities, sent in turn
BATCH = 50
# Large bodies: what is in flight is bounded in bytes too (else 1,000 unconfirmed 16 MiB messages are 16 GB), with
# the counts above as they are for bodies up to 64 KiB: a send batch, the publisher's unconfirmed and outstanding
# messages, and the consumer's deliveries between two acks.
BATCH_BYTES = 4 << 20
IN_FLIGHT_BYTES = 64 << 20
ACK_BYTES = 4 << 20
LATENCY_SAMPLES = 5000
LATENCY_WARMUP = 200
# a non-blocking read or write that has to wait (TLS sockets raise their own kinds)
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class AMQPError(Exception):
    pass


# --------------------------------------------------------------------------
# encoding helpers
# --------------------------------------------------------------------------

def shortstr(s) -> bytes:
    if isinstance(s, str):
        s = s.encode()
    if len(s) > 255:
        raise ValueError("shortstr too long")
    return bytes((len(s),)) + s


def longstr(s) -> bytes:
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("!I", len(s)) + s


def table(d: dict | None) -> bytes:
    out = bytearray()
    for k, v in (d or {}).items():
        out += shortstr(k)
        if isinstance(v, bool):
            out += b"t" + (b"\x01" if v else b"\x00")
        elif isinstance(v, int):
            out += b"l" + struct.pack("!q", v)
        elif isinstance(v, dict):
            out += b"F" + table(v)
        else:
            out += b"S" + longstr(v)
    return struct.pack("!I", len(out)) + bytes(out)


def decode_table(buf, off: int):
    """Decode a field table; returns (dict, new_offset). Best effort, used only
    for the server properties in connection.start."""
    (n,) = struct.unpack_from("!I", buf, off)
    off += 4
    end = off + n
    res = {}
    while off < end:
        kl = buf[off]
        key = bytes(buf[off + 1:off + 1 + kl]).decode(errors="replace")
        off += 1 + kl
        val, off = _decode_value(buf, off)
        res[key] = val
    return res, end


_FIXED = {b"b": "!b", b"B": "!B", b"s": "!h", b"u": "!H", b"I": "!i", b"i": "!I",
          b"l": "!q", b"L": "!Q", b"f": "!f", b"d": "!d", b"T": "!Q"}


def _decode_value(buf, off):
    t = bytes(buf[off:off + 1])
    off += 1
    if t == b"S" or t == b"x":
        (n,) = struct.unpack_from("!I", buf, off)
        v = bytes(buf[off + 4:off + 4 + n])
        return (v.decode(errors="replace") if t == b"S" else v), off + 4 + n
    if t == b"t":
        return bool(buf[off]), off + 1
    if t in _FIXED:
        fmt = _FIXED[t]
        return struct.unpack_from(fmt, buf, off)[0], off + struct.calcsize(fmt)
    if t == b"D":
        return None, off + 5
    if t == b"F":
        return decode_table(buf, off)
    if t == b"A":
        (n,) = struct.unpack_from("!I", buf, off)
        off += 4
        end = off + n
        arr = []
        while off < end:
            v, off = _decode_value(buf, off)
            arr.append(v)
        return arr, end
    if t == b"V":
        return None, off
    raise AMQPError(f"unknown field type {t!r}")


def method_frame(channel: int, cls: int, meth: int, args: bytes = b"") -> bytes:
    return _HDR.pack(FRAME_METHOD, channel, len(args) + 4) + _CM.pack(cls, meth) + args + FRAME_END


def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes,
                   persistent: bool, frame_max: int, priority: int | None = None) -> bytes:
    """basic.publish + content header + body frame(s) for one message."""
    m = method_frame(channel, 60, 40, struct.pack("!H", 0) + shortstr(exchange)
                     + shortstr(routing_key) + b"\x00")
    flags, values = 0, b""
    if persistent:
        flags, values = flags | 0x1000, values + b"\x02"  # delivery-mode 2
    if priority is not None:
        flags, values = flags | 0x0800, values + bytes((priority,))
    props = struct.pack("!H", flags) + values
    hp = struct.pack("!HHQ", 60, 0, len(body)) + props
    h = _HDR.pack(FRAME_HEADER, channel, len(hp)) + hp + FRAME_END
    parts = [m, h]
    chunk = max(1, frame_max - 8) if frame_max else len(body) or 1
    for i in range(0, len(body), chunk):
        piece = body[i:i + chunk]
        parts.append(_HDR.pack(FRAME_BODY, channel, len(piece)) + piece + FRAME_END)
    return b"".join(parts)


def ack_frame(channel: int, tag: int, multiple: bool) -> bytes:
    return method_frame(channel, 60, 80, struct.pack("!QB", tag, 1 if multiple else 0))


# --------------------------------------------------------------------------
# connection
# --------------------------------------------------------------------------

def connect(cfg):
    """A Connection as the command line asked (host, credentials, TLS)."""
    return Connection(cfg["host"], cfg["port"], cfg["user"], cfg["password"], cfg["vhost"], cafile=cfg["tls_ca"])


class Connection:
    """Minimal synchronous AMQP connection with an offset-based frame buffer."""

    def __init__(self, host, port, user, password, vhost="/", timeout=10.0, cafile=None):
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 1 << 20)
            except OSError:
                pass
        if cafile:  # AMQPS: verify the broker against this CA
            sock = ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.buf = bytearray(1 << 20)
        self.start = 0
        self.end = 0
        self.frame_max = 131072
        self.server_properties = {}
        self._handshake(user, password, vhost)

    # -- low level -----------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def fill(self) -> None:
        """Read more bytes into the buffer (compacting / growing as needed)."""
        buf = self.buf
        if self.start == self.end:
            self.start = self.end = 0
        elif len(buf) - self.end < 65536:
            rem = self.end - self.start
            if self.start > 0:
                buf[0:rem] = buf[self.start:self.end]
                self.start, self.end = 0, rem
            if len(buf) - self.end < 65536:
                buf.extend(bytes(len(buf)))
        n = self.sock.recv_into(memoryview(self.buf)[self.end:])
        if n == 0:
            raise AMQPError("connection closed by broker")
        self.end += n

    def poll_frame(self):
        """Non-blocking: the next complete frame already in the buffer as
        (type, channel, payload_start, payload_end), or None."""
        if self.end - self.start >= 7:
            ftype, ch, size = _HDR.unpack_from(self.buf, self.start)
            fend = self.start + 8 + size
            if fend <= self.end:
                if self.buf[fend - 1] != 0xCE:
                    raise AMQPError("bad frame end")
                p0 = self.start + 7
                self.start = fend
                return ftype, ch, p0, fend - 1
        return None

    def next_frame(self):
        """Blocking: return (type, channel, payload_start, payload_end)."""
        while True:
            f = self.poll_frame()
            if f is not None:
                return f
            self.fill()

    def _check_close(self, ch, cls, meth, p0):
        if cls == 10 and meth == 50:
            code, = struct.unpack_from("!H", self.buf, p0 + 4)
            tl = self.buf[p0 + 6]
            text = bytes(self.buf[p0 + 7:p0 + 7 + tl]).decode(errors="replace")
            try:
                self.send(method_frame(0, 10, 51))
            except OSError:
                pass
            raise AMQPError(f"connection closed by broker: {code} {text}")
        if cls == 20 and meth == 40:
            code, = struct.unpack_from("!H", self.buf, p0 + 4)
            tl = self.buf[p0 + 6]
            text = bytes(self.buf[p0 + 7:p0 + 7 + tl]).decode(errors="replace")
            self.send(method_frame(ch, 20, 41))
            raise AMQPError(f"channel {ch} closed by broker: {code} {text}")

    def wait_method(self, channel, cls, meth):
        """Wait for a specific method; returns its args offset in self.buf."""
        while True:
            ftype, ch, p0, p1 = self.next_frame()
            if ftype != FRAME_METHOD:
                continue
            c, m = _CM.unpack_from(self.buf, p0)
            self._check_close(ch, c, m, p0)
            if ch == channel and c == cls and m == meth:
                return p0 + 4

    def rpc(self, channel, cls, meth, args, reply_meth):
        self.send(method_frame(channel, cls, meth, args))
        return self.wait_method(channel, cls, reply_meth)

    # -- handshake -----------------------------------------------------
    def _handshake(self, user, password, vhost):
        self.send(b"AMQP\x00\x00\x09\x01")
        off = self.wait_method(0, 10, 10)  # connection.start
        try:
            self.server_properties, _ = decode_table(self.buf, off + 2)
        except Exception:  # pragma: no cover - cosmetic only
            self.server_properties = {}
        props = table({"product": "warren-amqp-load", "platform": "Python",
                       "capabilities": {"consumer_cancel_notify": True,
                                        "publisher_confirms": True,
                                        "basic.nack": True}})
        resp = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.send(method_frame(0, 10, 11, props + shortstr("PLAIN") + longstr(resp)
                               + shortstr("en_US")))
        off = self.wait_method(0, 10, 30)  # connection.tune
        chmax, fmax, _hb = struct.unpack_from("!HIH", self.buf, off)
        fmax = min(fmax or 131072, 131072)
        self.frame_max = fmax
        self.send(method_frame(0, 10, 31, struct.pack("!HIH", chmax or 2047, fmax, 0)))
        self.rpc(0, 10, 40, shortstr(vhost) + shortstr("") + b"\x00", 41)

    # -- commands ------------------------------------------------------
    def channel_open(self, ch=1):
        self.rpc(ch, 20, 10, shortstr(""), 11)

    def queue_declare(self, ch, name, durable=False, auto_delete=False, exclusive=False, passive=False,
                      arguments=None):
        """queue.declare; returns (message_count, consumer_count) from declare-ok.
        A failed passive declare (404) raises AMQPError and closes the channel."""
        bits = ((1 if passive else 0) | (2 if durable else 0) | (4 if exclusive else 0)
                | (8 if auto_delete else 0))
        off = self.rpc(ch, 50, 10, struct.pack("!H", 0) + shortstr(name) + bytes((bits,)) + table(arguments), 11)
        off += 1 + self.buf[off]  # queue name
        return struct.unpack_from("!II", self.buf, off)

    def queue_delete(self, ch, name):
        self.rpc(ch, 50, 40, struct.pack("!H", 0) + shortstr(name) + b"\x00", 41)

    def exchange_declare(self, ch, name, etype, durable=False, auto_delete=False):
        bits = (2 if durable else 0) | (4 if auto_delete else 0)
        self.rpc(ch, 40, 10, struct.pack("!H", 0) + shortstr(name) + shortstr(etype)
                 + bytes((bits,)) + table(None), 11)

    def exchange_delete(self, ch, name):
        self.rpc(ch, 40, 20, struct.pack("!H", 0) + shortstr(name) + b"\x00", 21)

    def queue_bind(self, ch, queue, exchange, key=""):
        self.rpc(ch, 50, 20, struct.pack("!H", 0) + shortstr(queue) + shortstr(exchange)
                 + shortstr(key) + b"\x00" + table(None), 21)

    def basic_qos(self, ch, prefetch):
        self.rpc(ch, 60, 10, struct.pack("!IHB", 0, prefetch, 0), 11)

    def basic_consume(self, ch, queue, no_ack, tag="c", arguments=None):
        self.rpc(ch, 60, 20, struct.pack("!H", 0) + shortstr(queue) + shortstr(tag)
                 + bytes((2 if no_ack else 0,)) + table(arguments), 21)

    def confirm_select(self, ch):
        self.rpc(ch, 85, 10, b"\x00", 11)

    def close(self, timeout=2.0):
        """Graceful connection.close; never raises."""
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(timeout)
            self.send(method_frame(0, 10, 50, struct.pack("!H", 200) + shortstr("bye")
                                   + struct.pack("!HH", 0, 0)))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                ftype, ch, p0, p1 = self.next_frame()
                if ftype == FRAME_METHOD and ch == 0:
                    c, m = _CM.unpack_from(self.buf, p0)
                    if (c, m) in ((10, 51), (10, 50)):
                        break
        except Exception:
            pass
        finally:
            try:
                self.sock.close()
            except OSError:
                pass


# --------------------------------------------------------------------------
# bulk helpers (single connection, used by backlog.py)
# --------------------------------------------------------------------------

class Confirms:
    """Publisher confirms as they arrive: every tag up to ``hw`` is confirmed (multiple acks), and those in
    ``singles`` above it one by one."""

    __slots__ = ("hw", "singles", "nacks")

    def __init__(self):
        self.hw = 0
        self.singles = set()
        self.nacks = 0

    @property
    def count(self):
        return self.hw + len(self.singles)

    def confirmed(self, tag, multiple, nack=False):
        """basic.ack (or basic.nack) of ``tag``, ``multiple`` or not."""
        if nack:
            self.nacks += max(1, tag - self.hw) if multiple else 1
        if multiple:
            if tag > self.hw:
                self.hw = tag
                if self.singles:
                    self.singles = {t for t in self.singles if t > tag}
        elif tag > self.hw:
            self.singles.add(tag)


def publish_confirmed(conn, queue, body, count, persistent=True,
                      max_unconfirmed=10000, batch=100, timeout=None, progress=None, max_priority=None):
    """Publish ``count`` copies of ``body`` to ``queue`` through the default exchange on channel 1 (already in
    confirm mode) and wait until the broker has confirmed all of them.

    Pipelined: batches of ``batch`` messages are written whenever fewer than
    ``max_unconfirmed`` are outstanding; the socket is non-blocking, so broker
    back-pressure is honoured and confirms are read while publishing.  Returns
    ``{"sent_s", "confirmed_s", "nacks"}`` (seconds from the first publish until
    the last one was written / the last confirm arrived).  ``progress(sent,
    confirmed)`` is called about once a second.  Raises AMQPError on a broker
    close or when ``timeout`` seconds pass.  ``max_priority``: the messages'
    ``priority`` goes round 0..max_priority."""
    levels = [None] if max_priority is None else range(max_priority + 1)
    frames = [publish_frames(1, "", queue, body, persistent, conn.frame_max, priority=level) for level in levels]
    one = frames[0]
    full = memoryview(b"".join(frames[i % len(frames)] for i in range(batch)))
    sock = conn.sock
    old_timeout = sock.gettimeout()
    sock.setblocking(False)
    t0 = time.perf_counter()
    deadline = None if timeout is None else time.monotonic() + timeout
    next_report = time.monotonic() + 1.0
    sent = 0          # messages fully or partially handed to the socket
    confirms = Confirms()
    pending = None    # unsent remainder of the current batch
    poff = 0
    sent_s = None
    unpack_q = struct.Struct("!QB").unpack_from
    try:
        while confirms.count < count:
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise AMQPError(f"publish timeout: {sent} sent, {confirms.count} confirmed")
            if progress is not None and now >= next_report:
                progress(sent, confirms.count)
                next_report = now + 1.0
            can_send = pending is not None or (sent < count and sent - confirms.count + batch <= max_unconfirmed)
            r, w, _ = select.select([sock], [sock] if can_send else [], [], 0.5)
            if r:
                try:
                    conn.fill()
                except WOULD_BLOCK:
                    pass
                while True:
                    f = conn.poll_frame()
                    if f is None:
                        break
                    ftype, fch, p0, _p1 = f
                    if ftype != FRAME_METHOD:
                        continue
                    cls, meth = _CM.unpack_from(conn.buf, p0)
                    if cls == 60 and meth in (80, 120):  # basic.ack / basic.nack
                        tag, bits = unpack_q(conn.buf, p0 + 4)
                        confirms.confirmed(tag, bits & 1, meth == 120)
                    else:
                        conn._check_close(fch, cls, meth, p0)
            if w and can_send:
                if pending is None:
                    n = min(batch, count - sent)
                    pending = full if n == batch else memoryview(one * n)
                    poff = 0
                    sent += n
                try:
                    poff += sock.send(pending[poff:])
                except WOULD_BLOCK:
                    pass
                if poff >= len(pending):
                    pending = None
                    if sent >= count and sent_s is None:
                        sent_s = time.perf_counter() - t0
    finally:
        sock.settimeout(old_timeout)
    return {"sent_s": sent_s if sent_s is not None else time.perf_counter() - t0,
            "confirmed_s": time.perf_counter() - t0, "nacks": confirms.nacks}


def consume_count(conn, ch, queue, count, prefetch=1000, ack_every=100, timeout=None,
                  progress=None, arguments=None):
    """basic.consume on ``queue`` with manual acks (multiple, every ``ack_every``)
    until ``count`` deliveries have arrived; ack the rest, cancel nothing (close
    the connection afterwards).  Returns the elapsed seconds from basic.consume
    until the last ack was written.  Raises AMQPError on timeout."""
    conn.basic_qos(ch, prefetch)
    t0 = time.perf_counter()
    conn.basic_consume(ch, queue, no_ack=False, tag="backlog", arguments=arguments)
    deadline = None if timeout is None else time.monotonic() + timeout
    next_report = time.monotonic() + 1.0
    old_timeout = conn.sock.gettimeout()
    conn.sock.settimeout(1.0)
    got = 0
    unacked = 0
    last_tag = 0
    unpack_q = _U64.unpack_from
    try:
        while got < count:
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise AMQPError(f"consume timeout: {got}/{count} delivered")
            if progress is not None and now >= next_report:
                progress(got)
                next_report = now + 1.0
            try:
                ftype, fch, p0, _p1 = conn.next_frame()
            except socket.timeout:
                continue
            if ftype != FRAME_METHOD:
                continue
            cls, meth = _CM.unpack_from(conn.buf, p0)
            if cls == 60 and meth == 60:  # basic.deliver: ctag, delivery tag, ...
                tl = conn.buf[p0 + 4]
                (last_tag,) = unpack_q(conn.buf, p0 + 5 + tl)
                got += 1
                unacked += 1
                if unacked >= ack_every:
                    conn.send(ack_frame(ch, last_tag, True))
                    unacked = 0
            else:
                conn._check_close(fch, cls, meth, p0)
        if unacked:
            conn.send(ack_frame(ch, last_tag, True))
    finally:
        conn.sock.settimeout(old_timeout)
    return time.perf_counter() - t0


# --------------------------------------------------------------------------
# worker processes
# --------------------------------------------------------------------------

def scaled(count, size, budget):
    """``count`` messages, or as many ``size``-byte ones as ``budget`` bytes hold (at least one)."""
    return max(1, min(count, budget // max(1, size)))


def consumer_proc(cfg, queue, no_ack, counter, ready, stop, errq):
    conn = None
    try:
        conn = connect(cfg)
        conn.channel_open(1)
        ack_every = scaled(ACK_EVERY, cfg["size"], ACK_BYTES)
        if not no_ack:
            conn.basic_qos(1, cfg.get("prefetch", PREFETCH))
        conn.basic_consume(1, queue, no_ack)
        ready.value = 1
        sock = conn.sock
        sock.settimeout(0.2)
        unpack_hdr = _HDR.unpack_from
        unpack_cm = _CM.unpack_from
        unpack_q = _U64.unpack_from
        count = 0
        unacked = 0
        buf = conn.buf
        start, end = conn.start, conn.end
        mv = memoryview(buf)
        while not stop.value:
            # parse every complete frame in the buffer
            while end - start >= 7:
                ftype, ch, size = unpack_hdr(buf, start)
                fend = start + size + 8
                if fend > end:
                    break
                if ftype == 1:
                    cls, meth = unpack_cm(buf, start + 7)
                    if cls == 60 and meth == 60:
                        count += 1
                        if not no_ack:
                            unacked += 1
                            if unacked >= ack_every:
                                tl = buf[start + 11]
                                (tag,) = unpack_q(buf, start + 12 + tl)
                                sock.sendall(ack_frame(1, tag, True))
                                unacked = 0
                    else:
                        conn.start = start
                        conn._check_close(ch, cls, meth, start + 7)
                start = fend
            counter.value = count
            # make room, then read
            if start == end:
                start = end = 0
            elif len(buf) - end < 65536:
                rem = end - start
                buf[0:rem] = buf[start:end]
                start, end = 0, rem
                if len(buf) - end < 65536:
                    buf.extend(bytes(len(buf)))
                    mv = memoryview(buf)
            try:
                n = sock.recv_into(mv[end:])
            except socket.timeout:
                continue
            if n == 0:
                raise AMQPError("connection closed by broker")
            end += n
        conn.start = conn.end = 0
    except Exception as e:  # report to the parent
        errq.put(f"consumer({queue}): {type(e).__name__}: {e}")
        ready.value = -1
    finally:
        if conn is not None:
            conn.close()


@dataclass
class Signals:
    """What a worker process shares with its parent: ``ready`` (1 once set up, -1 on failure), ``go``, ``stop``,
    and the queue its errors go to."""

    ready: Any
    go: Any
    stop: Any
    errq: Any


def _publisher_batches(conn, exchange, routing_key, persistent, prioritised, size, batch_of):
    """The batches a publisher sends in turn: one of ``batch_of`` messages, or with ``prioritised`` several whose
    messages have random priorities."""
    body = os.urandom(size // 2 + 1).hex()[:size].encode()
    if not prioritised:
        return [memoryview(publish_frames(1, exchange, routing_key, body, persistent, conn.frame_max) * batch_of)]
    rng = random.Random(1)
    return [memoryview(b"".join(
        publish_frames(1, exchange, routing_key, body, persistent, conn.frame_max, rng.randint(0, MAX_PRIORITY))
        for _ in range(batch_of)))
        for _ in range(PRIORITY_BATCHES)]


def _read_confirms(conn, sock, mv, start, end, confirms):
    """Read what the broker sent (confirms, or a close, which raises) without blocking; the buffer's new (start,
    end)."""
    buf = conn.buf
    unpack_hdr = _HDR.unpack_from
    unpack_cm = _CM.unpack_from
    while True:
        try:
            n = sock.recv_into(mv[end:])
        except WOULD_BLOCK:
            return start, end
        if n == 0:
            raise AMQPError("connection closed by broker")
        end += n
        while end - start >= 7:
            ftype, ch, size = unpack_hdr(buf, start)
            fend = start + size + 8
            if fend > end:
                break
            if ftype == 1:
                cls, meth = unpack_cm(buf, start + 7)
                if cls == 60 and (meth == 80 or meth == 120):  # ack / nack
                    tag, bits = struct.unpack_from("!QB", buf, start + 11)
                    confirms.confirmed(tag, bits & 1)
                else:
                    conn._check_close(ch, cls, meth, start + 7)
            start = fend
        if start == end:
            start = end = 0
        elif len(buf) - end < 65536:
            rem = end - start
            buf[0:rem] = buf[start:end]
            start, end = 0, rem


def publisher_proc(cfg, exchange, routing_key, persistent, confirm, counters, published, signals, prioritised=False):
    """Publish batches as fast as the consumers (``counters``) keep up with, within the window (and, with
    ``confirm``, the unconfirmed limit), counting into ``published`` until ``signals.stop``."""
    conn = None
    try:
        conn = connect(cfg)
        conn.channel_open(1)
        if confirm:
            conn.confirm_select(1)
        batch_of = scaled(BATCH, cfg["size"], BATCH_BYTES)
        batches = _publisher_batches(conn, exchange, routing_key, persistent, prioritised, cfg["size"], batch_of)
        window = scaled(cfg["window"], cfg["size"], IN_FLIGHT_BYTES)
        unconfirmed = scaled(MAX_UNCONFIRMED, cfg["size"], IN_FLIGHT_BYTES) if confirm else None
        signals.ready.value = 1
        while not signals.go.value:
            if signals.stop.value:
                return
            time.sleep(0.005)
        _publish_until_stopped(conn, batches, batch_of, window, unconfirmed, counters, published, signals.stop)
    except Exception as e:
        signals.errq.put(f"publisher: {type(e).__name__}: {e}")
        signals.ready.value = -1
    finally:
        if conn is not None:
            conn.close()


def _publish_until_stopped(conn, batches, batch_of, window, unconfirmed, counters, published, stop):
    """publisher_proc's loop: ``unconfirmed`` None for a publisher without confirms."""
    sock = conn.sock
    sock.setblocking(False)
    mv = memoryview(conn.buf)
    start = end = 0
    pub = 0
    pending = None       # partially sent batch
    poff = 0
    confirms = Confirms()
    nconsumers = len(counters)
    while not stop.value:
        start, end = _read_confirms(conn, sock, mv, start, end, confirms)
        if pending is not None:
            try:
                poff += sock.send(pending[poff:])
            except WOULD_BLOCK:
                pass
            if poff >= len(pending):
                pending = None
            else:
                select.select([sock], [sock], [], 0.05)
                continue
        consumed = counters[0].value if nconsumers == 1 else min(c.value for c in counters)
        if pub - consumed + batch_of > window or (
                unconfirmed is not None and pub - confirms.count + batch_of > unconfirmed):
            if unconfirmed is None:
                time.sleep(0.001)
            else:
                select.select([sock], [], [], 0.002)  # confirms may come meanwhile
            continue
        batch = batches[(pub // batch_of) % len(batches)]
        try:
            n = sock.send(batch)
        except WOULD_BLOCK:
            n = 0
        pub += batch_of
        published.value = pub
        if n < len(batch):
            pending, poff = batch, n


# --------------------------------------------------------------------------
# workloads
# --------------------------------------------------------------------------

def _uniq(workload):
    return f"warren-bench.{workload}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _wait_ready(flags, procs, errq, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(f.value < 0 for f in flags) or not errq.empty():
            break
        if all(f.value == 1 for f in flags):
            return
        if any(not p.is_alive() for p in procs):
            break
        time.sleep(0.01)
    errs = _drain(errq)
    raise AMQPError("workers failed to start: " + ("; ".join(errs) or "timeout"))


def _drain(errq):
    out = []
    while True:
        try:
            out.append(errq.get_nowait())
        except Exception:
            return out


def _cpu_seconds(pid):
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_throughput(cfg, workload):
    ctx = mp.get_context("fork")
    name = _uniq(workload)
    ctl = connect(cfg)
    ctl.channel_open(1)
    persistent = confirm = False
    no_ack = True
    exchange = ""
    if workload == "fanout4":
        exchange = name + ".fx"
        queues = [f"{name}.q{i}" for i in range(4)]
        ctl.exchange_declare(1, exchange, "fanout")
        for q in queues:
            ctl.queue_declare(1, q, auto_delete=True)
            ctl.queue_bind(1, q, exchange)
        routing_key = ""
    elif workload == "persistent-confirm":
        queues = [name]
        ctl.queue_declare(1, name, durable=True)
        routing_key = name
        persistent = confirm = True
        no_ack = False
    else:
        queues = [name]
        arguments = {"x-max-priority": MAX_PRIORITY} if workload == "priority" else None
        ctl.queue_declare(1, name, auto_delete=True, arguments=arguments)
        routing_key = name
        no_ack = workload == "transient-noack"
        confirm = workload == "transient-confirm"

    stop = ctx.RawValue("b", 0)
    go = ctx.RawValue("b", 0)
    errq = ctx.Queue()
    counters = [ctx.RawValue("q", 0) for _ in queues]
    cready = [ctx.RawValue("b", 0) for _ in queues]
    pready = ctx.RawValue("b", 0)
    published = ctx.RawValue("q", 0)
    procs = []
    result = None
    try:
        for q, c, r in zip(queues, counters, cready):
            p = ctx.Process(target=consumer_proc, args=(cfg, q, no_ack, c, r, stop, errq), daemon=True)
            p.start()
            procs.append(p)
        _wait_ready(cready, procs, errq)
        pp = ctx.Process(target=publisher_proc,
                         args=(cfg, exchange, routing_key, persistent, confirm, counters, published,
                               Signals(pready, go, stop, errq), workload == "priority"), daemon=True)
        pp.start()
        procs.append(pp)
        _wait_ready([pready], procs, errq)
        go.value = 1
        time.sleep(1.0)  # warm-up
        c0, p0, t0 = sum(c.value for c in counters), published.value, time.perf_counter()
        cpu0 = _cpu_seconds(cfg["broker_pid"]) if cfg["broker_pid"] else 0.0
        deadline = t0 + cfg["seconds"]
        peak_rss = _rss(cfg["broker_pid"]) if cfg["broker_pid"] else 0
        while time.perf_counter() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.perf_counter())))
            if cfg["broker_pid"]:
                peak_rss = max(peak_rss, _rss(cfg["broker_pid"]))
            if not errq.empty() or not all(p.is_alive() for p in procs):
                break
        c1, p1, t1 = sum(c.value for c in counters), published.value, time.perf_counter()
        cpu1 = _cpu_seconds(cfg["broker_pid"]) if cfg["broker_pid"] else 0.0
        errs = _drain(errq)
        if errs:
            raise AMQPError("; ".join(errs))
        dt = t1 - t0
        result = {"rate": (c1 - c0) / dt, "publish_rate": (p1 - p0) / dt,
                  "unit": "deliveries/s" if workload == "fanout4" else "msg/s"}
        if cfg["broker_pid"]:  # broker CPU per delivery: comparable however busy the machine is
            result["broker_cpu_us"] = (cpu1 - cpu0) / max(1, c1 - c0) * 1e6
            result["broker_cpu_us_per_mib"] = result["broker_cpu_us"] * (1 << 20) / max(1, cfg["size"])
            result["broker_peak_rss_mib"] = peak_rss / (1 << 20)
    finally:
        stop.value = 1
        for p in procs:
            p.join(5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(2)
        try:
            for q in queues:
                try:
                    ctl.queue_delete(1, q)
                except AMQPError:  # e.g. already auto-deleted: reopen channel
                    ctl.channel_open(1)
            if exchange:
                ctl.exchange_delete(1, exchange)
        except Exception as e:
            print(f"warning: cleanup failed: {e}", file=sys.stderr)
        ctl.close()
    return result


def run_latency(cfg):
    name = _uniq("latency")
    pubc = connect(cfg)
    subc = connect(cfg)
    try:
        pubc.channel_open(1)
        subc.channel_open(1)
        pubc.queue_declare(1, name, auto_delete=True)
        subc.basic_consume(1, name, no_ack=True)
        body = b"x" * cfg["size"]
        frame = publish_frames(1, "", name, body, False, pubc.frame_max)
        psend = pubc.sock.sendall
        next_frame = subc.next_frame
        sbuf = subc.buf
        samples = []
        perf = time.perf_counter_ns
        deadline = time.monotonic() + cfg["seconds"] + 1.0
        total = LATENCY_WARMUP + cfg["latency_samples"]
        for i in range(total):
            t0 = perf()
            psend(frame)
            # wait for deliver + header + full body
            remaining = -1
            while remaining != 0:
                ftype, ch, p0, p1 = next_frame()
                if ftype == FRAME_METHOD:
                    sbuf = subc.buf
                    c, m = _CM.unpack_from(sbuf, p0)
                    if not (c == 60 and m == 60):
                        subc._check_close(ch, c, m, p0)
                elif ftype == FRAME_HEADER:
                    (remaining,) = _U64.unpack_from(subc.buf, p0 + 4)
                elif ftype == FRAME_BODY:
                    remaining -= p1 - p0
            t1 = perf()
            if i >= LATENCY_WARMUP:
                samples.append((t1 - t0) / 1000.0)
            if time.monotonic() > deadline and len(samples) >= 100:
                break
        samples.sort()

        def pct(p):
            return samples[min(len(samples) - 1, int(round(p / 100.0 * (len(samples) - 1))))]
        return {"p50_us": pct(50), "p99_us": pct(99), "p999_us": pct(99.9), "max_us": samples[-1],
                "mean_us": statistics.fmean(samples), "samples": len(samples)}
    finally:
        try:
            pubc.queue_delete(1, name)
        except Exception:
            pass
        subc.close()
        pubc.close()


def _rss(pid):
    """Resident bytes of process ``pid`` now (sampled every 0.1 s over a run: its peak is reported)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def run_workload(cfg, workload):
    if workload == "latency":
        return run_latency(cfg)
    return run_throughput(cfg, workload)


def parse_workload(spec, size):
    """``NAME`` or ``NAME@SIZE``: the workload and its body size in bytes (``size``, i.e. --size, unless given);
    None if ``spec`` names no workload."""
    name, _, at = spec.partition("@")
    if name not in NAMED or (at and not (at.isdigit() and int(at) > 0)):
        return None
    return name, int(at) if at else size


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--vhost", default="/")
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement window per run (after 1 s warm-up)")
    ap.add_argument("--size", type=int, default=100, help="message body size in bytes")
    ap.add_argument("--workload", default="all", help="one of %s, or 'all' (comma list allowed; NAME@SIZE "
                    "runs NAME with SIZE-byte bodies, e.g. persistent-confirm@4096)" % ", ".join(WORKLOADS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=int, default=20000, help="max messages outstanding (published - consumed)")
    ap.add_argument("--prefetch", type=int, default=PREFETCH, help="the consumers' prefetch, with manual acks (200)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tls-ca", metavar="PEM", help="connect with TLS (AMQPS), verifying the broker against this CA")
    ap.add_argument("--broker-pid", type=int, help="also report this (local) broker process's CPU time per delivery")
    ap.add_argument("--latency-samples", type=int, default=LATENCY_SAMPLES,
                    help="round trips the latency workload times (it ends after these or --seconds)")
    args = ap.parse_args(argv)

    if args.workload == "all":
        workloads = list(WORKLOADS)
    else:
        workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
        bad = [w for w in workloads if parse_workload(w, args.size) is None]
        if bad:
            ap.error(f"unknown workload(s): {', '.join(bad)}")
    cfg = {"host": args.host, "port": args.port, "user": args.user, "password": args.password,
           "vhost": args.vhost, "seconds": args.seconds, "size": args.size, "window": args.window,
           "prefetch": args.prefetch,
           "tls_ca": args.tls_ca, "broker_pid": args.broker_pid, "latency_samples": args.latency_samples}

    server = {}
    try:
        probe = connect(cfg)
        sp = probe.server_properties
        server = {"product": sp.get("product"), "version": sp.get("version")}
        probe.close()
    except Exception as e:
        print(f"error: cannot connect to {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2

    results = {}
    exit_code = 0
    for w in workloads:
        name, size = parse_workload(w, args.size)
        runs = []
        error = None
        for i in range(args.runs):
            try:
                runs.append(run_workload({**cfg, "size": size}, name))
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                print(f"error: {w} run {i + 1}: {error}", file=sys.stderr)
                exit_code = 1
                break
            if not args.json:
                print(f"  {w} run {i + 1}/{args.runs}: {_fmt_run(name, runs[-1])}", file=sys.stderr)
        entry = {"runs": runs}
        if error:
            entry["error"] = error
        if runs:
            if name == "latency":
                entry["unit"] = "us"
                entry["p50_us"] = statistics.median(r["p50_us"] for r in runs)
                entry["p99_us"] = statistics.median(r["p99_us"] for r in runs)
            else:
                entry["unit"] = runs[0]["unit"]
                entry["median"] = statistics.median(r["rate"] for r in runs)
                entry["publish_median"] = statistics.median(r["publish_rate"] for r in runs)
                if "broker_cpu_us" in runs[0]:
                    entry["broker_cpu_us_median"] = statistics.median(r["broker_cpu_us"] for r in runs)
        results[w] = entry

    if args.json:
        print(json.dumps({"host": args.host, "port": args.port, "server": server,
                          "seconds": args.seconds, "size": args.size, "runs": args.runs,
                          "window": args.window, "results": results}, indent=2))
    else:
        print(f"broker {args.host}:{args.port}  {server.get('product')} {server.get('version')}  "
              f"size={args.size}B seconds={args.seconds:g} runs={args.runs}")
        print(f"{'workload':<24} {'result (median)':>28}   {'per-run':<}")
        print("-" * 82)
        for w, e in results.items():
            if "error" in e and not e["runs"]:
                print(f"{w:<24} {'ERROR':>28}   {e['error']}")
                continue
            if w.partition("@")[0] == "latency":
                med = f"p50 {e['p50_us']:.0f} us  p99 {e['p99_us']:.0f} us"
                per = ", ".join(f"{r['p50_us']:.0f}/{r['p99_us']:.0f}" for r in e["runs"])
            else:
                med = f"{e['median']:,.0f} {e['unit']}"
                per = ", ".join(f"{r['rate']:,.0f}" for r in e["runs"])
                if "broker_cpu_us_median" in e:
                    per += f"  (broker CPU {e['broker_cpu_us_median']:.1f} us per delivery)"
            print(f"{w:<24} {med:>28}   {per}")
    return exit_code


def _fmt_run(w, r):
    if w == "latency":
        return (f"p50 {r['p50_us']:.0f} us, p99 {r['p99_us']:.0f} us, p99.9 {r['p999_us']:.0f} us, "
                f"max {r['max_us']:.0f} us ({r['samples']} samples)")
    cpu = (f", broker CPU {r['broker_cpu_us']:.1f} us/delivery ({r['broker_cpu_us_per_mib']:,.0f} us/MiB), "
           f"peak RSS {r['broker_peak_rss_mib']:.0f} MiB" if "broker_cpu_us" in r else "")
    return f"{r['rate']:,.0f} {r['unit']} consumed (published {r['publish_rate']:,.0f}/s){cpu}"


if __name__ == "__main__":
    sys.exit(main())
