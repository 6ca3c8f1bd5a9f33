"""Where clients and tools depend on RabbitMQ's exact answers (issue: compatibility).

Each test passes against RabbitMQ 3.10 too (parity mode, see conftest), except those marked warren_only.
"""
from __future__ import annotations

import asyncio
import socket
import struct
import time

import aio_pika
import pika
import pytest
from aio_pika.patterns import RPC
from pamqp import body as pbody, commands, frame as pframe, header as pheader

from conftest import connect
from support import Raw, beneath, call, method_payload, q, raw_frame

pytestmark = pytest.mark.timeout(60)


# -- connection.close: the client closes the socket ------------------------------------------------

def test_close_ok_then_the_client_closes_the_socket(broker, uid):
    """Publishes pipelined after connection.close are read and dropped; after close-ok the broker waits for
    the client to close (closing with unread data would reset the client's connection)."""
    raw = Raw(broker)
    raw.handshake()
    raw.open_channel(1)
    frames = [raw_publish(uid) for _ in range(2000)]
    close = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    raw.send(frame(0, close) + b"".join(frames))
    raw.expect(commands.Connection.CloseOk)
    raw.sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        raw.sock.recv(1)  # still open: the broker leaves closing to us
    raw.close()


def frame(channel: int, value) -> bytes:
    return pframe.marshal(value, channel)


def raw_publish(queue: str) -> bytes:
    """basic.publish + header + 1 KB body on channel 1, as raw frames."""
    return (frame(1, commands.Basic.Publish(exchange="", routing_key=queue))
            + frame(1, pheader.ContentHeader(0, 1024, commands.Basic.Properties()))
            + frame(1, pbody.ContentBody(b"x" * 1024)))


# -- queue.delete-ok before basic.cancel ---------------------------------------------------------------

def test_delete_ok_comes_before_the_cancel_of_the_deleting_channels_consumer(broker, uid):
    """kombu's own suite deletes a queue it still consumes with py-amqp, which raises ConsumerCancelled if the
    server's basic.cancel arrives while it waits for queue.delete-ok; RabbitMQ sends delete-ok first."""
    raw = Raw(broker)
    raw.handshake(capabilities={"consumer_cancel_notify": True})
    raw.open_channel(1)
    raw.send(frame(1, commands.Queue.Declare(queue=uid)))
    raw.expect(commands.Queue.DeclareOk)
    raw.send(frame(1, commands.Basic.Consume(queue=uid, consumer_tag="c")))
    raw.expect(commands.Basic.ConsumeOk)
    raw.send(frame(1, commands.Queue.Delete(queue=uid)))
    raw.expect(commands.Queue.DeleteOk)
    raw.expect(commands.Basic.Cancel)
    raw.close()


# -- unbind of what is gone --------------------------------------------------------------------------

def test_unbind_of_missing_queue_or_exchange_is_ok(conn, uid):
    ch = conn.channel()
    ch.queue_unbind(f"{uid}-no-queue", "amq.direct", "k")
    ch.queue_unbind(f"{uid}-no-queue", f"{uid}-no-exchange", "k")
    ch.queue_declare(uid, exclusive=True)
    ch.queue_unbind(uid, f"{uid}-no-exchange", "k")
    ch.exchange_unbind(f"{uid}-no-dest", f"{uid}-no-source", "k")
    ch.exchange_unbind(f"{uid}-no-dest", "amq.fanout", "k")
    assert ch.is_open
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_bind(f"{uid}-no-queue", "amq.direct", "k")  # bind still needs both ends
    assert closed.value.reply_code == 404


def test_aio_pika_rpc_closes_after_its_queue_went(broker, uid):
    """aio-pika's RPC pattern unbinds its auto-delete result queue on close: unbind-ok, as RabbitMQ."""
    async def main() -> int:
        connection = await aio_pika.connect(broker.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            rpc = await RPC.create(channel)

            async def square(*, x: int) -> int:
                return x * x

            await rpc.register(uid, square, auto_delete=True)
            result = await asyncio.wait_for(rpc.proxy.__getattr__(uid)(x=7), 10)
            await asyncio.wait_for(rpc.close(), 10)
            return result

    assert asyncio.run(main()) == 49


# -- channel numbers ---------------------------------------------------------------------------------

def test_any_channel_number_up_to_65535(broker):
    raw = Raw(broker)
    raw.handshake()
    for number in (65535, 2048, 4000):
        raw.send_method(number, commands.Channel.Open())
        channel, reply = raw.read_frame()
        assert (channel, type(reply)) == (number, commands.Channel.OpenOk)
    raw.close()


def test_open_channels_are_limited_by_channel_max(broker):
    raw = Raw(broker)
    raw.send(b"AMQP\x00\x00\x09\x01")
    raw.expect(commands.Connection.Start)
    raw.send_method(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                   response="\x00guest\x00guest", locale="en_US"))
    tune = raw.expect(commands.Connection.Tune)
    raw.send_method(0, commands.Connection.TuneOk(channel_max=2, frame_max=tune.frame_max, heartbeat=0))
    raw.send_method(0, commands.Connection.Open(virtual_host="/"))
    raw.expect(commands.Connection.OpenOk)
    for number in (10, 20):
        raw.send_method(number, commands.Channel.Open())
        raw.expect(commands.Channel.OpenOk)
    raw.send_method(30, commands.Channel.Open())
    close = raw.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == ("NOT_ALLOWED - number of channels opened (2) has reached the negotiated "
                                "channel_max (2)")


# -- properties are opaque ---------------------------------------------------------------------------

def test_far_future_timestamp_is_kept_as_sent(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, exclusive=True)
    ch.basic_publish("", uid, b"x", pika.BasicProperties(timestamp=2 ** 62, reply_to="r", user_id="guest"))
    _, props, body = ch.basic_get(uid, auto_ack=True)
    assert (props.timestamp, props.reply_to, body) == (2 ** 62, "r", b"x")


def test_dead_lettering_keeps_a_millisecond_timestamp(conn, uid):
    """pamqp would read a timestamp over 2^32 as milliseconds and divide it; the bytes must pass unchanged."""
    ch = conn.channel()
    ch.queue_declare(f"{uid}-dl", exclusive=True)
    ch.queue_declare(f"{uid}-src", exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{uid}-dl"})
    ch.basic_publish("", f"{uid}-src", b"y", pika.BasicProperties(timestamp=1732400000000, expiration="60000",
                                                                  headers={"n": 5}))
    method, _, _ = ch.basic_get(f"{uid}-src")
    ch.basic_reject(method.delivery_tag, requeue=False)
    deadline = time.monotonic() + 5
    while True:
        _, props, body = ch.basic_get(f"{uid}-dl", auto_ack=True)
        if body is not None or time.monotonic() > deadline:
            break
    assert body == b"y"
    assert props.timestamp == 1732400000000
    assert props.expiration is None
    assert props.headers["n"] == 5 and props.headers["x-death"][0]["original-expiration"] == "60000"


# -- channel.flow -------------------------------------------------------------------------------------

def test_channel_flow_active_false_is_not_implemented(broker):
    raw = Raw(broker)
    raw.handshake()
    raw.open_channel(1)
    raw.send_method(1, commands.Channel.Flow(active=True))
    assert raw.expect(commands.Channel.FlowOk).active is True
    raw.send_method(1, commands.Channel.Flow(active=False))
    close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        540, "NOT_IMPLEMENTED - active=false", 20, 20)


# -- management API ----------------------------------------------------------------------------------

def _mgmt(broker) -> None:
    if not broker.mgmt_port:
        pytest.skip("needs WARREN_TEST_BROKER_MGMT (parity mode)")


def test_trailing_slash_paths(broker, conn, uid):
    _mgmt(broker)
    conn.channel().queue_declare(uid, exclusive=True)
    for path in ("/api/connections/", "/api/queues/", "/api/queues/%2F/", "/api/overview/", "/api/exchanges/"):
        reply = call(broker, "GET", path)
        assert reply.status == 200, (path, reply.status)
    assert uid in [item["name"] for item in call(broker, "GET", "/api/queues/%2F/").json]


def test_health_checks(broker):
    _mgmt(broker)
    ok = {"status": "ok"}
    assert call(broker, "GET", "/api/healthchecks/node").json == ok
    assert call(broker, "GET", "/api/health/checks/alarms").json == ok
    assert call(broker, "GET", "/api/health/checks/local-alarms").json == ok
    assert call(broker, "GET", "/api/health/checks/virtual-hosts").json == ok
    assert call(broker, "GET", "/api/health/checks/certificate-expiration/1/months").json == ok
    bad_unit = call(broker, "GET", "/api/health/checks/certificate-expiration/1/fortnights")
    assert (bad_unit.status, bad_unit.json) == (400, {
        "error": "bad_request", "reason": "Time unit not recognised. Supported units: days, weeks, months, years."})
    assert call(broker, "GET", f"/api/health/checks/port-listener/{broker.port}").json == {
        "status": "ok", "port": broker.port}
    missing = call(broker, "GET", "/api/health/checks/port-listener/1")
    assert missing.status == 503
    assert missing.json["status"] == "failed" and missing.json["reason"] == "No active listener"
    assert missing.json["missing"] == 1 and broker.port in missing.json["ports"]
    assert call(broker, "GET", "/api/health/checks/port-listener/abc").json == {
        "error": "bad_request", "reason": "Invalid port"}
    for name in ("amqp", "amqp091"):
        assert call(broker, "GET", f"/api/health/checks/protocol-listener/{name}").json == {
            "status": "ok", "protocol": "amqp"}
    mqtt = call(broker, "GET", "/api/health/checks/protocol-listener/mqtt")
    assert mqtt.status == 503 and mqtt.json["missing"] == "mqtt" and "amqp" in mqtt.json["protocols"]
    critical = call(broker, "GET", "/api/health/checks/node-is-quorum-critical")
    assert critical.status == 200 and critical.json["status"] == "ok"


def test_http_purge(broker, conn, uid):
    """DELETE .../contents empties the queue (across nodes: tests/cluster/test_cluster.py)."""
    _mgmt(broker)
    ch = conn.channel()
    ch.queue_declare(uid)
    for _ in range(3):
        ch.basic_publish("", uid, b"x")
    assert call(broker, "DELETE", f"/api/queues/%2F/{q(uid)}/contents").status == 204
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_delete(uid)


def test_closed_connection_is_gone_from_the_api(broker, uid):
    _mgmt(broker)
    connection = connect(broker, name=uid)
    connection.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        names = [c.get("client_properties", {}).get("connection_name") for c in
                 call(broker, "GET", "/api/connections/").json]
        if uid not in names:
            break
        time.sleep(0.2)
    assert uid not in names


# -- argument types: refusals name the wire type the client sent ------------------------------------

def _sstr(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


def _table(name: str, kind: str, value: bytes) -> bytes:
    entry = _sstr(name) + kind.encode() + value
    return struct.pack(">I", len(entry)) + entry


FIELDS = {"b": (struct.pack(">b", 1), "byte"), "B": (struct.pack(">B", 1), "unsignedbyte"),
          "s": (struct.pack(">h", 1), "short"), "u": (struct.pack(">H", 1), "unsignedshort"),
          "I": (struct.pack(">i", 1), "signedint"), "i": (struct.pack(">I", 1), "unsignedint"),
          "l": (struct.pack(">q", 1), "long"), "f": (struct.pack(">f", 1.5), "float"),
          "d": (struct.pack(">d", 1.5), "double"), "V": (b"", "void"), "x": (b"\x00\x00\x00\x01a", "binary"),
          "T": (struct.pack(">Q", 5), "timestamp"), "A": (b"\x00\x00\x00\x00", "array")}


def _refusal(broker, class_id: int, method_id: int, args: bytes, setup: bytes = b"") -> str:
    client = Raw(broker)
    try:
        client.handshake()
        client.open_channel(1)
        if setup:
            client.send(raw_frame(1, 1, setup))
            client.read_frame()
        client.send(raw_frame(1, 1, method_payload(class_id, method_id, args)))
        _, reply = client.read_frame()
        return f"{reply.reply_code} {reply.reply_text}" if isinstance(reply, commands.Channel.Close) else "ok"
    finally:
        client.close()


@pytest.mark.parametrize("kind", sorted(FIELDS))
def test_argument_refusals_name_the_wire_type(broker, uid, kind):
    """aio-pika (pamqp) sends a small integer as a byte, pika as a signedint: RabbitMQ's refusal names which,
    and a void argument is there (refused), not absent."""
    value, name = FIELDS[kind]
    q_name = f"{uid}-{kind}"

    def declare(arg: str) -> str:
        return _refusal(broker, 50, 10, struct.pack(">H", 0) + _sstr(q_name) + b"\x00" + _table(arg, kind, value))

    where = f"for queue '{q_name}' in vhost '/'"
    assert declare("x-overflow") == f"406 PRECONDITION_FAILED - invalid arg 'x-overflow' {where}: " \
                                    f"{{unacceptable_type,{name}}}"
    assert declare("x-dead-letter-exchange") == (f"406 PRECONDITION_FAILED - invalid type '{name}' for arg "
                                                 f"'x-dead-letter-exchange' in queue '{q_name}' in vhost '/'")
    integer = declare("x-max-length")
    if name in ("byte", "unsignedbyte", "short", "unsignedshort", "signedint", "unsignedint", "long"):
        assert integer == "ok"
        conn = connect(broker)
        conn.channel().queue_delete(q_name)
        conn.close()
    else:
        assert integer == f"406 PRECONDITION_FAILED - invalid arg 'x-max-length' {where}: " \
                          f"\"expected integer, got {name}\""
    exchange = _refusal(broker, 40, 10, struct.pack(">H", 0) + _sstr(f"{uid}-x{kind}") + _sstr("direct") + b"\x00"
                        + _table("alternate-exchange", kind, value))
    assert exchange == (f"406 PRECONDITION_FAILED - invalid type '{name}' for arg 'alternate-exchange' in "
                        f"exchange '{uid}-x{kind}' in vhost '/'")


@pytest.mark.parametrize("kind", ["b", "V", "x"])
def test_consumer_argument_types(broker, uid, kind):
    value, name = FIELDS[kind]
    q_name = f"{uid}-{kind}"
    declare = method_payload(50, 10, struct.pack(">H", 0) + _sstr(q_name) + b"\x00" + struct.pack(">I", 0))

    def consume(arg: str) -> str:
        return _refusal(broker, 60, 20, struct.pack(">H", 0) + _sstr(q_name) + _sstr("") + b"\x00"
                        + _table(arg, kind, value), setup=declare)

    where = f"for queue '{q_name}' in vhost '/'"
    assert consume("x-cancel-on-ha-failover") == (f"406 PRECONDITION_FAILED - invalid arg 'x-cancel-on-ha-failover' "
                                                  f"{where}: {{unacceptable_type,{name}}}")
    assert consume("x-priority") == ("ok" if kind == "b" else
                                     f"406 PRECONDITION_FAILED - invalid arg 'x-priority' {where}: "
                                     f"\"expected integer, got {name}\"")
    conn = connect(broker)
    conn.channel().queue_delete(q_name)
    conn.close()


@pytest.mark.parametrize("queue_type, refused", [("classic", ["x-stream-offset"]),
                                                  ("quorum", ["x-stream-offset", "x-cancel-on-ha-failover"]),
                                                  ("stream", ["x-priority", "x-cancel-on-ha-failover"])])
def test_consumer_arguments_a_queue_type_does_not_take(broker, uid, queue_type, refused):
    values = {"x-stream-offset": "first", "x-cancel-on-ha-failover": True, "x-priority": 3, "x-credit":
              {"credit": 5, "drain": False}}
    conn = connect(broker)
    try:
        ch = conn.channel()
        ch.queue_declare(uid, durable=True, arguments={"x-queue-type": queue_type})
        for arg, value in values.items():
            ch = conn.channel()
            ch.basic_qos(prefetch_count=10)
            if arg in refused:
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
                    ch.basic_consume(uid, lambda *a: None, arguments={arg: value})
                assert (caught.value.reply_code, caught.value.reply_text) == (
                    406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{uid}' in vhost '/' of queue type "
                         f"rabbit_{queue_type}_queue")
            else:
                ch.basic_cancel(ch.basic_consume(uid, lambda *a: None, arguments={arg: value}))
                ch.close()
    finally:
        conn.channel().queue_delete(uid)
        conn.close()


@pytest.mark.parametrize("value", ["soon", [1], None])
def test_consumer_timeout_argument_of_any_type(conn, uid, value):
    """RabbitMQ 3.10 takes x-consumer-timeout whatever it is (Warren: a whole number of ms applies)."""
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-consumer-timeout": value})
    ch.queue_delete(uid)


# -- the HTTP API's refusals, in RabbitMQ's words ---------------------------------------------------

def _reason(response, status: int, error: str = "bad_request"):
    assert response.status == status, (response.status, response.raw)
    assert response.json["error"] == error, response.json
    return response.json["reason"]


def test_http_declare_refusals_drop_the_reply_name(broker, uid):
    _mgmt(broker)
    path = f"/api/queues/%2F/{q(uid)}"
    assert call(broker, "PUT", path, {"arguments": {"x-max-length": 5}}).status == 201
    assert _reason(call(broker, "PUT", path, {"arguments": {"x-max-length": 6}}), 400) == (
        f"inequivalent arg 'x-max-length' for queue '{uid}' in vhost '/': received '6' but current is '5'")
    assert _reason(call(broker, "PUT", path, {}), 400) == (  # a JSON integer is a long
        f"inequivalent arg 'x-max-length' for queue '{uid}' in vhost '/': received none but current is the value "
        "'5' of type 'long'")
    assert _reason(call(broker, "PUT", f"/api/queues/%2F/{q(uid)}-o", {"arguments": {"x-overflow": 5}}), 400) == (
        f"invalid arg 'x-overflow' for queue '{uid}-o' in vhost '/': {{unacceptable_type,long}}")
    for table in ({"x-foo": None}, {"x-foo": {"a": None}}):
        assert _reason(call(broker, "PUT", f"/api/queues/%2F/{q(uid)}-n", {"arguments": table}), 400) == \
            "null_not_allowed"
    assert _reason(call(broker, "PUT", f"/api/queues/%2F/amq.{q(uid)}", {}), 401, "not_authorised") == \
        "Access refused."
    # (RabbitMQ says "invalid exchange type" instead for a name its Erlang VM has an atom for, such as "undefined")
    assert _reason(call(broker, "PUT", f"/api/exchanges/%2F/{q(uid)}-x", {"type": f"{uid}-type"}), 400) == \
        f"unknown exchange type '{uid}-type'"
    assert _reason(call(broker, "PUT", f"/api/queues/no-{q(uid)}/q", {}), 404, "not_found") == "vhost_not_found"
    assert _reason(call(broker, "PUT", f"/api/exchanges/no-{q(uid)}/x", {}), 404, "not_found") == "vhost_not_found"
    assert _reason(call(broker, "POST", f"/api/bindings/%2F/e/{q(uid)}-none/q/{q(uid)}", {}), 404, "not_found") == \
        f"no exchange '{uid}-none' in vhost '/'"
    assert _reason(call(broker, "POST", f"/api/bindings/%2F/e/amq.direct/q/{q(uid)}-none", {}), 404, "not_found") \
        == f"no queue '{uid}-none' in vhost '/'"
    call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
         {"routing_key": uid, "payload": "x", "payload_encoding": "string", "properties": {}})
    assert _reason(call(broker, "DELETE", f"{path}?if-empty=true"), 400) == f"queue '{uid}' in vhost '/' not empty"
    assert call(broker, "DELETE", path).status == 204


def test_http_body_refusals(broker, uid):
    _mgmt(broker)
    path = f"/api/queues/%2F/{q(uid)}"
    assert _reason(call(broker, "PUT", path, raw=b"not json"), 400) == "not_json"
    assert _reason(call(broker, "PUT", path, [1]), 400) == "not_json"
    assert _reason(call(broker, "PUT", path, {"durable": "yes"}), 400) == ["not_boolean", "yes"]
    assert _reason(call(broker, "PUT", f"/api/users/{q(uid)}", {}), 400) == "tags_not_present"
    assert _reason(call(broker, "PUT", f"/api/vhosts/{q(uid)}", {"tracing": "x"}), 400) == ["not_boolean", "x"]
    assert call(broker, "PUT", path, {}).status == 201
    get = f"{path}/get"
    assert _reason(call(broker, "POST", get, {"ackmode": "ack_requeue_true", "encoding": "auto"}), 400) == \
        "[{key_missing,count}]"
    assert _reason(call(broker, "POST", get, {"count": "x", "ackmode": "ack_requeue_true", "encoding": "auto"}),
                   400) == ["not_integer", "x"]
    assert _reason(call(broker, "POST", get, {"count": 1, "ackmode": "ack_requeue_true", "encoding": "x"}), 400) \
        == "Unsupported encoding. Please use auto or base64."
    assert _reason(call(broker, "POST", f"/api/queues/%2F/{q(uid)}-none/get",
                        {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}), 404, "not_found") == \
        f"NOT_FOUND - no queue '{uid}-none' in vhost '/'"
    publish = "/api/exchanges/%2F/amq.default/publish"
    assert _reason(call(broker, "POST", publish, {"payload": "x", "payload_encoding": "string", "properties": {}}),
                   400) == "[{key_missing,routing_key}]"
    assert _reason(call(broker, "POST", f"/api/exchanges/%2F/{q(uid)}-none/publish",
                        {"routing_key": "a", "payload": "x", "payload_encoding": "string", "properties": {}}), 400) \
        == f"404 NOT_FOUND - no exchange '{uid}-none' in vhost '/'"
    assert call(broker, "DELETE", path).status == 204


def test_http_refusals_for_a_user_without_permission(broker, uid):
    _mgmt(broker)
    user, password = uid, "pw"
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": password, "tags": "management"}).status == 201
    try:
        assert call(broker, "PUT", f"/api/permissions/%2F/{q(user)}",
                    {"configure": "^$", "write": "^$", "read": "^$"}).status == 201
        assert call(broker, "PUT", f"/api/queues/%2F/{q(uid)}", {}).status == 201
        auth = (user, password)
        for method, path, body in (("PUT", f"/api/queues/%2F/{q(uid)}-2", {}),
                                   ("DELETE", f"/api/queues/%2F/{q(uid)}", None),
                                   ("DELETE", f"/api/queues/%2F/{q(uid)}/contents", None),
                                   ("POST", f"/api/bindings/%2F/e/amq.direct/q/{q(uid)}", {"routing_key": "a"})):
            assert _reason(call(broker, method, path, body, auth=auth), 401, "not_authorised") == "Access refused."
        assert _reason(call(broker, "POST", f"/api/queues/%2F/{q(uid)}/get",
                            {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}, auth=auth),
                       401, "not_authorised") == \
            f"ACCESS_REFUSED - access to queue '{uid}' in vhost '/' refused for user '{user}'"
        assert _reason(call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                            {"routing_key": "a", "payload": "x", "payload_encoding": "string", "properties": {}},
                            auth=auth), 400) == \
            f"403 ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user '{user}'"
    finally:
        call(broker, "DELETE", f"/api/queues/%2F/{q(uid)}")
        call(broker, "DELETE", f"/api/users/{q(user)}")


# -- topic permissions (RabbitMQ's topic authorisation) -------------------------------------------------

def _user_with_topic_permissions(broker, user: str, exchange: str, write: str, read: str) -> tuple[str, str]:
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "management"}).status == 201
    assert call(broker, "PUT", f"/api/permissions/%2F/{q(user)}",
                {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    assert call(broker, "PUT", f"/api/topic-permissions/%2F/{q(user)}",
                {"exchange": exchange, "write": write, "read": read}).status == 201
    return user, "pw"


def _refused_topic(broker, user: str, action) -> str:
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, credentials=pika.PlainCredentials(user, "pw")))
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        action(channel)
    connection.close()
    assert refused.value.reply_code == 403
    return refused.value.reply_text


def _allowed_topic(broker, user: str, action) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, credentials=pika.PlainCredentials(user, "pw")))
    action(connection.channel())
    connection.close()


def test_topic_permissions_check_routing_keys_published_and_bound(broker, uid):
    """A write pattern for the keys published to a topic exchange, a read pattern for the keys bound with on it
    (queue and exchange bindings, unbinding too); ``{username}`` and ``{vhost}`` expand; other exchanges are
    not checked."""
    _mgmt(broker)
    exchange = f"{uid}.topic"
    user, _ = _user_with_topic_permissions(broker, uid, exchange, "^a\\.{username}\\.", "^r\\.{vhost}\\.")
    try:
        def declare(channel):
            channel.exchange_declare(exchange, "topic", auto_delete=True)
            channel.queue_declare(uid, exclusive=True)

        def publish(key):
            def action(channel):
                channel.confirm_delivery()
                declare(channel)
                channel.basic_publish(exchange, key, b"x")
            return action

        _allowed_topic(broker, user, publish(f"a.{uid}.x"))
        assert _refused_topic(broker, user, publish("b.x")) == \
            f"ACCESS_REFUSED - access to topic 'b.x' in exchange '{exchange}' in vhost '/' refused for user '{user}'"
        _allowed_topic(broker, user, lambda ch: (declare(ch), ch.queue_bind(uid, exchange, "r./.x"),
                                                 ch.queue_unbind(uid, exchange, "r./.x")))
        for action in (lambda ch: (declare(ch), ch.queue_bind(uid, exchange, "r.x")),
                       lambda ch: (declare(ch), ch.queue_unbind(uid, exchange, "r.x")),
                       lambda ch: (declare(ch), ch.exchange_declare(f"{uid}.f", "fanout", auto_delete=True),
                                   ch.exchange_bind(f"{uid}.f", exchange, "r.x"))):
            assert _refused_topic(broker, user, action) == (f"ACCESS_REFUSED - access to topic 'r.x' in exchange "
                                                           f"'{exchange}' in vhost '/' refused for user '{user}'")
        # another topic exchange, and the binding's destination side, are not restricted
        _allowed_topic(broker, user, lambda ch: (ch.confirm_delivery(), ch.basic_publish("amq.topic", "b.x", b"x")))
        _allowed_topic(broker, user, lambda ch: (declare(ch),
                                                 ch.exchange_declare(f"{uid}.f", "fanout", auto_delete=True),
                                                 ch.exchange_bind(exchange, f"{uid}.f", "r.x"),
                                                 ch.exchange_delete(f"{uid}.f")))
    finally:
        call(broker, "DELETE", f"/api/users/{q(user)}")


def test_topic_permissions_are_checked_for_every_publish_on_a_channel(broker, uid):
    """A channel that published an allowed key is still refused a key the pattern does not allow (the exchange's
    write permission is remembered per channel, the routing key is not); the HTTP API's publish is checked too."""
    _mgmt(broker)
    user, password = _user_with_topic_permissions(broker, uid, "amq.topic", "^ok\\.", ".*")
    try:
        def action(channel):
            channel.confirm_delivery()
            for _ in range(3):
                channel.basic_publish("amq.topic", "ok.1", b"x")
            channel.basic_publish("amq.topic", "no.1", b"x")
        assert _refused_topic(broker, user, action) == \
            f"ACCESS_REFUSED - access to topic 'no.1' in exchange 'amq.topic' in vhost '/' refused for user '{user}'"
        body = {"routing_key": "no.2", "payload": "x", "payload_encoding": "string", "properties": {}}
        assert _reason(call(broker, "POST", "/api/exchanges/%2F/amq.topic/publish", body, auth=(user, password)),
                       400) == (f"403 ACCESS_REFUSED - access to topic 'no.2' in exchange 'amq.topic' in vhost '/' "
                                f"refused for user '{user}'")
        body["routing_key"] = "ok.2"
        assert call(broker, "POST", "/api/exchanges/%2F/amq.topic/publish", body, auth=(user, password)).json == \
            {"routed": False}
    finally:
        call(broker, "DELETE", f"/api/users/{q(user)}")


def test_topic_permissions_http_api(broker, uid):
    _mgmt(broker)
    user = uid
    path = f"/api/topic-permissions/%2F/{q(user)}"
    assert call(broker, "PUT", path, {"exchange": "amq.topic", "write": ".*", "read": ".*"}).json["reason"] == \
        "vhost_or_user_not_found"
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": ""}).status == 201
    try:
        assert call(broker, "GET", path).status == 404
        assert _reason(call(broker, "PUT", path, {"write": ".*", "read": ".*"}), 400) == "[{key_missing,exchange}]"
        assert _reason(call(broker, "PUT", path, {"exchange": "amq.topic", "read": ".*"}), 400) == \
            "[{key_missing,write}]"
        assert call(broker, "PUT", path, {"exchange": "amq.topic", "write": "(", "read": ".*"}).status == 400
        assert call(broker, "PUT", path, {"exchange": "amq.topic", "write": "^w", "read": "^r"}).status == 201
        assert call(broker, "PUT", path, {"exchange": "amq.direct", "write": "x", "read": ""}).status == 204
        assert call(broker, "PUT", path, {"exchange": "amq.direct", "write": "y", "read": ""}).status == 204
        mine = [{"user": user, "vhost": "/", "exchange": "amq.direct", "write": "y", "read": ""},
                {"user": user, "vhost": "/", "exchange": "amq.topic", "write": "^w", "read": "^r"}]
        def by_exchange(listing):
            return sorted((p for p in listing if p["user"] == user), key=lambda p: p["exchange"])
        for listing in (path, f"/api/users/{q(user)}/topic-permissions", "/api/topic-permissions",
                        "/api/vhosts/%2F/topic-permissions"):
            assert by_exchange(call(broker, "GET", listing).json) == mine, listing
        assert by_exchange(call(broker, "GET", "/api/definitions").json["topic_permissions"]) == mine
        assert call(broker, "DELETE", path).status == 204  # all of them
        assert call(broker, "GET", path).status == 404
        assert call(broker, "DELETE", path).status == 404
        assert call(broker, "GET", f"/api/users/{q(user)}/topic-permissions").json == []
    finally:
        call(broker, "DELETE", f"/api/users/{q(user)}")


def test_topic_permissions_apply_to_open_channels(broker, uid):
    """Set while a channel publishes to the exchange, a topic permission applies to the channel's next publish
    with a new routing key; the last 12 keys it allowed on the channel stay allowed (RabbitMQ's per-channel
    cache)."""
    _mgmt(broker)
    user, password = _user_with_topic_permissions(broker, uid, "amq.direct", ".*", ".*")
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.port, credentials=pika.PlainCredentials(user, password)))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", "any.key", b"x")
        assert call(broker, "PUT", f"/api/topic-permissions/%2F/{q(user)}",
                    {"exchange": "amq.topic", "write": "^ok", "read": ".*"}).status == 204
        channel.basic_publish("amq.topic", "ok.key", b"x")
        channel.basic_publish("amq.topic", "any.key", b"x")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_publish("amq.topic", "other.key", b"x")
        assert refused.value.reply_code == 403
        connection.close()
    finally:
        call(broker, "DELETE", f"/api/users/{q(user)}")


def test_topic_permissions_follow_an_exchange_made_again_as_topic(broker, conn, uid):
    """A channel that published to a direct exchange is checked once the name is a topic exchange's."""
    _mgmt(broker)
    exchange = f"{uid}.x"
    user, password = _user_with_topic_permissions(broker, uid, exchange, "^ok", ".*")
    admin = conn.channel()
    try:
        admin.exchange_declare(exchange, "direct")
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.port, credentials=pika.PlainCredentials(user, password)))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange, "any.key", b"x")
        admin.exchange_delete(exchange)
        admin.exchange_declare(exchange, "topic")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_publish(exchange, "any.key", b"x")
        assert refused.value.reply_code == 403
        connection.close()
    finally:
        admin.exchange_delete(exchange)
        call(broker, "DELETE", f"/api/users/{q(user)}")


# -- vhost and user limits ----------------------------------------------------------------------------------

def _login(broker, vhost: str, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, vhost,
                                                             credentials=pika.PlainCredentials(user, password)))


@pytest.fixture
def limited_vhost(broker, uid):
    _mgmt(broker)
    vhost = f"{uid}-vh"
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}", {}).status == 201
    yield vhost
    call(broker, "DELETE", f"/api/vhosts/{q(vhost)}")


def test_vhost_limits(broker, limited_vhost):
    vhost = limited_vhost
    path = f"/api/vhost-limits/{q(vhost)}"
    assert call(broker, "GET", path).json == []
    assert call(broker, "PUT", f"{path}/max-connections", {"value": 1}).status == 204
    assert call(broker, "PUT", f"{path}/max-queues", {"value": 2}).status == 204
    assert call(broker, "GET", path).json == [{"vhost": vhost, "value": {"max-connections": 1, "max-queues": 2}}]
    assert {"vhost": vhost, "value": {"max-connections": 1, "max-queues": 2}} in \
        call(broker, "GET", "/api/vhost-limits").json
    assert {"value": {"max-connections": 1, "max-queues": 2}, "vhost": vhost, "component": "vhost-limits",
            "name": "limits"} in call(broker, "GET", "/api/parameters").json
    first = _login(broker, vhost)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        _login(broker, vhost)
    assert "530" in str(refused.value) and \
        f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (1) is reached" \
        in str(refused.value)
    channel = first.channel()
    channel.queue_declare("q1")
    channel.queue_declare("q2", exclusive=True)
    channel.queue_declare("q1")  # a queue that is there is no new one
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("q3")
    assert (closed.value.reply_code, closed.value.reply_text) == \
        (406, f"PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost '{vhost}' (2) is reached")
    assert call(broker, "PUT", f"/api/queues/{q(vhost)}/q4", {}).status == 400  # HTTP declares are limited too
    first.close()
    assert call(broker, "PUT", f"{path}/max-connections", {"value": -1}).status == 204  # negative: no limit
    assert call(broker, "DELETE", f"{path}/max-queues").status == 204
    assert call(broker, "GET", path).json == [{"vhost": vhost, "value": {"max-connections": -1}}]
    connections = [_login(broker, vhost) for _ in range(3)]
    connections[0].channel().queue_declare("q3")
    for connection in connections:
        connection.close()


def test_vhost_limit_refusals(broker, limited_vhost):
    path = f"/api/vhost-limits/{q(limited_vhost)}"
    assert _reason(call(broker, "PUT", f"{path}/max-bogus", {"value": 1}), 400) == \
        'Validation failed\n\nUnrecognised terms [{<<"max-bogus">>,1}] in limits\n'
    assert _reason(call(broker, "PUT", f"{path}/max-queues", {"value": "x"}), 400) == \
        'Validation failed\n\nmax-queues should be a number, actually was <<"x">>\n'
    assert _reason(call(broker, "PUT", f"{path}/max-queues", {"value": 1.5}), 400) == \
        "Validation failed\n\nmax-queues should be a number, actually was 1.5\n"
    assert _reason(call(broker, "PUT", f"{path}/max-queues", {}), 400) == "[{key_missing,value}]"
    assert _reason(call(broker, "PUT", f"/api/vhost-limits/{q(limited_vhost)}-no/max-queues", {"value": 1}), 404,
                   "not_found") == "vhost_not_found"
    assert call(broker, "GET", f"/api/vhost-limits/{q(limited_vhost)}-no").status == 404


def test_user_limits(broker, limited_vhost, uid):
    user, password = uid, "pw"
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": password, "tags": ""}).status == 201
    try:
        assert call(broker, "PUT", f"/api/permissions/{q(limited_vhost)}/{q(user)}",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
        path = f"/api/user-limits/{q(user)}"
        assert call(broker, "PUT", f"{path}/max-connections", {"value": 1}).status == 204
        assert call(broker, "PUT", f"{path}/max-channels", {"value": 2}).status == 204
        assert call(broker, "GET", path).json == [{"user": user, "value": {"max-channels": 2, "max-connections": 1}}]
        assert call(broker, "GET", f"/api/users/{q(user)}").json["limits"] == {"max-channels": 2,
                                                                               "max-connections": 1}
        connection = _login(broker, limited_vhost, user, password)
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            _login(broker, limited_vhost, user, password)
        assert f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) is reached" \
            in str(refused.value)
        connection.channel()
        connection.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.channel()
        assert (closed.value.reply_code, closed.value.reply_text) == \
            (530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the maximum allowed "
                  f"user limit of (2)")
        assert _reason(call(broker, "PUT", f"{path}/max-bogus", {"value": 1}), 400) == \
            'Unrecognised terms [{<<"max-bogus">>,1}] in user-limits'
        assert _reason(call(broker, "PUT", f"{path}/max-channels", {"value": True}), 400) == \
            "max-channels should be a number, actually was true"
        assert call(broker, "PUT", f"/api/user-limits/{q(user)}-no/max-channels", {"value": 1}).json["reason"] == \
            ["no_such_user", f"{user}-no"]
        assert call(broker, "DELETE", f"{path}/max-connections").status == 204
        assert call(broker, "DELETE", f"{path}/max-channels").status == 204
        assert call(broker, "GET", path).json == []
        for connection in [_login(broker, limited_vhost, user, password) for _ in range(2)]:
            connection.close()
    finally:
        call(broker, "DELETE", f"/api/users/{q(user)}")


def test_connection_limits_are_checked_before_the_vhost_permission(broker, limited_vhost, uid):
    """rabbit_reader's connection.open: is_over_vhost_connection_limit, then is_over_user_connection_limit, then
    check_vhost_access: a user without permissions on a vhost at its limit is told of the limit."""
    user, password = uid, "pw"
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": password, "tags": ""}).status == 201
    try:
        vhost_limit = f"/api/vhost-limits/{q(limited_vhost)}/max-connections"
        assert call(broker, "PUT", vhost_limit, {"value": 0}).status == 204
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            _login(broker, limited_vhost, user, password)
        assert f"NOT_ALLOWED - access to vhost '{limited_vhost}' refused for user '{user}': connection limit (0) " \
            "is reached" in str(refused.value)
        assert call(broker, "DELETE", vhost_limit).status == 204
        assert call(broker, "PUT", f"/api/user-limits/{q(user)}/max-connections", {"value": 0}).status == 204
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            _login(broker, limited_vhost, user, password)
        assert f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (0) is reached" \
            in str(refused.value)
    finally:
        call(broker, "DELETE", f"/api/users/{q(user)}")


# -- what the HTTP API shows ------------------------------------------------------------------------------

def _queue(broker, name: str) -> dict:
    return call(broker, "GET", f"/api/queues/%2F/{q(name)}").json


def test_queue_bytes_persistent_messages_and_head_timestamp(broker, conn, uid):
    """message_bytes (ready and unacked), messages_persistent and message_bytes_persistent (a durable queue's
    persistent messages, unacked too), head_message_timestamp (the next message's timestamp property; RabbitMQ's
    also looks at unacked messages, Warren's does not)."""
    _mgmt(broker)
    channel = conn.channel()
    channel.queue_declare(uid, durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", uid, b"p" * 10, pika.BasicProperties(delivery_mode=2, timestamp=1700000000))
    channel.basic_publish("", uid, b"t" * 7, pika.BasicProperties(delivery_mode=1))
    channel.basic_publish("", uid, b"q" * 5, pika.BasicProperties(delivery_mode=2))
    try:
        def settled(check, name: str = uid) -> dict:
            deadline = time.monotonic() + 10
            while True:  # the API's figures follow within a moment on RabbitMQ
                info = _queue(broker, name)
                if check(info) or time.monotonic() > deadline:
                    return info
                time.sleep(0.2)

        info = settled(lambda i: i.get("messages_persistent") == 2)
        assert (info["message_bytes"], info["message_bytes_ready"], info["message_bytes_unacknowledged"]) == \
            (22, 22, 0)
        assert (info["messages_persistent"], info["message_bytes_persistent"]) == (2, 15)
        assert info["head_message_timestamp"] == 1700000000
        method, _, _ = channel.basic_get(uid)  # the first: unacked now
        info = settled(lambda i: i.get("message_bytes_unacknowledged") == 10)
        assert (info["message_bytes"], info["message_bytes_ready"], info["message_bytes_unacknowledged"]) == \
            (22, 12, 10)
        assert (info["messages_persistent"], info["message_bytes_persistent"]) == (2, 15)
        channel.basic_ack(method.delivery_tag)
        info = settled(lambda i: i.get("messages_persistent") == 1)
        assert (info["message_bytes"], info["message_bytes_unacknowledged"]) == (12, 0)
        assert (info["messages_persistent"], info["message_bytes_persistent"]) == (1, 5)
        assert info["head_message_timestamp"] is None  # the next one has none
        channel.queue_declare(f"{uid}-t")
        channel.basic_publish("", f"{uid}-t", b"x", pika.BasicProperties(delivery_mode=2))
        info = settled(lambda i: i.get("messages") == 1 and "messages_persistent" in i, f"{uid}-t")
        assert (info["messages_persistent"], info["message_bytes_persistent"]) == (0, 0)  # a transient queue's
    finally:
        channel.queue_delete(uid)
        channel.queue_delete(f"{uid}-t")


def test_quorum_queue_fields(broker, conn, uid):
    _mgmt(broker)
    channel = conn.channel()
    channel.queue_declare(uid, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    channel.basic_publish("", uid, b"hello", pika.BasicProperties(delivery_mode=1))
    try:
        deadline = time.monotonic() + 10
        while ((info := _queue(broker, uid)).get("messages") != 1 or "message_bytes" not in info) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (info["message_bytes"], info["messages_persistent"], info["message_bytes_persistent"]) == (5, 1, 5)
        assert info["single_active_consumer_ctag"] is None
        assert list(info["open_files"]) == [info["node"]]
    finally:
        channel.queue_delete(uid)


def test_node_level_endpoints(broker, uid):
    """/api/auth (asked before any login), /api/feature-flags, /api/users/without-permissions, auth attempts."""
    _mgmt(broker)
    assert call(broker, "GET", "/api/auth", auth=None).json == \
        {"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""}
    flags = {f["name"]: f for f in call(broker, "GET", "/api/feature-flags").json}
    assert {"quorum_queue", "stream_queue", "user_limits", "virtual_host_metadata"} <= set(flags)
    assert all(f["state"] == "enabled" and f["stability"] == "stable" for f in flags.values())
    assert call(broker, "PUT", f"/api/users/{q(uid)}", {"password": "pw", "tags": ""}).status == 201
    try:
        assert uid in [u["name"] for u in call(broker, "GET", "/api/users/without-permissions").json]
        assert "guest" not in [u["name"] for u in call(broker, "GET", "/api/users/without-permissions").json]
        node = call(broker, "GET", "/api/overview").json["node"]

        def attempts() -> dict[str, tuple[int, int]]:
            return {a["protocol"]: (a["auth_attempts_succeeded"], a["auth_attempts_failed"])
                    for a in call(broker, "GET", f"/api/auth/attempts/{q(node)}").json}

        before = attempts()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", broker.port, credentials=pika.PlainCredentials("guest", "wrong")))
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port)).close()
        after = attempts()
        ok, failed = before.get("amqp091", (0, 0))
        assert after["amqp091"] == (ok + 1, failed + 1)
        assert after["http"][0] > before["http"][0]
        assert call(broker, "GET", f"/api/auth/attempts/{q(node)}/source").json == []
    finally:
        call(broker, "DELETE", f"/api/users/{q(uid)}")


def test_idle_queues_and_channels_say_since_when(broker, conn, uid):
    _mgmt(broker)
    channel = conn.channel()
    channel.queue_declare(uid, exclusive=True)
    deadline = time.monotonic() + 30
    while "idle_since" not in (info := _queue(broker, uid)) and time.monotonic() < deadline:
        time.sleep(0.5)
        conn.process_data_events(0)
    assert time.strftime("%Y-%m-%dT", time.gmtime()) in info["idle_since"]
    assert info["idle_since"].endswith("+00:00")


def test_definitions_of_a_missing_vhost(broker, uid):
    _mgmt(broker)
    assert _reason(call(broker, "GET", f"/api/definitions/{q(uid)}"), 400) == "vhost_not_found"
    assert _reason(call(broker, "POST", f"/api/definitions/{q(uid)}", {}), 404, "not_found") == "vhost_not_found"


@pytest.mark.parametrize("action", [
    lambda ch, uid: ch.exchange_bind("", "amq.direct", "k"),
    lambda ch, uid: ch.exchange_unbind("", "amq.direct", "k"),
    lambda ch, uid: ch.exchange_unbind("amq.direct", "", "k"),
    lambda ch, uid: ch.queue_unbind(f"{uid}-none", "", "k"),
], ids=["exchange.bind to it", "exchange.unbind to it", "exchange.unbind from it", "queue.unbind of no queue"])
def test_bindings_of_the_default_exchange_are_refused(conn, uid, action):
    """Either end, before anything is looked up (an unbind of what is not there included)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        action(conn.channel(), uid)
    assert (refused.value.reply_code, refused.value.reply_text) == \
        (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_a_binding_with_neither_end_names_the_source(conn, uid):
    for action in (lambda ch: ch.queue_bind(f"{uid}-q", f"{uid}-x", "k"),
                   lambda ch: ch.exchange_bind(f"{uid}-d", f"{uid}-x", "k")):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            action(conn.channel())
        assert refused.value.reply_text == f"NOT_FOUND - no exchange '{uid}-x' in vhost '/'"


def test_http_refusals_in_rabbitmqs_order_and_words(broker, uid):
    _mgmt(broker)
    publish = "/api/exchanges/%2F/amq.default/publish"
    for key in ("content_type", "correlation_id", "expiration", "message_id", "type", "user_id", "app_id"):
        body = {"routing_key": uid, "payload": "x", "payload_encoding": "string", "properties": {key: 5}}
        assert _reason(call(broker, "POST", publish, body), 400) == ["not_string", key]
    get = f"/api/queues/%2F/{q(uid)}-none/get"  # the body is checked before the queue is looked up
    assert _reason(call(broker, "POST", get, {"count": 1, "ackmode": "ack_requeue_true", "encoding": "bogus"}),
                   400) == "Unsupported encoding. Please use auto or base64."
    assert _reason(call(broker, "POST", get, {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto",
                                              "truncate": "x"}), 400) == ["not_integer", "x"]
    assert _reason(call(broker, "PUT", f"/api/policies/{q(uid)}-none/p", {"pattern": "^x", "definition": {}}), 404,
                   "not_found") == "vhost_not_found"
    refused = call(broker, "PATCH", f"/api/queues/%2F/{q(uid)}", {})
    assert (refused.status, refused.raw) == (405, b"")


def test_definitions_import_refusals_and_skipped_bindings(broker, uid):
    _mgmt(broker)
    assert _reason(call(broker, "POST", "/api/definitions", {"permissions": [
        {"vhost": f"{uid}-nv", "user": "guest", "configure": ".*", "write": ".*", "read": ".*"}]}), 400) == \
        ["no_such_vhost", f"{uid}-nv"]
    assert _reason(call(broker, "POST", "/api/definitions", {"queues": [
        {"vhost": f"{uid}-nv", "name": uid, "durable": True, "auto_delete": False, "arguments": {}}]}), 400) == \
        ["no_such_vhost", f"{uid}-nv"]
    # a binding whose source or destination is missing is skipped; the rest is imported
    body = {"queues": [{"vhost": "/", "name": uid, "durable": False, "auto_delete": False, "arguments": {}}],
            "bindings": [{"vhost": "/", "source": f"{uid}-nx", "destination": uid, "destination_type": "queue",
                          "routing_key": "k", "arguments": {}},
                         {"vhost": "/", "source": "amq.direct", "destination": f"{uid}-nq",
                          "destination_type": "queue", "routing_key": "k", "arguments": {}},
                         {"vhost": "/", "source": "amq.direct", "destination": uid, "destination_type": "queue",
                          "routing_key": "k", "arguments": {}}]}
    try:
        assert call(broker, "POST", "/api/definitions", body).status == 204
        assert [b["source"] for b in call(broker, "GET", f"/api/queues/%2F/{q(uid)}/bindings").json] == \
            ["", "amq.direct"]
    finally:
        call(broker, "DELETE", f"/api/queues/%2F/{q(uid)}")


def test_users_bulk_delete(broker, uid):
    _mgmt(broker)
    assert _reason(call(broker, "POST", "/api/users/bulk-delete", {}), 400) == "[{key_missing,users}]"
    assert _reason(call(broker, "POST", "/api/users/bulk-delete", {"users": [f"{uid}-none"]}), 400) == \
        ["no_such_user", f"{uid}-none"]
    for name in (f"{uid}-1", f"{uid}-2"):
        assert call(broker, "PUT", f"/api/users/{q(name)}", {"password": "pw", "tags": ""}).status == 201
    assert call(broker, "POST", "/api/users/bulk-delete", {"users": [f"{uid}-1", f"{uid}-2"]}).status == 204
    assert call(broker, "GET", f"/api/users/{q(uid)}-1").status == 404


@pytest.mark.parametrize("method", [commands.Connection.Blocked(reason="x"), commands.Connection.Unblocked()],
                         ids=["blocked", "unblocked"])
def test_a_client_cannot_say_the_connection_is_blocked(broker, method):
    """connection.blocked and unblocked go from the server to the client only."""
    raw = Raw(broker)
    raw.handshake()
    raw.send(frame(0, method))
    close = raw.expect(commands.Connection.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == \
        (504, "CHANNEL_ERROR - unexpected method in connection state running", 10, method.index & 0xFFFF)
    raw.close()


def test_global_parameters_and_the_cluster_name(broker, uid):
    _mgmt(broker)
    path = f"/api/global-parameters/{q(uid)}"
    assert call(broker, "GET", path).status == 404
    assert _reason(call(broker, "PUT", path, {}), 400) == "[{key_missing,value}]"
    assert call(broker, "PUT", path, {"value": {"a": [1, 2]}}).status == 201
    assert call(broker, "PUT", path, {"value": "s"}).status == 204
    assert call(broker, "GET", path).json == {"name": uid, "value": "s"}
    assert {"name": uid, "value": "s"} in call(broker, "GET", "/api/global-parameters").json
    assert {"name": uid, "value": "s"} in call(broker, "GET", "/api/definitions").json["global_parameters"]
    assert call(broker, "DELETE", path).status == 204
    assert call(broker, "DELETE", path).status == 404
    before = call(broker, "GET", "/api/cluster-name").json["name"]
    try:
        assert _reason(call(broker, "PUT", "/api/cluster-name", {}), 400) == "[{key_missing,name}]"
        assert call(broker, "PUT", "/api/cluster-name", {"name": f"{uid}-cluster"}).status == 204
        assert call(broker, "GET", "/api/cluster-name").json == {"name": f"{uid}-cluster"}
        assert call(broker, "GET", "/api/overview").json["cluster_name"] == f"{uid}-cluster"
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        properties = beneath(connection).server_properties  # connection.start's
        assert properties is not None and properties["cluster_name"] == f"{uid}-cluster"
        connection.close()
    finally:
        call(broker, "PUT", "/api/cluster-name", {"name": before})
