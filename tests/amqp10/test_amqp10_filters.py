"""Stream consumers over AMQP 1.0 with RabbitMQ 4.1's filters, driven by rabbitmq-amqp-python-client as its own
suite drives RabbitMQ: stream filter values (``rabbitmq:stream-filter``, ``rabbitmq:stream-match-unfiltered``,
the ``x-stream-filter-value`` annotation) and property filter expressions (``amqp:properties-filter``,
``amqp:application-properties-filter``)."""
from __future__ import annotations

from typing import Any

import pytest

from proton import Described, Message, symbol
from proton.reactor import Filter
from proton.utils import LinkDetached
from test_amqp10 import connect, declare, node, url  # noqa: F401  (the node fixture)

client = pytest.importorskip("rabbitmq_amqp_python_client")
from rabbitmq_amqp_python_client import AMQPMessagingHandler  # noqa: E402 (after importorskip)

pytestmark = pytest.mark.timeout(60)


class Done(Exception):
    pass


class Collect(AMQPMessagingHandler):
    """Keeps (offset, body, application properties) of each message, and accepts it unless it came settled,
    until it has ``wanted``."""

    def __init__(self, wanted: int, accept: bool = True) -> None:
        super().__init__()
        self.wanted = wanted
        self.accepts = accept  # (not ``accept``: that is the handler's method)
        self.seen: list[tuple[int | None, str, Any]] = []
        self.annotations: list[dict[str, Any]] = []
        self.messages: list[tuple[Any, Any, Any]] = []  # (subject, group-id, correlation-id)

    def on_amqp_message(self, event: Any) -> None:
        message = event.message
        self.annotations.append(dict(message.annotations))
        self.messages.append((message.subject, message.group_id, message.correlation_id))
        self.seen.append(((message.annotations or {}).get("x-stream-offset"),
                          client.Converter.bytes_to_string(message.body), message.application_properties))
        if self.accepts:
            self.delivery_context.accept(event)
        if len(self.seen) == self.wanted:
            raise Done


@pytest.fixture
def stream(node):  # noqa: F811
    environment = client.Environment(uri=url(node))
    connection = environment.connection()
    connection.dial()
    management = connection.management()
    management.declare_queue(client.StreamSpecification(name="s"))
    yield connection
    management.close()
    environment.close()


def publish(connection: Any, messages: list[dict[str, Any]]) -> None:
    publisher = connection.publisher(client.AddressHelper.queue_address("s"))
    for i, fields in enumerate(messages):
        status = publisher.publish(client.Message(body=client.Converter.string_to_bytes(f"m{i}"), **fields))
        assert status.remote_state == client.Delivery.ACCEPTED
    publisher.close()


def consume(connection: Any, wanted: int, handler: Collect | None = None,
            **filters: Any) -> list[tuple[int | None, str, Any]]:
    handler = handler or Collect(wanted)
    options = client.StreamConsumerOptions(client.OffsetSpecification.first, client.StreamFilterOptions(**filters))
    consumer = connection.consumer(client.AddressHelper.queue_address("s"), message_handler=handler,
                                   consumer_options=options)
    with pytest.raises(Done):
        consumer.run()
    consumer.close()
    return handler.seen


def nothing_before(connection: Any, published: int, sentinel: dict[str, Any], **filters: Any) -> None:
    """None of the ``published`` messages matches: one that does, published now, is the first delivered."""
    publish(connection, [sentinel])
    assert consume(connection, 1, **filters)[0][0] == published


def test_filter_values_deliver_only_the_messages_annotated_with_one_of_them(stream):
    publish(stream, [{"annotations": {"x-stream-filter-value": "apple"}}] * 5
            + [{"annotations": {"x-stream-filter-value": "banana"}}] * 5 + [{}] * 2)
    seen = consume(stream, 5, values=["banana"])
    assert [(offset, body) for offset, body, _ in seen] == [(i, f"m{i}") for i in range(5, 10)]
    seen = consume(stream, 7, values=["banana"], match_unfiltered=True)  # and those without a value
    assert [offset for offset, _, _ in seen] == [5, 6, 7, 8, 9, 10, 11]
    seen = consume(stream, 10, values=["apple", "banana"])
    assert [offset for offset, _, _ in seen] == list(range(10))
    nothing_before(stream, 12, {"annotations": {"x-stream-filter-value": "cherry"}}, values=["cherry"])


def test_application_properties_filter_matches_values_prefixes_and_suffixes(stream):
    publish(stream, [{"application_properties": {"key": f"value_{i}", "n": i, "region": "emea" if i % 2 else "us"}}
                     for i in range(20)])
    seen = consume(stream, 1, application_properties={"key": "value_17"})
    assert seen == [(17, "m17", {"key": "value_17", "n": 17, "region": "emea"})]
    seen = consume(stream, 2, application_properties={"key": "&p:value_1", "region": "&s:ea"})
    assert [offset for offset, _, _ in seen] == [1, 11]
    seen = consume(stream, 1, application_properties={"n": 4})
    assert [offset for offset, _, _ in seen] == [4]
    nothing_before(stream, 20, {"application_properties": {"absent": "x"}}, application_properties={"absent": "x"})


def test_properties_filter_matches_the_properties_a_message_keeps(stream):
    publish(stream, [{"id": f"id-{i}", "correlation_id": f"c{i % 3}", "content_type": "text/plain"}
                     for i in range(9)])
    seen = consume(stream, 3, message_properties=client.MessageProperties(correlation_id="c1"))
    assert [offset for offset, _, _ in seen] == [1, 4, 7]
    seen = consume(stream, 1, message_properties=client.MessageProperties(message_id="id-5",
                                                                          content_type="text/plain"))
    assert [offset for offset, _, _ in seen] == [5]
    seen = consume(stream, 1, message_properties=client.MessageProperties(message_id="&s:-8"))
    assert [offset for offset, _, _ in seen] == [8]
    nothing_before(stream, 9, {"correlation_id": "c1", "content_type": "text/html"},
                   message_properties=client.MessageProperties(correlation_id="c1", content_type="text/html"))


def test_properties_filter_reads_every_property_the_publish_had(stream):
    publish(stream, [{"subject": f"important_{i}", "group_id": f"group_{i}"} for i in range(30)])
    handler = Collect(1)
    seen = consume(stream, 1, handler, message_properties=client.MessageProperties(subject="important_15",
                                                                                   group_id="group_15"))
    assert seen[0][:2] == (15, "m15")
    assert handler.messages[0][:2] == ("important_15", "group_15")  # the properties section goes out as it came
    seen = consume(stream, 3, message_properties=client.MessageProperties(subject="&s:5", group_id="&p:group_"))
    assert [offset for offset, _, _ in seen] == [5, 15, 25]


@pytest.mark.parametrize("descriptor, value, refusal", [
    ("amqp:properties-filter", {symbol("colour"): "red"}, "'colour', not a field of properties"),
    ("amqp:properties-filter", "subject", "amqp:properties-filter must be a map"),
    ("amqp:application-properties-filter", {1: "x"}, "keys must be strings"),
    ("rabbitmq:stream-filter", 7, "must be a string or a list of strings"),
    ("rabbitmq:stream-offset-spec", 1.5, "bad rabbitmq:stream-offset-spec of type double"),
])
def test_a_filter_that_is_not_one_refuses_the_attach(node, descriptor, value, refusal):  # noqa: F811
    declare(node, "s", **{"x-queue-type": "stream"}).close()
    connection = connect(node)
    try:
        wanted = Filter({symbol("f"): Described(symbol(descriptor), value)})
        with pytest.raises(LinkDetached, match=f"amqp:invalid-field.*{refusal}"):
            connection.create_receiver("/queues/s", options=wanted)
    finally:
        connection.close()


def test_the_properties_amqp_091_has_no_room_for_survive_a_classic_queue(node):  # noqa: F811
    declare(node, "q").close()
    connection = connect(node)
    try:
        connection.create_sender("/queues/q").send(Message(body=b"x", subject="s", group_id="g", id="m-1",
                                                           reply_to_group_id="r", group_sequence=7))
        got = connection.create_receiver("/queues/q").receive(timeout=5)
        assert (got.subject, got.group_id, got.id, got.reply_to_group_id, got.group_sequence) == \
            ("s", "g", "m-1", "r", 7)
    finally:
        connection.close()


def test_annotations_come_back_as_annotations_with_the_offset(stream):
    """x- message annotations stay annotations (RabbitMQ 4.x's conversion), and a stream adds x-stream-offset."""
    publish(stream, [{"annotations": {"x-stream-filter-value": "v", "x-opt-n": 5},
                      "application_properties": {"k": "v"}},
                     {"annotations": {"x-stream-filter-value": "v", "x-opt-n": 6, "x-opt-long": "y" * 300}}])
    handler = Collect(2)
    assert consume(stream, 2, handler, values=["v"]) == [(0, "m0", {"k": "v"}), (1, "m1", None)]
    first, second = handler.annotations
    assert (first["x-stream-filter-value"], first["x-opt-n"], first["x-stream-offset"]) == ("v", 5, 0)
    assert (second["x-opt-n"], second["x-opt-long"], second["x-stream-offset"]) == (6, "y" * 300, 1)  # (a map32)
