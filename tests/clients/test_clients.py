"""The broker through real, unmodified clients: aio-pika, pika's async adapters, kombu, py-amqp, amqp-tools.

Also heartbeats (server side timeout and a live pika client) and connection.blocked under a memory alarm.
"""
from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time
from typing import Any

import aio_pika
import amqp
import kombu
import pika
import pytest
from pamqp import commands, frame as pframe

from conftest import unavailable
from support import beneath

pytestmark = pytest.mark.timeout(60)


# -- aio-pika -----------------------------------------------------------------------------------------------


async def test_aio_pika_publish_confirm_consume(broker, uid):
    connection = await aio_pika.connect_robust(broker.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=5)
        queue = await channel.declare_queue(uid, auto_delete=True)
        for i in range(10):
            confirmation = await channel.default_exchange.publish(
                aio_pika.Message(f"m{i}".encode(), headers={"i": i}, content_type="text/plain"), routing_key=uid)
            assert confirmation is not None
        got = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    got.append(message.body)
                    assert message.headers["i"] == len(got) - 1
                    assert message.content_type == "text/plain"
                if len(got) == 10:
                    break
        assert got == [f"m{i}".encode() for i in range(10)]


async def test_aio_pika_ack_nack_reject_and_get(broker, uid):
    async with await aio_pika.connect_robust(broker.url, timeout=10) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(uid, auto_delete=False)
        for body in (b"a", b"b", b"c"):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=uid)
        first = await queue.get(timeout=5)
        assert first.body == b"a" and not first.redelivered
        await first.nack(requeue=True)
        second = await queue.get(timeout=5)
        await second.reject(requeue=False)  # dropped
        third = await queue.get(timeout=5)
        await third.ack()
        bodies = {second.body, third.body}
        assert b"a" in bodies or first.body == b"a"
        rest = []
        while True:
            message = await queue.get(fail=False, timeout=5)
            if message is None:
                break
            rest.append(message)
            await message.ack()
        # a was requeued once; in total three deliveries consumed, one rejected, nothing left
        assert sorted([second.body, third.body] + [m.body for m in rest]) == [b"a", b"b", b"c"]
        assert all(m.redelivered for m in [second, third, *rest] if m.body == b"a")
        assert await queue.get(fail=False, timeout=5) is None
        await queue.delete(if_unused=False, if_empty=False)


async def test_aio_pika_topic_routing(broker, uid):
    async with await aio_pika.connect_robust(broker.url, timeout=10) as connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(f"x-{uid}", aio_pika.ExchangeType.TOPIC, auto_delete=True)
        q_star = await channel.declare_queue(exclusive=True)
        q_hash = await channel.declare_queue(exclusive=True)
        await q_star.bind(exchange, "stock.*.nyse")
        await q_hash.bind(exchange, "stock.#")
        for key in ("stock.ibm.nyse", "stock.aapl.nasdaq", "stock.nyse", "bond.x.nyse"):
            await exchange.publish(aio_pika.Message(key.encode()), routing_key=key)

        async def drain(queue):
            out = []
            while (message := await queue.get(fail=False, no_ack=True, timeout=5)) is not None:
                out.append(message.body.decode())
            return out

        assert await drain(q_star) == ["stock.ibm.nyse"]
        assert sorted(await drain(q_hash)) == ["stock.aapl.nasdaq", "stock.ibm.nyse", "stock.nyse"]


async def test_aio_pika_channel_error_is_reported(broker, uid):
    async with await aio_pika.connect_robust(broker.url, timeout=10) as connection:
        channel = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity) as info:
            await channel.declare_queue(f"missing-{uid}", passive=True)
        assert f"no queue 'missing-{uid}' in vhost '/'" in str(info.value)
        other = await connection.channel()
        queue = await other.declare_queue(exclusive=True)
        await other.default_exchange.publish(aio_pika.Message(b"still fine"), routing_key=queue.name)
        message = await queue.get(timeout=5, no_ack=True)
        assert message.body == b"still fine"


# -- pika async adapters ------------------------------------------------------------------------------------


def test_pika_select_connection_publish_consume(broker, uid):
    params = pika.ConnectionParameters(broker.host, broker.port, connection_attempts=1, socket_timeout=5)
    state: dict[str, Any] = {"received": [], "confirms": 0, "error": None}
    count = 20

    def on_open(connection):
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel):
        state["channel"] = channel
        channel.confirm_delivery(on_confirm)
        channel.queue_declare(uid, auto_delete=True, callback=lambda _f: on_declared(channel))

    def on_declared(channel):
        channel.basic_qos(prefetch_count=4)
        channel.basic_consume(uid, on_message)
        for i in range(count):
            channel.basic_publish("", uid, str(i).encode(), pika.BasicProperties(delivery_mode=2))

    def on_confirm(frame):
        if isinstance(frame.method, pika.spec.Basic.Ack):
            state["confirms"] = frame.method.delivery_tag if frame.method.multiple else state["confirms"] + 1

    def on_message(channel, method, properties, body):
        state["received"].append(body)
        channel.basic_ack(method.delivery_tag)
        if len(state["received"]) == count:
            channel.connection.close()

    def on_open_error(_connection, error):
        state["error"] = error
        _connection.ioloop.stop()

    connection = pika.SelectConnection(params, on_open_callback=on_open, on_open_error_callback=on_open_error,
                                       on_close_callback=lambda c, reason: c.ioloop.stop())
    timer = connection.ioloop.call_later(15, connection.ioloop.stop)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(timer)
    assert state["error"] is None
    assert state["received"] == [str(i).encode() for i in range(count)]
    assert state["confirms"] == count


async def test_pika_asyncio_connection(broker, uid):
    from pika.adapters.asyncio_connection import AsyncioConnection

    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    received = []

    def on_open(connection):
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel):
        def declared(_frame):
            channel.basic_consume(uid, on_message, auto_ack=True)
            channel.basic_publish("", uid, b"via asyncio adapter")

        channel.queue_declare(uid, exclusive=True, callback=declared)

    def on_message(channel, method, properties, body):
        received.append(body)
        channel.connection.close()

    def on_closed(_connection, reason):
        if not done.done():
            done.set_result(reason)

    AsyncioConnection(pika.ConnectionParameters(broker.host, broker.port), on_open_callback=on_open,
                      on_open_error_callback=lambda c, e: done.set_exception(e), on_close_callback=on_closed,
                      custom_ioloop=loop)
    await asyncio.wait_for(done, 15)
    assert received == [b"via asyncio adapter"]


# -- kombu --------------------------------------------------------------------------------------------------


def test_kombu_producer_consumer(broker, uid):
    exchange = kombu.Exchange(f"x-{uid}", type="direct", auto_delete=True)
    queue = kombu.Queue(uid, exchange, routing_key="rk", auto_delete=True)
    received = []
    with kombu.Connection(broker.url, connect_timeout=5) as connection:
        with connection.channel() as channel:
            producer = kombu.Producer(channel)
            for i in range(5):
                producer.publish({"n": i}, exchange=exchange, routing_key="rk", declare=[queue],
                                 serializer="json", retry=False)

            def on_message(body, message):
                received.append(body["n"])
                message.ack()

            with kombu.Consumer(channel, queues=[queue], callbacks=[on_message], accept=["json"]):
                deadline = time.monotonic() + 10
                while len(received) < 5 and time.monotonic() < deadline:
                    try:
                        connection.drain_events(timeout=1)
                    except socket.timeout:
                        pass
    assert received == list(range(5))


@pytest.mark.parametrize("scheme", ["amqp", "pyamqp"])
def test_kombu_simple_queue(broker, uid, scheme):
    url = broker.url.replace("amqp://", f"{scheme}://", 1)
    with kombu.Connection(url, connect_timeout=5) as connection:
        assert connection.transport_cls in ("amqp", "pyamqp") or connection.transport is not None
        queue = connection.SimpleQueue(f"{uid}-{scheme}")
        queue.put({"hello": scheme}, serializer="json")
        queue.put("second", serializer="json")
        message = queue.get(block=True, timeout=5)
        assert message.payload == {"hello": scheme}
        message.ack()
        message = queue.get(block=True, timeout=5)
        assert message.payload == "second"
        message.ack()
        with pytest.raises(queue.Empty):
            queue.get(block=False)
        queue.close()  # cancel our consumer first: deleting under it would send basic.cancel, as RabbitMQ does
        connection.default_channel.queue_delete(f"{uid}-{scheme}")


# -- py-amqp ------------------------------------------------------------------------------------------------


def test_py_amqp_direct(broker, uid):
    connection = amqp.Connection(f"{broker.host}:{broker.port}", userid="guest", password="guest",
                                 confirm_publish=True, connect_timeout=5, read_timeout=5, write_timeout=5)
    connection.connect()
    try:
        assert connection.server_capabilities.get("publisher_confirms") is True
        channel = connection.channel()
        name, count, consumers = channel.queue_declare(uid, auto_delete=True)
        assert (name, count, consumers) == (uid, 0, 0)
        for i in range(3):
            channel.basic_publish(amqp.Message(f"body{i}", content_type="text/plain",
                                               application_headers={"i": i}), exchange="", routing_key=uid)
        message = channel.basic_get(uid, no_ack=False)
        assert message.body == b"body0" or message.body == "body0"
        assert message.properties["application_headers"] == {"i": 0}
        channel.basic_ack(message.delivery_tag)
        got: list[bytes | str] = []

        def on_message(message: amqp.Message) -> None:
            got.append(message.body)
            channel.basic_ack(message.delivery_tag)

        channel.basic_consume(uid, callback=on_message)
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            try:
                connection.drain_events(timeout=1)
            except socket.timeout:
                pass
        assert [g if isinstance(g, bytes) else g.encode() for g in got] == [b"body1", b"body2"]
        # a soft error surfaces as the client's exception and the connection stays usable
        with pytest.raises(amqp.exceptions.NotFound):
            channel.queue_declare(f"missing-{uid}", passive=True)
        channel2 = connection.channel()
        channel2.queue_delete(uid)
    finally:
        connection.close()


# -- amqp-tools (rabbitmq-c) --------------------------------------------------------------------------------


@pytest.mark.client
def test_amqp_tools(broker, uid):
    if shutil.which("amqp-publish") is None:
        unavailable("amqp-tools (rabbitmq-c) is not installed (test.sh installs it)")
    common = ["--server", broker.host, "--port", str(broker.port), "--username", "guest", "--password", "guest"]
    run = lambda *args: subprocess.run(list(args), capture_output=True, text=True, timeout=20)  # noqa: E731 (a one-line helper)
    declared = run("amqp-declare-queue", *common, "-q", uid)
    assert declared.returncode == 0, declared.stderr
    assert declared.stdout.strip() == uid
    published = run("amqp-publish", *common, "-r", uid, "-b", "from rabbitmq-c", "-C", "text/plain")
    assert published.returncode == 0, published.stderr
    got = run("amqp-get", *common, "-q", uid)
    assert got.returncode == 0, got.stderr
    assert got.stdout == "from rabbitmq-c"
    empty = run("amqp-get", *common, "-q", uid)
    assert empty.returncode != 0  # rabbitmq-c's amqp-get exits non-zero on an empty queue
    deleted = run("amqp-delete-queue", *common, "-q", uid)
    assert deleted.returncode == 0, deleted.stderr


# -- heartbeats ---------------------------------------------------------------------------------------------


def _raw_handshake(sock: socket.socket, heartbeat: int) -> None:
    buf = b""

    def read(kind):
        nonlocal buf
        while True:
            try:
                consumed, _channel, value = pframe.unmarshal(buf)
            except Exception:
                data = sock.recv(65536)
                assert data, "closed during handshake"
                buf += data
                continue
            buf = buf[consumed:]
            assert isinstance(value, kind), value
            return value

    sock.sendall(b"AMQP\x00\x00\x09\x01")
    read(commands.Connection.Start)
    sock.sendall(pframe.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"), 0))
    tune = read(commands.Connection.Tune)
    sock.sendall(pframe.marshal(commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                           heartbeat=heartbeat), 0))
    sock.sendall(pframe.marshal(commands.Connection.Open(virtual_host="/"), 0))
    read(commands.Connection.OpenOk)


def test_silent_client_is_disconnected_after_two_heartbeat_intervals(broker):
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        _raw_handshake(sock, heartbeat=1)
        opened = time.monotonic()
        heartbeats = 0
        while True:
            try:
                data = sock.recv(4096)
            except ConnectionResetError:  # RabbitMQ drops the socket with a reset, Warren with a FIN
                break
            if not data:
                break
            heartbeats += data.count(b"\x08\x00\x00\x00\x00\x00\x00\xce")
        elapsed = time.monotonic() - opened
    assert heartbeats >= 3  # the server kept sending its own, every half interval as RabbitMQ does
    assert 1.5 <= elapsed <= 4.0, elapsed


def test_pika_heartbeat_client_stays_connected(broker, uid):
    params = pika.ConnectionParameters(broker.host, broker.port, heartbeat=1)
    connection = pika.BlockingConnection(params)
    try:
        assert beneath(connection).params.heartbeat == 1
        channel = connection.channel()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
        assert connection.is_open
        channel.queue_declare(uid, exclusive=True)
    finally:
        if connection.is_open:
            connection.close()


# -- connection.blocked -------------------------------------------------------------------------------------


def test_pika_receives_connection_blocked(start_broker, uid):
    # values <= 1 are a fraction of RAM (1 = all of it, as RabbitMQ's relative watermark); 2 bytes is always over
    node = start_broker("--memory-high-watermark", "2")
    blocked = threading.Event()
    connection = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port,
                                                                   blocked_connection_timeout=30))
    try:
        connection.add_on_connection_blocked_callback(lambda _c, frame: blocked.set())
        channel = connection.channel()
        channel.queue_declare(uid)
        channel.basic_publish("", uid, b"over the watermark")
        deadline = time.monotonic() + 6
        while not blocked.is_set() and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
        assert blocked.is_set()
    finally:
        try:
            connection.close()
        except Exception:
            pass


async def test_aio_pika_blocked_connection_publish_waits(start_broker, uid):
    # values <= 1 are a fraction of RAM (1 = all of it, as RabbitMQ's relative watermark); 2 bytes is always over
    node = start_broker("--memory-high-watermark", "2")
    connection = await aio_pika.connect(node.url, timeout=10)
    try:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(uid)
        await asyncio.sleep(1.5)  # let the alarm set
        # the publish that finds the alarm set is taken (as in RabbitMQ); then the connection stops being read
        first = asyncio.ensure_future(channel.default_exchange.publish(aio_pika.Message(b"1"), routing_key=uid))
        await asyncio.wait({first}, timeout=1)
        publish = asyncio.ensure_future(channel.default_exchange.publish(aio_pika.Message(b"2"), routing_key=uid))
        done, _ = await asyncio.wait({publish}, timeout=2)
        assert not done, "a publish was confirmed during a memory alarm"
        publish.cancel()
        first.cancel()
        assert queue.name == uid
    finally:
        await asyncio.wait_for(connection.close(), 5)
