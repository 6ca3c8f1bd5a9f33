"""Queue contents by offset, as Arrow IPC: the HTTP front end of the Spark bridge (``spark/`` is its client, and
``amqp_server/spark_bridge/`` its broker side: the reads, the commit, the reader processes).

An offset is a ready entry's ``seq`` (per queue, increasing, kept across restarts for durable
queues).  Three endpoints, each needing *read* permission on the queue:

``GET  /api/queues/{vhost}/{name}/offsets``
    ``{"head": .., "tail": .., "committed": .., "messages": .., "bytes": ..}``: the first live ready offset
    (``tail`` when empty), the next offset to be given out, the commit cursor, and how many ready messages
    there are with how many body bytes (for planning partitions).
``GET  /api/queues/{vhost}/{name}/records?start=&end=&limit=&body=binary|text&batch=&columns=``
    ``application/vnd.apache.arrow.stream``: ready entries with ``start <= offset < end`` (defaults:
    head, tail), at most ``limit``, in record batches of about ``batch`` rows of ``arrow_records.arrow_schema()``,
    or of the ``columns`` named (comma-separated, kept in the schema's order; an unknown one is a 400).  Nothing
    changes: no redelivered flag, no delivery.  Entries held unacked by AMQP consumers are not
    included.  The stream ends after ``limit`` rows or at ``end`` (for a durable queue, at most at the offsets
    reserved for readers: a block above the tail, ``Queues.reserve_offsets``); its offset column tells where.
``POST /api/queues/{vhost}/{name}/commit`` ``{"offset": N}``
    removes every ready entry below ``N`` as an ack would; idempotent and monotonic (an offset at
    or below the cursor removes nothing; one past the tail commits up to the tail).
    ``{"removed": k, "committed": c}``.

Authentication is the management API's (basic auth, management tag, vhost access); the
permission checked is ``read`` on the queue, for commit too: committing is consuming.

In cluster mode any node answers: for a queue of another node (a quorum queue's leader elsewhere
included) the request is checked here, then forwarded to that node's management API with the
caller's credentials, and its answer streamed back as it comes.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.errors import AMQPError
from amqp_server.queues.queue import AnyQueue, LocalQueue
from amqp_server.spark_bridge import arrow_records, record_reader, record_stream as records
from amqp_server.spark_bridge.commit import Commit
from amqp_server.spark_bridge.queue_reads import RecordSource

from . import auth, expect
from .context import ctx
from .forward import forward
from .http import HTTPError, bad_request, from_amqp, json_response, not_authorised, not_found, read_json

ARROW_STREAM = "application/vnd.apache.arrow.stream"
WRITE_SLICE = 256 * 1024  # bytes of a reader's batch written to the response at once
READER_PROCESSES = 2  # Spark reads a partition per core: two at once on the machines measured
READERS = web.AppKey("record_readers", record_reader.RecordReaders)


# -- auth: the management API's, reused ------------------------------------------------------

def authorize_queue_read(request: web.Request) -> AnyQueue:
    """The path's queue, once the caller is authenticated and may read it (401/404 otherwise).

    The management API's login (set by its middleware, or authenticated here when the route is
    reached without it), its vhost visibility rule, and the broker's one permission check.
    """
    broker = ctx(request).broker
    if auth.LOGIN not in request:
        request[auth.LOGIN] = auth.authenticate(request, broker, True)
    login = auth.login(request)
    vhost_name = request.match_info["vhost"]
    if not broker.access.vhost_exists(vhost_name):
        raise not_found()
    if not auth.has_vhost_access(broker, login, vhost_name):
        raise not_authorised("Access refused.")
    who = broker.access.principal(vhost_name, login.name)
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


def _owned(handler: Any) -> Any:
    """Answer here for a queue of this node, forward for one of another node."""
    async def wrapper(request: web.Request) -> web.StreamResponse:
        named = authorize_queue_read(request)  # (of any node)
        local = named.local()
        return await handler(request, local) if local is not None else await forward(request, named.node)

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


@_guarded
@_owned
async def offsets(request: web.Request, queue: LocalQueue) -> web.Response:
    request.app[READERS].start()  # the reads that follow find the reader processes up
    ctx(request).broker.queues.reserve_offsets(queue)  # (its tail: a restart carries on above it)
    return json_response(records.describe(RecordSource(queue)))


@_guarded
@_owned
async def read_records(request: web.Request, queue: LocalQueue) -> web.StreamResponse:
    """The range as an Arrow stream (``spark_bridge.records``)."""
    source = RecordSource(queue)
    ceiling = ctx(request).broker.queues.reserve_offsets(queue)
    head, tail = source.offsets()
    start = _int_query(request, "start", head)
    end = _int_query(request, "end", tail)
    if ceiling is not None:  # no offset shown that a restart could give again (entries published meanwhile)
        end = min(end, ceiling)
    limit = min(_int_query(request, "limit", records.MAX_LIMIT, 1), records.MAX_LIMIT)
    batch_rows = _int_query(request, "batch", records.DEFAULT_BATCH_ROWS, 1)
    body_format = request.query.get("body", "binary")
    if body_format not in ("binary", "text"):
        raise bad_request("body must be binary or text")
    try:
        layout = arrow_records.Layout.parse(request.query.get("columns"), body_format == "text")
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    response = web.StreamResponse(headers={
        "Content-Type": ARROW_STREAM, "X-Warren-Head": str(head), "X-Warren-Tail": str(tail)})
    if request.version >= (1, 1):
        response.enable_chunked_encoding()  # as aiohttp would: said here so that a reader knows how to frame
    await response.prepare(request)
    try:
        await records.write_records(source, request.app[READERS], _Output(request, response), start, end, limit,
                                    batch_rows, layout)
        await response.write_eof()
    except (ConnectionError, record_reader.ClientGone):  # the client went away mid-stream: nothing to log
        pass
    return response


class _Output:
    """A read's stream to the response (``records.Output``)."""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self.request, self.response = request, response

    async def write(self, data: Any) -> None:
        await self.response.write(data)

    def client(self) -> record_reader.ClientSocket | None:
        """The client's socket, when a reader may write to it now: plain TCP (not TLS), no compression, and
        nothing of the response still in the transport's buffer."""
        transport = self.request.transport
        if (transport is None or transport.is_closing() or transport.get_write_buffer_size()
                or transport.get_extra_info("sslcontext") is not None or self.response.compression):
            return None
        sock = transport.get_extra_info("socket")
        if sock is None:
            return None
        return record_reader.ClientSocket(sock.fileno(), self.response.chunked)

    async def write_rest(self, read: record_reader.Read, client: record_reader.ClientSocket | None) -> None:
        """What of a reader's batch is left for the loop to write: all of it, or what the client's socket did not
        take (framed by the reader already)."""
        if client is not None:
            if read.rest:
                assert self.request.transport is not None  # the client's socket was taken from it
                self.request.transport.write(read.rest)
                await self.request.writer.drain()
        else:
            for at in range(0, len(read.rest), WRITE_SLICE):  # each write a short copy, the loop free between
                await self.response.write(read.rest[at:at + WRITE_SLICE])


@_guarded
@_owned
async def commit(request: web.Request, queue: LocalQueue) -> web.Response:
    body = await read_json(request)
    offset = body.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise bad_request("offset must be a non-negative integer")
    removed = await Commit(ctx(request).broker).commit_offset(queue, offset)
    return json_response({"removed": removed, "committed": queue.committed})


def add_routes(app: web.Application) -> None:
    readers = app[READERS] = record_reader.RecordReaders(READER_PROCESSES)

    async def stop_readers(_app: web.Application) -> None:
        readers.close()

    app.on_cleanup.append(stop_readers)
    app.router.add_get("/api/queues/{vhost}/{name}/offsets", offsets, expect_handler=expect.defer)
    app.router.add_get("/api/queues/{vhost}/{name}/records", read_records, expect_handler=expect.defer)
    app.router.add_post("/api/queues/{vhost}/{name}/commit", commit, expect_handler=expect.defer)
