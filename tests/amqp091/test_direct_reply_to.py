"""Direct reply-to (amq.rabbitmq.reply-to) through pika and aio-pika: RPC round trips and RabbitMQ's errors."""
from __future__ import annotations

import asyncio

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import commands

from conftest import connect
from support import AsyncClose, Raw, beneath, publish_frames

pytestmark = pytest.mark.timeout(60)
REPLY_TO = "amq.rabbitmq.reply-to"


def test_capability_advertised(broker) -> None:
    with connect(broker) as connection:
        capabilities = beneath(connection).server_capabilities
        assert capabilities is not None  # known once the connection is open
        assert capabilities["direct_reply_to"] is True


def test_pika_rpc_round_trip(broker, uid: str) -> None:
    with connect(broker) as client, connect(broker) as server:
        client_channel = client.channel()
        replies: list[tuple] = []
        client_channel.basic_consume(REPLY_TO, lambda ch, method, props, body: replies.append((method, props, body)),
                                     auto_ack=True)
        server_channel = server.channel()
        server_channel.queue_declare(uid, auto_delete=True)
        for i in range(3):
            client_channel.basic_publish("", uid, f"req{i}".encode(),
                                         pika.BasicProperties(reply_to=REPLY_TO, correlation_id=str(i)))
        for i in range(3):
            method, props, body = _get(server, server_channel, uid)
            assert body == f"req{i}".encode()
            assert props.reply_to.startswith(REPLY_TO + ".") and len(props.reply_to) > len(REPLY_TO) + 8
            assert "." not in props.reply_to[len(REPLY_TO) + 1:]  # one node: no node tag in the name
            assert props.correlation_id == str(i)
            server_channel.basic_publish("", props.reply_to, f"resp{i}".encode(),
                                         pika.BasicProperties(correlation_id=props.correlation_id))
        while len(replies) < 3:
            client.process_data_events(0.1)
        assert [(m.exchange, m.routing_key, p.correlation_id, b) for m, p, b in replies] == [
            ("", props.reply_to, str(i), f"resp{i}".encode()) for i in range(3)]
        assert not replies[0][0].redelivered
        assert client_channel.queue_declare(REPLY_TO, passive=True).method.consumer_count == 1
        assert server_channel.queue_declare(props.reply_to, passive=True).method.consumer_count == 1


def _get(connection, channel, queue: str):
    for _ in range(100):
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, props, body
        connection.sleep(0.05)
    raise AssertionError("no request arrived")


def test_consume_with_acks_is_refused(broker) -> None:
    with connect(broker) as connection:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
        assert (info.value.reply_code, info.value.reply_text) == (
            406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_second_reply_consumer_on_a_channel_is_refused(broker) -> None:
    with connect(broker) as connection:
        channel = connection.channel()
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
        assert (info.value.reply_code, info.value.reply_text) == (
            406, "PRECONDITION_FAILED - reply consumer already set")


def test_publish_with_reply_to_without_consumer_is_refused(broker, uid: str) -> None:
    closed: list = []
    with connect(broker) as connection:
        channel = connection.channel()
        beneath(channel).add_on_close_callback(lambda ch, reason: closed.append(reason))
        channel.basic_publish("", uid, b"x", pika.BasicProperties(reply_to=REPLY_TO))
        while not closed:
            connection.process_data_events(0.1)
        assert (closed[0].reply_code, closed[0].reply_text) == (
            406, "PRECONDITION_FAILED - fast reply consumer does not exist")
        other = connection.channel()  # a reply consumer on another channel does not count
        other.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
        third = connection.channel()
        beneath(third).add_on_close_callback(lambda ch, reason: closed.append(reason))
        third.basic_publish("", uid, b"x", pika.BasicProperties(reply_to=REPLY_TO))
        while len(closed) < 2:
            connection.process_data_events(0.1)
        assert closed[1].reply_code == 406


def test_fast_reply_to_checked_before_user_id(broker, uid: str) -> None:
    """rabbit_channel basic.publish: maybe_set_fast_reply_to (406 "fast reply consumer does not exist") comes before
    check_user_id_header."""
    with connect(broker) as connection:
        channel = connection.channel()
        closed = AsyncClose(channel)
        channel.basic_publish("", uid, b"x", pika.BasicProperties(user_id="mallory", reply_to=REPLY_TO))
        closed.wait(406, "PRECONDITION_FAILED - fast reply consumer does not exist")


def _raw_channel(broker) -> Raw:
    raw = Raw(broker)
    raw.handshake()
    raw.open_channel(1)
    return raw


def test_reply_to_consume_with_a_tag_in_use_is_530_before_other_checks(broker, uid: str) -> None:
    """rabbit_channel basic.consume of amq.rabbitmq.reply-to: maps:find(CTag0, ConsumerMapping) comes first: a tag a
    queue consumer has is 530 even with no_ack=false (which alone is 406)."""
    raw = _raw_channel(broker)
    try:
        raw.send_method(1, commands.Queue.Declare(queue=uid, exclusive=True))
        raw.expect(commands.Queue.DeclareOk)
        raw.send_method(1, commands.Basic.Consume(queue=uid, consumer_tag="t"))
        raw.expect(commands.Basic.ConsumeOk)
        raw.send_method(1, commands.Basic.Consume(queue=REPLY_TO, consumer_tag="t", no_ack=False))
        while True:
            _, frame = raw.read_frame()
            if isinstance(frame, (commands.Connection.Close, commands.Channel.Close)):
                break
        assert (frame.reply_code, frame.reply_text) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 't'")
    finally:
        raw.close()


def test_cancel_of_reply_consumer_tag_leaves_queue_consumer(broker, uid: str) -> None:
    """rabbit_channel basic.cancel, first clause (reply_consumer = {ConsumerTag, _, _}): the reply consumer's tag
    cancels only it; a queue consumer of the channel with the same tag (allowed: the reply consumer is not in
    consumer_mapping) keeps consuming, and a second cancel of the tag cancels it."""
    raw = _raw_channel(broker)
    try:
        raw.send_method(1, commands.Queue.Declare(queue=uid, exclusive=True))
        raw.expect(commands.Queue.DeclareOk)
        raw.send_method(1, commands.Basic.Consume(queue=REPLY_TO, consumer_tag="same", no_ack=True))
        raw.expect(commands.Basic.ConsumeOk)
        raw.send_method(1, commands.Basic.Consume(queue=uid, consumer_tag="same", no_ack=True))
        raw.expect(commands.Basic.ConsumeOk)
        raw.send_method(1, commands.Basic.Cancel(consumer_tag="same"))
        raw.expect(commands.Basic.CancelOk)
        raw.send(publish_frames(1, "", uid, b"still-consumed"))
        assert raw.expect(commands.Basic.Deliver).consumer_tag == "same"
        raw.read_frame(), raw.read_frame()  # (its header and body)
        raw.send_method(1, commands.Basic.Cancel(consumer_tag="same"))
        raw.expect(commands.Basic.CancelOk)
    finally:
        raw.close()


def test_reply_to_unknown_or_gone_consumer(broker) -> None:
    with connect(broker) as client, connect(broker) as server:
        channel = client.channel()
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True, consumer_tag="replies")
        publisher = server.channel()
        publisher.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            publisher.basic_publish("", REPLY_TO + ".no-such-token", b"x", mandatory=True)
        publisher.basic_publish("", REPLY_TO + ".no-such-token", b"x")  # silently dropped
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            publisher.queue_declare(REPLY_TO + ".no-such-token", passive=True)
        assert info.value.reply_code == 404


def test_reply_after_cancel_or_close_is_unroutable(broker, uid: str) -> None:
    with connect(broker) as client, connect(broker) as server:
        channel = client.channel()
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True, consumer_tag="replies")
        server_channel = server.channel()
        server_channel.queue_declare(uid, auto_delete=False)
        channel.basic_publish("", uid, b"req", pika.BasicProperties(reply_to=REPLY_TO))
        _, props, _ = _get(server, server_channel, uid)
        channel.basic_cancel("replies")
        server_channel.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            server_channel.basic_publish("", props.reply_to, b"late", mandatory=True)
        server_channel.queue_delete(uid)


def test_a_mandatory_reply_is_delivered_and_also_returned_and_confirmed(broker, uid: str) -> None:
    """rabbit_exchange:route/2 hands a reply-to key to rabbit_channel:deliver_reply/2 and answers no queue name for
    it, so rabbit_channel:deliver_to_queues/2 sees [] and process_routing_mandatory(true, [], ...) returns the
    reply (312 NO_ROUTE) it delivered; its confirm is an ack at once. A CC of the same key delivers it once."""
    with connect(broker) as client, connect(broker) as server:
        client_channel = client.channel()
        replies: list[bytes] = []
        client_channel.basic_consume(REPLY_TO, lambda ch, m, p, body: replies.append(body), auto_ack=True)
        server_channel = server.channel()
        server_channel.queue_declare(uid, auto_delete=True)
        client_channel.basic_publish("", uid, b"req", pika.BasicProperties(reply_to=REPLY_TO))
        _, props, _ = _get(server, server_channel, uid)
        returned: list[tuple[int | None, str, bytes]] = []
        server_channel.add_on_return_callback(lambda ch, m, p, body: returned.append((m.reply_code, m.reply_text,
                                                                                        body)))
        server_channel.basic_publish("", props.reply_to, b"resp", mandatory=True)
        server_channel.basic_publish("", props.reply_to, b"cc", pika.BasicProperties(headers={"CC": [props.reply_to]}))
        server_channel.confirm_delivery()
        server_channel.basic_publish("", props.reply_to, b"confirmed")  # (acked: no UnroutableError, not mandatory)
        while len(replies) < 3:
            client.process_data_events(0.05)
        server.process_data_events(0.1)
        assert replies == [b"resp", b"cc", b"confirmed"]
        assert returned == [(312, "NO_ROUTE", b"resp")]


async def test_aio_pika_rpc(broker, uid: str) -> None:
    client = await aio_pika.connect(broker.url, timeout=10)
    server = await aio_pika.connect(broker.url, timeout=10)
    async with client, server:
        server_channel = await server.channel()
        requests = await server_channel.declare_queue(uid, auto_delete=True)

        async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            assert message.reply_to is not None  # every request here names its reply queue
            async with message.process():
                await server_channel.default_exchange.publish(
                    aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id),
                    routing_key=message.reply_to)

        await requests.consume(serve)
        client_channel = await client.channel()
        replies = await client_channel.get_queue(REPLY_TO, ensure=False)
        answers: asyncio.Queue = asyncio.Queue()
        await replies.consume(answers.put, no_ack=True)
        for word in ("ping", "pong"):
            await client_channel.default_exchange.publish(
                aio_pika.Message(word.encode(), reply_to=REPLY_TO, correlation_id=word), routing_key=uid)
        got = [await asyncio.wait_for(answers.get(), 10) for _ in range(2)]
        assert [(m.body, m.correlation_id) for m in got] == [(b"PING", "ping"), (b"PONG", "pong")]
