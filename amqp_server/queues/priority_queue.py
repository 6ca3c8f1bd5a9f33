"""Priority queues (``x-max-priority``), as RabbitMQ's classic queues have them.

A message's level is its ``priority`` property (0 when unset), capped at the queue's maximum.
Delivery (consumers, basic.get, peek) takes the highest non-empty level first and is FIFO
(by ``seq``) within a level; a requeued entry goes back to its place in its level.  Offsets (the
Spark bridge) stay in ``seq`` order across levels.

Each level pages as a plain queue's ready list does (RabbitMQ's priority queue is one backing queue
per level): the head of a level is in memory, the rest of it on disk.  The queue index keys an
entry by its level first (:func:`index_key`), so a level's entries on disk are one ordered range
of the index, read without walking the others' (a durable queue's rows are written so too: the type's storage,
:class:`RankedRows`).

A priority queue is a :class:`~amqp_server.queues.queue.Queue` whose ready list is a :class:`PriorityReadyList`: it
swaps the store of ready entries (as LavinMQ's priority queue swaps its message store), so that a plain queue's ready
list stays a bare deque and publish and deliver pay nothing for priorities.  Everything else (TTL, limits,
dead-lettering, persistence) is the queue's, working through the ready list's deque-like ``entries`` and the
paging it overrides here.
"""
from __future__ import annotations

import heapq
import logging
from collections import deque
from itertools import chain, islice, takewhile
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from queue_index import IndexEntry

from ..logs import untrusted
from ..message import Message
from .ready import Entry, from_seq, pop_below, put_back
from .ready_list import PAGE_IN_BATCH, PAGE_IN_BELOW, ReadyList, ReadyOwner, stored_message

if TYPE_CHECKING:
    from .persistence import Persistence, StoredQueue

log = logging.getLogger("warren.queue")

RANK_SHIFT = 55  # an entry's index key: (256 - level) << RANK_SHIFT | seq, so higher levels sort first
SEQ_MASK = (1 << RANK_SHIFT) - 1


def index_key(level: int, seq: int) -> int:
    return (256 - level) << RANK_SHIFT | seq


def key_level(key: int) -> int:
    """The level an index key names (an unranked key, written before levels were keyed, is above all)."""
    return 256 - (key >> RANK_SHIFT)


class LeveledEntry(Entry):
    """An entry of a priority queue: its message's priority read once (uncapped; ``PriorityReady`` caps it),
    or for one read back from disk, the level its index key names."""

    __slots__ = ("level",)

    def __init__(self, seq: int, message: Message, redelivered: bool = False, expiry: int = 0,
                 transient: int = 0, level: int | None = None) -> None:
        super().__init__(seq, message, redelivered, expiry, transient)
        self.level = message.priority if level is None else level


class PriorityReady:
    """Ready entries in one deque per level 0..max; iteration and ``popleft`` go highest level first.

    ``taken[n]`` is the highest seq ``popleft`` took from level ``n``: every entry a consumer holds is at or
    below it, so the level's part above it may go to disk (a requeue then comes back in memory)."""

    __slots__ = ("levels", "top", "count", "taken")

    def __init__(self, max_priority: int) -> None:
        self.levels: list[deque[Entry]] = [deque() for _ in range(max_priority + 1)]
        self.top = -1  # no level above this one holds entries
        self.count = 0
        self.taken = [-1] * (max_priority + 1)

    def index_of(self, entry: LeveledEntry) -> int:
        return min(entry.level, len(self.levels) - 1)

    def level(self, entry: LeveledEntry) -> deque[Entry]:
        """The deque ``entry`` belongs in; a level above ``top`` raises ``top``."""
        return self.at(self.index_of(entry))

    def at(self, index: int) -> deque[Entry]:
        if index > self.top:
            self.top = index
        return self.levels[index]

    def highest(self) -> int:
        """The highest level holding entries in memory, -1 if none."""
        levels = self.levels
        top = self.top
        while top >= 0 and not levels[top]:
            top -= 1
        self.top = top
        return top

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Entry]:
        return chain.from_iterable(reversed(self.levels[:self.top + 1]))

    def append(self, entry: LeveledEntry) -> None:
        index = min(entry.level, len(self.levels) - 1)  # level(), inline: the publish path
        if index > self.top:
            self.top = index
        self.levels[index].append(entry)
        self.count += 1

    def popleft(self) -> Entry:
        if not self.count:
            raise IndexError("pop from an empty ready list")
        levels = self.levels
        top = self.top  # highest(), inline: the delivery path
        while not levels[top]:
            top -= 1
        self.top = top
        self.count -= 1
        entry = levels[top].popleft()
        if entry.seq > self.taken[top]:
            self.taken[top] = entry.seq
        return entry

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self.top = -1
        self.count = 0


class PriorityReadyList(ReadyList):
    """A ready list whose entries in memory are a :class:`PriorityReady`, each level paging on its own.

    Level ``n``'s entries with ``seq >= level_from[n]`` are on disk while ``on_disk[n]`` (which may stay set
    once the level's last entry on disk left otherwise than by paging in, while other levels are on disk: the
    next page-in finds none and clears it; once none is on disk, none is set); ``paged`` counts them all.  A
    level pages out only above ``entries.taken[n]``, so every unacked entry is in front of the level's part on
    disk and a requeue puts it back in memory."""

    ranked = True
    entry_type = LeveledEntry

    def __init__(self, owner: ReadyOwner, expiring: dict[int, Entry], max_priority: int) -> None:
        # its levels' parts on disk interleave: a commit drops them at once
        super().__init__(owner, expiring, drops_later=False)
        self.entries: PriorityReady = PriorityReady(max_priority)
        levels = len(self.entries.levels)
        self.max_level = levels - 1
        self.on_disk = [False] * levels
        self.level_from = [0] * levels
        self.disk_top = -1  # the highest level on disk

    def row_key(self, entry: LeveledEntry) -> int:  # type: ignore[override]  # a priority queue's entries are LeveledEntry (entry_type)
        """index_key, inline: asked for each store, delivery and ack of a persistent message."""
        return (256 - min(entry.level, self.max_level)) << RANK_SHIFT | entry.seq

    def _set_on_disk(self, level: int, value: bool) -> None:
        self.on_disk[level] = value
        if value:
            self.disk_top = max(self.disk_top, level)
        elif level == self.disk_top:
            top = level
            while top >= 0 and not self.on_disk[top]:
                top -= 1
            self.disk_top = top

    # -- in and out of memory -------------------------------------------------------------------

    def _tail_on_disk(self, entry: Entry) -> bool:
        return self.on_disk[self.entries.index_of(entry)]  # type: ignore[arg-type]  # a priority queue's entries are LeveledEntry (entry_type)

    def page_due(self) -> bool:
        """The highest level on disk is above every level in memory, or is the highest and runs short."""
        level = self.disk_top
        if level < 0:
            return True  # counted on disk, yet no level is: page_in puts the count right
        top = self.entries.highest()
        return level > top or (level == top and len(self.entries.levels[level]) < PAGE_IN_BELOW)

    def page_in(self) -> bool:
        """The next batch of the highest level on disk comes in; a level found with no more on disk is so no longer
        (the next page-in reads the one below).  False if no level is on disk."""
        level = self.disk_top
        if level < 0:
            self.trust_index()
            return False
        rows = self._level_rows(level, self.level_from[level], PAGE_IN_BATCH)
        ready = self.entries
        entries = ready.at(level)

        def admit(entry: Entry) -> None:
            entries.append(entry)
            ready.count += 1

        self.bring_in(rows, admit)
        if rows:
            self.level_from[level] = (rows[-1].seq & SEQ_MASK) + 1
        if len(rows) < PAGE_IN_BATCH:
            self._set_on_disk(level, False)
            if self.disk_top < 0 and self.paged:
                self.trust_index()
        if not self.tail.count:
            self._none_on_disk()
        return True

    def page_out(self, keep: int, written: dict[int, tuple[Message, int]] | None = None) -> int:
        """Entries after the first ``keep`` (in delivery order) go to disk, lowest level first, each level from
        its tail (those above every seq of it a consumer took)."""
        ready = self.entries
        pager = self.owner.pager
        if pager is None or len(ready) <= keep:
            return 0
        pager.deep(self.owner)
        freed = 0
        for level, entries in enumerate(ready.levels):
            taken = ready.taken[level]
            while len(ready) > keep and entries and entries[-1].seq > taken:
                entry = entries.pop()
                ready.count -= 1
                self.level_from[level] = entry.seq
                self._set_on_disk(level, True)
                if entry.gone:
                    self.gone -= 1
                    continue
                if entry.expiry and self.expiring is not None:
                    self.expiring.pop(index_key(level, entry.seq), None)  # its (expiry, key) stays in the heap
                self.page_write(entry, written)
                self.tail.add(1, entry.message.body_size)
                if entry.message.body is not None:
                    freed += entry.message.body_size
                else:
                    self.unheld -= entry.message.body_size
            if len(ready) <= keep:
                break
        return freed

    def put_back(self, entry: Entry) -> None:
        put_back(self.entries.level(entry), entry)  # type: ignore[arg-type]  # a priority queue's entries are LeveledEntry (entry_type)
        self.entries.count += 1
        self.came_back(entry)

    def last_in_memory(self, entry: Entry) -> bool:
        level = self.entries.levels[self.entries.index_of(entry)]  # type: ignore[arg-type]  # (LeveledEntry)
        return bool(level) and level[-1] is entry

    # -- what is on disk ------------------------------------------------------------------------

    def _level_rows(self, level: int, start: int, limit: int) -> list[IndexEntry]:
        """Up to ``limit`` index rows of ``level`` from ``seq >= start`` (keys as stored)."""
        index, queue_id = self.page_index()
        end = index_key(level - 1, 0)  # where the level below begins (level 0: past every level)
        return [row for row in index.read(queue_id, index_key(level, start), limit) if row.seq < end]

    def paged_rows(self, start: int, limit: int) -> list[IndexEntry]:
        """Every level's rows on disk from ``seq >= start``, merged in seq order, with their seqs."""
        found = [row._replace(seq=row.seq & SEQ_MASK) for level, on_disk in enumerate(self.on_disk) if on_disk
                 for row in self._level_rows(level, max(start, self.level_from[level]), limit)]
        found.sort(key=lambda row: row.seq)
        return found[:limit]

    def _entry_of(self, row: IndexEntry) -> LeveledEntry:
        return LeveledEntry(row.seq & SEQ_MASK, stored_message(row), row.delivered, row.expiry,
                            row.msg_id if row.transient else 0, key_level(row.seq))

    def peek(self, offset: int = 0, count: int = 10, after: Entry | None = None) -> list[Entry]:
        """In delivery order: each level's entries in memory, then those on disk, highest level first."""
        if after is not None:
            return self._peek_after(after, count)
        entries: list[Entry] = []
        skip = offset
        for level in range(len(self.entries.levels) - 1, -1, -1):
            for entry in self.entries.levels[level]:
                if len(entries) >= count:
                    return entries
                if entry.gone:
                    continue
                if skip:
                    skip -= 1
                    continue
                entries.append(entry)
            if self.on_disk[level] and len(entries) < count:
                rows = self._level_rows(level, self.level_from[level], skip + count - len(entries))
                entries.extend(self.paged_entry(row) for row in rows[skip:])
                skip = max(0, skip - len(rows))
        return entries[:count]

    def _peek_after(self, after: Entry, count: int) -> list[Entry]:
        """The ``count`` entries that follow ``after`` in delivery order: the rest of its level, then lower ones."""
        entries: list[Entry] = []
        top = self.entries.index_of(after)  # type: ignore[arg-type]  # a priority queue's entries are LeveledEntry (entry_type)
        for level in range(top, -1, -1):
            start = after.seq + 1 if level == top else 0
            memory = (e for e in from_seq(self.entries.levels[level], start) if not e.gone)
            entries.extend(islice(memory, count - len(entries)))
            if self.on_disk[level] and len(entries) < count:
                rows = self._level_rows(level, max(start, self.level_from[level]), count - len(entries))
                entries.extend(self.paged_entry(row) for row in rows)
            if len(entries) >= count:
                break
        return entries

    def paged_ranges(self, below: int = SEQ_MASK) -> list[tuple[int, int]]:
        return [(index_key(level, self.level_from[level]), index_key(level, min(below, SEQ_MASK)))
                for level, on_disk in enumerate(self.on_disk) if on_disk]

    def drop_paged(self, below: int) -> int:
        """Every level's entries on disk with seq < ``below`` leave the queue, as acked."""
        index, queue_id = self.page_index()
        removed = 0
        for level, on_disk in enumerate(self.on_disk):
            if not on_disk:
                continue
            start, end = index_key(level, self.level_from[level]), index_key(level, min(below, SEQ_MASK))
            while len((taken := index.take(queue_id, start, end, PAGE_IN_BATCH))[0]):
                seqs, rows = taken
                self.release_rows(rows)
                removed += len(seqs)
                start = int(seqs[-1]) + 1
            self.level_from[level] = max(self.level_from[level], below)
        return removed

    def expire_paged(self, key: int) -> Entry | None:
        level, seq = key_level(key), key & SEQ_MASK
        if not self.on_disk[level] or seq < self.level_from[level]:
            return None
        return super().expire_paged(key)

    def clear(self) -> None:
        super().clear()
        self._none_on_disk()

    def left_disk(self, count: int, size: int) -> None:
        """Entries on disk left without coming into memory (expired there, committed): once none is left, no level
        is on disk, which a level's flag may otherwise still say (only a page-in finds a level empty), and the
        next entry of that level, going to memory, would be read back by a page-in of it."""
        super().left_disk(count, size)
        if not self.tail.count:
            self._none_on_disk()

    def _none_on_disk(self) -> None:
        for level, on_disk in enumerate(self.on_disk):
            if on_disk:
                self._set_on_disk(level, False)

    # -- memory only ----------------------------------------------------------------------------

    def from_seq(self, start: int) -> Iterable[Entry]:
        return heapq.merge(*(from_seq(level, start) for level in self.entries.levels if level))

    def span(self, start: int, end: int) -> list[Entry]:
        """The levels' entries in ``[start, end)``, merged into seq order."""
        return list(takewhile(lambda entry: entry.seq < end, self.from_seq(start))) if end > start else []

    def pop_below(self, offset: int) -> Iterator[Entry]:
        ready = self.entries
        for level in ready.levels:
            for entry in pop_below(level, offset):
                ready.count -= 1
                yield entry

    def compact(self) -> None:
        ready = self.entries
        ready.levels = [deque(e for e in level if not e.gone) for level in ready.levels]
        ready.count = sum(map(len, ready.levels))
        self.gone = 0

    # -- a restart ------------------------------------------------------------------------------

    def recover(self, count: int, size: int, last_seq: int | None,
                expiries: Iterable[tuple[int, int]]) -> tuple[int | None, Iterable[tuple[int, int]]]:
        """The levels found on disk (one index lookup each); entries written before levels were keyed are
        keyed now (once), reading their messages' priorities."""
        index, queue_id = self.page_index()
        rekeyed = self._rekey(index, queue_id)
        last = -1
        for level in range(len(self.entries.levels)):
            rows = self._level_rows(level, 0, 1)
            if rows:
                self._set_on_disk(level, True)
                last = max(last, (index.last_seq(queue_id, below=index_key(level - 1, 0)) or 0) & SEQ_MASK)
        return super().recover(count, size, last if last >= 0 else None,
                               [(expiry, rekeyed.get(seq, seq)) for expiry, seq in expiries])

    def _rekey(self, index: Any, queue_id: int) -> dict[int, int]:
        """Index rows keyed by seq alone (before levels were keyed) move to their level's range (a restart has
        dropped a durable queue's transient entries; a message the store lost is the page-in's to drop)."""
        moved: dict[int, int] = {}
        owner = self.owner
        assert owner.persistence is not None and owner.host is not None  # a durable queue's rows, at its recovery
        store = owner.persistence.store
        while rows := [row for row in index.read(queue_id, 0, PAGE_IN_BATCH) if row.seq <= SEQ_MASK]:
            for row in rows:
                level = 0
                if row.msg_id in store:
                    message = Message.stored(row.msg_id, row.size)
                    owner.host.load_body(message)
                    level = min(message.priority, len(self.entries.levels) - 1)
                moved[row.seq] = key = index_key(level, row.seq)
                index.publish(queue_id, key, row.msg_id, row.expiry, row.size, row.delivered, row.transient)
                index.ack(queue_id, row.seq)
        if moved:
            index.commit()
            log.info("queue %s in vhost %s: %d entries keyed by level", untrusted(owner.name),
                     untrusted(owner.vhost), len(moved))
        return moved


class RankedRows:
    """A durable priority queue's rows in the queue index (its type's storage, ``persistence.QueueRows``): keyed
    by level, then seq (the queue's ``row_key``: its ready list's), so that each level's part on disk is a range
    of the index of its own; the messages in the node's persistent store, as any durable queue's."""

    def __init__(self, persistence: Persistence) -> None:
        self.persistence = persistence
        self.index = persistence.index

    def write(self, queue: StoredQueue, entry: Entry) -> None:
        message = entry.message
        self.persistence.keep(message)
        self.index.publish(queue.index_id, queue.row_key(entry), message.msg_id, entry.expiry, len(message.body))

    def delivered(self, queue: StoredQueue, entry: Entry, returns: int = 0) -> None:
        message = entry.message
        self.index.delivered(queue.index_id, queue.row_key(entry), message.msg_id, entry.expiry, message.body_size,
                             returns=returns)
        self.persistence.stage()

    def remove(self, queue: StoredQueue, entry: Entry) -> None:
        self.index.ack(queue.index_id, queue.row_key(entry))
        self.persistence.store.remove(entry.message.msg_id)
        self.persistence.stage()
