"""A queue: its ready messages, its consumers, and the round-robin that joins them.

Delivery is synchronous: an enqueue with a consumer that has credit goes out
in the same call, so a message published and consumed on one broker touches
no scheduler.  The channel owns delivery tags and the unacked map; the queue
only hands entries over and takes them back.

Expired entries are found through an expiry heap wherever they sit, marked
gone in place and skipped when the ready list reaches them, so expiring a
message in the middle of a long queue costs O(log n).

Only the head of the ready list need be in memory: past ``window`` entries (a
durable queue) or when memory runs short (any queue but a priority one), the
tail goes to disk as queue index entries (``page_out``) and comes back a batch
at a time as the head drains (``_page_in``).  While part of the queue is on
disk, new entries join it there, so order holds.  Every seq on disk is above
every seq in memory and every seq a consumer holds (``_taken_upto``).

The ready list is a deque in ``seq`` order; a priority queue (``x-max-priority``,
:mod:`priority_queue`) keeps one per priority level.  Consumers are grouped by their
``x-priority``: a group gets messages only while every higher one is out of
credit, round-robin within it.  With ``x-single-active-consumer`` the only
group is the active consumer; when it leaves, the next (highest priority, then
earliest registered) takes over.
"""
from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections import deque
from functools import partial
from itertools import islice
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol

import numpy as np

from queue_index import FLAG_TRANSIENT, ExpiryHeap, IndexEntry, QueueIndex

from .clock import now_ms
from .logs import untrusted
from .message import Message
from .queue_args import QueueArgs
from .ready import Entry, _seq, from_seq, pop_below, put_back
from .stats import MessageStats

if TYPE_CHECKING:
    from msg_store import MessageStore

    from .persistence import Persistence
    from .policy import Policy
    from .ports import ConfirmSink, DeliveryTarget, ExclusiveOwner, Replicator


log = logging.getLogger("warren.queue")

PAGE_IN_BELOW = 256  # live entries in memory under which the next batch of the tail comes in
PAGE_IN_BATCH = 1024
DROP_BATCH = 1024  # index rows dropped per loop turn in the background (a deleted queue's, a purge's): milliseconds
COUNT_BATCH = 8192  # index rows a commit counts per loop turn (a few milliseconds), before they are dropped
PAGED_WINDOW = 2048  # the window of a queue paged under memory pressure (it has none of its own)
MIN_WINDOW = 64  # the least a deep queue keeps in memory, however many share the budget (paging.Pager.window)
CONSUMED_WINDOW = 32768  # the window of a queue with consumers (the shared budget still applies)
PAGE_IN_BYTES = 4 * 1024 * 1024  # contents read with a batch; the rest of it is read when delivered


def _segment_files(segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct segment numbers, in order, and each row's index among them: ``np.unique`` with its inverse,
    without its sort when the rows are in order already (a backlog's records are, mostly: they were written
    in publish order), each run of one number then a block of one index."""
    if np.all(segments[1:] >= segments[:-1]):
        starts = np.flatnonzero(np.concatenate(([True], segments[1:] != segments[:-1])))[:len(segments)]
        files = np.repeat(np.arange(len(starts), dtype=np.uint32), np.diff(np.append(starts, len(segments))))
        return segments[starts], files
    numbers, files = np.unique(segments, return_inverse=True)
    return numbers, files.astype(np.uint32)


def _store_span(store: "MessageStore | None", msg_ids: np.ndarray) -> "DiskSpan":
    """``Queue.disk_span`` of messages all in ``store`` (None: none found)."""
    if store is None:
        return DiskSpan(np.zeros(len(msg_ids), bool), *(np.zeros(len(msg_ids), np.uint32) for _ in range(3)), [])
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

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class Consumer:
    """basic.consume on one queue; ``prefetch`` 0 means unlimited."""

    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "arguments", "prefetch",
                 "unacked", "prefix", "priority", "counted")

    def __init__(self, tag: str, channel: "DeliveryTarget[Consumer, Entry]", queue: "Queue", no_ack: bool,
                 exclusive: bool, arguments: dict, prefetch: int, prefix: bytes, priority: int = 0) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self.prefetch = prefetch
        self.unacked = 0
        self.prefix = prefix  # encoded Basic.Deliver class/method + consumer tag
        self.priority = priority  # x-priority
        self.counted = queue.counts_deliveries  # its deliveries' header is the queue's (delivery_header)

    def has_credit(self) -> bool:
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()


class ConsumerGroup:
    """The consumers of one priority that receive messages, and where round-robin among them resumes."""

    __slots__ = ("priority", "consumers", "rr")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.consumers: list[Consumer] = []
        self.rr = 0


class QueueHost(Protocol):
    """What a queue asks of the broker that owns it."""

    def dead_letter(self, queue: "Queue", entries: list[Entry], reason: str) -> list[Entry]: ...

    def expire_queue(self, queue: "Queue") -> None: ...

    def load_body(self, message: Message) -> None: ...


class TransientPages(Protocol):
    """Where a queue's tail goes when its messages are not in the persistent store, and how much of a
    queue stays in memory (paging.Pager)."""

    store: "MessageStore"
    index: QueueIndex
    share: int

    def deep(self, queue: "Queue") -> None: ...

    def shallow(self, queue: "Queue") -> None: ...

    def new_page_id(self) -> int: ...

    def write(self, message: Message) -> int: ...


def stored_message(row: IndexEntry) -> Message:
    """The message of an index row, its content left in the store (transient or persistent) it names."""
    return Message.stored(0, row.size, row.msg_id) if row.transient else Message.stored(row.msg_id, row.size)


def _priority(consumer: Consumer) -> int:
    return consumer.priority


class Queue:
    """A FIFO of entries plus its consumers, as RabbitMQ's classic queue behaves."""

    available = True  # a cluster proxy (forwarder.RemoteQueue) is not while its home node is down
    remote = False  # a cluster proxy: basic.get and purge are awaited (fetch, purge_remote)
    pageable = True
    ranked = False  # a priority queue keys its index entries by level, then seq (row_key)
    entry_type = Entry  # a priority queue's entries know their level
    queue_type = "classic"
    counts_deliveries = False  # a quorum queue sets x-delivery-count on each delivery (delivery_header)
    persists_all = False  # a durable quorum queue stores transient messages too (a copy of its own)
    replicator: "Replicator[Entry] | None" = None  # a quorum queue led here in cluster mode: ships its changes
    DROPS_COMMITTED_LATER = True  # a commit counts its entries on disk (count_committed); they go in the background
    PURGES_LATER = True  # a purge's entries on disk leave in the background (Pager.drop_later), marked dropped

    def __init__(self, name: str, vhost: str, durable: bool = False,
                 exclusive_owner: "ExclusiveOwner[Queue] | None" = None, auto_delete: bool = False,
                 arguments: dict[str, Any] | None = None, args: QueueArgs | None = None,
                 host: QueueHost | None = None) -> None:
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.args = args or QueueArgs()
        self._limited = self.args.limited
        self._ttl = self.args.message_ttl is not None
        self.host = host
        self.ready: deque[Entry] = deque()
        self.gone_in_ready = 0
        self.ready_bytes = 0
        self.consumers: list[Consumer] = []  # in registration order
        self.active_consumer: Consumer | None = None  # x-single-active-consumer: the one that receives
        self._groups: list[ConsumerGroup] = []  # consumers that receive, by descending priority
        self.unacked = 0
        self.unacked_bytes = 0
        self.next_seq = 0
        self.had_consumer = False
        self.deleted = False
        self.stats = MessageStats()
        self.index_id = 0
        self.persistence: "Persistence | None" = None  # set for durable queues
        self._expiring: dict[int, Entry] = {}
        self._expiry = ExpiryHeap()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expires_timer: asyncio.TimerHandle | None = None
        self._fresh = -1  # seq of the entry being published: not expired on its way to a consumer
        self.pager: "TransientPages | None" = None  # set for a queue that may page
        self.window: int | None = None  # entries kept in memory before the tail pages out (durable queues)
        self.paged = 0  # ready entries on disk only, all with seq >= paged_from
        self.paged_bytes = 0  # their bodies' bytes (in ready_bytes too)
        self.paged_from = 0
        self.page_id = 0  # a non-durable queue's id in the transient index, once it pages
        self._taken_upto = -1  # the highest seq ever taken by a consumer or basic.get
        self.committed = 0  # offset cursor of remove_upto (Spark bridge): only moves forward; in memory
        self._drop_below = 0  # entries on disk from paged_from to here are committed away, being counted
        self._counting = (0, 0, 0)  # where that count goes on from, the entries and bytes counted so far
        self._drop_marks: list[int] = []  # the index's drop marks naming them, forgotten once they are gone
        self.committed_drops = 0  # entries on disk removed by commits, in all (what a commit's answer counts)
        self.policy: "Policy | None" = None  # the user / operator policy applied (see policy.py)
        self.operator_policy: "Policy | None" = None
        self.touch()

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return len(self.ready) - self.gone_in_ready + self.paged

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}/{self.name}>"

    # -- in -----------------------------------------------------------------------------------

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """Add a published message; False if the queue's length limit rejects it (reject-publish).

        ``confirm`` matters only to a queue of another node or a replicated one, whose group must have the
        message first; otherwise a confirm follows the fsync."""
        args = self.args
        limited = self._limited
        if limited and args.overflow != "drop-head" and self._full(message.body_size):
            if args.overflow == "reject-publish-dlx":
                self._dead_letter([Entry(self.next_seq, message)], "maxlen", persisted=False)
            return False
        expiry = self._expiry_for(message) if self._ttl or message.has_expiration else 0
        entry = self.entry_type(self.next_seq, message, False, expiry)
        self.next_seq += 1
        self.stats.publish += 1
        if self.persistence is not None and (message.persistent or self.persists_all):
            self.persistence.write(self, entry)
            if self.replicator is not None:  # (a quorum queue's leader: it stores every message) before anything
                self.replicator.enqueued(entry, confirm)  # else can remove the entry
        if self.paged or expiry:
            self._append(entry)
        else:  # _append's common case, inline: this is the hot path
            self.ready_bytes += message.body_size
            self.ready.append(entry)
        if limited and args.overflow == "drop-head":
            self._drop_overflow()
        if self.consumers:
            self._fresh = entry.seq  # TTL 0 (or a deadline passing this ms): a waiting consumer still gets it
            self.deliver_ready()
            self._fresh = -1
        depth = len(self.ready)
        # a cheap test first (the hot path): could the window, whatever it is now, be exceeded?
        if self.window is not None and depth > MIN_WINDOW and (
                depth > self.pager.share or depth > (CONSUMED_WINDOW if self.consumers else self.window)):
            window = self._window()
            if depth > window:
                self.page_out(window // 2)
        if expiry and self._expiry.next_deadline() <= now_ms():
            self._expire_due()  # TTL 0: delivered above or expired now
        return True

    def _stored_copy(self, message: Message) -> Message:
        """The message as a queue that stores every message (``persists_all``) keeps it: a transient one not
        yet stored becomes a copy of its own, so the other queues it went to keep theirs in memory."""
        if not message.persistent and self.persistence is not None and not message.msg_id:
            return message.copy()
        return message

    def _append(self, entry: Entry) -> None:
        """A ready entry joins the tail: on disk if the tail is there (so order holds), else in memory."""
        size = entry.message.body_size
        self.ready_bytes += size
        if self._tail_on_disk(entry):
            self._page_write(entry)
            self._count_paged(entry, size)
            if entry.expiry:
                self._schedule_expiry(entry.expiry, self.row_key(entry))
        else:
            self.ready.append(entry)
            if entry.expiry:
                self._track_expiry(entry)

    def set_args(self, args: QueueArgs) -> None:
        """The effective arguments changed (a policy was set or cleared): limits and x-expires apply now.

        Messages already queued keep the expiry they were given, as in RabbitMQ.
        """
        self.args = args
        self._limited = args.limited
        self._ttl = args.message_ttl is not None
        if self._limited and args.overflow == "drop-head":
            self._drop_overflow()
        if args.expires is None and self._expires_timer is not None:
            self._expires_timer.cancel()
            self._expires_timer = None
        self.touch()

    def _expiry_for(self, message: Message) -> int:
        ttl = self.args.message_ttl
        expiration = message.expiration_ms
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        return now_ms() + ttl if ttl is not None else 0

    def _full(self, incoming: int) -> bool:
        args = self.args
        return ((args.max_length is not None and self.message_count >= args.max_length)
                or (args.max_length_bytes is not None and self.ready_bytes + incoming > args.max_length_bytes))

    def _drop_overflow(self) -> None:
        """drop-head: the oldest messages go (dead-lettered as maxlen) until the limits hold."""
        args = self.args
        dropped = []
        while ((args.max_length is not None and self.message_count > args.max_length)
               or (args.max_length_bytes is not None and self.ready_bytes > args.max_length_bytes)):
            entry = self._pop_ready()
            if entry is None:
                break
            dropped.append(entry)
        if dropped:
            self._dead_letter(dropped, "maxlen")

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        """At start-up: the queue index holds ``count`` entries of ``size`` bytes up to ``last_seq``, all on
        disk until they near the head; ``expiries`` are the (expiry, seq) of those that have one."""
        self.paged = count
        self.paged_bytes = size
        self.ready_bytes += size
        self.paged_from = 0
        if count and self.pager is not None:
            self.pager.deep(self)
        if last_seq is not None:
            self.next_seq = max(self.next_seq, last_seq + 1)
        for expiry, seq in expiries:
            self._schedule_expiry(expiry, seq)

    # -- out ----------------------------------------------------------------------------------

    def deliver_ready(self) -> None:
        """Hand ready entries to consumers with credit: the highest priority group first, round-robin within.

        Credit only shrinks during one call, so a group none of whose consumers can take more is done.
        """
        ready = self.ready
        if len(ready) == self.gone_in_ready and not self.paged:
            return
        for group in self._groups:
            consumers = group.consumers
            n = len(consumers)
            i = group.rr
            idle = 0
            while (ready or self.paged) and idle < n:
                if i >= n:
                    i = 0
                consumer = consumers[i]
                i += 1
                if not consumer.has_credit():
                    idle += 1
                    continue
                entry = self._pop_ready()
                if entry is None:
                    break
                idle = 0
                if consumer.no_ack:
                    self.stats.deliver_no_ack += 1
                else:
                    self.stats.deliver += 1
                    consumer.unacked += 1  # against its prefetch until settled (Broker.settle_taken)
                consumer.channel.deliver(consumer, self._take(entry, consumer.no_ack))
            group.rr = i

    def _pop_ready(self) -> Entry | None:
        """The head live entry, leaving the ready list; expired ones met on the way are expired now."""
        ready = self.ready
        while True:
            if self.paged and self._page_due():
                self._page_in()
            if not ready:
                return None
            entry = ready.popleft()
            if entry.gone:
                self.gone_in_ready -= 1
                continue
            self.ready_bytes -= entry.message.body_size
            if entry.expiry:
                self._expiring.pop(self.row_key(entry), None)
                if entry.expiry <= now_ms() and entry.seq != self._fresh:
                    self._dead_letter([entry], "expired")
                    continue
            return entry

    def _take(self, entry: Entry, no_ack: bool) -> Entry:
        """An entry leaves the ready list for a consumer or basic.get."""
        message = entry.message
        if entry.redelivered:
            self.stats.redeliver += 1
        if entry.seq > self._taken_upto:
            self._taken_upto = entry.seq
        if message.body is None:
            self.host.load_body(message)
        if no_ack:
            self._forget(entry)
        else:
            self.unacked += 1
            self.unacked_bytes += message.body_size
            if message.msg_id and self.persistence is not None and not entry.redelivered:
                self.persistence.delivered(self, entry)
        return entry

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        """The content header a consumer (``get``: basic.get) receives for ``entry`` (the hot path asks only
        where ``counts_deliveries``)."""
        return entry.message.header

    def get(self, no_ack: bool) -> Entry | None:
        """basic.get: the head entry, or None."""
        self.touch()
        entry = self._pop_ready()
        if entry is None:
            self.stats.get_empty += 1
            return None
        if no_ack:
            self.stats.get_no_ack += 1
        else:
            self.stats.get += 1
        return self._take(entry, no_ack)

    def peek(self, offset: int = 0, count: int = 10) -> list[Entry]:
        """Ready entries from ``offset`` on, without taking them: order, redelivered flags and stats stay."""
        entries: list[Entry] = []
        skipped = 0
        for entry in self.ready:
            if entry.gone:
                continue
            if skipped < offset:
                skipped += 1
                continue
            if len(entries) >= count:
                break
            entries.append(entry)
        if len(entries) < count and self.paged:
            rows = self._paged_rows(0, offset - skipped + count - len(entries))
            entries.extend(self._paged_entry(row) for row in rows[offset - skipped:])
        return self._with_bodies(entries)

    def _with_bodies(self, entries: list[Entry]) -> list[Entry]:
        for entry in entries:
            if entry.message.body is None and self.host is not None:
                self.host.load_body(entry.message)
        return entries

    # -- offsets (the Spark bridge: read by sequence number, remove once the reader committed) ----
    # An offset is an entry's ``seq``: per queue, increasing, and for durable queues kept by the
    # queue index across restarts.  Only *ready* entries are visible here: entries a consumer
    # holds unacked are neither browsed nor removed (if requeued they come back at their seq).

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
        first_on_disk = self._first_paged(start)  # memory up to there first (a priority queue's interleave)
        memory = self.span(start, end if first_on_disk is None else min(end, first_on_disk))
        cursor = start
        for i in range(0, len(memory), step):
            batch = self.readable(memory[i:i + step], remaining)
            cursor = memory[min(i + step, len(memory)) - 1].seq + 1
            if batch:
                yield batch
            if remaining is not None:
                remaining -= len(batch)
                if remaining <= 0:
                    return
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
            batch = self.readable(entries, remaining)
            if batch:
                yield batch
            if remaining is not None:
                remaining -= len(batch)
                if remaining <= 0:
                    return

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

    def disk_span(self, msg_ids: np.ndarray, transient: np.ndarray) -> DiskSpan:
        """Where the payloads of entries walked from ``disk_index`` lie in the stores' segment files:
        ``msg_ids`` of the transient store where ``transient``, of the persistent one elsewhere."""
        persistent = self.persistence.store if self.persistence is not None else None
        if not transient.any() or transient.all():  # one store holds them all (a backlog's): its arrays as they are
            return _store_span(self.pager.store if len(transient) and transient[0] else persistent, msg_ids)
        count = len(msg_ids)
        span = DiskSpan(np.zeros(count, bool), *(np.zeros(count, np.uint32) for _ in range(3)), [])
        for store, which in ((self.pager.store, transient), (persistent, ~transient)):
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
        self.stats.ack += removed
        if removed:
            self.touch()
        return removed

    def count_committed(self) -> bool:
        """Count up to ``COUNT_BATCH`` more of the entries on disk a commit removed (``remove_upto``); once all are
        counted they leave the queue, as acked, their index rows dropped in the background.  Whether more is
        left to count: a commit of part of a deep queue's million entries counts a batch per loop turn."""
        if not self._drop_below or self.deleted:
            return False
        index, queue_id = self._page_index()
        start, count, size = self._counting
        counted, counted_size, following = index.tally(queue_id, start, self._drop_below, COUNT_BATCH)
        count, size = count + counted, size + counted_size
        if following is not None:
            self._counting = (following, count, size)
            return True
        self._cut(count, size)
        return False

    def _cut(self, count: int, size: int) -> None:
        """The entries on disk below ``_drop_below``, ``count`` of ``size`` bytes, leave the queue now, as acked;
        their rows go in the background, named by the drop marks until they are gone."""
        self.paged -= count
        self.paged_bytes -= size
        self.ready_bytes -= size
        self.stats.ack += count
        self.committed_drops += count
        self._drop_marked([(self.paged_from, self._drop_below)], self._drop_marks)
        self.paged_from, self._drop_below, self._drop_marks = self._drop_below, 0, []
        if count:
            self.touch()

    def _drop_marked(self, ranges: list[tuple[int, int]], marks: list[int]) -> None:
        """The rows of entries on disk in ``ranges`` (keys), which left the queue, go in the background with their
        store references; then the drop marks naming them are forgotten."""
        index, queue_id = self._page_index()
        self.pager.drop_later(index, queue_id, ranges, self._release, partial(index.forget_dropped, queue_id, marks))

    def _finish_count(self) -> None:
        """A commit's count of entries on disk ends now: before anything moves entries between memory and disk."""
        while self.count_committed():
            pass

    def settle(self, entries: list[Entry]) -> None:
        """Entries taken for manual ack were acked."""
        self._settled(entries)
        self.stats.ack += len(entries)
        for entry in entries:
            self._forget(entry)

    def reject(self, entries: list[Entry]) -> None:
        """Rejected or nacked without requeue: dead-lettered (if configured) and settled."""
        self._settled(entries)
        self._dead_letter(entries, "rejected")

    def _settled(self, entries: list[Entry]) -> None:
        """Unacked entries are no longer."""
        self.unacked -= len(entries)
        self.unacked_bytes -= sum(entry.message.body_size for entry in entries)

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Put unacked entries back in their original places, marked redelivered."""
        count = 0
        for entry in sorted(entries, key=lambda e: e.seq):
            entry.redelivered = True
            count += 1
            self.ready_bytes += entry.message.body_size
            self.unacked_bytes -= entry.message.body_size
            if entry.expiry:
                self._track_expiry(entry)
            self._put_back(entry)
        self.unacked -= count
        if count:
            self.deliver_ready()
            if self._expiring:
                self._expire_due()

    def purge(self) -> int:
        """Every ready entry leaves the queue; how many.  Those on disk (a deep queue's backlog) at once to
        every reader, and from the index in the background: a million held every client for seconds.  Drop
        marks in the index name them until they are gone, so a restart meanwhile drops them too."""
        count = self.message_count
        self._forget_ready()
        if self.paged and self.PURGES_LATER:
            index, queue_id = self._page_index()
            on_disk = self._paged_ranges(self.next_seq)
            marks = [index.mark_dropped(queue_id, start, end) for start, end in on_disk] + self._drop_marks
            self._drop_marked(on_disk, marks)
            self.paged_from, self._drop_below, self._drop_marks = self.next_seq, 0, []  # a commit's drop: part of it
        elif self.paged:
            self._drop_paged(self.next_seq)
        self._clear_ready()
        return count

    def drop_all(self) -> None:
        """The queue is deleted: its ready entries go, and its index rows.  Those in memory go now; those on disk,
        a deep queue's backlog, in the background (``Pager.drop_later``), as do the rows of entries consumers
        still hold (their store references are theirs to release)."""
        on_disk = self._paged_ranges() if self.paged else []
        self._forget_ready()
        self._clear_ready()
        if self.pager is not None:
            self.pager.shallow(self)
            if self.persistence is not None or self.page_id:
                index, queue_id = self._page_index()
                self.pager.drop_later(index, queue_id, on_disk, self._release, partial(index.delete_queue, queue_id))
        self._groups = []
        self.active_consumer = None
        for timer in (self._expiry_timer, self._expires_timer):
            if timer is not None:
                timer.cancel()

    # -- the ready list's slow paths (a priority queue has one deque per level) ------------------

    def detach(self) -> None:
        """This object stops standing for the queue, whose storage lives on without it (a replicated queue's
        leader was deposed): it takes nothing more, forgets what it held in memory and touches no storage;
        what its clients still settle is dropped."""
        self.deleted = True
        self.replicator = None
        self.persistence = None
        self.window = None
        self._clear_ready()
        for timer in (self._expiry_timer, self._expires_timer):
            if timer is not None:
                timer.cancel()
        self._expiry_timer = self._expires_timer = None
        if self.pager is not None:
            self.pager.shallow(self)

    def _put_back(self, entry: Entry) -> None:
        put_back(self.ready, entry)

    def _from_seq(self, start: int) -> Iterable[Entry]:
        """Ready entries with ``seq >= start``, in seq order."""
        return from_seq(self.ready, start)

    def _pop_below(self, offset: int) -> Iterator[Entry]:
        """Take every ready entry with ``seq < offset`` out of the ready list."""
        return pop_below(self.ready, offset)

    def _compact_ready(self) -> None:
        """Drop the entries marked gone."""
        self.ready = deque(e for e in self.ready if not e.gone)

    def _clear_ready(self) -> None:
        self.ready.clear()
        self.gone_in_ready = 0
        self.ready_bytes = 0
        self.paged = self.paged_bytes = 0
        self._expiring.clear()
        self._expiry.clear()

    # -- the tail on disk ---------------------------------------------------------------------

    def _page_index(self) -> tuple[QueueIndex, int]:
        """The index this queue's tail goes to, and its id there."""
        if self.persistence is not None:
            return self.persistence.index, self.index_id
        if not self.page_id:
            self.page_id = self.pager.new_page_id()
        return self.pager.index, self.page_id

    def row_key(self, entry: Entry) -> int:
        """Where ``entry`` is in the queue index: its seq (a priority queue ranks it by level first)."""
        return entry.seq

    def _tail_on_disk(self, entry: Entry) -> bool:
        """Whether a new ``entry`` goes to disk: the tail it joins is there (so order holds)."""
        return self.paged > 0

    def _count_paged(self, entry: Entry, size: int) -> None:
        """``entry`` (``size`` bytes) joined the part of the queue on disk."""
        self.paged += 1
        self.paged_bytes += size

    def _page_due(self) -> bool:
        """The ready entries in memory run short: the next batch of the tail should come in."""
        return len(self.ready) - self.gone_in_ready < PAGE_IN_BELOW

    def _first_paged(self, start: int) -> int | None:
        """The lowest seq >= ``start`` of an entry on disk, None if there is none."""
        rows = self._paged_rows(start, 1) if self.paged else []
        return rows[0].seq if rows else None

    def _paged_rows(self, start: int, limit: int) -> list[IndexEntry]:
        """Up to ``limit`` index rows of entries on disk with seq >= ``start``, in seq order."""
        index, queue_id = self._page_index()
        return index.read(queue_id, max(start, self.paged_from, self._drop_below), limit)

    def page_out(self, keep: int, written: dict[int, tuple[Message, int]] | None = None) -> int:
        """Move the ready entries after the first ``keep`` to disk (those above every seq a consumer took);
        returns the bytes of bodies that left memory.  ``written``: transient records made in this pass, by
        message, so a message several queues page is written once."""
        ready = self.ready
        if not self.pageable or self.pager is None or len(ready) <= keep:
            return 0
        self._finish_count()
        self.pager.deep(self)
        freed = 0
        while len(ready) > keep and ready[-1].seq > self._taken_upto:
            entry = ready.pop()
            self.paged_from = entry.seq
            if entry.gone:
                self.gone_in_ready -= 1
                continue
            if entry.expiry:
                self._expiring.pop(self.row_key(entry), None)  # its (expiry, key) stays in the heap
            self._page_write(entry, written)
            self.paged += 1
            self.paged_bytes += entry.message.body_size
            if entry.message.body is not None:
                freed += entry.message.body_size
        return freed

    def _page_write(self, entry: Entry, written: dict[int, tuple[Message, int]] | None = None) -> None:
        """Make sure the entry is in the index, so it can leave memory."""
        message = entry.message
        index, queue_id = self._page_index()
        if entry.transient:  # paged in before: its index entry and record are still there
            if entry.redelivered:
                index.delivered(queue_id, self.row_key(entry), entry.transient, entry.expiry, message.body_size,
                                transient=True)
            return
        if message.msg_id and self.persistence is not None:
            return  # a persistent message of a durable queue: indexed when it came
        pager = self.pager
        known = written.get(id(message)) if written is not None else None
        if known is not None and known[1] in pager.store:
            transient_id = known[1]
            pager.store.add_ref(transient_id)
        else:
            transient_id = pager.write(message)
            if written is not None:
                written[id(message)] = (message, transient_id)
        index.publish(queue_id, self.row_key(entry), transient_id, entry.expiry, message.body_size,
                      entry.redelivered, transient=True)

    def _paged_entry(self, row: IndexEntry) -> Entry:
        """An entry for an index row (its message's content stays in its store until needed)."""
        return Entry(row.seq, stored_message(row), row.delivered, row.expiry, row.msg_id if row.transient else 0)

    def _page_in(self) -> None:
        """Bring the next batch of the tail into memory; the whole tail if it fits in the window, so a queue
        that is no longer deep leaves the disk (else, with publishers keeping pace, every message would go
        on through it)."""
        self._finish_count()
        index, queue_id = self._page_index()
        room = self._window() - (len(self.ready) - self.gone_in_ready)
        rows = index.read(queue_id, self.paged_from, self.paged if self.paged <= room else PAGE_IN_BATCH)
        self._bring_in(rows, self._admit)
        if rows:
            self.paged_from = rows[-1].seq + 1
        if not rows or self.paged <= 0:
            self._trust_index()

    def _bring_in(self, rows: list[IndexEntry], admit: Callable[[Entry], None]) -> None:
        """Index rows of the part on disk become ready entries in memory (``admit``), their contents read a
        batch at a time; an entry whose message the store lost is dropped."""
        index, queue_id = self._page_index()
        persistent = self.persistence.store if self.persistence is not None else None
        payloads = {}  # the batch's contents, a read or two per store rather than one per message
        routes: dict[bytes, tuple[bytes, str, str]] = {}
        headers: dict[bytes, bytes] = {}
        for store, transient in ((self.pager.store, True), (persistent, False)):
            ids = [row.msg_id for row in rows if row.transient == transient]
            if ids and store is not None:
                payloads[transient] = dict(zip(ids, store.read_many(ids, PAGE_IN_BYTES)))
        self.paged -= len(rows)
        self.paged_bytes -= sum(row.size for row in rows)
        for row in rows:
            payload = payloads[row.transient].get(row.msg_id)
            if payload is None and not row.transient and (persistent is None or row.msg_id not in persistent):
                log.warning("queue %s in vhost %s: message %d of entry %d is missing from the store; dropped",
                            untrusted(self.name), untrusted(self.vhost), row.msg_id, row.seq)
                index.ack(queue_id, row.seq)
                self.ready_bytes -= row.size
                continue
            entry = self._paged_entry(row)
            if payload is not None:
                entry.message.fill_from(payload, routes, headers)
            admit(entry)
            if row.expiry:
                self._expiring[self.row_key(entry)] = entry

    def _trust_index(self) -> None:
        """The counts said more was on disk than the index held: the index is right."""
        if self.paged:
            log.error("queue %s in vhost %s: %d entries counted on disk were not found", untrusted(self.name),
                      untrusted(self.vhost), self.paged)
        self.ready_bytes -= self.paged_bytes
        self.paged = self.paged_bytes = 0

    def _window(self) -> int:
        """How much of the queue stays in memory: its window, or ``CONSUMED_WINDOW`` while consumers take from
        it (they should not wait on the disk for what they are about to get), within its share of the memory
        budget of deep queues (smaller when many are deep)."""
        window = self.window or PAGED_WINDOW
        return min(max(window, CONSUMED_WINDOW) if self.consumers else window, self.pager.share)

    def _admit(self, entry: Entry) -> None:
        """An entry paged in joins the ready list's end (its seq is above every seq in memory)."""
        self.ready.append(entry)

    def _unpage(self, size: int) -> None:
        """One entry on disk left the queue without coming into memory."""
        self.paged -= 1
        self.paged_bytes -= size
        self.ready_bytes -= size

    def _drop_paged(self, below: int) -> int:
        """Entries on disk with seq < ``below`` leave the queue, as acked; returns how many."""
        removed, done = 0, False
        while not done:
            taken, done = self._drop_paged_batch(below, PAGE_IN_BATCH)
            removed += taken
        return removed

    def _drop_paged_batch(self, below: int, limit: int) -> tuple[int, bool]:
        """Up to ``limit`` of the entries on disk with seq < ``below`` leave the queue, as acked: how many, and
        whether none is left."""
        taken = 0
        if self.paged:
            index, queue_id = self._page_index()
            seqs, rows = index.take(queue_id, self.paged_from, below, limit)
            taken = len(seqs)
            if taken:
                self._release_rows(seqs, rows)
                self.paged_from = int(seqs[-1]) + 1
            if taken == limit and self.paged:
                return taken, False
        self.paged_from = max(self.paged_from, below)
        return taken, True

    def _release_rows(self, seqs: np.ndarray, rows: np.ndarray) -> None:
        """Entries on disk left the queue without coming into memory (``QueueIndex.take`` deleted them): the
        store references they held go, and their weight."""
        self._release(rows)
        size = int(rows["size"].sum())
        self.paged -= len(rows)
        self.paged_bytes -= size
        self.ready_bytes -= size

    def _forget_ready(self) -> None:
        """Every ready entry in memory leaves the queue for good (a purge, a deletion)."""
        for entry in self.ready:
            if not entry.gone:
                self._forget(entry)

    def _release(self, rows: np.ndarray) -> None:
        """The store references of index rows taken from the queue's index (transient ones in the pager's store)."""
        transient = (rows["flags"] & FLAG_TRANSIENT) != 0
        if transient.any():
            self.pager.store.remove_many(rows["msg_id"][transient])
        if self.persistence is not None and not transient.all():
            self.persistence.store.remove_many(rows["msg_id"][~transient])

    def _paged_ranges(self, below: int = 2 ** 64 - 1) -> list[tuple[int, int]]:
        """The index keys of the entries on disk with seq < ``below`` (``[start, end)`` ranges; a priority
        queue has one per level)."""
        return [(self.paged_from, below)]

    def _forget(self, entry: Entry) -> None:
        """An entry leaves the queue for good: its index entry and its store reference go."""
        message = entry.message
        if entry.transient:
            index, queue_id = self._page_index()
            index.ack(queue_id, self.row_key(entry))
            self.pager.store.remove(entry.transient)
        elif message.msg_id and self.persistence is not None:
            self.persistence.remove(self, entry)

    # -- expiry -------------------------------------------------------------------------------

    def _track_expiry(self, entry: Entry) -> None:
        key = self.row_key(entry)
        self._expiring[key] = entry
        self._schedule_expiry(entry.expiry, key)

    def _schedule_expiry(self, expiry: int, seq: int) -> None:
        first = self._expiry.next_deadline()
        self._expiry.push(expiry, seq)
        if first is None or expiry < first or self._expiry_timer is None:
            self._arm_expiry()

    def _arm_expiry(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        deadline = self._expiry.next_deadline()
        if deadline is not None and not self.deleted:
            loop = asyncio.get_running_loop()
            self._expiry_timer = loop.call_later(max(0.0, (deadline - now_ms()) / 1000), self._expire_due)

    def _expire_due(self) -> None:
        """Mark every entry whose time is up as gone, wherever it is, and dead-letter it."""
        self._expiry_timer = None
        expired = []
        for seq in self._expiry.pop_due(now_ms()):
            entry = self._expiring.pop(seq, None)
            if entry is None:
                if self.paged and seq >= max(self.paged_from, self._drop_below):
                    entry = self._expire_paged(seq)
                    if entry is not None:
                        expired.append(entry)
                continue  # delivered or already expired
            entry.gone = True
            self.gone_in_ready += 1
            self.ready_bytes -= entry.message.body_size
            expired.append(entry)
        if expired:
            self._dead_letter(expired, "expired")
            if self.gone_in_ready > 1024 and self.gone_in_ready * 2 > len(self.ready):
                self._compact_ready()
                self.gone_in_ready = 0
        self._arm_expiry()

    def _expire_paged(self, seq: int) -> Entry | None:
        """An entry on disk whose time is up leaves the queue without coming into memory."""
        index, queue_id = self._page_index()
        row = index.get(queue_id, seq)
        if row is None:
            return None
        self._unpage(row.size)
        return self._paged_entry(row)

    def _dead_letter(self, entries: list[Entry], reason: str, persisted: bool = True) -> None:
        """Entries leave the queue for good: to the dead-letter exchange if one is set."""
        if self.args.dead_letter_exchange is not None and self.host is not None:
            for entry in entries:
                if entry.message.body is None:
                    self.host.load_body(entry.message)
            self.host.dead_letter(self, entries, reason)
        if persisted:
            for entry in entries:
                self._forget(entry)

    # -- consumers and x-expires --------------------------------------------------------------

    def touch(self) -> None:
        """Used (declared, consumed, got from): restart the x-expires countdown."""
        expires = self.args.expires
        if expires is None or self.deleted:
            return
        if self._expires_timer is not None:
            self._expires_timer.cancel()
        self._expires_timer = asyncio.get_running_loop().call_later(expires / 1000, self._unused)

    def _unused(self) -> None:
        self._expires_timer = None
        if self.consumers:
            return  # consumers keep it alive; the countdown restarts when the last one leaves
        if self.host is not None and not self.deleted:
            self.host.expire_queue(self)

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        if not self.args.single_active_consumer:
            self._join_group(consumer)
        elif self.active_consumer is None:
            self._activate(consumer)
        self.touch()

    def remove_consumer(self, consumer: Consumer) -> None:
        """The consumer is cancelled or its channel closed; a single active one hands over (run the queue after)."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if not self.args.single_active_consumer:
            self._leave_group(consumer)
        elif consumer is self.active_consumer:
            self._activate(max(self.consumers, key=_priority, default=None))
        if not self.consumers:
            self.touch()

    def _join_group(self, consumer: Consumer) -> None:
        groups = self._groups
        for position, group in enumerate(groups):
            if group.priority == consumer.priority:
                group.consumers.append(consumer)
                return
            if group.priority < consumer.priority:
                break
        else:
            position = len(groups)
        group = ConsumerGroup(consumer.priority)
        group.consumers.append(consumer)
        groups.insert(position, group)

    def _leave_group(self, consumer: Consumer) -> None:
        for group in self._groups:
            if group.priority == consumer.priority:
                index = group.consumers.index(consumer)
                del group.consumers[index]
                if index < group.rr:
                    group.rr -= 1
                if not group.consumers:
                    self._groups.remove(group)
                return

    def _activate(self, consumer: Consumer | None) -> None:
        self.active_consumer = consumer
        self._groups = []
        if consumer is not None:
            self._join_group(consumer)

    @property
    def unused_auto_delete(self) -> bool:
        """An auto-delete queue goes once its last consumer has gone."""
        return self.auto_delete and self.had_consumer and not self.consumers
