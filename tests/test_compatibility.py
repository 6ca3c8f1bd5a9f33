"""Where clients and tools depend on RabbitMQ's exact answers (issue: compatibility).

Each test passes against RabbitMQ 3.10 too (parity mode, see conftest), except those marked warren_only.
"""
from __future__ import annotations

import asyncio
import socket
import time

import aio_pika
import pika
import pytest
from aio_pika.patterns import RPC
from pamqp import body as pbody, commands, frame as pframe, header as pheader

from conftest import connect
from test_mgmt_api import call, q
from test_protocol_errors import Raw

pytestmark = pytest.mark.timeout(60)


# -- connection.close: the client closes the socket ------------------------------------------------

def test_close_ok_then_the_client_closes_the_socket(broker, uid):
    """Publishes pipelined after connection.close are read and dropped; after close-ok the broker waits for
    the client to close (closing with unread data would reset the client's connection)."""
    raw = Raw(broker)
    raw.handshake()
    raw.open_channel(1)
    frames = [raw_publish(uid) for _ in range(2000)]
    raw.send(frame(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)) + b"".join(frames))
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
    """DELETE .../contents empties the queue (across nodes: tests/test_cluster.py)."""
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
