"""The typed field-table codec: every AMQP 0-9-1 field type RabbitMQ uses survives a decode and re-encode
byte for byte, and a headers table is replaced without touching the other properties."""
from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from amqp_server.framing import header_table
from amqp_server.framing.header_table import Field

# One entry of each type, written by hand as RabbitMQ's rabbit_binary_generator writes it.
ENTRIES = {
    "t": (b"t\x01", Field("t", 1)),
    "b": (b"b\xfb", Field("b", -5)),
    "B": (b"B\xfb", Field("B", 251)),
    "s": (b"s\xff\xfe", Field("s", -2)),
    "u": (b"u\xff\xfe", Field("u", 65534)),
    "I": (b"I\x00\x00\x00\x05", Field("I", 5)),
    "i": (b"i\xff\xff\xff\xff", Field("i", 2 ** 32 - 1)),
    "L": (b"L" + struct.pack(">q", 7), Field("L", 7)),
    "l": (b"l" + struct.pack(">q", -(2 ** 40)), Field("l", -(2 ** 40))),
    "f": (b"f" + struct.pack(">f", 1.5), Field("f", 1.5)),
    "d": (b"d" + struct.pack(">d", 0.1), Field("d", 0.1)),
    "D": (b"D\x02\x00\x00\x04\xd2", Field("D", (2, 1234))),
    "S": (b"S\x00\x00\x00\x04h\xc3\xa9\xff", Field("S", b"h\xc3\xa9\xff".decode("utf-8", "surrogateescape"))),
    "A": (b"A\x00\x00\x00\x07S\x00\x00\x00\x00b\x01", Field("A", [Field("S", ""), Field("b", 1)])),
    "T": (b"T" + struct.pack(">Q", 1_700_000_000), Field("T", 1_700_000_000)),
    "F": (b"F\x00\x00\x00\x03\x01kV", Field("F", {"k": Field("V", None)})),
    "V": (b"V", Field("V", None)),
    "x": (b"x\x00\x00\x00\x02\x00\xff", Field("x", b"\x00\xff")),
}


@pytest.mark.parametrize("kind", sorted(ENTRIES))
def test_every_field_type_round_trips(kind):
    raw, field = ENTRIES[kind]
    table = b"\x03key" + raw
    assert header_table.decode(table) == {"key": field}
    assert header_table.encode({"key": field}) == table


def test_whole_table_round_trips_in_order():
    table = b"".join(bytes((len(kind) + 1,)) + b"k" + kind.encode() + raw for kind, (raw, _) in ENTRIES.items())
    fields = header_table.decode(table)
    assert list(fields) == [f"k{kind}" for kind in ENTRIES]
    assert header_table.encode(fields) == table


def test_unknown_field_type_is_unsupported():
    with pytest.raises(header_table.NotInTable):
        header_table.decode(b"\x01kZ\x00")


def _header(**props) -> bytes:
    return ContentHeader(0, 3, commands.Basic.Properties(**props)).marshal()


def _flags(header: bytes) -> int:
    return struct.unpack_from(">H", header, 12)[0]


def test_with_headers_replaces_the_table_and_keeps_other_properties():
    header = _header(content_type="text/plain", content_encoding="gzip", headers={"a": 5, "b": "x"},
                     delivery_mode=2, expiration="60000", message_id="m1")
    fields = header_table.headers(header, _flags(header))
    assert fields == {"a": Field("b", 5), "b": Field("S", "x")}
    fields["a"] = Field("I", 5)
    new = header_table.with_headers(header, _flags(header), fields)
    content = ContentHeader()
    content.unmarshal(new)
    assert content.properties.headers == {"a": 5, "b": "x"}
    assert (content.properties.content_type, content.properties.content_encoding, content.properties.delivery_mode,
            content.properties.expiration, content.properties.message_id) == ("text/plain", "gzip", 2, "60000", "m1")
    assert b"\x01aI\x00\x00\x00\x05" in new


def test_with_headers_adds_a_table_to_a_header_without_one():
    header = _header(content_type="text/plain", priority=3)
    assert header_table.headers(header, _flags(header)) == {}
    new = header_table.with_headers(header, _flags(header), {"n": Field("l", 1)})
    content = ContentHeader()
    content.unmarshal(new)
    assert content.properties.headers == {"n": 1}
    assert (content.properties.content_type, content.properties.priority) == ("text/plain", 3)
    assert header_table.headers(new, _flags(new)) == {"n": Field("l", 1)}
