"""A queue's tail on disk: past its window the ready list's tail goes to the queue index (``page_out``) and comes
back a batch at a time as the head drains (``_page_in``); while part of the queue is on disk, new entries join it
there, so order holds, and every seq on disk is above every seq in memory and every seq a consumer holds
(``_taken_upto``).  Entries leave from there too: a commit's, counted a batch per loop turn and dropped in the
background, and a purge's.  Where the transient part lives, and the memory budget, is :mod:`paging`'s.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Callable, Iterable

import numpy as np

from queue_index import FLAG_TRANSIENT, IndexEntry, QueueIndex

from .logs import untrusted
from .message import Message
from .queue_base import QueueBase, TransientPages
from .queue_type import PAGING
from .ready import Entry

log = logging.getLogger("warren.queue")


PAGE_IN_BELOW = 256  # live entries in memory under which the next batch of the tail comes in
PAGE_IN_BATCH = 1024
DROP_BATCH = 1024  # index rows dropped per loop turn in the background (a deleted queue's, a purge's): milliseconds
COUNT_BATCH = 8192  # index rows a commit counts per loop turn (a few milliseconds), before they are dropped
PAGED_WINDOW = 2048  # the window of a queue paged under memory pressure (it has none of its own)
MIN_WINDOW = 64  # the least a deep queue keeps in memory, however many share the budget (paging.Pager.window)
CONSUMED_WINDOW = 32768  # the window of a queue with consumers (the shared budget still applies)
PAGE_IN_BYTES = 4 * 1024 * 1024  # contents read with a batch; the rest of it is read when delivered


def stored_message(row: IndexEntry) -> Message:
    """The message of an index row, its content left in the store (transient or persistent) it names."""
    return Message.stored(0, row.size, row.msg_id) if row.transient else Message.stored(row.msg_id, row.size)


class DiskTail(QueueBase):
    """A queue's tail on disk: a part of :class:`queue.Queue`."""

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
        self._left_disk(count, size)
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
        self._pages.drop_later(index, queue_id, ranges, self._release, partial(index.forget_dropped, queue_id, marks))

    def _finish_count(self) -> None:
        """A commit's count of entries on disk ends now: before anything moves entries between memory and disk."""
        while self.count_committed():
            pass

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        """At start-up: the queue index holds ``count`` entries of ``size`` bytes up to ``last_seq``, all on
        disk until they near the head; ``expiries`` are the (expiry, seq) of those that have one."""
        self.tail.clear()
        self.tail.add(count, size)
        self.ready_bytes += size
        self.paged_from = 0
        if count and self.pager is not None:
            self.pager.deep(self)
        if last_seq is not None:
            self.next_seq = max(self.next_seq, last_seq + 1)
        for expiry, seq in expiries:
            self._schedule_expiry(expiry, seq)

    @property
    def _pages(self) -> TransientPages:
        """The node's pager, which every queue of the node has (``Queues.attach``) before its tail is on disk."""
        assert self.pager is not None
        return self.pager

    def _page_index(self) -> tuple[QueueIndex, int]:
        """The index this queue's tail goes to, and its id there."""
        if self.persistence is not None:
            return self.persistence.index, self.index_id
        if not self.page_id:
            self.page_id = self._pages.new_page_id()
        return self._pages.index, self.page_id

    def row_key(self, entry: Entry) -> int:
        """Where ``entry`` is in the queue index: its seq (a priority queue ranks it by level first)."""
        return entry.seq

    def _tail_on_disk(self, entry: Entry) -> bool:
        """Whether a new ``entry`` goes to disk: the tail it joins is there (so order holds)."""
        return self.paged > 0

    def _count_paged(self, entry: Entry, size: int) -> None:
        """``entry`` (``size`` bytes) joined the part of the queue on disk."""
        self.tail.add(1, size)

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
        if PAGING not in self.type.capabilities or self.pager is None or len(ready) <= keep:
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
            self.tail.add(1, entry.message.body_size)
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
        pager = self._pages
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
        for store, transient in ((self._pages.store, True), (persistent, False)):
            ids = [row.msg_id for row in rows if row.transient == transient]
            if ids and store is not None:
                payloads[transient] = dict(zip(ids, store.read_many(ids, PAGE_IN_BYTES)))
        self.tail.remove(len(rows), sum(row.size for row in rows))
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
        self.ready_bytes -= self.tail.clear()

    def _window(self) -> int:
        """How much of the queue stays in memory: its window, or ``CONSUMED_WINDOW`` while consumers take from
        it (they should not wait on the disk for what they are about to get), within its share of the memory
        budget of deep queues (smaller when many are deep)."""
        window = self.window or PAGED_WINDOW
        return min(max(window, CONSUMED_WINDOW) if self.consumers else window, self._pages.share)

    def _admit(self, entry: Entry) -> None:
        """An entry paged in joins the ready list's end (its seq is above every seq in memory)."""
        self.ready.append(entry)

    def _unpage(self, size: int) -> None:
        """One entry on disk left the queue without coming into memory."""
        self._left_disk(1, size)

    def _left_disk(self, count: int, size: int) -> None:
        """``count`` entries on disk, ``size`` bytes in all, left the queue without coming into memory."""
        self.tail.remove(count, size)
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
        self._left_disk(len(rows), size)

    def _forget_ready(self) -> None:
        """Every ready entry in memory leaves the queue for good (a purge, a deletion)."""
        for entry in self.ready:
            if not entry.gone:
                self._forget(entry)

    def _release(self, rows: np.ndarray) -> None:
        """The store references of index rows taken from the queue's index (transient ones in the pager's store)."""
        transient = (rows["flags"] & FLAG_TRANSIENT) != 0
        if transient.any():
            self._pages.store.remove_many(rows["msg_id"][transient])
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
            self._pages.store.remove(entry.transient)
        elif message.msg_id and self.persistence is not None:
            self.persistence.remove(self, entry)
