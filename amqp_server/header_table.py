"""One entry of a content header's ``headers`` table, read or overwritten in the header bytes.

A delayed exchange reads ``x-delay`` from every message published to it, and
rewrites it once; doing that on the bytes, instead of decoding and re-encoding
every property with pamqp, keeps a delayed publish cheap.  Anything unusual
(a property flag continuation word, a field type this does not read) raises
:class:`Unsupported` and the caller goes through pamqp.
"""
from __future__ import annotations

import struct
from typing import Any

from . import codec

_LONG = struct.Struct(">I")
# field type -> struct of an integer value (RabbitMQ's table types)
_INTS = {ord("b"): struct.Struct(">b"), ord("B"): struct.Struct(">B"), ord("s"): struct.Struct(">h"),
         ord("u"): struct.Struct(">H"), ord("I"): struct.Struct(">i"),
         ord("i"): struct.Struct(">I"), ord("l"): struct.Struct(">q"), ord("L"): struct.Struct(">q")}
# unsigned type -> the signed type of the same width, for writing a negative value
_SIGNED = {ord("B"): ord("b"), ord("u"): ord("s"), ord("i"): ord("I")}
_FIXED = {ord("t"): 1, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0,
          **{t: s.size for t, s in _INTS.items()}}
_SIZED = {ord("S"), ord("x"), ord("A"), ord("F")}  # a 4-byte length, then that many bytes


class Unsupported(Exception):
    """The bytes cannot be read here; decode the properties instead."""


def _find(header: bytes, flags: int, name: bytes) -> int | None:
    """Offset of the field type byte of ``name`` in the headers table, or None if it is absent."""
    if flags & 0x0001:
        raise Unsupported
    if not flags & codec.FLAG_HEADERS:
        return None
    pos = 14
    if flags & codec.FLAG_CONTENT_TYPE:
        pos += 1 + header[pos]
    if flags & codec.FLAG_CONTENT_ENCODING:
        pos += 1 + header[pos]
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
            raise Unsupported
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
    raise Unsupported


def with_int(header: bytes, flags: int, name: str, value: int) -> bytes:
    """The header bytes with integer header ``name`` set to ``value`` (same width; an unsigned type becomes
    the signed one for a negative value); Unsupported if it is absent, not an integer, or ``value`` won't fit."""
    pos = _find(header, flags, name.encode())
    if pos is None or header[pos] not in _INTS:
        raise Unsupported
    kind = header[pos] if value >= 0 else _SIGNED.get(header[pos], header[pos])
    try:
        packed = _INTS[kind].pack(value)
    except struct.error:
        raise Unsupported from None
    return header[:pos] + bytes((kind,)) + packed + header[pos + 1 + len(packed):]
