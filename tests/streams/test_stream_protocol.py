"""RabbitMQ's stream protocol (``--stream-enabled``): rstream and rbfly unchanged, AMQP 0-9-1 on the same streams,
and raw frames for what a hostile or broken peer sends.

Each test also passes against RabbitMQ 3.10.8 with rabbitmq_stream, but for those marked warren_only.
"""
from __future__ import annotations

import asyncio
import datetime
import gzip
import socket
import struct
import time
import uuid
import zlib
from typing import Any

import pika
import pytest

from conftest import free_port, node_fixture
from support import call

rstream = pytest.importorskip("rstream")
from rstream import (  # noqa: E402 (after importorskip)
    AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, Properties, amqp_decoder)

pytestmark = pytest.mark.timeout(60)


def wait_for_stream_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)


node = node_fixture(streams=True)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def offset_of(properties: pika.BasicProperties) -> int:
    """The offset a delivery from a stream carries in its ``x-stream-offset`` header, as on RabbitMQ."""
    offset = (properties.headers or {}).get("x-stream-offset")
    assert isinstance(offset, int), properties.headers
    return offset


def producer(node) -> Producer:
    return rstream.Producer("127.0.0.1", port=node.stream_port, username="guest", password="guest")


def consumer(node) -> Consumer:
    return rstream.Consumer("127.0.0.1", port=node.stream_port, username="guest", password="guest")


async def read(node, stream: str, count: int, offset=OffsetType.FIRST, value=None, decoder=None) -> list:
    got: list = []
    done = asyncio.Event()
    reader = consumer(node)
    await reader.start()

    def on_message(message, context):
        got.append((context.offset, message if decoder else bytes(message)))
        if len(got) >= count:
            done.set()

    await reader.subscribe(stream, callback=on_message, decoder=decoder,
                           offset_specification=ConsumerOffsetSpecification(offset, value))
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await reader.close()
    return got


def test_the_stream_listener_is_listed_and_health_checked(node):
    """rabbit_networking:active_listeners() holds the stream plugin's listener: /api/overview shows it and the
    protocol-listener and port-listener checks find it."""
    listed = [(entry["protocol"], entry["port"]) for entry in call(node, "GET", "/api/overview").json["listeners"]]
    assert ("stream", node.stream_port) in listed
    assert call(node, "GET", "/api/health/checks/protocol-listener/stream").json == {"status": "ok",
                                                                                     "protocol": "stream"}
    assert call(node, "GET", f"/api/health/checks/port-listener/{node.stream_port}").json == {
        "status": "ok", "port": node.stream_port}


def test_publish_confirmed_then_read_from_first_and_from_an_offset(node):
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def scenario():
        async with producer(node) as writer:
            await writer.create_stream(stream)
            assert await writer.send_wait(stream, b"one") == 1
            assert await writer.send_batch(stream, [b"m%d" % i for i in range(200)]) == list(range(2, 202))
        everything = await read(node, stream, 201)
        assert everything == [(0, b"one")] + [(i + 1, b"m%d" % i) for i in range(200)]
        assert (await read(node, stream, 3, OffsetType.OFFSET, 198))[:3] == [(198, b"m197"), (199, b"m198"),
                                                                            (200, b"m199")]
        async with producer(node) as writer:
            await writer.delete_stream(stream)
    run(scenario())


def test_a_named_publisher_is_deduplicated_and_its_sequence_kept(node):
    """Publishing ids at or below the name's last are dropped (confirmed); a name with none yet takes any, 0 too
    (the Java client's first for a new name: osiris finds no sequence, so no duplicate; it was dropped)."""
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def scenario():
        async with producer(node) as writer:
            await writer.create_stream(stream)
            for publishing_id in (0, 1, 2, 1, 2):
                await writer.send_wait(stream, rstream.RawMessage(b"m%d" % publishing_id, publishing_id),
                                       publisher_name="app")
        async with producer(node) as writer:  # a new connection, the same name: the sequence is the stream's
            await writer.send_wait(stream, rstream.RawMessage(b"m2", 2), publisher_name="app")
            await writer.send_wait(stream, rstream.RawMessage(b"m3", 3), publisher_name="app")
        got = await read(node, stream, 4)
        assert [body for _, body in got] == [b"m0", b"m1", b"m2", b"m3"]
    run(scenario())


def test_offsets_are_stored_and_queried_by_reference(node):
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def scenario():
        reader = consumer(node)
        await reader.start()
        try:
            await reader.create_stream(stream)
            with pytest.raises(rstream.exceptions.OffsetNotFound):
                await reader.query_offset(stream, "app")
            await reader.store_offset(stream, "app", 42)
            assert await reader.query_offset(stream, "app") == 42
            with pytest.raises(rstream.exceptions.StreamAlreadyExists):
                await reader.create_stream(stream)
            await reader.delete_stream(stream)
            with pytest.raises(rstream.exceptions.StreamDoesNotExist):
                await reader.delete_stream(stream)
        finally:
            await reader.close()
    run(scenario())


@pytest.mark.warren_only("RabbitMQ 3.10 fails the consumer's connection (541) on a record that is not AMQP 1.0")
def test_a_stream_protocol_message_read_over_amqp_091(node):
    """An AMQP 1.0 message published over the stream protocol reaches an AMQP 0-9-1 consumer as RabbitMQ 3.10
    converts it; a record that is not AMQP 1.0 arrives as the body."""
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def publish():
        async with producer(node) as writer:
            await writer.create_stream(stream)
            await writer.send_wait(stream, AMQPMessage(
                body=b"hello", properties=Properties(message_id="id-1", content_type="text/plain",
                                                     correlation_id="c-1", reply_to="back"),
                application_properties={"colour": "red", "n": 7}))
            await writer.send_wait(stream, b"raw bytes")
    run(publish())
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    got = []
    channel.basic_consume(stream, lambda ch, method, props, body: got.append((method, props, body)),
                          arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    connection.close()
    (method, props, body), (_, raw_props, raw_body) = got
    assert body == b"hello" and method.routing_key == stream and method.exchange == ""
    assert (props.message_id, props.content_type, props.correlation_id, props.reply_to) == (
        "id-1", "text/plain", "c-1", "back")
    assert props.headers == {"colour": "red", "n": 7, "x-stream-offset": 0}
    assert raw_body == b"raw bytes" and raw_props.headers == {"x-stream-offset": 1}


def test_message_and_correlation_ids_that_are_not_strings_reach_amqp_091_as_rabbitmq_gives_them(node):
    stream = f"s-{uuid.uuid4().hex[:8]}"
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    cases = [(Properties(message_id=b"\x01\x02bin"), "AQJiaW4=", None, {"x-message-id-type": "binary"}),
             (Properties(message_id=ident), str(ident), None, {"x-message-id-type": "uuid"}),
             (Properties(message_id=42), "42", None, {"x-message-id-type": "ulong"}),
             (Properties(message_id="m" * 300), None, None, {"x-message-id": "m" * 300}),
             (Properties(correlation_id=ident), None, str(ident), {"x-correlation-id-type": "uuid"})]

    async def publish():
        async with producer(node) as writer:
            await writer.create_stream(stream)
            for properties, *_ in cases:
                await writer.send_wait(stream, AMQPMessage(body=b"b", properties=properties))
    run(publish())
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    got = []
    channel.basic_consume(stream, lambda ch, method, props, body: got.append(props),
                          arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while len(got) < len(cases) and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    channel.queue_delete(stream)
    connection.close()
    assert [(props.message_id, props.correlation_id, props.headers) for props in got] == [
        (message_id, correlation_id, {**headers, "x-stream-offset": offset})
        for offset, (_, message_id, correlation_id, headers) in enumerate(cases)]


def test_an_amqp_091_publish_read_over_the_stream_protocol(node):
    stream = f"s-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    channel.basic_publish("", stream, b"from amqp", pika.BasicProperties(
        content_type="application/json", message_id="m-9", delivery_mode=2, headers={"k": "v"}, app_id="app"))
    connection.close()
    [(offset, message)] = run(read(node, stream, 1, decoder=amqp_decoder))
    assert offset == 0 and message.body == b"from amqp"
    assert message.properties.message_id == b"m-9"
    assert message.properties.content_type == b"application/json"
    assert message.application_properties == {b"k": b"v", b"x-basic-app-id": b"app"}
    assert message.message_annotations[b"x-basic-delivery-mode"] == 2


def test_bodies_at_the_edges_of_framing_and_of_16_mib_read_over_the_stream_protocol_byte_exact(node):
    """AMQP 0-9-1 publishes of the sizes ``test_large_bodies`` frames, the large ones kept in the segment file
    for AMQP consumers, reach a stream-protocol subscriber byte-exact in their chunks, as they reach AMQP ones."""
    from test_large_bodies import SIZES, body

    stream = f"s-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for size in SIZES:
        channel.basic_publish("", stream, body(size), pika.BasicProperties(delivery_mode=2))
    connection.close()
    got = run(read(node, stream, len(SIZES), decoder=amqp_decoder))
    assert [offset for offset, _message in got] == list(range(len(SIZES)))
    assert [len(message.body) for _offset, message in got] == SIZES
    assert all(message.body == body(size) for (_offset, message), size in zip(got, SIZES))


def test_an_amqp_091_publish_is_stored_as_the_record_rabbitmq_writes(node):
    """Byte for byte the AMQP 1.0 record RabbitMQ 3.10.8 stores for this publish (read back over the stream protocol);
    an AMQP 0-9-1 consumer gets it back as RabbitMQ converts it: tables and arrays in the headers are gone."""
    stream = f"p091-{uuid.uuid4().hex[:10]}"  # 15 bytes, as the name the record below was taken with
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    headers: dict[str, Any] = {"s": "str", "i": 5, "neg": -3, "big": 1 << 40, "b": True, "t": {"x": 1},
                               "a": [1, "two"], "n": None, "ts": datetime.datetime(2020, 1, 1)}
    properties = pika.BasicProperties(
        content_type="text/plain", content_encoding="gzip", headers=headers, delivery_mode=2, priority=3,
        correlation_id="corr", reply_to="rep", expiration="60000", message_id="mid", timestamp=1600000000,
        type="typ", user_id="guest", app_id="app")
    channel.basic_publish("", stream, b"body", properties)
    [(_, record)] = run(read(node, stream, 1))
    expected = bytes.fromhex(
        "005372c1770aa30d782d726f7574696e672d6b6579a10f") + stream.encode() + bytes.fromhex(
        "a30a782d65786368616e6765a100a310782d62617369632d7072696f726974795003a315782d62617369632d64656c6976"
        "6572792d6d6f64655002a312782d62617369632d65787069726174696f6ea1053630303030005373c0390da1036d6964a005"
        "67756573744040a103726570a104636f7272a30a746578742f706c61696ea304677a6970408300000174876e800040404000"
        "5374c16112a10c782d62617369632d74797065a103747970a10e782d62617369632d6170702d6964a103617070a10173a103"
        "737472a101695405a1036e656754fda103626967810000010000000000a101625601a1016e40a1027473830000016f5e66e8"
        "00005375a004626f6479")
    assert record == expected
    channel.basic_qos(prefetch_count=10)
    got = []
    channel.basic_consume(stream, lambda ch, method, props, body: got.append((method, props, body)),
                          arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    channel.queue_delete(stream)
    connection.close()
    [(method, props, body)] = got
    assert (method.exchange, method.routing_key, body) == ("", stream, b"body")
    kept = {k: v for k, v in headers.items() if k not in ("t", "a")}
    assert props.headers == {**kept, "ts": datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc),
                             "x-stream-offset": 0}
    assert (props.content_type, props.content_encoding, props.delivery_mode, props.priority, props.correlation_id,
            props.reply_to, props.expiration, props.message_id, props.timestamp, props.type, props.user_id,
            props.app_id) == ("text/plain", "gzip", 2, 3, "corr", "rep", "60000", "mid", 1600000000, "typ", "guest",
                              "app")


def test_rbfly_publishes_and_reads(node):
    rbs = pytest.importorskip("rbfly.streams")
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def scenario():
        client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{node.stream_port}/")
        try:
            await client.create_stream(stream)
            async with client.publisher(stream) as publisher:
                for i in range(5):
                    await publisher.send(b"rb%d" % i)
            got = []
            async for message in client.subscribe(stream, offset=rbs.Offset.FIRST):
                got.append(message)
                if len(got) == 5:
                    break
            assert got == [b"rb%d" % i for i in range(5)]
            await client.delete_stream(stream)
        finally:
            await client.disconnect()
    run(scenario())


def test_a_deleted_stream_is_a_metadata_update_to_its_consumers(node):
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def scenario():
        closed = asyncio.Event()
        told: list[str] = []

        async def on_close(info):
            told.extend(info.streams)
            closed.set()

        reader = rstream.Consumer("127.0.0.1", port=node.stream_port, username="guest", password="guest",
                                  on_close_handler=on_close)
        await reader.start()
        await reader.create_stream(stream)
        await reader.subscribe(stream, callback=lambda message, context: None)
        connection = pika.BlockingConnection(pika.URLParameters(node.url))
        connection.channel().queue_delete(stream)
        connection.close()
        await asyncio.wait_for(closed.wait(), 5)
        assert told == [stream]
        await reader.close()
    run(scenario())


# -- raw frames -------------------------------------------------------------------------------------------

def frame(key: int, body: bytes, version: int = 1) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, version) + body


def string(value: str) -> bytes:
    return struct.pack(">h", len(value.encode())) + value.encode()


class Raw:
    def __init__(self, node) -> None:
        self.sock = socket.create_connection(("127.0.0.1", node.stream_port), timeout=5)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> tuple[int, bytes]:
        """(key, the rest) of the next frame; (-1, b"") when the broker closed the socket."""
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack_from(">I", self.buf)[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                return -1, b""
            self.buf += chunk
        size = struct.unpack_from(">I", self.buf)[0]
        data, self.buf = self.buf[4:4 + size], self.buf[4 + size:]
        return struct.unpack_from(">H", data)[0], data[4:]

    def authenticate(self, mechanism: str, data: bytes) -> int:
        """Peer properties, the SASL handshake and one sasl_authenticate: its response code."""
        self.send(frame(0x11, struct.pack(">I", 1) + struct.pack(">i", 0)))
        assert self.receive()[0] == 0x8011
        self.send(frame(0x12, struct.pack(">I", 2)))
        assert self.receive()[0] == 0x8012
        self.send(frame(0x13, struct.pack(">I", 3) + string(mechanism) + struct.pack(">i", len(data)) + data))
        key, rest = self.receive()
        assert key == 0x8013
        return struct.unpack_from(">IH", rest)[1]

    def login(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> int:
        code = self.authenticate("PLAIN", b"\0" + user.encode() + b"\0" + password.encode())
        if code != 1:
            return code
        key, rest = self.receive()
        assert key == 0x14
        self.send(frame(0x14, rest))
        self.send(frame(0x15, struct.pack(">I", 4) + string(vhost)))
        key, rest = self.receive()
        return struct.unpack_from(">IH", rest)[1]

    def request(self, key: int, body: bytes) -> int:
        """Send a request (correlation 9) and answer its response code."""
        self.send(frame(key, struct.pack(">I", 9) + body))
        got, rest = self.receive()
        assert got == key | 0x8000
        return struct.unpack_from(">IH", rest)[1]

    def closed_with(self) -> int:
        """The code of the close request the broker sends."""
        key, rest = self.receive()
        assert key == 0x16, key
        return struct.unpack_from(">IH", rest)[1]


@pytest.mark.warren_only("the pre-login frame limit is Warren's (RabbitMQ takes frames up to frame_max)")
def test_a_large_frame_before_login_closes_the_connection(node):
    raw = Raw(node)
    raw.send(struct.pack(">I", 1_000_000) + b"\x00\x11\x00\x01")
    assert raw.closed_with() == 0x0E  # FRAME_TOO_LARGE


def test_an_unknown_command_closes_with_unknown_frame(node):
    raw = Raw(node)
    assert raw.login() == 1
    raw.send(frame(0x7F, b"whatever"))
    assert raw.closed_with() == 0x0D


def test_a_truncated_frame_closes_with_unknown_frame(node):
    raw = Raw(node)
    assert raw.login() == 1
    raw.send(frame(0x0D, struct.pack(">I", 9) + struct.pack(">h", 300) + b"short"))
    assert raw.closed_with() == 0x0D


def test_a_wrong_password_is_authentication_failure(node):
    assert Raw(node).login(password="wrong") == 0x08


@pytest.mark.parametrize("mechanism, data, code", [("FOO", b"\0guest\0guest", 0x07), ("PLAIN", b"no-nul-bytes", 0x09),
                                                   ("PLAIN", b"guest\0guest\0guest", 0x09)])
def test_a_failed_sasl_authenticate_closes_the_connection(node, mechanism, data, code):
    """rabbit_stream_reader's sasl_authenticate answers an unknown mechanism (7) or a malformed response (9) and sets
    the step to failure, which closes the socket (invalid_transition): no second try on the connection."""
    raw = Raw(node)
    assert raw.authenticate(mechanism, data) == code
    assert raw.receive() == (-1, b"")


def test_the_nodes_mechanisms_are_offered_and_amqplain_logs_in(node):
    """rabbit_stream_utils:auth_mechanisms: the node's configured mechanisms (PLAIN and AMQPLAIN by default), each
    as AMQP's logins take it (rabbit_auth_mechanism_amqplain: a table of LOGIN and PASSWORD)."""
    raw = Raw(node)
    raw.send(frame(0x11, struct.pack(">I", 1) + struct.pack(">i", 0)))
    assert raw.receive()[0] == 0x8011
    raw.send(frame(0x12, struct.pack(">I", 2)))
    key, rest = raw.receive()
    assert key == 0x8012 and rest[4:] == struct.pack(">Hi", 1, 2) + string("PLAIN") + string("AMQPLAIN")

    def amqplain(password: bytes) -> bytes:
        return b"".join(bytes([len(name)]) + name + b"S" + struct.pack(">I", len(value)) + value
                        for name, value in ((b"LOGIN", b"guest"), (b"PASSWORD", password)))
    raw.send(frame(0x13, struct.pack(">I", 3) + string("AMQPLAIN") + struct.pack(">i", len(amqplain(b"guest")))
                   + amqplain(b"guest")))
    key, rest = raw.receive()
    assert key == 0x8013 and struct.unpack_from(">IH", rest) == (3, 1)
    assert Raw(node).authenticate("AMQPLAIN", amqplain(b"wrong")) == 0x08


def test_an_unknown_vhost_is_vhost_access_failure(node):
    assert Raw(node).login(vhost="no-such-vhost") == 0x0C


@pytest.mark.warren_only("needs warren-admin")
def test_permissions_are_checked_by_the_broker_operations(node):
    user = f"u-{uuid.uuid4().hex[:6]}"
    assert node.admin("add-user", user, "pw").returncode == 0
    assert node.admin("set-permissions", "/", user, "^cfg-.*", "^w-.*", "^r-.*").returncode == 0
    raw = Raw(node)
    assert raw.login(user, "pw") == 1
    assert raw.request(0x0D, string("nope") + struct.pack(">i", 0)) == 0x10  # create: configure refused
    assert raw.request(0x0D, string("cfg-a") + struct.pack(">i", 0)) == 1
    assert raw.request(0x01, b"\x01" + string("") + string("cfg-a")) == 0x10  # declare publisher: write
    assert raw.request(0x07, b"\x01" + string("cfg-a") + struct.pack(">H", 1) + struct.pack(">H", 10)
                       + struct.pack(">i", 0)) == 0x10  # subscribe: read
    assert raw.request(0x0E, string("cfg-a")) == 1


def test_bad_requests_get_their_response_codes(node):
    raw = Raw(node)
    assert raw.login() == 1
    stream = f"s-{uuid.uuid4().hex[:8]}"
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 1) + string("max-length-bytes")
                       + string("lots")) == 0x11
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 0x05
    assert raw.request(0x01, b"\x01" + string("") + string("missing")) == 0x02
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 1
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 0x11  # the id is taken
    assert raw.request(0x06, b"\x07") == 0x12
    subscribe = b"\x01" + string(stream) + struct.pack(">H", 1) + struct.pack(">H", 10) + struct.pack(">i", 0)
    assert raw.request(0x07, subscribe) == 1
    assert raw.request(0x07, subscribe) == 0x03
    assert raw.request(0x0C, b"\x05") == 0x04
    raw.send(frame(0x02, b"\x09" + struct.pack(">i", 1) + struct.pack(">Q", 77) + struct.pack(">i", 1) + b"x"))
    key, rest = raw.receive()
    assert key == 0x04 and rest == b"\x09" + struct.pack(">I", 1) + struct.pack(">QH", 77, 0x12)
    assert raw.request(0x0B, string("nobody") + string(stream)) == 0x13
    assert raw.request(0x0E, string(stream)) == 1


def create(raw: "Raw", stream: str, **arguments: str) -> int:
    return raw.request(0x0D, string(stream) + struct.pack(">i", len(arguments))
                       + b"".join(string(key.replace("_", "-")) + string(value) for key, value in arguments.items()))


def test_create_checks_its_arguments_and_an_existing_queues_equivalence_as_rabbitmq(node):
    """rabbit_stream_manager: a cluster size below 1 or an unknown leader locator is PRECONDITION_FAILED; an
    existing queue of the name is STREAM_ALREADY_EXISTS only if declaring it with these arguments is equivalent
    (assert_equivalence), else PRECONDITION_FAILED; the name is checked before the permission."""
    raw = Raw(node)
    assert raw.login() == 1
    stream = f"s-{uuid.uuid4().hex[:8]}"
    assert create(raw, stream, initial_cluster_size="0") == 0x11
    assert create(raw, stream, queue_leader_locator="nowhere") == 0x11
    assert create(raw, stream, max_age="1h", queue_leader_locator="balanced") == 1
    assert create(raw, stream, max_age="1h", queue_leader_locator="balanced") == 0x05
    assert create(raw, stream, max_age="2h", queue_leader_locator="balanced") == 0x11
    assert create(raw, stream) == 0x11
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(f"{stream}-amqp", durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_declare(f"{stream}-classic", durable=True)
    assert create(raw, f"{stream}-amqp") == 0x05
    assert create(raw, f"{stream}-classic") == 0x11
    assert create(raw, f"{stream}-long", max_length_bytes="1000") == 1
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            connection.channel().queue_declare(f"{stream}-long", durable=True, arguments={"x-queue-type": "stream"})
    assert caught.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-length-bytes' for queue '{stream}-long' in vhost '/': "
        "received none but current is the value '1000' of type 'long'")  # (create's integers are longs)
    for name in (stream, f"{stream}-amqp", f"{stream}-long"):
        assert raw.request(0x0E, string(name)) == 1
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        connection.channel().queue_delete(f"{stream}-classic")
    user = f"u-{uuid.uuid4().hex[:6]}"
    assert node.admin("add-user", user, "pw").returncode == 0
    assert node.admin("set-permissions", "/", user, "^cfg-.*", ".*", ".*").returncode == 0
    refused = Raw(node)
    assert refused.login(user, "pw") == 1
    assert create(refused, "amq.nope") == 0x11 and create(refused, "nope") == 0x10


def test_a_taken_id_on_a_missing_stream_is_answered_in_rabbitmqs_order(node):
    """rabbit_stream_reader: declare_publisher checks the ids before looking the stream up (PRECONDITION_FAILED),
    subscribe looks the stream up first (STREAM_DOES_NOT_EXIST)."""
    raw = Raw(node)
    assert raw.login() == 1
    stream = f"s-{uuid.uuid4().hex[:8]}"
    assert create(raw, stream) == 1
    assert raw.request(0x01, b"\x01" + string("ref") + string(stream)) == 1
    assert raw.request(0x01, b"\x01" + string("") + string("missing")) == 0x11
    assert raw.request(0x01, b"\x02" + string("ref") + string(stream)) == 0x11  # its reference, on that stream
    assert raw.request(0x01, b"\x02" + string("ref") + string("missing")) == 0x02
    subscribe = struct.pack(">H", 1) + struct.pack(">H", 10) + struct.pack(">i", 0)
    assert raw.request(0x07, b"\x01" + string(stream) + subscribe) == 1
    assert raw.request(0x07, b"\x01" + string("missing") + subscribe) == 0x02
    assert raw.request(0x07, b"\x01" + string(stream) + subscribe) == 0x03
    assert raw.request(0x0E, string(stream)) == 1


def partitions(raw: "Raw", super_stream: str) -> list[str]:
    raw.send(frame(0x19, struct.pack(">I", 9) + string(super_stream)))
    key, rest = raw.receive()
    assert key & 0x7FFF == 0x19 and struct.unpack_from(">IH", rest) == (9, 1)  # (RabbitMQ 3.10: key 0x19, no bit)
    names, at = [], 10
    for _ in range(struct.unpack_from(">i", rest, 6)[0]):
        size = struct.unpack_from(">h", rest, at)[0]
        names.append(rest[at + 2:at + 2 + size].decode())
        at += 2 + size
    return names


@pytest.mark.parametrize("bindings, expected", [
    ([("b", "s2", None), ("a", "s1", None), ("c", "s0", None)], ["s1", "s2", "s0"]),  # by routing key
    ([("10", "s0", None), ("2", "s1", None), ("1", "s2", None)], ["s2", "s0", "s1"]),  # (as binaries)
    ([("k", "s2", None), ("k", "s1", None), ("k", "s0", None)], ["s0", "s1", "s2"]),  # then by stream
    ([("x", "s0", "2"), ("y", "s1", "10"), ("z", "s2", 1)], ["s2", "s0", "s1"]),  # an order, a string one too
    ([("b", "s1", None), ("a", "s2", None), ("c", "s0", 5)], ["s0", "s2", "s1"]),  # ordered ones first
    ([("b", "s1", None), ("a", "s2", None), ("d", "s1", None)], ["s2", "s1", "s1"]),  # each binding
], ids=["key", "key-binary", "stream", "order", "ordered-first", "twice"])
def test_a_super_streams_partitions_are_in_rabbitmqs_order(node, bindings, expected):
    """rabbit_stream_manager:super_stream_partitions: the exchange's bindings to streams as Mnesia holds them (by
    routing key, then stream), those with an x-stream-partition-order (an integer, or a string of one) first by
    it (rabbit_stream_utils:sort_partitions): a client routing by hash picks the partition by its place."""
    tag = uuid.uuid4().hex[:8]
    super_stream = f"ss-{tag}"
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.exchange_declare(super_stream, "direct", durable=True)
        for key, stream, order in bindings:
            channel.queue_declare(f"{stream}-{tag}", durable=True, arguments={"x-queue-type": "stream"})
            channel.queue_bind(f"{stream}-{tag}", super_stream, key,
                               arguments=None if order is None else {"x-stream-partition-order": order})
    raw = Raw(node)
    assert raw.login() == 1
    assert partitions(raw, super_stream) == [f"{stream}-{tag}" for stream in expected]
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.exchange_delete(super_stream)
        for stream in {stream for _, stream, _ in bindings}:
            channel.queue_delete(f"{stream}-{tag}")


@pytest.mark.warren_only("kills a node of its own")
def test_a_named_publishers_sequence_and_its_confirmed_messages_survive_kill_9(start_broker):
    """Deduplication is as durable as the messages it confirmed: right after the last confirm, kill -9; the
    restarted node reports that publishing id and refuses to write those messages again."""
    port = free_port()
    node = start_broker("--stream-enabled", "true", "--stream-port", str(port))
    node.stream_port = port
    wait_for_stream_port(port)
    raw = Raw(node)
    assert raw.login() == 1
    assert raw.request(0x0D, string("s") + struct.pack(">i", 0)) == 1
    assert raw.request(0x01, b"\x01" + string("app") + string("s")) == 1

    def publish(ids: range) -> bytes:
        return frame(0x02, b"\x01" + struct.pack(">i", len(ids)) + b"".join(
            struct.pack(">QI", i, 4) + b"m%03d" % i for i in ids))

    for start in range(1, 301, 50):
        raw.send(publish(range(start, start + 50)))
    confirmed = 0
    while confirmed < 300:
        key, rest = raw.receive()
        assert key == 0x03
        confirmed += struct.unpack_from(">I", rest, 1)[0]
    node.kill()
    node.start()
    wait_for_stream_port(port)
    raw = Raw(node)
    assert raw.login() == 1
    raw.send(frame(0x05, struct.pack(">I", 9) + string("app") + string("s")))
    key, rest = raw.receive()
    assert key == 0x8005 and struct.unpack_from(">IHQ", rest) == (9, 1, 300)
    assert raw.request(0x01, b"\x01" + string("app") + string("s")) == 1
    raw.send(publish(range(299, 302)))  # two already there: confirmed, not written
    key, rest = raw.receive()
    assert key == 0x03
    assert raw.request(0x07, b"\x01" + string("s") + struct.pack(">HHi", 1, 100, 0)) == 1
    got: list[bytes] = []
    while len(got) < 301:
        key, rest = raw.receive()
        if key != 0x08:
            continue
        entries, data_len = struct.unpack_from(">H", rest, 3)[0], struct.unpack_from(">I", rest, 1 + 36)[0]
        data, pos = rest[1 + 48:1 + 48 + data_len], 0
        for _ in range(entries):
            size = struct.unpack_from(">I", data, pos)[0]
            got.append(data[pos + 4:pos + 4 + size])
            pos += 4 + size
    assert got == [b"m%03d" % i for i in range(1, 302)]


def read_chunks(raw: "Raw", count: int) -> list[tuple[int, int, int, bytes]]:
    """(first offset, entries, records, data) of the next ``count`` deliver frames."""
    chunks: list[tuple[int, int, int, bytes]] = []
    while len(chunks) < count:
        key, rest = raw.receive()
        if key != 0x08:
            continue
        _magic, _kind, entries, records, _ts, _epoch, first, crc, data_len, _trailer, _reserved = struct.unpack_from(
            ">BBHIqQQIIII", rest, 1)
        data = rest[1 + 48:]
        assert len(data) == data_len and zlib.crc32(data) == crc  # never the trailer
        chunks.append((first, entries, records, data))
    return chunks


def publish_raw(raw: "Raw", publisher_id: int, messages: list[tuple[int, bytes]]) -> list[int]:
    """A publish frame of (publishing id, entry): the publishing ids its confirms name."""
    raw.send(frame(0x02, bytes([publisher_id]) + struct.pack(">i", len(messages)) + b"".join(
        struct.pack(">QI", publishing_id, len(entry)) + entry for publishing_id, entry in messages)))
    confirmed: list[int] = []
    while len(confirmed) < len(messages):
        key, rest = raw.receive()
        assert key == 0x03 and rest[0] == publisher_id, (key, rest)
        count = struct.unpack_from(">I", rest, 1)[0]
        confirmed += struct.unpack_from(f">{count}Q", rest, 5)
    return confirmed


def test_a_name_published_under_on_two_connections_is_deduplicated_by_the_streams_sequence(node):
    """osiris_writer checks a publishing id against the stream's last for that writer name, whichever
    connection wrote it: a client that reconnects while its old connection lives on (or two instances of one
    producer) writes no message twice."""
    first, second = Raw(node), Raw(node)
    assert first.login() == 1 and second.login() == 1
    stream = f"s-{uuid.uuid4().hex[:8]}"
    assert create(first, stream) == 1
    for raw in (first, second):
        assert raw.request(0x01, b"\x01" + string("app") + string(stream)) == 1
    assert sorted(publish_raw(first, 1, [(i, b"a%d" % i) for i in range(1, 6)])) == [1, 2, 3, 4, 5]
    assert sorted(publish_raw(second, 1, [(i, b"b%d" % i) for i in range(3, 8)])) == [3, 4, 5, 6, 7]
    assert sorted(publish_raw(first, 1, [(6, b"a6"), (9, b"a9")])) == [6, 9]
    assert first.request(0x07, b"\x01" + string(stream) + struct.pack(">HH", 1, 50) + struct.pack(">i", 0)) == 1
    chunks = read_chunks(first, 3)
    assert [(offset, records) for offset, _, records, _ in chunks] == [(0, 5), (5, 2), (7, 1)]
    entries = b"".join(data for _, _, _, data in chunks)
    assert [entries[at + 4:at + 6] for at in range(0, len(entries), 6)] == [
        b"a1", b"a2", b"a3", b"a4", b"a5", b"b6", b"b7", b"a9"]
    assert first.request(0x0E, string(stream)) == 1


def test_a_sub_batch_is_stored_as_it_came_and_read_over_amqp_091_as_its_records(node):
    """A sub-batch entry reaches subscribers as the client compressed it, its records an offset each; an AMQP
    0-9-1 consumer gets the records of a gzip sub-batch, and passes over those of a compression it cannot read."""
    stream = f"s-{uuid.uuid4().hex[:8]}"
    raw = Raw(node)
    assert raw.login() == 1
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 1
    plain = b"".join(struct.pack(">I", len(r)) + r for r in (b"r0", b"r1", b"r2"))
    packed = gzip.compress(plain)
    gzip_entry = struct.pack(">BHII", 0x80 | 1 << 4, 3, len(plain), len(packed)) + packed
    zstd_entry = struct.pack(">BHII", 0x80 | 4 << 4, 2, 99, 5) + b"?????"
    simple = struct.pack(">I", 3) + b"end"
    raw.send(frame(0x02, b"\x01" + struct.pack(">i", 3) + struct.pack(">Q", 1) + gzip_entry
                   + struct.pack(">Q", 2) + zstd_entry + struct.pack(">Q", 3) + simple))
    key, rest = raw.receive()
    assert key == 0x03 and rest == b"\x01" + struct.pack(">I", 3) + struct.pack(">QQQ", 1, 2, 3)
    assert raw.request(0x07, b"\x01" + string(stream) + struct.pack(">HHi", 1, 10, 0)) == 1
    [(first, entries, records, data)] = read_chunks(raw, 1)
    assert (first, entries, records, data) == (0, 3, 6, gzip_entry + zstd_entry + simple)
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    got: list[tuple[int, bytes]] = []
    channel.basic_consume(stream, lambda ch, method, props, body: got.append((offset_of(props), body)),
                          arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 5
    while len(got) < 4 and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    connection.close()
    assert got == [(0, b"r0"), (1, b"r1"), (2, b"r2"), (5, b"end")]


@pytest.mark.parametrize("shape", ["sub-batch", "footer"])
def test_large_records_in_sub_batches_or_with_footers_reach_an_amqp_091_consumer_from_the_file(node, shape):
    """Eight 16 MiB AMQP 1.0 records, each between two small ones in an uncompressed sub-batch (``sub-batch``), or
    simple entries with a footer after the body (``footer``), read from the first offset by an AMQP 0-9-1
    consumer with prefetch 100 that acks none: each arrives byte-exact, its body sent from the segment file as
    a simple record's that ends with it is (``chunk.file_records``, ``Decoder.head``), where each was read
    into memory whole (a sub-batch whole) and decoded with its body: the node's peak grows by a body or two,
    not by the bodies in flight (17 and 20 MiB more at its peak, 143 and 126 before)."""
    stream = f"s-{uuid.uuid4().hex[:8]}"
    size, count = 16 << 20, 8
    bodies = [bytes([65 + number]) * 7 + struct.pack(">Q", number) * (size // 8 - 1) for number in range(count)]
    footer = b"\x00\x53\x78\xc1\x0c\x02\xa3\x05x-sum\xa1\x02ok"  # (a map of x-sum: "ok")
    raw = Raw(node)
    assert raw.login() == 1
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 1
    for number, data in enumerate(bodies):
        records = [b"\x00\x53\x75\xa0\x05small", b"\x00\x53\x75\xb0" + struct.pack(">I", len(data)) + data
                   + (footer if shape == "footer" else b""), b"\x00\x53\x75\xa0\x05after"]
        plain = [struct.pack(">I", len(record)) + record for record in records]
        entries = [struct.pack(">BHII", 0x80, len(records), len(b"".join(plain)), len(b"".join(plain)))
                   + b"".join(plain)] if shape == "sub-batch" else plain
        raw.send(frame(0x02, b"\x01" + struct.pack(">i", len(entries)) + b"".join(
            struct.pack(">Q", 3 * number + k + 1) + entry for k, entry in enumerate(entries))))
        key, rest = raw.receive()
        assert key == 0x03
    with open(f"/proc/{node.proc.pid}/clear_refs", "w") as refs:
        refs.write("5")
    before = peak_rss(node)
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    got: list[tuple[int, bool]] = []

    def on_message(_channel, _method, props, body: bytes) -> None:
        got.append((offset_of(props), body == bodies[len(got) // 3] if len(got) % 3 == 1 else len(body) == 5))

    channel.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    while len(got) < 3 * count and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    held = peak_rss(node) - before
    connection.close()
    assert got == [(offset, True) for offset in range(3 * count)]
    assert held < 64 << 20, f"{held >> 20} MiB more at the node's peak"


def peak_rss(node) -> int:
    """The node's peak resident memory (``VmHWM``) since it was last reset."""
    with open(f"/proc/{node.proc.pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


RABBITMQ_CUTS = {  # frames' entry counts: the chunks RabbitMQ 3.10.8's writer made of them into a new stream
    "4999, 100, 3000": ([4999, 100, 3000], [32, 64, 128, 256, 512, 1024, 2048, 935, 100, 1024, 1976]),
    "32, 32, 31, 200": ([32, 32, 31, 200], [32, 32, 31, 32, 64, 104]),
    "70000": ([70_000], [32, 64, 128, 256, 512, 1024, 2048, 4096] + [8192] * 7 + [4496]),
}


@pytest.mark.parametrize("cuts", RABBITMQ_CUTS, ids=list(RABBITMQ_CUTS))
@pytest.mark.parametrize("sizes", ["one size", "sizes differ"])
def test_publish_frames_are_cut_into_chunks_as_rabbitmqs_writer_cuts_them(node, cuts, sizes):
    """osiris's writer takes at most its batch size of the waiting writes into a chunk (32 at first, doubled after
    a full batch up to 8,192, halved after one that took all that waited); the chunks hold the entries as they
    came.  (Records all of one size are taken apart as arrays, others one by one; a named publisher's
    sequence is the frames' last id.)"""
    frames, expected = RABBITMQ_CUTS[cuts]
    stream = f"s-{uuid.uuid4().hex[:8]}"
    raw = Raw(node)
    assert raw.login() == 1
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
    reference = "app" if sizes == "sizes differ" else ""
    assert raw.request(0x01, b"\x01" + string(reference) + string(stream)) == 1
    entries = []
    publishing_id = 1
    for count in frames:
        records = [b"r%04d" % (i % 10000) + (b"+" if sizes == "sizes differ" and i % 7 == 3 else b"")
                   for i in range(count)]
        raw.send(frame(0x02, b"\x01" + struct.pack(">i", count) + b"".join(
            struct.pack(">QI", publishing_id + i, len(record)) + record for i, record in enumerate(records))))
        entries += [struct.pack(">I", len(record)) + record for record in records]
        publishing_id += count
        confirmed = 0
        while confirmed < count:
            key, rest = raw.receive()
            assert key == 0x03
            confirmed += struct.unpack_from(">I", rest, 1)[0]
    assert raw.request(0x07, b"\x01" + string(stream) + struct.pack(">HHi", 1, 100, 0)) == 1
    chunks = read_chunks(raw, len(expected))
    assert [entries for _first, entries, _records, _data in chunks] == expected
    assert [first for first, *_ in chunks] == [sum(expected[:i]) for i in range(len(expected))]
    assert b"".join(data for *_, data in chunks) == b"".join(entries)
    if reference:
        raw.send(frame(0x05, struct.pack(">I", 9) + string(reference) + string(stream)))
        key, rest = raw.receive()
        while key == 0x08:
            key, rest = raw.receive()
        assert key == 0x8005 and struct.unpack_from(">IHQ", rest) == (9, 1, publishing_id - 1)


def test_chunks_sent_to_a_subscriber_that_does_not_read_for_a_while_all_arrive_whole_and_in_order(node):
    """A large credit: runs of chunks are written at once while the socket takes them, and what it does not
    take waits in the transport; nothing is lost, cut or sent twice."""
    stream = f"s-{uuid.uuid4().hex[:8]}"
    raw = Raw(node)
    assert raw.login() == 1
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 1
    records: list[bytes] = []
    for n in range(50):  # chunks of 2,048 and 2,952 entries, each below RUN_BELOW: sent in runs
        batch = [b"%02d-%05d" % (n, i) + b"x" * (10 + i % 20) for i in range(5000)]
        raw.send(frame(0x02, b"\x01" + struct.pack(">i", len(batch)) + b"".join(
            struct.pack(">QI", len(records) + i, len(record)) + record for i, record in enumerate(batch))))
        records += batch
    confirmed = 0
    while confirmed < len(records):
        key, rest = raw.receive()
        assert key == 0x03
        confirmed += struct.unpack_from(">I", rest, 1)[0]
    assert raw.request(0x07, b"\x01" + string(stream) + struct.pack(">HHi", 1, 1000, 0)) == 1
    time.sleep(1)  # the broker writes until the socket is full
    chunks: list[tuple[int, int, int, bytes]] = []
    while sum(entries for _first, entries, _records, _data in chunks) < len(records):
        chunks += read_chunks(raw, 1)
    assert [first for first, *_ in chunks] == [sum(c[1] for c in chunks[:i]) for i in range(len(chunks))]
    assert b"".join(data for *_, data in chunks) == b"".join(struct.pack(">I", len(r)) + r for r in records)


def test_last_after_a_large_frame_starts_at_its_last_chunk_as_on_rabbitmq(node):
    """rstream's own test_offset_type_last: 4,999 messages sent in one frame, then a subscription at ``last``
    gets fewer than all of them (on RabbitMQ 3.10 the last 935: its writer cut the frame into chunks of 32, 64,
    ... 2,048 and 935)."""
    stream = f"s-{uuid.uuid4().hex[:8]}"

    async def scenario():
        writer = producer(node)
        await writer.start()
        await writer.create_stream(stream)
        confirmed = asyncio.Event()
        count = 0

        def on_confirm(status):
            nonlocal count
            count += 1
            if count == 4999:
                confirmed.set()

        await writer.send_batch(stream, [b"%d" % i for i in range(1, 5000)], on_publish_confirm=on_confirm)
        await asyncio.wait_for(confirmed.wait(), 10)
        await writer.close()
        return await read(node, stream, 935, OffsetType.LAST)

    got = run(scenario())
    assert len(got) == 935 and got[0] == (4064, b"4065") and got[-1] == (4998, b"4999")


def test_once_open_a_frame_above_the_tuned_frame_max_is_taken_as_rabbitmq_takes_it(node):
    """rstream 1.0.1 publishes what it buffered in one frame, past the frame max tune agreed (1 MiB); RabbitMQ
    3.10 takes it.  A frame past FRAME_LIMIT closes the connection with FRAME_TOO_LARGE."""
    stream = f"s-{uuid.uuid4().hex[:8]}"
    raw = Raw(node)
    assert raw.login() == 1
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 1
    count = 2048
    raw.send(frame(0x02, b"\x01" + struct.pack(">i", count) + b"".join(
        struct.pack(">QI", i, 1012) + b"x" * 1012 for i in range(count))))  # 2 MiB
    key, rest = raw.receive()
    assert key == 0x03 and struct.unpack_from(">I", rest, 1)[0] == count
    raw.send(struct.pack(">I", (64 << 20) + 1) + b"\x00\x02\x00\x01")
    assert raw.closed_with() == 0x0E


def test_open_and_metadata_name_the_host_of_the_nodes_name(node):
    """As RabbitMQ's advertised host defaults to the host of its node's name (--stream-advertised-host sets it)."""
    stream = f"s-{uuid.uuid4().hex[:8]}"
    raw = Raw(node)
    raw.send(frame(0x11, struct.pack(">I", 1) + struct.pack(">i", 0)))
    raw.receive()
    raw.send(frame(0x12, struct.pack(">I", 2)))
    raw.receive()
    raw.send(frame(0x13, struct.pack(">I", 3) + string("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest"))
    raw.receive()
    raw.send(frame(0x14, raw.receive()[1]))
    raw.send(frame(0x15, struct.pack(">I", 4) + string("/")))
    key, rest = raw.receive()
    host = socket.gethostname()  # the node's name is warren@<host> unless told
    assert key == 0x8015 and string("advertised_host") + string(host) in rest
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
    raw.send(frame(0x0F, struct.pack(">I", 5) + struct.pack(">i", 1) + string(stream)))
    key, rest = raw.receive()
    assert key == 0x800F and rest[8:8 + 4 + len(host)] == struct.pack(">H", 0) + string(host)


@pytest.mark.warren_only("a node in this process, its disk limit above any disk's free space")
def test_a_publisher_is_refused_while_the_disk_alarm_stands(tmp_path):
    """rabbit_stream_reader's declare_publisher with ``resource_alarm = true`` (the disk alarm, which a connection
    learns of as it registers): PRECONDITION_FAILED; once the alarm clears, the publisher is declared."""
    from amqp_server.publisher_flow import DISK
    from support import start

    running = start(tmp_path, stream_enabled=True, stream_port=free_port(), disk_free_limit=1 << 62)
    try:
        raw = Raw(running)
        assert raw.login() == 1
        assert raw.request(0x0D, string("s") + struct.pack(">i", 0)) == 1  # create: not refused
        declare = bytes([0]) + string("") + string("s")
        assert raw.request(0x01, declare) == 0x11
        assert running.node is not None
        flow = running.node.flow
        running.call(lambda: flow.unblock(DISK))
        assert raw.request(0x01, declare) == 1
    finally:
        running.stop()
