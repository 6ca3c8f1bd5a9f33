"""Delivery acknowledgement timeout (consumer_timeout), seen through pika on nodes with tiny timeouts.

A delivery held unacknowledged too long closes its channel with RabbitMQ's 406 and
text, and goes back to its queue; the queue argument, the policy key and the consumer
argument ``x-consumer-timeout`` override the node's setting.
"""
from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from amqp_server import config
from conftest import EXTERNAL, BrokerProcess, connect, node_fixture
from support import call, q

pytestmark = pytest.mark.skipif(bool(EXTERNAL), reason="starts Warren nodes with a tiny consumer_timeout")

TIMED_OUT = ("PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. Timeout value used: "
             "{timeout} ms. This timeout value can be configured, see consumers doc guide to learn more")


node = node_fixture("--consumer-timeout", "500")
untimed = node_fixture("--consumer-timeout", "false", name="untimed")  # no timeout


def held_until_closed(connection: pika.BlockingConnection, channel, limit: float = 5.0) -> ChannelClosedByBroker | None:
    """Hold what the channel was given (a consumer on an empty queue keeps pika waiting) until the broker closes it."""
    if not channel.consumer_tags:
        idle = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_consume(idle, lambda *_: None, auto_ack=True)
    timer = connection.call_later(limit, channel.stop_consuming)
    try:
        channel.start_consuming()
    except ChannelClosedByBroker as exc:
        connection.remove_timeout(timer)
        return exc
    return None


def hold_one(node: BrokerProcess, queue: str, arguments: dict | None = None, consumer_arguments: dict | None = None,
             get: bool = False) -> tuple[float, ChannelClosedByBroker | None, pika.BlockingConnection]:
    """Declare ``queue``, publish one message and hold it unacked: (seconds until the close, the close, connection)."""
    connection = connect(node)
    channel = connection.channel()
    channel.queue_declare(queue, arguments=arguments)
    channel.basic_publish("", queue, b"held")
    if get:
        method, _, _ = channel.basic_get(queue)
        assert method is not None
    else:
        channel.basic_consume(queue, lambda *_: None, arguments=consumer_arguments)
    started = time.monotonic()
    closed = held_until_closed(connection, channel, limit=2.0)
    return time.monotonic() - started, closed, connection


def assert_requeued(node: BrokerProcess, queue: str) -> None:
    with connect(node) as connection:
        channel = connection.channel()
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None and method.redelivered and body == b"held"


def test_config_default_and_disabling() -> None:
    assert config.load([], {}).consumer_timeout == 1800000
    assert config.load(["--consumer-timeout", "false"], {}).consumer_timeout == 0
    assert config.load([], {"WARREN_CONSUMER_TIMEOUT": "0"}).consumer_timeout == 0
    assert config.load([], {"WARREN_CONSUMER_TIMEOUT": "60000"}).consumer_timeout == 60000


def test_held_delivery_closes_channel_and_is_redelivered(node: BrokerProcess, uid: str) -> None:
    elapsed, closed, connection = hold_one(node, uid)
    assert closed is not None
    assert (closed.reply_code, closed.reply_text) == (406, TIMED_OUT.format(channel=1, timeout=500))
    assert 0.5 <= elapsed < 2.0
    assert connection.is_open  # a channel error: the connection carries on
    connection.channel().queue_declare(uid, passive=True)
    connection.close()
    assert_requeued(node, uid)


def test_acking_in_time_keeps_the_channel(node: BrokerProcess, uid: str) -> None:
    with connect(node) as connection:
        channel = connection.channel()
        channel.queue_declare(uid)
        received = []

        def on_message(ch, method, properties, body) -> None:
            received.append(body)
            ch.basic_ack(method.delivery_tag)

        tag = channel.basic_consume(uid, on_message)
        for i in range(8):  # 1.6 s of deliveries, each acked at once
            channel.basic_publish("", uid, str(i).encode())
            connection.process_data_events(0.2)
        assert len(received) == 8
        channel.basic_cancel(tag)
        for _ in range(4):  # 1.2 s of basic.get, each held 0.3 s
            channel.basic_publish("", uid, b"x")
            method, _, _ = channel.basic_get(uid)
            assert method is not None and method.delivery_tag is not None  # (the one just published)
            connection.sleep(0.3)
            channel.basic_ack(method.delivery_tag)
        connection.process_data_events(0.3)
        assert channel.is_open
        channel.queue_declare(uid, passive=True)


def test_basic_get_with_manual_ack_times_out(node: BrokerProcess, uid: str) -> None:
    elapsed, closed, connection = hold_one(node, uid, get=True)
    assert closed is not None
    assert (closed.reply_code, closed.reply_text) == (406, TIMED_OUT.format(channel=1, timeout=500))
    assert 0.5 <= elapsed < 2.0
    connection.close()
    assert_requeued(node, uid)


def test_disabled_with_false(untimed: BrokerProcess, uid: str) -> None:
    elapsed, closed, connection = hold_one(untimed, uid)
    assert closed is None and elapsed >= 2.0
    connection.close()


def test_queue_argument_overrides_the_node(node: BrokerProcess, untimed: BrokerProcess, uid: str) -> None:
    _, closed, connection = hold_one(node, uid, arguments={"x-consumer-timeout": 60000})
    assert closed is None
    connection.close()
    elapsed, closed, connection = hold_one(untimed, uid, arguments={"x-consumer-timeout": 300})
    assert closed is not None and closed.reply_text == TIMED_OUT.format(channel=1, timeout=300)
    assert elapsed >= 0.3
    connection.close()
    assert_requeued(untimed, uid)


def test_consumer_argument_overrides_the_queue(node: BrokerProcess, uid: str) -> None:
    _, closed, connection = hold_one(node, uid, arguments={"x-consumer-timeout": 300},
                                     consumer_arguments={"x-consumer-timeout": 60000})
    assert closed is None
    connection.close()


def test_policy_sets_the_timeout(untimed: BrokerProcess, uid: str) -> None:
    response = call(untimed, "PUT", f"/api/policies/{q('/')}/{uid}",
                    {"pattern": f"^{uid}", "definition": {"consumer-timeout": 400}, "apply-to": "queues"})
    assert response.status == 201, response.raw
    _, closed, connection = hold_one(untimed, uid)
    assert closed is not None and closed.reply_text == TIMED_OUT.format(channel=1, timeout=400)
    connection.close()
    # with the queue argument too, the lower of the two applies
    _, closed, connection = hold_one(untimed, f"{uid}-arg", arguments={"x-consumer-timeout": 60000})
    assert closed is not None and closed.reply_text == TIMED_OUT.format(channel=1, timeout=400)
    connection.close()


def test_policy_value_is_validated(untimed: BrokerProcess, uid: str) -> None:
    response = call(untimed, "PUT", f"/api/policies/{q('/')}/{uid}",
                    {"pattern": uid, "definition": {"consumer-timeout": "86400000"}})
    assert response.status == 400
    assert '&lt;&lt;"86400000"&gt;&gt; is not a valid consumer timeout' in response.json["reason"]
