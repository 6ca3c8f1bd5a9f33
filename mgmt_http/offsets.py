"""Queue contents by offset, as Arrow IPC: the broker side of the Spark bridge (``spark/``).

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
    included.  The stream ends after ``limit`` rows or at ``end``; its offset column tells where.
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

import asyncio
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from aiohttp import web

from amqp_server.errors import AMQPError
from amqp_server.clock import now_ms
from amqp_server.queue import Queue

from . import auth, record_reader
from .forward import by_owner
from .http import HTTPError, bad_request, from_amqp, json_response, not_authorised, not_found, read_json

if TYPE_CHECKING:
    from amqp_server.stream.log import ChunkSpan

    from .arrow_records import Layout

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_BATCH_ROWS = 65536
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: continuation marker, zero length
SNAPSHOT_ROWS = 2048  # rows snapshotted per loop turn
BATCH_BYTES = 8 << 20  # bodies per record batch, about: a batch of big messages has fewer rows, not more bytes
MAX_LIMIT = 1_000_000
WRITE_SLICE = 256 * 1024  # bytes of a reader's batch written to the response at once
READER_PROCESSES = 2  # Spark reads a partition per core: two at once on the machines measured
READERS = web.AppKey("record_readers", record_reader.RecordReaders)


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
        queue = authorize_queue_read(request)
        answer = await by_owner(request, queue)
        return answer if answer is not None else await handler(request, queue)

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


@_guarded
@_owned
async def offsets(request: web.Request, queue: Queue) -> web.Response:
    request.app[READERS].start()  # the reads that follow find the reader processes up
    head, tail = queue.offsets()
    return json_response({"head": head, "tail": tail, "committed": queue.committed,
                          "messages": queue.message_count, "bytes": queue.ready_bytes})


@_guarded
@_owned
async def records(request: web.Request, queue: Queue) -> web.StreamResponse:
    """The range as an Arrow stream.  Entries in memory: the loop snapshots each batch's references
    (``SNAPSHOT_ROWS`` at a time, so no AMQP connection waits long) and a worker thread builds the columns.
    Entries on disk: the loop finds where they lie and a reader process (``record_reader``) builds the
    batch, so the loop's GIL stays free for AMQP traffic; without one, they are read as those in memory."""
    from . import arrow_records

    head, tail = queue.offsets()
    start = _int_query(request, "start", head)
    end = _int_query(request, "end", tail)
    limit = min(_int_query(request, "limit", MAX_LIMIT, 1), MAX_LIMIT)
    batch_rows = _int_query(request, "batch", DEFAULT_BATCH_ROWS, 1)
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
    name = queue.name
    loop = asyncio.get_running_loop()

    def encode(snap: arrow_records.Snapshot) -> Any:
        """One IPC message of the stream; written as it is, with no copy on the loop."""
        return arrow_records.encode(name, snap, layout).serialize()

    async def in_memory(first: int, last: int, most: int) -> int:
        """Entries ``first <= seq < last`` (at most ``most``) as the loop and a worker thread read them."""
        written = 0
        snap = arrow_records.Snapshot()
        rows = min(SNAPSHOT_ROWS, batch_rows, _rows_for_bytes(queue.message_count, queue.ready_bytes))
        for entries in queue.read_range(first, last, rows, most):  # a slice per turn
            part = arrow_records.Snapshot()
            part.add(entries)
            written += len(entries)
            if snap.entries and snap.size + part.size > BATCH_BYTES:
                await response.write(memoryview(await loop.run_in_executor(None, encode, snap)))
                snap = arrow_records.Snapshot()
            snap.merge(part)
            if len(snap.entries) >= batch_rows:
                await response.write(memoryview(await loop.run_in_executor(None, encode, snap)))
                snap = arrow_records.Snapshot()
            else:
                await asyncio.sleep(0)  # let the loop serve others between slices
        if snap.entries:
            await response.write(memoryview(await loop.run_in_executor(None, encode, snap)))
        return written

    try:
        await response.write(layout.schema.serialize().to_pybytes())
        readers: record_reader.RecordReaders = request.app[READERS]
        cursor, remaining = start, limit
        while cursor < end and remaining > 0:
            rows = min(batch_rows, remaining, _rows_for_bytes(queue.message_count, queue.ready_bytes))
            span = queue.chunk_span(cursor, end, rows, BATCH_BYTES)
            if span is not None:  # a stream: a reader reads its chunks from the segment files
                if not len(span.ids):
                    span.close()
                    break
                read = await _chunk_batch(request, response, readers, queue, span, rows, layout)
                if read is None:  # no reader: the loop reads them
                    remaining -= await in_memory(cursor, end, remaining)
                    break
                remaining -= read.rows
                cursor = min(end, read.following if read.following is not None else end)
                continue
            on_disk_from = queue.paged_from if queue.paged else end  # a plain queue's memory holds what is below
            if cursor < on_disk_from:
                remaining -= await in_memory(cursor, min(end, on_disk_from), remaining)
                cursor = min(end, on_disk_from)
                continue
            try:
                rows = min(batch_rows, remaining, _rows_for_bytes(queue.paged, queue.paged_bytes))
                read = await _disk_batch(request, response, readers, queue, cursor, end, rows, layout)
            except record_reader.ReaderUnavailable:
                read = None
            if read is None:  # a priority queue (its levels' parts on disk interleave), or no reader
                remaining -= await in_memory(cursor, end, remaining)
                break
            remaining -= read.rows
            cursor = min(end, read.following if read.following is not None else end)
        await response.write(END_OF_STREAM)
        await response.write_eof()
    except (ConnectionError, record_reader.ClientGone):  # the client went away mid-stream: nothing to log
        pass
    return response


def _client_socket(request: web.Request, response: web.StreamResponse) -> record_reader.ClientSocket | None:
    """The client's socket, when a reader may write to it now: plain TCP (not TLS), no compression, and
    nothing of the response still in the transport's buffer."""
    transport = request.transport
    if (transport is None or transport.is_closing() or transport.get_write_buffer_size()
            or transport.get_extra_info("sslcontext") is not None or response.compression):
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    return record_reader.ClientSocket(sock.fileno(), response.chunked)


def _rows_for_bytes(count: int, size: int) -> int:
    """Rows of a batch of about ``BATCH_BYTES`` of bodies, for messages of the mean size of ``count`` of ``size``."""
    return max(1, BATCH_BYTES * count // size) if size > 0 else MAX_LIMIT


async def _disk_batch(request: web.Request, response: web.StreamResponse, readers: record_reader.RecordReaders,
                      queue: Queue, start: int, end: int, rows: int,
                      layout: Layout) -> record_reader.Read | None:
    """A record batch of up to ``rows`` ready entries on disk from ``start``, about ``BATCH_BYTES`` of bodies at
    most, written to the response: a reader walks the queue index, the loop finds where their payloads lie,
    the reader builds the batch and writes it to the client's socket itself when nothing of ours waits to be
    written before it (a plain TCP connection), the loop writing only what the socket did not take.  None for
    a priority queue."""
    where = queue.disk_index(start)
    if where is None:
        return None

    client = _client_socket(request, response)
    read = await readers.read(where, rows, BATCH_BYTES, end, now_ms(), _locator(queue, where[2]), queue.name,
                              layout, client)
    await _write_rest(request, response, read, client)
    return read


async def _chunk_batch(request: web.Request, response: web.StreamResponse, readers: record_reader.RecordReaders,
                       queue: Queue, span: ChunkSpan, rows: int, layout: Layout) -> record_reader.Read | None:
    """A record batch of a stream's chunks where ``span`` says, up to ``rows`` records: a reader reads the chunks
    from the segment files and decodes their records, nothing of them on the loop; written as ``_disk_batch``
    writes its batch.  None with no reader to ask."""
    client = _client_socket(request, response)
    try:
        read = await readers.read_chunks(span, rows, queue.name, layout, client)
    except record_reader.ReaderUnavailable:
        return None
    finally:
        span.close()
    await _write_rest(request, response, read, client)
    return read


async def _write_rest(request: web.Request, response: web.StreamResponse, read: record_reader.Read,
                      client: record_reader.ClientSocket | None) -> None:
    """What of a reader's batch is left for the loop to write: all of it, or what the client's socket did not
    take (framed by the reader already)."""
    if client is not None:
        if read.rest:
            assert request.transport is not None  # the client's socket was taken from it
            request.transport.write(read.rest)
            await request.writer.drain()
    else:
        for at in range(0, len(read.rest), WRITE_SLICE):  # each write a short copy, the loop free between
            await response.write(read.rest[at:at + WRITE_SLICE])


def _locator(queue: Queue, walked_from: int) -> Callable[[record_reader.Walked], record_reader.Located]:
    """Where the payloads of entries walked from ``walked_from`` lie, of those still on disk.  In one loop turn:
    a few array operations however many the rows, where slices (each turn's other work queued behind the next
    slice) made other clients wait more, not less."""

    def locate(walked: record_reader.Walked) -> record_reader.Located:
        skip = 0
        if not queue.paged or queue.paged_from > walked_from:  # consumers took the disk's head into memory meanwhile
            skip = int(np.searchsorted(walked.seqs, queue.paged_from))
        return record_reader.Located(skip, queue.disk_span(walked.msg_ids[skip:], walked.transient[skip:]))

    return locate


@_guarded
@_owned
async def commit(request: web.Request, queue: Queue) -> web.Response:
    body = await read_json(request, required=True)
    offset = body.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise bad_request("offset must be a non-negative integer")
    removed = await _broker(request).commit_offset(queue, offset)
    return json_response({"removed": removed, "committed": queue.committed})


def add_routes(app: web.Application) -> None:
    readers = app[READERS] = record_reader.RecordReaders(READER_PROCESSES)

    async def stop_readers(_app: web.Application) -> None:
        readers.close()

    app.on_cleanup.append(stop_readers)
    app.router.add_get("/api/queues/{vhost}/{name}/offsets", offsets)
    app.router.add_get("/api/queues/{vhost}/{name}/records", records)
    app.router.add_post("/api/queues/{vhost}/{name}/commit", commit)
