"""Durable objects keep every AMQP field type of their arguments: in LMDB, in etcd's JSON, in a definitions
export and import, across a clean restart and ``kill -9``.

Tables are written here byte by byte (every type code: t b B s u I i l f d D S x A T F V), so the node decodes
exactly what a client of any language could send; a value comes back *equal* when it has the same value and
the same Python type (the type names its AMQP field type, ``field_types.name``).
"""
from __future__ import annotations

import datetime
import decimal
import json
import math
import struct
from typing import Any

import orjson
import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, decode

from amqp_server.framing import field_types
from amqp_server.definition_store import DefinitionStore
from amqp_server.records import BindingRecord, ExchangeRecord, QueueRecord
from mgmt_http.definitions import TYPED_ARGUMENTS, _arguments_in, _arguments_out
from mgmt_http.http import encode as http_encode
from support import Raw, call, q

pytestmark = pytest.mark.timeout(120)
field_types.install()

_FIXED = {field_types.Byte: (b"b", ">b"), field_types.UnsignedByte: (b"B", ">B"), field_types.Short: (b"s", ">h"),
          field_types.UnsignedShort: (b"u", ">H"), field_types.UnsignedInt: (b"i", ">I"),
          field_types.Long: (b"l", ">q"), field_types.Float: (b"f", ">f"), int: (b"I", ">i"), float: (b"d", ">d")}


def _long(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def field(value: Any) -> bytes:
    """One field value on the wire, its type code chosen by its Python type (the field_types classes)."""
    kind = type(value)
    if value is None:
        return b"V"
    if kind is bool:
        return b"t" + bytes([value])
    if kind in _FIXED:
        code, fmt = _FIXED[kind]
        return code + struct.pack(fmt, value)
    if kind is decimal.Decimal:
        _, digits, exponent = value.as_tuple()
        return b"D" + struct.pack(">BI", -exponent, int("".join(map(str, digits))))
    if kind is str:
        return b"S" + _long(value.encode())
    if kind is bytes:  # a long string that is not UTF-8
        return b"S" + _long(value)
    if kind is bytearray:
        return b"x" + _long(bytes(value))
    if kind is datetime.datetime:
        return b"T" + struct.pack(">Q", int(value.timestamp()))
    if kind is list:
        return b"A" + _long(b"".join(field(item) for item in value))
    if kind is dict:
        return b"F" + table(value)
    raise TypeError(kind)


def table(value: dict[str, Any]) -> bytes:
    return _long(b"".join(bytes([len(key.encode())]) + key.encode() + field(item) for key, item in value.items()))


def decoded(value: dict[str, Any]) -> dict[str, Any]:
    """What the node holds once it has decoded ``table(value)``."""
    return decode.field_table(table(value))[1]


def same(a: Any, b: Any) -> bool:
    """Equal, with the same type all the way down (NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


EVERY_TYPE = {
    "x-bool": True, "x-byte": field_types.Byte(-5), "x-ubyte": field_types.UnsignedByte(200),
    "x-short": field_types.Short(-300), "x-ushort": field_types.UnsignedShort(60000), "x-int": -70000,
    "x-uint": field_types.UnsignedInt(4_000_000_000), "x-long": field_types.Long(-2 ** 40),
    "x-float": field_types.Float(1.5), "x-double": 2.25, "x-nan": float("nan"), "x-inf": float("-inf"),
    "x-decimal": decimal.Decimal("3.14"), "x-string": "héllo", "x-not-utf8": b"\xff\xfe",
    "x-bytes": bytearray(b"\x00\xffraw"), "x-timestamp": datetime.datetime(2024, 5, 6, 7, 8, 9,
                                                                          tzinfo=datetime.timezone.utc),
    "x-void": None, "x-array": [field_types.Byte(1), "two", [None, {"deep": decimal.Decimal("0.001")}]],
    "x-table": {"a": {"b": {"c": bytearray(b"\x01")}}, "$amqp:looks-tagged": 1},
}

_KEY = st.text(min_size=0, max_size=12).filter(lambda k: len(k.encode()) <= 255) | st.sampled_from(
    ["$amqp:timestamp", "$amqp:table", "x-dead-letter-exchange"])
_SCALAR = st.one_of(
    st.booleans(), st.none(), st.text(max_size=20),
    st.binary(min_size=1, max_size=8).filter(lambda b: not _utf8(b)),
    st.binary(max_size=8).map(bytearray),
    st.integers(-2 ** 7, 2 ** 7 - 1).map(field_types.Byte), st.integers(0, 2 ** 8 - 1).map(field_types.UnsignedByte),
    st.integers(-2 ** 15, 2 ** 15 - 1).map(field_types.Short),
    st.integers(0, 2 ** 16 - 1).map(field_types.UnsignedShort), st.integers(-2 ** 31, 2 ** 31 - 1),
    st.integers(0, 2 ** 32 - 1).map(field_types.UnsignedInt), st.integers(-2 ** 63, 2 ** 63 - 1).map(field_types.Long),
    st.floats(width=32).map(field_types.Float), st.floats(),
    st.builds(lambda raw, scale: decimal.Decimal(raw) * decimal.Decimal(10) ** -scale,
              st.integers(0, 2 ** 32 - 1), st.integers(0, 9)),
    st.integers(0, 2 ** 32 - 1).map(lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.timezone.utc)),
)
TABLES = st.dictionaries(_KEY, st.recursive(
    _SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEY, inner, max_size=4), max_leaves=20),
    max_size=6)


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.long
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TABLES)
def test_arguments_come_back_equal_from_every_store(tmp_path_factory, value):
    """LMDB (the definition store), etcd (the record's JSON, as the cluster's metadata writes it) and a definitions
    export read back by an import: the arguments a client declared, every field type kept."""
    arguments = decoded(value)
    records: list[QueueRecord | ExchangeRecord | BindingRecord] = [
        QueueRecord("/", "q", arguments=arguments), ExchangeRecord("/", "x", "topic", arguments=arguments),
        BindingRecord("/", "x", "q", "queue", "k", arguments=arguments)]
    store = DefinitionStore(str(tmp_path_factory.mktemp("lmdb")))
    try:
        for record in records:
            store.put(record.kind, record.key, record.to_json())
            stored = store.get(record.kind, record.key)
            assert stored is not None  # (just put)
            from_lmdb = type(record).from_json(stored)
            from_etcd = type(record).from_json(json.loads(json.dumps(record.to_json()).encode()))
            assert same(from_lmdb.arguments, arguments) and same(from_etcd.arguments, arguments)
            assert from_lmdb.key == record.key
    finally:
        store.close()
    exported = orjson.loads(http_encode(_arguments_out(arguments)))
    assert same(_arguments_in(exported), arguments)
    assert exported["arguments"] == orjson.loads(http_encode(arguments))  # RabbitMQ's rendering stays as it was


def test_an_edited_export_reads_its_arguments():
    """``typed_arguments`` that no longer read as the item's ``arguments`` (edited by hand) give way to them."""
    item = orjson.loads(http_encode(_arguments_out({"x-ts": decoded(EVERY_TYPE)["x-timestamp"]})))
    assert TYPED_ARGUMENTS in item
    item["arguments"]["x-ts"] = 5
    assert _arguments_in(item) == {"x-ts": 5}
    item[TYPED_ARGUMENTS] = {"x-ts": {"$amqp:decimal": "not a number"}}
    assert _arguments_in(item) == {"x-ts": 5}


def _method(class_id: int, method_id: int, fields: bytes) -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + fields
    return struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"


def _short(name: str) -> bytes:
    return bytes([len(name.encode())]) + name.encode()


def declare_with(node, uid: str, arguments: dict[str, Any]) -> None:
    """A durable headers exchange and a durable queue declared with ``arguments``, bound with them too (raw frames:
    every type code as written)."""
    client = Raw(node)
    try:
        client.handshake()
        client.open_channel(1)
        client.send(_method(40, 10, b"\0\0" + _short(uid) + _short("headers") + b"\x02" + table(arguments)))
        client.expect(commands.Exchange.DeclareOk)
        client.send(_method(50, 10, b"\0\0" + _short(uid) + b"\x02" + table(arguments)))
        client.expect(commands.Queue.DeclareOk)
        binding = {**arguments, "x-match": "any-with-x"}
        client.send(_method(50, 20, b"\0\0" + _short(uid) + _short(uid) + _short("") + b"\0" + table(binding)))
        _, reply = client.read_frame()
        assert isinstance(reply, commands.Queue.BindOk), (reply.reply_code, reply.reply_text)
    finally:
        client.close()


def exported(node, uid: str) -> dict[str, dict[str, Any]]:
    """The exchange's, queue's and binding's arguments in the node's export, read back with their types (those of
    them that are there)."""
    body = call(node, "GET", "/api/definitions").json
    return {kind: _arguments_in(item) for kind, match in (("exchanges", "name"), ("queues", "name"),
                                                           ("bindings", "destination"))
            for item in body[kind] if item[match] == uid}


def expect_kept(node, uid: str, arguments: dict[str, Any], messages: int) -> None:
    held = decoded(arguments)
    found = exported(node, uid)
    assert same(found["exchanges"], held) and same(found["queues"], held)
    assert same(found["bindings"], {**held, "x-match": "any-with-x"})
    assert call(node, "GET", f"/api/queues/%2F/{q(uid)}").json["messages"] == messages


def test_every_field_type_survives_restart_kill_and_export(start_broker, uid):
    """A durable queue, exchange and binding declared with a timestamp, a decimal, a byte array, nested tables and
    arrays, void and every integer width keep them across a clean restart and ``kill -9``, and keep taking and
    routing persistent messages; an export imported into a new node brings them back the same."""
    node = start_broker()
    declare_with(node, uid, EVERY_TYPE)
    with pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(uid, "", b"routed by the binding's decimal",
                              pika.BasicProperties(delivery_mode=2, headers={"x-decimal": decimal.Decimal("3.14")}))
    expect_kept(node, uid, EVERY_TYPE, 1)
    node.stop()
    node.start()
    expect_kept(node, uid, EVERY_TYPE, 1)
    node.kill()
    node.start()
    expect_kept(node, uid, EVERY_TYPE, 1)
    with pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(uid, "", b"again", pika.BasicProperties(
            delivery_mode=2, headers={"x-decimal": decimal.Decimal("3.14")}))
    expect_kept(node, uid, EVERY_TYPE, 2)
    definitions = call(node, "GET", "/api/definitions").json
    other = start_broker()
    assert call(other, "POST", "/api/definitions", definitions).status == 204
    expect_kept(other, uid, EVERY_TYPE, 0)
    other.stop()
    other.start()
    expect_kept(other, uid, EVERY_TYPE, 0)


def test_arguments_too_deep_to_keep_are_refused_before_anything_is_made(start_broker, uid):
    """Tables nested deeper than a content header may be (100) could be neither exported nor imported: 406, and
    no queue, not even after a restart."""
    node = start_broker()

    def nested(levels: int) -> dict[str, Any]:  # arguments that are ``levels`` tables deep, their own included
        value: dict[str, Any] = {"leaf": 1}
        for _ in range(levels - 1):
            value = {"d": value}
        return value

    client = Raw(node)
    try:
        client.handshake()
        client.open_channel(1)
        client.send(_method(50, 10, b"\0\0" + _short(uid) + b"\x02" + table(nested(field_types.MAX_DEPTH + 1))))
        _, close = client.read_frame()
    finally:
        client.close()
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arguments for queue '{uid}' in vhost '/': tables nested deeper than "
             f"{field_types.MAX_DEPTH}")
    assert call(node, "GET", f"/api/queues/%2F/{q(uid)}").status == 404
    node.kill()
    node.start()
    assert call(node, "GET", f"/api/queues/%2F/{q(uid)}").status == 404
    declare_with(node, uid, nested(field_types.MAX_DEPTH))
    node.stop()
    node.start()
    assert same(exported(node, uid)["queues"], decoded(nested(field_types.MAX_DEPTH)))
