"""Queue entries as Arrow record batches, built column by column for the Spark bridge's ``/records``.

Two steps, so that the event loop does only the cheap one: :meth:`Snapshot.add` (on the loop) copies
references to what a batch needs into plain lists, so later paging or acks cannot change it;
:func:`encode` (in a worker thread) builds the columns from those lists.  Properties are decoded
once per distinct content header and routes once per distinct route, not per row: a backlog's messages
mostly share theirs: a column whose rows all share one is a repeat of it (or nulls), else one ``take``
over the few decoded rows.
"""
from __future__ import annotations

import decimal
import json
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from operator import attrgetter
from typing import Any, Callable, Sequence, Union

import numpy as np
import pyarrow as pa

from ..framing import properties
from ..payload import route_names
from ..queues.ready import Entry

MAX_TIMESTAMP_S = (2 ** 63 - 1) // 1_000_000
PROPERTIES_AT = 12  # a content header's class, weight and body size come first; its property flags here

# Column order and names of every record batch (the Spark source's schema mirrors it).
COLUMNS = ("queue", "offset", "body", "exchange", "routing_key", "headers", "content_type", "content_encoding",
           "delivery_mode", "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
           "type", "user_id", "app_id", "redelivered")
ROUTE_COLUMNS = COLUMNS[3:5]
PROPERTY_COLUMNS = COLUMNS[5:-1]
_STRING_PROPS = {"content_type": "content_type", "content_encoding": "content_encoding",
                 "correlation_id": "correlation_id", "reply_to": "reply_to", "expiration": "expiration",
                 "message_id": "message_id", "type": "message_type", "user_id": "user_id", "app_id": "app_id"}


_message, _seq, _redelivered = attrgetter("message"), attrgetter("seq"), attrgetter("redelivered")
_body, _route, _header = attrgetter("body"), attrgetter("route"), attrgetter("header")


def arrow_schema(body_text: bool = False, columns: Sequence[str] = COLUMNS) -> pa.Schema:
    """The schema of record batches of ``columns``, in the order given, the body as text or bytes."""
    s = pa.string()
    types = {
        "queue": s, "offset": pa.int64(), "body": s if body_text else pa.binary(), "exchange": s,
        "routing_key": s, "headers": pa.map_(s, s), "content_type": s, "content_encoding": s,
        "delivery_mode": pa.int32(), "priority": pa.int32(), "correlation_id": s, "reply_to": s,
        "expiration": s, "message_id": s, "timestamp": pa.timestamp("us", tz="UTC"), "type": s,
        "user_id": s, "app_id": s, "redelivered": pa.bool_(),
    }
    return pa.schema([(name, types[name]) for name in columns])


@dataclass(frozen=True)
class Layout:
    """What the batches of a read hold: which of ``COLUMNS`` (a client that needs few asks for those: the
    others are neither decoded nor sent), and the body as text or bytes."""

    columns: tuple[str, ...] = COLUMNS
    body_text: bool = False

    @classmethod
    def parse(cls, columns: str | None, body_text: bool) -> "Layout":
        """From a request's comma-separated ``columns`` (None: all); ValueError names what is wrong."""
        if columns is None:
            return cls(COLUMNS, body_text)
        asked = {name.strip() for name in columns.split(",")}
        unknown = sorted(asked - set(COLUMNS))
        if unknown:
            raise ValueError(f"unknown column {unknown[0]!r} (columns: {', '.join(COLUMNS)})")
        return cls(tuple(name for name in COLUMNS if name in asked), body_text)

    @cached_property
    def schema(self) -> pa.Schema:
        return arrow_schema(self.body_text, self.columns)


_PROPERTY_TYPES = [arrow_schema().field(name).type for name in PROPERTY_COLUMNS]


@dataclass
class Snapshot:
    """What one record batch needs, taken on the event loop: the entries, and their bodies (the one thing
    that may change under a worker thread: paging drops a body).  An entry's seq and its message's route and
    header never change; its redelivered flag is read as it is when the batch is built."""

    entries: list[Entry] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    size: int = 0  # the bodies' bytes

    def add(self, entries: Sequence[Entry]) -> None:
        bodies = list(map(_body, map(_message, entries)))
        self.entries += entries
        self.bodies += bodies
        self.size += sum(map(len, bodies))

    def merge(self, other: "Snapshot") -> None:
        self.entries += other.entries
        self.bodies += other.bodies
        self.size += other.size


def encode(queue_name: str, snap: Snapshot, layout: Layout) -> pa.RecordBatch:
    entries = snap.entries
    messages = list(map(_message, entries))
    return encode_columns(queue_name, list(map(_seq, entries)), list(map(_redelivered, entries)),
                          list(map(_route, messages)), [h[PROPERTIES_AT:] for h in map(_header, messages)],
                          snap.bodies, layout)


Binaries = Union[list[bytes], pa.Array]


def encode_columns(queue_name: str, seqs: Sequence[int] | np.ndarray, redelivered: Sequence[bool] | np.ndarray,
                   routes: Binaries | None,
                   props: Binaries | None, bodies: Binaries | None, layout: Layout) -> pa.RecordBatch:
    """A record batch of ``layout`` from its rows' offsets, redelivered flags, routes, properties (a content
    header from ``PROPERTIES_AT`` on: flags and property list, so that headers differing only in body size are
    alike) and bodies; lists, or binary arrays ``record_reader`` gathers from the segment files.  Only the
    columns the layout holds are built (what no column of it needs may be None)."""
    schema = layout.schema
    wanted = set(layout.columns)
    arrays: dict[str, pa.Array] = {}
    if "queue" in wanted:
        arrays["queue"] = pa.repeat(pa.scalar(queue_name, pa.string()), len(seqs))
    if "offset" in wanted:
        arrays["offset"] = pa.array(seqs, pa.int64())
    if "body" in wanted:
        arrays["body"] = _as_text(_binary(bodies)) if layout.body_text else _binary(bodies)
    if wanted.intersection(ROUTE_COLUMNS):
        arrays.update(zip(ROUTE_COLUMNS, _distinct_columns(routes, route_names, (pa.string(), pa.string()))))
    if wanted.intersection(PROPERTY_COLUMNS):
        arrays.update(zip(PROPERTY_COLUMNS, _distinct_columns(props, _property_row, _PROPERTY_TYPES)))
    if "redelivered" in wanted:
        arrays["redelivered"] = pa.array(redelivered, pa.bool_())
    return pa.RecordBatch.from_arrays([arrays[name] for name in layout.columns], schema=schema)


def _binary(values: Binaries) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, pa.binary())


def _distinct_columns(keys: Binaries, row: Callable[[bytes], tuple[Any, ...]],
                      types: Sequence[pa.DataType]) -> list[pa.Array]:
    """Columns of values that depend on ``keys`` alone: each distinct key's row computed once, then one
    ``take`` per column; or, when every row has the same key (a backlog's messages mostly share their route
    and their properties), each column that value repeated."""
    keys = _binary(keys)
    if _one_value(keys):
        return [pa.nulls(len(keys), kind) if value is None else pa.repeat(pa.scalar(value, kind), len(keys))
                for value, kind in zip(row(keys[0].as_py()), types)]
    encoded = keys.dictionary_encode()  # hashed in Arrow, not in Python
    rows = list(map(row, encoded.dictionary.to_pylist()))
    return [pa.array([r[j] for r in rows], kind).take(encoded.indices) for j, kind in enumerate(types)]


def _one_value(values: pa.Array) -> bool:
    """Whether a binary array of two rows or more has no nulls and one value in every row: its lengths and
    bytes compared as arrays, cheaper than hashing each."""
    count = len(values)
    if count < 2 or values.null_count:
        return False
    _validity, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, count + 1, values.offset * 4)
    width = int(offsets[1] - offsets[0])
    if int(offsets[-1] - offsets[0]) != width * count or np.any(np.diff(offsets) != width):
        return False
    if not width:
        return True
    rows = np.frombuffer(data_buffer, np.uint8, width * count, int(offsets[0])).reshape(count, width)
    return bool((rows == rows[0]).all())


def _as_text(bodies: pa.Array) -> pa.Array:
    """Bodies as UTF-8 text; invalid bytes become U+FFFD (only then row by row)."""
    try:
        return bodies.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([b.decode("utf-8", "replace") for b in bodies.to_pylist()], pa.string())


@lru_cache(maxsize=1024)
def _property_row(flags_and_properties: bytes) -> tuple[Any, ...]:
    """Property values (PROPERTY_COLUMNS order, None where absent) of a content header from ``PROPERTIES_AT``."""
    if len(flags_and_properties) < 2 or flags_and_properties[:2] == b"\0\0":
        return (None,) * len(PROPERTY_COLUMNS)
    props = properties.decode(b"\0" * PROPERTIES_AT + flags_and_properties)
    values: dict[str, Any] = {name: getattr(props, attr) for name, attr in _STRING_PROPS.items()}
    if props.headers:
        values["headers"] = [(_text(k), None if v is None else _text(v)) for k, v in props.headers.items()]
    values["delivery_mode"] = props.delivery_mode
    values["priority"] = props.priority
    stamp = props.timestamp  # seconds, opaque on the wire: one Arrow (µs, int64) cannot hold is null
    if stamp is not None and stamp < MAX_TIMESTAMP_S:
        values["timestamp"] = stamp * 1_000_000
    return tuple(values.get(name) for name in PROPERTY_COLUMNS)


def _text(value: Any) -> str:
    """A header's name or value as text: bytes that are not UTF-8 replaced (U+FFFD), never refused, those of a byte
    array and those a field table's names and strings keep as they came (decoded with surrogateescape, which
    Arrow cannot encode) alike, nested ones too; a value of another type as JSON."""
    if isinstance(value, str):
        return _text(value.encode("utf-8", "surrogateescape"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return _text(json.dumps(value, default=_json_default, separators=(",", ":"), ensure_ascii=False))


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    return str(value)
