"""Stream consumers over AMQP 1.0 with RabbitMQ 4.1's and 4.2's filters, driven by rabbitmq-amqp-python-client as
its own suite drives RabbitMQ: stream filter values (``rabbitmq:stream-filter``, ``rabbitmq:stream-match-unfiltered``,
the ``x-stream-filter-value`` annotation), property filter expressions (``amqp:properties-filter``,
``amqp:application-properties-filter``) and SQL filter expressions (``amqp:sql-filter``, 4.2); and, with Qpid
Proton, the filters applied echoed in the attach (amqp_filter_sql_SUITE's ``invalid_filter``)."""
from __future__ import annotations

import time
import uuid
from typing import Any

import pika
import pytest

from proton import Described, Message, symbol, ulong
from proton.reactor import Filter
from test_amqp10 import connect, declare, node, url  # noqa: F401  (the node fixture)

client = pytest.importorskip("rabbitmq_amqp_python_client")
from rabbitmq_amqp_python_client import AMQPMessagingHandler  # noqa: E402 (after importorskip)

pytestmark = pytest.mark.timeout(60)
SENT_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


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


def echoed(receiver: Any) -> dict[Any, Any] | None:
    """The filter-set of the node's attach (the filters it applies)."""
    data = receiver.link.remote_source.filter
    data.rewind()
    return data.get_object() if data.next() is not None else None


def described(descriptor: str | int, value: Any) -> Described:
    return Described(symbol(descriptor) if isinstance(descriptor, str) else ulong(descriptor), value)


FIRST = {symbol("from start"): described("rabbitmq:stream-offset-spec", "first")}
SUBJECT = {symbol("props"): described("amqp:properties-filter", {symbol("subject"): "s"})}


@pytest.mark.parametrize("desired, applied", [
    ({symbol("sql-filter"): described("amqp:sql-filter", "@#$%^&")}, {}),  # a lexer error
    ({symbol("sql-filter"): described(0x120, "FALSE FALSE")}, {}),  # a parser error
    ({symbol("sql-filter"): described("apache.org:invalid:string", "TRUE")}, {}),
    ({symbol("sql-filter"): described("amqp:sql-filter", "x" * 4097)}, {}),
    ({symbol("sql-filter"): described("amqp:sql-filter", "k LIKE '%\n'")}, {}),
    ({**SUBJECT, symbol("sql-filter"): described("amqp:sql-filter", "TRUE")},  # exclusive: the later one
     {symbol("sql-filter"): described("amqp:sql-filter", "TRUE")}),
    ({symbol("sql-filter"): described("amqp:sql-filter", "TRUE"), **SUBJECT}, SUBJECT),
    ({**SUBJECT, symbol("props2"): described(0x173, {symbol("subject"): "&p:s"})},  # one per section
     {symbol("props2"): described(0x173, {symbol("subject"): "&p:s"})}),
    ({symbol("f"): described("amqp:properties-filter", {symbol("colour"): "red"})}, {}),
    ({symbol("f"): described("amqp:properties-filter", "subject")}, {}),
    ({symbol("f"): described("amqp:properties-filter", {symbol("subject"): "&x:s"})}, {}),
    ({symbol("f"): described("amqp:application-properties-filter", {1: "x"})}, {}),
    ({symbol("f"): described("rabbitmq:stream-filter", 7)}, {}),
    ({symbol("f"): described("rabbitmq:stream-offset-spec", 1.5)}, {}),
    ({symbol("f"): described("rabbitmq:stream-offset-spec", -1)}, {}),
    ({symbol("f"): described("rabbitmq:stream-match-unfiltered", "yes")}, {}),
    ({symbol("f"): described("unknown:filter", "x")}, {}),
])
def test_filters_not_applied_are_left_out_of_the_attach_which_goes_on(node, desired, applied):  # noqa: F811
    """As RabbitMQ 4.2 answers: the link attaches, its source naming only the filters in place."""
    declare(node, "s", **{"x-queue-type": "stream"}).close()
    connection = connect(node)
    try:
        connection.create_sender("/queues/s").send(Message(body=b"m", subject="s"))
        receiver = connection.create_receiver("/queues/s", options=Filter({**FIRST, **desired}))
        assert echoed(receiver) == {**FIRST, **applied}
        assert receiver.receive(timeout=5).body == b"m"
    finally:
        connection.close()


def test_the_filters_applied_are_echoed_as_they_came(node):  # noqa: F811
    declare(node, "s", **{"x-queue-type": "stream"}).close()
    desired: dict[symbol, Any] = {**FIRST, symbol("bloom"): described("rabbitmq:stream-filter", ["v", "w"]),
               symbol("unfiltered"): described("rabbitmq:stream-match-unfiltered", True),
               symbol("sql-filter"): described("amqp:sql-filter", "p.subject = 's' AND h.priority > 4"),
               symbol("rabbitmq:stream-filter"): "x"}  # (a value not described: its key is its descriptor)
    connection = connect(node)
    try:
        sender = connection.create_sender("/queues/s")
        sender.send(Message(body=b"no", subject="s", priority=9, annotations={"x-stream-filter-value": "z"}))
        sender.send(Message(body=b"yes", subject="s", priority=9))
        receiver = connection.create_receiver("/queues/s", options=Filter(desired))
        assert echoed(receiver) == {**{key: value for key, value in desired.items() if key != "rabbitmq:stream-filter"},
                                    symbol("rabbitmq:stream-filter"): described("rabbitmq:stream-filter", "x")}
        assert receiver.receive(timeout=5).body == b"yes"
        assert echoed(connection.create_receiver("/queues/s", name="plain")) is None  # none asked, none told
    finally:
        connection.close()


def test_sql_filter_reads_the_header_properties_and_application_properties(stream):
    """RabbitMQ's amqp_filter_sql_SUITE ``multiple_sections``, through the client's ``sql`` option."""
    now = time.time()
    publish(stream, [
        {},
        {"priority": 200, "id": "id-999", "user_id": b"guest", "subject": "🐇", "reply_to": "/queues/some%20queue",
         "correlation_id": "corr-123", "content_type": "text/plain", "content_encoding": "some encoding",
         "expiry_time": now + 100, "creation_time": now, "group_id": "my group ID", "group_sequence": 0xFFFFFFFF,
         "reply_to_group_id": "other group ID",
         "application_properties": {"k1": -3, "k2": False, "k3": True, "k4": "hey👋"}},
        {"group_id": "my group ID", "application_properties": {"k1": -4}},
    ])
    assert [offset for offset, _, _ in consume(stream, 2, sql="k1 <= -3")] == [1, 2]
    everything = ("header.priority = 200 AND p.message_id = 'id-999' AND p.user_id = 0x6775657374 AND "
                  "p.to IS NULL AND p.subject = '🐇' AND p.reply_to LIKE '/queues/some=%%' ESCAPE '=' AND "
                  "p.correlation_id IN ('corr-345', 'corr-123') AND "
                  "p.content_type = 'text/plain' AND p.content_encoding = 'some encoding' AND "
                  "p.absolute_expiry_time > UTC() AND p.creation_time > UTC() - 60000 AND "
                  "p.group_id IS NOT NULL AND p.group_sequence = 4294967295 AND "
                  "p.reply_to_group_id = 'other group ID' AND k1 < 0 AND NOT k2 AND k3 AND "
                  "k4 NOT LIKE 'hey' AND k5 IS NULL")
    assert consume(stream, 1, sql=everything)[0][:2] == (1, "m1")
    assert [offset for offset, _, _ in consume(stream, 3, sql="absent IS NULL")] == [0, 1, 2]
    nothing_before(stream, 3, {"application_properties": {"k1": -3}}, sql="k1 = -3 AND h.priority = 4 AND "
                   "p.group_id IS NULL")


def test_sql_filter_and_properties_filter_read_the_properties_section_as_it_came(stream):
    """A ulong or uuid message id is a filter's as it was sent (kept with the message), not the string a 0-9-1
    reader gets."""
    publish(stream, [{"id": ulong(7)}, {"id": ulong(8)}, {"id": SENT_ID}])
    assert [offset for offset, _, _ in consume(stream, 1, sql="p.message_id = 8")] == [1]
    seen = consume(stream, 1, message_properties=client.MessageProperties(message_id=SENT_ID))
    assert [offset for offset, _, _ in seen] == [2]


def test_sql_filter_with_filter_values_and_on_0_9_1_messages(stream, node):  # noqa: F811
    """A SQL filter beside a stream filter (both must match); a 0-9-1 publish's headers are its application
    properties, its priority the header's."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    for i in range(6):
        channel.basic_publish("", "s", f"m{i}".encode(), pika.BasicProperties(
            priority=i, headers={"x-stream-filter-value": "even" if i % 2 == 0 else "odd", "n": i,
                                 "region": "emea" if i < 3 else "us"}))
    connection.close()
    seen = consume(stream, 3, values=["even"], sql="region = 'emea' OR h.priority > 3")
    assert [body for _, body, _ in seen] == ["m0", "m2", "m4"]
    seen = consume(stream, 2, sql="n % 2 = 1 AND region LIKE 'u_'")
    assert [body for _, body, _ in seen] == ["m3", "m5"]


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


def test_application_properties_named_x_stay_application_properties_filters_see(stream, node):  # noqa: F811
    """RabbitMQ 4.2 keeps a 1.0 publish's application properties whatever their names: filters read ``x-`` ones
    (mc:routing_headers(Msg, [])) and a 1.0 reader gets them back as application properties, while an ``x-``
    message annotation is no application property; a 0-9-1 reader gets both as headers (mc_amqpl)."""
    publish(stream, [{"application_properties": {"x-region": "emea", "k": 1}},
                     {"application_properties": {"x-region": "us", "x-basic-type": "t"}},
                     {"annotations": {"x-region": "emea"}}])
    handler = Collect(1)
    assert consume(stream, 1, handler, application_properties={"x-region": "emea"}) == \
        [(0, "m0", {"x-region": "emea", "k": 1})]
    assert "x-region" not in handler.annotations[0]
    seen = consume(stream, 1, sql="[x-region] = 'us' AND a.[x-basic-type] = 't'")
    assert seen == [(1, "m1", {"x-region": "us", "x-basic-type": "t"})]
    assert [offset for offset, _, _ in consume(stream, 2, application_properties={"x-region": None})] == [0, 1]
    nothing_before(stream, 3, {"application_properties": {"x-region": "apj"}}, sql="[x-region] = 'apj'")
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    got: list[Any] = []
    channel.basic_consume("s", lambda ch, method, props, body: got.append((body, props)),
                          arguments={"x-stream-offset": "first"})
    while len(got) < 3:
        connection.process_data_events(time_limit=1)
    connection.close()
    headers = [props.headers or {} for _, props in got]
    assert (headers[0]["x-region"], headers[0]["k"], headers[1]["x-region"], headers[2]["x-region"]) == \
        ("emea", 1, "us", "emea")


def test_an_application_properties_filter_reads_values_as_rabbitmq_compares_them(stream):
    """A null reference matches any value present; a boolean only a boolean (Erlang's ``1 == true`` is false)."""
    publish(stream, [{"application_properties": {"flag": 1}}, {"application_properties": {"flag": True}},
                     {"application_properties": {"flag": None}}, {}])
    assert [offset for offset, _, _ in consume(stream, 1, application_properties={"flag": True})] == [1]
    assert [offset for offset, _, _ in consume(stream, 3, application_properties={"flag": None})] == [0, 1, 2]
    publish(stream, [{"application_properties": {"flag": 1.0}}])
    assert [offset for offset, _, _ in consume(stream, 2, application_properties={"flag": 1})] == [0, 4]


def test_an_encoded_filter_set_reads_back_as_the_filters_it_holds():
    """What a consumer's node tells a stream's owner (``Consumer.filter_set``): the filters, or None for bytes
    that are no filter-set (the owner refuses the consumer then) and for one that filters nothing."""
    from amqp_server.amqp1 import filters
    from stream_log import amqp10
    sql = amqp10.encode_map([(amqp10.symbol("sql-filter"), amqp10.encode(amqp10.Value("described", (
        "amqp:sql-filter", amqp10.Value("string", "TRUE")))))])
    offset_only = amqp10.encode_map([(amqp10.symbol("o"), amqp10.encode(amqp10.Value("described", (
        "rabbitmq:stream-offset-spec", amqp10.Value("string", "first")))))])
    assert filters.decode(sql) is not None
    for wrong in (sql[:-1], sql + b"\x40", b"", b"\xff" * 8, b"\xd1\xff\xff\xff\xff\x00\x00\x00\x10", offset_only):
        assert filters.decode(wrong) is None


def test_only_the_annotation_is_a_filter_value_not_an_application_property_of_its_name(stream):
    """rabbit_stream_queue reads a message's filter value with mc:x_header, which for an AMQP 1.0 message is its
    message annotation only (mc_amqp): an application property named ``x-stream-filter-value`` is none, the
    message unfiltered; the annotation is read beside it."""
    publish(stream, [{"application_properties": {"x-stream-filter-value": "apple"}},
                     {"annotations": {"x-stream-filter-value": "banana"},
                      "application_properties": {"x-stream-filter-value": "apple"}}])
    assert [offset for offset, _, _ in consume(stream, 1, values=["banana"])] == [1]
    assert [offset for offset, _, _ in consume(stream, 1, values=["apple"], match_unfiltered=True)] == [0]
    nothing_before(stream, 2, {"annotations": {"x-stream-filter-value": "apple"}}, values=["apple"])
