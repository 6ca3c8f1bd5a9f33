"""What the HTTP source (:mod:`spark.source`) and the AMQP fallback (:mod:`spark.amqp`) share: the rows'
schema, reading options, and the errors they raise."""
from __future__ import annotations

import json
import re
from typing import Any, overload

from pyspark.sql.types import (BinaryType, BooleanType, IntegerType, LongType, MapType, StringType, StructField,
                               StructType, TimestampType)

PIN_KEY = "warren"  # metadata of the offset column: where load() pinned a batch read


def pinned(schema: StructType) -> dict | None:
    """``{"url", "vhost", "user", "mode", "ranges": {queue: [start, end]}}`` fixed by ``load()``, if any:
    what :func:`spark.drain.commit` removes.  (The reader takes its ranges from the source instance,
    not from here: a schema copied into ``.schema(...)`` must not pin an old range.)"""
    if "offset" not in schema.fieldNames():
        return None
    return schema["offset"].metadata.get(PIN_KEY)


def base_schema(body_type: Any = None, pin: dict | None = None) -> StructType:
    s = StringType()
    return StructType([
        StructField("queue", s), StructField("offset", LongType(), metadata={PIN_KEY: pin} if pin else None),
        StructField("body", body_type or BinaryType()),
        StructField("exchange", s), StructField("routing_key", s), StructField("headers", MapType(s, s)),
        StructField("content_type", s), StructField("content_encoding", s),
        StructField("delivery_mode", IntegerType()), StructField("priority", IntegerType()),
        StructField("correlation_id", s), StructField("reply_to", s), StructField("expiration", s),
        StructField("message_id", s), StructField("timestamp", TimestampType()), StructField("type", s),
        StructField("user_id", s), StructField("app_id", s), StructField("redelivered", BooleanType()),
    ])


_SIMPLE_TYPES = {"string": "string", "int": "integer", "integer": "integer", "bigint": "long", "long": "long",
                 "double": "double", "float": "float", "boolean": "boolean", "bool": "boolean",
                 "timestamp": "timestamp", "date": "date", "binary": "binary", "smallint": "short",
                 "short": "short", "tinyint": "byte", "byte": "byte"}


def parse_body_schema(text: str) -> StructType:
    """``bodySchema``: a StructType's JSON, or flat DDL ``"id INT, name STRING"`` (simple types; nested
    structs and arrays through the JSON form or a full ``.schema(...)`` whose ``body`` is a struct).
    Parsed here, without a SparkSession: the data source runs in a Python worker that has none."""
    text = text.strip()
    if text.startswith("{"):
        return StructType.fromJson(json.loads(text))
    fields = []
    for part in text.split(","):
        bits = part.strip().split()
        if len(bits) != 2 or bits[1].lower() not in _SIMPLE_TYPES:
            raise ValueError(f"warren: bodySchema '{part.strip()}' is not 'name TYPE' with a simple type "
                             f"({', '.join(sorted(_SIMPLE_TYPES))}); use the JSON form for nested types")
        fields.append({"name": bits[0].strip("`"), "type": _SIMPLE_TYPES[bits[1].lower()], "nullable": True,
                       "metadata": {}})
    return StructType.fromJson({"type": "struct", "fields": fields})


def option(options: Any, key: str, default: Any = None) -> Any:
    """Options are a case-insensitive map: never ``dict()`` them (camelCase keys would vanish)."""
    value = options.get(key)
    if value is None:
        value = options.get(key.lower())
    return default if value is None else value


@overload
def int_option(options: Any, key: str, default: int) -> int: ...


@overload
def int_option(options: Any, key: str, default: None) -> int | None: ...


def int_option(options: Any, key: str, default: int | None) -> int | None:
    """A whole-number option of at least 1 (``default`` when unset), or ValueError saying which one is wrong."""
    value = option(options, key)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ValueError(f"warren: {key} must be a whole number of at least 1, not {value!r}")
    return number


class WarrenError(RuntimeError):
    """A one-line reason starting ``warren:``; ``status`` is the HTTP status when the API answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


_REASON = re.compile(r"warren(?: \(amqp\))?: [^\n]*")


def error_reason(exc: BaseException) -> str | None:
    """The ``warren: ...`` line inside ``exc``: Spark wraps what ``schema()`` raises in its own
    ``[PYTHON_DATA_SOURCE_ERROR] ...`` text (and a Python traceback unless
    ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``); this digs the reason back out."""
    found = _REASON.findall(str(exc))  # the last: a traceback's source lines come before the message
    return found[-1].rstrip() if found else None
