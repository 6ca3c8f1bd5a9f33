"""A stream stored by an earlier Warren (an entry per message in the queue index, its body in the message store, a
run of offsets per second beside them) is moved into a log of chunks when the node starts, once.

Each run becomes chunks with the run's publish time as their timestamp (so a consumer attaching by time finds what
it found before), the offsets stay as they were, and an AMQP 0-9-1 message is stored as the AMQP 1.0 record RabbitMQ
3.10 writes (as a publish does now).  The log is built in a directory of its own and renamed into place once it is
on disk; only then do the entries and their store references go.  A crash before the rename builds it again at the
next start; after it, the next start only removes the entries left.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from bisect import bisect_right
from typing import TYPE_CHECKING

from ..message import Message
from stream_log import amqp10, chunk
from stream_log.log import StreamLog, StreamLogs, _sync_dir

if TYPE_CHECKING:
    from .persistence import Persistence, RecoveredQueue

log = logging.getLogger("warren.stream")

READ_BATCH = 4096  # index entries read at a time
READ_BYTES = 64 << 20  # and at most so many bytes of their contents
CHUNK_RECORDS = 4096  # records per chunk at most (and chunk.MAX_ENTRIES, CHUNK_BYTES)
CHUNK_BYTES = 1 << 20


def legacy_stream(persistence: "Persistence", streams: StreamLogs, queue: "RecoveredQueue", name: str) -> None:
    """Move the messages of the stream ``name`` from the queue index and the message store into its log."""
    index = persistence.index
    queue_id = queue.index_id
    final = os.path.join(streams.directory, str(queue_id))
    rows = index.read(queue_id, 0, 1)
    if not rows:
        return
    first = rows[0].seq
    last = index.last_seq(queue_id)
    assert last is not None
    if not os.path.isdir(final):
        started = time.monotonic()
        building = final + ".migrating"
        shutil.rmtree(building, ignore_errors=True)
        os.makedirs(building)
        target = StreamLog(building, streams)
        target.next = target.first = target.last_chunk = first
        runs = [(run_first, ms) for _number, run_first, ms, _size, _flags in index.marks(queue_id)]
        written = _copy(persistence, queue.index_id, target, first, last + 1, runs)
        streams.commit()
        streams.sync()
        target.close()
        os.rename(building, final)
        _sync_dir(streams.directory)
        log.info("stream %s: %d messages moved into its log in %.1fs", name, written, time.monotonic() - started)
    persistence.recovered.append(lambda: _forget(persistence, queue, first, last + 1))


def _forget(persistence: "Persistence", queue: "RecoveredQueue", start: int, end: int) -> None:
    """The old entries, their store references and their runs go (once the store has recovered)."""
    persistence.drop(queue.index_id, [(start, end)])
    persistence.index.delete_queue(queue.index_id)


def _copy(persistence: "Persistence", queue_id: int, target: StreamLog, start: int, end: int,
          runs: list[tuple[int, int]]) -> int:
    """Every entry from ``start`` to ``end`` into ``target``, a chunk per run (split where it is too large)."""
    index, store = persistence.index, persistence.store
    run_starts = [run_first for run_first, _ms in runs]
    parts: list[bytes] = []
    body = 0
    written = 0
    cursor = start
    chunk_run = -1

    def write(timestamp: int) -> None:
        nonlocal parts, body
        count = len(parts) // 2
        target.append(b"".join(parts), count, count, body, chunk.body_trailer(body), timestamp=timestamp)
        parts, body = [], 0

    while cursor < end:
        rows = index.read(queue_id, cursor, READ_BATCH)
        if not rows:
            break
        payloads = store.read_many([row.msg_id for row in rows], READ_BYTES)
        for row, payload in zip(rows, payloads):
            if payload is None:
                payload = store.read(row.msg_id)
            message = Message.stored(row.msg_id, row.size)
            message.fill_from(payload)
            record = amqp10.from_amqp091(message) if message.header else message.body
            run = max(_run_of(run_starts, row.seq), 0)
            if parts and (run != chunk_run or len(parts) // 2 >= CHUNK_RECORDS or body >= CHUNK_BYTES):
                write(runs[chunk_run][1] if runs else 0)
            chunk_run = run
            parts.append(chunk.ENTRY.pack(len(record)))
            parts.append(record)
            body += message.body_size
            written += 1
        cursor = rows[-1].seq + 1
    if parts:
        write(runs[chunk_run][1] if runs else 0)
    return written


def _run_of(starts: list[int], seq: int) -> int:
    return bisect_right(starts, seq) - 1
