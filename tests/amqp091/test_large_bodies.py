"""Large bodies: every size arrives byte-exact through every kind of queue, in frames of the client's frame-max,
and a client that goes in the middle of a body leaves nothing behind.

The sizes are the edges of framing (empty, one octet, a body that just fills one frame of the default
frame-max and one that just does not) and a 16 MiB body of 128 frames.  Each body is a counter, so a frame
dropped, repeated or out of place shows.
"""
from __future__ import annotations

import base64
import os
import socket
import struct
import time
from typing import Any

import numpy as np
import pika
import pytest
from pamqp import commands

from conftest import connect, node_fixture
from support import Raw, call, publish_frames, stalled_consumer

pytestmark = pytest.mark.timeout(180)

FRAME_MAX = 131072  # the node's default, which pika takes
QUORUM = {"x-queue-type": "quorum"}
STREAM = {"x-queue-type": "stream"}
FROM_FIRST: dict[str, Any] = {"x-stream-offset": "first"}
SIZES = [0, 1, FRAME_MAX - 8, FRAME_MAX - 7, 16 * 1024 * 1024]

# A node of the module's own for the tests that count what the node reads or holds: it compacts no segment, so
# no move of another test's live records (a 16 MiB one read whole) lands in what they count.
quiet = node_fixture("--compaction-threshold", "1", name="quiet")


def body(size: int) -> bytes:
    """``size`` octets of a counter that starts at ``size`` (no two bodies alike, no two places alike)."""
    return np.arange(size, size + size // 8 + 1, dtype=">u8").tobytes()[:size]


def stored_bodies(connection, queue: str, count: int, size: int, arguments: dict | None = None):
    """A durable ``queue`` holding ``count`` persistent bodies of ``size``, ``size + 1``... octets, confirmed; the
    channel that published them."""
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments=arguments)
    channel.confirm_delivery()
    for number in range(count):
        channel.basic_publish("", queue, body(size + number), pika.BasicProperties(delivery_mode=2))
    return channel


def publish_all(connection, routing_key: str, **properties) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    for size in SIZES:
        channel.basic_publish("", routing_key, body(size), pika.BasicProperties(**properties))


def consume(connection, queue: str, arguments: dict | None = None, reject: bool = False) -> list[bytes]:
    """Every body delivered from ``queue`` (acked, or rejected without requeue), in order."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    got: list[bytes] = []

    def on_message(ch, method, _properties, data):
        got.append(data)
        if reject:
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message, arguments=arguments)
    deadline = time.monotonic() + 60
    while len(got) < len(SIZES) and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    return got


def assert_bodies(got: list[bytes]) -> None:
    assert [len(data) for data in got] == SIZES
    assert all(data == body(size) for data, size in zip(got, SIZES))


@pytest.mark.parametrize("arguments, persistent", [
    ({}, True),
    ({}, False),
    ({"x-max-priority": 10}, True),
    (QUORUM, True),
], ids=["classic", "classic-transient", "priority", "quorum"])
def test_bodies_arrive_byte_exact(broker, uid, arguments, persistent):
    with connect(broker) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=arguments)
        publish_all(connection, uid, delivery_mode=2 if persistent else 1)
        assert_bodies(consume(connection, uid))


def test_bodies_arrive_byte_exact_from_a_stream(broker, uid):
    with connect(broker) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
        publish_all(connection, uid, delivery_mode=2)
        assert_bodies(consume(connection, uid, arguments={"x-stream-offset": "first"}))


def test_dead_lettered_bodies_arrive_byte_exact(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(f"{uid}-dead", durable=True)
        channel.queue_declare(uid, durable=True, arguments={"x-dead-letter-exchange": "",
                                                            "x-dead-letter-routing-key": f"{uid}-dead"})
        publish_all(connection, uid, delivery_mode=2)
        assert_bodies(consume(connection, uid, reject=True))
        assert_bodies(consume(connection, f"{uid}-dead"))


@pytest.mark.parametrize("arguments, no_ack", [({}, True), (QUORUM, True), (QUORUM, False)],
                         ids=["classic", "quorum-no-ack", "quorum"])
def test_basic_get_of_bodies_is_byte_exact(broker, uid, arguments, no_ack):
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True, arguments=arguments)
        publish_all(connection, uid, delivery_mode=2)
        got: list[bytes] = []
        for _ in SIZES:
            method, _properties, data = channel.basic_get(uid, auto_ack=no_ack)
            assert method is not None and data is not None
            got.append(data)
            if not no_ack:
                channel.basic_ack(method.delivery_tag or 0)
        assert_bodies(got)


def read_frames(raw: Raw, until: int) -> list[tuple[int, int, bytes]]:
    """(type, channel, payload) of raw frames off the socket, until ``until`` body octets have come."""
    frames: list[tuple[int, int, bytes]] = []
    buf = raw.buf  # (what came with the frames read before)
    octets = 0
    while octets < until:
        while len(buf) < 7 or len(buf) < 8 + struct.unpack_from(">I", buf, 3)[0]:
            data = raw.recv(1 << 20)
            assert data, "the node closed the connection"
            buf += data
        ftype, channel, size = struct.unpack_from(">BHI", buf)
        assert buf[7 + size] == 0xCE
        frames.append((ftype, channel, buf[7:7 + size]))
        octets += size if ftype == 3 else 0
        buf = buf[8 + size:]
    return frames


@pytest.mark.parametrize("stored, arguments", [(False, None), (True, None), (True, STREAM)],
                         ids=["in-memory", "from-the-store", "from-a-stream"])
def test_a_client_with_a_small_frame_max_gets_frames_it_can_take(broker, uid, stored, arguments):
    """Bodies framed from memory (transient, no ack), from the store's file (persistent, for manual ack) and
    from a stream's segment file (read from the first, with a prefetch)."""
    with connect(broker) as connection:
        connection.channel().queue_declare(uid, durable=stored, arguments=arguments)
        publish_all(connection, uid, delivery_mode=2 if stored else 1)
    raw = Raw(broker, timeout=30)
    raw.handshake(frame_max=4096)
    raw.open_channel(1)
    if arguments:
        raw.send_method(1, commands.Basic.Qos(prefetch_count=100))
        raw.expect(commands.Basic.QosOk)
    raw.send_method(1, commands.Basic.Consume(queue=uid, no_ack=not stored, arguments=FROM_FIRST if arguments
                                              else {}))
    raw.expect(commands.Basic.ConsumeOk)
    frames = read_frames(raw, sum(SIZES))
    raw.close()
    assert max(len(payload) + 8 for _type, _channel, payload in frames) <= 4096
    bodies: list[bytes] = []
    for ftype, _channel, payload in frames:
        if ftype == 2:
            bodies.append(b"")
        elif ftype == 3:
            bodies[-1] += payload
    assert_bodies(bodies)


def test_a_client_gone_mid_body_leaves_nothing_behind(broker, uid):
    """Half of a 16 MiB body, sent in reads the node hands straight to the message's buffer, then a reset: no
    message, nothing kept in the node's memory, and the channel number is free for the next client."""
    with connect(broker) as connection:
        connection.channel().queue_declare(uid, durable=True)
    before = rss(broker)
    for _ in range(3):
        raw = Raw(broker, timeout=30)
        raw.handshake()
        raw.open_channel(1)
        head = publish_frames(1, "", uid, b"", declared=16 * 1024 * 1024)
        raw.send(head)
        chunk = b"z" * (FRAME_MAX - 8)
        for _ in range(64):  # 8 MiB
            raw.send(struct.pack(">BHI", 3, 1, len(chunk)) + chunk + b"\xce")
        time.sleep(0.3)
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()
    time.sleep(0.5)
    with connect(broker) as connection:
        channel = connection.channel()
        assert channel.queue_declare(uid, passive=True).method.message_count == 0
        channel.confirm_delivery()
        channel.basic_publish("", uid, body(1000), pika.BasicProperties(delivery_mode=2))
        method, _properties, data = channel.basic_get(uid, auto_ack=True)
        assert data == body(1000)
    if before:
        assert rss(broker) - before < 24 * 1024 * 1024


def test_large_bodies_whose_frames_interleave_across_channels_arrive_byte_exact(broker, uid):
    """Two channels' 1 MiB bodies, frame by frame in turn, with heartbeats between, in sends cut anywhere: the node
    reads each frame into its body with the next frame's head after it, which is now the other channel's (or a
    heartbeat, or not all there): every body arrives whole and in place."""
    with connect(broker) as connection:
        connection.channel().queue_declare(uid)
    size = 1 << 20
    bodies = {1: body(size), 2: body(size + 1)[1:]}
    raw = Raw(broker, timeout=30)
    raw.handshake()
    for ch in bodies:
        raw.open_channel(ch)
    wire = b"".join(publish_frames(ch, "", uid, b"", declared=size) for ch in bodies)
    step = FRAME_MAX - 8
    for at in range(0, size, step):
        for ch, whole in bodies.items():
            wire += struct.pack(">BHI", 3, ch, len(whole[at:at + step])) + whole[at:at + step] + b"\xce"
        wire += struct.pack(">BHI", 8, 0, 0) + b"\xce"
    for at, cut in enumerate(range(0, len(wire), 50_003)):  # (cuts fall inside frames and heads alike)
        raw.send(wire[cut:cut + 50_003])
        if at % 7 == 0:
            time.sleep(0.01)
    with connect(broker) as connection:
        channel = connection.channel()
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            _method, _properties, data = channel.basic_get(uid, auto_ack=True)
            if data is not None:
                got.append(data)
    raw.close()
    assert sorted(got) == sorted(bodies.values())


def test_a_large_body_frame_without_its_end_octet_is_a_frame_error(broker, uid):
    """The end octet read with a large body frame's last bytes is checked as any frame's: a wrong one closes the
    connection with 501."""
    raw = Raw(broker, timeout=30)
    raw.handshake()
    raw.open_channel(1)
    chunk = b"z" * (FRAME_MAX - 8)
    raw.send(publish_frames(1, "", uid, b"", declared=4 * len(chunk))
             + struct.pack(">BHI", 3, 1, len(chunk)) + chunk + b"\x00" + struct.pack(">BHI", 3, 1, len(chunk)))
    assert raw.expect_connection_close().reply_code == 501
    raw.close()


def rss(broker, field: str = "VmRSS") -> int:
    """The node's resident memory (``VmHWM``: its peak since ``reset_peak``), where the test can read it (0 for a
    node elsewhere)."""
    proc = getattr(broker, "proc", None)
    if proc is None:
        return 0
    with open(f"/proc/{proc.pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak(broker) -> None:
    """The node's peak resident memory (``VmHWM``) starts again from what it holds now."""
    with open(f"/proc/{broker.proc.pid}/clear_refs", "w") as refs:
        refs.write("5")


def held_by_a_consumer(connection, queue: str, count: int, size: int, arguments: dict | None = None):
    """A consumer with prefetch 100 (``arguments``: its consume's) takes ``count`` bodies of ``size``,
    ``size + 1``... octets, acking none: its channel, whether each arrived byte-exact, and their tags."""
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=100)
    exact: list[bool] = []
    tags: list[int] = []

    def on_message(_ch, method, _properties, data):
        exact.append(data == body(size + len(exact)))
        tags.append(method.delivery_tag or 0)

    consumer.basic_consume(queue, on_message, arguments=arguments)
    deadline = time.monotonic() + 60
    while len(exact) < count and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    return consumer, exact, tags


@pytest.mark.parametrize("arguments, count", [({}, 64), ({"x-max-priority": 10}, 24), (QUORUM, 24)],
                         ids=["classic", "priority", "quorum"])
def test_a_prefetch_100_consumer_of_queued_large_bodies_makes_the_node_hold_none(quiet, uid, arguments, count):
    """64 persistent 16 MiB messages (1 GiB) queued in a durable queue, then all taken by a consumer with
    prefetch 100 that acks none until it has them all: the node's peak RSS grows by a body or two, publishing
    as delivering, not with the bodies in flight (``benchmarks/large_rss.py`` measures 100 against the issue's
    bound: under 256 MiB in all).  A ready entry holds no body its queue stored, nor
    does an unacked delivery; each arrives byte-exact.  (A priority queue's entries neither: fewer, of one level;
    nor a quorum queue's, whose deliveries' header it makes.)"""
    if not rss(quiet):
        pytest.skip("reads the node's memory")
    size = 16 * 1024 * 1024
    with connect(quiet) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True, arguments=arguments)
        channel.confirm_delivery()
        before = rss(quiet)
        reset_peak(quiet)
        for number in range(count):
            channel.basic_publish("", uid, body(size + number),
                                  pika.BasicProperties(delivery_mode=2, priority=5))
        published = rss(quiet, "VmHWM") - before
        consumer, exact, tags = held_by_a_consumer(connection, uid, count, size)
        delivered = rss(quiet, "VmHWM") - before
        consumer.basic_ack(tags[-1], multiple=True)
        channel.queue_delete(uid)
    assert exact == [True] * count
    assert published < 64 * 1024 * 1024, f"{published >> 20} MiB more held publishing"
    assert delivered < 128 * 1024 * 1024, f"{delivered >> 20} MiB more held delivering"


@pytest.mark.parametrize("arguments", [{}, QUORUM], ids=["classic", "quorum"])
@pytest.mark.parametrize("how", ["ack", "no-ack", "get"])
def test_large_bodies_recovered_after_a_restart_go_from_the_store_unread(start_broker, uid, how, arguments):
    """Persistent 16 MiB messages recovered after a restart (their route and header are in the store too) are
    delivered for manual ack, without ack and to basic.get byte-exact, their headers read from the store and
    their bodies sent from its files, not read into the node's memory: little read, little more held."""
    count, size = 6, 16 * 1024 * 1024
    node = start_broker()
    with connect(node) as connection:
        stored_bodies(connection, uid, count, size, arguments)
    node.stop()
    node = start_broker(data_dir=node.data_dir)
    with connect(node) as connection:
        channel = connection.channel()
        before, read_before = rss(node), read_octets(node)
        reset_peak(node)
        got: list[bytes] = []
        if how == "get":
            for _ in range(count):
                method, _properties, data = channel.basic_get(uid, auto_ack=False)
                assert method is not None and data is not None
                got.append(data)
                channel.basic_ack(method.delivery_tag or 0)
        else:
            channel.basic_qos(prefetch_count=100)
            channel.basic_consume(uid, lambda _ch, _method, _properties, data: got.append(data),
                                  auto_ack=how == "no-ack")
            deadline = time.monotonic() + 60
            while len(got) < count and time.monotonic() < deadline:
                connection.process_data_events(0.05)
        read = read_octets(node) - read_before
        held = rss(node, "VmHWM") - before
    assert [data == body(size + number) for number, data in enumerate(got)] == [True] * count
    sent = sum(size + number for number in range(count))
    assert read < HEADS_READ, f"{read} octets read to send {sent}"
    assert held < 48 * 1024 * 1024, f"{held >> 20} MiB more held"


def test_unacked_large_bodies_are_not_held_in_memory(quiet, uid):
    """A consumer with prefetch 100 holding 20 unacked 16 MiB messages (320 MiB) does not make the node hold
    them; requeued (its channel closes), they come back byte-exact from the store."""
    if not rss(quiet):
        pytest.skip("reads the node's memory")
    count, size = 20, 16 * 1024 * 1024
    with connect(quiet) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True)
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=100)
        got: list[int] = []
        consumer.basic_consume(uid, lambda _ch, method, _properties, data: got.append(len(data)))
        channel.confirm_delivery()
        before = peak = rss(quiet)
        for number in range(count):
            channel.basic_publish("", uid, body(size + number), pika.BasicProperties(delivery_mode=2))
            connection.process_data_events(0)
            peak = max(peak, rss(quiet))
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            connection.process_data_events(0.05)
            peak = max(peak, rss(quiet))
        assert got == [size + number for number in range(count)]
        assert peak - before < 160 * 1024 * 1024, f"{(peak - before) >> 20} MiB more held"
        consumer.close()  # the 20 unacked go back to the queue
        again: list[bytes] = []
        for _ in range(count):
            data = channel.basic_get(uid, auto_ack=True)[2]
            assert data is not None  # (all back in the queue)
            again.append(data)
        assert [len(data) for data in again] == [size + number for number in range(count)]
        assert all(data == body(size + number) for number, data in enumerate(again))


@pytest.mark.parametrize("arguments", [{}, {"x-max-priority": 10}, QUORUM], ids=["classic", "priority", "quorum"])
def test_message_bytes_ram_counts_the_bodies_the_node_holds(quiet, uid, arguments):
    """The HTTP API's ``message_bytes_ram`` (RabbitMQ's "bytes of messages currently in RAM") counts the bodies the
    node holds: not large persistent ones its durable queue left in the store, queued or requeued after a delivery
    released them (a quorum queue's to its back); small ones and a large transient one (held in memory only) it
    does count, but a quorum queue stores a transient one too, and leaves it there."""
    large, small, transient = 1024 * 1024, 1000, 2 * 1024 * 1024
    with connect(quiet) as connection:
        channel = stored_bodies(connection, uid, 4, large, arguments)
        for number in range(3):
            channel.basic_publish("", uid, body(small + number), pika.BasicProperties(delivery_mode=2))
        channel.basic_publish("", uid, body(transient), pika.BasicProperties(delivery_mode=1))
        total = sum(large + number for number in range(4)) + sum(small + number for number in range(3)) + transient
        held = sum(small + number for number in range(3)) + (0 if arguments == QUORUM else transient)

        def shown() -> tuple[int, int]:
            queue = call(quiet, "GET", f"/api/queues/%2F/{uid}").json
            return queue["message_bytes"], queue["message_bytes_ram"]

        assert shown() == (total, held)
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=2)
        taken: list[int] = []
        consumer.basic_consume(uid, lambda _ch, _method, _properties, data: taken.append(len(data)))
        deadline = time.monotonic() + 30
        while len(taken) < 2 and time.monotonic() < deadline:
            connection.process_data_events(0.05)
        consumer.close()  # the two unacked come back, their bodies in the store
        assert shown() == (total, held)
        for _ in range(8):
            assert channel.basic_get(uid, auto_ack=True)[0] is not None
        assert shown() == (0, 0)


HEADS_READ = 1 << 20  # what a node may read of large stored messages it sends from their files: their heads


def read_octets(broker) -> int:
    """What the node's message stores have read from their files into memory (``io_read_bytes``, as RabbitMQ's
    node reports it): what a ``sendfile`` sends from them is not read (the process's own ``rchar`` counts it, as
    much of a body as the socket took at once: a fast client's made that half of what was sent)."""
    return call(broker, "GET", "/api/nodes").json[0]["io_read_bytes"]


@pytest.mark.parametrize("how, arguments", [("nack", {}), ("close", {}), ("close", {"x-max-priority": 10}),
                                           ("nack", QUORUM), ("close", QUORUM)],
                         ids=["nack", "close", "priority", "quorum-nack", "quorum-close"])
def test_a_redelivered_large_body_goes_from_the_store_unread(quiet, uid, how, arguments):
    """Large persistent bodies sent for manual ack and requeued (a nack, the channel closed) come back
    byte-exact and flagged redelivered, sent from the store's file as their first delivery was, not read back
    into memory first: a quorum queue's with the header it makes, which counts the return."""
    if not rss(quiet):
        pytest.skip("reads the node's counters")
    count, size = 3, 16 * 1024 * 1024
    with connect(quiet) as connection:
        stored_bodies(connection, uid, count, size, arguments)
        first, held = holding(connection, uid, count)
        if how == "nack":
            first.basic_cancel(first.consumer_tags[0])
            first.basic_nack(held[-1], multiple=True, requeue=True)
        first.close()
        before = read_octets(quiet)
        again = connection.channel()
        again.basic_qos(prefetch_count=10)
        got: list[tuple[bool, bytes]] = []
        counts: list[Any] = []

        def on_message(ch, method, properties, data):
            got.append((method.redelivered, data))
            counts.append((properties.headers or {}).get("x-delivery-count"))
            ch.basic_ack(method.delivery_tag)

        again.basic_consume(uid, on_message)
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            connection.process_data_events(0.05)
        read = read_octets(quiet) - before
    assert [redelivered for redelivered, _data in got] == [True] * count
    assert [data == body(size + number) for number, (_redelivered, data) in enumerate(got)] == [True] * count
    assert counts == [1 if arguments == QUORUM else None] * count
    sent = sum(size + number for number in range(count))
    assert read < HEADS_READ, f"{read} octets read to send {sent}"


def refusal_of(node, declared: int) -> commands.Channel.Close:
    """What the node answers a header declaring ``declared`` body octets, no body octet sent."""
    raw = Raw(node, timeout=10)
    try:
        raw.handshake()
        raw.open_channel(1)
        raw.send(publish_frames(1, "", "anywhere", b"", declared=declared))
        return raw.expect(commands.Channel.Close)
    finally:
        raw.close()


def test_a_message_over_the_max_size_is_refused_at_its_header(broker):
    limit = 128 * 1024 * 1024  # the default, as RabbitMQ 3.10's
    close = refusal_of(broker, limit + 1)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        406, f"PRECONDITION_FAILED - message size {limit + 1} is larger than configured max size {limit}", 60, 40)


@pytest.mark.warren_only("starts a node with its own max message size")
def test_a_max_message_size_above_rabbitmq_s_ceiling_is_its_ceiling(start_broker):
    node = start_broker("--max-message-size", str(1 << 30))
    close = refusal_of(node, (512 << 20) + 1)
    assert (close.reply_code, close.reply_text) == (
        406, f"PRECONDITION_FAILED - message size {(512 << 20) + 1} is larger than max size {512 << 20}")


def open_fds(broker) -> list[str]:
    """What the node's file descriptors name."""
    fds = f"/proc/{broker.proc.pid}/fd"
    names = []
    for fd in os.listdir(fds):
        try:
            names.append(os.readlink(f"{fds}/{fd}"))
        except OSError:  # closed meanwhile
            pass
    return names


def test_a_consumer_gone_mid_delivery_from_the_store_leaves_no_descriptor_and_gets_its_messages_back(quiet, uid):
    """A body sent from the store's file holds a descriptor of its own until sent: a client reset in the middle
    of it leaves none open, and the messages it held come back byte-exact."""
    if not rss(quiet):
        pytest.skip("reads the node's descriptors")
    size = 16 * 1024 * 1024
    with connect(quiet) as connection:
        stored_bodies(connection, uid, 3, size)
    time.sleep(0.5)
    before = len(open_fds(quiet))
    raw = stalled_consumer(quiet, uid)
    time.sleep(0.5)
    assert len(open_fds(quiet)) > before + 1  # the socket, and the body's descriptor at least
    assert len(raw.recv(1 << 20)) > 0
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()
    deadline = time.monotonic() + 10
    while len(open_fds(quiet)) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(open_fds(quiet)) <= before
    with connect(quiet) as connection:
        channel = connection.channel()
        again: list[bytes] = []
        for _ in range(3):
            data = channel.basic_get(uid, auto_ack=True)[2]
            assert data is not None  # (all three back in the queue)
            again.append(data)
    assert [len(data) for data in again] == [size + number for number in range(3)]
    assert all(data == body(size + number) for number, data in enumerate(again))


def test_a_body_sent_from_the_store_arrives_whole_though_its_segment_is_compacted_away_meanwhile(start_broker, uid):
    """A consumer has not read a 16 MiB body sent from the store when the segment holding it is compacted: its
    record moves to a new segment and the old file goes (unlinked, the store's descriptor of it closed, new
    segments opened after it).  The delivery already begun still arrives byte-exact, read through the descriptor
    it holds."""
    node = start_broker("--segment-size", str(64 << 20), "--compaction-threshold", "0.3")
    size, filler = 16 * 1024 * 1024, 1024 * 1024
    with connect(node) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True)
        channel.queue_declare(f"{uid}-filler", durable=True)
        raw = stalled_consumer(node, uid)
        channel.confirm_delivery()
        for number in range(40):
            channel.basic_publish("", f"{uid}-filler", body(filler + number), pika.BasicProperties(delivery_mode=2))
        channel.basic_publish("", uid, body(size), pika.BasicProperties(delivery_mode=2))
        for number in range(10):  # the segment fills: the next one is written
            channel.basic_publish("", f"{uid}-filler", body(filler + number), pika.BasicProperties(delivery_mode=2))
        for _ in range(50):  # 50 of the first segment's 66 MiB dead: it is compacted once quiet
            channel.basic_get(f"{uid}-filler", auto_ack=True)
        deadline = time.monotonic() + 20
        while not any("msg_store" in name and name.endswith("(deleted)") for name in open_fds(node)):
            assert time.monotonic() < deadline, "the body's segment was not compacted away"
            time.sleep(0.2)  # a commit unlinks the file that compaction emptied
            channel.basic_publish("", f"{uid}-filler", b"", pika.BasicProperties(delivery_mode=2))
        for number in range(20):  # new segment files, which may take the closed descriptor's number
            channel.basic_publish("", f"{uid}-filler", body(filler + number), pika.BasicProperties(delivery_mode=2))
        frames = read_frames(raw, size)
        raw.close()
    assert [ftype for ftype, _channel, _payload in frames[:2]] == [1, 2]
    assert b"".join(payload for ftype, _channel, payload in frames if ftype == 3) == body(size)


def test_a_stream_s_large_bodies_reach_a_consumer_and_warren_s_peek_whole(broker, uid):
    """The bodies a stream's decoded entries leave in the segment file go from there to a consumer, and are read
    for Warren's peek, which answers them whole: byte-exact both ways, the peek after the consumer."""
    with connect(broker) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=STREAM)
        publish_all(connection, uid, delivery_mode=2)
        assert_bodies(consume(connection, uid, arguments=FROM_FIRST))
        peeked = call(broker, "GET", f"/api/queues/%2F/{uid}/peek?count={len(SIZES)}&encoding=base64")
        connection.channel().queue_delete(uid)
    assert peeked.status == 200, peeked.raw
    assert_bodies([base64.b64decode(item["payload"]) for item in peeked.json])


def test_a_body_sent_from_a_stream_arrives_whole_though_retention_removes_its_segment_meanwhile(quiet, uid):
    """A consumer has not read a 16 MiB body sent from a stream's segment file when retention removes that
    segment (unlinked, the log's descriptors of it closed): the delivery already begun still arrives byte-exact,
    read through the descriptor it holds."""
    if not rss(quiet):
        pytest.skip("reads the node's descriptors")
    size = 16 * 1024 * 1024
    with connect(quiet) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True, arguments={**STREAM, "x-max-length-bytes": 20_000_000,
                                                            "x-stream-max-segment-size-bytes": 1_000_000})
        channel.confirm_delivery()
        channel.basic_publish("", uid, body(size), pika.BasicProperties(delivery_mode=2))
        raw = stalled_consumer(quiet, uid, prefetch=1, arguments=FROM_FIRST)
        for number in range(1, 3):  # a segment each: past 20 MB, the first goes
            channel.basic_publish("", uid, body(size + number), pika.BasicProperties(delivery_mode=2))
        assert channel.queue_declare(uid, passive=True).method.message_count < 3
        assert any(name.endswith(".segment (deleted)") for name in open_fds(quiet))
        frames = read_frames(raw, size)
        raw.close()
        channel.queue_delete(uid)
    assert [ftype for ftype, _channel, _payload in frames[:2]] == [1, 2]
    assert b"".join(payload for ftype, _channel, payload in frames if ftype == 3) == body(size)


def test_consumers_that_do_not_read_hold_no_bodies_in_the_node(quiet, uid):
    """Eight consumers that read nothing are each sent a 16 MiB persistent body: what waits for them is a
    window of frames each (the transport's buffer), not their bodies (128 MiB)."""
    if not rss(quiet):
        pytest.skip("reads the node's memory")
    size, count = 16 * 1024 * 1024, 8
    with connect(quiet) as connection:
        channel = connection.channel()
        channel.queue_declare(uid, durable=True)
        stalled = [stalled_consumer(quiet, uid) for _ in range(count)]
        for raw in stalled:
            raw.send_method(1, commands.Basic.Qos(prefetch_count=1))
            raw.expect(commands.Basic.QosOk)
        channel.confirm_delivery()
        before = peak = rss(quiet)
        for number in range(count):
            channel.basic_publish("", uid, body(size + number), pika.BasicProperties(delivery_mode=2))
            peak = max(peak, rss(quiet))
        time.sleep(1)
        held = rss(quiet) - before
        assert channel.queue_declare(uid, passive=True).method.message_count == 0  # all sent
        for raw in stalled:
            raw.close()
        channel.queue_delete(uid)
    assert held < 64 * 1024 * 1024, f"{held >> 20} MiB held for {count} consumers that do not read"


def stream_of_large_bodies(broker, connection, queue: str) -> int:
    """A stream holding 16 bodies of 16 MiB, 16 MiB + 1... octets, confirmed: the node's RSS then, at rest."""
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments=STREAM)
    channel.confirm_delivery()
    for number in range(16):
        channel.basic_publish("", queue, body((16 << 20) + number), pika.BasicProperties(delivery_mode=2))
    time.sleep(0.5)
    return rss(broker)


def test_stream_consumers_that_do_not_read_hold_no_bodies_in_the_node(quiet, uid):
    """A stream of 16 bodies of 16 MiB read by eight consumers with prefetch 100, each from an offset of its own,
    that read nothing: what waits for them is a window of frames each, not a body each (128 MiB) nor the bodies
    each was sent."""
    if not rss(quiet):
        pytest.skip("reads the node's memory")
    with connect(quiet) as connection:
        before = stream_of_large_bodies(quiet, connection, uid)
        stalled = [stalled_consumer(quiet, uid, prefetch=100, arguments={"x-stream-offset": 2 * number})
                   for number in range(8)]
        time.sleep(2)
        held = rss(quiet) - before
        for raw in stalled:
            raw.close()
        connection.channel().queue_delete(uid)
    assert held < 64 * 1024 * 1024, f"{held >> 20} MiB held for 8 stream consumers that do not read"


def test_a_prefetch_100_stream_consumer_of_large_bodies_makes_the_node_hold_none(quiet, uid):
    """A consumer with prefetch 100 reads a stream of 16 bodies of 16 MiB from the first, acking none until it
    has them all: the node's peak RSS grows by a body or two, not with the bodies in flight; each arrives
    byte-exact."""
    if not rss(quiet):
        pytest.skip("reads the node's memory")
    with connect(quiet) as connection:
        before = stream_of_large_bodies(quiet, connection, uid)
        reset_peak(quiet)
        consumer, exact, tags = held_by_a_consumer(connection, uid, 16, 16 << 20, FROM_FIRST)
        delivered = rss(quiet, "VmHWM") - before
        consumer.basic_ack(tags[-1], multiple=True)
        channel = connection.channel()
        channel.queue_delete(uid)
    assert exact == [True] * 16
    assert delivered < 48 * 1024 * 1024, f"{delivered >> 20} MiB more held delivering"


@pytest.mark.parametrize("arguments", [{}, QUORUM], ids=["classic", "quorum"])
def test_large_bodies_come_back_byte_exact_after_a_crash_and_again_when_requeued(start_broker, uid, arguments):
    """Confirmed large bodies are there after ``kill -9`` (recovered: route, header and body in the store), and
    requeued once delivered they come back byte-exact again."""
    node = start_broker()
    with connect(node) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments=arguments)
        publish_all(connection, uid, delivery_mode=2)
    node.kill()
    node = start_broker(data_dir=node.data_dir)
    with connect(node) as connection:
        held_and_requeued(connection, uid, len(SIZES))
        assert_bodies(consume(connection, uid))


def requeued_without_bodies(connection, queue: str, sizes: list[int], arguments: dict | None = None) -> None:
    """Persistent bodies of ``sizes`` in ``queue``, delivered once for manual ack and requeued: the node holds
    them in its store only (an unacked large delivery holds no body)."""
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments=arguments)
    channel.confirm_delivery()
    for size in sizes:
        channel.basic_publish("", queue, body(size), pika.BasicProperties(delivery_mode=2))
    held_and_requeued(connection, queue, len(sizes))


def holding(connection, queue: str, count: int):
    """A channel of a consumer that has been delivered the ``count`` messages of ``queue`` for manual ack, and
    their delivery tags."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=count)
    held: list[int] = []
    channel.basic_consume(queue, lambda _ch, method, _properties, _data: held.append(method.delivery_tag or 0))
    deadline = time.monotonic() + 60
    while len(held) < count and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert len(held) == count
    return channel, held


def held_and_requeued(connection, queue: str, count: int) -> None:
    """The ``count`` messages of ``queue`` delivered to a consumer for manual ack, and requeued as its channel
    closes."""
    holding(connection, queue, count)[0].close()


@pytest.mark.parametrize("arguments", [{}, QUORUM], ids=["classic", "quorum"])
@pytest.mark.parametrize("how", ["consume-no-ack", "get-no-ack", "get-ack"])
def test_a_large_body_not_in_memory_goes_from_the_store_unread_without_ack_and_to_basic_get(quiet, uid, how,
                                                                                             arguments):
    """Large stored bodies that are not in memory (requeued) go from the store's file, not read back into memory
    first, to a consumer without acks and to basic.get (with or without ack): byte-exact, and gone from the
    queue once taken without ack."""
    if not rss(quiet):
        pytest.skip("reads the node's counters")
    sizes = [16 * 1024 * 1024 + number for number in range(3)]
    with connect(quiet) as connection:
        requeued_without_bodies(connection, uid, sizes, arguments)
        channel = connection.channel()
        before = read_octets(quiet)
        got: list[bytes] = []
        if how == "consume-no-ack":
            channel.basic_consume(uid, lambda _ch, _method, _properties, data: got.append(data), auto_ack=True)
            deadline = time.monotonic() + 60
            while len(got) < len(sizes) and time.monotonic() < deadline:
                connection.process_data_events(0.05)
        else:
            for _ in sizes:
                method, _properties, data = channel.basic_get(uid, auto_ack=how == "get-no-ack")
                assert method is not None and data is not None
                got.append(data)
                if how == "get-ack":
                    channel.basic_ack(method.delivery_tag or 0)
        read = read_octets(quiet) - before
        assert channel.queue_declare(uid, passive=True).method.message_count == 0
    assert [data == body(size) for size, data in zip(sizes, got)] == [True] * len(sizes)
    assert read < HEADS_READ, f"{read} octets read to send {sum(sizes)}"


def read_calls(broker) -> int:
    """How many reads the node has made of files and sockets."""
    with open(f"/proc/{broker.proc.pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("syscr:"))


def test_publishes_of_64_kib_bodies_are_read_several_to_a_read(quiet, uid):
    """Bodies smaller than a read (64 KiB) go through the read buffer with the frames around them, several
    publishes to a read, not read into each message's buffer at two reads a publish at least (its frames before
    the body, then the body): a read and a loop turn a message cost the node more than the copy they save."""
    if not rss(quiet):
        pytest.skip("reads the node's counters")
    count, size = 200, 64 * 1024
    with connect(quiet) as connection:
        channel = connection.channel()
        channel.queue_declare(uid)
        raw = Raw(quiet, timeout=30)
        raw.handshake()
        raw.open_channel(1)
        before = read_calls(quiet)
        raw.send(b"".join(publish_frames(1, "", uid, body(size + number % 3)) for number in range(count)))
        deadline = time.monotonic() + 30
        while channel.queue_declare(uid, passive=True).method.message_count < count:
            assert time.monotonic() < deadline, "the publishes did not all arrive"
            time.sleep(0.05)
        reads = read_calls(quiet) - before
        raw.close()
        got = [channel.basic_get(uid, auto_ack=True)[2] for _ in range(3)]
    assert got == [body(size + number) for number in range(3)]
    assert reads < count * 3 // 2, f"{reads} reads for {count} publishes"


def test_a_stored_body_held_for_its_ack_goes_from_memory_without_a_descriptor(quiet, uid):
    """A persistent 64 KiB body delivered for manual ack is held by the node until acked anyway: it goes from
    memory, as a smaller one does, not as a range of the store's file with a descriptor of its own (taken and
    closed for each delivery, and held while the client does not read)."""
    if not rss(quiet):
        pytest.skip("reads the node's descriptors")
    count, size = 100, 64 * 1024
    with connect(quiet) as connection:
        channel = stored_bodies(connection, uid, count, size)
        time.sleep(0.5)
        before = len(open_fds(quiet))
        raw = stalled_consumer(quiet, uid)  # reads nothing: most deliveries wait in the node
        deadline = time.monotonic() + 20
        while channel.queue_declare(uid, passive=True).method.message_count:
            assert time.monotonic() < deadline, "not all delivered"
            time.sleep(0.05)
        time.sleep(0.2)
        held = len(open_fds(quiet)) - before
        frames = read_frames(raw, sum(size + number for number in range(count)))
        raw.close()
    assert held <= 1, f"{held} descriptors more (the consumer's socket is one)"
    bodies = [payload for ftype, _channel, payload in frames if ftype == 3]
    assert bodies == [body(size + number) for number in range(count)]


def test_a_nack_of_many_held_large_bodies_dead_letters_them_a_body_at_a_time(quiet, uid):
    """16 persistent 16 MiB messages (256 MiB) held by a consumer (the node holds none of their bodies), then
    nacked at once without requeue to a dead-letter queue: the node reads each body back for its dead letter as
    it goes, not all of them first; the dead letters arrive byte-exact with their x-death."""
    if not rss(quiet):
        pytest.skip("reads the node's memory")
    count, size = 16, 16 * 1024 * 1024
    with connect(quiet) as connection:
        channel = connection.channel()
        channel.queue_declare(f"{uid}-dead", durable=True)
        stored_bodies(connection, uid, count, size, {"x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": f"{uid}-dead"})
        holder, held = holding(connection, uid, count)
        before = rss(quiet)
        reset_peak(quiet)
        holder.basic_nack(held[-1], multiple=True, requeue=False)
        dead = channel.queue_declare(f"{uid}-dead", passive=True).method.message_count
        grew = rss(quiet, "VmHWM") - before
        got: list[tuple[bytes, Any]] = []
        for _ in range(count):
            method, properties, data = channel.basic_get(f"{uid}-dead", auto_ack=True)
            assert method is not None and properties is not None and data is not None
            headers: Any = properties.headers
            got.append((data, headers["x-death"][0]["reason"]))
        channel.queue_delete(uid)
        channel.queue_delete(f"{uid}-dead")
    assert dead == count
    assert [(data == body(size + number), reason) for number, (data, reason) in enumerate(got)] == [
        (True, "rejected")] * count
    assert grew < 128 * 1024 * 1024, f"{grew >> 20} MiB more held dead-lettering"


@pytest.mark.parametrize("arguments", [{}, QUORUM], ids=["classic", "quorum"])
@pytest.mark.parametrize("ackmode", ["ack_requeue_true", "ack_requeue_false"])
def test_the_http_api_s_get_of_large_stored_bodies_reads_what_it_answers(quiet, uid, ackmode, arguments):
    """The HTTP API's "get messages" of large persistent bodies the node holds in its store only: with
    ``truncate``, as much of each body as it answers is read from the store's file, not the body; without,
    each payload is whole and byte-exact.  Taken without ack, they are gone; else they are back, byte-exact."""
    if not rss(quiet):
        pytest.skip("reads the node's counters")
    sizes = [16 * 1024 * 1024 + number for number in range(3)]
    path = f"/api/queues/%2F/{uid}/get"
    with connect(quiet) as connection:
        requeued_without_bodies(connection, uid, sizes, arguments)
        before = read_octets(quiet)
        cut = call(quiet, "POST", path, {"count": 3, "ackmode": "ack_requeue_true", "encoding": "base64",
                                          "truncate": 100})
        read = read_octets(quiet) - before
        assert cut.status == 200, cut.raw
        assert [(item["payload_bytes"], base64.b64decode(item["payload"])) for item in cut.json] == [
            (size, body(size)[:100]) for size in sizes]
        whole = call(quiet, "POST", path, {"count": 3, "ackmode": ackmode, "encoding": "base64"})
        read_whole = read_octets(quiet) - before - read
        assert whole.status == 200, whole.raw
        assert [base64.b64decode(item["payload"]) == body(size) for item, size in zip(whole.json, sizes)] == [
            True] * len(sizes)
        channel = connection.channel()
        left = channel.queue_declare(uid, passive=True).method.message_count
        again = [channel.basic_get(uid, auto_ack=True)[2] for _ in range(left)]
        channel.queue_delete(uid)
    assert read < HEADS_READ, f"{read} octets read to answer 100 of each of {sizes}"
    assert read_whole >= sum(sizes)  # (what it answers whole, it reads whole)
    if ackmode == "ack_requeue_false":
        assert left == 0
    else:
        assert [data == body(size) for data, size in zip(again, sizes)] == [True] * len(sizes)


@pytest.mark.parametrize("arguments", [{}, QUORUM], ids=["classic", "quorum"])
def test_the_http_api_s_peek_of_large_stored_bodies_reads_what_it_answers(quiet, uid, arguments):
    """Warren's peek of large persistent bodies its queue left in the store (a consumer or a restart can): with
    ``truncate``, as much of each as it answers is read from the store's file, not the body; without, each
    payload is whole and byte-exact; the queue holds them as before, in their order."""
    if not rss(quiet):
        pytest.skip("reads the node's counters")
    sizes = [16 * 1024 * 1024 + number for number in range(3)]
    path = f"/api/queues/%2F/{uid}/peek"
    with connect(quiet) as connection:
        stored_bodies(connection, uid, len(sizes), sizes[0], arguments)
        before = read_octets(quiet)
        cut = call(quiet, "GET", f"{path}?count=3&encoding=base64&truncate=100")
        read = read_octets(quiet) - before
        assert cut.status == 200, cut.raw
        assert [(item["payload_bytes"], base64.b64decode(item["payload"])) for item in cut.json] == [
            (size, body(size)[:100]) for size in sizes]
        whole = call(quiet, "GET", f"{path}?count=3&encoding=base64")
        assert whole.status == 200, whole.raw
        assert [base64.b64decode(item["payload"]) == body(size) for item, size in zip(whole.json, sizes)] == [
            True] * len(sizes)
        channel = connection.channel()
        again = [channel.basic_get(uid, auto_ack=True)[2] for _ in sizes]
        channel.queue_delete(uid)
    assert read < HEADS_READ, f"{read} octets read to answer 100 of each of {sizes}"
    assert [data == body(size) for data, size in zip(again, sizes)] == [True] * len(sizes)
