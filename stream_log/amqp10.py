"""AMQP 1.0 messages inside streams, converted to and from AMQP 0-9-1 as RabbitMQ 3.10.8 converts them
(rabbit_msg_record): an AMQP 0-9-1 publish is stored as the AMQP 1.0 record RabbitMQ writes (``from_amqp091``,
byte for byte), and a record is read by an AMQP 0-9-1 consumer as RabbitMQ delivers it (``Decoder``).

Mapping (3.10.8, as observed): message-annotations ``x-routing-key`` and ``x-exchange`` (the publish's), then
``x-basic-priority``, ``x-basic-delivery-mode`` and ``x-basic-expiration``; properties message-id, user-id,
reply-to, correlation-id, content-type, content-encoding and creation-time (ms; 0-9-1 timestamps are seconds), all
13 fields once any is set; application-properties ``x-basic-type``, ``x-basic-app-id``, then the headers (tables
and arrays left out); the body as one data section.  Back: exchange and routing key from those annotations (else
"" and the stream's name), a message or correlation id that is not a string as a string with its type in
``x-message-id-type`` / ``x-correlation-id-type`` (binary in base64; one longer than 256 bytes in the header
``x-message-id`` / ``x-correlation-id`` instead), other properties and annotations ignored.

Where RabbitMQ 3.10 fails the consumer's connection (541) Warren delivers something: a record that is not AMQP
1.0 arrives as the body with no properties; an amqp-value or amqp-sequence body as its encoded section; several
data sections joined; a decimal header is left out on the way in.  A record with more values than ``MAX_ITEMS``
(or an array of more nulls than its bytes) is refused (``TooLarge``) as RabbitMQ refuses what it cannot read:
decoding is bounded by the bytes left, every count checked before any loop.
"""
from __future__ import annotations

import base64
import datetime
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from pamqp import commands

from amqp_server.framing import header_table
from amqp_server.message import Message, build_header, encode_route

# section descriptors
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
_PROPERTY_NAMES = ("message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                   "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                   "reply_to_group_id")
# Sections kept whole in these 0-9-1 headers (RabbitMQ's names, mc_amqpl: a 0-9-1 publisher, or a node before
# message containers stored AMQP 1.0, may set them): an AMQP 1.0 reader gets each back as the section it is
PROPERTIES_HEADER = "x-amqp-1.0-properties"
APP_PROPERTIES_HEADER = "x-amqp-1.0-app-properties"
MAX_DEPTH = 32
MAX_ITEMS = 16_384  # values one record may hold (its sections' fields, list and map items, array elements)


class Invalid(ValueError):
    """Not an AMQP 1.0 message."""


class TooLarge(Exception):
    """An AMQP 1.0 message with more values than a node decodes (``MAX_ITEMS``): refused, never delivered."""


@dataclass(frozen=True)
class Value:
    """A decoded AMQP 1.0 value with its type (``kind``): the conversion needs to know a symbol from a string."""

    kind: str
    value: Any


_FIXED: dict[int, tuple[str, struct.Struct]] = {
    0x50: ("ubyte", struct.Struct(">B")), 0x51: ("byte", struct.Struct(">b")),
    0x52: ("uint", struct.Struct(">B")), 0x53: ("ulong", struct.Struct(">B")),
    0x54: ("int", struct.Struct(">b")), 0x55: ("long", struct.Struct(">b")),
    0x60: ("ushort", struct.Struct(">H")), 0x61: ("short", struct.Struct(">h")),
    0x70: ("uint", struct.Struct(">I")), 0x71: ("int", struct.Struct(">i")),
    0x72: ("float", struct.Struct(">f")), 0x73: ("char", struct.Struct(">I")),
    0x80: ("ulong", struct.Struct(">Q")), 0x81: ("long", struct.Struct(">q")),
    0x82: ("double", struct.Struct(">d")), 0x83: ("timestamp", struct.Struct(">q")),
}
_CONSTANTS = {0x40: Value("null", None), 0x41: Value("bool", True), 0x42: Value("bool", False),
              0x43: Value("uint", 0), 0x44: Value("ulong", 0), 0x45: Value("list", [])}
_VARIABLE = {0xA0: ("binary", 1), 0xA1: ("string", 1), 0xA3: ("symbol", 1),
             0xB0: ("binary", 4), 0xB1: ("string", 4), 0xB3: ("symbol", 4)}
_U8, _U32 = struct.Struct(">B"), struct.Struct(">I")


class _Reading:
    """One record's decoding, bounded by its bytes: every count is checked against the bytes left before any loop
    (an array of elements with no data, such as nulls, against the record's size), and at most
    ``MAX_ITEMS`` values are made, so time and memory stay linear in the record's size."""

    __slots__ = ("buf", "left")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.left = MAX_ITEMS

    def take(self, count: int, room: int) -> None:
        """``count`` values are about to be read from ``room`` bytes."""
        if count > room:
            raise Invalid(f"{count} values in {room} bytes")
        self.left -= count
        if self.left < 0:
            raise TooLarge(f"more than {MAX_ITEMS} values in one message")

    def value(self, pos: int, depth: int = 0) -> tuple[Value, int]:
        return self.value_as(_byte(self.buf, pos), pos + 1, depth)

    def value_as(self, code: int, pos: int, depth: int) -> tuple[Value, int]:
        """The value of type ``code`` at ``pos`` (its constructor read already)."""
        buf = self.buf
        if depth > MAX_DEPTH:
            raise Invalid("nested too deep")
        if code == 0x00:  # described: descriptor, then value
            self.take(2, len(buf) - pos)
            descriptor, pos = self.value(pos, depth + 1)
            value, pos = self.value(pos, depth + 1)
            return Value("described", (descriptor.value, value)), pos
        constant = _CONSTANTS.get(code)
        if constant is not None:
            return constant, pos
        fixed = _FIXED.get(code)
        if fixed is not None:
            kind, unpacker = fixed
            if pos + unpacker.size > len(buf):
                raise Invalid("truncated")
            return Value(kind, unpacker.unpack_from(buf, pos)[0]), pos + unpacker.size
        if code == 0x56:
            return Value("bool", _byte(buf, pos) != 0), pos + 1
        if code == 0x98:
            return Value("uuid", uuid.UUID(bytes=_slice(buf, pos, 16))), pos + 16
        if code in (0x74, 0x84, 0x94):
            width = {0x74: 4, 0x84: 8, 0x94: 16}[code]
            return Value("decimal", _slice(buf, pos, width)), pos + width
        variable = _VARIABLE.get(code)
        if variable is not None:
            return self._variable(*variable, pos)
        if code in (0xC0, 0xC1, 0xD0, 0xD1):
            return self._compound(code, pos, depth)
        if code in (0xE0, 0xF0):
            return self._array(code, pos, depth)
        raise Invalid(f"unknown type code 0x{code:02x}")

    def _variable(self, kind: str, width: int, pos: int) -> tuple[Value, int]:
        """binary, string or symbol: a size of ``width`` bytes, then that many bytes."""
        size, pos = _size(self.buf, pos, width)
        raw = _slice(self.buf, pos, size)
        if kind == "binary":
            return Value(kind, raw), pos + size
        try:
            return Value(kind, raw.decode()), pos + size
        except UnicodeDecodeError:
            raise Invalid("string is not UTF-8") from None

    def _sized(self, width: int, pos: int) -> tuple[int, int, int]:
        """A compound's or array's size and count, each ``width`` bytes: (where it ends, count, where its items
        start)."""
        size, pos = _size(self.buf, pos, width)
        end = pos + size
        if end > len(self.buf):
            raise Invalid("truncated")
        count, pos = _size(self.buf, pos, width)
        return end, count, pos

    def _compound(self, code: int, pos: int, depth: int) -> tuple[Value, int]:
        """list8/32 or map8/32: size, count, then each item with its own constructor."""
        end, count, pos = self._sized(1 if code in (0xC0, 0xC1) else 4, pos)
        self.take(count, end - pos)  # each item takes a byte at least
        items = []
        for _ in range(count):
            item, pos = self.value(pos, depth + 1)
            items.append(item)
        if pos > end:
            raise Invalid("compound runs past its size")
        if code in (0xC1, 0xD1):
            if count % 2:
                raise Invalid("map with an odd count")
            return Value("map", list(zip(items[::2], items[1::2]))), end
        return Value("list", items), end

    def _array(self, code: int, pos: int, depth: int) -> tuple[Value, int]:
        """array8/32: size, count, one element constructor, then each element's data."""
        end, count, pos = self._sized(1 if code == 0xE0 else 4, pos)
        buf = self.buf
        element = _byte(buf, pos)
        if element == 0x00:
            raise Invalid("arrays of described values are not read")
        pos += 1
        constant = _CONSTANTS.get(element)
        if constant is not None:  # no data per element: counted against the record's size, made at once
            if count > len(buf):
                raise TooLarge(f"an array of {count} values with no data in {len(buf)} bytes")
            self.take(count, len(buf))
            return Value("array", [constant] * count), end
        self.take(count, end - pos)
        items = []
        for _ in range(count):
            item, pos = self.value_as(element, pos, depth + 1)
            items.append(item)
        if pos > end:
            raise Invalid("array runs past its size")
        return Value("array", items), end


def _byte(buf: bytes, pos: int) -> int:
    if pos >= len(buf):
        raise Invalid("truncated")
    return buf[pos]


def _slice(buf: bytes, pos: int, size: int) -> bytes:
    if pos + size > len(buf):
        raise Invalid("truncated")
    return bytes(buf[pos:pos + size])


def _size(buf: bytes, pos: int, width: int) -> tuple[int, int]:
    unpacker = _U8 if width == 1 else _U32
    if pos + width > len(buf):
        raise Invalid("truncated")
    return unpacker.unpack_from(buf, pos)[0], pos + width


def value_at(buf: bytes, pos: int = 0) -> tuple[Value, int]:
    """The value at ``pos`` of ``buf`` and where it ends, decoded under the same bounds as a record (a frame's
    performative: ``Invalid`` or ``TooLarge`` for what is not one)."""
    return _Reading(buf).value(pos)


def sections(record: bytes, skipped: int | None = None) -> list[tuple[int, Value, bytes]]:
    """(descriptor, value, encoded bytes) of each section of an AMQP 1.0 message; Invalid if it is not one,
    TooLarge if it holds more values than ``MAX_ITEMS``.  A section ``skipped`` (a descriptor) is passed over
    undecoded when its encoding allows, and left out."""
    return _sections(_Reading(record), skipped)


def _sections(reading: _Reading, skipped: int | None = None) -> list[tuple[int, Value, bytes]]:
    record = reading.buf
    found = []
    pos = 0
    while pos < len(record):
        start = pos
        if skipped is not None and record[pos + 2:pos + 3] == bytes((skipped,)):
            end = _skip(record, pos)
            if 0 < end <= len(record):
                pos = end
                continue
        value, pos = reading.value(pos)
        if value.kind != "described" or not isinstance(value.value[0], int):
            raise Invalid("not a message section")
        descriptor, content = value.value
        if not HEADER <= descriptor <= FOOTER:
            raise Invalid("unknown section")
        found.append((descriptor, content, record[start:pos]))
    if not record:
        raise Invalid("empty")
    return found


# -- AMQP 1.0 -> AMQP 0-9-1 ---------------------------------------------------------------------------------------

AMQP10_TYPE = "amqp-1.0"  # the 0-9-1 type of a message whose body is AMQP 1.0 sections (amqp-value, amqp-sequence)
CACHED = 4096  # conversions a Memo remembers at most
CACHED_KEY = 4096  # the most bytes a remembered conversion may be keyed by: a larger one is made again each time
K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """Conversions remembered by what they were made from (``size``: its bytes), all forgotten at once when full:
    at most ``CACHED`` of them and ``budget`` bytes of keys, none keyed by more than ``CACHED_KEY`` bytes.  Runs
    of messages alike share one; messages each unlike the last (a request id in every one) keep at most the
    budget, not thousands of their sections."""

    __slots__ = ("entries", "size", "budget")

    def __init__(self, budget: int) -> None:
        self.entries: dict[K, V] = {}
        self.size = 0
        self.budget = budget

    def get(self, key: K) -> V | None:
        return self.entries.get(key)

    def put(self, key: K, value: V, size: int) -> V:
        if size > CACHED_KEY:
            return value
        entries = self.entries
        if len(entries) >= CACHED or self.size + size > self.budget:
            entries.clear()
            self.size = 0
        entries[key] = value
        self.size += size
        return value


LINK_MEMO = 256 * 1024  # a decoder's (one per publishing link, or stream): the bytes of keys it may keep
SHARED_MEMO = 4 * 1024 * 1024  # a node-wide memo's


def _plain(value: Value) -> Any:
    return None if value.kind == "null" else value.value


def _field(value: Value) -> header_table.Field | None:
    """An application property as an AMQP 0-9-1 header value (rabbit_msg_record:to_091); None: left out."""
    kind, raw = value.kind, value.value
    if kind in ("string", "symbol"):
        return header_table.Field("S", raw)
    if kind == "binary":
        return header_table.Field("x", raw)
    if kind == "bool":
        return header_table.Field("t", int(raw))
    if kind == "long":
        return header_table.Field("l", raw)
    if kind == "ulong":
        return header_table.Field("l", min(raw, (1 << 63) - 1))
    if kind in ("int", "uint", "short", "ushort", "byte", "ubyte"):
        return header_table.Field({"int": "I", "uint": "i", "short": "s", "ushort": "u", "byte": "b",
                                   "ubyte": "B"}[kind], raw)
    if kind == "double":
        return header_table.Field("d", raw)
    if kind == "float":
        return header_table.Field("f", raw)
    if kind == "timestamp":  # (one before 1970 has no 0-9-1 timestamp: left out)
        return header_table.Field("T", raw // 1000) if raw >= 0 else None
    if kind == "null":
        return header_table.Field("V", None)
    if kind == "uuid":
        return header_table.Field("S", str(raw))
    return None


def _message_id(value: Value | None, name: str, headers: dict[str, header_table.Field]) -> str | None:
    """A message or correlation id (``name``: its header's) as rabbit_msg_record:message_id gives it."""
    if value is None or value.kind == "null":
        return None
    if value.kind in ("string", "binary"):
        text = value.value if value.kind == "string" else base64.b64encode(value.value).decode()
        if len(text.encode()) > 256:  # too long for a shortstr: the header instead
            headers[name[:-len("-type")]] = header_table.Field("S", value.value) if value.kind == "string" \
                else header_table.Field("x", value.value)
            return None
        if value.kind == "binary":
            headers[name] = header_table.Field("S", "binary")
        return text
    if value.kind in ("ulong", "uuid"):
        headers[name] = header_table.Field("S", value.kind)
        return str(value.value)
    return None


def _map(value: Value) -> dict[str, Value]:
    if value.kind != "map":
        return {}
    return {str(key.value): item for key, item in value.value if key.kind in ("string", "symbol")}


def _text(value: Value | None) -> str | None:
    if value is None or value.kind not in ("string", "symbol"):
        return None
    return value.value[:255]


def _int(value: Value | None) -> int | None:
    if value is None or not isinstance(value.value, int) or isinstance(value.value, bool):
        return None
    return value.value if 0 <= value.value <= 255 else None


_MAX_TIMESTAMP = 253402300799  # the last second a 0-9-1 timestamp (a datetime) holds here: 9999-12-31T23:59:59


def _timestamp(value: Value | None) -> datetime.datetime | None:
    """A creation-time (ms) as the 0-9-1 timestamp (s), the milliseconds dropped as mc_amqpl's ``V div 1000``
    drops them; None for one before 1970 or past year 9999 (no 0-9-1 timestamp here holds it)."""
    if value is None or value.kind != "timestamp" or not 0 <= value.value // 1000 <= _MAX_TIMESTAMP:
        return None
    return datetime.datetime.fromtimestamp(value.value // 1000, datetime.timezone.utc)


def _internal(name: str) -> bool:
    """An annotation RabbitMQ 4.x reads itself and does not make a 0-9-1 header (mc_amqpl:is_internal_header)."""
    return name.startswith("x-basic-") or name in ("x-routing-key", "x-exchange", "x-death")


def _convert(found: list[tuple[int, Value, bytes]], stream: str,
             native: bool = False) -> tuple[str, str, bytes, list[bytes]]:
    """(exchange, routing key, content header, body parts) of a record's sections.  ``native``: a message an
    AMQP 1.0 client published, converted as RabbitMQ 4.x converts it (``_convert_native``)."""
    props: dict[str, Value] = {}
    header_fields: list[Value] = []
    application: dict[str, Value] = {}
    annotations: dict[str, Value] = {}
    body: list[bytes] = []
    for descriptor, content, encoded in found:
        if descriptor == PROPERTIES and content.kind == "list":
            props = {name: item for name, item in zip(_PROPERTY_NAMES, content.value)}
        elif descriptor == APPLICATION_PROPERTIES:
            application = _map(content)
        elif descriptor == MESSAGE_ANNOTATIONS:
            annotations = _map(content)
        elif descriptor == DATA and content.kind == "binary":
            body.append(content.value)
        elif descriptor in (AMQP_VALUE, AMQP_SEQUENCE):
            body.append(encoded)
        elif descriptor == HEADER and content.kind == "list":
            header_fields = content.value
    if native:
        return _convert_native(header_fields, annotations, props, application, body, found, stream)
    headers: dict[str, header_table.Field] = {}
    delivery_mode = _int(annotations.get("x-basic-delivery-mode"))
    priority = _int(annotations.get("x-basic-priority"))
    expiration = _text(annotations.get("x-basic-expiration"))
    basic_type, app_id = application.pop("x-basic-type", None), application.pop("x-basic-app-id", None)
    for name, value in application.items():
        converted = _field(value)
        if converted is not None:
            headers[name] = converted
    message_id = _message_id(props.get("message_id"), "x-message-id-type", headers)
    correlation_id = _message_id(props.get("correlation_id"), "x-correlation-id-type", headers)
    basic = commands.Basic.Properties(
        content_type=_text(props.get("content_type")), content_encoding=_text(props.get("content_encoding")),
        delivery_mode=delivery_mode, priority=priority, correlation_id=correlation_id,
        reply_to=_text(props.get("reply_to")), expiration=expiration,
        message_id=message_id, timestamp=_timestamp(props.get("creation_time")), message_type=_text(basic_type),
        app_id=_text(app_id), user_id=_user_id(props.get("user_id")))
    return _converted(basic, headers, annotations, stream, body)


def _converted(basic: commands.Basic.Properties, headers: dict[str, header_table.Field],
               annotations: dict[str, Value], stream: str, body: list[bytes]) -> tuple[str, str, bytes, list[bytes]]:
    header = build_header(basic, 0)
    if headers:
        header = header_table.with_headers(header, struct.unpack_from(">H", header, 12)[0], headers)
    exchange = annotations.get("x-exchange")
    routing_key = annotations.get("x-routing-key")
    if exchange is not None and routing_key is not None and exchange.kind == routing_key.kind == "string":
        return exchange.value[:255], routing_key.value[:255], header, body
    return "", stream, header, body


def _convert_native(header_fields: list[Value], annotations: dict[str, Value], props: dict[str, Value],
                    application: dict[str, Value], body: list[bytes], found: list[tuple[int, Value, bytes]],
                    stream: str) -> tuple[str, str, bytes, list[bytes]]:
    """What RabbitMQ 4.x gives an AMQP 0-9-1 reader of an AMQP 1.0 message (mc_amqpl:convert_from, then its
    protocol_state): delivery-mode 2 unless the header says ``durable`` false (RabbitMQ's default, unlike the
    specification's), priority and expiration from the header else the ``x-basic-*`` annotations; headers from
    the ``x-`` annotations (``x-cc`` as ``CC``, the received time as ``timestamp_in_ms``), a message or
    correlation id 0-9-1 cannot hold, and the application properties, sorted by name with the first of a name
    kept; the type from ``x-basic-type``, or ``amqp-1.0`` for a body of AMQP 1.0 sections (and the footer)."""
    durable, priority_field, ttl = (header_fields + [Value("null", None)] * 3)[:3]
    if durable.kind == "bool":
        delivery_mode: int | None = 2 if durable.value else 1
    else:
        delivery_mode = _int(annotations.get("x-basic-delivery-mode"))
        if delivery_mode is None:
            delivery_mode = 2
    priority = _int(priority_field) if priority_field.kind != "null" else _int(annotations.get("x-basic-priority"))
    expiration = str(ttl.value) if ttl.kind == "uint" else _text(annotations.get("x-basic-expiration"))
    ordered: list[tuple[str, header_table.Field]] = []
    for name, value in annotations.items():
        if name == "x-cc":
            name = "CC"
        elif name == "x-opt-rabbitmq-received-time":
            if value.kind == "timestamp":
                ordered.append(("timestamp_in_ms", header_table.Field("l", value.value)))
            continue
        elif name == "x-opt-deaths":
            if value.kind == "array":
                ordered.append(("x-death", header_table.Field("A", [_death_table(death) for death in value.value
                                                                    if death.kind == "map"])))
            continue
        elif not name.startswith("x-") or _internal(name):
            continue
        converted = _native_field(value)
        if converted is not None and len(name.encode()) <= 255:
            ordered.append((name, converted))
    message_id = _native_id(props.get("message_id"), "x-message-id", ordered)
    correlation_id = _native_id(props.get("correlation_id"), "x-correlation-id", ordered)
    for name, value in application.items():
        converted = _native_field(value)
        if converted is not None and len(name.encode()) <= 255:
            ordered.append((name, converted))
    headers: dict[str, header_table.Field] = {}
    for name, converted in ordered:
        headers.setdefault(name, converted)
    headers = {name: headers[name] for name in sorted(headers, key=lambda name: name.encode())}
    basic_type = annotations.get("x-basic-type")
    if any(descriptor in (AMQP_VALUE, AMQP_SEQUENCE) for descriptor, _, _ in found):
        basic_type = Value("string", AMQP10_TYPE)  # its body is its encoded sections: a 1.0 reader takes them
        body = body + [encoded for descriptor, _, encoded in found if descriptor == FOOTER]
    basic = commands.Basic.Properties(
        content_type=_text(props.get("content_type")), content_encoding=_text(props.get("content_encoding")),
        delivery_mode=delivery_mode, priority=priority, correlation_id=correlation_id,
        reply_to=_shortstr(props.get("reply_to")), expiration=expiration, message_id=message_id,
        timestamp=_timestamp(props.get("creation_time")), message_type=_text(basic_type),
        app_id=_shortstr(props.get("group_id")), user_id=_user_id(props.get("user_id")))
    return _converted(basic, headers, annotations, stream, body)


def _death_table(death: Value) -> header_table.Field:
    """One ``x-opt-deaths`` map as the ``x-death`` table a 0-9-1 reader gets (mc_amqpl's
    convert_from_amqp_deaths): the first time, in seconds, is its time; a ttl its ``original-expiration``.  A
    field of another type is left out (RabbitMQ fails the conversion)."""
    info = {key.value: value for key, value in death.value if key.kind == "symbol"}
    table: dict[str, header_table.Field] = {}
    ttl = info.get("ttl")
    if ttl is not None and ttl.kind == "uint":
        table["original-expiration"] = header_table.Field("S", str(ttl.value))
    count = info.get("count")
    if count is not None and count.kind == "ulong":
        table["count"] = header_table.Field("l", min(count.value, (1 << 63) - 1))
    for name, kind in (("reason", "symbol"), ("queue", "string")):
        found = info.get(name)
        if found is not None and found.kind == kind:
            table[name] = header_table.Field("S", found.value)
    first = info.get("first-time")
    if first is not None and first.kind == "timestamp" and first.value >= 0:
        table["time"] = header_table.Field("T", first.value // 1000)
    exchange, keys = info.get("exchange"), info.get("routing-keys")
    if exchange is not None and exchange.kind == "string":
        table["exchange"] = header_table.Field("S", exchange.value)
    if keys is not None and keys.kind == "array":
        table["routing-keys"] = header_table.Field("A", [header_table.Field("S", key.value) for key in keys.value
                                                         if key.kind == "string"])
    return header_table.Field("F", table)


def _user_id(value: Value | None) -> str | None:
    """The user-id, as the publish's checks compare it with the user's name: one that is no short string is
    kept mangled, not dropped, so it is refused as RabbitMQ refuses it (whose readers get only names that
    matched, which mc_amqpl's is_valid_shortstr would keep)."""
    if value is not None and value.kind == "binary":
        return value.value.decode("utf-8", "replace")[:255]
    return _text(value)


def _shortstr(value: Value | None) -> str | None:
    """A string property a 0-9-1 shortstr holds (mc_amqpl's unwrap_shortstr: at most 255 bytes); None for
    any other."""
    if value is None or value.kind != "string" or len(value.value.encode()) > 255:
        return None
    return str(value.value)


def _native_id(value: Value | None, name: str, headers: list[tuple[str, header_table.Field]]) -> str | None:
    """A message or correlation id as mc_amqpl:message_id gives it: a uuid as its URN, a ulong as its digits,
    a string as it is; a binary one, or a string too long for a shortstr, as the header ``name`` instead."""
    if value is None:
        return None
    if value.kind == "uuid":
        return value.value.urn
    if value.kind == "ulong":
        return str(value.value)
    if value.kind == "binary":
        headers.append((name, header_table.Field("x", value.value)))
    elif value.kind == "string":
        if len(value.value.encode("utf-8", "surrogateescape")) <= 255:
            return str(value.value)
        headers.append((name, header_table.Field("S", value.value)))
    return None


def _native_field(value: Value) -> header_table.Field | None:
    """An application property or annotation as mc_amqpl:to_091 makes it a header: as ``_field``, and a list
    an array, a map a table."""
    if value.kind in ("list", "array"):
        items = [_native_field(item) for item in value.value]
        return header_table.Field("A", [item for item in items if item is not None])
    if value.kind == "map":
        table = {}
        for key, item in value.value:
            converted = _native_field(item)
            if key.kind in ("string", "symbol") and converted is not None and len(key.value.encode()) <= 255:
                table[str(key.value)] = converted
        return header_table.Field("F", table)
    return _field(value)


def _skip(record: bytes, pos: int) -> int:
    """Where the section at ``pos`` ends, for the encodings a record's sections use; -1 for others."""
    if len(record) < pos + 4 or record[pos] != 0 or record[pos + 1] != 0x53:
        return -1
    code = record[pos + 3]
    at = pos + 4
    if code in (0x40, 0x45):
        return at
    if code in (0xC0, 0xC1, 0xA0, 0xA1, 0xA3):
        return at + 1 + record[at] if at < len(record) else -1
    if code in (0xD0, 0xD1, 0xB0, 0xB1, 0xB3):
        return at + 4 + _U32.unpack_from(record, at)[0] if at + 4 <= len(record) else -1
    return -1


_SIZE = struct.Struct(">Q")
_DATA_SECTION = b"\x00\x53\x75"
_FOOTER_SECTION = b"\x00\x53\x78"
FOOTER_MAX = 64 << 10  # the footer of a large record read to convert it without its body (``Decoder.head``)
_HEADER_SECTION = b"\x00\x53\x70"  # a record that starts with one is an AMQP 1.0 message as RabbitMQ 4.x keeps it
_BODIES = (DATA, AMQP_VALUE, AMQP_SEQUENCE)
# (exchange, routing key, route, 0-9-1 content header, and the sections before the body of a message kept as
# AMQP 1.0, or None): what the sections before a record's body convert to
_Conversion = tuple[str, str, bytes, bytes, bytes | None]


class Decoder:
    """A stream's records as AMQP 0-9-1 messages: the conversion of what precedes a record's body is remembered
    (records from one publisher share it), so reading one costs a few slices.  ``message`` raises TooLarge for
    a record with more values than ``MAX_ITEMS``; ``values`` counts those decoded the slow way (what a caller
    bounds its work by)."""

    def __init__(self, stream: str, native: bool = False) -> None:
        self.stream = stream
        self.native = native  # an AMQP 1.0 client's messages (see _convert)
        self.values = 0
        self.route = encode_route("", stream)
        self._cache: Memo[bytes, _Conversion] = Memo(LINK_MEMO)
        self._last = b"\xff"  # the sections before the body of the last record read (the next is likely alike)
        self._last_data = self._last + _DATA_SECTION  # and the data section's descriptor after them
        self._last_conversion: _Conversion | None = None
        self._sized: tuple[int, bytes, bytes] = (-1, b"", b"")  # a body size, a conversion's header, and with the size
        # the last record read the cached way: its bytes before the body's (the sections, the data section's
        # descriptor and binary size), the body's size, and its message's exchange, routing key, route, header and
        # kept sections; a record alike (a publisher's next message of that size) costs one comparison
        self._hit: tuple[bytes, int, str, str, bytes, bytes, bytes | None] = (b"", -1, "", "", b"", b"", None)

    def message(self, record: bytes | bytearray, start: int = 0, end: int | None = None) -> Message:
        """The message of ``record[start:end]``, read where it lies: a body after sections like the last record's
        is its only copy, and messages of one size share their header."""
        if end is None:
            end = len(record)
        before, size, exchange, routing_key, route, header, kept = self._hit
        body_start = start + len(before)
        if end - body_start == size and record.startswith(before, start):
            body = record[body_start:end]
            message = Message(exchange, routing_key, route, header, body if isinstance(body, bytes) else bytes(body))
            if kept is not None:
                message.amqp10 = kept
            return message
        body_at = start + len(self._last)
        if record.startswith(self._last_data, start, end):  # the last record's sections, then a data section
            cached = self._last_conversion
        else:
            if start or end != len(record) or not isinstance(record, bytes):
                record, start, end = bytes(record[start:end]), 0, end - start
            cached, body_at = self._prefix(record)
        if cached is not None and end - body_at >= 5:
            kind = record[body_at + 3]
            if kind == 0xA0:
                size, body_start = record[body_at + 4], body_at + 5
            elif kind == 0xB0 and end - body_at >= 8:
                size, body_start = _U32.unpack_from(record, body_at + 4)[0], body_at + 8
            else:
                size, body_start = -1, end
            if body_start + size == end:
                exchange, routing_key, route, header, kept = cached
                if self._sized[0] != size or self._sized[1] is not header:
                    self._sized = (size, header, header[:4] + _SIZE.pack(size) + header[12:])
                self._hit = (bytes(record[start:body_start]), size, exchange, routing_key, route, self._sized[2],
                             kept)
                body = record[body_start:end]
                message = Message(exchange, routing_key, route, self._sized[2],
                                  body if isinstance(body, bytes) else bytes(body))
                if kept is not None:
                    message.amqp10 = kept
                return message
        return self._convert(bytes(record[start:end]))

    def head(self, head: bytes, size: int, read: Callable[[int, int], bytes]) -> tuple[Message, int] | None:
        """The message of a record of ``size`` bytes whose first bytes are ``head``, its body (one binary data
        section after sections within ``head``, that ends the record or a footer of ``FOOTER_MAX`` bytes at most
        follows, which ``read(pos, size)`` reads from the record) left where it lies: the message holds none
        (``Message.body`` None); and where the body starts in the record.  None for another record, which is
        read whole."""
        cached, body_at = self._prefix(head, size)
        if cached is None:
            return self._footed(head, size, read)
        if head[body_at + 3] != 0xB0 or len(head) < body_at + 8:
            return None
        body_size = _U32.unpack_from(head, body_at + 4)[0]
        if body_at + 8 + body_size != size:
            return None
        exchange, routing_key, route, header, kept = cached
        message = Message(exchange, routing_key, route, header, b"")
        message.amqp10 = kept
        return _without_body(message, body_size), body_at + 8

    def _footed(self, head: bytes, size: int, read: Callable[[int, int], bytes]) -> tuple[Message, int] | None:
        """``head`` of a record whose binary data body a footer follows: converted the slow way (``_convert``, as
        the whole record is) from its sections around an empty body, the footer read from the record."""
        body_at = 0
        while not head.startswith(_DATA_SECTION, body_at):
            body_at = _skip(head, body_at)
            if body_at < 0:
                return None
        if len(head) < body_at + 8 or head[body_at + 3] != 0xB0:
            return None
        body_size = _U32.unpack_from(head, body_at + 4)[0]
        body_end = body_at + 8 + body_size
        if not 0 < size - body_end <= FOOTER_MAX:
            return None
        footer = read(body_end, size - body_end)
        if not footer.startswith(_FOOTER_SECTION):
            return None
        message = self._convert(head[:body_at] + _DATA_SECTION + b"\xa0\x00" + footer)
        if message.body_size:  # (not read as AMQP 1.0 sections: its bytes are the body, read whole)
            return None
        return _without_body(message, body_size), body_at + 8

    def _prefix(self, record: bytes, end: int | None = None) -> tuple[_Conversion | None, int]:
        """The conversion of the sections before a record's body, where its body is one binary data section that
        ends it (``end``: the record's size, of which ``record`` may be the first bytes only); and where that
        section starts."""
        body_at = pos = 0
        end = len(record) if end is None else end
        while pos < end:
            body_at = pos
            pos = _skip(record, pos)
            if pos < 0:
                return None, 0
        if end - body_at < 5 or record[body_at + 2] != DATA or record[body_at + 3] not in (0xA0, 0xB0):
            return None, 0
        prefix = record[:body_at]
        cached = self._cache.get(prefix)
        if cached is None:
            cached = self._remember(prefix)
        if cached is not None:
            self._last, self._last_conversion = prefix, cached
            self._last_data = prefix + _DATA_SECTION
        return cached, body_at

    def _sections(self, record: bytes) -> list[tuple[int, Value, bytes]]:
        reading = _Reading(record)
        try:
            return _sections(reading)
        finally:
            self.values += MAX_ITEMS - reading.left

    def _remember(self, prefix: bytes) -> _Conversion | None:
        try:
            found = self._sections(prefix) if prefix else []
        except Invalid:
            return None
        if any(descriptor in (DATA, AMQP_VALUE, AMQP_SEQUENCE) for descriptor, _, _ in found):
            return None
        native = self.native or prefix.startswith(_HEADER_SECTION)
        exchange, routing_key, header, _ = _convert(found, self.stream, native)
        route = self.route if (exchange, routing_key) == ("", self.stream) else encode_route(exchange, routing_key)
        return self._cache.put(prefix, (exchange, routing_key, route, header, prefix if native else None), len(prefix))

    def _convert(self, record: bytes) -> Message:
        """The slow way: a record the cache cannot take (several body sections, an amqp-value), or not AMQP 1.0."""
        native = self.native or record.startswith(_HEADER_SECTION)
        try:
            found = self._sections(record)
            exchange, routing_key, header, body = _convert(found, self.stream, native)
        except Invalid:
            if self.native:  # an AMQP 1.0 client's transfer is refused, not taken as opaque bytes
                raise
            return Message("", self.stream, self.route, build_header(commands.Basic.Properties(), len(record)),
                           record)
        data = b"".join(body)
        header = header[:4] + _SIZE.pack(len(data)) + header[12:]
        message = Message(exchange, routing_key, encode_route(exchange, routing_key), header, data)
        if native:
            message.amqp10 = _kept(found)
        return message


def _without_body(message: Message, body_size: int) -> Message:
    """A record's message whose body of ``body_size`` bytes is left where it lies (``Message.body`` None, as
    Message.stored's: its reader sends it from the file), its content header saying that size."""
    message.header = message.header[:4] + _SIZE.pack(body_size) + message.header[12:]
    message.body = None  # type: ignore[assignment]
    message.body_size = body_size
    return message


def _kept(found: list[tuple[int, Value, bytes]]) -> bytes:
    """What ``Message.amqp10`` keeps of a message's sections: the encoded ones before its first body section, then
    after a data body its footer (RabbitMQ's bare_and_footer: ``record_parts`` sends it after the body; an
    amqp-value or amqp-sequence body keeps its footer in its encoded sections)."""
    parts = []
    body = 0
    for descriptor, _, encoded in found:
        if descriptor in _BODIES:
            body = body or descriptor
        elif not body or (descriptor == FOOTER and body == DATA):
            parts.append(encoded)
    return b"".join(parts)


# -- AMQP 0-9-1 -> AMQP 1.0, as amqp10_binary_generator encodes it ------------------------------------------------

def _variable(small: int, large: int, data: bytes) -> bytes:
    return (bytes((small, len(data))) if len(data) < 256 else bytes((large,)) + _U32.pack(len(data))) + data


def utf8(value: str) -> bytes:
    return _variable(0xA1, 0xB1, value.encode("utf-8", "surrogateescape"))


def symbol(value: str) -> bytes:
    return _variable(0xA3, 0xB3, value.encode("utf-8", "surrogateescape"))


def binary(value: bytes) -> bytes:
    return _variable(0xA0, 0xB0, value)


def _compound(small: int, large: int, items: list[bytes]) -> bytes:
    data = b"".join(items)
    if len(items) >= 255 or len(data) + 1 >= 256:
        return bytes((large,)) + _U32.pack(len(data) + 4) + _U32.pack(len(items)) + data
    return bytes((small, len(data) + 1, len(items))) + data


def encode_list(items: list[bytes]) -> bytes:
    """A list of encoded values (the fields of a performative or section)."""
    return _compound(0xC0, 0xD0, items) if items else b"\x45"


def encode_map(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A map of encoded keys and values."""
    return _compound(0xC1, 0xD1, [part for pair in pairs for part in pair])


def _int_value(small: int, large: str, code: int, value: int) -> bytes:
    return bytes((small,)) + struct.pack(">b", value) if -128 <= value <= 127 else bytes((code,)) + struct.pack(
        large, value)


def _unsigned(zero: int, small: int, code: int, large: str, value: int) -> bytes:
    if value == 0:
        return bytes((zero,))
    return bytes((small, value)) if value < 256 else bytes((code,)) + struct.pack(large, value)


def _header_value(field: header_table.Field) -> bytes | None:
    """A header as an application property (rabbit_msg_record:from_091); None: left out."""
    kind, value = field.kind, field.value
    if kind == "S":
        return utf8(value)
    if kind in ("l", "L"):
        return _int_value(0x55, ">q", 0x81, value)
    if kind == "I":
        return _int_value(0x54, ">i", 0x71, value)
    if kind == "i":
        return _unsigned(0x43, 0x52, 0x70, ">I", value)
    if kind == "t":
        return b"\x56\x01" if value else b"\x56\x00"
    if kind == "T":
        return b"\x83" + struct.pack(">q", value * 1000)
    if kind == "b":
        return b"\x51" + struct.pack(">b", value)
    if kind == "B":
        return b"\x50" + bytes((value,))
    if kind == "s":
        return b"\x61" + struct.pack(">h", value)
    if kind == "u":
        return b"\x60" + struct.pack(">H", value)
    if kind == "f":
        return b"\x72" + struct.pack(">f", value)
    if kind == "d":
        return b"\x82" + struct.pack(">d", value)
    if kind == "x":
        return binary(value)
    if kind == "V":
        return b"\x40"
    return None  # tables and arrays (RabbitMQ 3.10 leaves them out), decimals (it fails the publish)


def described(descriptor: int, value: bytes) -> bytes:
    """``value`` under a small-ulong descriptor: a section, a performative, an outcome."""
    return b"\x00\x53" + bytes((descriptor,)) + value


NULL = b"\x40"


def boolean(value: bool) -> bytes:
    return b"\x41" if value else b"\x42"


def uint(value: int) -> bytes:
    """(Every performative's handles, ids, windows and credit: one step for the common values.)"""
    return _UINTS[value] if value < 256 else b"\x70" + _U32.pack(value)


def ulong(value: int) -> bytes:
    return _unsigned(0x44, 0x53, 0x80, ">Q", value)


def ubyte(value: int) -> bytes:
    return b"\x50" + _BYTES[value]


def ushort(value: int) -> bytes:
    return b"\x60" + struct.pack(">H", value)


def symbols(names: list[str]) -> bytes:
    """An array of symbols (capabilities, SASL mechanisms)."""
    data = b"".join(_variable(0xA3, 0xB3, name.encode())[1:] for name in names)
    if any(len(name.encode()) > 255 for name in names) or len(data) + 2 > 255:
        raise ValueError("symbol array too large")  # (only the node's own short names are sent)
    return bytes((0xE0, len(data) + 2, len(names), 0xA3)) + data


_WIDE = {kind: (bytes((code,)), packer) for code, (kind, packer) in _FIXED.items() if code >= 0x60 or kind in
         ("ubyte", "byte")}
_WIDE_VARIABLE = {"binary": 0xB0, "string": 0xB1, "symbol": 0xB3}
_COMPACT: dict[str, Callable[[Any], bytes]] = {
    "null": lambda raw: NULL, "bool": lambda raw: boolean(raw), "uint": lambda raw: uint(raw),
    "ulong": lambda raw: ulong(raw), "int": lambda raw: _int_value(0x54, ">i", 0x71, raw),
    "long": lambda raw: _int_value(0x55, ">q", 0x81, raw), "string": lambda raw: utf8(raw),
    "symbol": lambda raw: symbol(raw), "binary": lambda raw: binary(raw)}
_DECIMALS = {4: 0x74, 8: 0x84, 16: 0x94}


def encode(value: Value) -> bytes:
    """Any decoded value back to bytes (the same value; a scalar in its widest form): what a node echoes of a
    peer's terminus, such as the filters it applies."""
    kind, raw = value.kind, value.value
    if kind == "described":
        descriptor, content = raw
        return b"\x00" + (ulong(descriptor) if isinstance(descriptor, int) else symbol(descriptor)) + encode(content)
    if kind == "list":
        return encode_list([encode(item) for item in raw])
    if kind == "map":
        return encode_map([(encode(key), encode(item)) for key, item in raw])
    compact = _COMPACT.get(kind)
    if compact is not None:
        return compact(raw)
    constructor, data = _element(value)
    return constructor + data


def _element(value: Value) -> tuple[bytes, bytes]:
    """(constructor, data) of a value, the form an array's elements share."""
    kind, raw = value.kind, value.value
    if kind == "null":
        return b"\x40", b""
    if kind == "bool":
        return b"\x56", b"\x01" if raw else b"\x00"
    if kind in _WIDE:
        constructor, packer = _WIDE[kind]
        return constructor, packer.pack(raw)
    if kind in _WIDE_VARIABLE:
        data = raw if kind == "binary" else raw.encode("utf-8", "surrogateescape")
        return bytes((_WIDE_VARIABLE[kind],)), _U32.pack(len(data)) + data
    if kind == "uuid":
        return b"\x98", raw.bytes
    if kind == "decimal":
        return bytes((_DECIMALS[len(raw)],)), raw
    if kind == "list":
        items = b"".join(encode(item) for item in raw)
        return b"\xd0", _U32.pack(len(items) + 4) + _U32.pack(len(raw)) + items
    if kind == "map":
        items = b"".join(encode(part) for pair in raw for part in pair)
        return b"\xd1", _U32.pack(len(items) + 4) + _U32.pack(len(raw) * 2) + items
    if kind == "array":
        elements = [_element(item) for item in raw]
        constructor = elements[0][0] if elements else b"\x40"
        items = constructor + b"".join(data for _, data in elements)
        return b"\xf0", _U32.pack(len(items) + 4) + _U32.pack(len(raw)) + items
    raise Invalid(f"no encoding of {kind}")


_ENVELOPES: Memo[tuple[bytes, bytes, bool, bytes | None], tuple[bytes, bool, bytes]] = Memo(SHARED_MEMO)
_UINT_MAX = 0xFFFFFFFF


def _header_section(message: Message) -> bytes:
    """The header section an AMQP 1.0 reader gets for a message, as mc_amqp:protocol_state writes it: durable,
    priority, ttl, and first-acquirer true (``redelivered`` makes a redelivery's)."""
    props = message.properties
    ttl = _ttl(props.expiration)
    return described(HEADER, encode_list([
        boolean(message.persistent), ubyte(props.priority) if props.priority is not None else NULL,
        uint(ttl) if ttl is not None else NULL, b"\x41"]))


def redelivered(envelope: bytes, count: int) -> bytes:
    """An envelope ``record_parts`` made for an AMQP 1.0 reader (its header section first) as a redelivery's:
    first-acquirer false, and ``count`` (the returns a quorum queue counted) its delivery-count, as
    mc_amqp:protocol_state writes a redelivered message's header.  Made per redelivery: first deliveries, the
    many, keep the remembered envelope."""
    header, end = value_at(envelope)
    durable, priority, ttl = (list(header.value[1].value) + [Value("null", None)] * 3)[:3]
    fields = [encode(durable), encode(priority), encode(ttl)] + ([b"\x42", uint(count)] if count else [])
    while fields[-1] == NULL:
        fields.pop()
    return described(HEADER, encode_list(fields)) + envelope[end:]


def _ttl(expiration: str | None) -> int | None:
    return int(expiration) if expiration is not None and expiration.isdigit() and int(expiration) <= _UINT_MAX \
        else None


def from_amqp091(message: Message) -> bytes:
    """An AMQP 0-9-1 message as the record RabbitMQ 3.10.8 stores (what a stream-protocol consumer reads)."""
    return entry(message)[4:]


def entry(message: Message) -> bytes:
    """``from_amqp091`` as a chunk's simple entry: its size, then the record (one join, the envelope remembered)."""
    envelope, data_head, footer = record_parts(message, False)
    body = message.body
    return b"".join((_U32.pack(len(envelope) + len(data_head) + len(body) + len(footer)), envelope, data_head, body,
                     footer))


def record(message: Message, native: bool = False) -> bytes:
    """``from_amqp091``, or (``native``) the message an AMQP 1.0 consumer gets, as RabbitMQ 4.x converts it
    (mc_amqpl): a header section says ``durable``, ``priority``, ``ttl`` and ``first-acquirer``, and a body of
    AMQP 1.0 sections (type ``amqp-1.0``) goes out as those sections, the type not told."""
    envelope, data_head, footer = record_parts(message, native)
    return b"".join((envelope, data_head, message.body, footer))


def record_parts(message: Message, native: bool) -> tuple[bytes, bytes, bytes]:
    """``record`` in the parts around its body, for a writer that sends the body from where it is: the sections
    before the body, the body's data section constructor (empty for a body of AMQP 1.0 sections already), and
    the footer after it (empty but for an AMQP 1.0 publish's data body that had one).  A message published over
    AMQP 1.0 (``Message.amqp10``) keeps its sections: an AMQP 1.0 reader gets them as RabbitMQ 4.x sends them
    (``_kept_envelope``), and a stream stores them as RabbitMQ 4.x does (``native`` false), with a header
    section.  The last message's route and header objects are remembered with its parts, so a run of messages
    alike (their header shared by their publisher) costs no lookup."""
    global _last_parts
    route, header, size, kept, last = message.route, message.header, message.body_size, message.amqp10, _last_parts
    if last[0] is route and last[1] is header and last[2] is native and last[3] == size and last[4] is kept:
        return last[5]
    key = (route, header[12:], native, kept)
    cached = _ENVELOPES.get(key)
    if cached is None:
        sections_body = (native or kept is not None) and message.properties.message_type == AMQP10_TYPE
        if kept is not None:
            envelope = (_header_section(message) if native else _stored_header(message)) + _kept_envelope(
                message, kept)
        else:
            envelope = _envelope(message, sections_body, native)
            if native:
                envelope = _header_section(message) + envelope
        footer = b"".join(encoded for descriptor, _, encoded in sections(kept) if descriptor == FOOTER) \
            if kept else b""
        cached = (envelope, sections_body, footer)
        _ENVELOPES.put(key, cached, len(route) + len(header) + (len(kept) if kept else 0))
    envelope, sections_body, footer = cached
    if sections_body:
        parts = (envelope, b"", footer)
    else:
        parts = (envelope, _DATA_HEADS[size] if size < 256 else b"\x00\x53\x75\xb0" + _U32.pack(size), footer)
    _last_parts = (route, header, native, size, kept, parts)
    return parts


def _stored_header(message: Message) -> bytes:
    """The header section a stream keeps with an AMQP 1.0 message (rabbit_stream_queue: durable said always,
    first-acquirer true), which also tells its reader the record is one (``_HEADER_SECTION``)."""
    props = message.properties
    ttl = _ttl(props.expiration)
    return described(HEADER, encode_list([boolean(message.persistent), ubyte(props.priority) if props.priority
                                          is not None else NULL, uint(ttl) if ttl is not None else NULL, b"\x41"]))


def _kept_envelope(message: Message, kept: bytes) -> bytes:
    """An AMQP 1.0 message's sections after its header as RabbitMQ 4.x sends them (mc_amqp:protocol_state): its
    message annotations with ``x-exchange`` then ``x-routing-key`` set in place or added, its delivery
    annotations left out, its properties and application properties byte for byte."""
    annotations: list[tuple[Value, bytes]] = []
    bare = []
    for descriptor, content, encoded in sections(kept) if kept else ():
        if descriptor == MESSAGE_ANNOTATIONS and content.kind == "map":
            annotations = [(name, encode(value)) for name, value in content.value]
        elif descriptor in (PROPERTIES, APPLICATION_PROPERTIES):
            bare.append(encoded)
    for name, value in (("x-exchange", message.exchange), ("x-routing-key", message.routing_key)):
        entry = (Value("symbol", name), utf8(value))
        at = next((i for i, (key, _) in enumerate(annotations) if key == entry[0]), None)
        if at is None:
            annotations.append(entry)
        else:
            annotations[at] = entry
    return described(MESSAGE_ANNOTATIONS, encode_map([(encode(key), value) for key, value in annotations])) \
        + b"".join(bare)


def dead_lettered(kept: bytes, queue: str, reason: str, exchange: str, routing_keys: list[str],
                  expiration: str | None, now_ms: int) -> bytes:
    """An AMQP 1.0 message's kept sections (``Message.amqp10``) as it leaves ``queue`` dead-lettered, as RabbitMQ
    4.x records it (mc_amqp): its ``x-opt-deaths`` message annotation, an array of maps newest first, one per
    (queue, reason), counted, with the first and last time (ms), and the exchange, routing keys and ttl (the one
    ``expiration`` stands for) of its first death there; ``x-first-death-*`` set once, ``x-last-death-*`` each
    time.  An AMQP 1.0 reader gets these, not the 0-9-1 ``x-death`` header the message keeps for 0-9-1 readers.
    TooLarge if the sections would then hold more values than ``MAX_ITEMS`` (no reader would decode them)."""
    found, annotations, names = _annotations_of(kept)
    old = annotations[names["x-opt-deaths"]][1] if "x-opt-deaths" in names else None
    deaths = list(old.value) if old is not None and old.kind == "array" else []
    for i, death in enumerate(deaths):
        fields = {key.value: value for key, value in death.value} if death.kind == "map" else {}
        count = fields.get("count")
        if _says(fields.get("queue"), queue) and _says(fields.get("reason"), reason):
            number = count.value if count is not None and count.kind == "ulong" else 1
            del deaths[i]
            deaths.insert(0, Value("map", [(key, Value("ulong", number + 1)) if key.value == "count" else
                                           (key, Value("timestamp", now_ms)) if key.value == "last-time" else
                                           (key, value) for key, value in death.value]))
            break
    else:
        ttl = _ttl(expiration)
        entry = [("ttl", Value("uint", ttl))] if ttl is not None else []  # (first, as mc_amqp:encode_deaths)
        entry += [("queue", Value("string", queue)), ("reason", Value("symbol", reason)),
                  ("count", Value("ulong", 1)), ("first-time", Value("timestamp", now_ms)),
                  ("last-time", Value("timestamp", now_ms)), ("exchange", Value("string", exchange)),
                  ("routing-keys", Value("array", [Value("string", key) for key in routing_keys]))]
        deaths.insert(0, Value("map", [(Value("symbol", key), value) for key, value in entry]))
    updates = [("x-opt-deaths", Value("array", deaths))]
    if "x-first-death-queue" not in names:
        updates += [("x-first-death-queue", Value("string", queue)),
                    ("x-first-death-reason", Value("string", reason)),
                    ("x-first-death-exchange", Value("string", exchange))]
    updates += [("x-last-death-queue", Value("string", queue)), ("x-last-death-reason", Value("string", reason)),
                ("x-last-death-exchange", Value("string", exchange))]
    return _with_annotations(found, annotations, names, updates)


def _annotations_of(kept: bytes) -> tuple[list[tuple[int, Value, bytes]], list[tuple[Value, Value]], dict[str, int]]:
    """Kept sections (``Message.amqp10``), their message annotations, and where each symbol key is in them."""
    found = sections(kept) if kept else []
    annotations = next((list(content.value) for descriptor, content, _ in found
                        if descriptor == MESSAGE_ANNOTATIONS and content.kind == "map"), [])
    return found, annotations, {key.value: i for i, (key, _) in enumerate(annotations) if key.kind == "symbol"}


def _with_annotations(found: list[tuple[int, Value, bytes]], annotations: list[tuple[Value, Value]],
                      names: dict[str, int], updates: list[tuple[str, Value]]) -> bytes:
    """The sections ``found`` with their message annotations (``annotations``, their symbol keys' places in
    ``names``) set to ``updates``, each in its place or added.  TooLarge if they would then hold more values than a
    reader decodes (the caller keeps the sections it had)."""
    for name, value in updates:
        at = names.get(name)
        if at is None:
            names[name] = len(annotations)
            annotations.append((Value("symbol", name), value))
        else:
            annotations[at] = (annotations[at][0], value)
    section = described(MESSAGE_ANNOTATIONS, encode(Value("map", annotations)))
    before = [encoded for descriptor, _, encoded in found if descriptor in (HEADER, DELIVERY_ANNOTATIONS)]
    after = [encoded for descriptor, _, encoded in found if descriptor in (PROPERTIES, APPLICATION_PROPERTIES,
                                                                           FOOTER)]
    out = b"".join((*before, section, *after))
    sections(out)
    return out


MODIFIABLE = "x-opt-"  # the message annotations a modified outcome may set (RabbitMQ 4.x refuses others)


def modified(message: Message, annotations: bytes) -> Message:
    """A copy of ``message`` (its body loaded) with the message annotations of an AMQP 1.0 ``modified`` outcome
    set (``annotations``: their encoded map, ``x-opt-`` symbol keys), as RabbitMQ 4.x's quorum queues set them
    (rabbit_fifo keeps them with the message, mc:set_annotation applies them): in the sections an AMQP 1.0
    publish kept (the values as they came), and as headers (``_native_field``), which a 0-9-1 reader gets and an
    AMQP 1.0 reader of a 0-9-1 message gets back as annotations.  Not written to any store (no msg_id).  What is
    no map of symbols changes nothing (every copy of a quorum queue comes to the same message)."""
    try:
        found = value_at(annotations)[0]
    except (Invalid, TooLarge):
        found = Value("null", None)
    pairs = [(key.value, value) for key, value in found.value if key.kind == "symbol"] if found.kind == "map" else []
    out = message.copy()
    if not pairs:
        return out
    fields = message.typed_headers() if message.has_headers else {}
    for name, value in pairs:
        field = _native_field(value)
        if field is not None and len(name.encode()) <= 255:
            fields[name] = field
    out.replace_headers(fields)
    kept = message.amqp10
    if kept is not None:
        try:
            out.amqp10 = _with_annotations(*_annotations_of(kept), pairs)
        except (Invalid, TooLarge):  # (past the values one record may hold: its sections kept as they were)
            pass
    return out


def _says(value: Value | None, text: str) -> bool:
    return value is not None and value.kind in ("string", "symbol") and value.value == text


def kept_properties_of(message: Message) -> list[Value] | None:
    """The fields of the properties section an AMQP 1.0 publish had (kept with it, or in ``PROPERTIES_HEADER``
    by an older record), None if it had none kept: what a properties filter reads in place of 0-9-1's."""
    kept = message.amqp10
    if kept is None:
        section = message.header_value(PROPERTIES_HEADER) if message.has_headers else None
        return kept_properties(section) if isinstance(section, (bytes, bytearray)) else None
    fields = _KEPT_PROPERTIES.get(kept)
    if fields is None:
        fields = next((content.value for descriptor, content, _ in sections(kept)
                       if descriptor == PROPERTIES and content.kind == "list"), []) if kept else []
        _KEPT_PROPERTIES.put(kept, fields, len(kept))
    return fields


_KEPT_PROPERTIES: Memo[bytes, list[Value]] = Memo(SHARED_MEMO)


def kept_annotations(kept: bytes) -> dict[str, Value]:
    """The message annotations (symbol keys) of an AMQP 1.0 publish's kept sections (``Message.amqp10``), read
    once per distinct sections: what RabbitMQ 4.x's mc_amqp:x_header reads, where a 0-9-1 header (which also
    holds the application properties) would not do."""
    found = _KEPT_ANNOTATIONS.get(kept)
    if found is None:
        found = {key.value: value for descriptor, content, _ in (sections(kept) if kept else ())
                 if descriptor == MESSAGE_ANNOTATIONS and content.kind == "map"
                 for key, value in reversed(content.value) if key.kind == "symbol"}
        _KEPT_ANNOTATIONS.put(kept, found, len(kept))
    return found


_KEPT_ANNOTATIONS: Memo[bytes, dict[str, Value]] = Memo(SHARED_MEMO)


_DATA_HEADS = [b"\x00\x53\x75\xa0" + bytes((i,)) for i in range(256)]
_last_parts: tuple[bytes, bytes, bool, int, bytes | None, tuple[bytes, bytes, bytes]] = (
    b"", b"", False, -1, None, (b"", b"", b""))
_BYTES = [bytes((i,)) for i in range(256)]
_UINTS = [b"\x43"] + [b"\x52" + _BYTES[i] for i in range(1, 256)]  # uint0, then smalluint


def kept_properties(section: bytes | bytearray) -> list[Value] | None:
    """The fields of a properties section kept in ``PROPERTIES_HEADER``; None if it is not one (a header any
    publisher may set: only a well-formed section goes out as one)."""
    content = _section_content(section, PROPERTIES)
    return content.value if content is not None else None


def _envelope(message: Message, sections_body: bool = False, native: bool = False) -> bytes:
    """Everything of the record before its body: the same for every message with this route and these properties
    (``sections_body``: a body of AMQP 1.0 sections, whose type ``amqp-1.0`` is not told).  ``native``: for an
    AMQP 1.0 reader, ``x-`` headers are message annotations, as RabbitMQ 4.x converts them (mc_amqpl)."""
    props = message.properties
    annotations = [(symbol("x-routing-key"), utf8(message.routing_key)), (symbol("x-exchange"), utf8(message.exchange))]
    if native:  # (the header section says priority, durable and ttl)
        if props.message_type is not None and not sections_body:
            annotations.append((symbol("x-basic-type"), utf8(props.message_type)))
    elif props.priority is not None:
        annotations.append((symbol("x-basic-priority"), b"\x50" + bytes((props.priority,))))
    if props.delivery_mode is not None and not native:
        annotations.append((symbol("x-basic-delivery-mode"), b"\x50" + bytes((props.delivery_mode,))))
    if props.expiration is not None and not native:
        annotations.append((symbol("x-basic-expiration"), utf8(props.expiration)))
    application: list[tuple[bytes, bytes]] = []
    if props.message_type is not None and not native:
        application.append((utf8("x-basic-type"), utf8(props.message_type)))
    group_id = props.app_id if native else None
    if props.app_id is not None and not native:
        application.append((utf8("x-basic-app-id"), utf8(props.app_id)))
    kept: bytes | None = None  # (native) the properties section the publish had, if kept whole
    kept_application: bytes | None = None  # (native) and its application-properties section
    if message.has_headers:
        headers = message.typed_headers()
        if native:
            kept = _kept_section(headers.pop(PROPERTIES_HEADER, None), PROPERTIES)
            kept_application = _kept_section(headers.pop(APP_PROPERTIES_HEADER, None), APPLICATION_PROPERTIES)
        named = _application_names(kept_application) if kept_application is not None else ()
        for name, field in headers.items():
            if name in named:
                continue  # (the kept section says it)
            if native and name == "x-death":
                annotations.extend(_deaths(field, headers))
                continue
            value = _header_value(field)
            if value is None:
                continue
            if native and name.startswith("x-"):
                annotations.append((symbol(name), value))
            elif kept_application is None:
                application.append((utf8(name), value))
    out = [described(MESSAGE_ANNOTATIONS, encode_map(annotations))]
    values = [props.message_id, props.user_id, props.reply_to, props.correlation_id, props.content_type,
              props.content_encoding, props.timestamp, group_id]
    if kept is not None:
        out.append(kept)
    elif any(value is not None for value in values):
        out.append(described(PROPERTIES, encode_list([
            _id_value(props.message_id, native),
            binary(props.user_id.encode()) if props.user_id is not None else b"\x40",
            b"\x40", b"\x40",
            utf8(props.reply_to) if props.reply_to is not None else b"\x40",
            _id_value(props.correlation_id, native),
            symbol(props.content_type) if props.content_type is not None else b"\x40",
            symbol(props.content_encoding) if props.content_encoding is not None else b"\x40",
            b"\x40",
            b"\x83" + struct.pack(">q", props.timestamp * 1000) if props.timestamp is not None else b"\x40",
            utf8(group_id) if group_id is not None else b"\x40", b"\x40", b"\x40"])))
    if kept_application is not None:
        out.append(kept_application)
    elif application:
        out.append(described(APPLICATION_PROPERTIES, encode_map(application)))
    return b"".join(out)


def _deaths(field: header_table.Field, headers: dict[str, header_table.Field]) -> list[tuple[bytes, bytes]]:
    """A dead-lettered AMQP 0-9-1 message's ``x-death`` header as RabbitMQ 4.x gives an AMQP 1.0 reader its
    deaths (mc_amqp, as ``dead_lettered`` records them for an AMQP 1.0 message): ``x-opt-deaths``, one map a
    death, newest first, and the newest one's ``x-last-death-*``, unless headers say them."""
    deaths = [_death(death.value) for death in (field.value if field.kind == "A" else ()) if death.kind == "F"]
    if not deaths:
        return []
    out = [(symbol("x-opt-deaths"), encode(Value("array", deaths)))]
    newest = {key.value: value for key, value in deaths[0].value}
    for name in ("queue", "reason", "exchange"):
        if f"x-last-death-{name}" not in headers and name in newest:
            out.append((symbol(f"x-last-death-{name}"), utf8(newest[name].value)))
    return out


def _death(info: dict[str, header_table.Field]) -> Value:
    """One ``x-death`` table as an ``x-opt-deaths`` map: its time (seconds) is both the first and the last, as
    the header has no other."""
    def text(name: str, kind: str) -> Value | None:
        found = info.get(name)
        return Value(kind, found.value) if found is not None and found.kind == "S" else None

    count, when, keys, expiration = (info.get(name) for name in ("count", "time", "routing-keys",
                                                                 "original-expiration"))
    time = Value("timestamp", when.value * 1000) if when is not None and when.kind == "T" else None
    ttl = _ttl(expiration.value) if expiration is not None and expiration.kind == "S" else None
    entry = [("ttl", Value("uint", ttl) if ttl is not None else None),
             ("queue", text("queue", "string")), ("reason", text("reason", "symbol")),
             ("count", Value("ulong", max(count.value, 0)) if count is not None and count.kind in "bBsuIilL"
              else None),
             ("first-time", time), ("last-time", time), ("exchange", text("exchange", "string")),
             ("routing-keys", Value("array", [Value("string", key.value) for key in keys.value if key.kind == "S"])
              if keys is not None and keys.kind == "A" else None)]
    return Value("map", [(Value("symbol", name), value) for name, value in entry if value is not None])


def _id_value(value: str | None, native: bool) -> bytes:
    """A message or correlation id: (``native``) a URN of a uuid as the uuid, as mc_amqpl:convert_to reads it
    (the way back of ``_native_id``); else a string."""
    if value is None:
        return NULL
    if native and len(value) == 45 and value.startswith("urn:uuid:"):
        try:
            return b"\x98" + uuid.UUID(value[9:]).bytes
        except ValueError:
            pass
    return utf8(value)


def _kept_section(field: header_table.Field | None, descriptor: int) -> bytes | None:
    """A section kept whole in a header (``PROPERTIES_HEADER``, ``APP_PROPERTIES_HEADER``); None if the header
    is not one (any publisher may set it: only a well-formed section goes out as one)."""
    if field is None or field.kind != "x":
        return None
    content = _section_content(field.value, descriptor)
    return bytes(field.value) if content is not None else None


def _section_content(section: bytes | bytearray, descriptor: int) -> Value | None:
    try:
        value, end = value_at(bytes(section))
    except (Invalid, TooLarge):
        return None
    if end != len(section) or value.kind != "described" or value.value[0] != descriptor \
            or value.value[1].kind != ("list" if descriptor == PROPERTIES else "map"):
        return None
    return value.value[1]


def _application_names(section: bytes) -> frozenset[str]:
    content = _section_content(section, APPLICATION_PROPERTIES)
    return frozenset(key.value for key, _ in content.value if key.kind == "string") if content is not None \
        else frozenset()
