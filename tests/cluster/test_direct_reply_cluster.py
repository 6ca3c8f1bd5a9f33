"""Direct reply-to (``amq.rabbitmq.reply-to``) across the nodes of a cluster: a reply published through any node
reaches the requesting channel, as RabbitMQ's rabbit_channel:deliver_reply/2 hands it to the channel its name
carries, on whatever node; it routes to no queue there either (confirmed at once, returned 312 if mandatory)."""
from __future__ import annotations

from typing import Iterator

import pika
import pika.exceptions
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import CLUSTER, BrokerProcess, starts
from test_cluster import Etcd, connect, pump, three_nodes, wait_for

pytestmark = pytest.mark.timeout(120)
REPLY_TO = "amq.rabbitmq.reply-to"


@pytest.fixture(scope="module")
@starts(CLUSTER)
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    started: tuple[Etcd, list[BrokerProcess]]
    with three_nodes(tmp_path_factory.mktemp("reply-cluster")) as started:
        yield started[1]


def requested(server: pika.BlockingConnection, queue: str) -> tuple[str, str | None]:
    """The reply-to and correlation id of the request the server takes from ``queue`` (it may take a moment to
    cross the nodes)."""
    channel = server.channel()
    got: list[pika.BasicProperties] = []

    def take() -> bool:
        method, props, _ = channel.basic_get(queue, auto_ack=True)
        if method is not None and props is not None:
            got.append(props)
        return bool(got)

    wait_for(take, "the request reaches the server")
    channel.close()
    reply_to = got[0].reply_to
    assert reply_to is not None
    return reply_to, got[0].correlation_id


def returned(channel, name: str, body: bytes) -> tuple[int, str]:
    """Publish a mandatory reply on a confirming channel: its basic.return (code, text), which pika raises with the
    confirm once the broker acked the publish (a nack would raise NackError)."""
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        channel.basic_publish("", name, body, pika.BasicProperties(correlation_id="c"), mandatory=True)
    method = info.value.messages[0].method
    return method.reply_code or 0, method.reply_text


def test_a_reply_through_another_node_reaches_the_requester_and_is_confirmed(nodes, uid):
    """RPC client on node 1, server on node 2 replying through node 2: the reply is delivered to the client as it
    would be on one node; the server's channel gets its confirm (an ack: the reply routes to no queue, so a
    mandatory one is also returned 312 NO_ROUTE, as rabbit_exchange:route/2 answers no queue for it); a passive
    declare of the reply name through node 2 finds the consumer (rabbit_channel's declare_fast_reply_to calls the
    channel on its node)."""
    n1, n2, _ = nodes
    with connect(n1) as client, connect(n2) as server:
        server.channel().queue_declare(uid, auto_delete=False)
        wait_for(lambda: client.channel().queue_declare(uid, passive=True), "the queue is known on node 1")
        client_channel = client.channel()
        replies: list[tuple] = []
        client_channel.basic_consume(REPLY_TO, lambda ch, m, p, b: replies.append((m, p, b)), auto_ack=True)
        client_channel.basic_publish("", uid, b"request", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="7"))
        name, correlation_id = requested(server, uid)
        assert name.startswith(REPLY_TO + ".") and correlation_id == "7"
        replying = server.channel()
        assert replying.queue_declare(name, passive=True).method.consumer_count == 1
        replying.confirm_delivery()
        replying.basic_publish("", name, b"reply", pika.BasicProperties(correlation_id="7"))  # acked, or it raises
        assert returned(replying, name, b"mandatory reply") == (312, "NO_ROUTE")
        pump(client, lambda: len(replies) == 2)
        assert [(m.exchange, m.routing_key, m.redelivered, p.correlation_id, b) for m, p, b in replies] == [
            ("", name, False, "7", b"reply"), ("", name, False, "c", b"mandatory reply")]
        server.channel().queue_delete(uid)


def test_a_reply_to_a_gone_requester_through_another_node_is_returned_and_reaches_no_one(nodes, uid):
    """The requesting channel closed: a passive declare of its reply name through another node is 404, and a
    mandatory reply through that node is confirmed and returned 312 NO_ROUTE (rabbit_channel:deliver_reply_local
    drops it: the channel is in no group); the requester's other channels get nothing.  A name made up from a live
    one (its token changed) reaches no one either: only the whole name finds a consumer."""
    n1, n2, _ = nodes
    with connect(n1) as client, connect(n2) as server:
        server.channel().queue_declare(uid)
        wait_for(lambda: client.channel().queue_declare(uid, passive=True), "the queue is known on node 1")
        requester = client.channel()
        requester.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
        requester.basic_publish("", uid, b"request", pika.BasicProperties(reply_to=REPLY_TO))
        name, _ = requested(server, uid)
        other = client.channel()
        replies: list[bytes] = []
        other.basic_consume(REPLY_TO, lambda ch, m, p, b: replies.append(b), auto_ack=True)
        other.basic_publish("", uid, b"request", pika.BasicProperties(reply_to=REPLY_TO))
        live, _ = requested(server, uid)
        requester.close()
        replying = server.channel()
        replying.confirm_delivery()
        assert returned(replying, name, b"to no one") == (312, "NO_ROUTE")
        forged = live[:-4] + ("AAAA" if not live.endswith("AAAA") else "BBBB")
        assert returned(replying, forged, b"forged") == (312, "NO_ROUTE")
        replying.basic_publish("", live, b"to the live one")
        pump(client, lambda: bool(replies))
        assert replies == [b"to the live one"]
        with pytest.raises(ChannelClosedByBroker) as info:
            server.channel().queue_declare(name, passive=True)
        assert (info.value.reply_code, info.value.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")
        server.channel().queue_delete(uid)


def test_an_amqp10_reply_link_on_one_node_gets_replies_sent_through_another(nodes):
    """An AMQP 1.0 direct reply-to link (RabbitMQ 4.2's volatile queue) on node 1: a 0-9-1 reply through node 2
    reaches it and is routed as to a queue (a mandatory one is not returned; it is confirmed), an AMQP 1.0 sender
    through node 2 attaches to its address (node 1 is asked) and sends to it, and so does the anonymous terminus
    with the address as ``to``; an address of node 1 that no link holds there is not found."""
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    from proton import Message
    from proton.utils import BlockingConnection, LinkDetached
    from test_amqp10_filters import Collect, Done

    n1, n2, _ = nodes
    environment = client.Environment(uri=f"amqp://guest:guest@127.0.0.1:{n1.port}")
    try:
        connection = environment.connection()
        connection.dial()
        handler = Collect(3, accept=False)
        options = client.ConsumerOptions(settle_strategy=client.ConsumerSettleStrategy.DirectReplyTo)
        consumer = connection.consumer(None, message_handler=handler, consumer_options=options)
        address = consumer.address
        name = address.removeprefix("/queues/")
        with connect(n2) as server:
            channel = server.channel()
            channel.confirm_delivery()
            channel.basic_publish("", name, b"from 0-9-1", pika.BasicProperties(correlation_id="a"), mandatory=True)
        sender_side = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{n2.port}", timeout=10,
                                         allowed_mechs="PLAIN")
        try:
            sender = sender_side.create_sender(address)
            sender.send(Message(body=b"from 1.0", correlation_id="b"))
            sender_side.create_sender(None).send(Message(address=address, body=b"to", correlation_id="c"))
            with pytest.raises(Done):
                consumer.run()
            assert [(correlation, body) for (_, _, correlation), (_, body, _) in
                    zip(handler.messages, handler.seen)] == [("a", "from 0-9-1"), ("b", "from 1.0"), ("c", "to")]
            made_up = address[:-4] + ("AAAA" if not address.endswith("AAAA") else "BBBB")
            with pytest.raises(LinkDetached, match="amqp:not-found"):
                sender_side.create_sender(made_up)
        finally:
            sender_side.close()
        consumer.close()
    finally:
        environment.close()
