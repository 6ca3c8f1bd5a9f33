"""The property block on the bytes (amqp_server/framing/properties.py) agrees with pamqp's codec, and refuses what
RabbitMQ cannot decode."""
from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp.header import ContentHeader

from amqp_server.framing import codec, properties

short = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20).filter(
    lambda s: len(s.encode()) < 256)
PROPERTY_VALUES = {
    "content_type": short, "content_encoding": short, "correlation_id": short, "reply_to": short,
    "expiration": short, "message_id": short, "message_type": short, "user_id": short, "app_id": short,
    "headers": st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-2 ** 31, 2 ** 31 - 1), short,
                                                               st.booleans()), max_size=4),
    "delivery_mode": st.integers(1, 2), "priority": st.integers(0, 255),
    "timestamp": st.integers(0, 2 ** 31).map(lambda s: datetime.datetime.fromtimestamp(s, datetime.timezone.utc)),
}


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional=PROPERTY_VALUES))
def test_decode_read_and_replace_agree_with_pamqp(chosen):
    header = ContentHeader(0, 5, commands.Basic.Properties(**chosen)).marshal()
    properties.check(header)
    decoded = properties.decode(header)
    chosen = {name: value for name, value in chosen.items() if value != ""}  # pamqp leaves empty strings out
    for _, name, kind in properties.FIELDS:
        got, want = getattr(decoded, name), chosen.get(name)
        if kind == "T" and got is not None:
            got = datetime.datetime.fromtimestamp(got, datetime.timezone.utc)
        assert got == want, name
    for flag, name, kind in properties.FIELDS:
        if kind == "s":
            assert properties.read_str(header, flag) == chosen.get(name)
    replaced = properties.replace(header, codec.FLAG_REPLY_TO, codec.shortstr("amq.rabbitmq.reply-to.x"))
    properties.check(replaced)
    again = properties.decode(replaced)
    assert again.reply_to == "amq.rabbitmq.reply-to.x"
    assert {n: getattr(again, n) for _, n, _ in properties.FIELDS if n != "reply_to"} == {
        n: getattr(decoded, n) for _, n, _ in properties.FIELDS if n != "reply_to"}
    removed = properties.replace(replaced, codec.FLAG_REPLY_TO, None)
    properties.check(removed)
    assert properties.decode(removed).reply_to is None


@pytest.mark.parametrize("props", [
    struct.pack(">H", 0x2000) + struct.pack(">I", 0xFFFFFFF0),  # table longer than the frame
    struct.pack(">H", 0x8000) + b"\x09ab",  # truncated shortstr
    struct.pack(">H", 0x1000) + b"\x02\x00",  # a byte after the last property
    struct.pack(">H", 0x8001) + b"\x01a\x00\x00",  # continuation flag
    struct.pack(">H", 0x2000) + struct.pack(">I", 3) + b"\x01aL",  # no such field type in RabbitMQ
])
def test_malformed(props):
    with pytest.raises(properties.MalformedProperties):
        properties.check(struct.pack(">HHQ", 60, 0, 1) + props)


def test_nesting_is_bounded_without_recursion():
    inner = b""
    for depth in range(properties.MAX_TABLE_DEPTH + 1):
        inner = b"\x01a" + b"F" + struct.pack(">I", len(inner)) + inner
        header = struct.pack(">HHQH", 60, 0, 1, 0x2000) + struct.pack(">I", len(inner)) + inner
        if depth < properties.MAX_TABLE_DEPTH:
            properties.check(header)
    with pytest.raises(properties.MalformedProperties):
        properties.check(header)
