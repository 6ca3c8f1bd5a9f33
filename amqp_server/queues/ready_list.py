"""A queue's ready entries, a component of :class:`queue.Queue`: those in memory in ``seq`` order (``entries``),
and past the queue's window its tail on disk.

The tail goes to the queue index (``page_out``) and comes back a batch at a time as the head drains (``page_in``);
while part of the queue is on disk, new entries join it there, so order holds, and every seq on disk is above every
seq in memory and every seq a consumer holds (``taken_upto``).  Entries leave from there too: a commit's, counted a
batch per loop turn and dropped in the background, and a purge's.  Where the transient part lives, and the memory
budget, is :mod:`paging`'s.  A priority queue's ready list (:mod:`priority_queue`) keeps one deque per level, each
paging on its own: it swaps the store, not the queue.

A quorum queue's entries that came back to the front (``quorum_machine.State.returns``) are served before all
others, in the order they came back (``front``), always in memory.  Each came back under a new seq, above every
other then: its row (and its row once a consumer took it again) may lie among the tail's on disk, which every read
of the tail passes over (``apart``), and no drop of the tail takes.
"""
from __future__ import annotations

import logging
from bisect import bisect_left
from collections import deque
from functools import partial
from heapq import merge
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol, Sized

import numpy as np

from queue_index import FLAG_TRANSIENT, IndexEntry, QueueIndex

from ..logs import untrusted
from ..message import Message
from .queue_args import QueueArgs
from .ready import Entry, _seq, from_seq, pop_below, put_back
from ..stats import MessageStats

if TYPE_CHECKING:
    from msg_store import MessageStore

    from .persistence import Persistence, QueueRows

log = logging.getLogger("warren.queue")


PAGE_IN_BELOW = 256  # live entries in memory under which the next batch of the tail comes in
PAGE_IN_BATCH = 1024
DROP_BATCH = 1024  # index rows dropped per loop turn in the background (a deleted queue's, a purge's): milliseconds
COUNT_BATCH = 8192  # index rows a commit counts per loop turn (a few milliseconds), before they are dropped
PAGED_WINDOW = 2048  # the window of a queue paged under memory pressure (it has none of its own)
MIN_WINDOW = 64  # the least a deep queue keeps in memory, however many share the budget (paging.Pager.window)
CONSUMED_WINDOW = 32768  # the window of a queue with consumers (the shared budget still applies)
PAGE_IN_BYTES = 4 * 1024 * 1024  # contents read with a batch; the rest of it is read when delivered


class TailCount:
    """How many of a queue's ready entries are on disk, and their bodies' bytes: counted in this one object, the two
    always together (a priority queue's levels' tails in one too).  ``ReadyList.bytes`` counts these bytes as
    well; ``ReadyList.left_disk`` moves it with them when entries leave the queue from disk."""

    __slots__ = ("count", "bytes")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def add(self, count: int, size: int) -> None:
        """``count`` entries of ``size`` bytes in all went to disk (paged out, joined the tail there, recovered)."""
        self.count += count
        self.bytes += size

    def remove(self, count: int, size: int) -> None:
        """``count`` entries of ``size`` bytes in all are no longer on disk (paged in, or gone)."""
        self.count -= count
        self.bytes -= size

    def clear(self) -> int:
        """None is on disk any more: the bytes that were."""
        size = self.bytes
        self.count = self.bytes = 0
        return size


class TransientPages(Protocol):
    """Where a queue's tail goes when its messages are not in the persistent store, and how much of a
    queue stays in memory (paging.Pager)."""

    store: "MessageStore"
    index: QueueIndex
    share: int

    def deep(self, queue: Any) -> None: ...

    def shallow(self, queue: Any) -> None: ...

    def new_page_id(self) -> int: ...

    def write(self, message: Message) -> int: ...

    def drop_later(self, index: QueueIndex, queue_id: int, ready: list[tuple[int, int]],
                   release: Callable[[np.ndarray], None], then: Callable[[], None]) -> None: ...


class ReadyOwner(Protocol):
    """What a ready list reads of the queue it belongs to (``queue.Queue``): where its storage is (set when the
    broker attaches it), its window, and what a commit's entries leaving counts."""

    name: str
    vhost: str
    args: QueueArgs
    index_id: int
    persistence: Persistence | None
    rows: QueueRows | None  # (with persistence: where its entries are indexed, as its type keys them)
    pager: TransientPages | None
    window: int | None
    deleted: bool
    stats: MessageStats
    host: Any  # queue.QueueHost: a priority queue's recovery reads old messages' priorities through it

    @property
    def consumers(self) -> Sized: ...

    def touch(self) -> None: ...

    def row_key(self, entry: Entry) -> int: ...

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None: ...


def stored_message(row: IndexEntry) -> Message:
    """The message of an index row, its content left in the store (transient or persistent) it names."""
    return Message.stored(0, row.size, row.msg_id) if row.transient else Message.stored(row.msg_id, row.size)


class ReadyList:
    """A queue's ready entries: a deque in seq order in memory (``entries``, entries marked ``gone`` by expiry
    among them, ``gone`` of them), the tail on disk (``tail``: all with seq >= ``paged_from``), and the bytes of
    both (``bytes``).  Of the bytes in memory, ``unheld`` are bodies memory does not hold: the store keeps them
    (a large one released, ``release_body``; one paged in or recovered unread); it is counted where an entry's
    body is released or its entry comes into memory or leaves it, so that what the node holds
    (``Queue.held_bytes``) costs no walk of the entries, and the delivery path no test more: an entry ``pop_head``
    hands over is uncounted by its taker, which tests its body anyway (``Queue.took``), or ``unhold``.

    ``expiring`` is the queue's expiry's map of the entries in memory that have an expiry, by ``row_key``: an
    entry leaving memory leaves it (None: a quorum queue's deadlines are its state machine's, which names the
    entries that expire, ``take_out``).  ``pages``: the queue's type pages (a durable queue keeps a window).
    ``drops_later``: a commit's entries on disk are counted a batch per loop turn and dropped in the background
    (else at once: a quorum queue's commit is an op carried out as it is applied)."""

    ranked = False  # a priority queue's keys its rows by level, then seq (row_key): its part on disk is no seq suffix
    entry_type: Callable[..., Entry] = Entry  # a priority queue's entries know their level

    def __init__(self, owner: ReadyOwner, expiring: dict[int, Entry] | None, pages: bool = True,
                 drops_later: bool = True) -> None:
        self.owner = owner
        self.expiring = expiring
        self.pages = pages
        self.drops_later = drops_later
        self.entries: Any = deque()  # deque[Entry]; a priority queue's: priority_queue.PriorityReady
        self.gone = 0
        self.bytes = 0  # of the entries in memory and on disk, those gone excepted
        self.unheld = 0  # of the entries in memory (those gone excepted) whose body is in a store only
        self.tail = TailCount()  # ready entries on disk only, all with seq >= paged_from, and their bytes
        self.paged_from = 0
        self.page_id = 0  # a non-durable queue's id in the transient index, once it pages
        self.taken_upto = -1  # the highest seq ever taken by a consumer or basic.get
        self._drop_below = 0  # entries on disk from paged_from to here are committed away, being counted
        self._counting = (0, 0, 0)  # where that count goes on from, the entries and bytes counted so far
        self._drop_marks: list[int] = []  # the index's drop marks naming them, forgotten once they are gone
        self.committed_drops = 0  # entries on disk removed by commits, in all (what a commit's answer counts)
        self.front: deque[Entry] = deque()  # entries served before all others, in the order they came back
        # the seqs of rows among the tail's on disk that are not the tail's: the front's entries, and those a consumer
        # took from it (forgotten once the tail is past them for good: ``page_in``)
        self.apart: set[int] = set()
        # the queue's say on entries read back from disk: one it keeps apart rather than ready (True), whether
        # the entry of a seq came back to the queue before (its redelivered flag), and what it does about an entry
        # whose message the store lost (dropped here)
        self.keep_apart: Callable[[Entry], bool] | None = None
        self.returned: Callable[[int], bool] | None = None
        self.lost: Callable[[list[int]], None] | None = None

    def __len__(self) -> int:
        """Entries in memory, those gone included."""
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        """Entries in memory, in delivery order, those gone included."""
        return iter(self.entries)

    @property
    def message_count(self) -> int:
        return len(self.entries) - self.gone + self.tail.count + len(self.front)

    @property
    def paged(self) -> int:
        """Ready entries on disk only."""
        return self.tail.count

    @property
    def paged_bytes(self) -> int:
        """Their bodies' bytes (in ``bytes`` too)."""
        return self.tail.bytes

    @property
    def disk_floor(self) -> int:
        """Every entry on disk still in the queue is at or above this seq (a commit's being counted are below)."""
        return max(self.paged_from, self._drop_below)

    def row_key(self, entry: Entry) -> int:
        """Where ``entry`` is in the queue index: its seq (a priority queue ranks it by level first)."""
        return entry.seq

    # -- in and out of memory -------------------------------------------------------------------

    def push(self, entry: Entry) -> bool:
        """A ready entry joins the tail: on disk if the tail is there (so order holds; True), else in memory."""
        size = entry.message.body_size
        self.bytes += size
        if self._tail_on_disk(entry):
            self.page_write(entry)
            self.tail.add(1, size)
            return True
        self.entries.append(entry)
        return False

    def push_front(self, entry: Entry) -> None:
        """A returned entry is served after the others that came back to the front, before all the rest (a
        quorum queue's; its bytes counted here, and its body if the store alone holds it)."""
        self.bytes += entry.message.body_size
        self.front.append(entry)
        self.apart.add(entry.seq)
        self.came_back(entry)

    def load_front(self, seqs: list[int]) -> None:
        """At start (a restart, a new leader's copy, whose entries are all on disk, counted in the tail): the
        entries of ``seqs`` are the front, in that order, in memory (one whose message the store lost leaves,
        ``lost``)."""
        index, queue_id = self.page_index()
        rows = [row for row in (index.peek(queue_id, seq) for seq in seqs) if row is not None]
        self.apart.update(seqs)
        self.bring_in(rows, self.front.append)

    def put_back(self, entry: Entry) -> None:
        """A requeued entry goes back where its seq puts it (its bytes are the caller's to count; a body its
        delivery released, ``unheld``'s here)."""
        put_back(self.entries, entry)
        self.came_back(entry)

    def unhold(self, entry: Entry) -> None:
        """An entry ``pop_head`` handed over leaves the ready list for good otherwise than taken by a consumer
        (expired, dropped): ``unheld`` forgets its body if the store held it (``Queue.took`` does so inline)."""
        if entry.message.body is None:
            self.unheld -= entry.message.body_size

    def came_back(self, entry: Entry) -> None:
        """``entry`` is in memory again: a body of it the store alone holds is counted."""
        if entry.message.body is None:
            self.unheld += entry.message.body_size

    def release_body(self, entry: Entry) -> None:
        """The entry just appended leaves its body to the store (``Queue.release_body``) if it is still the last
        in memory (not delivered, dropped, or gone to disk already)."""
        if self.last_in_memory(entry):
            entry.message = entry.message.without_body()
            self.unheld += entry.message.body_size

    def last_in_memory(self, entry: Entry) -> bool:
        """``entry`` is the last appended in memory (a priority queue's: of its level)."""
        entries = self.entries
        return bool(entries) and entries[-1] is entry

    def fill(self) -> None:
        """Bring in the tail, a batch at a time, while memory runs short (``page_due``): the head is in memory
        after, and the entries whose message the store lost are found (``lost``) before anyone takes it."""
        while self.tail.count and self.page_due():
            if not self.page_in():
                return

    def pop_head(self) -> Entry | None:
        """The head live entry, out of the ready list (the next batch of the tail comes in as the head drains):
        the front's first, if any."""
        front = self.front
        if front:
            entry = front.popleft()
            self.bytes -= entry.message.body_size
            return entry
        entries, tail = self.entries, self.tail
        while True:
            if tail.count:
                self.fill()
            if not entries:
                return None
            entry = entries.popleft()
            if entry.gone:
                self.gone -= 1
                continue
            self.bytes -= entry.message.body_size
            return entry  # (its taker's to uncount if its body is in the store: ``unhold``)

    def take_out(self, seq: int, leaving: bool = True) -> Entry | None:
        """The ready entry of ``seq`` leaves the ready list wherever it is: in memory it is marked gone (passed
        over when the head reaches it); on disk, if it is ``leaving`` the queue (expired: the caller removes it),
        its row is read where it is, else (a quorum queue's checkout, whose row stays) the tail is brought into
        memory up to it first, since a page-in would read its row back as ready, and no page-out takes the tail
        down past it again (``taken_upto``); an entry of the front leaves it.  None if it is in neither."""
        for entry in self.front:  # (few: what consumers held)
            if entry.seq == seq:
                self.front.remove(entry)
                message = entry.message
                self.bytes -= message.body_size
                if message.body is None:
                    self.unheld -= message.body_size
                if not leaving:
                    self.taken_upto = max(self.taken_upto, seq)
                return entry
        if not leaving:
            self.page_in_upto(seq)
            self.taken_upto = max(self.taken_upto, seq)
        entries = self.entries
        if entries and entries[0].seq <= seq <= entries[-1].seq:
            i = bisect_left(entries, seq, key=_seq)
            entry = entries[i]
            if entry.seq == seq and not entry.gone:
                self.mark_gone(entry)
                return entry
        if leaving and self.tail.count and seq >= self.disk_floor:
            return self.expire_paged(seq)
        return None

    def page_in_upto(self, seq: int) -> None:
        """Bring the tail into memory, a batch at a time, until ``seq`` is in memory (or nothing more comes)."""
        while self.tail.count and seq >= self.disk_floor:
            if not self.page_in():
                return

    def mark_gone(self, entry: Entry) -> None:
        """An entry in memory leaves the ready list where it is (passed over when the head reaches it)."""
        entry.gone = True
        self.gone += 1
        message = entry.message
        self.bytes -= message.body_size
        if message.body is None:
            self.unheld -= message.body_size

    def compact(self) -> None:
        """Drop the entries marked gone (in place: whoever holds the deque sees the change)."""
        live = [e for e in self.entries if not e.gone]
        self.entries.clear()
        self.entries.extend(live)
        self.gone = 0

    def clear(self) -> None:
        """Nothing is ready any more (what was is the caller's to have forgotten)."""
        self.entries.clear()
        self.front.clear()
        self.gone = 0
        self.bytes = self.unheld = 0
        self.tail.clear()

    def _tail_on_disk(self, entry: Entry) -> bool:
        """Whether a new ``entry`` goes to disk: the tail it joins is there (so order holds)."""
        return self.tail.count > 0

    def page_due(self) -> bool:
        """The ready entries in memory run short: the next batch of the tail should come in."""
        return len(self.entries) - self.gone < PAGE_IN_BELOW

    def window(self) -> int:
        """How much of the queue stays in memory: its window, or ``CONSUMED_WINDOW`` while consumers take from
        it (they should not wait on the disk for what they are about to get), within its share of the memory
        budget of deep queues (smaller when many are deep)."""
        owner = self.owner
        window = owner.window or PAGED_WINDOW
        return min(max(window, CONSUMED_WINDOW) if owner.consumers else window, self._pages.share)

    def page_out(self, keep: int, written: dict[int, tuple[Message, int]] | None = None) -> int:
        """Move the ready entries after the first ``keep`` to disk (those above every seq a consumer took);
        returns the bytes of bodies that left memory.  ``written``: transient records made in this pass, by
        message, so a message several queues page is written once."""
        entries = self.entries
        pager = self.owner.pager
        if not self.pages or pager is None or len(entries) <= keep:
            return 0
        self._finish_count()
        pager.deep(self.owner)
        freed = 0
        while len(entries) > keep and entries[-1].seq > self.taken_upto:
            entry = entries.pop()
            self.paged_from = entry.seq
            if entry.gone:
                self.gone -= 1
                continue
            if entry.expiry and self.expiring is not None:
                self.expiring.pop(self.row_key(entry), None)  # its (expiry, key) stays in the heap
            self.page_write(entry, written)
            self.tail.add(1, entry.message.body_size)
            if entry.message.body is not None:
                freed += entry.message.body_size
            else:
                self.unheld -= entry.message.body_size
        return freed

    def page_in(self) -> bool:
        """Bring the next batch of the tail into memory; the whole tail if it fits in the window, so a queue
        that is no longer deep leaves the disk (else, with publishers keeping pace, every message would go
        on through it).  False if there was none: another page-in would find none either."""
        self._finish_count()
        index, queue_id = self.page_index()
        room = self.window() - (len(self.entries) - self.gone)
        rows = index.read(queue_id, self.paged_from, self.paged if self.paged <= room else PAGE_IN_BATCH)
        apart = self.apart
        self.bring_in([row for row in rows if row.seq not in apart] if apart else rows, self.entries.append)
        if rows:
            self.paged_from = rows[-1].seq + 1
            if apart:  # (a seq the tail is past and not the front's is a consumer's: above it for good, taken_upto)
                front = {entry.seq for entry in self.front}
                self.apart = {seq for seq in apart if seq >= self.paged_from or seq in front}
        if not rows or self.paged <= 0:
            self.trust_index()
        return bool(rows)

    def bring_in(self, rows: list[IndexEntry], admit: Callable[[Entry], None]) -> None:
        """Index rows of the part on disk become ready entries in memory (``admit``; those the queue keeps apart
        aside), their contents read a batch at a time; an entry whose message the store lost is dropped."""
        owner = self.owner
        index, queue_id = self.page_index()
        persistent = owner.persistence.store if owner.persistence is not None else None
        payloads = {}  # the batch's contents, a read or two per store rather than one per message
        routes: dict[bytes, tuple[bytes, str, str]] = {}
        headers: dict[bytes, bytes] = {}
        for store, transient in ((self._pages.store, True), (persistent, False)):
            ids = [row.msg_id for row in rows if row.transient == transient]
            if ids and store is not None:
                payloads[transient] = dict(zip(ids, store.read_many(ids, PAGE_IN_BYTES)))
        self.tail.remove(len(rows), sum(row.size for row in rows))
        keep_apart = self.keep_apart
        lost = []
        for row in rows:
            payload = payloads[row.transient].get(row.msg_id)
            if payload is None and not row.transient and (persistent is None or row.msg_id not in persistent):
                log.warning("queue %s in vhost %s: message %d of entry %d is missing from the store; dropped",
                            untrusted(owner.name), untrusted(owner.vhost), row.msg_id, row.seq)
                index.ack(queue_id, row.seq)
                self.bytes -= row.size
                lost.append(row.seq)
                continue
            entry = self.paged_entry(row)
            if payload is not None:
                entry.message.fill_from(payload, routes, headers)
            if keep_apart is None or not keep_apart(entry):
                admit(entry)
                self.came_back(entry)
            if row.expiry and self.expiring is not None:
                self.expiring[self.row_key(entry)] = entry
        if lost and self.lost is not None:
            self.lost(lost)

    def trust_index(self) -> None:
        """The counts said more was on disk than the index held: the index is right."""
        if self.paged:
            log.error("queue %s in vhost %s: %d entries counted on disk were not found", untrusted(self.owner.name),
                      untrusted(self.owner.vhost), self.paged)
        self.bytes -= self.tail.clear()

    def page_write(self, entry: Entry, written: dict[int, tuple[Message, int]] | None = None) -> None:
        """Make sure the entry is in the index, so it can leave memory."""
        message = entry.message
        index, queue_id = self.page_index()
        if entry.transient:  # paged in before: its index entry and record are still there
            if entry.redelivered:
                index.delivered(queue_id, self.row_key(entry), entry.transient, entry.expiry, message.body_size,
                                transient=True)
            return
        if message.msg_id and self.owner.persistence is not None:
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

    # -- what is on disk ------------------------------------------------------------------------

    @property
    def _pages(self) -> TransientPages:
        """The node's pager, which every queue of the node has (``Queues.attach``) before its tail is on disk."""
        pager = self.owner.pager
        assert pager is not None
        return pager

    def page_index(self) -> tuple[QueueIndex, int]:
        """The index this queue's tail goes to, and its id there."""
        persistence = self.owner.persistence
        if persistence is not None:
            return persistence.index, self.owner.index_id
        if not self.page_id:
            self.page_id = self._pages.new_page_id()
        return self._pages.index, self.page_id

    def paged_entry(self, row: IndexEntry) -> Entry:
        """An entry for an index row (its message's content stays in its store until needed)."""
        entry = self._entry_of(row)
        if self.returned is not None and not entry.redelivered:
            entry.redelivered = self.returned(entry.seq)
        return entry

    def _entry_of(self, row: IndexEntry) -> Entry:
        return Entry(row.seq, stored_message(row), row.delivered, row.expiry, row.msg_id if row.transient else 0)

    def first_paged(self, start: int) -> int | None:
        """The lowest seq >= ``start`` of an entry on disk, None if there is none."""
        rows = self.paged_rows(start, 1) if self.paged else []
        return rows[0].seq if rows else None

    def paged_rows(self, start: int, limit: int) -> list[IndexEntry]:
        """Up to ``limit`` index rows of entries on disk with seq >= ``start``, in seq order."""
        index, queue_id = self.page_index()
        apart = self.apart
        rows = index.read(queue_id, max(start, self.paged_from, self._drop_below), limit + len(apart))
        return [row for row in rows if row.seq not in apart][:limit] if apart else rows

    def paged_ranges(self, below: int = 2 ** 64 - 1) -> list[tuple[int, int]]:
        """The index keys of the entries on disk with seq < ``below`` (``[start, end)`` ranges, around the rows
        that are not the tail's, ``apart``; a priority queue has one per level)."""
        ranges, start = [], self.paged_from
        for seq in sorted(self.apart):
            if start <= seq < below:
                if start < seq:
                    ranges.append((start, seq))
                start = seq + 1
        return [*ranges, (start, below)] if start < below else ranges

    def recover(self, count: int, size: int, last_seq: int | None,
                expiries: Iterable[tuple[int, int]]) -> tuple[int | None, Iterable[tuple[int, int]]]:
        """At start-up: the queue index holds ``count`` entries of ``size`` bytes up to ``last_seq``, all on
        disk until they near the head; ``expiries`` are the (expiry, key) of those that have one.  The last seq
        found (the queue's next comes after it), and the expiries by the keys the entries have now."""
        self.tail.clear()
        self.tail.add(count, size)
        self.bytes += size
        self.paged_from = 0
        if count and self.owner.pager is not None:
            self.owner.pager.deep(self.owner)
        return last_seq, expiries

    # -- entries leaving ------------------------------------------------------------------------

    def forget(self, entry: Entry) -> None:
        """An entry leaves the queue for good: its index entry and its store reference go."""
        message = entry.message
        if entry.transient:
            index, queue_id = self.page_index()
            index.ack(queue_id, self.row_key(entry))
            self._pages.store.remove(entry.transient)
        elif message.msg_id and self.owner.rows is not None:
            self.owner.rows.remove(self.owner, entry)

    def forget_memory(self) -> None:
        """Every ready entry in memory leaves the queue for good (a purge, a deletion)."""
        for entry in self.entries:
            if not entry.gone:
                self.forget(entry)
        for entry in self.front:
            self.forget(entry)

    def expire_paged(self, key: int) -> Entry | None:
        """An entry on disk whose time is up leaves the queue without coming into memory."""
        index, queue_id = self.page_index()
        row = index.get(queue_id, key)
        if row is None:
            return None
        self.left_disk(1, row.size)
        return self.paged_entry(row)

    def left_disk(self, count: int, size: int) -> None:
        """``count`` entries on disk, ``size`` bytes in all, left the queue without coming into memory."""
        self.tail.remove(count, size)
        self.bytes -= size

    def drop_paged(self, below: int) -> int:
        """Entries on disk with seq < ``below`` leave the queue, as acked (not the rows ``apart``); returns how
        many."""
        removed = 0
        for start, end in self.paged_ranges(below):
            self.paged_from = max(self.paged_from, start)
            done = False
            while not done:
                taken, done = self._drop_paged_batch(end, PAGE_IN_BATCH)
                removed += taken
        self.paged_from = max(self.paged_from, below)
        return removed

    def _drop_paged_batch(self, below: int, limit: int) -> tuple[int, bool]:
        """Up to ``limit`` of the entries on disk with seq < ``below`` leave the queue, as acked: how many, and
        whether none is left."""
        taken = 0
        if self.paged:
            index, queue_id = self.page_index()
            seqs, rows = index.take(queue_id, self.paged_from, below, limit)
            taken = len(seqs)
            if taken:
                self.release_rows(rows)
                self.paged_from = int(seqs[-1]) + 1
            if taken == limit and self.paged:
                return taken, False
        self.paged_from = max(self.paged_from, below)
        return taken, True

    def release_rows(self, rows: np.ndarray) -> None:
        """Entries on disk left the queue without coming into memory (``QueueIndex.take`` deleted them): the
        store references they held go, and their weight."""
        self._release(rows)
        self.left_disk(len(rows), int(rows["size"].sum()))

    def _release(self, rows: np.ndarray) -> None:
        """The store references of index rows taken from the queue's index (transient ones in the pager's store)."""
        transient = (rows["flags"] & FLAG_TRANSIENT) != 0
        if transient.any():
            self._pages.store.remove_many(rows["msg_id"][transient])
        persistence = self.owner.persistence
        if persistence is not None and not transient.all():
            persistence.store.remove_many(rows["msg_id"][~transient])

    def _drop_marked(self, ranges: list[tuple[int, int]], marks: list[int]) -> None:
        """The rows of entries on disk in ``ranges`` (keys), which left the queue, go in the background with their
        store references; then the drop marks naming them are forgotten."""
        index, queue_id = self.page_index()
        self._pages.drop_later(index, queue_id, ranges, self._release, partial(index.forget_dropped, queue_id, marks))

    def purge(self, upto: int) -> None:
        """Every ready entry leaves the queue (``upto``: the queue's next seq).  Those on disk (a deep queue's
        backlog) at once to every reader, and from the index in the background: a million held every client for
        seconds.  Drop marks in the index name them until they are gone, so a restart meanwhile drops them too."""
        self.forget_memory()
        if self.paged:
            index, queue_id = self.page_index()
            on_disk = self.paged_ranges(upto)
            marks = [index.mark_dropped(queue_id, start, end) for start, end in on_disk] + self._drop_marks
            self._drop_marked(on_disk, marks)
            self.paged_from, self._drop_below, self._drop_marks = upto, 0, []  # a commit's drop: part of it
        self.clear()

    def drop_all(self) -> None:
        """The queue is deleted: its ready entries go, and its index rows.  Those in memory go now; those on disk,
        a deep queue's backlog, in the background (``Pager.drop_later``), as do the rows of entries consumers
        still hold (their store references are theirs to release)."""
        on_disk = self.paged_ranges() if self.paged else []
        self.forget_memory()
        self.clear()
        owner = self.owner
        if owner.pager is not None:
            owner.pager.shallow(owner)
            if owner.persistence is not None or self.page_id:
                index, queue_id = self.page_index()
                owner.pager.drop_later(index, queue_id, on_disk, self._release, partial(index.delete_queue, queue_id))

    # -- a commit (the Spark bridge's): the entries below an offset leave --------------------------

    def remove_below(self, offset: int) -> int:
        """Every ready entry with ``seq < offset`` leaves as an ack would (index and store updated): how many left
        now.  With ``drops_later``, those in memory; the ones on disk are left to ``count_committed`` (unseen
        meanwhile by reads, deliveries and expiry) unless every entry on disk is below ``offset``: then they
        leave at once."""
        removed = 0
        for entry in [entry for entry in self.front if entry.seq < offset]:
            self.take_out(entry.seq)
            self.forget(entry)
            removed += 1
        for entry in self.pop_below(offset):
            if entry.gone:
                self.gone -= 1
                continue
            self.bytes -= entry.message.body_size
            if entry.message.body is None:
                self.unheld -= entry.message.body_size
            if entry.expiry and self.expiring is not None:
                self.expiring.pop(self.row_key(entry), None)
            self.forget(entry)
            removed += 1
        if self.paged and offset > self.paged_from:
            if self.drops_later:
                index, queue_id = self.page_index()
                self._drop_marks.append(index.mark_dropped(queue_id, self.paged_from, offset))
                if not self._drop_below:
                    self._counting = (self.paged_from, 0, 0)
                self._drop_below = offset
                if self.first_paged(offset) is None:  # the whole part on disk: its count is known
                    self._cut(self.paged, self.paged_bytes)
            else:
                removed += self.drop_paged(offset)
        return removed

    def count_committed(self) -> bool:
        """Count up to ``COUNT_BATCH`` more of the entries on disk a commit removed (``remove_below``); once all
        are counted they leave the queue, as acked, their index rows dropped in the background.  Whether more is
        left to count: a commit of part of a deep queue's million entries counts a batch per loop turn."""
        if not self._drop_below or self.owner.deleted:
            return False
        index, queue_id = self.page_index()
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
        self.left_disk(count, size)
        self.owner.stats.ack += count
        self.committed_drops += count
        self._drop_marked([(self.paged_from, self._drop_below)], self._drop_marks)
        self.paged_from, self._drop_below, self._drop_marks = self._drop_below, 0, []
        if count:
            self.owner.touch()

    def _finish_count(self) -> None:
        """A commit's count of entries on disk ends now: before anything moves entries between memory and disk."""
        while self.count_committed():
            pass

    # -- reads ----------------------------------------------------------------------------------

    def from_seq(self, start: int) -> Iterable[Entry]:
        """Ready entries in memory with ``seq >= start``, in seq order."""
        return from_seq(self.entries, start)

    def pop_below(self, offset: int) -> Iterator[Entry]:
        """Take every ready entry in memory with ``seq < offset`` out of the ready list."""
        return pop_below(self.entries, offset)

    def span(self, start: int, end: int) -> list[Entry]:
        """The in-memory ready entries with ``start <= seq < end`` in seq order (the front's among them), dead ones
        included: one copy of references, which a long read goes through in slices while the queue changes."""
        ready, front = self.entries, self._front_in(start, end)
        if not ready or end <= start:
            return front
        first = bisect_left(ready, start, key=_seq) if ready[0].seq < start else 0
        last = bisect_left(ready, end, key=_seq) if ready[-1].seq >= end else len(ready)
        found = list(islice(ready, first, last))
        return sorted([*found, *front], key=_seq) if front else found

    def _front_in(self, start: int, end: int) -> list[Entry]:
        """The front's entries with ``start <= seq < end``, in seq order (the order they came back in)."""
        return [entry for entry in self.front if start <= entry.seq < end] if self.front else []

    def range_slices(self, start: int, end: int, step: int) -> Iterator[list[Entry]]:
        """The entries with ``start <= seq < end``, at most ``step`` at a time in seq order, dead ones included:
        those in memory below the first on disk, then from where they ended on, what is there when asked."""
        for entries, rows in self.range_parts(start, end, step):
            yield sorted([*entries, *map(self.paged_entry, rows)], key=_seq) if rows else sorted(entries, key=_seq)

    def range_parts(self, start: int, end: int, step: int) -> Iterator[tuple[list[Entry], list[IndexEntry]]]:
        """``range_slices``, each slice as its entries in memory and the index rows of those on disk, with no
        entry made for these (a reader of their records in the store: a quorum queue's snapshot)."""
        first_on_disk = self.first_paged(start)  # memory up to there first (a priority queue's interleave)
        memory = self.span(start, end if first_on_disk is None else min(end, first_on_disk))
        cursor = start
        for i in range(0, len(memory), step):
            yield memory[i:i + step], []
            cursor = memory[min(i + step, len(memory)) - 1].seq + 1
        while cursor < end:
            # entries at or above cursor: any paged in or requeued since (in memory), then those on disk
            entries = [entry for entry in islice(merge(self.from_seq(cursor), self._front_in(cursor, end), key=_seq),
                                                 step) if entry.seq < end]
            rows = [row for row in self.paged_rows(cursor, step) if row.seq < end] if self.paged else []
            if not entries and not rows:
                return
            if entries and rows:  # the first ``step`` of both (each has at most that many)
                seqs = sorted([*(entry.seq for entry in entries), *(row.seq for row in rows)])
                last = seqs[min(step, len(seqs)) - 1]
                entries = [entry for entry in entries if entry.seq <= last]
                rows = [row for row in rows if row.seq <= last]
            else:
                last = max(item.seq for item in entries or rows)
            cursor = last + 1
            yield entries, rows

    def peek(self, offset: int = 0, count: int = 10, after: Entry | None = None) -> list[Entry]:
        """Ready entries from ``offset`` on in delivery order, without taking them (their bodies may be on disk).
        ``after``: those that follow this entry instead (a long browse goes on where its last slice ended,
        without walking the queue from its head again)."""
        front = self.front
        if after is not None and any(entry is after for entry in front):  # (then the others, past the front)
            following = list(islice(front, [id(entry) for entry in front].index(id(after)) + 1, None))[:count]
            return following + self.peek(len(front), count - len(following)) if len(following) < count else following
        if after is not None:
            following = list(islice((e for e in self.from_seq(after.seq + 1) if not e.gone), count))
            if len(following) < count and self.paged:
                rows = self.paged_rows(after.seq + 1, count - len(following))
                following.extend(self.paged_entry(row) for row in rows)
            return following
        entries: list[Entry] = []
        skipped = 0
        for entry in chain(front, self.entries) if front else self.entries:
            if entry.gone:
                continue
            if skipped < offset:
                skipped += 1
                continue
            if len(entries) >= count:
                break
            entries.append(entry)
        if len(entries) < count and self.tail.count:
            rows = self.paged_rows(0, offset - skipped + count - len(entries))
            entries.extend(self.paged_entry(row) for row in rows[offset - skipped:])
        return entries
