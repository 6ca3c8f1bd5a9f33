"""The ``x-local-random`` exchange type (RabbitMQ 4.0): declared over AMQP 0-9-1 and through the AMQP 1.0
/management node, each message to one local classic queue picked at random, bindings refused in RabbitMQ's words."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pika
import pika.exceptions
import pytest

from exchanges import LocalRandomExchange, exchange_class
from test_amqp10 import node, url  # noqa: F401  (the node fixture)

pytestmark = pytest.mark.timeout(60)


def channel_of(node: Any) -> tuple[pika.BlockingConnection, Any]:  # noqa: F811
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    return connection, connection.channel()


def test_each_message_goes_to_one_bound_queue_picked_at_random(node):  # noqa: F811
    connection, channel = channel_of(node)
    channel.exchange_declare("rpc", "x-local-random", durable=True)
    names = [f"worker-{i}" for i in range(3)]
    for name in names:
        channel.queue_declare(name)
        channel.queue_bind(name, "rpc", "")
    channel.confirm_delivery()
    for i in range(300):
        channel.basic_publish("rpc", "any key", f"{i}".encode(), mandatory=True)
    got: Counter[str] = Counter()
    bodies: list[bytes] = []
    for name in names:
        while (message := channel.basic_get(name, auto_ack=True))[0] is not None:
            got[name] += 1
            bodies.append(message[2])
    assert sorted(bodies, key=int) == [f"{i}".encode() for i in range(300)]  # each message to exactly one
    assert all(got[name] > 30 for name in names), got  # (300 picks of 3: below 31 is about 1 in 10^13)
    connection.close()


def test_with_no_bound_queue_a_mandatory_message_is_returned(node):  # noqa: F811
    connection, channel = channel_of(node)
    channel.exchange_declare("rpc", "x-local-random")
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("rpc", "", b"nobody", mandatory=True)
    connection.close()


@pytest.mark.parametrize("bind, reply", [
    (lambda ch: ch.queue_bind("classic", "rpc", "key"), "Non empty binding 'key' key not permitted"),
    (lambda ch: ch.queue_bind("quorum", "rpc", ""), "Queue type rabbit_quorum_queue not valid for this exchange type"),
    (lambda ch: ch.queue_bind("stream", "rpc", ""), "Queue type rabbit_stream_queue not valid for this exchange type"),
    (lambda ch: ch.exchange_bind("amq.fanout", "rpc"), "Destination not found"),
])
def test_bindings_it_cannot_take_are_refused_as_rabbitmq_refuses_them(node, bind, reply):  # noqa: F811
    connection, channel = channel_of(node)
    channel.exchange_declare("rpc", "x-local-random")
    channel.queue_declare("classic")
    channel.queue_declare("quorum", durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_declare("stream", durable=True, arguments={"x-queue-type": "stream"})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        bind(channel)
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == f"PRECONDITION_FAILED - {reply}"
    connection.close()


class Proxy:
    """A classic queue as the exchange sees it: its type and whether it is this node's (``local()``)."""

    type = SimpleNamespace(name="classic", capabilities=frozenset({"unreplicated"}))

    def __init__(self, remote: bool) -> None:
        self.remote = remote

    def local(self) -> "Proxy | None":
        return None if self.remote else self


def test_queues_another_node_holds_are_never_picked():
    """In a cluster a queue whose home is another node is a proxy here (its ``local()`` is None): never picked."""
    assert exchange_class("x-local-random") is LocalRandomExchange
    exchange = LocalRandomExchange("rpc")
    local = Proxy(remote=False)
    remotes = [Proxy(remote=True) for _ in range(5)]
    for queue in remotes:
        exchange.bind(queue, "")
    assert not exchange.route("", None)
    exchange.bind(local, "")
    assert all(list(exchange.route("", None)) == [local] for _ in range(50))
    exchange.unbind(local, "")
    assert not exchange.route("", None)


def test_the_rabbitmq_amqp10_client_declares_one_and_publishes_through_it(node):  # noqa: F811
    client = pytest.importorskip("rabbitmq_amqp_python_client")
    environment = client.Environment(uri=url(node))
    connection = environment.connection()
    connection.dial()
    management = connection.management()
    management.declare_exchange(client.ExchangeCustomSpecification(name="rpc", exchange_type="x-local-random"))
    management.declare_queue(client.ClassicQueueSpecification(name="requests"))
    management.bind(client.ExchangeToQueueBindingSpecification(source_exchange="rpc", destination_queue="requests"))
    publisher = connection.publisher(client.AddressHelper.exchange_address("rpc"))
    for i in range(3):
        status = publisher.publish(client.Message(body=client.Converter.string_to_bytes(f"request {i}")))
        assert status.remote_state == client.Delivery.ACCEPTED
    publisher.close()
    assert management.queue_info("requests").message_count == 3
    management.close()
    environment.close()
