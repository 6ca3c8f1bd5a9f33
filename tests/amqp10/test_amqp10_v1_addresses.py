"""RabbitMQ 3.x's v1 addresses that declare, as RabbitMQ 4.x still serves them (rabbit_amqp_session's
``ensure_terminus``): ``/queue/:queue`` declares the queue it names, as a source or a target; the sources
``/exchange/:exchange/:key`` and ``/topic/:key`` consume from a new server-named queue bound there.  Driven by
Qpid Proton's blocking API, as a 3.x application would."""
from __future__ import annotations

from typing import Any

import pika
import pytest
from proton import Link, Message, Terminus
from proton.reactor import LinkOption
from proton import Timeout
from proton.utils import BlockingConnection, LinkDetached

from amqp_server.access_control import Permissions
from test_amqp10 import Running, connect, declare, node, url  # noqa: F401  (the node fixture)

pytestmark = pytest.mark.timeout(60)


class Durable(LinkOption):
    """The terminus the node declares from asks for configuration durability."""

    def apply(self, link: Link) -> None:
        terminus = link.source if link.is_receiver else link.target
        terminus.durability = Terminus.CONFIGURATION


def queues(running: Running) -> dict[str, Any]:
    """The vhost's queues by name, read on the node's loop."""
    assert running.node is not None
    broker = running.node.broker
    return dict(running.call(lambda: broker.vhosts["/"].queues))


def test_an_exchange_source_consumes_from_a_new_queue_bound_with_its_key(node):  # noqa: F811
    connection = connect(node)
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    try:
        receiver = connection.create_receiver("/exchange/amq.topic/orders.*")
        made = [name for name in queues(node) if name.startswith("amq.gen-")]
        assert len(made) == 1
        assert not queues(node)[made[0]].durable  # the terminus asked for no durability
        channel = publisher.channel()
        channel.basic_publish("amq.topic", "orders.new", b"an order")
        channel.basic_publish("amq.topic", "invoices.new", b"not for this link")
        message = receiver.receive(timeout=5)
        receiver.accept()
        assert message.body == b"an order"
        with pytest.raises(Timeout):  # bound with the link's key, and that one only
            receiver.receive(timeout=0.5)
        topic = connection.create_receiver("/topic/invoices.#", options=Durable())
        channel.basic_publish("amq.topic", "invoices.new", b"an invoice")
        assert topic.receive(timeout=5).body == b"an invoice"
        topic.accept()
        durable = [queue for name, queue in queues(node).items() if name.startswith("amq.gen-") and name != made[0]]
        assert len(durable) == 1 and durable[0].durable
    finally:
        publisher.close()
        connection.close()


def round_trip(connection: BlockingConnection, address: str, body: str) -> Any:
    """Send ``body`` to ``address`` and take it back from the same address: what came."""
    connection.create_sender(address).send(Message(body=body))
    receiver = connection.create_receiver(address)
    got = receiver.receive(timeout=5).body
    receiver.accept()
    return got


def test_a_queue_address_declares_the_queue_as_a_source_and_as_a_target(node):  # noqa: F811
    connection = connect(node)
    try:
        assert round_trip(connection, "/queue/made-by-sender", "kept") == "kept"
        connection.create_receiver("/queue/made-by-receiver", options=Durable())
        made = queues(node)
        assert not made["made-by-sender"].durable and made["made-by-receiver"].durable
        assert made["made-by-receiver"].type.name == "classic"
    finally:
        connection.close()


def test_a_queue_that_exists_is_taken_as_it_is(node):  # noqa: F811
    declare(node, "kept", **{"x-queue-type": "quorum", "x-max-length": 10}).close()
    connection = connect(node)
    try:
        assert round_trip(connection, "/queue/kept", "into the quorum queue") == "into the quorum queue"
        assert queues(node)["kept"].type.name == "quorum"
    finally:
        connection.close()


def test_an_exchange_source_on_a_missing_exchange_is_refused_and_declares_nothing(node):  # noqa: F811
    connection = connect(node)
    try:
        with pytest.raises(LinkDetached) as refused:
            connection.create_receiver("/exchange/missing/key")
        assert "amqp:not-found" in str(refused.value)
        assert "no exchange 'missing' in vhost '/'" in str(refused.value)
        assert not [name for name in queues(node) if name.startswith("amq.gen-")]
        receiver = connection.create_receiver("/topic/still.served")  # the session carries on
        assert receiver is not None
    finally:
        connection.close()


def test_declaring_needs_the_users_configure_permission(node):  # noqa: F811
    assert node.node is not None
    broker = node.node.broker
    node.call(lambda: broker.access.add_user("reader", "secret"))
    node.call(lambda: broker.access.set_permissions("/", "reader", Permissions(configure="^$")))
    connection = BlockingConnection(url(node, "reader", "secret"), timeout=10, allowed_mechs="PLAIN")
    try:
        with pytest.raises(LinkDetached) as refused:
            connection.create_receiver("/queue/not-mine")
        assert "amqp:unauthorized-access" in str(refused.value)
        assert "access to queue 'not-mine' in vhost '/' refused for user 'reader'" in str(refused.value)
        with pytest.raises(LinkDetached):
            connection.create_receiver("/topic/anything")
        assert "not-mine" not in queues(node)
        assert not [name for name in queues(node) if name.startswith("amq.gen-")]
    finally:
        connection.close()


def test_the_vhosts_queue_limit_refuses_a_declaring_address_with_resource_limit_exceeded(node):  # noqa: F811
    """rabbit_amqp_session ``declare_queue`` turns the queue type's queue_limit_exceeded into
    amqp:resource-limit-exceeded (it was amqp:precondition-failed, 0-9-1's 406), in the same words."""
    assert node.node is not None
    broker = node.node.broker
    node.call(lambda: broker.access.set_limits("vhost_limits", "/", {"max-queues": 0}))
    connection = connect(node)
    try:
        with pytest.raises(LinkDetached) as refused:
            connection.create_receiver("/queue/over")
        assert "amqp:resource-limit-exceeded" in str(refused.value)
        assert "cannot declare queue 'over': queue limit in vhost '/' (0) is reached" in str(refused.value)
    finally:
        connection.close()
    assert "over" not in queues(node)
    channel = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port)).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:  # 0-9-1 still gets its 406
        channel.queue_declare("over")
    assert closed.value.reply_code == 406
