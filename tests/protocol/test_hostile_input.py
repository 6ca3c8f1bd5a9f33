"""Hostile input and narrow permissions: each refused with RabbitMQ's error, nothing else changes.

A user with narrow permissions, raw frames, oversized or half-sent requests: the node answers the offender
and keeps serving everybody else, loses nothing, keeps no memory.
"""
from __future__ import annotations

import json
import socket
import struct
import time
import urllib.parse

import pika
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from conftest import connect
from support import Closed, Raw, assert_error, call, publish_frames, q, raw_frame

from amqp_server.amqp091.channel import Channel
from amqp_server.frontend.front_end import ListedChannel

pytestmark = pytest.mark.timeout(120)


def make_user(broker, name: str, configure: str, write: str, read: str, tags: str = "management",
              password: str = "pw") -> tuple[str, str]:
    assert broker.admin("add-user", name, password, "--tags", tags).returncode == 0
    assert broker.admin("set-permissions", "/", name, configure, write, read).returncode == 0
    return name, password


def refused(action) -> pika.exceptions.ChannelClosedByBroker:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action()
    return closed.value


def rss(broker) -> int:
    with open(f"/proc/{broker.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# -- 1. dead letters and unroutable messages only go where their publisher may write -----------------

def test_dead_letter_exchange_needs_write_permission(broker, uid):
    user = make_user(broker, f"{uid}-u", f"^{uid}-app.*", f"^{uid}-app.*", f"^{uid}-app.*")
    with connect(broker, *user) as connection:
        ch = connection.channel()
        error = refused(lambda: ch.queue_declare(f"{uid}-app-dl", arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{uid}-secret"}))
        assert (error.reply_code, error.reply_text) == (
            403, f"ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user '{user[0]}'")
        ch = connection.channel()
        error = refused(lambda: ch.queue_declare(f"{uid}-app-ttl", arguments={
            "x-dead-letter-exchange": "amq.direct", "x-message-ttl": 1}))
        assert error.reply_code == 403 and "exchange 'amq.direct'" in error.reply_text
        ch = connection.channel()
        error = refused(lambda: ch.exchange_declare(f"{uid}-app-x", "fanout", arguments={
            "alternate-exchange": "amq.direct"}))
        assert error.reply_code == 403 and "exchange 'amq.direct'" in error.reply_text
        ch = connection.channel()  # within its own names it may
        ch.exchange_declare(f"{uid}-app-dlx", "fanout", auto_delete=True)
        ch.queue_declare(f"{uid}-app-ok", exclusive=True, arguments={"x-dead-letter-exchange": f"{uid}-app-dlx"})


@pytest.mark.warren_only("creates users with management tags through warren-admin")
def test_dead_letter_exchange_permission_over_http_and_policies(broker, uid):
    user = make_user(broker, f"{uid}-u", f"^{uid}-app.*", f"^{uid}-app.*", f"^{uid}-app.*", tags="policymaker")
    reply = call(broker, "PUT", f"/api/queues/%2F/{q(uid)}-app-dl", {"arguments": {
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{uid}-secret"}}, auth=user)
    assert assert_error(reply, 401)["reason"] == "Access refused."  # RabbitMQ's words: no detail over HTTP
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}-app-dl").status == 404
    for key in ("dead-letter-exchange", "alternate-exchange"):
        reply = call(broker, "PUT", f"/api/policies/%2F/{q(uid)}-{key}", {
            "pattern": f"^{uid}-app", "definition": {key: "amq.direct"}}, auth=user)
        assert_error(reply, 401)
    assert call(broker, "PUT", f"/api/policies/%2F/{q(uid)}-ok", {
        "pattern": f"^{uid}-app", "definition": {"dead-letter-exchange": f"{uid}-app-dlx"}}, auth=user).status == 201
    assert call(broker, "DELETE", f"/api/policies/%2F/{q(uid)}-ok").status == 204


# -- 2. no stored value can make later routing fail -----------------------------------------------------

@pytest.mark.warren_only("RabbitMQ 3.10 accepts it, then closes every later reader of such a dead letter with 541")
def test_dead_letter_routing_key_longer_than_a_short_string_is_refused(conn, broker, uid):
    ch = conn.channel()
    error = refused(lambda: ch.queue_declare(uid, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "k" * 300}))
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '{uid}' in vhost '/': "
             "{value_too_long,300}")
    reply = call(broker, "PUT", f"/api/policies/%2F/{q(uid)}", {
        "pattern": "^$", "definition": {"dead-letter-routing-key": "k" * 300}})
    assert_error(reply, 400)


# -- 3. partial bodies: the memory alarm holds them back, and a closed channel frees them --------------

@pytest.mark.warren_only("starts a node with a small memory watermark")
def test_partial_bodies_are_held_by_the_memory_alarm_and_freed(start_broker, uid):
    node = start_broker("--memory-high-watermark", str(160 * 1024 * 1024))
    assert rss(node) < 140 * 1024 * 1024
    raw = Raw(node, timeout=10)
    raw.handshake()
    chunk = b"x" * (128 * 1024 - 8)
    for number in range(1, 5):
        raw.open_channel(number)
        raw.send_method(number, commands.Basic.Publish(exchange="", routing_key=uid))
        raw.send(raw_frame(2, number, struct.pack(">HHQH", 60, 0, 127 * 1024 * 1024, 0)))
    raw.sock.settimeout(3)
    sent = 0
    try:
        while sent < 400 * 1024 * 1024:  # 375 MiB in 4 partial messages, unless the node stops reading
            raw.send(b"".join(raw_frame(3, 1 + i % 4, chunk) for i in range(8)))
            sent += 8 * len(chunk)
    except (socket.timeout, OSError):
        pass
    peak = rss(node)
    assert sent < 300 * 1024 * 1024, "the node kept reading a publisher during its memory alarm"
    assert peak < 260 * 1024 * 1024
    # the client aborts (a reset: a graceful close would queue its FIN behind data the node no longer reads;
    # such a peer goes at its heartbeat timeout)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()
    # the channels' partial content is freed with them: the alarm clears and another publisher is confirmed
    deadline = time.monotonic() + 20
    with connect(node) as connection:
        ch = connection.channel()
        ch.queue_declare(uid)
        ch.confirm_delivery()
        ch.basic_publish("", uid, b"after")
        assert time.monotonic() < deadline
    assert "memory alarm cleared" in node.said()


@pytest.mark.warren_only("starts a node with a small memory watermark")
def test_a_publisher_blocked_by_an_alarm_is_not_closed_for_the_heartbeats_it_cannot_send(start_broker):
    """A publisher held by the memory alarm is not read, so its heartbeats wait unread: rabbit_reader's maybe_block
    pauses the heartbeat monitor (rabbit_heartbeat:pause_monitor) until it is read again, and so does Warren (it
    closed the client, heartbeating every half second, after two intervals)."""
    node = start_broker("--memory-high-watermark", str(1024 * 1024))  # below any node's memory: the alarm stands
    client = Raw(node, timeout=10)
    try:
        client.handshake(heartbeat=1, capabilities={"connection.blocked": True})
        client.open_channel(1)
        client.send(publish_frames(1, "", "nowhere", b"x"))  # a publisher: held, not read, once the alarm stands
        client.expect(commands.Connection.Blocked)
        client.sock.settimeout(0.5)
        until = time.monotonic() + 3.5  # three and a half intervals
        while time.monotonic() < until:
            try:
                client.send(raw_frame(8, 0, b""))
                data = client.sock.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            assert data, f"closed while blocked, {3.5 - (until - time.monotonic()):.1f} s in"
    finally:
        client.close()


def partial_body(channel: ListedChannel) -> bool:
    """Whether the AMQP 0-9-1 channel holds part of a body (a function: a local would keep the channel alive)."""
    assert isinstance(channel, Channel)
    return bool(channel._body)


def test_closed_channel_with_partial_content_is_freed_without_the_cycle_collector(tmp_path):
    """In-process: a connection and its channels holding partial bodies are freed by reference counting
    alone once the client goes (no Channel <-> AckTimeout or other reference cycle)."""
    import asyncio
    import gc
    import weakref

    from amqp_server.broker import Broker
    from amqp_server.frontend.clients import Clients
    from amqp_server.config import Config
    from amqp_server.amqp091.connection import Connection
    from amqp_server.publisher_flow import PublisherFlow

    async def scenario() -> list[weakref.ref]:
        broker = Broker(str(tmp_path / "data"))
        config = Config()
        clients = Clients()
        server = await asyncio.get_running_loop().create_server(
            lambda: Connection(broker, config, PublisherFlow(), clients), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        from pamqp import frame as pframe

        writer.write(b"AMQP\x00\x00\x09\x01")
        await reader.read(4096)
        writer.write(pframe.marshal(commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"), 0))
        await reader.read(4096)
        writer.write(pframe.marshal(commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0))
        writer.write(pframe.marshal(commands.Connection.Open(virtual_host="/"), 0))
        for number in range(1, 5):
            writer.write(pframe.marshal(commands.Channel.Open(), number))
            writer.write(pframe.marshal(commands.Basic.Publish(exchange="", routing_key="q"), number))
            writer.write(raw_frame(2, number, struct.pack(">HHQH", 60, 0, 10 * 1024 * 1024, 0)))
            writer.write(raw_frame(3, number, b"y" * 100_000))
        await writer.drain()
        for _ in range(50):
            await asyncio.sleep(0.02)
            connections = list(clients.connections)
            if connections and len(connections[0].channels) == 4 and partial_body(connections[0].channels[4]):
                break
        connection = connections[0]
        refs = [weakref.ref(connection)] + [weakref.ref(c) for c in connection.channels.values()]
        del connections, connection
        writer.close()
        for _ in range(50):
            await asyncio.sleep(0.02)
            if not clients.connections:
                break
        server.close()
        await server.wait_closed()
        broker.close()
        return refs

    gc.collect()
    gc.disable()
    try:
        refs = asyncio.run(scenario())
        alive = [ref() for ref in refs if ref() is not None]
        assert not alive, [gc.get_referrers(obj) for obj in alive]
    finally:
        gc.enable()


# -- 4. HTTP bodies: authorised before read, bounded -------------------------------------------------

@pytest.mark.warren_only("reads the node's memory")
def test_http_body_limit_and_refusal_before_reading(broker, uid):
    user = make_user(broker, f"{uid}-u", "^nothing$", "^nothing$", "^nothing$")
    before = rss(broker)
    big = json.dumps({"arguments": {f"k{i}": "v" * 50 for i in range(150_000)}}).encode()  # ~9 MiB
    started = time.monotonic()
    reply = call(broker, "PUT", f"/api/queues/%2F/{q(uid)}", raw=big, auth=user)
    assert_error(reply, 401)
    assert time.monotonic() - started < 2
    assert rss(broker) - before < 64 * 1024 * 1024
    too_big = b'{"arguments": {"k": "' + b"v" * (11 * 1024 * 1024) + b'"}}'
    assert call(broker, "PUT", f"/api/queues/%2F/{q(uid)}", raw=too_big).status == 413
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}").status == 404


@pytest.mark.parametrize("method, path", [("POST", "/api/definitions"), ("POST", "/api/definitions/%2F"),
                                          ("PUT", "/api/queues/%2F/nested"), ("PUT", "/api/policies/%2F/nested"),
                                          ("POST", "/api/exchanges/%2F/amq.default/publish")])
def test_json_nested_without_end_is_a_bad_request(broker, method, path):
    """JSON nested 200,000 deep (a stack's worth for a recursive parser) is a 400 like any undecodable body."""
    for nested in (b"[" * 200_000, b'{"a":' * 200_000 + b"1" + b"}" * 200_000):
        assert_error(call(broker, method, path, raw=nested), 400)
    assert call(broker, "GET", "/api/overview").status == 200


@pytest.mark.warren_only("RabbitMQ takes JSON of any depth")
def test_json_nested_too_deep_to_write_back_is_refused(broker, uid):
    """A value nested 900 deep decodes, but kept it would fail every answer that lists it (the global parameters,
    the definitions export): refused, as is one level past 128; a body of 128 levels is kept and listed."""
    def nested(depth: int) -> str:
        return "[" * depth + "]" * depth

    for method, path, body in (
            ("PUT", f"/api/global-parameters/{q(uid)}", '{"value": %s}' % nested(900)),
            ("PUT", f"/api/queues/%2F/{q(uid)}", '{"arguments": {"x-deep": %s}}' % nested(900)),
            ("POST", "/api/definitions", '{"global_parameters": [{"name": "%s", "value": %s}]}' % (uid, nested(900))),
            ("PUT", f"/api/global-parameters/{q(uid)}", '{"value": %s}' % nested(128))):
        reply = call(broker, method, path, raw=body.encode())
        assert assert_error(reply, 400)["reason"] == "JSON nested deeper than 128"
    kept = '{"value": %s}' % nested(127)
    assert call(broker, "PUT", f"/api/global-parameters/{q(uid)}", raw=kept.encode()).status == 201
    try:
        assert call(broker, "GET", "/api/global-parameters").status == 200
        assert call(broker, "GET", "/api/definitions").status == 200
    finally:
        call(broker, "DELETE", f"/api/global-parameters/{q(uid)}")


# -- 5. another connection's exclusive queue is locked over HTTP too ----------------------------------

@pytest.mark.warren_only("peek, records and commit are Warren's endpoints")
def test_exclusive_queue_is_locked_over_http(conn, broker, uid):
    ch = conn.channel()
    ch.queue_declare(uid, exclusive=True)
    ch.basic_publish("", uid, b"private")
    base = f"/api/queues/%2F/{q(uid)}"
    for method, path, body in (("GET", f"{base}/peek", None), ("GET", f"{base}/records", None),
                               ("GET", f"{base}/offsets", None), ("POST", f"{base}/commit", {"offset": 1}),
                               ("POST", f"{base}/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                        "encoding": "auto"}),
                               ("DELETE", f"{base}/contents", None)):
        reply = call(broker, method, path, body)
        assert reply.status == 400, (path, reply.status, reply.raw[:200])
        # RabbitMQ's words: get names the reply code, the others give the detail alone
        prefix = "405 RESOURCE_LOCKED - " if path.endswith("/get") else ""
        assert reply.json["reason"].startswith(f"{prefix}cannot obtain exclusive access"), reply.json
    assert ch.queue_declare(uid, passive=True).method.message_count == 1


# -- 6. content headers: malformed ones refused as RabbitMQ does, odd ones stored and read safely -------

def header(flags: int, props: bytes, size: int = 1) -> bytes:
    return struct.pack(">HHQH", 60, 0, size, flags) + props


MALFORMED = {
    "table claims 4 GB": header(0x2000, struct.pack(">I", 0xFFFFFFF0) + b"\x01aSxx"),
    "truncated content_type": header(0x8000, b"\x09ab"),
    "flag continuation": header(0x8001, b"\x02ab\x00\x00"),
    "unknown field type": header(0x2000, struct.pack(">I", 4) + b"\x01aZ\x00"),
    "bytes after the last property": header(0x1000, b"\x02\x00\x00"),
    "no property flags": struct.pack(">HHQ", 60, 0, 1),  # (analyze_frame reads it: 12 octets)
    "half the property flags": struct.pack(">HHQ", 60, 0, 1) + b"\x00",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_content_header_closes_the_connection_as_rabbitmq(broker, uid, name):
    with connect(broker) as connection:
        ch = connection.channel()
        ch.queue_declare(uid, durable=True)
        ch.basic_publish("", uid, b"kept", pika.BasicProperties(delivery_mode=2))
    raw = Raw(broker)
    raw.handshake()
    raw.open_channel(1)
    raw.send_method(1, commands.Basic.Publish(exchange="", routing_key=uid))
    raw.send(raw_frame(2, 1, MALFORMED[name]) + raw_frame(3, 1, b"x"))
    close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (541, "INTERNAL_ERROR", 0, 0)
    raw.close()
    with connect(broker) as connection:
        ch = connection.channel()
        assert ch.queue_declare(uid, passive=True).method.message_count == 1
        ch.queue_delete(uid)


@pytest.mark.warren_only("RabbitMQ 3.10 accepts any depth")
def test_tables_nested_deeper_than_100_are_refused(broker):
    inner = b""
    for _ in range(10_000):
        inner = b"\x01a" + b"F" + struct.pack(">I", len(inner)) + inner
    raw = Raw(broker)
    raw.handshake()
    raw.open_channel(1)
    raw.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    raw.send(raw_frame(2, 1, header(0x2000, struct.pack(">I", len(inner)) + inner)) + raw_frame(3, 1, b"x"))
    assert raw.expect_connection_close().reply_code == 541


@pytest.mark.warren_only("peek and records are Warren's endpoints")
def test_odd_properties_are_stored_and_read_safely(conn, broker, uid):
    """Invalid UTF-8 (which RabbitMQ accepts) and a timestamp beyond any calendar: every reader copes."""
    ch = conn.channel()
    ch.queue_declare(uid, durable=True)
    raw = Raw(broker)
    raw.handshake()
    raw.open_channel(1)
    odd = header(0x8000 | 0x2000 | 0x0040, b"\x02\xff\xfe" + struct.pack(">I", 9) + b"\x01aS"
                 + struct.pack(">I", 2) + b"\xff\xfe" + struct.pack(">Q", 2 ** 62))
    raw.send_method(1, commands.Basic.Publish(exchange="", routing_key=uid))
    raw.send(raw_frame(2, 1, odd) + raw_frame(3, 1, b"z"))
    raw.send_method(1, commands.Basic.Qos())
    raw.expect(commands.Basic.QosOk)
    raw.close()
    base = f"/api/queues/%2F/{q(uid)}"
    peek = call(broker, "GET", f"{base}/peek")
    assert peek.status == 200 and peek.json[0]["properties"]["timestamp"] == 2 ** 62
    records = call(broker, "GET", f"{base}/records")
    assert records.status == 200
    table = pa.ipc.open_stream(records.raw).read_all()
    assert table.column("timestamp").to_pylist() == [None] and table.column("body").to_pylist() == [b"z"]
    got = call(broker, "POST", f"{base}/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert got.status == 200 and got.json[0]["payload"] == "z"
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_delete(uid)


# -- 7. credentials: UTF-8, and never echoed -----------------------------------------------------------

@pytest.mark.warren_only("reads the node's log")
def test_utf8_password_and_no_password_in_replies_or_logs(broker, uid):
    name, password = make_user(broker, f"{uid}-u", ".*", ".*", ".*", password="密码123")
    with connect(broker, name, password) as connection:
        assert connection.channel().is_open
    wrong = f"Wrong-{uid}-密码"
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused_login:
        connect(broker, name, wrong)
    assert wrong not in str(refused_login.value)
    time.sleep(0.2)
    assert wrong not in broker.log() and "密码123" not in broker.log()


def test_empty_password_never_logs_in(broker, uid):
    assert broker.admin("add-user", f"{uid}-u", "").returncode == 0
    assert broker.admin("set-permissions", "/", f"{uid}-u", ".*", ".*", ".*").returncode == 0
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(broker, f"{uid}-u", "")


# -- 8. the rest of the HTTP surface -------------------------------------------------------------------

@pytest.mark.warren_only("Warren's UI headers")
def test_ui_is_served_with_security_headers(broker):
    for path in ("/", "/api/overview"):
        reply = call(broker, "GET", path)
        assert reply.status == 200
        assert "frame-ancestors 'none'" in reply.headers["Content-Security-Policy"]
        assert reply.headers["X-Frame-Options"] == "DENY"


def test_names_longer_than_255_bytes_are_refused_over_http(broker, uid):
    reply = call(broker, "PUT", f"/api/queues/%2F/{'q' * 300}", {})
    assert (reply.status, reply.json) == (400, {"error": "bad_request",
                                                "reason": "queue should be less than 255 bytes, actually was 300\n"})


@pytest.mark.warren_only("restarts a node")
def test_long_multibyte_names_survive_a_restart(start_broker):
    node = start_broker()
    vhost = "v" + "é" * 127  # 255 bytes, 765 once escaped in a key
    name = "q" + "é" * 127
    assert call(node, "PUT", f"/api/vhosts/{q(vhost)}", {}).status == 201
    assert call(node, "PUT", f"/api/permissions/{q(vhost)}/guest",
                {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    assert call(node, "PUT", f"/api/queues/{q(vhost)}/{q(name)}", {"durable": True}).status == 201
    node.stop()
    node.start()
    assert call(node, "GET", f"/api/queues/{q(vhost)}/{q(name)}").json["name"] == name


@pytest.mark.warren_only("Warren's option")
def test_metrics_can_require_a_monitoring_login(start_broker, uid):
    node = start_broker("--metrics-auth", "true")
    assert call(node, "GET", "/metrics", auth=None).status == 401
    assert call(node, "GET", "/metrics").status == 200
    make_user(node, f"{uid}-u", ".*", ".*", ".*", tags="management")
    assert call(node, "GET", "/metrics", auth=(f"{uid}-u", "pw")).status == 401


@pytest.mark.warren_only("Warren's HTTP timeouts")
def test_half_sent_http_request_is_closed(start_broker):
    node = start_broker("--mgmt-idle-timeout", "1")
    with socket.create_connection(("127.0.0.1", node.mgmt_port), timeout=5) as sock:
        sock.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\n")  # never finished
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < 4


# -- standing robustness: fuzzed frames, the node keeps serving and loses nothing -----------------------

@pytest.fixture(scope="module")
def witness(broker):
    """A durable queue with 3 messages whose count no fuzzed input may change."""
    name = f"fuzz-witness-{time.time_ns()}"
    with connect(broker) as connection:
        ch = connection.channel()
        ch.queue_declare(name, durable=True)
        for _ in range(3):
            ch.basic_publish("", name, b"w", pika.BasicProperties(delivery_mode=2))
    yield name
    with connect(broker) as connection:
        connection.channel().queue_delete(name)


def _still_serving(broker, witness: str) -> None:
    with connect(broker) as connection:
        assert connection.channel().queue_declare(witness, passive=True).method.message_count == 3


def _drain(raw: Raw) -> None:
    raw.sock.settimeout(0.2)
    try:
        while True:
            raw.read_frame()
    except (Closed, OSError, socket.timeout):
        pass
    raw.close()


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(class_id=st.sampled_from([10, 20, 40, 50, 60, 85, 90, 7]), method_id=st.integers(0, 130),
       payload=st.binary(max_size=64))
def test_fuzzed_method_frames(broker, witness, class_id, method_id, payload):
    raw = Raw(broker, timeout=3)
    raw.handshake()
    raw.open_channel(1)
    raw.send(raw_frame(1, 1, struct.pack(">HH", class_id, method_id) + payload))
    _drain(raw)
    _still_serving(broker, witness)


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(flags=st.integers(0, 0xFFFF), props=st.binary(max_size=80), body=st.binary(max_size=16))
def test_fuzzed_content_headers(broker, witness, flags, props, body):
    raw = Raw(broker, timeout=3)
    raw.handshake()
    raw.open_channel(1)
    raw.send_method(1, commands.Basic.Publish(exchange="amq.fanout", routing_key=""))
    raw.send(raw_frame(2, 1, struct.pack(">HHQH", 60, 0, len(body), flags) + props))
    if body:
        raw.send(raw_frame(3, 1, body))
    raw.send_method(1, commands.Basic.Qos())
    _drain(raw)
    _still_serving(broker, witness)


# -- the permission matrix: every operation x each permission it needs ---------------------------------

OPERATIONS = {  # name -> (permission kind needed on the resource named X, action(channel, X))
    "exchange.declare": ("configure", lambda ch, x: ch.exchange_declare(x, "fanout")),
    "exchange.delete": ("configure", lambda ch, x: ch.exchange_delete(x)),
    "queue.declare": ("configure", lambda ch, x: ch.queue_declare(x)),
    "queue.delete": ("configure", lambda ch, x: ch.queue_delete(x)),
    "queue.purge": ("read", lambda ch, x: ch.queue_purge(x)),
    "basic.get": ("read", lambda ch, x: ch.basic_get(x)),
    "basic.consume": ("read", lambda ch, x: ch.basic_consume(x, lambda *a: None)),
    "queue.bind (queue)": ("write", lambda ch, x: ch.queue_bind(x, "amq.fanout")),
    "queue.bind (exchange)": ("read", lambda ch, x: ch.queue_bind(f"{x}-q", x)),
    "queue.unbind (queue)": ("write", lambda ch, x: ch.queue_unbind(x, "amq.fanout")),
    "queue.unbind (exchange)": ("read", lambda ch, x: ch.queue_unbind(f"{x}-q", x)),
    "exchange.bind (destination)": ("write", lambda ch, x: ch.exchange_bind(x, "amq.fanout")),
    "exchange.bind (source)": ("read", lambda ch, x: ch.exchange_bind("amq.fanout", x)),
    "exchange.unbind (destination)": ("write", lambda ch, x: ch.exchange_unbind(x, "amq.fanout")),
    "basic.publish": ("write", lambda ch, x: (ch.confirm_delivery(), ch.basic_publish(x, "", b"p"))),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_permission_matrix(broker, uid, operation):
    """Allowed with the permission the operation needs, 403 without it (the other two granted)."""
    kind, action = OPERATIONS[operation]
    resource = f"{uid}-r"
    with connect(broker) as connection:  # what the operations act on
        ch = connection.channel()
        ch.exchange_declare(resource, "fanout")
        ch.queue_declare(resource)
        ch.queue_declare(f"{resource}-q")
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    denied = dict(grant, **{kind: f"^{uid}-never$"})
    user = make_user(broker, f"{uid}-denied", denied["configure"], denied["write"], denied["read"])
    with connect(broker, *user) as connection:
        error = refused(lambda: action(connection.channel(), resource))
        assert error.reply_code == 403 and f"refused for user '{user[0]}'" in error.reply_text
    allowed = make_user(broker, f"{uid}-allowed", ".*", ".*", ".*")
    with connect(broker, *allowed) as connection:
        action(connection.channel(), resource)
    with connect(broker) as connection:
        ch = connection.channel()
        ch.queue_delete(resource)
        ch.queue_delete(f"{resource}-q")
        ch.exchange_delete(resource)


HTTP_OPERATIONS = {  # path template, method, body, permission kind
    "PUT queue": ("PUT", "/api/queues/%2F/{x}", {}, "configure"),
    "DELETE queue": ("DELETE", "/api/queues/%2F/{x}", None, "configure"),
    "PUT exchange": ("PUT", "/api/exchanges/%2F/{x}", {"type": "fanout"}, "configure"),
    "DELETE exchange": ("DELETE", "/api/exchanges/%2F/{x}", None, "configure"),
    "purge": ("DELETE", "/api/queues/%2F/{x}/contents", None, "read"),
    "get": ("POST", "/api/queues/%2F/{x}/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"},
            "read"),
    "publish": ("POST", "/api/exchanges/%2F/{x}/publish", {"routing_key": "", "payload": "p",
                                                           "payload_encoding": "string", "properties": {}}, "write"),
    "bind (queue)": ("POST", "/api/bindings/%2F/e/amq.fanout/q/{x}", {"routing_key": "k"}, "write"),
    "bind (exchange)": ("POST", "/api/bindings/%2F/e/{x}/e/amq.fanout", {"routing_key": "k"}, "read"),
    "peek": ("GET", "/api/queues/%2F/{x}/peek", None, "read"),
    "offsets": ("GET", "/api/queues/%2F/{x}/offsets", None, "read"),
    "records": ("GET", "/api/queues/%2F/{x}/records", None, "read"),
    "commit": ("POST", "/api/queues/%2F/{x}/commit", {"offset": 0}, "read"),
    "move": ("POST", "/api/queues/%2F/{x}/move", {"destination": "{x}-q"}, "read"),
}


@pytest.mark.warren_only("creates users with management tags through warren-admin")
@pytest.mark.parametrize("operation", sorted(HTTP_OPERATIONS))
def test_http_permission_matrix(broker, uid, operation):
    method, template, body, kind = HTTP_OPERATIONS[operation]
    resource = f"{uid}-r"
    with connect(broker) as connection:
        ch = connection.channel()
        ch.exchange_declare(resource, "fanout")
        ch.queue_declare(resource)
        ch.queue_declare(f"{resource}-q")
    path = template.format(x=urllib.parse.quote(resource, safe=""))
    if body is not None and "destination" in body:
        body = {"destination": f"{resource}-q"}
    denied = {"configure": ".*", "write": ".*", "read": ".*", kind: f"^{uid}-never$"}
    user = make_user(broker, f"{uid}-denied", denied["configure"], denied["write"], denied["read"])
    # RabbitMQ's publish answers a refusal 400 "403 ACCESS_REFUSED - …", as any refusal of its publish
    assert_error(call(broker, method, path, body, auth=user), 400 if operation == "publish" else 401)
    allowed = make_user(broker, f"{uid}-allowed", ".*", ".*", ".*")
    assert call(broker, method, path, body, auth=allowed).status < 300
    with connect(broker) as connection:
        ch = connection.channel()
        ch.queue_delete(resource)
        ch.queue_delete(f"{resource}-q")
        ch.exchange_delete(resource)


# -- patterns that backtrack ------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_pattern_that_backtracks_does_not_hold_the_broker(broker, conn, uid):
    """``^(a|a)*$`` against 40 a's and a b backtracks 2^40 times: as a permission, a topic permission, a policy
    pattern or a listing filter, each search gives up after a few milliseconds (no match), as RabbitMQ's PCRE
    gives up at its match limit, and other clients are answered meanwhile."""
    slow, name = "^(a|a)*$", "a" * 40 + "b"
    user = f"bt-{uid}"
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "management"}).status == 201
    try:
        assert call(broker, "PUT", f"/api/permissions/%2F/{q(user)}",
                    {"configure": slow, "write": ".*", "read": ".*"}).status == 201
        assert call(broker, "PUT", f"/api/topic-permissions/%2F/{q(user)}",
                    {"exchange": "amq.topic", "write": slow, "read": ".*"}).status == 201
        assert call(broker, "PUT", f"/api/policies/%2F/bt-{q(uid)}",
                    {"pattern": slow, "definition": {"max-length": 1}, "apply-to": "queues"}).status == 201
        started = time.monotonic()
        conn.channel().queue_declare(name, auto_delete=True)  # the policy's pattern is searched in its name
        user_connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.port, credentials=pika.PlainCredentials(user, "pw")))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            user_connection.channel().queue_declare(name + "2")
        assert refused.value.reply_code == 403
        channel = user_connection.channel()
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_publish("amq.topic", name, b"x")
        assert refused.value.reply_code == 403
        user_connection.close()
        listed = call(broker, "GET", f"/api/queues/%2F?page=1&name={urllib.parse.quote(slow)}&use_regex=true")
        assert listed.status == 200 and listed.json["items"] == []  # (a name filters a page only, as RabbitMQ)
        assert call(broker, "GET", f"/api/queues/%2F/{q(name)}").json["policy"] is None
        assert time.monotonic() - started < 10
    finally:
        call(broker, "DELETE", f"/api/policies/%2F/bt-{q(uid)}")
        call(broker, "DELETE", f"/api/users/{q(user)}")
