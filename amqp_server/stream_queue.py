"""Streams (``x-queue-type: stream``) over AMQP 0-9-1, as RabbitMQ 3.10 serves them to AMQP clients.

A stream is an append-only log: a consumer reads it from an offset of its choosing (``x-stream-offset``:
``first``, ``last``, ``next``, a number, a timestamp or an interval such as ``1h``) without taking
anything, each delivery carrying its ``x-stream-offset`` header; acks only give credit back.  Messages
leave by retention alone (``x-max-length-bytes``, ``x-max-age``), a whole segment at a time and only
when a segment fills (``x-stream-max-segment-size-bytes``, 500 MB by default), as RabbitMQ's log does.

Every message is on disk (queue index and message store); memory holds the newest ``TAIL`` entries, which
consumers that keep up read, and runs: the first offset, publish time and bytes of each second's messages
(and of each segment's first), kept in the queue index beside the entries (``QueueIndex.marks``) so that
timestamps and retention survive a restart.  Past ``MAX_RUNS`` runs, neighbours within a segment merge
pairwise, so memory stays bounded however long the stream keeps its messages (a timestamp then starts
at the merged run: earlier, never later).  An offset is the entry's ``seq``.
"""
from __future__ import annotations

import datetime
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from . import errors, header_table
from .stream import amqp10
from .clock import now_ms
from .message import Message
from .queue import PAGE_IN_BYTES, Consumer, Entry, Queue
from .queue_args import QueueArgs, interval_ms

if TYPE_CHECKING:
    from .ports import ConfirmSink, StreamListener

OFFSET_HEADER = "x-stream-offset"
TAIL = 4096  # newest entries kept in memory, at most
TAIL_BYTES = 16 << 20  # and at most so many bytes of their bodies
READ_BATCH = 256  # entries read from disk at a time for a consumer behind the tail
DEFAULT_SEGMENT_BYTES = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
MAX_RUNS = 16384  # runs kept before neighbours merge
SEGMENT, MERGED = 1, 2  # a run's flags: it starts a segment; it spans more than its second


@dataclass(slots=True)
class Mark:
    """A run of the stream: from ``first`` (its first offset) to the next mark's; published from ``ms`` on."""

    number: int
    first: int
    ms: int
    size: int = 0  # bytes of its messages' bodies
    flags: int = 0  # SEGMENT: the first run of a segment (retention removes whole segments); MERGED

    @property
    def segment(self) -> bool:
        return bool(self.flags & SEGMENT)


class StreamQueue(Queue):
    queue_type = "stream"
    counts_deliveries = True  # each delivery carries x-stream-offset (delivery_header)
    persists_all = True  # every message is on disk, whatever its delivery mode
    pageable = False  # its own: the tail in memory, the rest read from disk (``_read``)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first = 0  # the lowest offset still in the stream
        self.cursors: dict[Consumer, int] = {}  # each consumer's next offset
        self.marks: deque[Mark] = deque()
        self.segment_bytes = 0  # of the segment being written
        self.tail_bytes = 0  # of the entries in memory (``ready``)
        # stream-protocol readers and writers (stream.reader)
        self.listeners: dict["StreamListener[StreamQueue]", None] = {}

    @property
    def message_count(self) -> int:
        return self.next_seq - self.first

    def __repr__(self) -> str:
        return f"<Stream {self.vhost}/{self.name}>"

    # -- in -----------------------------------------------------------------------------------

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        message = self._stored_copy(message)
        entry = Entry(self.next_seq, message)
        self.next_seq += 1
        self.stats.publish += 1
        self.persistence.write(self, entry)
        self._mark(entry.seq, message.body_size)
        ready = self.ready
        ready.append(entry)
        self.tail_bytes += message.body_size
        while len(ready) > TAIL or (self.tail_bytes > TAIL_BYTES and len(ready) > 1):
            self.tail_bytes -= ready.popleft().message.body_size
        if self.cursors:
            self.deliver_ready()
        for listener in self.listeners:
            listener.appended(self)
        return True

    def _mark(self, seq: int, size: int) -> None:
        """Count the message in its run; a new second or a full segment starts a new run (and a full segment
        lets retention run)."""
        marks = self.marks
        now = now_ms()
        rolled = self.segment_bytes >= (self.args.segment_bytes or DEFAULT_SEGMENT_BYTES)
        if rolled or not marks or now // 1000 != marks[-1].ms // 1000:
            if marks:
                self._save(marks[-1])  # its size is final now
            marks.append(Mark(marks[-1].number + 1 if marks else 0, seq, now, 0,
                              SEGMENT if rolled or len(marks) == 0 else 0))
            self._save(marks[-1])
            if rolled:
                self.segment_bytes = 0
            if len(marks) > MAX_RUNS:
                self._merge_runs()
        marks[-1].size += size
        self.segment_bytes += size
        self.ready_bytes += size
        if rolled:
            self._retain()

    def _save(self, mark: Mark) -> None:
        self.persistence.index.put_mark(self.index_id, mark.number, mark.first, mark.ms, mark.size, mark.flags)

    def _merge_runs(self) -> None:
        """Each pair of neighbouring runs within a segment becomes one (the newest run stays as it is)."""
        index = self.persistence.index
        kept: deque[Mark] = deque()
        newest = self.marks[-1]
        joined = None  # the run that took its neighbour in this pass
        for mark in self.marks:
            last = kept[-1] if kept else None
            if last is not None and last is not joined and not mark.segment and mark is not newest:
                last.size += mark.size
                last.flags |= MERGED
                index.forget_mark(self.index_id, mark.number)
                self._save(last)
                joined = last
            else:
                kept.append(mark)
        self.marks = kept

    def _retain(self) -> None:
        """Whole segments go, oldest first, while the stream is over x-max-length-bytes or the next segment began
        before x-max-age ago (so every message of theirs is older); never the segment being written."""
        max_bytes, max_age = self.args.max_length_bytes, self.args.max_age
        if max_bytes is None and max_age is None:
            return
        marks = self.marks
        oldest = now_ms() - max_age if max_age is not None else None
        while True:
            starts = [i for i, mark in enumerate(islice(marks, 1, None), 1) if mark.segment]
            if not starts:
                return
            segment = list(islice(marks, 0, starts[0]))
            if not ((max_bytes is not None and self.ready_bytes > max_bytes)
                    or (oldest is not None and marks[starts[0]].ms < oldest)):
                return
            self._drop(marks[starts[0]].first, segment)

    def _drop(self, end: int, segment: list[Mark]) -> None:
        """Offsets below ``end`` leave the stream, with the runs that held them."""
        self.persistence.remove_range(self, self.first, end)
        ready = self.ready
        while ready and ready[0].seq < end:
            self.tail_bytes -= ready.popleft().message.body_size
        for mark in segment:
            self.marks.popleft()
            self.ready_bytes -= mark.size
        self.persistence.index.forget_marks(self.index_id, segment[-1].number + 1)
        self.first = end

    def set_args(self, args: QueueArgs) -> None:
        """A policy changed the retention: it applies when the next segment fills, as RabbitMQ's does."""
        self.args = args

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.cursors[consumer] = self.attach_at(consumer.arguments.get(OFFSET_HEADER, "next"))
        super().add_consumer(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        self.cursors.pop(consumer, None)
        super().remove_consumer(consumer)

    def attach_at(self, spec: Any) -> int:
        """The offset a consumer starts from, within the stream (``queue_args.check_consumer`` checked the
        spec).  ``last`` is the last message (RabbitMQ's last chunk: what it wrote at once)."""
        if isinstance(spec, bytes):
            spec = spec.decode(errors="replace")
        if spec == "next":
            return self.next_seq
        if spec == "first":
            return self.first
        if spec == "last":
            return max(self.first, self.next_seq - 1)
        if isinstance(spec, int) and not isinstance(spec, bool):
            return min(max(spec, self.first), self.next_seq)
        if isinstance(spec, datetime.datetime):
            return self._published_from(int(spec.timestamp() * 1000))
        if isinstance(spec, str) and (ms := interval_ms(spec)) is not None:
            return self._published_from(now_ms() - ms)
        return self.next_seq

    def _published_from(self, ms: int) -> int:
        """The first offset of the first run that may hold a message published at or after ``ms``: one that
        ends after it (a run ends with its second, a merged one where the next begins)."""
        marks = self.marks
        for i, mark in enumerate(marks):
            if mark.flags & MERGED and i + 1 < len(marks):
                end = marks[i + 1].ms
            else:
                end = (mark.ms // 1000 + 1) * 1000
            if end > ms:
                return mark.first
        return self.next_seq

    def deliver_ready(self) -> None:
        """Each consumer reads on from its own offset while it has credit."""
        for consumer in self.consumers:
            cursor = max(self.cursors[consumer], self.first)
            while cursor < self.next_seq and consumer.has_credit():
                room = consumer.prefetch - consumer.unacked
                batch = self._read(cursor, min(room, READ_BATCH))
                if not batch:
                    cursor = self.next_seq
                    break
                for entry in batch:
                    if not consumer.has_credit():
                        break
                    entry = self._amqp091(entry)
                    consumer.unacked += 1
                    self.unacked += 1
                    self.stats.deliver += 1
                    cursor = entry.seq + 1
                    consumer.channel.deliver(consumer, entry)
            self.cursors[consumer] = cursor

    def read(self, start: int, count: int) -> list[Entry]:
        """Up to ``count`` entries from offset ``start`` (within the stream) with their contents: a stream-protocol
        reader's next chunk."""
        return self._read(start, count)

    def published_ms(self) -> int:
        """When the newest run began: the timestamp of a chunk read now (runs are a second long at most)."""
        return self.marks[-1].ms if self.marks else now_ms()

    def _read(self, start: int, count: int) -> list[Entry]:
        """Up to ``count`` entries from ``start`` on: from the tail in memory, else from disk."""
        ready = self.ready
        if ready and start >= ready[0].seq:
            position = start - ready[0].seq
            behind = len(ready) - position
            if behind < position:  # near the end (a consumer keeping up): walked from there
                newest = list(islice(reversed(ready), behind))
                newest.reverse()
                return newest[:count]
            return list(islice(ready, position, position + count))
        persistence = self.persistence
        rows = persistence.index.read(self.index_id, start, count)
        payloads = persistence.store.read_many([row.msg_id for row in rows], PAGE_IN_BYTES)  # a pread per run
        routes: dict[bytes, tuple[bytes, str, str]] = {}
        headers: dict[bytes, bytes] = {}
        entries = []
        for row, payload in zip(rows, payloads):
            entry = self._paged_entry(row)
            if payload is not None:  # (else beyond the batch's budget: read on its own by ``readable``)
                entry.message.fill_from(payload, routes, headers)
            entries.append(entry)
        return self.readable(entries)

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        return header_table.with_int_set(entry.message.header, OFFSET_HEADER, entry.seq)

    def settle(self, entries: list[Entry]) -> None:
        """An ack gives credit back; the message stays."""
        self.unacked -= len(entries)
        self.stats.ack += len(entries)

    def requeue(self, entries: Iterable[Entry]) -> None:
        """What a closed channel or cancelled consumer held: nothing comes back (the offsets are read)."""
        self.unacked -= sum(1 for _ in entries)

    def get(self, no_ack: bool) -> Entry | None:
        raise errors.ConnectionError(
            errors.NOT_IMPLEMENTED,
            f"basic.get not supported by stream queues {errors.resource_name('queue', self.name, self.vhost)}")

    # -- what reads or changes the whole stream -----------------------------------------------

    def purge(self) -> int:
        raise errors.ConnectionError(
            errors.NOT_IMPLEMENTED,
            f"queue.purge not supported by stream queues {errors.resource_name('queue', self.name, self.vhost)}")

    def drop_all(self) -> None:
        """The stream is deleted: its entries, their store references and its runs go; its stream-protocol
        readers and writers are told."""
        for listener in list(self.listeners):
            listener.deleted(self)
        self.listeners.clear()
        self._groups = []
        self.active_consumer = None
        self.cursors.clear()
        self.ready.clear()
        self.persistence.remove_range(self, self.first, self.next_seq)
        self.persistence.delete_queue(self)

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        """Offsets, bytes and runs from the index; nothing is read into memory until a consumer asks."""
        index = self.persistence.index
        if last_seq is not None:
            self.next_seq = last_seq + 1
        rows = index.read(self.index_id, 0, 1)
        self.first = rows[0].seq if rows else self.next_seq
        self.ready_bytes = size
        self.marks = deque(Mark(*run) for run in index.marks(self.index_id))
        if self.marks:  # the last run's bytes were saved as it began
            self.marks[-1].size = max(0, size - sum(mark.size for mark in islice(self.marks, 0, len(self.marks) - 1)))
            current = max(i for i, mark in enumerate(self.marks) if mark.segment or i == 0)
            self.segment_bytes = sum(mark.size for mark in islice(self.marks, current, None))

    def offsets(self) -> tuple[int, int]:
        return self.first, self.next_seq

    def peek(self, offset: int = 0, count: int = 10) -> list[Entry]:
        if self.first + offset >= self.next_seq:
            return []
        return [self._amqp091(entry) for entry in self._read(self.first + offset, count)]

    def _amqp091(self, entry: Entry) -> Entry:
        """The entry as AMQP 0-9-1 readers see it: a stream-protocol record converted."""
        if entry.message.header:
            return entry
        return Entry(entry.seq, amqp10.to_amqp091(entry.message.body, self.name))

    def read_range(self, start: int, end: int, step: int, limit: int | None = None) -> Iterator[list[Entry]]:
        cursor, remaining = max(start, self.first), limit
        while cursor < min(end, self.next_seq) and (remaining is None or remaining > 0):
            want = step if remaining is None else min(step, remaining)
            batch = [self._amqp091(entry) for entry in self._read(cursor, want) if entry.seq < end]
            if not batch:
                return
            cursor = batch[-1].seq + 1
            if remaining is not None:
                remaining -= len(batch)
            yield batch

    def remove_upto(self, offset: int) -> int:
        raise errors.precondition_failed(
            f"{errors.resource_name('queue', self.name, self.vhost)} is a stream: its messages leave by "
            "retention only")
