"""A queue's side of the Spark bridge: read by sequence number, remove once the reader committed.

An offset is an entry's ``seq``: per queue, increasing, and for durable queues kept by the queue index across
restarts.  Only *ready* entries are visible here: entries a consumer holds unacked are neither browsed nor removed
(if requeued they come back at their seq).  A reader in another process walks the part on disk itself
(``disk_part``, ``disk_index``, ``locate``: ``record_reader``), or a stream's chunks (``chunk_span``).
:class:`RecordSource` is all the bridge reads a queue through: an adapter outside the queue's class, over what
every queue gives (its offsets and ``read_range``) and where its ready list or its log keeps the rest.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

import numpy as np

from ..queues.queue_type import LOG
from ..queues.ready import Entry

if TYPE_CHECKING:
    from msg_store import MessageStore

    from ..queues.queue import LocalQueue

    from stream_log.log import ChunkSpan


def _segment_files(segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct segment numbers, in order, and each row's index among them: ``np.unique`` with its inverse,
    without its sort when the rows are in order already (a backlog's records are, mostly: they were written
    in publish order), each run of one number then a block of one index."""
    if np.all(segments[1:] >= segments[:-1]):
        starts = np.flatnonzero(np.concatenate(([True], segments[1:] != segments[:-1])))[:len(segments)]
        files = np.repeat(np.arange(len(starts), dtype=np.uint32), np.diff(np.append(starts, len(segments))))
        return segments[starts], files
    numbers, inverse = np.unique(segments, return_inverse=True)
    return numbers, inverse.astype(np.uint32)


def _store_span(store: "MessageStore | None", msg_ids: np.ndarray) -> "DiskSpan":
    """``Queue.disk_span`` of messages all in ``store`` (None: none found)."""
    if store is None:
        return DiskSpan.none(len(msg_ids))
    found, segments, offsets, sizes = store.locate(msg_ids)
    if found.all():
        numbers, files = _segment_files(segments)
    else:  # the rows not found name no segment
        numbers, files_found = _segment_files(segments[found])
        files = np.zeros(len(segments), np.uint32)
        files[found] = files_found
    return DiskSpan(found, files, offsets, sizes, [os.dup(store.segment_fd(int(number))) for number in numbers])


@dataclass
class DiskSpan:
    """Where the payloads of entries walked from a queue's part on disk lie (``Queue.disk_span``): row ``i``,
    if ``found[i]``, is the ``sizes[i]`` bytes at ``offsets[i]`` of the segment file open as ``fds[files[i]]``.
    The descriptors are duplicates, the holder's to close (``close``): they stay that file whatever the store
    does meanwhile."""

    found: np.ndarray
    files: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    fds: list[int]

    @classmethod
    def none(cls, count: int) -> DiskSpan:
        """``count`` rows, none found yet."""
        return cls(np.zeros(count, bool), np.zeros(count, np.uint32), np.zeros(count, np.uint32),
                   np.zeros(count, np.uint32), [])

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class DiskPart(NamedTuple):
    """A queue's ready entries on disk: every one from ``first`` on, ``messages`` of them with ``size`` body bytes;
    those below ``first`` are in memory."""

    first: int
    messages: int
    size: int


class RecordSource:
    """What the Spark bridge reads a queue through (``records``): its offsets and its entries by seq, whatever its
    type; a stream's chunks (``chunk_span``); for the others, where their entries on disk are, for a reader process
    to walk in the queue index (``disk_part``, ``disk_index``, ``locate``)."""

    __slots__ = ("queue", "log")

    def __init__(self, queue: LocalQueue) -> None:
        self.queue: Any = queue
        self.log = LOG in queue.type.capabilities  # a stream: its log's chunks, no part on disk

    @property
    def name(self) -> str:
        return self.queue.name

    @property
    def committed(self) -> int:
        return self.queue.committed

    @property
    def message_count(self) -> int:
        return self.queue.message_count

    @property
    def ready_bytes(self) -> int:
        return self.queue.ready_bytes

    def offsets(self) -> tuple[int, int]:
        """(head, tail): the lowest offset of a ready entry (``tail`` if none), and the next one to be given."""
        return self.queue.offsets()

    def read_range(self, start: int, end: int, step: int, limit: int | None = None) -> Iterator[list[Entry]]:
        """Ready entries with ``start <= seq < end``, at most ``step`` at a time (``Queue.read_range``)."""
        return self.queue.read_range(start, end, step, limit)

    def disk_index(self, start: int) -> tuple[str, int, int] | None:
        """Where a reader in another process walks the entries on disk from ``start`` on (``disk_span`` then
        finds their payloads): the queue index's directory, the queue's id there and the first seq, the index
        committed so that the reader sees them.  None where the part on disk is not a seq suffix (a priority
        queue's levels interleave; a quorum queue's returns to the front have rows among it, ``ReadyList.apart``)."""
        if self.log or self.queue.ready.ranked or self.queue.ready.apart:
            return None
        ready = self.queue.ready
        index, queue_id = ready.page_index()
        index.commit()
        return index.path, queue_id, max(start, ready.disk_floor)

    def chunk_span(self, start: int, end: int, rows: int, max_bytes: int) -> "ChunkSpan | None":
        """Where a reader in another process reads the chunks holding offsets ``start`` to ``end`` (``rows`` of
        them, about ``max_bytes``); None for a queue whose messages are not kept in chunks (a stream's are)."""
        return self.queue.chunk_span(start, end, rows, max_bytes) if self.log else None

    def disk_part(self) -> DiskPart | None:
        """The ready entries on disk (None: none are)."""
        ready = self.queue.ready
        return DiskPart(ready.paged_from, ready.paged, ready.paged_bytes) if not self.log and ready.paged else None

    def locate(self, walked_from: int, seqs: np.ndarray, msg_ids: np.ndarray,
               transient: np.ndarray) -> tuple[int, DiskSpan]:
        """Where the payloads of entries a reader walked from ``walked_from`` (``disk_index``; ``seqs``, ``msg_ids``
        and ``transient`` as ``disk_span`` takes them) lie, of those still on disk: how many of the first rows are
        not (consumers took the disk's head into memory meanwhile), and the others' ``disk_span``."""
        skip, ready = 0, self.queue.ready
        if not ready.paged or ready.paged_from > walked_from:
            skip = int(np.searchsorted(seqs, ready.paged_from))
        return skip, self.disk_span(msg_ids[skip:], transient[skip:])

    def disk_span(self, msg_ids: np.ndarray, transient: np.ndarray) -> DiskSpan:
        """Where the payloads of entries walked from ``disk_index`` lie in the stores' segment files:
        ``msg_ids`` of the transient store where ``transient``, of the persistent one elsewhere."""
        persistence = self.queue.persistence
        persistent = persistence.store if persistence is not None else None
        transient_store = self.queue.pager.store
        if not transient.any() or transient.all():  # one store holds them all (a backlog's): its arrays as they are
            return _store_span(transient_store if len(transient) and transient[0] else persistent, msg_ids)
        count = len(msg_ids)
        span = DiskSpan.none(count)
        for store, which in ((transient_store, transient), (persistent, ~transient)):
            part = _store_span(store, msg_ids[which])
            span.found[which], span.offsets[which], span.sizes[which] = part.found, part.offsets, part.sizes
            span.files[which] = part.files + np.uint32(len(span.fds))
            span.fds.extend(part.fds)
        return span
