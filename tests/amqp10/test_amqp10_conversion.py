"""AMQP 0-9-1 and AMQP 1.0 messages across protocols as RabbitMQ 4.x converts them (mc_amqpl): a 0-9-1 message
reaches an AMQP 1.0 reader with a header section (durable, priority, ttl), ``x-`` headers and the type as message
annotations, app-id as group-id; a 1.0 publish's group-id is a 0-9-1 reader's app-id."""
from __future__ import annotations

import uuid
from typing import Any

import pika
import pytest
from proton import Described, Handler, Message, symbol, ulong
from proton.reactor import Filter

from support import get_within, headers_of
from test_amqp10 import _deaths, connect, declare, node  # noqa: F401  (the node fixture)

pytestmark = pytest.mark.timeout(60)
SENT_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def test_a_091_message_reaches_an_amqp10_reader_as_rabbitmq_4_converts_it(node):  # noqa: F811
    connection = declare(node, "q")
    channel = connection.channel()
    channel.basic_publish("", "q", b"full", pika.BasicProperties(
        delivery_mode=2, priority=4, expiration="60000", type="t", app_id="a", headers={"x-h": "1", "h": 2},
        message_id=SENT_ID.urn, correlation_id="urn:uuid:x"))
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
    assert (full.id, full.correlation_id) == (SENT_ID, "urn:uuid:x")  # (mc_amqpl:convert_to's urn_string_to_uuid)
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


@pytest.mark.parametrize("queue_type", ["classic", "stream"])
def test_an_091_reader_gets_an_amqp10_message_as_rabbitmq_4_shows_it(node, queue_type):  # noqa: F811
    """mc_amqpl:convert_from then protocol_state: no section kept in a header; a uuid message id as its URN, a
    ulong correlation id as its digits, a binary id as the header ``x-message-id``; the ``x-`` annotations and
    the application properties as headers sorted by name; delivery-mode 2 unless the header says ``durable``
    false (Proton leaves it out).  An AMQP 1.0 reader gets the sections as they were sent."""
    connection = declare(node, "q", **{"x-queue-type": queue_type})
    amqp = connect(node)
    sent = [Message(body=b"x", inferred=True, id=SENT_ID, correlation_id=ulong(7), subject="s", address="/to",
                    creation_time=1700000000.987, properties={"x-app": "a", "k": 1, "b": "z"},
                    annotations={"x-ann": "b", "x-basic-type": "t"}),
            Message(body=b"y", inferred=True, id=b"\x01\x02", priority=5)]
    try:
        sender = amqp.create_sender("/queues/q")
        for message in sent:
            sender.send(message)
        receiver = amqp.create_receiver("/queues/q", options=Filter({
            symbol("offset"): Described(symbol("rabbitmq:stream-offset-spec"), "first")})
            if queue_type == "stream" else None)
        got = [receiver.receive(timeout=5) for _ in sent]
        receiver.close()
    finally:
        amqp.close()  # (unsettled: back in the classic queue)
    assert [(m.id, m.correlation_id, m.subject, m.address, m.creation_time, m.properties) for m in got] == [
        (m.id, m.correlation_id, m.subject, m.address, m.creation_time, m.properties) for m in sent]
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    read: list[Any] = []
    channel.basic_consume("q", lambda ch, method, props, body: read.append(props),
                          arguments={"x-stream-offset": "first"} if queue_type == "stream" else None)
    while len(read) < len(sent):
        connection.process_data_events(time_limit=1)
    connection.close()
    first, second = read
    assert (first.message_id, first.correlation_id, first.type, first.delivery_mode, first.timestamp) == (
        SENT_ID.urn, "7", "t", 2, 1700000000)
    offsets = [[("x-stream-offset", i)] if queue_type == "stream" else [] for i in range(2)]
    assert list(first.headers.items()) == [("b", "z"), ("k", 1), ("x-ann", "b"), ("x-app", "a")] + offsets[0]
    assert (second.message_id, list(second.headers.items()), second.priority, second.delivery_mode) == (
        None, [("x-message-id", b"\x01\x02")] + offsets[1], 5, 2)


def _publish(record: bytes) -> Any:
    """A message as an AMQP 1.0 link publishes ``record`` to the queue ``s`` (in process)."""
    from amqp_server.message import encode_route
    from stream_log import amqp10
    message = amqp10.Decoder("", native=True).message(record)
    message.exchange, message.routing_key, message.route = "", "s", encode_route("", "s")
    return message


def test_a_stream_keeps_an_amqp10_message_as_it_came_and_gives_its_sections_back():
    """rabbit_stream_queue: a header section first (durable said, first-acquirer), the message annotations with
    ``x-exchange`` and ``x-routing-key``, delivery annotations left out, then the bare message byte for byte; read
    back, an AMQP 1.0 reader gets the bare message as it came, a 0-9-1 reader mc_amqpl's headers."""
    from stream_log import amqp10
    from stream_log.amqp10 import described, encode_list, encode_map, symbol, utf8
    bare = (described(amqp10.PROPERTIES, encode_list([utf8("id"), b"\x40", utf8("/to"), utf8("subject")]))
            + described(amqp10.APPLICATION_PROPERTIES, encode_map([(utf8("x-k"), b"\x54\x07"), (utf8("a"), b"\x41")])))
    body = b"\x00\x53\x75\xa0\x04body"
    record = (described(amqp10.HEADER, encode_list([b"\x42", b"\x50\x03"]))
              + described(amqp10.DELIVERY_ANNOTATIONS, encode_map([(symbol("d"), b"\x40")]))
              + described(amqp10.MESSAGE_ANNOTATIONS, encode_map([(symbol("x-a"), utf8("b")), (b"\x53\x01", b"\x41")]))
              + bare + body)
    published = _publish(record)
    assert (published.persistent, published.priority, published.properties.message_id) == (False, 3, "id")
    assert list(published.properties.headers.items()) == [("a", 1), ("x-a", "b"), ("x-k", 7)]
    stored = amqp10.entry(published)[4:]
    kept = [(descriptor, amqp10.encode(content)) for descriptor, content, _ in amqp10.sections(stored)]
    assert kept[:2] == [
        (amqp10.HEADER, encode_list([b"\x42", b"\x50\x03", b"\x40", b"\x41"])),
        (amqp10.MESSAGE_ANNOTATIONS, amqp10.encode(amqp10.value_at(encode_map([
            (symbol("x-a"), utf8("b")), (b"\x53\x01", b"\x41"), (symbol("x-exchange"), utf8("")),
            (symbol("x-routing-key"), utf8("s"))]))[0]))]
    assert stored.endswith(bare + body) and len(kept) == 5
    read = amqp10.Decoder("s").message(stored)
    assert (read.exchange, read.routing_key, read.body, read.header) == ("", "s", b"body", published.header)
    envelope, data_head, footer = amqp10.record_parts(read, True)
    assert envelope.endswith(bare) and data_head + read.body == body and footer == b""
    assert [descriptor for descriptor, _, _ in amqp10.sections(envelope)] == [
        amqp10.HEADER, amqp10.MESSAGE_ANNOTATIONS, amqp10.PROPERTIES, amqp10.APPLICATION_PROPERTIES]
    assert amqp10.record_parts(published, True) == (envelope, data_head, footer)


@pytest.mark.parametrize("header, annotations, delivery_mode", [
    (b"", [], 2), (b"\x00\x53\x70\x45", [], 2), (b"\x00\x53\x70\xc0\x02\x01\x41", [], 2),
    (b"\x00\x53\x70\xc0\x02\x01\x42", [], 1), (b"", [("x-basic-delivery-mode", b"\x50\x01")], 1)])
def test_an_amqp10_message_is_durable_unless_it_says_otherwise(header, annotations, delivery_mode):
    """RabbitMQ 4.x: no header, or no ``durable`` in it, is durable (the specification says not); the
    ``x-basic-delivery-mode`` annotation is read only without ``durable``."""
    from stream_log.amqp10 import MESSAGE_ANNOTATIONS, described, encode_map, symbol
    record = header + (described(MESSAGE_ANNOTATIONS, encode_map([(symbol(name), value) for name, value in
                                                                   annotations])) if annotations else b"")
    assert _publish(record + b"\x00\x53\x75\xa0\x01x").properties.delivery_mode == delivery_mode


def test_an_amqp10_message_of_a_body_alone_goes_out_and_into_a_stream():
    """No section before the body (what a raw client such as benchmarks/amqp10_load.py sends)."""
    from stream_log import amqp10
    published = _publish(b"\x00\x53\x75\xa0\x01x")
    parts = amqp10.record_parts(published, True)
    assert [descriptor for descriptor, _, _ in amqp10.sections(parts[0])] == [amqp10.HEADER, amqp10.MESSAGE_ANNOTATIONS]
    read = amqp10.Decoder("s").message(amqp10.entry(published)[4:])
    assert (read.body, read.amqp10 is not None, amqp10.record_parts(read, True)) == (b"x", True, parts)


def test_an_amqp10_user_id_is_checked_even_when_no_0_9_1_reader_could_be_shown_it(node):  # noqa: F811
    """A user-id that is not the user's name is rejected (rabbit_amqp_session's check), one that is no UTF-8 too:
    the 0-9-1 view leaving it out must not let it through."""
    import proton.utils
    connection = declare(node, "q")
    amqp = connect(node)
    try:
        sender = amqp.create_sender("/queues/q")
        for forged in (b"\xffguest", b"other"):
            with pytest.raises(proton.utils.SendException) as rejected:
                sender.send(Message(body=b"x", user_id=forged))
            assert rejected.value.state == proton.Delivery.REJECTED
        sender.send(Message(body=b"x", user_id=b"guest"))
    finally:
        amqp.close()
    _, props, _ = connection.channel().basic_get("q", auto_ack=True)
    connection.close()
    assert props is not None and props.user_id == "guest"


def test_a_dead_letter_whose_deaths_would_pass_the_values_a_reader_decodes_keeps_its_sections():
    """An AMQP 1.0 message with nearly ``MAX_ITEMS`` values is dead-lettered with its sections as they were
    rather than with an ``x-opt-deaths`` that would make it one no AMQP 1.0 reader could decode; a roomier one
    gets its deaths."""
    from amqp_server.broker.dlx_message import dead_letter_message
    from stream_log import amqp10
    from stream_log.amqp10 import described, encode_map, symbol, utf8
    body = b"\x00\x53\x75\xa0\x04body"
    for count, recorded in ((amqp10.MAX_ITEMS // 2 - 4, False), (10, True)):
        annotations = described(amqp10.MESSAGE_ANNOTATIONS,
                                encode_map([(symbol(f"x-{i}"), utf8("v")) for i in range(count)]))
        published = _publish(annotations + body)
        assert published.amqp10 == annotations
        dead = dead_letter_message(published, "s", "rejected", "dlx", None)
        assert dead.body == b"body" and dead.amqp10 is not None and (dead.amqp10 == annotations) is not recorded
        amqp10.sections(dead.amqp10)  # (a reader decodes it)
        assert (b"x-opt-deaths" in dead.amqp10) is recorded


def test_a_modified_outcomes_annotations_merge_into_the_kept_sections_and_the_headers():
    """``amqp10.modified`` (a quorum queue's copies all make the same message of it): an annotation replaces one of
    its name in place and the others are added, in the kept sections as sent and in the 0-9-1 headers; what is no
    map of symbols changes nothing; the body and the original message are untouched."""
    from stream_log import amqp10
    from stream_log.amqp10 import Value, described, encode_map, symbol as sym, utf8

    body = b"\x00\x53\x75\xa0\x04body"
    kept = described(amqp10.MESSAGE_ANNOTATIONS, encode_map([(sym("x-opt-a"), utf8("old")), (sym("x-b"), utf8("b"))]))
    published = _publish(kept + body)
    update = amqp10.encode(Value("map", [(Value("symbol", "x-opt-a"), Value("string", "new")),
                                         (Value("symbol", "x-opt-n"), Value("long", 7))]))
    modified = amqp10.modified(published, update)
    assert modified.amqp10 is not None and modified.body == b"body" and published.amqp10 == kept
    found = amqp10.sections(modified.amqp10)
    assert [(key.value, value.value) for key, value in found[0][1].value] == [("x-opt-a", "new"), ("x-b", "b"),
                                                                             ("x-opt-n", 7)]
    assert (modified.header_value("x-opt-a"), modified.header_value("x-opt-n")) == ("new", 7)
    for malformed in (b"", b"\xff", amqp10.encode(Value("string", "x-opt-a"))):
        same = amqp10.modified(published, malformed)
        assert (same.amqp10, same.header) == (published.amqp10, published.header)


@pytest.mark.parametrize("queue_type", ["classic", "quorum", "stream"])
def test_an_amqp10_publish_with_x_opt_deaths_is_read_over_091_with_x_death(node, queue_type):  # noqa: F811
    """mc_amqpl:convert_from_amqp_deaths: an AMQP 1.0 message's ``x-opt-deaths`` annotation (here a dead letter's,
    sent again as it was received: its maps begin with the ttl, as mc_amqp:encode_deaths writes them) is the
    ``x-death`` header a 0-9-1 reader gets: the one a 0-9-1 reader of the dead letter got."""
    connection = declare(node, "q", **{"x-queue-type": queue_type})
    channel = connection.channel()
    channel.queue_declare("dlq")
    channel.queue_declare("slow", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    amqp = connect(node)
    try:
        amqp.create_sender("/queues/slow").send(Message(body=b"late", inferred=True, ttl=0.05))
        dead = amqp.create_receiver("/queues/dlq", credit=1).receive(timeout=5)
        assert list(_deaths(dead)[0])[0] == "ttl"
        amqp.create_sender("/queues/q").send(Message(body=b"again", inferred=True, annotations=dead.annotations))
    finally:
        amqp.close()  # (unsettled: back in the dlq)
    _, dead_props, body = get_within(channel, "dlq", auto_ack=True)
    assert body == b"late"
    channel.basic_qos(prefetch_count=1)
    read: list[Any] = []
    channel.basic_consume("q", lambda ch, method, props, body: read.append(props),
                          arguments={"x-stream-offset": "first"} if queue_type == "stream" else None)
    while not read:
        connection.process_data_events(time_limit=1)
    connection.close()
    death = headers_of(dead_props)["x-death"]
    assert [entry["original-expiration"] for entry in death] == ["50"]
    assert headers_of(read[0])["x-death"] == death


class _Raw(Message):
    """A message sent as its encoded sections as they are (Proton encodes no footer)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data

    def send(self, sender: Any, tag: Any = None) -> Any:
        delivery = sender.delivery(tag or sender.delivery_tag())
        sender.stream(self.data)
        sender.advance()
        return delivery


class _RawReceiver(Handler):
    """Keeps each transfer's bytes as they came (Proton decodes no footer), leaving it unsettled."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[bytes] = []

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        if delivery.readable and not delivery.partial:
            self.received.append(event.link.recv(delivery.pending))


@pytest.mark.parametrize("queue_type", ["classic", "quorum", "stream"])
def test_a_data_body_s_footer_reaches_an_amqp10_reader_and_not_an_091_one(node, queue_type):  # noqa: F811
    """mc_amqp keeps an AMQP 1.0 message's bare message and footer (bare_and_footer): an AMQP 1.0 reader gets the
    footer after the data body; a 0-9-1 reader gets the body alone (mc_amqpl:convert_from)."""
    from stream_log import amqp10
    footer = amqp10.described(amqp10.FOOTER, amqp10.encode_map([(amqp10.symbol("x-sum"), amqp10.utf8("abc"))]))
    bare = Message(body=b"x", inferred=True, properties={"k": 1}).encode()
    connection = declare(node, "q", **{"x-queue-type": queue_type})
    amqp = connect(node)
    try:
        amqp.create_sender("/queues/q").send(_Raw(bare + footer))
        raw = _RawReceiver()
        receiver = amqp.create_receiver("/queues/q", handler=raw, options=Filter({
            symbol("offset"): Described(symbol("rabbitmq:stream-offset-spec"), "first")})
            if queue_type == "stream" else None)
        amqp.wait(lambda: bool(raw.received), timeout=5)
        receiver.close()
    finally:
        amqp.close()  # (unsettled: back in the queue)
    got = Message()
    got.decode(raw.received[0])
    assert raw.received[0].endswith(b"\x00\x53\x75\xa0\x01x" + footer)
    assert (got.body, got.properties) == (b"x", {"k": 1})
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)
    read: list[Any] = []
    channel.basic_consume("q", lambda ch, method, props, body: read.append((props.type, body)),
                          arguments={"x-stream-offset": "first"} if queue_type == "stream" else None)
    while not read:
        connection.process_data_events(time_limit=1)
    connection.close()
    assert read == [(None, b"x")]


@pytest.mark.parametrize("kept", [True, False], ids=["amqp10", "converted"])
def test_a_large_record_s_head_and_footer_convert_as_the_whole_record_its_body_left_where_it_lies(kept):
    """``Decoder.head``: the sections of a large record before its binary data body, and the footer after it if
    any (read from the record as asked, nothing else), convert as the whole record does, the body left where it
    lies and its place told; a record whose body is more than one data section, or whose footer is larger than
    ``FOOTER_MAX``, is read whole (None).  ``kept``: a record that starts with a header section (an AMQP 1.0
    message as a stream keeps it, its sections and footer kept with it)."""
    from stream_log import amqp10
    from stream_log.amqp10 import described, encode_list, encode_map, symbol as sym, utf8

    body = bytes(range(256)) * 1200
    prefix = ((described(amqp10.HEADER, encode_list([b"\x41"])) if kept else b"")
              + described(amqp10.MESSAGE_ANNOTATIONS, encode_map([(sym("x-a"), utf8("b"))]))
              + described(amqp10.PROPERTIES, encode_list([utf8("id")]))
              + described(amqp10.APPLICATION_PROPERTIES, encode_map([(utf8("k"), utf8("v"))])))
    data = b"\x00\x53\x75\xb0" + len(body).to_bytes(4, "big") + body
    footer = described(amqp10.FOOTER, encode_map([(sym("x-sum"), utf8("abc"))]))
    reads: list[int] = []

    def head(record: bytes) -> Any:
        def read(pos: int, size: int) -> bytes:
            reads.append(size)
            return record[pos:pos + size]
        return amqp10.Decoder("s").head(record[:64 << 10], len(record), read)

    for record in (prefix + data, prefix + data + footer):
        whole = amqp10.Decoder("s").message(record)
        found = head(record)
        assert found is not None
        message, body_at = found
        assert message.body is None and record[body_at:body_at + message.body_size] == whole.body == body
        assert (message.exchange, message.routing_key, message.route, message.header, message.amqp10) == (
            whole.exchange, whole.routing_key, whole.route, whole.header, whole.amqp10)
        assert (message.amqp10 is not None and message.amqp10.endswith(footer)) == (kept and record.endswith(footer))
    assert reads == [len(footer)]
    large_footer = described(amqp10.FOOTER, encode_map([(sym("x-sum"), utf8("f" * amqp10.FOOTER_MAX))]))
    assert head(prefix + data + b"\x00\x53\x75\xa0\x01x" + footer) is None
    assert head(prefix + data + large_footer) is None


def test_a_data_body_s_footer_stays_through_a_dead_letter_and_a_modified_outcome():
    """The footer kept with an AMQP 1.0 message's sections stays after them when its annotations change."""
    from amqp_server.broker.dlx_message import dead_letter_message
    from stream_log import amqp10
    from stream_log.amqp10 import Value, described, encode_map, symbol as sym, utf8

    footer = described(amqp10.FOOTER, encode_map([(sym("x-sum"), utf8("abc"))]))
    published = _publish(b"\x00\x53\x75\xa0\x04body" + footer)
    update = amqp10.encode(Value("map", [(Value("symbol", "x-opt-a"), Value("string", "new"))]))
    for message in (published, dead_letter_message(published, "s", "rejected", "dlx", None),
                    amqp10.modified(published, update)):
        assert message.body == b"body" and amqp10.record(message, True).endswith(b"body" + footer)
