#!/usr/bin/env python3
"""Delayed-exchange benchmark: scheduling accuracy with a large number of pending delayed messages.

Starts a throwaway Warren node (loopback, free port, fresh temp dir), declares a
durable ``x-delayed-message`` exchange (``x-delayed-type`` direct) bound to a
durable queue, and starts a consumer process (no-ack) on that queue.  Then:

1. publishes ``--messages`` (1,000,000) persistent (``--transient``: delivery
   mode 1, held in memory) ``--size`` (100) byte messages with publisher
   confirms (at most ``--max-unconfirmed`` (1,000) outstanding), each with
   ``x-delay`` set so that it falls due at a time drawn uniformly from
   [start + ``--lead``, start + ``--lead`` + ``--spread``] (defaults 90 s and
   60 s; the lead must cover the publishing, which is checked); the body carries
   the due time.  Reports the publish rate (messages / time until the last
   confirm) and the broker's RSS with everything pending;
2. the consumer records each delivery's arrival time; lateness is arrival minus
   due time, where the due time is x-delay after the broker read the publish.
   That moment is not visible to a client but lies between the client writing
   the publish and the broker's confirm of it (sent after the fsync), so both
   are reported: ``late_*`` from the write (an upper bound: it includes time the
   publish sat in socket buffers while the broker was busy) and ``late_c_*``
   from the confirm (a lower bound, short of the truth by about one group
   commit).  p50 / p99 / p99.9 / max in ms, plus the broker's peak RSS (sampled
   every 0.5 s from /proc).  The consumer's own delay in reading is included.
   The broker's own figure (``broker_late_*``: due time to routing, from its
   log at shutdown) leaves out delivery and the consumer.  The broker's CPU use
   over the delivery phase (share of one core, and per delivered message) and
   the machine's load average say whether lateness came from the broker's own
   work or from waiting for a CPU.

Output is a table, or JSON with ``--json``.

    /work/main/.venv/bin/python benchmarks/delayed.py --messages 1000000
    /work/main/.venv/bin/python benchmarks/delayed.py --messages 100000 --lead 15 --spread 20
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import select
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from amqp_load import _CM, _HDR, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD, Connection, method_frame, \
    shortstr, table  # noqa: E402 (after sys.path takes this folder)
from backlog import Warren, log, port_open, rss_bytes  # noqa: E402 (after sys.path takes this folder)

EXCHANGE = "warren-bench.delayed"
QUEUE = "warren-bench.delayed-q"
_BODY = struct.Struct("!Ii")  # seq, delay ms


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def delayed_frames(ch: int, delay_ms: int, body: bytes, mode: bytes) -> bytes:
    """basic.publish (headers {x-delay}, delivery mode) + header + one body frame."""
    m = method_frame(ch, 60, 40, struct.pack("!H", 0) + shortstr(EXCHANGE) + shortstr("k") + b"\x00")
    props = struct.pack("!H", 0x2000 | 0x1000) + table({"x-delay": delay_ms}) + mode
    hp = struct.pack("!HHQ", 60, 0, len(body)) + props
    return (m + _HDR.pack(FRAME_HEADER, ch, len(hp)) + hp + FRAME_END
            + _HDR.pack(FRAME_BODY, ch, len(body)) + body + FRAME_END)


@dataclass
class Timeline:
    """Per message, by seq: when it was written, when it was confirmed, and the x-delay it was given (ms)."""

    written: list[float]
    confirmed_at: list[float]
    delays: list[int]

    @classmethod
    def of(cls, count: int) -> Timeline:
        return cls([0.0] * count, [0.0] * count, [0] * count)


def publish(conn: Connection, count: int, size: int, first_due: float, spread: float,
            max_unconfirmed: int, timeline: Timeline, mode: bytes, batch: int = 50) -> float:
    """Publish with confirms, pipelined, filling in ``timeline``; returns seconds until the last confirm.

    A batch's x-delay values are computed just before it is written, and the socket's send buffer is
    small, so a message reaches the broker soon after its delay was reckoned.
    """
    written, confirmed_at, delays = timeline.written, timeline.confirmed_at, timeline.delays
    sock = conn.sock
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.setblocking(False)
    rng = random.Random(1)
    pad = b"x" * max(0, size - _BODY.size)
    sent = confirmed = 0
    pending = memoryview(b"")
    t0 = time.perf_counter()
    next_report = time.monotonic() + 5
    while confirmed < count:
        want_send = len(pending) > 0 or (sent < count and sent - confirmed + batch <= max_unconfirmed)
        r, w, _ = select.select([sock], [sock] if want_send else [], [], 1.0)
        if r:
            try:
                conn.fill()
            except (BlockingIOError, InterruptedError):
                pass
            while (frame := conn.poll_frame()) is not None:
                ftype, fch, p0, _ = frame
                if ftype != FRAME_METHOD:
                    continue
                cls, meth = _CM.unpack_from(conn.buf, p0)
                if cls == 60 and meth == 80:
                    tag, multiple = struct.unpack_from("!QB", conn.buf, p0 + 4)
                    now = time.time()
                    for seq in range(confirmed, tag if multiple else max(confirmed, tag)):
                        confirmed_at[seq] = now
                    confirmed = tag if multiple else max(confirmed, tag)
                else:
                    conn._check_close(fch, cls, meth, p0)
        if w and want_send:
            if not pending:
                parts = []
                now = time.time()
                for seq in range(sent, sent + min(batch, count - sent)):
                    delay = int((first_due + rng.random() * spread - now) * 1000)
                    written[seq], delays[seq] = now, delay
                    parts.append(delayed_frames(1, delay, _BODY.pack(seq, delay) + pad, mode))
                sent += len(parts)
                pending = memoryview(b"".join(parts))
            try:
                pending = pending[sock.send(pending):]
            except (BlockingIOError, InterruptedError):
                pass
        if time.monotonic() >= next_report:
            log(f"published {sent}, confirmed {confirmed}")
            next_report = time.monotonic() + 5
    return time.perf_counter() - t0


def consumer(port: int, count: int, ready, out, timeout: float) -> None:
    """Consume (no-ack) ``count`` messages; send back their arrival times by seq."""
    conn = Connection("127.0.0.1", port, "guest", "guest")
    conn.channel_open(1)
    conn.basic_consume(1, QUEUE, no_ack=True, tag="bench")
    ready.set()
    arrived = [0.0] * count
    got = 0
    conn.sock.settimeout(1.0)
    deadline = time.monotonic() + timeout
    expect_body = False
    while got < count and time.monotonic() < deadline:
        try:
            ftype, _, p0, p1 = conn.next_frame()
        except socket.timeout:
            continue
        if ftype == FRAME_BODY and expect_body:
            arrived[_BODY.unpack_from(conn.buf, p0)[0]] = time.time()
            got += 1
            expect_body = False
        elif ftype == FRAME_METHOD:
            expect_body = _CM.unpack_from(conn.buf, p0) == (60, 60)
    conn.close()
    out.put(arrived)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--lead", type=float, default=90.0, help="seconds from start to the first due time")
    parser.add_argument("--spread", type=float, default=60.0, help="due times spread over this many seconds")
    parser.add_argument("--max-unconfirmed", type=int, default=1000)
    parser.add_argument("--transient", action="store_true",
                        help="delivery mode 1: held in memory, not stored (as RabbitMQ's plugin does)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="warren-delayed-")
    node = Warren(free_port(), tmp, args.python, args.log_level)
    peak = {"rss": 0}
    stop = threading.Event()
    result: dict = {"messages": args.messages, "size": args.size, "lead_s": args.lead, "spread_s": args.spread,
                    "persistent": not args.transient}
    try:
        node.start()
        deadline = time.monotonic() + 30
        while not port_open(node.port):
            node.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("broker did not start")
            time.sleep(0.1)

        def sample() -> None:
            while not stop.wait(0.5):
                pid = node.pid()
                peak["rss"] = max(peak["rss"], (rss_bytes(pid) or 0) if pid else 0)
        threading.Thread(target=sample, daemon=True).start()

        conn = Connection("127.0.0.1", node.port, "guest", "guest")
        conn.channel_open(1)
        conn.rpc(1, 40, 10, struct.pack("!H", 0) + shortstr(EXCHANGE) + shortstr("x-delayed-message")
                 + bytes((2,)) + table({"x-delayed-type": "direct"}), 11)
        conn.queue_declare(1, QUEUE, durable=True)
        conn.queue_bind(1, QUEUE, EXCHANGE, "k")
        conn.confirm_select(1)

        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=consumer, args=(node.port, args.messages, ready, out,
                                                  args.lead + args.spread + 600))
        proc.start()
        ready.wait(30)

        start = time.time()
        log(f"publishing {args.messages} delayed messages, due in [{args.lead:.0f}, {args.lead + args.spread:.0f}] s")
        timeline = Timeline.of(args.messages)
        elapsed = publish(conn, args.messages, args.size, start + args.lead, args.spread, args.max_unconfirmed,
                          timeline, b"\x01" if args.transient else b"\x02")
        result["publish_rate"] = args.messages / elapsed
        result["published_before_first_due"] = time.time() < start + args.lead
        result["rss_all_pending"] = rss_bytes(node.pid() or 0) or 0
        log(f"published at {result['publish_rate']:.0f} msg/s; RSS {result['rss_all_pending'] / 2**20:.0f} MiB; "
            f"waiting for deliveries")
        time.sleep(max(0.0, start + args.lead - time.time()))
        cpu0, wall0, load0 = cpu_seconds(node.pid()), time.time(), os.getloadavg()[0]
        arrived = out.get(timeout=args.lead + args.spread + 900)
        cpu = cpu_seconds(node.pid()) - cpu0
        result["broker_cpu_share_delivering"] = cpu / (time.time() - wall0)
        result["broker_cpu_us_per_delivery"] = cpu / args.messages * 1e6
        result["load_average"] = (load0 + os.getloadavg()[0]) / 2
        proc.join(30)
        conn.close()
        got = [seq for seq, at in enumerate(arrived) if at]
        result["delivered"] = len(got)
        for name, base in (("late", timeline.written), ("late_c", timeline.confirmed_at)):
            late = sorted((arrived[s] - base[s]) * 1000 - timeline.delays[s] for s in got)
            n = len(late)
            for label, p in (("p50", 50), ("p99", 99), ("p999", 99.9)):
                result[f"{name}_{label}_ms"] = late[min(n - 1, int(p / 100 * n))] if n else float("nan")
            result[f"{name}_max_ms"] = late[-1] if n else float("nan")
        result["rss_peak"] = peak["rss"]
        node.stop()
        found = re.findall(r"delayed\s+messages\s+routed:\s+\d+,\s+ms\s+late\s+p50\s+(\d+)\s+p99\s+(\d+)\s+max\s+(\d+)",
                           node.log_text())
        if found:
            result.update(zip(("broker_late_p50_ms", "broker_late_p99_ms", "broker_late_max_ms"),
                              map(int, found[-1])))
    finally:
        stop.set()
        node.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            if key.startswith("rss"):
                value = f"{value / 2**20:.0f} MiB"
            elif isinstance(value, float):
                value = f"{value:.1f}"
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
