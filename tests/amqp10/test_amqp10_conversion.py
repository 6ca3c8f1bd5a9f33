"""AMQP 0-9-1 and AMQP 1.0 messages across protocols as RabbitMQ 4.x converts them (mc_amqpl): a 0-9-1 message
reaches an AMQP 1.0 reader with a header section (durable, priority, ttl), ``x-`` headers and the type as message
annotations, app-id as group-id; a 1.0 publish's group-id is a 0-9-1 reader's app-id."""
from __future__ import annotations

from typing import Any

import pika
import pytest
from proton import Described, Message, symbol
from proton.reactor import Filter

from test_amqp10 import connect, declare, node  # noqa: F401  (the node fixture)

pytestmark = pytest.mark.timeout(60)


def test_a_091_message_reaches_an_amqp10_reader_as_rabbitmq_4_converts_it(node):  # noqa: F811
    connection = declare(node, "q")
    channel = connection.channel()
    channel.basic_publish("", "q", b"full", pika.BasicProperties(
        delivery_mode=2, priority=4, expiration="60000", type="t", app_id="a", headers={"x-h": "1", "h": 2}))
    channel.basic_publish("", "q", b"plain", pika.BasicProperties())
    connection.close()
    amqp = connect(node)
    try:
        receiver = amqp.create_receiver("/queues/q")
        full, plain = receiver.receive(timeout=5), receiver.receive(timeout=5)
    finally:
        amqp.close()
    assert (full.durable, full.priority, full.ttl) == (True, 4, 60.0) and full.annotations is not None
    assert (full.annotations["x-basic-type"], full.annotations["x-h"], full.group_id) == ("t", "1", "a")
    assert full.properties == {"h": 2}
    assert not {"x-basic-priority", "x-basic-delivery-mode", "x-basic-expiration"} & set(full.annotations)
    assert (plain.durable, plain.priority, plain.ttl, plain.group_id) == (False, 4, 0.0, None)  # (proton's defaults)


def test_an_amqp10_group_id_is_the_app_id_an_091_reader_gets(node):  # noqa: F811
    connection = declare(node, "q")
    amqp = connect(node)
    try:
        amqp.create_sender("/queues/q").send(Message(body=b"x", group_id="g", priority=7, ttl=30.0))
    finally:
        amqp.close()
    _, props, _ = connection.channel().basic_get("q", auto_ack=True)
    connection.close()
    assert props is not None
    assert (props.app_id, props.priority, props.expiration) == ("g", 7, "30000")


def test_amqp10_application_properties_named_x_come_back_as_application_properties(node):  # noqa: F811
    """mc_amqpl: a 0-9-1 reader gets application properties and ``x-`` annotations as headers, its type from the
    ``x-basic-type`` annotation only; an AMQP 1.0 reader gets each section back as it was sent."""
    connection = declare(node, "q")
    amqp = connect(node)
    try:
        sender = amqp.create_sender("/queues/q")
        for _ in range(2):
            sender.send(Message(body=b"x", inferred=True, annotations={"x-ann": "b", "x-basic-type": "t"},
                                properties={"x-app": "a", "x-basic-type": "not-the-type", "k": 1}))
        got = amqp.create_receiver("/queues/q").receive(timeout=5)
    finally:
        amqp.close()
    assert got.properties == {"x-app": "a", "x-basic-type": "not-the-type", "k": 1}
    assert got.annotations is not None and got.annotations["x-ann"] == "b" and "x-app" not in got.annotations
    _, props, _ = connection.channel().basic_get("q", auto_ack=True)
    connection.close()
    assert props is not None and props.headers is not None
    assert (props.type, props.headers["x-app"], props.headers["x-ann"], props.headers["k"]) == ("t", "a", "b", 1)


@pytest.mark.parametrize("queue_type", ["classic", "stream"])
def test_an_amqp10_creation_time_keeps_its_milliseconds_for_an_amqp10_reader(node, queue_type):  # noqa: F811
    """mc_amqpl: a 0-9-1 reader's timestamp is the creation-time's seconds (``V div 1000``, no header keeps the
    rest); an AMQP 1.0 reader gets it as sent.  One out of a 0-9-1 timestamp's range leaves the timestamp unset."""
    sent = [1700000000.987, 1700000001.0, -1.5, 3e11]
    connection = declare(node, "q", **{"x-queue-type": queue_type})
    amqp = connect(node)
    try:
        sender = amqp.create_sender("/queues/q")
        for seconds in sent:
            sender.send(Message(body=b"x", inferred=True, creation_time=seconds))
        receiver = amqp.create_receiver("/queues/q", options=Filter({
            symbol("offset"): Described(symbol("rabbitmq:stream-offset-spec"), "first")})
            if queue_type == "stream" else None)
        got = [receiver.receive(timeout=5).creation_time for _ in sent]
    finally:
        amqp.close()  # (unsettled: back in the classic queue)
    assert got == sent
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    stamps: list[Any] = []
    channel.basic_consume("q", lambda ch, method, props, body: stamps.append(props.timestamp),
                          arguments={"x-stream-offset": "first"} if queue_type == "stream" else None)
    while len(stamps) < len(sent):
        connection.process_data_events(time_limit=1)
    connection.close()
    assert stamps == [1700000000, 1700000001, None, None]


def test_a_kept_section_header_a_091_publisher_forges_goes_out_only_if_it_is_one(node):  # noqa: F811
    """``x-amqp-1.0-app-properties`` is read back as RabbitMQ's amqp10_section_header reads it: a well-formed
    application-properties section goes out as the section; anything else is left out, the rest converted."""
    from stream_log import amqp10
    section = amqp10.described(amqp10.APPLICATION_PROPERTIES, amqp10.encode_map([(amqp10.utf8("x-k"), b"\x54\x07")]))
    connection = declare(node, "q")
    channel = connection.channel()
    for forged in (section, section[:-1], b"\x00\x53\x73\xc0\x01\x00", b"\xff" * 64):
        channel.basic_publish("", "q", b"x", pika.BasicProperties(headers={"x-amqp-1.0-app-properties": forged,
                                                                          "h": 1, "x-a": "b"}))
    amqp = connect(node)
    try:
        receiver = amqp.create_receiver("/queues/q")
        got = [receiver.receive(timeout=5) for _ in range(4)]
    finally:
        amqp.close()
        connection.close()
    assert [message.properties for message in got] == [{"x-k": 7}, {"h": 1}, {"h": 1}, {"h": 1}]
    assert all(message.annotations is not None and message.annotations["x-a"] == "b" and
               "x-amqp-1.0-app-properties" not in message.annotations for message in got)
