"""The AMQP field type of a decoded table value, as RabbitMQ names it in its refusals, and kept in JSON.

pamqp decodes every integer type to ``int`` and both float types to ``float``, so a refusal such as
``{unacceptable_type,byte}`` (aio-pika sends a small integer as a byte) could not name what the client
sent.  :func:`install` makes pamqp decode those types as ``int`` and ``float`` subclasses that remember
their wire type; they are ints and floats everywhere else (arithmetic, JSON, comparisons).  A value that
did not come off the wire is named as a typical client encodes it: an int as 32 bits if it fits.

:func:`to_json` and :func:`from_json` keep any decoded table (a durable object's arguments, in LMDB, etcd and
definitions exports) in JSON so that it comes back equal, with every value's type: what plain JSON would bring
back as it was stays plain, anything else (a timestamp, a decimal, a byte array, a byte or short or 64-bit
integer, a 32-bit float, a non-finite double, a string that is not UTF-8) becomes ``{"$amqp:TYPE": value}``.
"""
from __future__ import annotations

import base64
import datetime
import decimal
import math
from collections.abc import Callable
from typing import Any

from pamqp import decode


def _typed(base: type, cls_name: str, field_type: str) -> type:
    return type(cls_name, (base,), {"__slots__": (), "field_type": field_type, "__repr__": base.__repr__,
                                    "__module__": __name__})


Byte = _typed(int, "Byte", "byte")
UnsignedByte = _typed(int, "UnsignedByte", "unsignedbyte")
Short = _typed(int, "Short", "short")
UnsignedShort = _typed(int, "UnsignedShort", "unsignedshort")
UnsignedInt = _typed(int, "UnsignedInt", "unsignedint")
Long = _typed(int, "Long", "long")
Float = _typed(float, "Float", "float")

# pamqp's table type byte -> the subclass its decoded value becomes ('I' stays int: signedint)
_WIRE = {b"b": Byte, b"B": UnsignedByte, b"s": Short, b"u": UnsignedShort, b"i": UnsignedInt, b"l": Long,
         b"f": Float}
_NAMES = {str: "longstr", bytes: "longstr", bytearray: "binary", bool: "bool", float: "double",
          decimal.Decimal: "decimal", dict: "table", list: "array", datetime.datetime: "timestamp",
          type(None): "void"}


def name(value: Any) -> str:
    """``byte``, ``signedint``, ``longstr``, ``void``…: the type RabbitMQ would name for ``value``."""
    typed = getattr(value, "field_type", None)
    if typed is not None:
        return typed
    if type(value) is int:
        return "signedint" if -2**31 <= value < 2**31 else "long"
    return _NAMES.get(type(value), "unknown")


def _keeping(decoder: Callable[[bytes], tuple[int, Any]], cls: type) -> Callable[[bytes], tuple[int, Any]]:
    def decode_typed(data: bytes) -> tuple[int, Any]:
        consumed, value = decoder(data)
        return consumed, cls(value)
    return decode_typed


def install() -> None:
    """Make pamqp's table decoding keep the types above (idempotent).

    A patch of pamqp's table, not a wrapper: pamqp decodes a table's values, nested ones included, by looking each
    type up in ``decode.TABLE_MAPPING`` as it goes, so a wrapper around its decoder sees only plain ints, their wire
    types lost; keeping them without the patch takes a table decoder of Warren's own for every method that carries
    one.  It costs a call per value of those types decoded; routing and delivery decode no property (``message``)."""
    for code, cls in _WIRE.items():
        if getattr(decode.TABLE_MAPPING[code], "__name__", "") != "decode_typed":
            decode.TABLE_MAPPING[code] = _keeping(decode.TABLE_MAPPING[code], cls)


TAG = "$amqp:"  # a one-key object {"$amqp:TYPE": value} in JSON is a value of that type
LONG_MIN, LONG_MAX = -2**63, 2**63 - 1  # AMQP's signed 64-bit integer (a long-long): the widest a table carries
MAX_DEPTH = 100  # nested tables and arrays, as for content headers (properties.MAX_TABLE_DEPTH)
_TYPED: dict[str, type] = {vars(cls)["field_type"]: cls for cls in _WIRE.values()}  # (classes made by type())


def to_json(value: Any, depth: int = 0) -> Any:
    """``value`` (a decoded field value or table) as JSON that :func:`from_json` turns back into an equal value of
    the same types.  ValueError for tables and arrays nested deeper than ``MAX_DEPTH`` (an export or a listing could
    not be read back) and for an integer outside AMQP's signed 64 bits (no client could be sent it, nor the HTTP API
    list it), TypeError for a value no table holds."""
    kind = type(value)
    if kind is int:
        return value if LONG_MIN <= value <= LONG_MAX else _out_of_range(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else {TAG + "double": repr(value)}
    if kind is dict or kind is list:
        if depth >= MAX_DEPTH:
            raise ValueError(f"tables nested deeper than {MAX_DEPTH}")
        if kind is list:
            return [to_json(item, depth + 1) for item in value]
        table = {key: to_json(item, depth + 1) for key, item in value.items()}
        if any(key.startswith(TAG) for key in value):  # a table that would read as a tag: kept as a table
            return {TAG + "table": table}
        return table
    if kind in _WIRE.values():
        base = float if isinstance(value, float) else int
        return {TAG + value.field_type: repr(base(value)) if base is float else to_json(base(value))}
    if kind is datetime.datetime:
        return {TAG + "timestamp": value.isoformat()}
    if kind is decimal.Decimal:
        return {TAG + "decimal": str(value)}
    if kind is bytearray:
        return {TAG + "binary": base64.b64encode(value).decode()}
    if kind is bytes:  # a long string that is not UTF-8
        return {TAG + "longstr": base64.b64encode(value).decode()}
    raise TypeError(f"{kind.__name__} is not an AMQP field value")


def _out_of_range(value: int) -> Any:
    shown = str(value) if abs(value) < 10**40 else f"{str(value)[:40]}… ({len(str(value))} digits)"
    raise ValueError(f"{shown} is outside the signed 64-bit range")


def in_range(value: Any) -> bool:
    """Whether every integer in ``value`` (a field value or table) fits AMQP's signed 64 bits."""
    if isinstance(value, bool) or not isinstance(value, (int, dict, list)):
        return True
    if isinstance(value, int):
        return LONG_MIN <= value <= LONG_MAX
    return all(in_range(item) for item in (value.values() if isinstance(value, dict) else value))


def from_json(value: Any) -> Any:
    """The value :func:`to_json` kept (plain JSON as it is)."""
    if isinstance(value, list):
        return [from_json(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (key, item), = value.items()
        if key.startswith(TAG):
            return _tagged(key[len(TAG):], item)
    return {key: from_json(item) for key, item in value.items()}


def _tagged(kind: str, item: Any) -> Any:
    """One tagged value; ValueError for anything :func:`to_json` would not have written (an import is input)."""
    expected = dict if kind == "table" else int if kind in _TYPED and not issubclass(_TYPED[kind], float) else str
    if type(item) is not expected:
        raise ValueError(f"{kind} field written as {type(item).__name__}")
    value: Any = item  # of the type ``kind`` expects, which the checks below take on trust
    try:
        if kind == "table":
            return {key: from_json(field) for key, field in value.items()}
        if kind == "double":
            return float(value)
        if kind in _TYPED:
            cls = _TYPED[kind]
            return cls(float(value) if issubclass(cls, float) else value)
        if kind == "timestamp":
            return datetime.datetime.fromisoformat(value)
        if kind == "decimal":
            return decimal.Decimal(value)
        if kind == "binary":
            return bytearray(base64.b64decode(value, validate=True))
        if kind == "longstr":
            return base64.b64decode(value, validate=True)
    except (ArithmeticError, ValueError) as exc:  # decimal.InvalidOperation is an ArithmeticError
        raise ValueError(f"{kind} field {item!r}: {exc}") from None
    raise ValueError(f"unknown field type {kind!r}")
