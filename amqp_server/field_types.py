"""The AMQP field type of a decoded table value, as RabbitMQ names it in its refusals.

pamqp decodes every integer type to ``int`` and both float types to ``float``, so a refusal such as
``{unacceptable_type,byte}`` (aio-pika sends a small integer as a byte) could not name what the client
sent.  :func:`install` makes pamqp decode those types as ``int`` and ``float`` subclasses that remember
their wire type; they are ints and floats everywhere else (arithmetic, JSON, comparisons).  A value that
did not come off the wire is named as a typical client encodes it: an int as 32 bits if it fits.
"""
from __future__ import annotations

import datetime
import decimal
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
    """Make pamqp's table decoding keep the types above (idempotent)."""
    for code, cls in _WIRE.items():
        if getattr(decode.TABLE_MAPPING[code], "__name__", "") != "decode_typed":
            decode.TABLE_MAPPING[code] = _keeping(decode.TABLE_MAPPING[code], cls)
