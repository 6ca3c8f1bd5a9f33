"""A queue's side of the Spark bridge: read by sequence number, remove once the reader committed.

An offset is an entry's ``seq``: per queue, increasing, and for durable queues kept by the queue index across
restarts.  Only *ready* entries are visible here: entries a consumer holds unacked are neither browsed nor removed
(if requeued they come back at their seq).  A reader in another process walks the part on disk itself
(``disk_part``, ``disk_index``, ``locate``: ``record_reader``), or a stream's chunks (``chunk_span``).
:class:`RecordSource` is all the bridge reads a queue through; every queue type provides it (:class:`Offsets`
here, for the types whose entries sit in a ready list and the queue index; a stream's own methods for its log).
"""
from __future__ import annotations

import os
from bisect import bisect_left
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple, Protocol

import numpy as np

from ..clock import now_ms
from ..ready import Entry, _seq
from ..settle import Settling

if TYPE_CHECKING:
    from msg_store import MessageStore

    from ..stream.log import ChunkSpan


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


class RecordSource(Protocol):
    """What the Spark bridge reads a queue through (``records``, ``commit``), whatever its type: a stream names its
    chunks (``chunk_span``); the others give their entries in memory (``read_range``) and name those on disk, for a
    reader process to walk in the queue index (``disk_part``, ``disk_index``, ``locate``)."""

    @property
    def name(self) -> str: ...
    @property
    def committed(self) -> int: ...
    @property
    def message_count(self) -> int: ...
    @property
    def ready_bytes(self) -> int: ...
    def offsets(self) -> tuple[int, int]: ...
    def read_range(self, start: int, end: int, step: int, limit: int | None = None) -> Iterator[list[Entry]]: ...
    def chunk_span(self, start: int, end: int, rows: int, max_bytes: int) -> "ChunkSpan | None": ...
    def disk_part(self) -> DiskPart | None: ...
    def disk_index(self, start: int) -> tuple[str, int, int] | None: ...
    def locate(self, walked_from: int, seqs: np.ndarray, msg_ids: np.ndarray,
               transient: np.ndarray) -> tuple[int, DiskSpan]: ...


class Offsets(Settling):
    """Reads by offset and commits, for the Spark bridge: a part of :class:`queue.Queue`."""

    def offsets(self) -> tuple[int, int]:
        """(head, tail): the lowest seq of a live ready entry (``next_seq`` if none), and ``next_seq``."""
        head = next((entry.seq for entry in self._from_seq(0) if not entry.gone), self.next_seq)
        first_on_disk = self._first_paged(0)
        return min(head, first_on_disk) if first_on_disk is not None else head, self.next_seq

    def browse(self, start: int, end: int, limit: int | None = None) -> list[Entry]:
        """Ready entries with ``start <= seq < end``, in seq order, at most ``limit``; nothing changes.

        No redelivered flag, no delivery, no stats: a retried read sees the same entries.  Entries whose
        TTL ran out are skipped.  Bodies on disk are loaded.  A priority queue's entries come in seq
        (publish) order too, not in delivery order.
        """
        found: list[Entry] = []
        for batch in self.read_range(start, end, 4096, limit):
            found.extend(batch)
        return found

    def read_range(self, start: int, end: int, step: int, limit: int | None = None) -> Iterator[list[Entry]]:
        """``browse`` a batch of at most ``step`` entries at a time, so a long read can let others run
        between batches while the queue changes: each batch is what is ready when it is read."""
        remaining = limit
        for entries in self._range_slices(start, end, step):
            batch = self.readable(entries, remaining)
            if batch:
                yield batch
            if remaining is not None:
                remaining -= len(batch)
                if remaining <= 0:
                    return

    def _range_slices(self, start: int, end: int, step: int) -> Iterator[list[Entry]]:
        """``read_range``'s entries with ``start <= seq < end``, at most ``step`` at a time in seq order, dead ones
        included: those in memory below the first on disk, then from where they ended on, what is there when asked."""
        first_on_disk = self._first_paged(start)  # memory up to there first (a priority queue's interleave)
        memory = self.span(start, end if first_on_disk is None else min(end, first_on_disk))
        cursor = start
        for i in range(0, len(memory), step):
            yield memory[i:i + step]
            cursor = memory[min(i + step, len(memory)) - 1].seq + 1
        while cursor < end:
            # entries at or above cursor: any paged in or requeued since (in memory), then those on disk
            entries = [entry for entry in islice(self._from_seq(cursor), step) if entry.seq < end]
            if self.paged:
                entries.extend(self._paged_entry(row) for row in self._paged_rows(cursor, step) if row.seq < end)
            if not entries:
                return
            entries.sort(key=_seq)
            entries = entries[:step]
            cursor = entries[-1].seq + 1
            yield entries

    def disk_index(self, start: int) -> tuple[str, int, int] | None:
        """Where a reader in another process walks the entries on disk from ``start`` on (``disk_span`` then
        finds their payloads): the queue index's directory, the queue's id there and the first seq, the index
        committed so that the reader sees them.  None where the part on disk is not a seq suffix (a priority
        queue's levels interleave)."""
        if self.ranked:
            return None
        index, queue_id = self._page_index()
        index.commit()
        return index.path, queue_id, max(start, self.paged_from, self._drop_below)

    def chunk_span(self, start: int, end: int, rows: int, max_bytes: int) -> "ChunkSpan | None":
        """Where a reader in another process reads the chunks holding offsets ``start`` to ``end`` (``rows`` of
        them, about ``max_bytes``); None for a queue whose messages are not kept in chunks (a stream's are)."""
        return None

    def disk_part(self) -> DiskPart | None:
        """The ready entries on disk (None: none are)."""
        return DiskPart(self.paged_from, self.paged, self.paged_bytes) if self.paged else None

    def locate(self, walked_from: int, seqs: np.ndarray, msg_ids: np.ndarray,
               transient: np.ndarray) -> tuple[int, DiskSpan]:
        """Where the payloads of entries a reader walked from ``walked_from`` (``disk_index``; ``seqs``, ``msg_ids``
        and ``transient`` as ``disk_span`` takes them) lie, of those still on disk: how many of the first rows are
        not (consumers took the disk's head into memory meanwhile), and the others' ``disk_span``."""
        skip = 0
        if not self.paged or self.paged_from > walked_from:
            skip = int(np.searchsorted(seqs, self.paged_from))
        return skip, self.disk_span(msg_ids[skip:], transient[skip:])

    def disk_span(self, msg_ids: np.ndarray, transient: np.ndarray) -> DiskSpan:
        """Where the payloads of entries walked from ``disk_index`` lie in the stores' segment files:
        ``msg_ids`` of the transient store where ``transient``, of the persistent one elsewhere."""
        persistent = self.persistence.store if self.persistence is not None else None
        if not transient.any() or transient.all():  # one store holds them all (a backlog's): its arrays as they are
            return _store_span(self._pages.store if len(transient) and transient[0] else persistent, msg_ids)
        count = len(msg_ids)
        span = DiskSpan.none(count)
        for store, which in ((self._pages.store, transient), (persistent, ~transient)):
            part = _store_span(store, msg_ids[which])
            span.found[which], span.offsets[which], span.sizes[which] = part.found, part.offsets, part.sizes
            span.files[which] = part.files + np.uint32(len(span.fds))
            span.fds.extend(part.fds)
        return span

    def span(self, start: int, end: int) -> list[Entry]:
        """The in-memory ready entries with ``start <= seq < end`` in seq order, dead ones included: one copy
        of references, which a long read goes through in slices (``readable``) while the queue changes."""
        ready = self.ready
        if not ready or end <= start:
            return []
        first = bisect_left(ready, start, key=_seq) if ready[0].seq < start else 0
        last = bisect_left(ready, end, key=_seq) if ready[-1].seq >= end else len(ready)
        return list(islice(ready, first, last))

    def readable(self, entries: Iterable[Entry], limit: int | None = None) -> list[Entry]:
        """Of ``entries`` (from ``span``), those still ready and unexpired, at most ``limit``, bodies loaded."""
        found: list[Entry] = []
        if limit is not None and limit <= 0:
            return found
        now = now_ms()
        host = self.host
        for entry in entries:
            if entry.gone or (entry.expiry and entry.expiry <= now):
                continue
            if entry.message.body is None and host is not None:
                host.load_body(entry.message)
            found.append(entry)
            if limit is not None and len(found) >= limit:
                break
        return found

    def remove_upto(self, offset: int) -> int:
        """Remove every ready entry with ``seq < offset`` as an ack would (index and store updated).

        Idempotent and monotonic: ``committed`` never goes back, an offset at or below it removes
        nothing more.  Returns how many entries were removed; with ``DROPS_COMMITTED_LATER``, those in
        memory, the ones on disk left to ``count_committed`` (unseen meanwhile by reads, deliveries and expiry)
        unless every entry on disk is below ``offset``: then they leave at once.  An offset past the tail
        commits up to the tail: the cursor never passes offsets not given out yet, which a later commit
        could then not reach.
        """
        offset = min(offset, self.next_seq)
        if offset <= self.committed:
            return 0
        self.committed = offset
        removed = self._remove_below(offset)
        self.stats.ack += removed
        if removed:
            self.touch()
        return removed

    def _remove_below(self, offset: int) -> int:
        """``remove_upto``'s removals, without its cursor and counts: how many entries left now."""
        removed = 0
        for entry in self._pop_below(offset):
            if entry.gone:
                self.gone_in_ready -= 1
                continue
            self.ready_bytes -= entry.message.body_size
            if entry.expiry:
                self._expiring.pop(self.row_key(entry), None)
            self._forget(entry)
            removed += 1
        if self.paged and offset > self.paged_from:
            if self.DROPS_COMMITTED_LATER:
                index, queue_id = self._page_index()
                self._drop_marks.append(index.mark_dropped(queue_id, self.paged_from, offset))
                if not self._drop_below:
                    self._counting = (self.paged_from, 0, 0)
                self._drop_below = offset
                if self._first_paged(offset) is None:  # the whole part on disk: its count is known
                    self._cut(self.paged, self.paged_bytes)
            else:
                removed += self._drop_paged(offset)
        return removed
