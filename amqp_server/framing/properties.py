"""The basic class's content properties on the bytes, as they arrived.

A published content header is checked once, structurally (:func:`check`): one walk over the
property block and its field tables, with no objects built.  What RabbitMQ cannot decode it
refuses, and so does Warren.  Afterwards every property is read (:func:`read_str`) and replaced
(:func:`replace`) on the bytes, so a value the broker does not change leaves exactly as it came:
a timestamp stays an opaque 64-bit integer, a header keeps its wire type.  :func:`decode` gives
them all, for the management API, the Spark bridge and routing on headers; it cannot fail on a
header :func:`check` accepted.
"""
from __future__ import annotations

import decimal
import struct
from dataclasses import dataclass
from typing import Any

from . import codec, header_table

_LONG = struct.Struct(">I")
_TIMESTAMP = struct.Struct(">Q")

# (flag, attribute, wire kind) in wire order: s shortstr, F table, o octet, T timestamp
FIELDS = (
    (0x8000, "content_type", "s"),
    (0x4000, "content_encoding", "s"),
    (0x2000, "headers", "F"),
    (0x1000, "delivery_mode", "o"),
    (0x0800, "priority", "o"),
    (0x0400, "correlation_id", "s"),
    (0x0200, "reply_to", "s"),
    (0x0100, "expiration", "s"),
    (0x0080, "message_id", "s"),
    (0x0040, "timestamp", "T"),
    (0x0020, "message_type", "s"),
    (0x0010, "user_id", "s"),
    (0x0008, "app_id", "s"),
    (0x0004, "cluster_id", "s"),
)
_KIND = {flag: kind for flag, _, kind in FIELDS}
_AFTER_HEADERS = tuple((flag, kind) for flag, _, kind in FIELDS[3:])
FLAG_CONTENT_ENCODING, FLAG_HEADERS = codec.FLAG_CONTENT_ENCODING, codec.FLAG_HEADERS
FLAG_CONTENT_TYPE = codec.FLAG_CONTENT_TYPE
FLAG_CONTINUATION = 0x0001
MAX_TABLE_DEPTH = 100  # nested tables / arrays; deeper ones would exhaust a reader's (or a client's) stack

# field value types RabbitMQ's rabbit_binary_parser reads: fixed sizes, and the 4-byte-length ones
_FIXED = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4, ord("i"): 4,
          ord("l"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0}
_TABLE, _ARRAY = ord("F"), ord("A")
_SIZED = {ord("S"), ord("x"), _TABLE, _ARRAY}


class MalformedProperties(ValueError):
    """A property block RabbitMQ could not decode either."""


def check(header: bytes | bytearray) -> None:
    """Malformed unless the content header's property block decodes exactly to its end."""
    if len(header) < 14:
        raise MalformedProperties("content header shorter than 14 octets")
    flags = header[12] << 8 | header[13]
    if flags & FLAG_CONTINUATION:
        raise MalformedProperties("property flags continuation is not used by the basic class")
    pos = 14
    end = len(header)
    for flag, name, kind in FIELDS:
        if not flags & flag:
            continue
        if kind == "s":
            if pos >= end:
                raise MalformedProperties(f"{name} truncated")
            pos += 1 + header[pos]
        elif kind == "F":
            if pos + 4 > end:
                raise MalformedProperties("headers truncated")
            size = _LONG.unpack_from(header, pos)[0]
            pos += 4
            if pos + size > end:
                raise MalformedProperties(f"headers table of {size} octets exceeds the frame")
            _check_table(header, pos, pos + size)
            pos += size
        elif kind == "o":
            pos += 1
        else:
            pos += 8
        if pos > end:
            raise MalformedProperties(f"{name} truncated")
    if pos != end:
        raise MalformedProperties(f"{end - pos} octets after the last property")


def _check_table(buf: bytes | bytearray, pos: int, end: int) -> None:
    """Walk a field table (and every table or array in it) without recursion."""
    stack: list[tuple[int, bool]] = []  # (end, is_array) of the enclosing containers
    is_array = False
    while True:
        if pos == end:
            if not stack:
                return
            end, is_array = stack.pop()
            continue
        if not is_array:
            pos += 1 + buf[pos]  # field name
            if pos >= end:
                raise MalformedProperties("field table entry truncated")
        kind = buf[pos]
        pos += 1
        if kind in _FIXED:
            pos += _FIXED[kind]
        elif kind in _SIZED:
            if pos + 4 > end:
                raise MalformedProperties("field value truncated")
            size = _LONG.unpack_from(buf, pos)[0]
            pos += 4
            if pos + size > end:
                raise MalformedProperties("field value exceeds its table")
            if kind == _TABLE or kind == _ARRAY:
                if len(stack) >= MAX_TABLE_DEPTH:
                    raise MalformedProperties(f"tables nested deeper than {MAX_TABLE_DEPTH}")
                stack.append((end, is_array))
                end, is_array = pos + size, kind == _ARRAY
                continue
            pos += size
        else:
            raise MalformedProperties(f"unknown field type {chr(kind)!r}")
        if pos > end:
            raise MalformedProperties("field value exceeds its table")


def locate(header: bytes, flag: int) -> tuple[int, int]:
    """(start, end) of property ``flag``'s encoded value, or (where it would go, same) if it is not set."""
    flags = header[12] << 8 | header[13]
    if flag > FLAG_HEADERS:  # content_type or content_encoding
        pos = 15 + header[14] if flag == FLAG_CONTENT_ENCODING and flags & FLAG_CONTENT_TYPE else 14
    else:
        pos = codec.table_pos(header, flags)
        if flag < FLAG_HEADERS:
            if flags & FLAG_HEADERS:
                pos += 4 + _LONG.unpack_from(header, pos)[0]
            for field_flag, kind in _AFTER_HEADERS:
                if field_flag == flag:
                    break
                if flags & field_flag:
                    pos += _width(header, pos, kind)
    if not flags & flag:
        return pos, pos
    return pos, pos + _width(header, pos, _KIND[flag])


def _width(header: bytes, pos: int, kind: str) -> int:
    if kind == "s":
        return 1 + header[pos]
    if kind == "F":
        return 4 + _LONG.unpack_from(header, pos)[0]
    return 1 if kind == "o" else 8


def read_str(header: bytes, flag: int) -> str | None:
    """A shortstr property (None if unset); bytes that are not UTF-8 become U+FFFD."""
    if not (header[12] << 8 | header[13]) & flag:
        return None
    start, end = locate(header, flag)
    return header[start + 1:end].decode("utf-8", "replace")


def replace(header: bytes, flag: int, encoded: bytes | None) -> bytes:
    """The header with property ``flag`` set to ``encoded`` (its wire form, length prefix included) or,
    with None, removed; every other byte stays."""
    flags = header[12] << 8 | header[13]
    start, end = locate(header, flag)
    flags = flags | flag if encoded is not None else flags & ~flag
    return header[:12] + struct.pack(">H", flags) + header[14:start] + (encoded or b"") + header[end:]


_BY_NAME = {name: (flag, kind) for flag, name, kind in FIELDS}


def with_value(header: bytes, name: str, value: str | int) -> bytes:
    """The header with property ``name`` (a :class:`Properties` attribute other than ``headers``) set to
    ``value``; every other byte stays."""
    flag, kind = _BY_NAME[name]
    if kind == "s":
        encoded = codec.shortstr(str(value))
    elif kind == "o":
        encoded = bytes((int(value),))
    elif kind == "T":
        encoded = _TIMESTAMP.pack(int(value))
    else:
        raise ValueError(f"{name} is not set with with_value")
    return replace(header, flag, encoded)


@dataclass(slots=True)
class Properties:
    """Every basic property, decoded; ``timestamp`` is the wire's integer (seconds), never a datetime."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    message_type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


def decode(header: bytes) -> Properties:
    """All properties of a header :func:`check` accepted (or the broker built)."""
    props = Properties()
    flags = header[12] << 8 | header[13]
    pos = 14
    for flag, name, kind in FIELDS:
        if not flags & flag:
            continue
        width = _width(header, pos, kind)
        if kind == "s":
            value: Any = header[pos + 1:pos + width].decode("utf-8", "replace")
        elif kind == "F":
            value = plain(header_table.decode(header[pos + 4:pos + width]))
        elif kind == "o":
            value = header[pos]
        else:
            value = _TIMESTAMP.unpack_from(header, pos)[0]
        setattr(props, name, value)
        pos += width
    return props


def plain(fields: dict[str, header_table.Field]) -> dict[str, Any]:
    """A typed table as Python values: strings that are not UTF-8 stay bytes, timestamps stay integers."""
    return {name: _plain(field) for name, field in fields.items()}


def _plain(field: header_table.Field) -> Any:
    kind, value = field.kind, field.value
    if kind == "S":
        raw = value.encode("utf-8", "surrogateescape")
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return raw
    if kind == "F":
        return plain(value)
    if kind == "A":
        return [_plain(item) for item in value]
    if kind == "t":
        return bool(value)
    if kind == "D":
        scale, digits = value
        return decimal.Decimal(digits).scaleb(-scale)
    return value
