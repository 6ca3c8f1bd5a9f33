"""Argument values are checked where they are stored (``broker.core.storable``), so every path that makes a queue
refuses the same values with RabbitMQ's code and text: AMQP's queue.declare, the stream protocol's create, the
HTTP API's PUT, a definitions import and a definition another node agreed.  Integers outside AMQP's signed 64 bits
are refused (a listing or an export could not write them), and a stream's segment size beyond RabbitMQ's cap
(3,000,000,000); one below the floor a stream's log segments at (1,000,000) is taken, as RabbitMQ takes it.
Values an older version stored out of range are recovered without them, and never break a listing.
"""
from __future__ import annotations

import socket
import struct
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from amqp_server.framing import field_types
from amqp_server.queues import queue_args
from amqp_server.broker import Broker
from amqp_server.config import Config
from amqp_server.records import QueueRecord
from conftest import node_fixture
from support import call, local, q

pytestmark = pytest.mark.timeout(120)

EXCEEDED = "Exceeded max value for x-stream-max-segment-size-bytes"  # rabbit_stream_queue's text


node = node_fixture(streams=True)


def declared(node, name: str, arguments: dict[str, Any]) -> tuple[int, str]:
    """queue.declare over AMQP: (0, "") or the channel's close."""
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port)) as connection:
        try:
            connection.channel().queue_declare(name, durable=True, arguments=arguments)
            return 0, ""
        except ChannelClosedByBroker as exc:
            return exc.reply_code, exc.reply_text


@pytest.mark.parametrize("value, text", [(queue_args.MAX_SEGMENT_BYTES + 1, EXCEEDED), (10**18, EXCEEDED)])
def test_amqp_declare_refuses_a_segment_size_out_of_range(node, value, text):
    name = f"r-{uuid.uuid4().hex[:8]}"
    assert declared(node, name, {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": value}) == (
        406, "PRECONDITION_FAILED - " + text)
    assert call(node, "GET", f"/api/queues/%2F/{q(name)}").status == 404


@pytest.mark.parametrize("value", [0, 200, queue_args.MIN_SEGMENT_BYTES, queue_args.MAX_SEGMENT_BYTES])
def test_amqp_declare_takes_a_segment_size_within_the_range(node, value):
    """(200: rabbitmq-amqp-python-client's own test declares it; RabbitMQ takes it.)"""
    name = f"r-{uuid.uuid4().hex[:8]}"
    assert declared(node, name, {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": value}) == (0, "")
    call(node, "DELETE", f"/api/queues/%2F/{q(name)}")


# -- the stream protocol's create -----------------------------------------------------------------------------


def sframe(key: int, body: bytes) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, 1) + body


def sstring(value: str) -> bytes:
    return struct.pack(">h", len(value.encode())) + value.encode()


def receive(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < 4:
        head += sock.recv(4 - len(head))
    size = struct.unpack(">I", head)[0]
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return struct.unpack_from(">H", data)[0], data[4:]


def stream_create(node, name: str, arguments: dict[str, str]) -> int:
    """A stream-protocol create after a login: its response code."""
    sock = socket.create_connection(("127.0.0.1", node.stream_port), timeout=5)
    try:
        sock.sendall(sframe(0x11, struct.pack(">Ii", 1, 0)) + sframe(0x12, struct.pack(">I", 2)))
        receive(sock), receive(sock)
        sock.sendall(sframe(0x13, struct.pack(">I", 3) + sstring("PLAIN") + struct.pack(">i", 12) + b"\0guest\0guest"))
        receive(sock)
        assert receive(sock)[0] == 0x14
        sock.sendall(sframe(0x14, struct.pack(">II", 1048576, 0)) + sframe(0x15, struct.pack(">I", 4) + sstring("/")))
        receive(sock)
        table = struct.pack(">i", len(arguments)) + b"".join(sstring(k) + sstring(v) for k, v in arguments.items())
        sock.sendall(sframe(0x0D, struct.pack(">I", 9) + sstring(name) + table))
        key, rest = receive(sock)
        assert key == 0x800D
        return struct.unpack_from(">IH", rest)[1]
    finally:
        sock.close()


@pytest.mark.warren_only("reads the node's HTTP API after the create")
@pytest.mark.parametrize("value", [str(10**30), str(queue_args.MAX_SEGMENT_BYTES + 1)])
def test_stream_create_refuses_a_segment_size_out_of_range_and_listings_still_answer(node, value):
    """Finding: a create with 10^30 was stored, and GET /api/queues and /api/definitions answered 500 for
    everyone from then on, restarts included."""
    name = f"r-{uuid.uuid4().hex[:8]}"
    assert stream_create(node, name, {"stream-max-segment-size-bytes": value}) == 0x11  # PRECONDITION_FAILED
    assert call(node, "GET", f"/api/queues/%2F/{q(name)}").status == 404
    assert call(node, "GET", "/api/queues").status == 200
    assert call(node, "GET", "/api/definitions").status == 200


# -- HTTP, definitions import -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments, text", [
    ({"x-queue-type": "stream", "x-stream-max-segment-size-bytes": queue_args.MAX_SEGMENT_BYTES + 1}, EXCEEDED),
    ({"x-max-length": 2**63}, "outside the signed 64-bit range"),
])
def test_http_put_queue_refuses_values_out_of_range(node, arguments, text):
    name = f"r-{uuid.uuid4().hex[:8]}"
    response = call(node, "PUT", f"/api/queues/%2F/{q(name)}", {"durable": True, "arguments": arguments})
    assert response.status == 400 and text in response.json["reason"], response.raw
    assert call(node, "GET", f"/api/queues/%2F/{q(name)}").status == 404


@pytest.mark.parametrize("arguments, text", [
    ({"x-queue-type": "stream", "x-stream-max-segment-size-bytes": queue_args.MAX_SEGMENT_BYTES + 1}, EXCEEDED),
    ({"x-max-length": 2**63}, "outside the signed 64-bit range"),
])
def test_a_definitions_import_refuses_values_out_of_range(node, arguments, text):
    name = f"r-{uuid.uuid4().hex[:8]}"
    response = call(node, "POST", "/api/definitions", {"queues": [
        {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": arguments}]})
    assert response.status == 400 and text in response.json["reason"], response.raw
    assert call(node, "GET", f"/api/queues/%2F/{q(name)}").status == 404


def test_a_policy_refuses_a_segment_size_out_of_range(node):
    for value in (-1, queue_args.MAX_SEGMENT_BYTES + 1):
        response = call(node, "PUT", "/api/policies/%2F/segments", {
            "pattern": "^none$", "apply-to": "streams", "definition": {"stream-max-segment-size-bytes": value}})
        assert response.status == 400 and f"{value} is not a valid segment size" in response.json["reason"]
    response = call(node, "PUT", "/api/policies/%2F/segments", {
        "pattern": "^none$", "apply-to": "streams", "definition": {"stream-max-segment-size-bytes": 1000}})
    assert response.status == 201, response.raw  # (taken, as RabbitMQ takes it: the log segments at the floor)
    call(node, "DELETE", "/api/policies/%2F/segments")


# -- cluster apply, and what an older version stored ------------------------------------------------------------


async def test_a_node_applying_an_agreed_queue_checks_its_arguments_too(tmp_path: Path, caplog):
    import forwarder

    broker = Broker(str(tmp_path / "data"))
    try:
        cluster = forwarder.Cluster(broker, Config(cluster_etcd="127.0.0.1:1", cluster_secret="s",
                                                   node_name="a@host"), None)  # type: ignore[arg-type]  # no flow: nothing publishes
        for arguments in ({"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 10**30},
                          {"x-max-length": 2**63}):
            for node_name in ("a@host", "b@host"):  # this node's, another's (a proxy here)
                record = QueueRecord("/", f"q-{node_name}", True, False, arguments, node=node_name)
                cluster.apply("queue", record.key, asdict(record), None)
                assert f"q-{node_name}" not in broker.vhost("/").queues
        assert "cannot apply queue" in caplog.text
    finally:
        broker.close()


async def test_arguments_an_older_version_stored_out_of_range_are_recovered_without_them(tmp_path: Path):
    data = str(tmp_path / "data")
    broker = Broker(data)
    broker.declare_queue(broker.vhost("/"), "s", durable=True, arguments={"x-queue-type": "stream"})
    broker.declare_queue(broker.vhost("/"), "c", durable=True, arguments={"x-max-length": 5})
    for name, arguments in (("s", {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 10**30}),
                            ("c", {"x-max-length": 5, "x-unknown": [2**64]})):
        record = QueueRecord("/", name, True, False, arguments, index_id=local(broker.vhost("/").queues[name]).index_id)
        broker.store.put(record.kind, record.key, asdict(record))
    broker.close()
    broker = Broker(data)
    try:
        queues = broker.vhost("/").queues
        assert queues["s"].arguments == {"x-queue-type": "stream"} and queues["s"].type.name == "stream"
        assert queues["c"].arguments == {"x-max-length": 5}
        for queue in queues.values():
            field_types.to_json(queue.arguments)  # a listing and an export can write them
    finally:
        broker.close()


def test_the_http_api_writes_an_integer_beyond_64_bits_rather_than_failing():
    from mgmt_http.http import encode

    assert encode({"arguments": {"x": 10**30}}) == b'{"arguments": {"x": 1000000000000000000000000000000}}'
