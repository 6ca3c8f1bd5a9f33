"""Direct reply-to over AMQP 1.0 (RabbitMQ 4.2): a receiving link with a dynamic source asking for
``rabbitmq:volatile-queue`` is given an address ``/queues/amq.rabbitmq.reply-to.…`` that publishers send to,
driven by rabbitmq-amqp-python-client as its own suite drives RabbitMQ."""
from __future__ import annotations

from typing import Any

import pytest
from proton import Message
from proton.utils import LinkDetached

from test_amqp10 import connect, node, url  # noqa: F401  (the node fixture)
from test_amqp10_filters import Collect, Done

client = pytest.importorskip("rabbitmq_amqp_python_client")

pytestmark = pytest.mark.timeout(60)


def reply_consumer(connection: Any, handler: Any) -> Any:
    options = client.ConsumerOptions(settle_strategy=client.ConsumerSettleStrategy.DirectReplyTo)
    return connection.consumer(None, message_handler=handler, consumer_options=options)


def test_replies_published_to_the_reply_address_reach_its_link(node):  # noqa: F811
    environment = client.Environment(uri=url(node))
    connection = environment.connection()
    connection.dial()
    handler = Collect(10, accept=False)
    consumer = reply_consumer(connection, handler)
    address = consumer.address
    assert address.startswith("/queues/amq.rabbitmq.reply-to.")
    other = environment.connection()
    other.dial()
    publisher = other.publisher(address)
    for i in range(10):
        message = client.Message(body=client.Converter.string_to_bytes(f"reply {i}"), correlation_id=f"c{i}")
        assert publisher.publish(message).remote_state == client.Delivery.ACCEPTED
    with pytest.raises(Done):
        consumer.run()
    assert [body for _, body, _ in handler.seen] == [f"reply {i}" for i in range(10)]
    assert [correlation for _, _, correlation in handler.messages] == [f"c{i}" for i in range(10)]
    publisher.close()
    consumer.close()
    with pytest.raises(Exception, match="amq.rabbitmq.reply-to"):  # its name is gone with its link
        other.publisher(address)
    environment.close()


def test_an_rpc_server_answers_through_the_anonymous_terminus(node):  # noqa: F811
    """The requester's reply address travels as reply-to; the server sends to it with ``to``."""
    environment = client.Environment(uri=url(node))
    connection = environment.connection()
    connection.dial()
    management = connection.management()
    management.declare_queue(client.ClassicQueueSpecification(name="requests"))
    handler = Collect(1, accept=False)
    consumer = reply_consumer(connection, handler)
    requests = connection.publisher(client.AddressHelper.queue_address("requests"))
    request = client.Message(body=client.Converter.string_to_bytes("ping"), reply_to=consumer.address,
                             correlation_id="r1")
    assert requests.publish(request).remote_state == client.Delivery.ACCEPTED
    server = connect(node)
    received = server.create_receiver("/queues/requests").receive(timeout=5)
    assert received.reply_to == consumer.address
    sender = server.create_sender(None)
    sender.send(Message(address=received.reply_to, body=b"pong", correlation_id=received.correlation_id))
    with pytest.raises(Done):
        consumer.run()
    assert (handler.seen[0][1], handler.messages[0][2]) == ("pong", "r1")
    server.close()
    management.close()
    environment.close()


def test_a_reply_address_nobody_holds_is_not_found(node):  # noqa: F811
    connection = connect(node)
    try:
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            connection.create_sender("/queues/amq.rabbitmq.reply-to.nobody")
    finally:
        connection.close()
