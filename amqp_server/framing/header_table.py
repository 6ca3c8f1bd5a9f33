"""A content header's ``headers`` table on the bytes, with every value's wire type kept.

pamqp picks integer widths by value when it encodes, so a table it re-encodes loses the publisher's
types (an ``I`` 5 comes back as ``b``) and cannot write RabbitMQ's x-death types (``l`` count, ``T``
time).  :func:`headers` decodes the table into :class:`Field` values that remember their type and
:func:`with_headers` writes one back, leaving every other property byte for byte; dead-lettering,
BCC removal, shovels and federation links use them, the links with RabbitMQ's own table edits
(:func:`set_value`, :func:`prepend_table`).  A delayed exchange reads ``x-delay`` from every message
published to it and rewrites it once (:func:`read`, :func:`with_int`) without decoding the rest.  A field
type this does not read raises :class:`Unsupported`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from . import codec

_LONG = struct.Struct(">I")
_FLAGS = struct.Struct(">H")  # the property flags, at offset 12 of a content header payload
# field type -> struct of an integer value (RabbitMQ's table types)
_INTS = {ord("b"): struct.Struct(">b"), ord("B"): struct.Struct(">B"), ord("s"): struct.Struct(">h"),
         ord("u"): struct.Struct(">H"), ord("I"): struct.Struct(">i"),
         ord("i"): struct.Struct(">I"), ord("l"): struct.Struct(">q"), ord("L"): struct.Struct(">q")}
# unsigned type -> the signed type of the same width, for writing a negative value
_SIGNED = {ord("B"): ord("b"), ord("u"): ord("s"), ord("i"): ord("I")}
_FIXED = {ord("t"): 1, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0,
          **{t: s.size for t, s in _INTS.items()}}
_SIZED = {ord("S"), ord("x"), ord("A"), ord("F")}  # a 4-byte length, then that many bytes


class NotInTable(Exception):
    """The bytes cannot be read here; decode the properties instead."""


def _find(header: bytes, flags: int, name: bytes) -> int | None:
    """Offset of the field type byte of ``name`` in the headers table, or None if it is absent."""
    if not flags & codec.FLAG_HEADERS:
        return None
    pos = codec.table_pos(header, flags)
    end = pos + 4 + _LONG.unpack_from(header, pos)[0]
    pos += 4
    while pos < end:
        length = header[pos]
        key = header[pos + 1:pos + 1 + length]
        pos += 1 + length
        if key == name:
            return pos
        kind = header[pos]
        pos += 1
        if kind in _SIZED:
            pos += 4 + _LONG.unpack_from(header, pos)[0]
        elif kind in _FIXED:
            pos += _FIXED[kind]
        else:
            raise NotInTable
    return None


def read(header: bytes, flags: int, name: str) -> Any:
    """An integer or string header's value, None if absent; Unsupported for other types."""
    pos = _find(header, flags, name.encode())
    if pos is None:
        return None
    kind = header[pos]
    if kind in _INTS:
        return _INTS[kind].unpack_from(header, pos + 1)[0]
    if kind == ord("S"):
        length = _LONG.unpack_from(header, pos + 1)[0]
        return header[pos + 5:pos + 5 + length].decode(errors="replace")
    raise NotInTable


def with_int(header: bytes, flags: int, name: str, value: int) -> bytes:
    """The header bytes with integer header ``name`` set to ``value`` (same width; an unsigned type becomes
    the signed one for a negative value); Unsupported if it is absent, not an integer, or ``value`` won't fit."""
    pos = _find(header, flags, name.encode())
    if pos is None or header[pos] not in _INTS:
        raise NotInTable
    kind = header[pos] if value >= 0 else _SIGNED.get(header[pos], header[pos])
    try:
        packed = _INTS[kind].pack(value)
    except struct.error:
        raise NotInTable from None
    return header[:pos] + bytes((kind,)) + packed + header[pos + 1 + len(packed):]


def has(header: bytes, name: str) -> bool:
    """Whether the headers table has a field ``name`` (Unsupported if a field before it cannot be read)."""
    return _find(header, _FLAGS.unpack_from(header, 12)[0], name.encode()) is not None


def with_field(header: bytes, name: str, value: bytes) -> bytes:
    """The header bytes with field ``name``, which it does not have (:func:`has`), added with ``value`` (its type
    byte and bytes, as :func:`encode_value` writes them) at the end of the table, every other byte kept."""
    flags = _FLAGS.unpack_from(header, 12)[0]
    key = name.encode()
    field = bytes((len(key),)) + key + value
    pos = codec.table_pos(header, flags)
    if not flags & codec.FLAG_HEADERS:  # a table of this one field, where the headers go
        return header[:12] + _FLAGS.pack(flags | codec.FLAG_HEADERS) + header[14:pos] + _LONG.pack(len(field)) + field \
            + header[pos:]
    end = pos + 4 + _LONG.unpack_from(header, pos)[0]
    return header[:pos] + _LONG.pack(end - pos - 4 + len(field)) + header[pos + 4:end] + field + header[end:]


def with_int_set(header: bytes, name: str, value: int) -> bytes:
    """The header bytes with integer header ``name`` set to ``value``: in place where it is an integer that
    fits, else added (or replaced) as a long-long, as RabbitMQ writes its own counters."""
    flags = _FLAGS.unpack_from(header, 12)[0]
    try:
        if _find(header, flags, name.encode()) is None:  # the usual case: appended to the table's bytes
            return with_field(header, name, b"l" + _INTS[ord("l")].pack(value))
        return with_int(header, flags, name, value)
    except NotInTable:
        fields = headers(header, flags)
        fields[name] = Field("l", value)
        return with_headers(header, flags, fields)


@dataclass(frozen=True)
class Field:
    """A table value with its AMQP field type, so a re-encoded table keeps the publisher's widths.

    ``value`` is an int (integer types, ``t``, ``T``), float (``f``, ``d``), (scale, digits) for ``D``,
    str for ``S`` (surrogate-escaped, so any bytes survive), bytes for ``x``, a list of Field for ``A``,
    a dict of Field for ``F``, None for ``V``.
    """
    kind: str
    value: Any


_FLOATS = {"f": struct.Struct(">f"), "d": struct.Struct(">d")}
_DECIMAL = struct.Struct(">BI")
_TIMESTAMP = struct.Struct(">Q")


def _decode_value(buf: bytes, pos: int) -> tuple[Field, int]:
    kind = chr(buf[pos])
    pos += 1
    if ord(kind) in _INTS:
        packer = _INTS[ord(kind)]
        return Field(kind, packer.unpack_from(buf, pos)[0]), pos + packer.size
    if kind in _FLOATS:
        return Field(kind, _FLOATS[kind].unpack_from(buf, pos)[0]), pos + _FLOATS[kind].size
    if kind == "t":
        return Field(kind, buf[pos]), pos + 1
    if kind == "T":
        return Field(kind, _TIMESTAMP.unpack_from(buf, pos)[0]), pos + 8
    if kind == "D":
        return Field(kind, _DECIMAL.unpack_from(buf, pos)), pos + 5
    if kind == "V":
        return Field(kind, None), pos
    if ord(kind) not in _SIZED:
        raise NotInTable
    end = pos + 4 + _LONG.unpack_from(buf, pos)[0]
    data = buf[pos + 4:end]
    if kind == "S":
        return Field(kind, data.decode("utf-8", "surrogateescape")), end
    if kind == "x":
        return Field(kind, bytes(data)), end
    if kind == "F":
        return Field(kind, decode(data)), end
    items, at = [], 0
    while at < len(data):
        item, at = _decode_value(data, at)
        items.append(item)
    return Field(kind, items), end


def decode(table: bytes) -> dict[str, Field]:
    """A field table's contents (without its length prefix), every value typed."""
    fields: dict[str, Field] = {}
    pos = 0
    while pos < len(table):
        length = table[pos]
        name = table[pos + 1:pos + 1 + length].decode("utf-8", "surrogateescape")
        fields[name], pos = _decode_value(table, pos + 1 + length)
    return fields


def encode_value(field: Field) -> bytes:
    """A typed value's bytes in a table: its type byte, then the value."""
    kind, value = field.kind, field.value
    code = kind.encode()
    if ord(kind) in _INTS:
        return code + _INTS[ord(kind)].pack(value)
    if kind in _FLOATS:
        return code + _FLOATS[kind].pack(value)
    if kind == "t":
        return code + bytes((value,))
    if kind == "T":
        return code + _TIMESTAMP.pack(value)
    if kind == "D":
        return code + _DECIMAL.pack(*value)
    if kind == "V":
        return code
    if kind == "S":
        data = value.encode("utf-8", "surrogateescape")
    elif kind == "x":
        data = value
    elif kind == "F":
        data = encode(value)
    elif kind == "A":
        data = b"".join(encode_value(item) for item in value)
    else:
        raise ValueError(f"unknown field type {kind!r}")
    return code + _LONG.pack(len(data)) + data


def encode(fields: dict[str, Field]) -> bytes:
    """The field table bytes (without its length prefix) of typed ``fields``."""
    out = []
    for name, field in fields.items():
        key = name.encode("utf-8", "surrogateescape")
        out.append(bytes((len(key),)) + key + encode_value(field))
    return b"".join(out)


INVALID_HEADERS = "x-invalid-headers"  # rabbit_basic's ?INVALID_HEADERS_KEY


def set_value(fields: dict[str, Field], name: str, value: Field) -> dict[str, Field]:
    """rabbit_misc:set_table_value: ``fields`` with ``name`` set to ``value`` (in its place, else added), the
    table then sorted by name as RabbitMQ sorts it (sort_field_table: the names' bytes)."""
    return sort_table({**fields, name: value})


def sort_table(fields: dict[str, Field]) -> dict[str, Field]:
    """rabbit_misc:sort_field_table: ``fields`` in the order of their names' bytes."""
    return dict(sorted(fields.items(), key=lambda item: item[0].encode("utf-8", "surrogateescape")))


def prepend_table(fields: dict[str, Field], name: str, entry: dict[str, Field]) -> dict[str, Field]:
    """rabbit_basic:prepend_table_header: ``entry`` put first in the array ``name`` (the hop lists x-shovelled,
    x-received-from); a ``name`` that is not an array is replaced by a new one and its value kept under
    ``x-invalid-headers`` (set_invalid_header)."""
    existing = fields.get(name)
    prior = existing.value if existing is not None and existing.kind == "A" else []
    changed = set_value(fields, name, Field("A", [Field("F", entry), *prior]))
    if existing is None or existing.kind == "A":
        return changed
    return _set_invalid(changed, name, existing)


def _set_invalid(fields: dict[str, Field], name: str, value: Field) -> dict[str, Field]:
    invalid = fields.get(INVALID_HEADERS)
    if invalid is not None and invalid.kind != "F":  # (itself corrupt: kept in itself first)
        fields = set_value(fields, INVALID_HEADERS, Field("F", {INVALID_HEADERS: Field("A", [invalid])}))
        invalid = fields[INVALID_HEADERS]
    table: dict[str, Field] = invalid.value if invalid is not None else {}
    prior = table.get(name)
    values = [value, *(prior.value if prior is not None and prior.kind == "A" else [])]
    return set_value(fields, INVALID_HEADERS, Field("F", set_value(table, name, Field("A", values))))


def headers(header: bytes, flags: int) -> dict[str, Field]:
    """The typed headers table of a content header ({} when it has none)."""
    if not flags & codec.FLAG_HEADERS:
        return {}
    pos = codec.table_pos(header, flags)
    return decode(header[pos + 4:pos + 4 + _LONG.unpack_from(header, pos)[0]])


def with_headers(header: bytes, flags: int, fields: dict[str, Field]) -> bytes:
    """The content header bytes with its headers table replaced by ``fields`` (other properties untouched)."""
    pos = codec.table_pos(header, flags)
    end = pos + 4 + _LONG.unpack_from(header, pos)[0] if flags & codec.FLAG_HEADERS else pos
    table = encode(fields)
    flags |= codec.FLAG_HEADERS
    return header[:12] + struct.pack(">H", flags) + header[14:pos] + _LONG.pack(len(table)) + table + header[end:]
