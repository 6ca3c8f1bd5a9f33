"""Clients that do not read: the work done per read is bounded, and what waits for them is memory the alarm sees.

A client whose socket is full is not read, and the frames it already sent wait too; no get, delivery or
return copies more than one turn's budget into its output.  Each test drives a node of its own (its RSS
is measured) through raw frames on a socket that is not read.
"""
from __future__ import annotations

import base64
import os
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pframe

from conftest import connect, node_fixture
from test_hostile_input import rss
from support import Raw, raw_frame

pytestmark = [pytest.mark.timeout(300), pytest.mark.warren_only("measures the node's own memory")]

MiB = 1024 * 1024
FRAME_MAX = 131072


def http_latency(node) -> float:
    """Seconds an API request takes (it answers from the same loop the frames are handled on)."""
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}/api/overview", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
    return time.monotonic() - started


def anonymous(node) -> int:
    """What the memory alarm counts: the node's resident anonymous memory (amqp_server.memory)."""
    with open(f"/proc/{node.proc.pid}/statm") as statm:
        fields = statm.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


class Watch:
    """Samples the node's memory (``measure``: RSS, or what the alarm counts) and an API request's latency
    in a thread while a test goes on."""

    def __init__(self, node, measure: Callable[[object], int] = rss) -> None:
        self.node = node
        self.measure = measure
        self.base = measure(node)
        self.peak = self.base
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure(self.node))
            self.slowest = max(self.slowest, http_latency(self.node))
            self._stop.wait(0.05)

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join(60)
        self.peak = max(self.peak, self.measure(self.node))
        return self

    @property
    def growth(self) -> int:
        return self.peak - self.base


def deaf(node) -> Raw:
    """A raw client, logged in with channel 1 open, which will not read (until a test says so)."""
    raw = Raw(node, timeout=10)
    raw.handshake()
    raw.open_channel(1)
    return raw


def send_until_refused(raw: Raw, data: bytes, seconds: float = 3.0) -> int:
    """Send ``data`` until it is all sent or the node stops reading for ``seconds``; the bytes sent."""
    raw.sock.settimeout(seconds)
    view, sent = memoryview(data), 0
    try:
        while sent < len(data):
            sent += raw.sock.send(view[sent:sent + 65536])
    except OSError:  # (a timeout too)
        pass
    return sent


def content(channel: int, body: bytes) -> bytes:
    """A content header and body frames (each within the frame size) for a publish just sent."""
    frames = [pframe.marshal(pframe.header.ContentHeader(0, len(body), commands.Basic.Properties()), channel)]
    for start in range(0, len(body), FRAME_MAX - 8):
        frames.append(raw_frame(3, channel, body[start:start + FRAME_MAX - 8]))
    return b"".join(frames)


def abort(raw: Raw) -> None:
    """Leave with a reset (a FIN would queue behind data the node no longer reads)."""
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()


node = node_fixture()  # of its own: these tests fill its memory


def ready(node, queue: str) -> int:
    with connect(node) as connection:
        return connection.channel().queue_declare(queue, passive=True).method.message_count


# -- a get answered while the client is not reading copies one body, then the rest waits ---------------

def test_get_and_reject_pairs_from_a_client_that_does_not_read(node):
    """basic.get + basic.reject(requeue) pairs for one 4 MiB message, sent in one go: each get copied the
    body into the output (1,000 pairs: +4 GB of RSS in 4 s, the API waiting seconds).  Now the node answers
    the first get, sees the client not read, and handles the other pairs as the client reads."""
    pairs = 200
    with connect(node) as connection:
        ch = connection.channel()
        ch.queue_declare("big-get")
        ch.basic_publish("", "big-get", b"g" * (4 * MiB))
    watch = Watch(node)
    raw = deaf(node)
    frames = b"".join(pframe.marshal(commands.Basic.Get(queue="big-get"), 1)
                      + pframe.marshal(commands.Basic.Reject(delivery_tag=tag, requeue=True), 1)
                      for tag in range(1, pairs + 1))
    assert send_until_refused(raw, frames) == len(frames)  # (small: the kernel's buffers take it all)
    time.sleep(2)
    watch.stop()
    assert watch.growth < 128 * MiB, f"RSS grew {watch.growth / MiB:.0f} MiB"
    assert watch.slowest < 1.0, f"an API request took {watch.slowest:.2f} s"
    # once it reads, every pair is answered in turn and the message is back in its queue
    raw.sock.settimeout(30)
    received = 0
    while received < pairs * 4 * MiB:
        chunk = raw.sock.recv(1 << 20)
        assert chunk, f"closed after {received} bytes"
        received += len(chunk)
    raw.close()
    assert ready(node, "big-get") == 1


# -- deliveries: one turn writes a budget of bytes, not 2,000 messages whatever their size -------------

def test_deliveries_to_a_consumer_that_does_not_read_copy_a_budget_per_turn(node):
    """A manual-ack consumer that does not read, on a queue of 100 messages of 2 MiB: the first turn
    joined all 100 bodies into one write (200 MiB more); now a turn stops at the budget's 4 MiB of
    content, and the write that fills the client's socket stops deliveries until it reads."""
    with connect(node) as connection:
        ch = connection.channel()
        ch.queue_declare("big-deliver")
        for _ in range(100):
            ch.basic_publish("", "big-deliver", b"d" * (2 * MiB))
    watch = Watch(node)
    raw = deaf(node)
    raw.send_method(1, commands.Basic.Consume(queue="big-deliver", consumer_tag="deaf"))
    time.sleep(2)
    watch.stop()
    assert watch.growth < 48 * MiB, f"RSS grew {watch.growth / MiB:.0f} MiB"
    abort(raw)
    deadline = time.monotonic() + 10
    while ready(node, "big-deliver") != 100:  # every delivery is requeued when the client goes
        assert time.monotonic() < deadline
        time.sleep(0.1)


# -- output waiting for a client is memory the alarm sees as it grows ----------------------------------

def test_replies_piling_up_for_a_client_that_does_not_read_set_the_memory_alarm(start_broker):
    """Direct replies go at once to the requester's connection, read or not.  A replier sending 1 MiB
    replies to a requester that does not read filled its output for a second before the memory check saw
    it; now each 8 MiB waiting for a client checks the alarm, which holds the replier at the watermark."""
    limit = 320 * MiB
    node = start_broker("--memory-high-watermark", str(limit))
    assert anonymous(node) < 200 * MiB
    requester = deaf(node)
    requester.send_method(1, commands.Basic.Consume(queue="amq.rabbitmq.reply-to", no_ack=True,
                                                    consumer_tag="replies"))
    requester.expect(commands.Basic.ConsumeOk)
    with connect(node) as connection:
        ch = connection.channel()
        ch.queue_declare("rpc")
        requester.send(pframe.marshal(commands.Basic.Publish(exchange="", routing_key="rpc"), 1)
                       + pframe.marshal(pframe.header.ContentHeader(0, 3, commands.Basic.Properties(
                           reply_to="amq.rabbitmq.reply-to")), 1) + raw_frame(3, 1, b"req"))
        deadline = time.monotonic() + 10
        while (request := ch.basic_get("rpc", auto_ack=True))[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        reply_to = request[1].reply_to
        assert reply_to is not None  # (the request named its reply queue)
    replier = Raw(node, timeout=10)
    replier.handshake()
    replier.open_channel(1)
    reply = (pframe.marshal(commands.Basic.Publish(exchange="", routing_key=reply_to), 1)
             + content(1, b"r" * MiB))
    watch = Watch(node, anonymous)
    sent = send_until_refused(replier, reply * 800)  # 800 MiB, unless the node stops reading the replier
    watch.stop()
    assert watch.peak < limit + 64 * MiB, f"memory reached {watch.peak / MiB:.0f} MiB, watermark {limit / MiB:.0f}"
    assert sent < 400 * MiB, "the replier was read on through the memory alarm"
    assert "memory alarm set" in node.said()
    abort(requester)
    abort(replier)


# -- fuzzed: any mix of requests from a client that does not read --------------------------------------

def _publish(routing_key: str, size: int, mandatory: bool) -> bytes:
    return (pframe.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key, mandatory=mandatory), 1)
            + content(1, b"p" * size))


# the large message is only ever taken with manual acks: when the client goes, it is back in its queue
OPERATIONS = st.one_of(
    st.just(pframe.marshal(commands.Basic.Get(queue="fuzz-big"), 1)),
    st.builds(lambda no_ack: pframe.marshal(commands.Basic.Get(queue="fuzz-small", no_ack=no_ack), 1),
              st.booleans()),
    st.just(pframe.marshal(commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True), 1)),
    st.just(pframe.marshal(commands.Basic.Recover(requeue=True), 1)),
    st.builds(lambda size: _publish("nowhere", size, True), st.integers(0, 300_000)),  # returned
    st.builds(lambda size: _publish("fuzz-small", size, False), st.integers(0, 70_000)),
    st.just(pframe.marshal(commands.Basic.Consume(queue="fuzz-big"), 1)),
    st.builds(lambda no_ack: pframe.marshal(commands.Basic.Consume(queue="fuzz-small", no_ack=no_ack), 1),
              st.booleans()),
    st.builds(lambda prefetch: pframe.marshal(commands.Basic.Qos(prefetch_count=prefetch), 1), st.integers(0, 5)),
)


@pytest.fixture(scope="module")
def fuzz_queues(node):
    with connect(node) as connection:
        ch = connection.channel()
        ch.queue_declare("fuzz-big")
        ch.queue_declare("fuzz-small", arguments={"x-max-length": 10})
        ch.basic_publish("", "fuzz-big", b"b" * (4 * MiB))
    return node


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(operations=st.lists(OPERATIONS, min_size=1, max_size=6), times=st.integers(1, 400))
def test_fuzzed_requests_from_a_client_that_does_not_read(fuzz_queues, operations, times):
    """Whatever a client that does not read sends (gets, returns, consumes, requeues, repeated), the node's
    memory grows by less than 128 MiB and its API answers within a second; when the client goes, the
    large message is back in its queue."""
    node = fuzz_queues
    watch = Watch(node)
    raw = deaf(node)
    send_until_refused(raw, b"".join(operations) * times, seconds=1.0)
    time.sleep(0.3)
    watch.stop()
    abort(raw)
    assert watch.growth < 128 * MiB, f"RSS grew {watch.growth / MiB:.0f} MiB"
    assert watch.slowest < 1.0, f"an API request took {watch.slowest:.2f} s"
    deadline = time.monotonic() + 10
    while ready(node, "fuzz-big") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
