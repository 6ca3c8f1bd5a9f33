"""A queue's contents by offset as an Arrow IPC stream: the broker operation behind the Spark bridge's ``/offsets``
and ``/records`` (``mgmt_http/offsets.py`` is their HTTP front end: it checks the caller, parses the request and
gives :func:`write_records` an :class:`Output` on the response).

An offset is a ready entry's ``seq`` (per queue, increasing, kept across restarts for durable queues).  A read
goes through the queue's :class:`~.queue_reads.RecordSource` alone: a stream's chunks, or the entries in memory
and those on disk.  Entries in memory: the loop snapshots each batch's references (``SNAPSHOT_ROWS`` at a time,
so no AMQP connection waits long) and a worker thread builds the columns.  Entries on disk: the loop finds where
they lie and a reader process (``record_reader``) builds the batch, so the loop's GIL stays free for AMQP traffic;
without one, they are read as those in memory.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..clock import now_ms
from . import arrow_records, record_reader

if TYPE_CHECKING:
    from stream_log.log import ChunkSpan
    from .arrow_records import Layout
    from .queue_reads import RecordSource

DEFAULT_BATCH_ROWS = 65536
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: continuation marker, zero length
SNAPSHOT_ROWS = 2048  # rows snapshotted per loop turn
BATCH_BYTES = 8 << 20  # bodies per record batch, about: a batch of big messages has fewer rows, not more bytes
MAX_LIMIT = 1_000_000


class ReadOutput(Protocol):
    """Where a read's stream goes (the HTTP response): its bytes as the loop writes them, or a client's socket a
    reader process may write a batch to itself, then the rest of that batch."""

    async def write(self, data: Any) -> None: ...
    def client(self) -> record_reader.ClientSocket | None: ...
    async def write_rest(self, read: record_reader.Read, client: record_reader.ClientSocket | None) -> None: ...


def describe(queue: RecordSource) -> dict[str, int]:
    """``/offsets``: the first live ready offset (``tail`` when empty), the next offset to be given out, the commit
    cursor, and how many ready messages there are with how many body bytes (for planning partitions)."""
    head, tail = queue.offsets()
    return {"head": head, "tail": tail, "committed": queue.committed,
            "messages": queue.message_count, "bytes": queue.ready_bytes}


async def write_records(queue: RecordSource, readers: record_reader.RecordReaders, out: ReadOutput, start: int,
                        end: int, limit: int, batch_rows: int, layout: Layout) -> None:
    """Ready entries with ``start <= seq < end``, at most ``limit``, to ``out`` as an Arrow stream of record batches
    of about ``batch_rows`` rows of ``layout``, its end marker included."""
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
                await out.write(memoryview(await loop.run_in_executor(None, encode, snap)))
                snap = arrow_records.Snapshot()
            snap.merge(part)
            if len(snap.entries) >= batch_rows:
                await out.write(memoryview(await loop.run_in_executor(None, encode, snap)))
                snap = arrow_records.Snapshot()
            else:
                await asyncio.sleep(0)  # let the loop serve others between slices
        if snap.entries:
            await out.write(memoryview(await loop.run_in_executor(None, encode, snap)))
        return written

    await out.write(layout.schema.serialize().to_pybytes())
    cursor, remaining = start, limit
    while cursor < end and remaining > 0:
        rows = min(batch_rows, remaining, _rows_for_bytes(queue.message_count, queue.ready_bytes))
        span = queue.chunk_span(cursor, end, rows, BATCH_BYTES)
        if span is not None:  # a stream: a reader reads its chunks from the segment files
            if not len(span.ids):
                span.close()
                break
            read = await _chunk_batch(out, readers, queue, span, rows, layout)
            if read is None:  # no reader: the loop reads them
                remaining -= await in_memory(cursor, end, remaining)
                break
            remaining -= read.rows
            cursor = min(end, read.following if read.following is not None else end)
            continue
        on_disk = queue.disk_part()
        on_disk_from = on_disk.first if on_disk is not None else end  # a plain queue's memory holds what is below
        if cursor < on_disk_from:
            remaining -= await in_memory(cursor, min(end, on_disk_from), remaining)
            cursor = min(end, on_disk_from)
            continue
        assert on_disk is not None
        try:
            rows = min(batch_rows, remaining, _rows_for_bytes(on_disk.messages, on_disk.size))
            read = await _disk_batch(out, readers, queue, cursor, end, rows, layout)
        except record_reader.ReaderUnavailable:
            read = None
        if read is None:  # a priority queue (its levels' parts on disk interleave), or no reader
            remaining -= await in_memory(cursor, end, remaining)
            break
        remaining -= read.rows
        cursor = min(end, read.following if read.following is not None else end)
    await out.write(END_OF_STREAM)


def _rows_for_bytes(count: int, size: int) -> int:
    """Rows of a batch of about ``BATCH_BYTES`` of bodies, for messages of the mean size of ``count`` of ``size``."""
    return max(1, BATCH_BYTES * count // size) if size > 0 else MAX_LIMIT


async def _disk_batch(out: ReadOutput, readers: record_reader.RecordReaders, queue: RecordSource, start: int, end: int,
                      rows: int, layout: Layout) -> record_reader.Read | None:
    """A record batch of up to ``rows`` ready entries on disk from ``start``, about ``BATCH_BYTES`` of bodies at
    most, written to ``out``: a reader walks the queue index, the loop finds where their payloads lie, the reader
    builds the batch and writes it to the client's socket itself when nothing of ours waits to be written before
    it (a plain TCP connection), the loop writing only what the socket did not take.  None where the part on disk
    is not a seq suffix (``RecordSource.disk_index``)."""
    where = queue.disk_index(start)
    if where is None:
        return None

    client = out.client()
    read = await readers.read(where, rows, BATCH_BYTES, end, now_ms(), _locator(queue, where[2]), queue.name,
                              layout, client)
    await out.write_rest(read, client)
    return read


async def _chunk_batch(out: ReadOutput, readers: record_reader.RecordReaders, queue: RecordSource, span: ChunkSpan,
                       rows: int, layout: Layout) -> record_reader.Read | None:
    """A record batch of a stream's chunks where ``span`` says, up to ``rows`` records: a reader reads the chunks
    from the segment files and decodes their records, nothing of them on the loop; written as ``_disk_batch``
    writes its batch.  None with no reader to ask."""
    client = out.client()
    try:
        read = await readers.read_chunks(span, rows, queue.name, layout, client)
    except record_reader.ReaderUnavailable:
        return None
    finally:
        span.close()
    await out.write_rest(read, client)
    return read


def _locator(queue: RecordSource, walked_from: int) -> Callable[[record_reader.Walked], record_reader.Located]:
    """Where the payloads of entries walked from ``walked_from`` lie, of those still on disk.  In one loop turn:
    a few array operations however many the rows, where slices (each turn's other work queued behind the next
    slice) made other clients wait more, not less."""

    def locate(walked: record_reader.Walked) -> record_reader.Located:
        return record_reader.Located(*queue.locate(walked_from, walked.seqs, walked.msg_ids, walked.transient))

    return locate
