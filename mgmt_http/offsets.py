"""Queue contents by offset, as Arrow IPC: the broker side of the Spark bridge (``spark/``).

An offset is a ready entry's ``seq`` (per queue, increasing, kept across restarts for durable
queues).  Three endpoints, each needing *read* permission on the queue:

``GET  /api/queues/{vhost}/{name}/offsets``
    ``{"head": .., "tail": .., "committed": ..}``: the first live ready offset (``tail`` when
    empty), the next offset to be given out, and the commit cursor.
``GET  /api/queues/{vhost}/{name}/records?start=&end=&limit=&body=binary|text&batch=``
    ``application/vnd.apache.arrow.stream``: ready entries with ``start <= offset < end`` (defaults:
    head, tail), at most ``limit``, in ``batch``-row record batches of :data:`SCHEMA`.  Nothing
    changes: no redelivered flag, no delivery.  Entries held unacked by AMQP consumers are not
    included.  ``X-Warren-Count`` and ``X-Warren-Last-Offset`` tell what was sent.
``POST /api/queues/{vhost}/{name}/commit`` ``{"offset": N}``
    removes every ready entry below ``N`` as an ack would; idempotent and monotonic (an offset at
    or below the cursor removes nothing).  ``{"removed": k, "committed": c}``.

Authentication is the management API's (basic auth, management tag, vhost access); the
permission checked is ``read`` on the queue, for commit too: committing is consuming.
"""
from __future__ import annotations

import decimal
import json
from typing import Any

from aiohttp import web

from amqp_server import properties
from amqp_server.auth import Principal
from amqp_server.errors import AMQPError
from amqp_server.properties import Properties
from amqp_server.queue import Entry, Queue

from . import auth
from .http import HTTPError, bad_request, not_authorised, from_amqp, json_response, not_found, read_json

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_BATCH_ROWS = 16384
MAX_LIMIT = 1_000_000
MAX_TIMESTAMP_S = (2 ** 63 - 1) // 1_000_000

# Column order and names of every record batch (the Spark source's schema mirrors it).
COLUMNS = ("queue", "offset", "body", "exchange", "routing_key", "headers", "content_type", "content_encoding",
           "delivery_mode", "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
           "type", "user_id", "app_id", "redelivered")
_STRING_PROPS = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
                 "message_type", "user_id", "app_id")


def arrow_schema(body_text: bool = False) -> Any:
    import pyarrow as pa

    s = pa.string()
    return pa.schema([
        ("queue", s), ("offset", pa.int64()), ("body", s if body_text else pa.binary()), ("exchange", s),
        ("routing_key", s), ("headers", pa.map_(s, s)), ("content_type", s), ("content_encoding", s),
        ("delivery_mode", pa.int32()), ("priority", pa.int32()), ("correlation_id", s), ("reply_to", s),
        ("expiration", s), ("message_id", s), ("timestamp", pa.timestamp("us", tz="UTC")), ("type", s),
        ("user_id", s), ("app_id", s), ("redelivered", pa.bool_()),
    ])


# -- auth: the management API's, reused ------------------------------------------------------

def _broker(request: web.Request) -> Any:
    from .context import KEY

    if KEY in request.app:
        return request.app[KEY].broker
    return request.app["broker"]


def authorize_queue_read(request: web.Request) -> Queue:
    """The path's queue, once the caller is authenticated and may read it (401/404 otherwise).

    The management API's login (set by its middleware, or authenticated here when the route is
    reached without it), its vhost visibility rule, and the broker's one permission check.
    """
    broker = _broker(request)
    if "login" not in request:
        request["login"] = auth.authenticate(request, broker, True)
    login = auth.login(request)
    vhost_name = request.match_info["vhost"]
    if not broker.access.vhost_exists(vhost_name):
        raise not_found()
    if not auth.can_see_vhost(broker, login, vhost_name):
        raise not_authorised("Access refused.")
    who = Principal(login.name, broker.access.permissions(vhost_name, login.name))
    vhost = broker.vhost(vhost_name)
    name = request.match_info["name"]
    if name not in vhost.queues:
        who.check("read", "queue", vhost_name, name)  # refused before a missing queue is told apart
        raise not_found()
    return broker.consumable(vhost, name, None, who)  # read permission; another's exclusive queue is locked


def _guarded(handler: Any) -> Any:
    """HTTPError/AMQPError to RabbitMQ-shaped responses, whether or not the app's error middleware runs."""
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except HTTPError as exc:
            return exc.response()
        except AMQPError as exc:
            return from_amqp(exc).response()

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


# -- Arrow encoding --------------------------------------------------------------------------

def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return json.dumps(value, default=_json_default, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    return str(value)


def _properties(message: Any) -> Properties:
    """Decoded properties without caching them on the message (a big browse would keep them all)."""
    props = getattr(message, "_properties", None)
    return props if props is not None else properties.decode(message.header)


def encode_batch(queue_name: str, entries: list[Entry], body_text: bool, schema: Any) -> Any:
    import pyarrow as pa

    n = len(entries)
    offsets = [0] * n
    bodies: list[Any] = [None] * n
    exchanges: list[Any] = [None] * n
    keys: list[Any] = [None] * n
    redelivered = [False] * n
    cols: dict[str, list[Any]] = {name: [None] * n for name in (
        "headers", "content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
        "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id")}
    for i, entry in enumerate(entries):
        message = entry.message
        offsets[i] = entry.seq
        body = message.body
        bodies[i] = bytes(body).decode("utf-8", "replace") if body_text else body
        exchanges[i] = message.exchange
        keys[i] = message.routing_key
        redelivered[i] = entry.redelivered
        if not message._flags:
            continue
        props = _properties(message)
        if props.headers:
            cols["headers"][i] = [(str(k), None if v is None else _text(v)) for k, v in props.headers.items()]
        for attr in _STRING_PROPS:
            value = getattr(props, attr)
            if value is not None:
                cols["type" if attr == "message_type" else attr][i] = value
        cols["delivery_mode"][i] = props.delivery_mode
        cols["priority"][i] = props.priority
        stamp = props.timestamp  # seconds, opaque on the wire: one Arrow (µs, int64) cannot hold is null
        if stamp is not None and stamp < MAX_TIMESTAMP_S:
            cols["timestamp"][i] = stamp * 1_000_000
    arrays = [pa.array([queue_name] * n, pa.string()), pa.array(offsets, pa.int64()),
              pa.array(bodies, schema.field("body").type), pa.array(exchanges, pa.string()),
              pa.array(keys, pa.string())]
    for name in COLUMNS[5:-1]:
        arrays.append(pa.array(cols[name], schema.field(name).type))
    arrays.append(pa.array(redelivered, pa.bool_()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _Chunks:
    """A write-only file for the Arrow IPC writer: what it wrote since the last ``take``."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


# -- handlers --------------------------------------------------------------------------------

def _int_query(request: web.Request, name: str, default: int, minimum: int = 0) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be an integer") from None
    if value < minimum:
        raise bad_request(f"{name} must be at least {minimum}")
    return value


@_guarded
async def offsets(request: web.Request) -> web.Response:
    queue = authorize_queue_read(request)
    head, tail = queue.offsets()
    return json_response({"head": head, "tail": tail, "committed": queue.committed})


@_guarded
async def records(request: web.Request) -> web.StreamResponse:
    import pyarrow as pa

    queue = authorize_queue_read(request)
    head, tail = queue.offsets()
    start = _int_query(request, "start", head)
    end = _int_query(request, "end", tail)
    limit = min(_int_query(request, "limit", MAX_LIMIT, 1), MAX_LIMIT)
    batch_rows = _int_query(request, "batch", DEFAULT_BATCH_ROWS, 1)
    body_format = request.query.get("body", "binary")
    if body_format not in ("binary", "text"):
        raise bad_request("body must be binary or text")
    body_text = body_format == "text"
    entries = queue.browse(start, end, limit)
    schema = arrow_schema(body_text)
    response = web.StreamResponse(headers={
        "Content-Type": ARROW_STREAM, "X-Warren-Count": str(len(entries)),
        "X-Warren-Last-Offset": str(entries[-1].seq if entries else -1),
        "X-Warren-Head": str(head), "X-Warren-Tail": str(tail)})
    await response.prepare(request)
    sink = _Chunks()
    writer = pa.ipc.new_stream(sink, schema)
    name = queue.name
    for i in range(0, len(entries), batch_rows):
        writer.write_batch(encode_batch(name, entries[i:i + batch_rows], body_text, schema))
        await response.write(sink.take())  # also yields to the loop between batches
    writer.close()
    await response.write(sink.take())
    await response.write_eof()
    return response


@_guarded
async def commit(request: web.Request) -> web.Response:
    queue = authorize_queue_read(request)
    body = await read_json(request, required=True)
    offset = body.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise bad_request("offset must be a non-negative integer")
    removed = _broker(request).commit_offset(queue, offset)
    return json_response({"removed": removed, "committed": queue.committed})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/queues/{vhost}/{name}/offsets", offsets)
    app.router.add_get("/api/queues/{vhost}/{name}/records", records)
    app.router.add_post("/api/queues/{vhost}/{name}/commit", commit)
