"""Hostile input on the stream protocol and the stream store, as a logged-in user sends it: records that decode
to millions of values, gzip bombs, timestamps at the ends of i64, floods of stored offsets and named publishers,
segments of one byte.  Each gets a clear refusal or bounded work; other clients keep being served; the node stays
up.  (RabbitMQ's figures for the same inputs are in docs/operations.md, Stream limits.)"""
# ruff: noqa: F811 (test functions take the fixture `node`, imported from test_stream_protocol)
from __future__ import annotations

import base64
import gzip
import json
import os
import struct
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pika
import pika.exceptions
import pytest

from test_stream_protocol import Raw, frame, node, offset_of, string  # noqa: F401 (node: the fixture)

pytestmark = [pytest.mark.timeout(120), pytest.mark.warren_only("Warren's limits")]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Watch:
    """Another client's round trips (stream-protocol metadata requests) while something else happens: the
    longest wait, counted in the node's CPU time during it (a busy machine that runs the node late is no stall
    of the node's; a node busy with one client's work meanwhile is)."""

    def __init__(self, node) -> None:
        self.raw = Raw(node)
        assert self.raw.login() == 1
        self.stat = f"/proc/{node.proc.pid}/stat"
        self.longest = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            started, cpu = time.monotonic(), self._node_cpu()
            self.raw.send(frame(0x0F, struct.pack(">I", 9) + struct.pack(">i", 1) + string("none")))
            key, _ = self.raw.receive()
            assert key == 0x800F
            self.longest = max(self.longest, min(time.monotonic() - started, self._node_cpu() - cpu))
            time.sleep(0.02)

    def _node_cpu(self) -> float:
        """The node's CPU seconds so far (user and system, all its threads)."""
        with open(self.stat) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def __enter__(self) -> "Watch":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def new_stream(raw: Raw, *arguments: tuple[str, str]) -> str:
    stream = f"s-{uuid.uuid4().hex[:8]}"
    body = struct.pack(">i", len(arguments)) + b"".join(string(k) + string(v) for k, v in arguments)
    assert raw.request(0x0D, string(stream) + body) == 1
    return stream


def publish(raw: Raw, publisher: int, entries: list[bytes], first_id: int = 1) -> None:
    """One publish frame of ``entries`` (each a whole entry: a simple one's size and record, or a sub-batch)."""
    body = b"".join(struct.pack(">Q", first_id + k) + entry for k, entry in enumerate(entries))
    raw.send(frame(0x02, bytes([publisher]) + struct.pack(">i", len(entries)) + body))
    key, rest = raw.receive()
    assert key == 0x03, key


def simple(record: bytes) -> bytes:
    return struct.pack(">I", len(record)) + record


def consume(node, stream: str, wanted: int, within: float = 10) -> tuple[list[tuple[int, bytes]], object]:
    """An AMQP 0-9-1 consumer from the stream's first offset: what it got, and how its connection ended (None:
    still open).  pika's asynchronous connection, which hands each delivery over as its frames are read: the
    blocking one raises a connection.close read in the same segment as deliveries before it, and drops them."""
    got: list[tuple[int, bytes]] = []
    ended: list[object] = []

    def on_channel(channel) -> None:
        channel.basic_qos(prefetch_count=100, callback=lambda _: channel.basic_consume(
            stream, on_message, arguments={"x-stream-offset": "first"}))

    def on_message(channel, method, props, body: bytes) -> None:
        got.append((offset_of(props), body))
        if len(got) >= wanted and connection.is_open:
            connection.close()

    def on_closed(connection, reason: BaseException) -> None:
        if not isinstance(reason, pika.exceptions.ConnectionClosedByClient):
            ended.append(reason)
        connection.ioloop.stop()

    def on_open_error(connection, error: BaseException) -> None:
        ended.append(error)
        connection.ioloop.stop()

    connection = pika.SelectConnection(
        pika.URLParameters(node.url), on_open_callback=lambda connection: connection.channel(
            on_open_callback=on_channel), on_open_error_callback=on_open_error, on_close_callback=on_closed)

    def give_up() -> None:
        if connection.is_open:
            connection.close()
        elif not connection.is_closing:  # (still opening)
            connection.ioloop.stop()

    connection.ioloop.call_later(within, give_up)
    connection.ioloop.start()
    connection.ioloop.close()
    return got, ended[0] if ended else None


def http(node, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}{path}", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def bomb(count: int) -> bytes:
    """A record of 25 bytes whose application-properties hold an array32 of ``count`` nulls."""
    pair = b"\xa1\x01k" + b"\xf0" + struct.pack(">II", 5, count) + b"\x40"
    return b"\x00\x53\x74\xc1" + bytes([len(pair) + 1, 2]) + pair + b"\x00\x53\x75\xa0\x01x"


def test_a_record_that_decodes_to_millions_of_values_fails_its_consumer_with_541_and_stalls_no_one(node):
    raw = Raw(node)
    assert raw.login() == 1
    stream = new_stream(raw)
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 1
    publish(raw, 1, [simple(b"\x00\x53\x75\xa0\x02ok"), simple(bomb(20_000_000))])
    with Watch(node) as watch:
        started = time.monotonic()
        got, ended = consume(node, stream, 2)
        elapsed = time.monotonic() - started
        status, answer = http(node, f"/api/queues/%2F/{stream}/peek?offset=0&count=5")
    assert got == [(0, b"ok")]
    assert isinstance(ended, pika.exceptions.ConnectionClosedByBroker) and ended.reply_code == 541, ended
    assert "offset 1" in ended.reply_text and "cannot be read" in ended.reply_text
    assert elapsed < 5
    assert status == 400 and "cannot be read" in answer["reason"], (status, answer)
    assert watch.longest < 0.5
    assert node.running


def test_a_gzip_sub_batch_inflating_past_the_cap_is_passed_over_without_a_stall(node):
    raw = Raw(node)
    assert raw.login() == 1
    stream = new_stream(raw)
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 1
    inflated = 512 << 20
    packed = gzip.compress(b"\0" * inflated, 9)  # 510 KiB
    sub_batch = struct.pack(">BHII", 0x80 | 1 << 4, 1, inflated, len(packed)) + packed
    publish(raw, 1, [sub_batch, simple(b"\x00\x53\x75\xa0\x05after")])
    with Watch(node) as watch:
        got, ended = consume(node, stream, 1)
    assert ended is None and got == [(1, b"after")]
    assert watch.longest < 0.5
    assert "passed over" in node.said() and "inflate" in node.log()


@pytest.mark.parametrize("timestamp", [2**63 - 1, -2**63])
def test_subscribe_at_a_timestamp_at_either_end_of_i64_answers_ok(node, timestamp):
    raw = Raw(node)
    assert raw.login() == 1
    stream = new_stream(raw)
    subscribe = b"\x01" + string(stream) + struct.pack(">Hq", 5, timestamp) + struct.pack(">Hi", 10, 0)
    assert raw.request(0x07, subscribe) == 1
    assert raw.request(0x0C, b"\x01") == 1  # still open
    assert "Traceback" not in node.log()


def store_offset(reference: str, stream: str, offset: int) -> bytes:
    return frame(0x0A, string(reference) + string(stream) + struct.pack(">Q", offset))


def query_offset(raw: Raw, reference: str, stream: str) -> tuple[int, int]:
    raw.send(frame(0x0B, struct.pack(">I", 9) + string(reference) + string(stream)))
    key, rest = raw.receive()
    assert key == 0x800B
    _, code, offset = struct.unpack_from(">IHQ", rest)
    return code, offset


def test_a_burst_of_new_stored_offsets_keeps_the_latest_and_stalls_no_one(node):
    raw = Raw(node)
    assert raw.login() == 1
    stream = new_stream(raw)
    references = [f"{k:0255d}" for k in range(10_000)]
    with Watch(node) as watch:
        for start in range(0, len(references), 2000):
            raw.send(b"".join(store_offset(reference, stream, k) for k, reference in
                              enumerate(references[start:start + 2000], start)))
        assert query_offset(raw, references[-1], stream) == (1, 9_999)
    assert query_offset(raw, references[0], stream)[0] == 0x13  # the least recently stored: forgotten
    assert watch.longest < 1.0  # (frames are read a socket read at a time, ~1,000 of these: slow on a busy machine)


def test_a_stored_offset_of_a_reference_longer_than_255_bytes_closes_the_connection(node):
    raw = Raw(node)
    assert raw.login() == 1
    stream = new_stream(raw)
    raw.send(store_offset("r" * 255, stream, 3))
    assert query_offset(raw, "r" * 255, stream) == (1, 3)
    raw.send(store_offset("r" * 256, stream, 4))
    assert raw.closed_with() == 0x11  # PRECONDITION_FAILED
    other = Raw(node)
    assert other.login() == 1
    assert other.request(0x01, b"\x01" + string("p" * 256) + string(stream)) == 0x11
    assert other.request(0x01, b"\x01" + string("p" * 255) + string(stream)) == 1


def test_named_publishers_are_bounded_per_stream_and_stall_no_one(node):
    raw = Raw(node)
    assert raw.login() == 1
    stream = new_stream(raw)
    with Watch(node) as watch:
        for k in range(400):
            assert raw.request(0x01, b"\x01" + string(f"w{k}") + string(stream)) == 1
            publish(raw, 1, [simple(b"\x00\x53\x75\xa0\x01x")], first_id=k + 1)
            assert raw.request(0x06, b"\x01") == 1
    sequence = frame(0x05, struct.pack(">I", 9) + string("w0") + string(stream))
    raw.send(sequence)
    key, rest = raw.receive()
    assert key == 0x8005 and struct.unpack_from(">IHQ", rest)[1:] == (1, 0)  # forgotten, as osiris forgets it
    raw.send(frame(0x05, struct.pack(">I", 9) + string("w399") + string(stream)))
    key, rest = raw.receive()
    assert struct.unpack_from(">IHQ", rest)[1:] == (1, 400)
    assert watch.longest < 0.5
