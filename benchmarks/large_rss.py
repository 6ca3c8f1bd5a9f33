#!/usr/bin/env python3
"""Peak RSS of a Warren node that takes and delivers large persistent messages: is its memory bounded by the
frames in flight, not by the bodies in flight?

Starts a throwaway node (its data in a temp dir, removed at the end), declares a durable classic queue, then

1. publishes ``--messages`` (100) persistent ``--size`` (16 MiB) messages with publisher confirms, at most
   ``--window`` (4) unconfirmed (the raw client of ``amqp_load.py``);
2. with ``--restart``, stops the node (SIGTERM) and starts it again on its data: the messages are recovered;
3. takes them all with one pika consumer: ``--mode ack`` (prefetch ``--prefetch``, 100, manual acks: it acks
   none until it holds as many as its prefetch lets it, then all of them), ``noack`` (a no-ack consumer), or
   ``get`` (basic.get with acks, each acked at once); every body is checked octet for octet.  With ``--amqp10``,
   one AMQP 1.0 receiver (Qpid Proton) takes them instead: link credit ``--prefetch``, frames of
   ``--frame-max`` octets; ``ack`` accepts none until it holds as many as its credit lets it, ``noack``
   receives them pre-settled (``get`` has no AMQP 1.0 counterpart).  With ``--dead-letter``, the queue
   dead-letters to ``large-rss-dead``: ``ack`` rejects (nacks without requeue) where it would ack, and the
   dead letters are then taken from there with acks, as ``--mode ack`` does.  With ``--http``, the management
   API's ``POST /api/queues/%2F/large-rss/get`` takes them instead, ``--prefetch`` at a time (``ackmode``
   ``ack_requeue_false`` for ``noack``, else ``reject_requeue_false``; ``--truncate``: its ``truncate``).
   With ``--peek``, Warren's ``GET /api/queues/%2F/large-rss/peek`` reads them all first, ``--prefetch`` at a
   time (``--truncate``: its ``truncate``), its peak ``peek_peak_mib``; they are then taken as above.
   With ``--remote``, two nodes make a cluster (with an etcd of their own, ``etcd`` on the PATH): the queue is
   the first's, and the messages are taken through the second (its link to the first), whose peak is
   ``take_peak_mib``; the first's is ``owner_take_peak_mib``.  With ``--quorum``, the queue is a quorum queue
   (of the one node, or of the first with ``--remote``); ``--modify`` (with ``--amqp10``) settles each with a
   modified outcome that sets an annotation first (requeued with it), then takes them again.  With
   ``--stream``, it is a stream, read from its first offset (by an AMQP 0-9-1 consumer, ``--mode ack``, or an
   AMQP 1.0 receiver; of the first node, read through the second with ``--remote``).

The node's peak RSS (``VmHWM``, reset between the phases through ``/proc/PID/clear_refs``) is reported for each
phase, with its RSS when idle before it::

    .venv/bin/python benchmarks/large_rss.py
    .venv/bin/python benchmarks/large_rss.py --restart --mode noack --messages 50
    .venv/bin/python benchmarks/large_rss.py --amqp10
    .venv/bin/python benchmarks/large_rss.py --dead-letter --messages 50
    .venv/bin/python benchmarks/large_rss.py --http --prefetch 10 --messages 20 [--truncate 100]
    .venv/bin/python benchmarks/large_rss.py --peek --prefetch 10 --messages 20 [--truncate 100] [--quorum]
    .venv/bin/python benchmarks/large_rss.py --remote --messages 30 [--mode get]
    .venv/bin/python benchmarks/large_rss.py --quorum [--restart] [--mode noack|get] [--amqp10 [--modify]]
    .venv/bin/python benchmarks/large_rss.py --stream [--restart] [--amqp10] [--remote]
"""
from __future__ import annotations

import argparse
import base64
import json
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pika

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import etcd_local  # noqa: E402  # (beside this script)
from amqp_load import Connection, publish_frames  # noqa: E402  # (the load generator beside this script)

MIB = 1 << 20
QUEUE = "large-rss"
DEAD = "large-rss-dead"


def body(size: int, number: int) -> bytes:
    """``size`` octets of a counter that starts at ``number``: no two messages alike, nor two places in one."""
    return np.arange(number, number + size // 8 + 1, dtype=">u8").tobytes()[:size]


def status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure in bytes (``VmRSS``, ``VmHWM``)."""
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Etcd:
    """An etcd of the benchmark's own, for ``--remote``'s cluster."""

    def __init__(self, data: Path) -> None:
        self.port = free_port()
        url, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{free_port()}"
        if shutil.which("etcd") is None:
            raise RuntimeError("--remote needs etcd on the PATH")
        self.proc = subprocess.Popen(etcd_local.command("large-rss", str(data), url, peer),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not etcd_local.healthy(url, 30):
            self.stop()
            raise TimeoutError("etcd did not become healthy")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Node:
    def __init__(self, data: Path, port: int, mgmt_port: int = 0, extra: tuple[str, ...] = ()) -> None:
        self.data, self.port, self.mgmt_port = data, port, mgmt_port  # (mgmt_port 0: no management API)
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.data.parent / "broker.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", str(self.port),
             *(("--mgmt-port", str(self.mgmt_port)) if self.mgmt_port else ("--mgmt-enabled", "false")),
             "--log-level", "WARNING", "--data-dir", str(self.data), *self.extra],
            cwd=HERE.parent, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("the node exited") from None
                time.sleep(0.1)
        raise TimeoutError("the node did not listen")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def publish(port: int, queue: str, count: int, size: int, window: int, dead_letter: bool = False,
            queue_type: str = "classic") -> float:
    """Publish with confirms, at most ``window`` unconfirmed; the seconds it took.  ``dead_letter``: the queue
    dead-letters to ``DEAD``, declared too; ``queue_type``: its x-queue-type."""
    conn = Connection("127.0.0.1", port, "guest", "guest")
    conn.channel_open(1)
    arguments: dict[str, str] = {"x-queue-type": queue_type} if queue_type != "classic" else {}
    if dead_letter:
        conn.queue_declare(1, DEAD, durable=True)
        arguments |= {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": DEAD}
    conn.queue_declare(1, queue, durable=True, arguments=arguments or None)
    conn.confirm_select(1)
    started = time.monotonic()
    sent = confirmed = 0
    sock = conn.sock
    sock.setblocking(False)
    pending = memoryview(b"")
    while confirmed < count:
        if not pending and sent < count and sent - confirmed < window:
            pending = memoryview(publish_frames(1, "", queue, body(size, sent), True, conn.frame_max))
            sent += 1
        readable, writable, _ = select.select([sock], [sock] if pending else [], [], 1.0)
        if writable and pending:
            try:
                pending = pending[sock.send(pending):]
            except BlockingIOError:
                pass
        if readable:
            try:
                conn.fill()
            except BlockingIOError:
                continue
            while (frame := conn.poll_frame()) is not None:
                ftype, _channel, p0, _p1 = frame
                cls, meth = struct.unpack_from("!HH", conn.buf, p0)
                if ftype == 1 and (cls, meth) == (60, 80):
                    tag, multiple = struct.unpack_from("!QB", conn.buf, p0 + 4)
                    confirmed = tag if multiple & 1 else confirmed + 1
                elif ftype == 1:
                    raise RuntimeError(f"unexpected method {cls}.{meth}")
    sock.setblocking(True)
    conn.close()
    return time.monotonic() - started


def take(port: int, queue: str, count: int, size: int, mode: str, prefetch: int, timeout: float,
         reject: bool = False, stream: bool = False) -> float:
    """Take ``count`` messages as ``mode`` says, checking each body; the seconds it took.  ``reject``: nacked
    without requeue (dead-lettered) where they would be acked; ``stream``: read from the stream's first offset."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    channel = connection.channel()
    started = time.monotonic()
    deadline = started + timeout
    got = 0
    last_tag = 0

    def settle(tag: int, multiple: bool) -> None:
        if reject:
            channel.basic_nack(tag, multiple=multiple, requeue=False)
        else:
            channel.basic_ack(tag, multiple=multiple)

    def check(data: bytes) -> None:
        nonlocal got
        if data != body(size, got):
            raise AssertionError(f"message {got}: its body differs")
        got += 1

    if mode == "get":
        while got < count and time.monotonic() < deadline:
            method, _properties, data = channel.basic_get(queue, auto_ack=False)
            if method is None or data is None:
                time.sleep(0.05)
                continue
            check(data)
            settle(method.delivery_tag or 0, False)
    else:
        channel.basic_qos(prefetch_count=prefetch)

        def on_message(channel, method, _properties, data: bytes) -> None:
            nonlocal last_tag
            check(data)
            last_tag = method.delivery_tag
            if mode == "ack" and got % prefetch == 0:  # (it holds as many as its prefetch lets it, then acks)
                settle(last_tag, True)

        channel.basic_consume(queue, on_message, auto_ack=mode == "noack",
                              arguments={"x-stream-offset": "first"} if stream else None)
        while got < count and time.monotonic() < deadline:
            connection.process_data_events(0.1)
        if mode == "ack" and got % prefetch:
            settle(last_tag, True)
    if got < count:
        raise TimeoutError(f"{got} of {count} taken")
    elapsed = time.monotonic() - started
    connection.close()
    return elapsed


def take_http(port: int, queue: str, count: int, size: int, mode: str, batch: int, timeout: float,
              truncate: int | None, peek: bool = False) -> float:
    """``take`` by the management API's "get messages", ``batch`` a request, each payload checked (its first
    ``truncate`` octets with ``--truncate``); ``peek``: read by Warren's peek instead, none taken."""
    request = {"count": batch, "ackmode": "ack_requeue_false" if mode == "noack" else "reject_requeue_false",
               "encoding": "base64"}
    if truncate is not None:
        request["truncate"] = truncate
    auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
    started = time.monotonic()
    got = 0
    while got < count:
        url = f"http://127.0.0.1:{port}/api/queues/%2F/{queue}/"
        answer = urllib.request.urlopen(
            urllib.request.Request(url + "peek?" + urllib.parse.urlencode({**request, "offset": got}), headers=auth)
            if peek else urllib.request.Request(url + "get", json.dumps(request).encode(),
                                                {"Content-Type": "application/json", **auth}), timeout=timeout)
        items = json.load(answer)
        if not items:
            raise RuntimeError(f"{got} of {count} got, then none")
        for item in items:
            expected = body(size, got)[:truncate]
            if item["payload_bytes"] != size or base64.b64decode(item["payload"]) != expected:
                raise AssertionError(f"message {got}: its payload differs")
            got += 1
    return time.monotonic() - started


def take_amqp10(port: int, queue: str, count: int, size: int, mode: str, credit: int, timeout: float,
                frame_max: int, stream: bool = False, modify: bool = False) -> float:
    """``take`` by an AMQP 1.0 receiver of link credit ``credit`` and frames of ``frame_max`` octets (``stream``:
    from the stream's first offset).  ``modify``: each message is first settled at once with a modified outcome
    that sets an annotation (requeued to the back with it, as RabbitMQ 4.x's quorum queues keep it), then taken
    again, with it, as ``mode`` says."""
    from proton import Delivery, Described, symbol
    from proton.reactor import AtMostOnce, Filter
    from proton.utils import BlockingConnection

    connection = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=timeout, allowed_mechs="PLAIN",
                                    max_frame_size=frame_max)
    options = [AtMostOnce()] if mode == "noack" else []
    if stream:
        options.append(Filter({symbol("first"): Described(symbol("rabbitmq:stream-offset-spec"), "first")}))
    receiver = connection.create_receiver(f"/queues/{queue}", credit=credit, options=options or None)
    started = time.monotonic()
    for got in range(count if modify else 0):
        message = receiver.receive(timeout=timeout)
        if not isinstance(message.body, (bytes, memoryview)) or message.body != body(size, got):
            raise AssertionError(f"message {got}: its body differs")
        assert receiver.fetcher is not None  # (a blocking receiver's)
        receiver.fetcher.unsettled[0].local.annotations = {symbol("x-opt-large-rss"): got}
        receiver.settle(Delivery.MODIFIED)
    unsettled = 0
    for got in range(count):
        message = receiver.receive(timeout=timeout)  # (its body is a view of the message's: kept while read)
        if not isinstance(message.body, (bytes, memoryview)) or message.body != body(size, got):
            raise AssertionError(f"message {got}: its body differs")
        if modify and (message.annotations or {}).get("x-opt-large-rss") != got:
            raise AssertionError(f"message {got}: its modified outcome's annotation is not there")
        if mode == "ack":
            unsettled += 1
            if unsettled == credit or got == count - 1:  # (it holds as many as its credit lets it, then accepts)
                for _ in range(unsettled):
                    receiver.accept()
                unsettled = 0
    elapsed = time.monotonic() - started
    connection.close()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--size", type=int, default=16 * MIB)
    ap.add_argument("--window", type=int, default=4, help="unconfirmed publishes at most")
    ap.add_argument("--prefetch", type=int, default=100)
    ap.add_argument("--mode", choices=("ack", "noack", "get"), default="ack")
    ap.add_argument("--restart", action="store_true", help="restart the node between publishing and taking")
    ap.add_argument("--amqp10", action="store_true", help="take them with an AMQP 1.0 receiver (credit: --prefetch)")
    ap.add_argument("--frame-max", type=int, default=131072, help="the AMQP 1.0 receiver's max-frame-size")
    ap.add_argument("--modify", action="store_true", help="the AMQP 1.0 receiver settles each with a modified "
                                                          "outcome first, then takes them again (--quorum)")
    ap.add_argument("--dead-letter", action="store_true",
                    help="reject them to a dead-letter queue where they would be acked, then take them from there")
    ap.add_argument("--http", action="store_true", help="take them with the management API's get, --prefetch a time")
    ap.add_argument("--peek", action="store_true", help="peek at them all by the management API first, --prefetch a "
                                                        "time")
    ap.add_argument("--truncate", type=int, help="the management API get's or peek's truncate (--http, --peek)")
    ap.add_argument("--remote", action="store_true", help="take them through another node of a cluster of two")
    ap.add_argument("--quorum", action="store_true", help="a quorum queue rather than a classic one")
    ap.add_argument("--stream", action="store_true", help="a stream rather than a classic queue, read from first")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds each phase may take")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.amqp10 and args.mode == "get":
        ap.error("--amqp10 takes --mode ack or noack")
    if args.modify and not (args.amqp10 and args.quorum and args.mode == "ack"):
        ap.error("--modify takes --amqp10 --quorum --mode ack")
    if args.dead_letter and (args.amqp10 or args.http or args.mode != "ack"):
        ap.error("--dead-letter takes --mode ack, an AMQP 0-9-1 consumer")
    if args.http and (args.amqp10 or args.mode == "get"):
        ap.error("--http takes --mode ack or noack")
    if args.stream and (args.quorum or args.dead_letter or args.http or args.peek or args.mode != "ack"):
        ap.error("--stream takes --mode ack, a consumer or an AMQP 1.0 receiver")
    tmp = Path(tempfile.mkdtemp(prefix="warren-large-rss."))
    etcd = Etcd(tmp / "etcd") if args.remote else None
    mgmt = args.http or args.peek
    nodes = [Node(tmp / f"data{number}", free_port(), free_port() if mgmt else 0, () if etcd is None else (
        "--node-name", f"large-rss{number}@localhost", "--cluster-etcd", f"127.0.0.1:{etcd.port}",
        "--cluster-secret", "large-rss", "--cluster-port", str(free_port())))
        for number in range(2 if args.remote else 1)]
    node, taker = nodes[0], nodes[-1]  # (the queue's node, and the node the messages are taken through)
    result: dict[str, float] = {}
    try:
        for each in nodes:
            each.start()
        time.sleep(0.5)
        result["idle_rss_mib"] = status(node.pid, "VmRSS") / MIB
        reset_peak(node.pid)
        result["publish_s"] = publish(node.port, QUEUE, args.messages, args.size, args.window, args.dead_letter,
                                      "quorum" if args.quorum else "stream" if args.stream else "classic")
        result["publish_peak_mib"] = status(node.pid, "VmHWM") / MIB
        if args.restart:
            node.stop()
            node.start()
            time.sleep(0.5)
        result["before_take_rss_mib"] = status(taker.pid, "VmRSS") / MIB
        if args.peek:
            reset_peak(node.pid)
            result["peek_s"] = take_http(node.mgmt_port, QUEUE, args.messages, args.size, args.mode, args.prefetch,
                                         args.timeout, args.truncate, peek=True)
            result["peek_peak_mib"] = status(node.pid, "VmHWM") / MIB
        for each in nodes:
            reset_peak(each.pid)
        if args.amqp10:
            result["take_s"] = take_amqp10(taker.port, QUEUE, args.messages, args.size, args.mode, args.prefetch,
                                           args.timeout, args.frame_max, args.stream, args.modify)
        elif args.http:
            result["take_s"] = take_http(node.mgmt_port, QUEUE, args.messages, args.size, args.mode, args.prefetch,
                                         args.timeout, args.truncate)
        else:
            result["take_s"] = take(taker.port, QUEUE, args.messages, args.size, args.mode, args.prefetch,
                                    args.timeout, args.dead_letter, args.stream)
        result["take_peak_mib"] = status(taker.pid, "VmHWM") / MIB
        if args.remote:
            result["owner_take_peak_mib"] = status(node.pid, "VmHWM") / MIB
        if args.dead_letter:
            reset_peak(node.pid)
            result["dead_take_s"] = take(node.port, DEAD, args.messages, args.size, "ack", args.prefetch,
                                         args.timeout)
            result["dead_take_peak_mib"] = status(node.pid, "VmHWM") / MIB
    finally:
        for each in nodes:
            each.stop()
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.messages} x {args.size / MIB:g} MiB, window {args.window}, {args.mode}"
              f"{' after a restart' if args.restart else ''}{', dead-lettered' if args.dead_letter else ''}"
              f"{', by HTTP' if args.http else ''}{', peeked first' if args.peek else ''}"
              f"{', through another node' if args.remote else ''}"
              f"{', quorum' if args.quorum else ''}{', stream' if args.stream else ''}"
              f"{', each modified once first' if args.modify else ''}"
              f"{f' truncated to {args.truncate}' if args.truncate is not None else ''}, "
              + (f"AMQP 1.0 credit {args.prefetch}, frames of {args.frame_max}" if args.amqp10
                 else f"prefetch {args.prefetch}"))
        for key, value in result.items():
            print(f"  {key:22} {value:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
