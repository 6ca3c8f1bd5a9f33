"""AMQP 1.0 on the AMQP port, as RabbitMQ 4.x serves it: Qpid Proton's blocking API and pika against one node
(in this process, its loop in a thread), raw frames for protocol violations and the pre-login limits.

What the node answers is checked against RabbitMQ 4.2's texts (rabbit_amqp_reader, rabbit_amqp_session)."""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, Iterator

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_server.config import Config
from stream_log import amqp10
from stream_log.amqp10 import described, encode_list, symbol, uint, utf8
from conftest import free_port
from support import Running, delivery_tag, get_within, headers_of, start

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton.reactor import AtMostOnce  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

pytestmark = pytest.mark.timeout(60)

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Running]:
    running = start(tmp_path)
    yield running
    running.stop()


def url(node: Running, user: str = "guest", password: str = "guest") -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{node.port}"


def binary(message: Message) -> bytes:
    """The body of a message sent as data: Proton gives a memoryview, which its types leave out."""
    body: object = message.body
    assert isinstance(body, (bytes, memoryview)), body
    return bytes(body)


def connect(node: Running) -> BlockingConnection:
    return BlockingConnection(url(node), timeout=10, allowed_mechs="PLAIN")


def declare(node: Running, name: str, **arguments: Any) -> pika.BlockingConnection:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    connection.channel().queue_declare(name, durable=True, arguments=arguments or None)
    return connection


# -- Qpid Proton -----------------------------------------------------------------------------------------------


def test_proton_sends_to_a_queue_and_receives_what_it_sent(node):
    declare(node, "q").close()
    connection = connect(node)
    try:
        sender = connection.create_sender("/queues/q")
        for i in range(5):
            sender.send(Message(body=f"message {i}".encode(), durable=True))  # waits for the accepted outcome
        receiver = connection.create_receiver("/queues/q", credit=3)
        got = []
        for _ in range(5):
            message = receiver.receive(timeout=5)
            got.append(binary(message))
            receiver.accept()
        assert got == [f"message {i}".encode() for i in range(5)]
    finally:
        connection.close()
    pika_connection = declare(node, "q")
    assert pika_connection.channel().queue_declare("q", passive=True).method.message_count == 0
    pika_connection.close()


def test_a_message_keeps_its_amqp10_sections_through_a_restart(tmp_path):
    """What a durable queue holds of a 1.0 publish is the message as it came: after a restart (read back from the
    store) an AMQP 1.0 reader gets the same ids, creation time to the millisecond and typed application
    properties, not the message rebuilt from its 0-9-1 view."""
    import uuid

    from proton import ubyte
    node = start(tmp_path)
    message_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    sent = Message(body=b"kept", durable=True, id=message_id, correlation_id=b"\x00binary",
                   creation_time=1_700_000_000.123, properties={"x-k": ubyte(7), "n": -1})
    try:
        declare(node, "kept").close()
        connection = connect(node)
        try:
            connection.create_sender("/queues/kept").send(sent)
        finally:
            connection.close()
    finally:
        node.stop()
    node = start(tmp_path)
    try:
        connection = connect(node)
        try:
            got = connection.create_receiver("/queues/kept", credit=1).receive(timeout=5)
        finally:
            connection.close()
    finally:
        node.stop()
    assert (binary(got), got.id, got.correlation_id, got.creation_time) == (b"kept", message_id, b"\x00binary",
                                                                            1_700_000_000.123)
    properties = got.properties
    assert properties is not None and properties == {"x-k": 7, "n": -1} and type(properties["x-k"]) is ubyte


def test_a_message_larger_than_a_frame_goes_both_ways_in_several_transfers(node):
    declare(node, "big").close()
    body = bytes(range(256)) * 2048  # 512 KiB: four 128 KiB frames at least
    connection = connect(node)
    try:
        connection.create_sender("/queues/big").send(Message(body=body))
        message = connection.create_receiver("/queues/big").receive(timeout=10)
        assert binary(message) == body
    finally:
        connection.close()


def unsettled_bodies(node: Running) -> list[bytes | None]:
    """The bodies the node's AMQP 1.0 sessions hold for the deliveries they wait to have settled."""
    from amqp_server.amqp1.connection import Amqp10Connection

    assert node.node is not None
    return [entry.message.body for connection in node.node.clients.connections
            if isinstance(connection, Amqp10Connection) for session in connection.sessions.values()
            for entry, _queue, _consumer in session.unsettled.values()]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("restart", [False, True], ids=["stored", "recovered"])
def test_large_stored_bodies_reach_a_receiver_of_small_frames_from_the_store(tmp_path, monkeypatch, restart,
                                                                             queue_type):
    """Persistent bodies of 1 MiB and 3 MiB + 7 octets in a durable queue (classic or quorum), as stored or
    recovered after a restart, reach an AMQP 1.0 receiver of 16 KiB frames byte-exact, in many transfers, from the
    store's file: never read whole into the node (``Persistence.load_body``), nor held for the deliveries it waits
    to have settled; released, they come back so too (a quorum queue's to its back)."""
    from test_large_bodies import body

    from amqp_server.queues.persistence import Persistence

    sizes = [1 << 20, (3 << 20) + 7]
    node = start(tmp_path)
    try:
        connection = declare(node, "large", **{"x-queue-type": queue_type})
        channel = connection.channel()
        channel.confirm_delivery()
        for size in sizes:
            channel.basic_publish("", "large", body(size), pika.BasicProperties(delivery_mode=2))
        connection.close()
        if restart:
            node.stop()
            node = start(tmp_path)
        read: list[int] = []
        load_body = Persistence.load_body

        def counted(self: Persistence, message: Any) -> None:
            read.append(message.body_size)
            load_body(self, message)

        monkeypatch.setattr(Persistence, "load_body", counted)
        client = BlockingConnection(url(node), timeout=10, allowed_mechs="PLAIN", max_frame_size=16384)
        try:
            receiver = client.create_receiver("/queues/large", credit=10)
            first = [binary(receiver.receive(timeout=10)) for _ in sizes]
            held = node.call(lambda: unsettled_bodies(node))
            for _ in sizes:
                receiver.release(delivered=False)
            again = [binary(receiver.receive(timeout=10)) for _ in sizes]
            for _ in sizes:
                receiver.accept()
        finally:
            client.close()
    finally:
        node.stop()
    assert [len(got) for got in first] == [len(got) for got in again] == sizes
    assert [got == body(size) for got, size in zip(first + again, sizes + sizes)] == [True] * 4
    assert held == [None, None]
    assert read == []


@pytest.mark.parametrize("max_frame_size", [None, 16384], ids=["default-frames", "small-frames"])
def test_large_bodies_of_a_stream_reach_a_receiver_from_the_segment_file(tmp_path, monkeypatch, max_frame_size):
    """Bodies at the edges of framing and one of 16 MiB, published over AMQP 0-9-1 to a stream, reach an AMQP 1.0
    receiver byte-exact (in transfers of its frames): the 16 MiB one from the segment file, never read into the
    node (its largest read is a part of a chunk), nor held for the delivery it waits to have settled."""
    from test_large_bodies import SIZES, body
    from proton import Described, symbol
    from proton.reactor import Filter

    node = start(tmp_path)
    try:
        connection = declare(node, "large", **{"x-queue-type": "stream"})
        channel = connection.channel()
        channel.confirm_delivery()
        for size in SIZES:
            channel.basic_publish("", "large", body(size), pika.BasicProperties(delivery_mode=2))
        connection.close()
        reads: list[int] = []
        pread = os.pread

        def counted(fd: int, size: int, pos: int) -> bytes:
            reads.append(size)
            return pread(fd, size, pos)

        monkeypatch.setattr(os, "pread", counted)
        client = BlockingConnection(url(node), timeout=10, allowed_mechs="PLAIN", max_frame_size=max_frame_size)
        try:
            receiver = client.create_receiver("/queues/large", credit=10, options=Filter(
                {symbol("from start"): Described(symbol("rabbitmq:stream-offset-spec"), "first")}))
            got = [binary(receiver.receive(timeout=10)) for _ in SIZES]
            held = node.call(lambda: unsettled_bodies(node))
            for _ in SIZES:
                receiver.accept()
        finally:
            client.close()
    finally:
        node.stop()
    assert [len(data) for data in got] == SIZES
    assert [data == body(size) for data, size in zip(got, SIZES)] == [True] * len(SIZES)
    assert held[-1] is None, "the 16 MiB body is held for its settlement"
    assert max(reads) < 1 << 20


def test_pre_settled_both_ways(node):
    declare(node, "settled").close()
    connection = connect(node)
    try:
        sender = connection.create_sender("/queues/settled", options=AtMostOnce())
        for i in range(3):
            sender.send(Message(body=f"m{i}"))
        receiver = connection.create_receiver("/queues/settled", options=AtMostOnce())
        assert [receiver.receive(timeout=5).body for _ in range(3)] == ["m0", "m1", "m2"]
    finally:
        connection.close()
    pika_connection = declare(node, "settled")
    assert pika_connection.channel().queue_declare("settled", passive=True).method.message_count == 0
    pika_connection.close()


def test_a_release_requeues_and_a_reject_dead_letters(node):
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.queue_declare("dlq")
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    amqp = connect(node)
    try:
        amqp.create_sender("/queues/work").send(Message(body="once"))
        receiver = amqp.create_receiver("/queues/work", credit=1)
        assert receiver.receive(timeout=5).body == "once"
        receiver.release()
        assert receiver.receive(timeout=5).body == "once"  # requeued, delivered again
        receiver.reject()
        with pytest.raises(proton.Timeout):
            receiver.receive(timeout=0.3)  # (Proton sends the disposition as it next works)
        deadline = time.monotonic() + 5
        body = None
        while body is None and time.monotonic() < deadline:  # (the disposition is not waited for)
            _, _, body = channel.basic_get("dlq", auto_ack=True)
        assert channel.queue_declare("work", passive=True).method.message_count == 0
        assert body is not None and body.endswith(b"once")  # an amqp-value body: its encoded section
    finally:
        amqp.close()
        connection.close()


def test_released_requeues_a_quorum_queues_message_without_counting_a_delivery_and_a_failed_one_counts(node):
    """RabbitMQ 4.x: ``released`` returns a message uncounted (no x-delivery-count, no step to the delivery
    limit); ``modified`` with delivery-failed counts one, and past the limit the message goes."""
    from proton import Delivery

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 2})
    channel.basic_publish("", "qq", b"poison")
    amqp = connect(node)
    try:
        receiver = amqp.create_receiver("/queues/qq", credit=1)
        for _ in range(5):  # more releases than the limit allows returns
            assert receiver.receive(timeout=5).body == b"poison"
            receiver.release(delivered=False)
        assert receiver.receive(timeout=5).body == b"poison"
        receiver.close()  # (with the message unsettled: a consumer gone counts one return)
    finally:
        amqp.close()
    method, properties, body = get_within(channel, "qq")
    assert method is not None and body == b"poison"
    assert headers_of(properties)["x-delivery-count"] == 1  # the consumer gone, not the five releases
    channel.basic_nack(delivery_tag(method), requeue=False)  # (dead-lettered nowhere: gone)
    channel.basic_publish("", "qq", b"failing")
    amqp = connect(node)
    try:
        receiver = amqp.create_receiver("/queues/qq", credit=1)
        for _ in range(3):  # delivery-failed twice is the limit; the third time it goes
            assert receiver.receive(timeout=5).body == b"failing"
            assert receiver.fetcher is not None  # (a blocking receiver's)
            receiver.fetcher.unsettled[0].local.failed = True
            receiver.settle(Delivery.MODIFIED)
        with pytest.raises(proton.Timeout):
            receiver.receive(timeout=0.5)
    finally:
        amqp.close()
    assert channel.queue_declare("qq", passive=True).method.message_count == 0
    connection.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_redelivery_says_it_is_no_first_acquirer_and_the_failed_deliveries_a_quorum_queue_counted(node, queue_type):
    """mc_amqp:protocol_state: the header says ``first-acquirer`` on a first delivery, not on a redelivery, whose
    ``delivery-count`` is the failed deliveries a quorum queue counted (rabbit_quorum_queue: ``released`` counts
    none); a classic queue counts none."""
    declare(node, "q", **{"x-queue-type": queue_type}).close()
    amqp = connect(node)
    try:
        amqp.create_sender("/queues/q").send(Message(body=b"m"))
        receiver = amqp.create_receiver("/queues/q", credit=1)
        got = []
        for settle in (lambda: _modify(receiver, {}, failed=True), lambda: receiver.release(delivered=False),
                       receiver.accept):
            message = receiver.receive(timeout=5)
            got.append((message.first_acquirer, message.delivery_count))
            settle()
    finally:
        amqp.close()
    counted = 1 if queue_type == "quorum" else 0
    assert got == [(True, 0), (False, counted), (False, counted)]


def test_credit_bounds_what_the_node_sends(node):
    declare(node, "credit").close()
    connection = connect(node)
    try:
        sender = connection.create_sender("/queues/credit")
        for i in range(10):
            sender.send(Message(body=i))
        receiver = connection.create_receiver("/queues/credit", credit=0)
        time.sleep(0.3)
        fetcher = receiver.fetcher
        assert fetcher is not None  # (a blocking receiver's)
        assert fetcher.incoming.__len__() == 0  # no credit, nothing sent
        receiver.flow(2)
        got = [receiver.receive(timeout=5).body for _ in range(2)]
        time.sleep(0.3)
        assert got == [0, 1] and len(fetcher.incoming) == 0
    finally:
        connection.close()


def test_a_receivers_rabbitmq_priority_property_is_its_consumer_priority(node):
    """RabbitMQ 4.x's parse_attach_properties makes the link property ``rabbitmq:priority`` (an int) the consumer's
    ``x-priority``: the higher consumer gets every message while it has credit (they were shared round-robin)."""
    from proton import int32, symbol
    from proton.reactor import LinkOption

    class Priority(LinkOption):
        def __init__(self, value: Any) -> None:
            self.value = value

        def apply(self, link: Any) -> None:
            link.properties = {symbol("rabbitmq:priority"): self.value}

    declare(node, "prio").close()
    connection = connect(node)
    try:
        low = connection.create_receiver("/queues/prio", credit=10, name="low")
        high = connection.create_receiver("/queues/prio", credit=10, name="high", options=Priority(int32(5)))
        ignored = connection.create_receiver("/queues/prio", credit=10, name="ignored",
                                             options=Priority("9"))  # not an int
        sender = connection.create_sender("/queues/prio")
        for i in range(4):
            sender.send(Message(body=i))
        assert [high.receive(timeout=5).body for _ in range(4)] == [0, 1, 2, 3]
        time.sleep(0.3)
        for other in (low, ignored):
            assert other.fetcher is not None and len(other.fetcher.incoming) == 0
    finally:
        connection.close()


def test_unknown_queue_is_refused_as_rabbitmq_refuses_it(node):
    connection = connect(node)
    try:
        with pytest.raises(proton.utils.LinkDetached) as refused:
            connection.create_receiver("/queues/missing")
        assert "amqp:not-found" in str(refused.value)
        assert "no queue 'missing' in vhost '/'" in str(refused.value)
    finally:
        connection.close()


def test_another_connections_exclusive_queue_is_refused_in_rabbitmq_4s_amqp10_words(node):
    """rabbit_amqp_session ``handle_attach`` refuses a receiver on another connection's exclusive queue with
    amqp:resource-locked and its own text, without 0-9-1's explanation (which it had)."""
    owner = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    owner.channel().queue_declare("mine", exclusive=True)
    connection = connect(node)
    try:
        with pytest.raises(proton.utils.LinkDetached) as refused:
            connection.create_receiver("/queues/mine")
        assert "Condition('amqp:resource-locked', \"cannot obtain exclusive access to locked queue 'mine' in " \
               "vhost '/'\")" in str(refused.value)
    finally:
        connection.close()
        owner.close()


def test_open_says_rabbitmq_4_and_warren(node):
    connection = connect(node)
    try:
        assert connection.conn is not None  # (open)
        properties = connection.conn.remote_properties
        assert properties["product"] == "RabbitMQ" and properties["version"].startswith("4.2")
        assert "Warren" in properties["platform"]
    finally:
        connection.close()


def test_wrong_password_is_refused(node, monkeypatch):
    from amqp_server.amqp1 import connection as amqp10_connection

    monkeypatch.setattr(amqp10_connection, "SILENT_CLOSE_DELAY", 0.1)
    with pytest.raises(proton.ConnectionException, match="amqp:unauthorized-access.*Authentication failed"):
        BlockingConnection(url(node, password="wrong"), timeout=10, allowed_mechs="PLAIN")


def test_anonymous_is_offered_only_when_configured(node, tmp_path):
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.sendall(SASL_HEADER)
        mechanisms = _read_frames(sock, 0x40)[-1][1][0].value
        assert [m.value for m in mechanisms] == ["PLAIN", "AMQPLAIN"]  # no ANONYMOUS by default
    with pytest.raises(proton.ConnectionException):
        BlockingConnection(f"amqp://127.0.0.1:{node.port}", timeout=10, allowed_mechs="ANONYMOUS")
    running = start(tmp_path / "anonymous", auth_mechanisms="PLAIN ANONYMOUS")
    try:
        connection = BlockingConnection(f"amqp://127.0.0.1:{running.port}", timeout=10, allowed_mechs="ANONYMOUS")
        declare(running, "anon").close()
        connection.create_sender("/queues/anon").send(Message(body="as guest"))
        connection.close()
    finally:
        running.stop()


# -- across protocols --------------------------------------------------------------------------------------------


def test_an_amqp10_publish_is_consumed_by_pika_with_its_properties(node):
    pika_connection = declare(node, "across")
    amqp = connect(node)
    try:
        pika_connection.channel().queue_bind("across", "amq.direct", "across-key")
        message = Message(body=b"payload", id="m-1", correlation_id="c-1", content_type="text/plain",
                          reply_to="replies", properties={"k": "v", "n": 7}, durable=True, priority=3,
                          inferred=True)  # a data section, as RabbitMQ's clients send
        amqp.create_sender("/exchanges/amq.direct/across-key").send(message)
    finally:
        amqp.close()
    method, props, body = pika_connection.channel().basic_get("across", auto_ack=True)
    pika_connection.close()
    assert body == b"payload" and method is not None and props is not None
    assert method.exchange == "amq.direct" and method.routing_key == "across-key"
    assert props.message_id == "m-1" and props.correlation_id == "c-1" and props.content_type == "text/plain"
    assert props.reply_to == "replies" and props.delivery_mode == 2 and props.priority == 3
    assert props.headers == {"k": "v", "n": 7}


def test_a_pika_publish_is_received_over_amqp10_with_its_properties(node):
    pika_connection = declare(node, "back")
    pika_connection.channel().basic_publish("", "back", b"from pika", pika.BasicProperties(
        message_id="p-1", content_type="application/octet-stream", delivery_mode=2, headers={"h": "x", "i": 5}))
    pika_connection.close()
    amqp = connect(node)
    try:
        message = amqp.create_receiver("/queues/back").receive(timeout=5)
    finally:
        amqp.close()
    assert binary(message) == b"from pika"
    assert message.id == "p-1" and message.content_type == "application/octet-stream" and message.durable
    assert message.properties == {"h": "x", "i": 5}
    assert message.annotations is not None and message.annotations["x-routing-key"] == "back"


def test_rabbitmq_3_v1_addresses_are_still_taken(node):
    pika_connection = declare(node, "v1")
    pika_connection.channel().queue_bind("v1", "amq.topic", "a.b")
    amqp = connect(node)
    try:
        amqp.create_sender("/topic/a.b").send(Message(body="by topic"))
        amqp.create_sender("/exchange/amq.topic/a.b").send(Message(body="by exchange"))
        amqp.create_sender("/amq/queue/v1").send(Message(body="by queue"))
        receiver = amqp.create_receiver("/amq/queue/v1")
        assert [receiver.receive(timeout=5).body for _ in range(3)] == ["by topic", "by exchange", "by queue"]
        receiver.accept()
    finally:
        amqp.close()
        pika_connection.close()


def test_unroutable_is_released(node):
    amqp = connect(node)
    try:
        sender = amqp.create_sender("/exchanges/amq.direct/nowhere")
        with pytest.raises(proton.utils.SendException) as released:
            sender.send(Message(body="lost"))
        assert released.value.state == proton.Delivery.RELEASED
    finally:
        amqp.close()


# -- raw frames ------------------------------------------------------------------------------------------------


def _frame(body: bytes, channel: int = 0, kind: int = 0) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, kind, channel) + body


def _performative(code: int, *fields: bytes) -> bytes:
    return described(code, encode_list(list(fields)))


def _read_frames(sock: socket.socket, until: int, timeout: float = 5.0) -> list[tuple[int, list[amqp10.Value]]]:
    """The performatives read until one with code ``until`` (or the socket closes)."""
    sock.settimeout(timeout)
    data = b""
    found: list[tuple[int, list[amqp10.Value]]] = []
    while True:
        while len(data) >= 8 and data.startswith(b"AMQP"):
            data = data[8:]
        while len(data) >= 8 and len(data) >= struct.unpack_from(">I", data)[0]:
            size, doff = struct.unpack_from(">IB", data)
            if size > doff * 4:
                value, _ = amqp10.value_at(data[doff * 4:size])
                found.append((value.value[0], value.value[1].value))
                if value.value[0] == until:
                    return found
            data = data[size:]
        chunk = sock.recv(65536)
        if not chunk:
            return found
        data += chunk


def _logged_in(node: Running) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", node.port))
    sock.sendall(SASL_HEADER + _frame(_performative(0x41, symbol("PLAIN"), amqp10.binary(b"\0guest\0guest")),
                                      kind=1))
    outcome = _read_frames(sock, 0x44)
    assert outcome[-1][0] == 0x44 and outcome[-1][1][0].value == 0
    sock.sendall(AMQP_HEADER + _frame(_performative(0x10, utf8("raw"))))
    assert _read_frames(sock, 0x10)[-1][0] == 0x10
    return sock


def _close_error(found: list[tuple[int, list[amqp10.Value]]], code: int = 0x18) -> tuple[str, str]:
    fields = found[-1][1]
    assert found[-1][0] == code, found
    error = fields[-1].value[1].value
    return error[0].value, error[1].value


def test_amqp10_without_sasl_is_refused_with_the_sasl_header(node):
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.settimeout(5)
        sock.sendall(AMQP_HEADER)
        data = b""
        while chunk := sock.recv(64):
            data += chunk
        assert data == SASL_HEADER


def test_a_frame_above_max_frame_size_closes_with_a_framing_error(node):
    sock = _logged_in(node)
    with sock:
        sock.sendall(struct.pack(">IBBH", 131073, 2, 0, 0))
        assert _close_error(_read_frames(sock, 0x18)) == (
            "amqp:connection:framing-error", "frame size (131073 bytes) > maximum frame size (131072 bytes)")


def test_a_transfer_on_an_unattached_handle_ends_the_session(node):
    sock = _logged_in(node)
    with sock:
        sock.sendall(_frame(_performative(0x11, amqp10.NULL, uint(0), uint(100), uint(100)), channel=1))
        assert _read_frames(sock, 0x11)[-1][0] == 0x11
        sock.sendall(_frame(_performative(0x14, uint(7), uint(0), amqp10.binary(b"t")), channel=1))
        assert _close_error(_read_frames(sock, 0x17), 0x17) == ("amqp:session:unattached-handle",
                                                                "link handle 7 is not attached")


def test_a_channel_above_channel_max_closes_with_a_framing_error(node):
    sock = _logged_in(node)
    with sock:
        sock.sendall(_frame(_performative(0x11, amqp10.NULL, uint(0), uint(100), uint(100)), channel=64))
        assert _close_error(_read_frames(sock, 0x18)) == (
            "amqp:connection:framing-error", "channel number (64) exceeds maximum channel number (63)")



def _sender_attached(sock: socket.socket, queue: str) -> list[tuple[int, list[amqp10.Value]]]:
    """A session begun and a link ``l`` attached to send to ``queue``: the performatives read up to the node's
    attach."""
    sock.sendall(_frame(_performative(0x11, amqp10.NULL, uint(0), uint(100), uint(100))))
    _read_frames(sock, 0x11)
    target = described(0x29, encode_list([utf8(f"/queues/{queue}")]))
    sock.sendall(_frame(_performative(0x12, utf8("l"), uint(0), amqp10.boolean(False), amqp10.NULL,
                                      amqp10.NULL, amqp10.NULL, target)))
    return _read_frames(sock, 0x12)

def test_an_alarm_grants_no_credit_and_a_transfer_beyond_it_detaches_the_link_with_the_condition_alone(node):
    """rabbit_amqp_session ``incoming_link_transfer`` (``Credit =< 0``): ``detach(HandleInt, Link,
    ?V_1_0_LINK_ERROR_TRANSFER_LIMIT_EXCEEDED)``, an error with no description."""
    declare(node, "nocredit").close()
    node.call(lambda: node.node.flow.block("memory"))
    sock = _logged_in(node)
    with sock:
        assert [code for code, _ in _sender_attached(sock, "nocredit")] == [0x12]
        with pytest.raises(socket.timeout):
            _read_frames(sock, 0x13, timeout=0.3)  # no flow: no credit while the alarm stands
        record = described(0x75, amqp10.binary(b"x"))
        sock.sendall(_frame(_performative(0x14, uint(0), uint(0), amqp10.binary(b"t"), uint(0),
                                          amqp10.boolean(True)) + record))
        found = _read_frames(sock, 0x16)
        assert found[-1][0] == DETACH and _error(found[-1][1], 2) == ("amqp:link:transfer-limit-exceeded", None)



def test_a_max_message_size_above_rabbitmq_s_ceiling_is_its_ceiling_for_amqp10_too(tmp_path):
    """A link a client sends on is told RabbitMQ's 512 MiB, not a larger configured size (a body over 1 GiB
    cannot be stored)."""
    capped = start(tmp_path, max_message_size=1 << 30)
    try:
        declare(capped, "big").close()
        sock = _logged_in(capped)
        with sock:
            attach = _sender_attached(sock, "big")[-1][1]
            assert attach[10].value == 512 << 20
    finally:
        capped.stop()


def _until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_the_handshake_deadline_counts_from_accept_not_from_the_sasl_header(tmp_path):
    """RabbitMQ's handshake timer is armed at accept (rabbit_reader:start_connection) and the AMQP 1.0 reader runs in
    the same process (rabbit_amqp_reader:handle_other(handshake_timeout, ...)): one deadline covers the wait for the
    header and SASL together, not a fresh one from the SASL header on."""
    running = start(tmp_path, handshake_timeout=2000)
    try:
        with socket.create_connection(("127.0.0.1", running.port)) as sock:
            connected = time.monotonic()
            time.sleep(1.6)
            sock.sendall(SASL_HEADER)  # then no sasl-init
            _until_closed(sock)
            took = time.monotonic() - connected
        assert took < 2.9, f"closed {took:.1f} s after connect, handshake_timeout is 2 s"
    finally:
        running.stop()


def test_before_login_a_huge_frame_is_refused_unread_and_a_wrong_password_gets_sasl_auth(node, monkeypatch):
    from amqp_server.amqp1 import connection as amqp10_connection

    monkeypatch.setattr(amqp10_connection, "SILENT_CLOSE_DELAY", 0.1)
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        started = time.monotonic()
        sock.sendall(SASL_HEADER + struct.pack(">IBBH", 2**31, 2, 1, 0) + b"x" * 65536)
        data = _until_closed(sock)
        assert time.monotonic() - started < 3
        assert [code for code, _ in _parse(data)] == [0x40]  # the mechanisms, then nothing: closed unread
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.sendall(SASL_HEADER + _frame(_performative(0x41, symbol("PLAIN"), amqp10.binary(b"\0guest\0nope")),
                                          kind=1))
        found = _parse(_until_closed(sock))
        assert [code for code, _ in found] == [0x40, 0x44] and found[-1][1][0].value == 1  # sasl-outcome auth


@pytest.mark.parametrize("mechanism, response", [("FOO", b"\0guest\0guest"), ("PLAIN", b"no-nul-bytes")])
def test_an_unknown_mechanism_or_a_malformed_response_gets_no_sasl_outcome(node, monkeypatch, mechanism, response):
    """rabbit_amqp_reader: auth_mechanism_to_module's not-found and auth_phase's decode-error are protocol errors
    before open (handle_exception: silent_close_delay, nothing sent); only refused credentials get a sasl-outcome."""
    from amqp_server.amqp1 import connection as amqp10_connection

    monkeypatch.setattr(amqp10_connection, "SILENT_CLOSE_DELAY", 0.1)
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.sendall(SASL_HEADER + _frame(_performative(0x41, symbol(mechanism), amqp10.binary(response)), kind=1))
        assert [code for code, _ in _parse(_until_closed(sock))] == [0x40]  # the mechanisms, then the close


def _parse(data: bytes) -> list[tuple[int, list[amqp10.Value]]]:
    found = []
    data = data[8:] if data.startswith(b"AMQP") else data
    while len(data) >= 8:
        size, doff = struct.unpack_from(">IB", data)
        value, _ = amqp10.value_at(data[doff * 4:size])
        found.append((value.value[0], value.value[1].value))
        data = data[size:]
    return found


def test_a_client_stalled_in_sasl_counts_among_the_handshakes(tmp_path):
    """Three AMQP 1.0 clients that send the SASL header and stall, with room for two handshakes: the oldest is
    closed to make room (the 0-9-1 front end's pool, entered again by the AMQP 1.0 one)."""
    running = start(tmp_path, handshakes_max=2)
    socks = []
    try:
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", running.port))
            sock.sendall(SASL_HEADER)
            socks.append(sock)
            time.sleep(0.2)
        waiting = lambda: running.node.clients.handshakes.waiting  # type: ignore[union-attr]  # noqa: E731
        deadline = time.monotonic() + 5
        while running.call(waiting) != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running.call(waiting) == 2
        _until_closed(socks[0])  # closed to make room (a reset may drop what it was sent): else a timeout
    finally:
        for sock in socks:
            sock.close()
        running.stop()


# -- RabbitMQ's own AMQP 1.0 client ------------------------------------------------------------------------------


def test_the_rabbitmq_client_declares_publishes_and_consumes_with_every_outcome(node):
    """Its README's first example: a quorum queue declared through /management, bound to an exchange, published
    to with outcomes, consumed with accept, requeue and discard, then the topology taken down."""
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    from rabbitmq_amqp_python_client import AMQPMessagingHandler

    class Done(Exception):
        pass

    class Handler(AMQPMessagingHandler):
        def __init__(self, actions: list[str]) -> None:
            super().__init__()
            self.actions = actions
            self.seen: list[str] = []

        def on_amqp_message(self, event: Any) -> None:
            self.seen.append(client.Converter.bytes_to_string(event.message.body))
            getattr(self.delivery_context, self.actions.pop(0))(event)
            if not self.actions:
                raise Done

    environment = client.Environment(uri=url(node))
    connection = environment.connection()
    connection.dial()
    management = connection.management()
    management.declare_exchange(client.ExchangeSpecification(name="orders"))
    management.declare_queue(client.QuorumQueueSpecification(name="orders-q"))
    info = management.queue_info("orders-q")
    assert info.name == "orders-q" and info.queue_type == client.QueueType.quorum and info.is_durable
    binding = management.bind(client.ExchangeToQueueBindingSpecification(
        source_exchange="orders", destination_queue="orders-q", binding_key="new"))
    publisher = connection.publisher(client.AddressHelper.exchange_address("orders", "new"))
    for i in range(3):
        status = publisher.publish(client.Message(body=client.Converter.string_to_bytes(f"order {i}")))
        assert status.remote_state == client.Delivery.ACCEPTED
    publisher.close()
    assert management.queue_info("orders-q").message_count == 3
    handler = Handler(["requeue", "accept", "discard", "accept"])
    consumer = connection.consumer(client.AddressHelper.queue_address("orders-q"), message_handler=handler)
    with pytest.raises(Done):
        consumer.run()
    consumer.close()
    assert handler.seen == ["order 0", "order 1", "order 2", "order 0"]  # (credit 10: all three were out)
    assert management.queue_info("orders-q").message_count == 0
    management.unbind(binding)
    management.delete_exchange("orders")
    assert management.purge_queue("orders-q") == 0
    management.delete_queue("orders-q")
    with pytest.raises(client.ValidationCodeException):
        management.queue_info("orders-q")  # 404
    management.close()
    connection.close()
    environment.close()


def test_the_rabbitmq_client_reads_a_stream_from_an_offset(node):
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    from rabbitmq_amqp_python_client import AMQPMessagingHandler

    class Done(Exception):
        pass

    class Handler(AMQPMessagingHandler):
        def __init__(self, wanted: int) -> None:
            super().__init__()
            self.wanted = wanted
            self.seen: list[str] = []

        def on_amqp_message(self, event: Any) -> None:
            self.seen.append(client.Converter.bytes_to_string(event.message.body))
            self.delivery_context.accept(event)
            if len(self.seen) == self.wanted:
                raise Done

    environment = client.Environment(uri=url(node))
    connection = environment.connection()
    connection.dial()
    management = connection.management()
    management.declare_queue(client.StreamSpecification(name="events", max_len_bytes=10_000_000))
    assert management.queue_info("events").queue_type == client.QueueType.stream
    publisher = connection.publisher(client.AddressHelper.queue_address("events"))
    for i in range(4):
        publisher.publish(client.Message(body=client.Converter.string_to_bytes(f"event {i}")))
    publisher.close()
    for offset, expected in ((client.OffsetSpecification.first, 4), (2, 2)):
        handler = Handler(expected)
        consumer = connection.consumer(client.AddressHelper.queue_address("events"), message_handler=handler,
                                       consumer_options=client.StreamConsumerOptions(offset_specification=offset))
        with pytest.raises(Done):
            consumer.run()
        consumer.close()
        assert handler.seen == [f"event {i}" for i in range(4 - expected, 4)]
    management.close()
    connection.close()
    environment.close()


def test_management_answers_with_rabbitmqs_codes(node):
    """(An authorization failure ends the session: test_amqp10_management.)"""
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    admin = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    admin.channel().queue_declare("taken", durable=True, arguments={"x-max-length": 5})
    admin.close()
    environment = client.Environment(uri=url(node))
    connection = environment.connection()
    connection.dial()
    management = connection.management()
    try:
        with pytest.raises(client.ValidationCodeException, match="ErrPreconditionFailed"):  # 409: inequivalent
            management.declare_queue(client.ClassicQueueSpecification(name="taken", max_len=6))
        with pytest.raises(client.ValidationCodeException, match="404"):
            management.queue_info("missing")
    finally:
        management.close()
        connection.close()
        environment.close()


def test_the_http_api_lists_and_closes_an_amqp10_connection(tmp_path):
    import base64
    import json
    import urllib.parse
    import urllib.request

    running = Running(Config(amqp_port=free_port(), mgmt_port=free_port(), bind="127.0.0.1",
                             data_dir=str(tmp_path)))
    auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}

    def api(path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{running.config.mgmt_port}{path}", method=method,
                                         headers=auth)
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
        return json.loads(body) if body else None

    try:
        amqp = connect(running)
        listed = api("/api/connections")
        assert [c["protocol"] for c in listed] == ["AMQP 1.0"]
        assert listed[0]["user"] == "guest" and listed[0]["vhost"] == "/" and listed[0]["auth_mechanism"] == "PLAIN"
        api("/api/connections/" + urllib.parse.quote(listed[0]["name"], safe=""), "DELETE")
        with pytest.raises(proton.ConnectionException, match="amqp:connection:forced"):
            amqp.create_sender("/queues/anything")
        deadline = time.monotonic() + 5  # (gone once the client answers, or CLOSE_TIMEOUT is over)
        while api("/api/connections") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert api("/api/connections") == []
    finally:
        running.stop()


# -- hostile frames, in-process ------------------------------------------------------------------------------------

_ADDRESSES = ["/queues/q", "/queues/missing", "/exchanges/amq.direct/k", "/exchanges/amq.fanout", "/management",
              "/queues/%ZZ", "", "/exchanges/amq.default/x", "/queues/" + "x" * 300]
_VALUES = st.one_of(
    st.just(amqp10.NULL), st.integers(0, 2**32 - 1).map(uint), st.booleans().map(amqp10.boolean),
    st.text(max_size=20).map(utf8), st.binary(max_size=20).map(amqp10.binary),
    st.sampled_from(_ADDRESSES).map(lambda a: described(0x29, encode_list([utf8(a)]))),
    st.sampled_from(_ADDRESSES).map(lambda a: described(0x28, encode_list([utf8(a)]))),
    st.sampled_from([0x24, 0x25, 0x26, 0x27, 0x23, 0x99]).map(lambda c: described(c, b"\x45")),
    st.integers(0, 2**64 - 1).map(amqp10.ulong), st.binary(max_size=24))
_PERFORMATIVES = st.builds(
    lambda code, fields, payload, channel: _frame(_performative(code, *fields) + payload, channel),
    st.sampled_from([0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x10, 0x40, 0x00]),
    st.lists(_VALUES, max_size=12), st.binary(max_size=32), st.sampled_from([0, 0, 1, 63, 64, 65535]))
_HANDLES = st.integers(0, 3).map(uint)
_RECORDS = st.one_of(st.binary(max_size=24), st.just(described(0x75, amqp10.binary(b"body"))),
                     st.just(described(0x73, encode_list([amqp10.NULL, amqp10.NULL, utf8("/queues/q"), utf8("GET")]))
                             + described(0x77, amqp10.NULL)))
_SHAPED = st.one_of(  # performatives of the right shape, values drawn: they reach links and deliveries
    st.builds(lambda h, role, src, tgt: _performative(0x12, utf8("l"), h, role, amqp10.NULL, amqp10.NULL, src, tgt),
              _HANDLES, st.booleans().map(amqp10.boolean), _VALUES, _VALUES),
    st.builds(lambda h, credit, drain, echo: _performative(0x13, uint(0), uint(100), uint(0), uint(100), h, uint(0),
                                                          credit, amqp10.NULL, drain, echo),
              _HANDLES, st.integers(0, 2**32 - 1).map(uint), st.booleans().map(amqp10.boolean),
              st.booleans().map(amqp10.boolean)),
    st.builds(lambda h, i, settled, more, record: _performative(0x14, h, i, amqp10.binary(b"t"), uint(0), settled,
                                                                more) + record,
              _HANDLES, st.integers(0, 5).map(uint), st.booleans().map(amqp10.boolean),
              st.booleans().map(amqp10.boolean), _RECORDS),
    st.builds(lambda first, last, settled, state: _performative(0x15, amqp10.boolean(True), first, last, settled,
                                                                state),
              st.integers(0, 5).map(uint), st.one_of(st.just(amqp10.NULL), st.integers(0, 2**32 - 1).map(uint)),
              st.booleans().map(amqp10.boolean), _VALUES),
    st.builds(lambda h, closed: _performative(0x16, h, closed), _HANDLES, st.booleans().map(amqp10.boolean)),
).map(_frame)
_FRAMES = st.one_of(_SHAPED, _SHAPED, _PERFORMATIVES, st.binary(max_size=40),
                    st.builds(lambda size, doff, kind, body: struct.pack(">IBBH", size, doff, kind, 0) + body,
                              st.integers(0, 2**32 - 1), st.integers(0, 255), st.integers(0, 3),
                              st.binary(max_size=16)))


class Transport(asyncio.Transport):
    """A loopback client's socket that keeps what is written."""

    def __init__(self, protocol: asyncio.BaseProtocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4242) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_FRAMES, max_size=16), st.integers(1, 64))
def test_fuzz_frames_after_login_get_an_answer_or_a_close_never_an_internal_error(tmp_path, sent, cut):
    """Whatever a logged-in client sends, the node answers or closes with a protocol error, never an internal
    error, and what it writes stays small."""
    from amqp_server.amqp1 import connection as amqp10_connection
    from amqp_server.amqp1.connection import Amqp10Connection
    from amqp_server.broker import Broker
    from amqp_server.frontend.clients import Clients
    from amqp_server.publisher_flow import PublisherFlow

    internal: list[str] = []

    async def run() -> int:
        broker = Broker(str(tmp_path / f"data-{time.monotonic_ns()}"))
        try:
            broker.declare_queue(broker.vhost("/"), "q", durable=True)
            config = Config()
            connection = Amqp10Connection(broker, config, PublisherFlow(), Clients(config))
            transport = Transport(connection)
            connection.connection_made(transport)
            login = (_frame(_performative(0x41, symbol("PLAIN"), amqp10.binary(b"\0guest\0guest")), kind=1)
                     + AMQP_HEADER + _frame(_performative(0x10, utf8("fuzz")))
                     + _frame(_performative(0x11, amqp10.NULL, uint(0), uint(100), uint(100))))
            connection.data_received(login)  # (the 0-9-1 front end took the SASL header)
            assert connection.state == amqp10_connection.OPEN and 0 in connection.sessions
            data = b"".join(sent)
            original = amqp10_connection.complaints.internal
            amqp10_connection.complaints.internal = lambda what, name: internal.append(what)  # type: ignore
            try:
                for at in range(0, len(data), cut):
                    if connection.state != amqp10_connection.CLOSED:
                        connection.data_received(data[at:at + cut])
                connection.flush()
                for _ in range(3):
                    await asyncio.sleep(0)
            finally:
                amqp10_connection.complaints.internal = original  # type: ignore[method-assign]
            return len(transport.written)
        finally:
            broker.close()

    written = asyncio.run(run())
    assert not internal
    assert written < 64 * 1024


def _in_process(broker: Any) -> tuple[Any, Transport]:
    """An AMQP 1.0 connection on a fake socket, logged in, session 0 begun (in a running loop)."""
    from amqp_server.amqp1.connection import OPEN, Amqp10Connection
    from amqp_server.frontend.clients import Clients
    from amqp_server.publisher_flow import PublisherFlow

    config = Config()
    connection = Amqp10Connection(broker, config, PublisherFlow(), Clients(config))
    transport = Transport(connection)
    connection.connection_made(transport)
    connection.data_received(_frame(_performative(0x41, symbol("PLAIN"), amqp10.binary(b"\0guest\0guest")), kind=1)
                             + AMQP_HEADER + _frame(_performative(0x10, utf8("in-process")))
                             + _frame(_performative(0x11, amqp10.NULL, uint(0), uint(100), uint(100))))
    assert connection.state == OPEN and 0 in connection.sessions
    connection.flush()
    transport.written.clear()
    return connection, transport


def _written(connection: Any, transport: Transport) -> list[tuple[int, list[amqp10.Value]]]:
    connection.flush()
    found = _parse(bytes(transport.written))
    transport.written.clear()
    return found


ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x12, 0x19)
_RECORD = described(0x75, amqp10.binary(b"x"))  # a message: one data section


def _broker_with_q(tmp_path: Path) -> Any:
    """A broker in this process with the durable queue ``q``."""
    from amqp_server.broker import Broker

    broker = Broker(str(tmp_path / "data"))
    broker.declare_queue(broker.vhost("/"), "q", durable=True)
    return broker


def _attach(handle: int, role: bool, address: str, name: str, settle_mode: bytes = amqp10.NULL) -> bytes:
    """An attach of session 0: the client receiving from (``role`` True) or sending to ``address``."""
    terminus = described(0x28 if role else 0x29, encode_list([utf8(address)]))
    termini = (terminus,) if role else (amqp10.NULL, terminus)
    return _frame(_performative(ATTACH, utf8(name), uint(handle), amqp10.boolean(role), settle_mode, amqp10.NULL,
                                *termini))


def _sender(handle: int, queue: str = "q", name: str = "s", settle_mode: bytes = amqp10.NULL) -> bytes:
    return _attach(handle, False, f"/queues/{queue}", name, settle_mode)


def _receiver(handle: int, queue: str = "q", name: str = "r", settle_mode: bytes = amqp10.NULL) -> bytes:
    return _attach(handle, True, f"/queues/{queue}", name, settle_mode)


def _transfer(handle: int, delivery_id: int | None, settled: bool, more: bool = False,
              payload: bytes = _RECORD) -> bytes:
    """A transfer of session 0 (a continuation when ``delivery_id`` is None)."""
    if delivery_id is None:
        head: tuple[bytes, ...] = (amqp10.NULL, amqp10.NULL, amqp10.NULL)
    else:
        head = (uint(delivery_id), amqp10.binary(struct.pack(">I", delivery_id)), uint(0))
    return _frame(_performative(TRANSFER, uint(handle), *head, amqp10.boolean(settled), amqp10.boolean(more))
                  + payload)


def _link_flow(handle: int, delivery_count: int, credit: int, drain: bool = False) -> bytes:
    return _frame(_performative(FLOW, uint(0), uint(5000), uint(0), uint(5000), uint(handle), uint(delivery_count),
                                uint(credit), amqp10.NULL, amqp10.boolean(drain)))


def _error(fields: list[amqp10.Value], at: int) -> tuple[str, str | None]:
    """The condition and description of the error field at ``at`` (of a detach, end or close)."""
    error = fields[at].value[1].value
    description = error[1].value if len(error) > 1 and error[1].kind != "null" else None
    return error[0].value, description


def _publish_settled(connection: Any, transport: Any, count: int) -> None:
    """``count`` messages put in ``q`` by a link of handle 9, pre-settled."""
    connection.data_received(_sender(9))
    _written(connection, transport)
    connection.data_received(b"".join(_transfer(9, i, True) for i in range(count)))
    _written(connection, transport)


@pytest.mark.parametrize("cause", ["refused attach", "deleted queue"])
async def test_the_clients_answer_to_the_nodes_detach_does_not_end_the_session(tmp_path, cause):
    """The node detaches a link (it refuses the attach: an attach, then a detach with the error; or its queue is
    deleted); the client answers with its own detach, which RabbitMQ's session takes quietly
    (``handle_frame(#'v1_0.detach'{})``: ``maps:take`` finds no link, ``detach_reply`` sends nothing): the session
    and its other links go on."""
    broker = _broker_with_q(tmp_path)
    try:
        vhost = broker.vhost("/")
        broker.declare_queue(vhost, "other", durable=True)
        connection, transport = _in_process(broker)
        connection.data_received(_receiver(1, queue="other", name="r2"))
        _written(connection, transport)
        if cause == "refused attach":
            connection.data_received(_receiver(0, queue="missing"))
        else:
            connection.data_received(_receiver(0))
            _written(connection, transport)
            broker.delete_queue(vhost, "q")
        assert [code for code, _ in _written(connection, transport)][-1] == DETACH
        connection.data_received(_frame(_performative(DETACH, uint(0), amqp10.boolean(True))))
        assert _written(connection, transport) == []
        assert 0 in connection.sessions and 1 in connection.sessions[0].links
    finally:
        broker.close()


async def test_a_coordinator_target_ends_the_session_with_not_implemented_not_the_connection(tmp_path):
    """A transactional client's coordinator link: rabbit_amqp_session ``validate_attach`` ->
    ``exit_not_implemented("Transactions not supported")``, the session ends and the connection stays."""
    from amqp_server.amqp1.connection import OPEN as CONNECTION_OPEN

    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        coordinator = described(0x30, encode_list([amqp10.NULL]))
        connection.data_received(_frame(_performative(ATTACH, utf8("txn"), uint(0), amqp10.boolean(False),
                                                      amqp10.NULL, amqp10.NULL, amqp10.NULL, coordinator)))
        [(code, fields)] = _written(connection, transport)
        assert code == END and _error(fields, 0) == ("amqp:not-implemented", "Transactions not supported")
        assert connection.state == CONNECTION_OPEN and 0 not in connection.sessions
    finally:
        broker.close()


async def test_an_attach_that_does_not_decode_ends_the_session_not_the_connection(tmp_path):
    """A source of another descriptor: the session process that reads the attach exits with the error, which
    ends the session alone."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_frame(_performative(ATTACH, utf8("r"), uint(0), amqp10.boolean(True), amqp10.NULL,
                                                      amqp10.NULL, described(0x77, encode_list([])))))
        [(code, fields)] = _written(connection, transport)
        assert code == END and _error(fields, 0)[0] == "amqp:decode-error"
    finally:
        broker.close()


async def test_rcv_settle_mode_second_is_refused_as_not_implemented(tmp_path):
    """rabbit_amqp_session ``validate_attach``: rcv-settle-mode second with a sender that does not settle ->
    ``exit_not_implemented("rcv-settle-mode second not supported")``: the session ends."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        source = described(0x28, encode_list([utf8("/queues/q")]))
        connection.data_received(_frame(_performative(ATTACH, utf8("r"), uint(0), amqp10.boolean(True),
                                                      amqp10.ubyte(0), amqp10.ubyte(1), source)))
        [(code, fields)] = _written(connection, transport)
        assert code == END and _error(fields, 0) == ("amqp:not-implemented", "rcv-settle-mode second not supported")
    finally:
        broker.close()


async def test_a_disposition_without_an_outcome_is_refused_and_acks_nothing(tmp_path):
    """rabbit_amqp_session ``settle_op_from_outcome(undefined)`` (its last clause): amqp:invalid-field
    "Unrecognised state: undefined in DISPOSITION" before anything is settled; the session ends and the queue gets
    the message back (it was taken as accepted, and acked)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        _publish_settled(connection, transport, 1)
        connection.data_received(_receiver(0) + _link_flow(0, 0, 1))
        assert TRANSFER in [code for code, _ in _written(connection, transport)]
        connection.data_received(_frame(_performative(DISPOSITION, amqp10.boolean(True), uint(0), uint(0),
                                                      amqp10.boolean(True))))
        [(code, fields)] = _written(connection, transport)
        assert code == END and _error(fields, 0) == ("amqp:invalid-field",
                                                     "Unrecognised state: undefined in DISPOSITION")
        assert broker.vhost("/").queues["q"].message_count == 1
    finally:
        broker.close()


async def test_an_unknown_delivery_state_ends_the_session_with_invalid_field(tmp_path):
    """``received`` is no outcome: ``settle_op_from_outcome`` ends the session with amqp:invalid-field (it was
    amqp:not-implemented)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        _publish_settled(connection, transport, 1)
        connection.data_received(_receiver(0) + _link_flow(0, 0, 1))
        _written(connection, transport)
        received = described(0x23, encode_list([uint(0), amqp10.ulong(0)]))
        connection.data_received(_frame(_performative(DISPOSITION, amqp10.boolean(True), uint(0), uint(0),
                                                      amqp10.boolean(True), received)))
        [(code, fields)] = _written(connection, transport)
        assert code == END and _error(fields, 0) == ("amqp:invalid-field",
                                                     "Unrecognised state: received in DISPOSITION")
    finally:
        broker.close()


@pytest.mark.parametrize("mode,settled", [(0, True), (1, False)])
async def test_a_transfer_against_its_links_settle_mode_is_a_framing_error(tmp_path, mode, settled):
    """rabbit_amqp_session ``validate_transfer_snd_settle_mode``: a settled transfer on a link attached unsettled,
    or one not settled on a link attached settled, ends the session with amqp:connection:framing-error (the
    first was published as settled, its outcome never sent; the second was taken as settled)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_sender(0, settle_mode=amqp10.ubyte(mode)))
        _written(connection, transport)
        connection.data_received(_transfer(0, 0, settled))
        [(code, fields)] = _written(connection, transport)
        names = {0: "unsettled", 1: "settled"}
        assert code == END and _error(fields, 0) == (
            "amqp:connection:framing-error", f"sender settle mode is '{names[mode]}' but transfer settled flag is "
            f"interpreted as being '{str(settled).lower()}'")
        assert broker.vhost("/").queues["q"].message_count == 0
    finally:
        broker.close()


@pytest.mark.parametrize("delivery_id,settled", [(5, False), (0, True)])
async def test_a_continuation_transfer_unlike_the_first_is_a_framing_error(tmp_path, delivery_id, settled):
    """rabbit_amqp_session ``validate_multi_transfer_delivery_id`` / ``validate_multi_transfer_settled``: a
    continuation saying another delivery-id, or settled where the first did not, ends the session with
    amqp:connection:framing-error (the joined message was published under the first's)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_sender(0))
        _written(connection, transport)
        connection.data_received(_transfer(0, 0, False, more=True, payload=_RECORD[:3])
                                 + _transfer(0, delivery_id, settled, payload=_RECORD[3:]))
        [(code, fields)] = _written(connection, transport)
        assert code == END and _error(fields, 0)[0] == "amqp:connection:framing-error"
        assert broker.vhost("/").queues["q"].message_count == 0
    finally:
        broker.close()


def _exchange_x_bound_to(broker: Any, queue: str) -> None:
    """The direct exchange ``x`` (declared anew) bound to the new queue ``queue`` with the key ``k``."""
    vhost = broker.vhost("/")
    broker.declare_exchange(vhost, "x", "direct")
    broker.declare_queue(vhost, queue, durable=True)
    broker.bind(vhost, "x", "queue", queue, "k")


_SUBJECT_K = described(0x73, encode_list([amqp10.NULL] * 3 + [utf8("k")]))  # properties: subject k


@pytest.mark.parametrize("address", ["/exchanges/x/k", "/exchanges/x"])
async def test_a_link_to_an_exchange_deleted_after_the_attach_releases_and_detaches_not_found(tmp_path, address):
    """rabbit_amqp_session ``check_exchange`` keeps only the name of an exchange but the default and ``amq.*``,
    and ``lookup_target`` looks it up at each transfer: gone, the message is released, then the link detaches
    with amqp:not-found "no exchange 'x' in vhost '/'" (the deleted exchange took the message, and the link
    stayed)."""
    broker = _broker_with_q(tmp_path)
    try:
        _exchange_x_bound_to(broker, "old")
        connection, transport = _in_process(broker)
        connection.data_received(_attach(0, False, address, "s"))
        _written(connection, transport)
        broker.delete_exchange(broker.vhost("/"), "x")
        connection.data_received(_transfer(0, 0, False, payload=_SUBJECT_K + _RECORD))
        (code, disposition), (last, detach) = _written(connection, transport)
        assert code == DISPOSITION and disposition[4].value[0] == 0x26  # released
        assert last == DETACH and _error(detach, 2) == ("amqp:not-found", "no exchange 'x' in vhost '/'")
    finally:
        broker.close()


async def test_a_link_to_an_exchange_declared_again_routes_through_the_new_one(tmp_path):
    """As above, the exchange then declared again and bound to another queue: the link's messages go through
    the new exchange's bindings (they went through the deleted one's: released, or lost when pre-settled)."""
    broker = _broker_with_q(tmp_path)
    try:
        _exchange_x_bound_to(broker, "old")
        connection, transport = _in_process(broker)
        connection.data_received(_attach(0, False, "/exchanges/x/k", "s"))
        _written(connection, transport)
        broker.delete_exchange(broker.vhost("/"), "x")
        _exchange_x_bound_to(broker, "new")
        connection.data_received(_transfer(0, 0, True))
        assert _written(connection, transport) == []
        assert broker.vhost("/").queues["new"].message_count == 1
    finally:
        broker.close()


@pytest.mark.parametrize("parts", [1, 2])
async def test_an_oversized_message_ends_the_session(tmp_path, parts):
    """rabbit_amqp_session ``validate_message_size`` -> ``protocol_error(?V_1_0_LINK_ERROR_MESSAGE_SIZE_EXCEEDED,
    ...)``, an exit that ends the session (it detached the link alone), in one transfer or several."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_sender(0))
        _written(connection, transport)
        connection.sessions[0].links[0].max_size = 16  # (the limit the link was given: --max-message-size)
        big = described(0x75, amqp10.binary(b"y" * 64))
        if parts == 1:
            connection.data_received(_transfer(0, 0, False, payload=big))
        else:
            connection.data_received(_transfer(0, 0, False, more=True, payload=big[:10])
                                     + _transfer(0, None, False, payload=big[10:]))
        [(code, fields)] = _written(connection, transport)
        assert code == END and _error(fields, 0) == (
            "amqp:link:message-size-exceeded", f"message size ({len(big)} bytes) > maximum message size (16 bytes)")
    finally:
        broker.close()


async def test_deleting_the_target_queue_detaches_the_sending_link(tmp_path):
    """rabbit_amqp_session ``handle_stashed_eol`` -> ``destroy_incoming_link``: a link whose target is the deleted
    queue detaches with amqp:resource-deleted (the condition alone), after the outcomes due (it stayed, its
    messages released from then on); a link to another queue stays, and its client's answer ends nothing."""
    broker = _broker_with_q(tmp_path)
    try:
        vhost = broker.vhost("/")
        broker.declare_queue(vhost, "other", durable=True)
        connection, transport = _in_process(broker)
        connection.data_received(_sender(0) + _sender(1, queue="other", name="s2"))
        _written(connection, transport)
        connection.data_received(_transfer(0, 0, False))
        for _ in range(5):
            await asyncio.sleep(0.05)
        assert DISPOSITION in [code for code, _ in _written(connection, transport)]
        broker.delete_queue(vhost, "q")
        [(code, fields)] = _written(connection, transport)
        assert code == DETACH and fields[0].value == 0 and _error(fields, 2) == ("amqp:resource-deleted", None)
        assert list(connection.sessions[0].links) == [1] and not broker.queues.targets.get(("/", "q"))
        connection.data_received(_frame(_performative(DETACH, uint(1), amqp10.boolean(True))))
        _written(connection, transport)
        assert not broker.queues.targets
    finally:
        broker.close()


async def test_a_drain_answered_by_deliveries_that_use_all_the_credit_still_ends_with_a_drain_flow(tmp_path):
    """rabbit_amqp_session ``handle_credit_reply0`` (drain): once the queue answers, a flow with drain=true, credit 0
    and the delivery-count advanced goes out even when the messages used all the credit (none went out then)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        _publish_settled(connection, transport, 3)
        connection.data_received(_receiver(0))
        _written(connection, transport)
        connection.data_received(_link_flow(0, 0, 3, drain=True))
        found = _written(connection, transport)
        assert [code for code, _ in found] == [TRANSFER] * 3 + [FLOW]
        flow = found[-1][1]
        assert (flow[4].value, flow[5].value, flow[6].value, flow[8].value) == (0, 3, 0, True)
    finally:
        broker.close()


async def test_the_begin_answer_takes_the_clients_smaller_handle_max_and_a_handle_above_it_is_a_framing_error(
        tmp_path):
    """rabbit_amqp_session ``init``: ``min(N, HandleMax)`` for the client's handle-max, sent back in the begin; a
    handle above it ends the session with amqp:connection:framing-error (``handle_frame(#'v1_0.attach'{})``; it
    was resource-limit-exceeded, above 255 alone)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_frame(_performative(0x11, amqp10.NULL, uint(0), uint(100), uint(100), uint(7)),
                                        channel=1))
        [(code, fields)] = _written(connection, transport)
        assert code == 0x11 and fields[4].value == 7
        connection.data_received(_frame(_performative(ATTACH, utf8("s"), uint(8), amqp10.boolean(False)), channel=1)
                                 + _sender(300))
        (code, fields), (code0, fields0) = _written(connection, transport)
        assert code == code0 == END
        assert _error(fields, 0) == ("amqp:connection:framing-error",
                                     "link handle value (8) exceeds maximum link handle value (7)")
        assert _error(fields0, 0) == ("amqp:connection:framing-error",
                                      "link handle value (300) exceeds maximum link handle value (255)")
    finally:
        broker.close()


async def test_a_receiving_link_asking_mixed_is_answered_unsettled(tmp_path):
    """rabbit_amqp_session ``handle_attach`` (the client receiving): a snd-settle-mode other than settled is
    answered unsettled (0), the mode the node sends in (mixed, Proton's receivers' default, was echoed)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_receiver(0, settle_mode=amqp10.ubyte(2)))
        [(code, fields)] = _written(connection, transport)
        assert code == ATTACH and fields[3].value == 0
    finally:
        broker.close()


def _management_attach(handle: int, role: bool, paired: bool) -> bytes:
    """An attach of half of a /management link pair, its properties saying ``paired`` (or nothing)."""
    terminus = (described(0x28, encode_list([utf8("/management")])),
                described(0x29, encode_list([utf8("/management")])))
    properties = amqp10.encode_map([(symbol("paired"), amqp10.boolean(True))]) if paired else amqp10.NULL
    return _frame(_performative(ATTACH, utf8("mgmt"), uint(handle), amqp10.boolean(role), amqp10.ubyte(1),
                                amqp10.NULL, *terminus, amqp10.NULL, amqp10.NULL, uint(0), amqp10.NULL,
                                amqp10.NULL, amqp10.NULL, properties))


async def test_the_management_link_is_granted_rabbitmqs_8_credit_and_an_unpaired_one_is_refused(tmp_path):
    """rabbit_amqp_session ``handle_attach`` for a sender to /management grants ``?MAX_MANAGEMENT_LINK_CREDIT`` (8;
    it was a publishing link's 128), and ``check_paired`` refuses a half without ``paired`` true
    (amqp:invalid-field)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_management_attach(1, True, True) + _management_attach(0, False, True))
        found = _written(connection, transport)
        flows = [fields for code, fields in found if code == FLOW and fields[4].value == 0]
        assert [flow[6].value for flow in flows] == [8]
        connection.data_received(_management_attach(2, False, False))
        (code, _), (last, detach) = _written(connection, transport)
        assert (code, last) == (ATTACH, DETACH) and _error(detach, 2) == (
            "amqp:invalid-field", "Link property 'paired' is not set to boolean value 'true'")
    finally:
        broker.close()


@pytest.mark.parametrize("receiver_credit, description", [
    (None, "received transfer on half open management link pair"),
    (0, "insufficient credit (0) for management link from RabbitMQ to client"),
])
async def test_a_management_request_with_no_response_link_or_credit_ends_the_session(tmp_path, receiver_credit,
                                                                                     description):
    """rabbit_amqp_session ``incoming_mgmt_link_transfer`` takes a request only with the paired outgoing half
    attached and holding credit, else the session ends with amqp:precondition-failed (the half-open pair was a
    link detach; a response without credit waited)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        if receiver_credit is not None:
            connection.data_received(_management_attach(1, True, True) + _link_flow(1, 0, receiver_credit))
        connection.data_received(_management_attach(0, False, True))
        _written(connection, transport)
        request = (described(0x73, encode_list([utf8("1"), amqp10.NULL, utf8("/queues/q"), utf8("GET"),
                                                utf8("$me")])) + described(0x77, amqp10.NULL))
        connection.data_received(_transfer(0, 0, True, payload=request))
        await asyncio.sleep(0.1)
        found = _written(connection, transport)
        assert [code for code, _ in found] == [END] and _error(found[0][1], 0) == (
            "amqp:precondition-failed", description)
        assert 0 not in connection.sessions
    finally:
        broker.close()


async def test_the_outcomes_due_when_the_client_ends_the_session_go_out_before_its_end(tmp_path):
    """An unroutable transfer and the client's END in one read: the released outcome goes out, then the END
    (RabbitMQ's ``handle_frame(#'v1_0.end'{})`` sends the delivery state changes first; it was dropped)."""
    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        connection.data_received(_attach(0, False, "/exchanges/amq.direct/nowhere", "s"))
        _written(connection, transport)
        connection.data_received(_transfer(0, 0, False) + _frame(_performative(END)))
        found = _written(connection, transport)
        assert [code for code, _ in found] == [DISPOSITION, END] and found[0][1][4].value[0] == 0x26  # released
    finally:
        broker.close()


def test_proton_after_a_refused_receiver_the_same_session_still_sends(node):
    """End to end: Proton answers a refused receiver with its detach; a sender on the same session then works."""
    import proton

    declare(node, "there").close()
    connection = connect(node)
    try:
        with pytest.raises(proton.utils.LinkDetached):
            connection.create_receiver("/queues/missing")
        sender = connection.create_sender("/queues/there")
        sender.send(Message(body=b"after the refusal"), timeout=5)
    finally:
        connection.close()


async def test_drain_with_nothing_to_send_gives_the_credit_back_and_a_deleted_queue_detaches_its_link(tmp_path):
    from amqp_server.broker import Broker

    broker = Broker(str(tmp_path / "data"))
    try:
        vhost = broker.vhost("/")
        broker.declare_queue(vhost, "q", durable=True)
        connection, transport = _in_process(broker)
        source = described(0x28, encode_list([utf8("/queues/q")]))
        connection.data_received(_frame(_performative(0x12, utf8("r"), uint(0), amqp10.boolean(True), amqp10.NULL,
                                                      amqp10.NULL, source)))
        assert [code for code, _ in _written(connection, transport)] == [0x12]
        connection.data_received(_frame(_performative(0x13, uint(0), uint(100), uint(0), uint(100), uint(0), uint(0),
                                                      uint(5), amqp10.NULL, amqp10.boolean(True))))
        [(code, fields)] = _written(connection, transport)
        assert code == 0x13  # drained: delivery-count advanced by the credit, none left, drain echoed
        assert (fields[5].value, fields[6].value, fields[8].value) == (5, 0, True)
        broker.delete_queue(vhost, "q")
        [(code, fields)] = _written(connection, transport)
        assert code == 0x16 and fields[0].value == 0 and fields[1].value is True
        error = fields[2].value[1].value
        assert (error[0].value, error[1].value) == ("amqp:resource-deleted", "queue 'q' in vhost '/' was deleted")
    finally:
        broker.close()


async def test_a_large_message_arriving_during_an_alarm_stops_the_reading(tmp_path):
    """A multi-transfer message grows past the memory check's step while an alarm stands: the socket is read no
    more until it clears (credit alone would not stop a message already granted)."""
    from amqp_server.broker import Broker
    from amqp_server.memory import MEMORY_CHECK_BYTES

    broker = Broker(str(tmp_path / "data"))
    try:
        broker.declare_queue(broker.vhost("/"), "q", durable=True)
        connection, transport = _in_process(broker)
        paused: list[bool] = []
        transport.pause_reading = lambda: paused.append(True)  # type: ignore[method-assign]
        transport.resume_reading = lambda: paused.append(False)  # type: ignore[method-assign]
        target = described(0x29, encode_list([utf8("/queues/q")]))
        connection.data_received(_frame(_performative(0x12, utf8("l"), uint(0), amqp10.boolean(False), amqp10.NULL,
                                                      amqp10.NULL, amqp10.NULL, target)))
        chunk = b"\0" * 60_000
        first = _frame(_performative(0x14, uint(0), uint(0), amqp10.binary(b"t"), uint(0), amqp10.boolean(False),
                                     amqp10.boolean(True)) + described(0x75, b"\xb0" + struct.pack(">I", 10**8)))
        more = _frame(_performative(0x14, uint(0), amqp10.NULL, amqp10.NULL, amqp10.NULL, amqp10.NULL,
                                    amqp10.boolean(True)) + chunk)
        connection.data_received(first)
        connection.flow.block("memory")
        fed = 0
        while not paused and fed < 2 * MEMORY_CHECK_BYTES:
            connection.data_received(more)
            fed += len(chunk)
        assert paused == [True] and fed <= MEMORY_CHECK_BYTES + len(chunk)
        connection.flow.unblock("memory")
        assert paused == [True, False]
    finally:
        broker.close()


@pytest.mark.parametrize("list32", [False, True])
def test_the_transfer_read_in_place_agrees_with_the_general_decoder(list32):
    from amqp_server.amqp1 import frames

    fields = [uint(3), uint(70000), amqp10.binary(b"tag1"), uint(0), amqp10.boolean(True), amqp10.boolean(False)]
    data = b"".join(fields)
    body = (b"\x00\x53\x14" + (b"\xd0" + struct.pack(">II", len(data) + 4, len(fields)) if list32
                               else bytes((0xC0, len(data) + 1, len(fields)))) + data + b"payload")
    fast = frames.transfer_at(bytearray(body), 0, len(body))
    assert fast is not None
    value, end = amqp10.value_at(body)
    assert fast == (*frames.transfer_of(value.value[1].value)[:4], end)
    assert body[fast[4]:] == b"payload"


_UINTS = st.one_of(st.just(b"\x43"), st.integers(0, 255).map(lambda v: b"\x52" + bytes((v,))),
                   st.integers(0, 2**32 - 1).map(lambda v: b"\x70" + struct.pack(">I", v)))
_TRANSFER_FIELDS = st.tuples(
    _UINTS, st.one_of(_UINTS, st.just(b"\x40")),
    st.one_of(st.binary(max_size=32).map(amqp10.binary), st.just(b"\x40"), st.just(b"\xb0\x00\x00\x00\x01t")),
    st.one_of(_UINTS, st.just(b"\x40")), st.sampled_from([b"\x41", b"\x42", b"\x40", b"\x56\x01"]),
    st.sampled_from([b"\x41", b"\x42", b"\x40"]), st.sampled_from([b"\x41", b"\x40", b"\x42"]))


@settings(max_examples=300, deadline=None)
@given(_TRANSFER_FIELDS, st.integers(2, 7), st.booleans(), st.binary(max_size=8), st.integers(0, 3))
def test_fuzz_the_transfer_read_in_place_agrees_with_the_general_decoder_or_leaves_it_the_frame(
        fields, count, list32, payload, cut):
    """Any encoding of a transfer's fields: the in-place read gives what the general decoder gives, or None (the
    general decoder then reads it); a frame cut short is never read past its end."""
    from amqp_server.amqp1 import frames

    data = b"".join(fields[:count])
    body = (b"\x00\x53\x14" + (b"\xd0" + struct.pack(">II", len(data) + 4, count) if list32
                               else bytes((0xC0, len(data) + 1, count))) + data + payload)
    end = len(body) - cut
    fast = frames.transfer_at(bytearray(body + b"\x40" * cut), 0, end)
    try:
        value, at = amqp10.value_at(body[:end])
    except (amqp10.Invalid, amqp10.TooLarge):
        assert fast is None
        return
    if fast is not None:
        assert fast == (*frames.transfer_of(value.value[1].value)[:4], at)
        assert frames.transfer_of(value.value[1].value)[4] is False


def _alike(fields: tuple[bytes, ...], delivery_id: int, fill: int) -> tuple[bytes, ...]:
    """A client's next transfer encoded as ``fields`` were: another delivery-id (a uint32 one) and tag bytes."""
    handle, delivery, tag, *rest = fields
    if delivery[:1] == b"\x70":
        delivery = b"\x70" + struct.pack(">I", delivery_id)
    if tag[:1] == b"\xa0":
        tag = amqp10.binary(bytes((fill,)) * tag[1])
    return (handle, delivery, tag, *rest)


def _transfer_frame(fields: tuple[bytes, ...], count: int, list32: bool, payload: bytes = b"payload",
                    channel: int = 1) -> bytearray:
    data = b"".join(fields[:count])
    body = (b"\x00\x53\x14" + (b"\xd0" + struct.pack(">II", len(data) + 4, count) if list32
                               else bytes((0xC0, len(data) + 1, count))) + data + payload)
    return bytearray(b"\x40" * 3 + struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body)  # (at 3, as it lies)


def _read(reader: Any, buf: bytearray, n: int) -> Any:
    """The frame at 3 as the frame loop reads it: like the last one, else its performative field by field."""
    from amqp_server.amqp1 import frames

    fast = reader.like_the_last(buf, 3, n, 1 << 20)
    if fast is not None:
        return fast
    size, _, _, channel = frames.FRAME_HEAD.unpack_from(buf, 3)
    head = reader.read(buf, 3, 11, 3 + size, channel) if 3 + size <= n else None
    return None if head is None else (channel, *head, 3 + size)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TRANSFER_FIELDS, st.integers(2, 7), st.booleans(), st.integers(0, 3)), min_size=1,
                max_size=8), st.integers(0, 2**32 - 1), st.integers(0, 255))
def test_fuzz_transfers_read_like_the_one_before_agree_with_the_read_field_by_field(transfers, delivery_id, fill):
    """A connection's transfer frames read with the layout of the one before (``frames.Transfers``) give what
    ``transfer_at`` gives each, whatever changes from one to the next: each encoding comes twice, the second time
    with another delivery-id and tag, as a client's next message; a frame not all read yet is not read."""
    from amqp_server.amqp1 import frames

    reader = frames.Transfers()
    for fields, count, list32, cut in transfers:
        for each in (fields, _alike(fields, delivery_id, fill)):
            buf = _transfer_frame(each, count, list32)
            found = frames.transfer_at(buf, 11, len(buf))
            if cut:
                assert reader.like_the_last(buf, 3, len(buf) - cut, 1 << 20) is None
            assert _read(reader, buf, len(buf)) == (None if found is None else (1, *found, len(buf)))


def test_a_transfer_like_the_one_before_but_for_its_tag_encoding_or_its_end_is_read_field_by_field():
    """The layout kept of a transfer frame (a binary8 tag, the frame whole in the buffer and within the frame
    size) is not taken for one whose tag is another type of the same size, nor for a frame not all read yet, too
    large, or ending inside its performative; one with another payload size is read with it."""
    from amqp_server.amqp1 import frames

    def transfer(tag: bytes, payload: bytes = b"payload") -> bytearray:
        return _transfer_frame((uint(0), b"\x70" + struct.pack(">I", 7), tag, b"\x43", b"\x41"), 5, False, payload)

    reader = frames.Transfers()
    first = transfer(b"\xa0\x04tag1")
    assert _read(reader, first, len(first)) == (1, 0, 7, True, False, len(first) - 7, len(first))
    other = transfer(b"\xb0\x00\x00\x00\x01t")  # (a binary32: the in-place read leaves it to the decoder)
    assert frames.transfer_at(other, 11, len(other)) is None
    assert reader.like_the_last(other, 3, len(other), 1 << 20) is None
    longer = transfer(b"\xa0\x04tag2", b"payload, longer")
    assert reader.like_the_last(longer, 3, len(longer) - 1, 1 << 20) is None
    assert reader.like_the_last(longer, 3, len(longer), len(longer) - 4) is None
    struct.pack_into(">I", short := bytearray(longer), 3, 20)  # (a frame ending inside the performative)
    assert reader.like_the_last(short, 3, len(short), 1 << 20) is None
    assert reader.like_the_last(longer, 3, len(longer), 1 << 20) == (1, 0, 7, True, False, len(longer) - 15,
                                                                     len(longer))


def test_outcomes_due_out_of_order_go_out_as_one_disposition_per_run():
    """A publishing link's outcomes, due as they come (an fsync's later than the transient ones around them),
    go out at the flush as one disposition per run of consecutive delivery ids with one outcome, in order;
    ``accepted`` ones counted as confirms."""
    from types import SimpleNamespace

    from amqp_server.amqp1 import frames
    from amqp_server.amqp1.session import Incoming
    from amqp_server.stats import MessageStats

    sent: list[bytes] = []
    session = SimpleNamespace(send=sent.append, stats=MessageStats(), vhost_stats=MessageStats(), confirming=set())
    link = Incoming.__new__(Incoming)
    link.session, link.connection = session, SimpleNamespace(schedule_flush=lambda: None)  # type: ignore[assignment]
    link.outcomes, link.run_state = [], None
    error = [frames.rejected("amqp:precondition-failed", "no") for _ in range(2)]  # (equal, not the same object)
    for delivery_id, state in [(5, frames.ACCEPTED_STATE), (6, frames.ACCEPTED_STATE), (7, frames.ACCEPTED_STATE),
                               (8, frames.RELEASED_STATE), (9, frames.ACCEPTED_STATE), (3, frames.ACCEPTED_STATE),
                               (4, frames.ACCEPTED_STATE), (10, error[0]), (11, error[1]), (12, frames.RELEASED_STATE)]:
        link._outcome(delivery_id, False, state)
    link._outcome(13, True, frames.ACCEPTED_STATE)  # (settled by its sender: no outcome)
    assert session.confirming == {link}
    link.emit_outcomes()
    assert sent == [frames.disposition(3, 7, frames.ACCEPTED_STATE), frames.disposition(8, 8, frames.RELEASED_STATE),
                    frames.disposition(9, 9, frames.ACCEPTED_STATE), frames.disposition(10, 11, error[0]),
                    frames.disposition(12, 12, frames.RELEASED_STATE)]
    assert session.stats.confirm == session.vhost_stats.confirm == 6
    sent.clear()
    link._outcome(14, False, frames.ACCEPTED_STATE)
    link.emit_outcomes()
    assert sent == [frames.disposition(14, 14, frames.ACCEPTED_STATE)]


def _deaths(message: Message) -> list[dict[str, Any]]:
    assert message.annotations is not None
    return [dict(death) for death in message.annotations["x-opt-deaths"]]


def test_a_dead_lettered_amqp10_message_carries_x_opt_deaths_as_rabbitmq_4_records_them(node):
    """RabbitMQ 4.x (mc_amqp): an AMQP 1.0 message dead-lettered is read over AMQP 1.0 with an ``x-opt-deaths``
    annotation (maps newest first, one per queue and reason, counted) and ``x-first-death-*`` / ``x-last-death-*``
    annotations, not a conversion of its 0-9-1 ``x-death`` header; a 0-9-1 reader still gets ``x-death``."""
    from proton import Delivery

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.queue_declare("dlq", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"})
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    channel.queue_declare("slow", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    channel.queue_declare("limited", durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 1, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dlq"})
    amqp = connect(node)
    try:
        sender = amqp.create_sender("/queues/work")
        sender.send(Message(body=b"once", annotations={"x-opt-mine": "kept"}))
        work = amqp.create_receiver("/queues/work", credit=1)
        dlq = amqp.create_receiver("/queues/dlq", credit=1)
        for _ in range(2):  # work -> dlq -> work -> dlq
            assert work.receive(timeout=5).body == b"once"
            work.reject()
            message = dlq.receive(timeout=5)
            if _ == 0:
                first = _deaths(message)
                dlq.reject()
        dlq.accept()
        assert len(first) == 1 and first[0]["queue"] == "work" and first[0]["reason"] == "rejected"
        assert first[0]["count"] == 1 and first[0]["exchange"] == "" and list(first[0]["routing-keys"]) == ["work"]
        assert first[0]["first-time"] == first[0]["last-time"] > 0
        deaths = _deaths(message)
        assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [("work", "rejected", 2),
                                                                           ("dlq", "rejected", 1)]
        assert deaths[0]["first-time"] == first[0]["first-time"] <= deaths[0]["last-time"]
        annotations = message.annotations
        assert annotations is not None
        assert (annotations["x-first-death-queue"], annotations["x-first-death-reason"]) == ("work", "rejected")
        assert (annotations["x-last-death-queue"], annotations["x-last-death-exchange"]) == ("work", "")
        assert annotations["x-opt-mine"] == "kept" and "x-death" not in annotations

        amqp.create_sender("/queues/slow").send(Message(body=b"late", ttl=0.05))
        message = dlq.receive(timeout=5)
        dlq.accept()
        expired = _deaths(message)
        assert [(d["queue"], d["reason"], d["ttl"]) for d in expired] == [("slow", "expired", 50)]
        assert message.ttl is None or message.ttl == 0  # (the ttl goes with the death)

        limited = amqp.create_receiver("/queues/limited", credit=1)
        amqp.create_sender("/queues/limited").send(Message(body=b"poison"))
        for _ in range(2):  # delivery-failed once is the limit; the second time it goes
            assert limited.receive(timeout=5).body == b"poison"
            assert limited.fetcher is not None  # (a blocking receiver's)
            limited.fetcher.unsettled[0].local.failed = True
            limited.settle(Delivery.MODIFIED)
        message = dlq.receive(timeout=5)
        dlq.accept()
        assert [(d["queue"], d["reason"], d["count"]) for d in _deaths(message)] == [
            ("limited", "delivery_limit", 1)]
        dlq.close()
        sender.send(Message(body=b"for 0-9-1"))
        assert work.receive(timeout=5).body == b"for 0-9-1"
        work.reject()
        with pytest.raises(proton.Timeout):
            work.receive(timeout=0.3)  # (Proton sends the disposition as it next works)
    finally:
        amqp.close()
    method, properties, _ = get_within(channel, "dlq", auto_ack=True)
    assert method is not None and headers_of(properties)["x-death"][0]["queue"] == "work"
    connection.close()


def _modify(receiver: Any, annotations: dict[Any, Any], failed: bool = False, undeliverable: bool = False) -> None:
    """Settle the receiver's delivery with the modified outcome, carrying ``annotations``."""
    from proton import Delivery

    assert receiver.fetcher is not None  # (a blocking receiver's)
    state = receiver.fetcher.unsettled[0].local
    state.annotations, state.failed, state.undeliverable = annotations, failed, undeliverable
    receiver.settle(Delivery.MODIFIED)


def test_a_modified_outcomes_annotations_go_with_a_quorum_queues_message_requeued_or_dead_lettered(node):
    """RabbitMQ 4.x's quorum queues: ``modified`` with message annotations sets them on the message, which is
    delivered again with them (and keeps the ones it had; delivery-failed false counts no delivery), or dead-
    lettered with them (undeliverable-here), beside its ``x-opt-deaths``; an AMQP 0-9-1 reader gets them as
    headers.  A classic queue ignores them, as RabbitMQ's classic queues do."""
    from proton import symbol

    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.queue_declare("dlq")
    channel.queue_declare("qq", durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    channel.queue_declare("classic")
    amqp = connect(node)
    try:
        sender = amqp.create_sender("/queues/qq")
        sender.send(Message(body=b"m", annotations={"x-opt-mine": "kept"}))
        receiver = amqp.create_receiver("/queues/qq", credit=1)
        assert receiver.receive(timeout=5).body == b"m"
        _modify(receiver, {symbol("x-opt-string"): "x-test1", symbol("x-opt-n"): 7})
        message = receiver.receive(timeout=5)  # requeued with them
        assert message.annotations is not None
        assert (message.annotations["x-opt-string"], message.annotations["x-opt-n"]) == ("x-test1", 7)
        assert message.annotations["x-opt-mine"] == "kept"
        _modify(receiver, {symbol("x-opt-string"): "x-test2"}, failed=True, undeliverable=True)
        dlq = amqp.create_receiver("/queues/dlq", credit=1)
        message = dlq.receive(timeout=5)  # dead-lettered with them
        dlq.accept()
        annotations = message.annotations
        assert annotations is not None
        assert (annotations["x-opt-string"], annotations["x-opt-n"], annotations["x-opt-mine"]) == (
            "x-test2", 7, "kept")
        assert [(death["queue"], death["reason"]) for death in _deaths(message)] == [("qq", "rejected")]

        sender.send(Message(body=b"for 0-9-1"))
        assert receiver.receive(timeout=5).body == b"for 0-9-1"
        _modify(receiver, {symbol("x-opt-string"): "x-test3"})
        receiver.close()
        amqp.create_sender("/queues/classic").send(Message(body=b"c"))
        classic = amqp.create_receiver("/queues/classic", credit=1)
        assert classic.receive(timeout=5).body == b"c"
        _modify(classic, {symbol("x-opt-string"): "x-test4"})
        message = classic.receive(timeout=5)
        assert message.body == b"c" and "x-opt-string" not in (message.annotations or {})
        classic.accept()
    finally:
        amqp.close()
    method, properties, _ = get_within(channel, "qq", auto_ack=True)
    assert method is not None and headers_of(properties)["x-opt-string"] == "x-test3"
    assert headers_of(properties).get("x-delivery-count", 0) == 0  # (delivery-failed false: none counted)
    connection.close()


def test_a_modified_outcome_on_a_large_quorum_body_sent_from_the_file_keeps_it_byte_exact(node):
    """A quorum queue's 1 MiB body goes to an AMQP 1.0 receiver from the store's file, and its unsettled delivery
    holds none: a modified outcome writes the annotated message from the old record's file
    (``MessageStore.write_from``), and the body comes back byte-exact with the annotations, requeued and then
    dead-lettered (read from the new record)."""
    from proton import symbol

    data = bytes(range(256)) * 4096
    declare(node, "dlq").close()
    declare(node, "qq-large", **{"x-queue-type": "quorum", "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": "dlq"}).close()
    amqp = connect(node)
    try:
        amqp.create_sender("/queues/qq-large").send(Message(body=data))
        receiver = amqp.create_receiver("/queues/qq-large", credit=1)
        assert receiver.receive(timeout=5).body == data
        _modify(receiver, {symbol("x-opt-a"): "first"})
        message = receiver.receive(timeout=5)
        assert message.body == data and message.annotations is not None
        assert message.annotations["x-opt-a"] == "first"
        _modify(receiver, {symbol("x-opt-b"): "second"}, failed=True, undeliverable=True)
        dead = amqp.create_receiver("/queues/dlq", credit=1).receive(timeout=5)
        assert dead.body == data and dead.annotations is not None
        assert (dead.annotations["x-opt-a"], dead.annotations["x-opt-b"]) == ("first", "second")
    finally:
        amqp.close()


def test_a_modified_outcome_with_an_annotation_not_x_opt_ends_the_session_and_the_message_stays(node):
    """RabbitMQ 4.x lets a modified outcome set only ``x-opt-`` message annotations: any other key ends the
    session (amqp:invalid-field), and the message it named is not lost: it goes back to the queue."""
    declare(node, "qq", **{"x-queue-type": "quorum"}).close()
    amqp = connect(node)
    try:
        amqp.create_sender("/queues/qq").send(Message(body=b"m"))
        receiver = amqp.create_receiver("/queues/qq", credit=1)
        assert receiver.receive(timeout=5).body == b"m"
        from proton import symbol

        _modify(receiver, {symbol("x-not-opt"): "no"})
        with pytest.raises(proton.Timeout):  # (Proton sends the disposition as it next works)
            receiver.receive(timeout=0.5)
        condition = receiver.link.session.remote_condition
        assert condition is not None and condition.name == "amqp:invalid-field"
        assert "'x-opt-'" in str(condition.description)
    finally:
        amqp.close()
    amqp = connect(node)
    try:
        receiver = amqp.create_receiver("/queues/qq", credit=1)
        message = receiver.receive(timeout=5)
        assert message.body == b"m" and "x-not-opt" not in (message.annotations or {})
        receiver.accept()
    finally:
        amqp.close()


def test_a_dead_lettered_amqp091_message_is_read_over_amqp10_with_x_opt_deaths(node):
    """RabbitMQ 4.x: a message published over AMQP 0-9-1 and dead-lettered is read over AMQP 1.0 with its deaths
    as ``x-opt-deaths`` (maps newest first, counted, with their exchange, routing keys and ttl) and the
    ``x-first-death-*`` / ``x-last-death-*`` annotations, not an ``x-death`` one; a 0-9-1 reader still gets
    ``x-death``."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.queue_declare("final")
    channel.queue_declare("dlq", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "final"})
    channel.queue_declare("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    for body in (b"for 1.0", b"for 0-9-1"):
        channel.basic_publish("", "work", body, pika.BasicProperties(expiration="60000", headers={"x-mine": "kept"}))
    for queue in ("work", "dlq"):  # work -> dlq -> final, rejected each time
        for _ in range(2):
            method, _, _ = get_within(channel, queue)
            assert method is not None
            channel.basic_reject(delivery_tag(method), requeue=False)
    amqp = connect(node)
    try:
        receiver = amqp.create_receiver("/queues/final", credit=1)
        message = receiver.receive(timeout=5)
        receiver.accept()
    finally:
        amqp.close()
    assert binary(message) == b"for 1.0"
    deaths = _deaths(message)
    assert [(d["queue"], d["reason"], d["count"], d["exchange"], list(d["routing-keys"])) for d in deaths] == [
        ("dlq", "rejected", 1, "", ["dlq"]), ("work", "rejected", 1, "", ["work"])]
    assert deaths[1]["ttl"] == 60000 and deaths[0]["first-time"] == deaths[0]["last-time"] > 0
    annotations = message.annotations
    assert annotations is not None and "x-death" not in annotations and annotations["x-mine"] == "kept"
    names = ("queue", "reason", "exchange")
    assert [annotations[f"x-first-death-{name}"] for name in names] == ["work", "rejected", ""]
    assert [annotations[f"x-last-death-{name}"] for name in names] == ["dlq", "rejected", ""]
    method, properties, got = channel.basic_get("final", auto_ack=True)
    assert method is not None and got == b"for 0-9-1"
    assert [death["queue"] for death in headers_of(properties)["x-death"]] == ["dlq", "work"]
    connection.close()


@pytest.mark.parametrize("size, count", [(100_000, 60), (3_000, 300)])
async def test_a_publishing_link_keeps_no_more_than_its_budget_of_sections_gone(tmp_path, size, count):
    """A link remembers the conversion of the sections before a body (a publisher's runs of messages alike share
    it), but not of sections larger than ``amqp10.CACHED_KEY``, and of smaller ones at most ``LINK_MEMO`` bytes:
    messages each with other application-properties (a request id) are not kept once routed, as RabbitMQ keeps
    nothing of a transfer it has routed."""
    import gc
    import tracemalloc

    broker = _broker_with_q(tmp_path)
    try:
        connection, transport = _in_process(broker)
        target = described(0x29, encode_list([utf8("/exchanges/amq.direct/nowhere")]))
        connection.data_received(_frame(_performative(0x12, utf8("s"), uint(0), amqp10.boolean(False), amqp10.NULL,
                                                      amqp10.NULL, amqp10.NULL, target)))
        _written(connection, transport)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):  # each with application-properties of its own, all unroutable
            value = (b"%06d" % i) * (size // 6)
            props = described(0x74, amqp10.encode_map([(utf8("k"), amqp10.binary(value))]))
            connection.data_received(_transfer(0, i, True, payload=props + described(0x75, amqp10.binary(b"x"))))
            _written(connection, transport)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        # (the last message's sections stay, a few copies of them: what the next one alike is compared with)
        assert kept < 2 * amqp10.LINK_MEMO + 8 * size, f"{kept / 1e6:.1f} MB kept of {size * count / 1e6:.1f} MB sent"
    finally:
        broker.close()
