"""AMQP 1.0 messages inside streams, converted to and from AMQP 0-9-1 as RabbitMQ 3.10 converts them
(rabbit_msg_record: ``from_amqp091`` when an AMQP 0-9-1 publish is read over the stream protocol, ``to_amqp091``
when a stream-protocol publish is read over AMQP 0-9-1).

Mapping (3.10): properties message-id, user-id, reply-to, correlation-id, content-type, content-encoding and
creation-time (ms; 0-9-1 timestamps are seconds) go both ways; 0-9-1 headers are application-properties;
``type`` and ``app_id`` travel as application-properties ``x-basic-type`` / ``x-basic-app-id``, and priority,
delivery mode and expiration as message-annotations ``x-basic-priority`` / ``x-basic-delivery-mode`` /
``x-basic-expiration``; the body is one data section (several are joined on the way back).  A record that is not
an AMQP 1.0 message (the stream protocol does not look inside) reaches AMQP 0-9-1 as the body, no properties.
"""
from __future__ import annotations

import datetime
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from .. import header_table
from ..message import Message, build_header, encode_route

# section descriptors
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
_PROPERTY_NAMES = ("message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                   "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                   "reply_to_group_id")
MAX_DEPTH = 32


class Invalid(ValueError):
    """Not an AMQP 1.0 message."""


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


def _decode(buf: bytes, pos: int, depth: int = 0) -> tuple[Value, int]:
    return _decode_as(_byte(buf, pos), buf, pos + 1, depth)


def _decode_as(code: int, buf: bytes, pos: int, depth: int) -> tuple[Value, int]:
    """The value of type ``code`` at ``pos`` (its constructor read already)."""
    if depth > MAX_DEPTH:
        raise Invalid("nested too deep")
    if code == 0x00:  # described: descriptor, then value
        descriptor, pos = _decode(buf, pos, depth + 1)
        value, pos = _decode(buf, pos, depth + 1)
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
        kind, width = variable
        size, pos = _size(buf, pos, width)
        raw = _slice(buf, pos, size)
        if kind == "binary":
            return Value(kind, raw), pos + size
        try:
            return Value(kind, raw.decode()), pos + size
        except UnicodeDecodeError:
            raise Invalid("string is not UTF-8") from None
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        width = 1 if code in (0xC0, 0xC1) else 4
        size, pos = _size(buf, pos, width)
        end = pos + size
        if end > len(buf):
            raise Invalid("truncated")
        count, pos = _size(buf, pos, width)
        items = []
        for _ in range(count):
            item, pos = _decode(buf, pos, depth + 1)
            items.append(item)
        if pos > end:
            raise Invalid("compound runs past its size")
        if code in (0xC1, 0xD1):
            if count % 2:
                raise Invalid("map with an odd count")
            return Value("map", list(zip(items[::2], items[1::2]))), end
        return Value("list", items), end
    if code in (0xE0, 0xF0):
        width = 1 if code == 0xE0 else 4
        size, pos = _size(buf, pos, width)
        end = pos + size
        count, pos = _size(buf, pos, width)
        element = _byte(buf, pos)
        if element == 0x00:
            raise Invalid("arrays of described values are not read")
        pos += 1
        items = []
        for _ in range(count):
            item, pos = _decode_as(element, buf, pos, depth + 1)
            items.append(item)
        if pos > end:
            raise Invalid("array runs past its size")
        return Value("array", items), end
    raise Invalid(f"unknown type code 0x{code:02x}")


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


def sections(record: bytes) -> list[tuple[int, Value, bytes]]:
    """(descriptor, value, encoded bytes) of each section of an AMQP 1.0 message; Invalid if it is not one."""
    found = []
    pos = 0
    while pos < len(record):
        start = pos
        value, pos = _decode(record, pos)
        if value.kind != "described" or not isinstance(value.value[0], int):
            raise Invalid("not a message section")
        descriptor, content = value.value
        if not HEADER <= descriptor <= FOOTER:
            raise Invalid("unknown section")
        found.append((descriptor, content, record[start:pos]))
    if not found:
        raise Invalid("empty")
    return found


# -- AMQP 1.0 -> AMQP 0-9-1 ---------------------------------------------------------------------------------------

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
    if kind in ("long", "ulong"):
        return header_table.Field("l", raw if kind == "long" else min(raw, (1 << 63) - 1))
    if kind in ("int", "uint"):
        return header_table.Field("I" if kind == "int" and raw >= -(1 << 31) else "l", raw)
    if kind in ("short", "ushort", "byte", "ubyte"):
        return header_table.Field({"short": "s", "ushort": "u", "byte": "b", "ubyte": "B"}[kind], raw)
    if kind == "double":
        return header_table.Field("d", raw)
    if kind == "float":
        return header_table.Field("f", raw)
    if kind == "timestamp":
        return header_table.Field("T", raw // 1000)
    if kind == "null":
        return header_table.Field("V", None)
    if kind == "uuid":
        return header_table.Field("S", str(raw))
    return None


def _message_id(value: Value | None, name: str, headers: dict[str, header_table.Field]) -> str | None:
    """A message or correlation id; one that is not a string is written as one, its type in a header."""
    if value is None or value.kind == "null":
        return None
    if value.kind == "string":
        return value.value
    if value.kind == "ulong":
        headers[name] = header_table.Field("S", "ulong")
        return str(value.value)
    if value.kind == "uuid":
        headers[name] = header_table.Field("S", "uuid")
        return str(value.value)
    if value.kind == "binary":
        headers[name] = header_table.Field("S", "binary")
        return value.value.decode("utf-8", "replace")
    return None


def _map(value: Value) -> dict[str, Value]:
    if value.kind != "map":
        return {}
    return {str(key.value): item for key, item in value.value if key.kind in ("string", "symbol")}


def to_amqp091(record: bytes, stream: str) -> Message:
    """A stream record as the AMQP 0-9-1 message RabbitMQ 3.10 delivers from a stream: exchange "" and the
    stream's name as routing key; a record that is not AMQP 1.0 is the body, as it is."""
    try:
        found = sections(record)
    except Invalid:
        return _message(stream, commands.Basic.Properties(), {}, record)
    props: dict[str, Value] = {}
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
    headers: dict[str, header_table.Field] = {}
    basic_type = application.pop("x-basic-type", None)
    app_id = application.pop("x-basic-app-id", None)
    for name, value in application.items():
        converted = _field(value)
        if converted is not None:
            headers[name] = converted
    message_id = _message_id(props.get("message_id"), "x-message-id-type", headers)
    correlation_id = _message_id(props.get("correlation_id"), "x-correlation-id-type", headers)
    user_id = props.get("user_id")
    created = props.get("creation_time")
    priority = annotations.get("x-basic-priority")
    mode = annotations.get("x-basic-delivery-mode")
    expiration = annotations.get("x-basic-expiration")
    basic = commands.Basic.Properties(
        content_type=_text(props.get("content_type")), content_encoding=_text(props.get("content_encoding")),
        delivery_mode=_int(mode), priority=_int(priority), correlation_id=correlation_id,
        reply_to=_text(props.get("reply_to")), expiration=_text(expiration), message_id=message_id,
        timestamp=_timestamp(created), message_type=_text(basic_type), app_id=_text(app_id),
        user_id=user_id.value.decode("utf-8", "replace") if user_id is not None and user_id.kind == "binary"
        else _text(user_id))
    return _message(stream, basic, headers, b"".join(body))


def _text(value: Value | None) -> str | None:
    if value is None or value.kind not in ("string", "symbol"):
        return None
    return value.value[:255]


def _int(value: Value | None) -> int | None:
    if value is None or not isinstance(value.value, int) or isinstance(value.value, bool):
        return None
    return value.value if 0 <= value.value <= 255 else None


def _timestamp(value: Value | None) -> datetime.datetime | None:
    if value is None or value.kind != "timestamp":
        return None
    return datetime.datetime.fromtimestamp(value.value // 1000, datetime.timezone.utc)


def _message(stream: str, props: commands.Basic.Properties, headers: dict[str, header_table.Field],
             body: bytes) -> Message:
    header = build_header(props, len(body))
    if headers:
        header = header_table.with_headers(header, struct.unpack_from(">H", header, 12)[0], headers)
    return Message("", stream, encode_route("", stream), header, body)


# -- AMQP 0-9-1 -> AMQP 1.0 ---------------------------------------------------------------------------------------

def _encode(value: Any) -> bytes:
    """A Python value (or a Value for a symbol, ubyte, binary, timestamp) in AMQP 1.0's encoding."""
    if isinstance(value, Value):
        kind, raw = value.kind, value.value
        if kind == "symbol":
            data = raw.encode()
            return (b"\xa3" + bytes((len(data),)) if len(data) < 256 else b"\xb3" + _U32.pack(len(data))) + data
        if kind == "ubyte":
            return b"\x50" + bytes((raw,))
        if kind == "timestamp":
            return b"\x83" + struct.pack(">q", raw)
        if kind == "byte":
            return b"\x51" + struct.pack(">b", raw)
        if kind == "short":
            return b"\x61" + struct.pack(">h", raw)
        if kind == "int":
            return b"\x71" + struct.pack(">i", raw)
        if kind == "ushort":
            return b"\x60" + struct.pack(">H", raw)
        if kind == "uint":
            return b"\x70" + _U32.pack(raw)
        if kind == "float":
            return b"\x72" + struct.pack(">f", raw)
        raise ValueError(kind)
    if value is None:
        return b"\x40"
    if isinstance(value, bool):
        return b"\x41" if value else b"\x42"
    if isinstance(value, int):
        return b"\x81" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"\x82" + struct.pack(">d", value)
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
        return (b"\xa1" + bytes((len(data),)) if len(data) < 256 else b"\xb1" + _U32.pack(len(data))) + data
    if isinstance(value, (bytes, bytearray)):
        return (b"\xa0" + bytes((len(value),)) if len(value) < 256 else b"\xb0" + _U32.pack(len(value))) + value
    if isinstance(value, list):
        items = b"".join(_encode(item) for item in value)
        return b"\xd0" + _U32.pack(len(items) + 4) + _U32.pack(len(value)) + items
    if isinstance(value, dict):
        items = b"".join(_encode(k) + _encode(v) for k, v in value.items())
        return b"\xd1" + _U32.pack(len(items) + 4) + _U32.pack(len(value) * 2) + items
    raise ValueError(type(value).__name__)


def _section(descriptor: int, value: Any) -> bytes:
    return b"\x00\x53" + bytes((descriptor,)) + _encode(value)


def _from_field(field: header_table.Field) -> Any:
    """An AMQP 0-9-1 header value as an application property (rabbit_msg_record:from_091)."""
    kind, value = field.kind, field.value
    if kind == "S":
        return value
    if kind == "t":
        return bool(value)
    if kind == "T":
        return Value("timestamp", value * 1000)
    if kind == "b":
        return Value("byte", value)
    if kind == "B":
        return Value("ubyte", value)
    if kind == "s":
        return Value("short", value)
    if kind == "u":
        return Value("ushort", value)
    if kind == "I":
        return Value("int", value)
    if kind == "i":
        return Value("uint", value)
    if kind == "f":
        return Value("float", value)
    if kind in ("l", "L", "d", "x"):
        return value
    if kind == "V":
        return None
    return None  # tables, arrays and decimals: RabbitMQ 3.10 leaves them out (unsupported_header_value_type)


def from_amqp091(message: Message) -> bytes:
    """An AMQP 0-9-1 message as the AMQP 1.0 record a stream-protocol consumer reads."""
    props = message.properties
    fields = header_table.headers(message.header, struct.unpack_from(">H", message.header, 12)[0]) \
        if message.has_headers else {}
    out: list[bytes] = []
    annotations: dict[Any, Any] = {}
    for name, value in (("x-basic-expiration", props.expiration), ("x-basic-delivery-mode", props.delivery_mode),
                        ("x-basic-priority", props.priority)):
        if value is not None:
            annotations[Value("symbol", name)] = value if isinstance(value, str) else Value("ubyte", value)
    if annotations:
        out.append(_section(MESSAGE_ANNOTATIONS, annotations))
    user_id = props.user_id.encode() if props.user_id is not None else None
    values = [props.message_id, user_id, None, None, props.reply_to, props.correlation_id,
              Value("symbol", props.content_type) if props.content_type is not None else None,
              Value("symbol", props.content_encoding) if props.content_encoding is not None else None, None,
              Value("timestamp", props.timestamp * 1000) if props.timestamp is not None else None]
    while values and values[-1] is None:
        values.pop()
    if values:
        out.append(_section(PROPERTIES, values))
    application: dict[Any, Any] = {}
    for name, field in fields.items():
        if field.kind not in ("F", "A", "D"):
            application[name] = _from_field(field)
    if props.app_id is not None:
        application["x-basic-app-id"] = props.app_id
    if props.message_type is not None:
        application["x-basic-type"] = props.message_type
    if application:
        out.append(_section(APPLICATION_PROPERTIES, application))
    out.append(_section(DATA, bytes(message.body)))
    return b"".join(out)


def stored_record(message: Message) -> bytes:
    """What a stream-protocol consumer reads for a stored message: a record published over the stream protocol
    (kept with no AMQP 0-9-1 header) as it came, an AMQP 0-9-1 publish converted."""
    return message.body if not message.header else from_amqp091(message)


def is_record(message: Message) -> bool:
    """Published over the stream protocol: its body is the record, it has no AMQP 0-9-1 header."""
    return not message.header

