"""Per-queue ordered entries in LMDB (RabbitMQ's rabbit_queue_index).

Key ``queue id (u32) | seq (u64)``, big-endian, so one cursor walk returns a
queue's entries in order; value ``msg_id (u64) | expiry ms (u64, 0 = none) |
size (u32) | flags (u8)``.  Beside them, under the bare ``queue id`` (which
sorts first), a queue's totals: entries, bytes, entries with an expiry, and
entries whose message is in the transient store.  The totals change in the
same transaction as the entries, from what each put replaced and each delete
removed, so they always match the entries, and a restart reads them instead
of counting.

A replicated queue's replica also keeps its position in its group's log (term, index) there, under
the reserved queue id ``POSITIONS`` with the queue's id as seq: it commits with the entries it
describes, so a replica never claims more than it has.

Its state's enqueuers (``quorum_machine.State.enqueuers``: each window of publishes and its next publish seq)
are under the reserved queue id ``ENQUEUERS``, with ``queue id << 32 | slot`` as seq, the enqueuer as msg_id and
its next seq as expiry: staged with the position, they commit with the entries they describe, so a replica
restarted from its entries takes no window's publish twice when it leads.

A quorum queue's entry keeps how often it came back (its x-delivery-count) in its flags' upper six bits, up to
63; past that they say 63, and the count itself is under the reserved queue id ``COUNTS``, keyed ``COUNTS |
queue id (u32) | seq (u64)`` (a key of its own length: a u64 seq cannot hold both), its value the count (u64).
Those rows are few (the entries of poison messages), read into memory at open, and go with their entries.  An
entry an earlier version kept saturated at 63 has no such row: it reads 63, as it did.  A ready entry a quorum
queue serves before the others (a return to the front, ``quorum_machine.State.returns``) has such a row too, its
count's ``FRONT`` bit set (they are as few: what consumers held): any change of the entry's count (a delivery, a
return in place) rewrites the row, and the bit goes.

A stream kept by an earlier version (an entry per message) has its runs (first offset, publish time, bytes)
under the reserved queue id ``MARKS``, with ``queue id << 32 | run number`` as seq:
``amqp_server.queues.stream_migrate`` reads them once, when it moves the stream into a log of its own.

A queue's entries that left it all at once (a purge) but are deleted a batch at a time in the background
are named by a drop mark, ``[start, end)`` of keys, under the reserved queue id ``DROPS`` with
``queue id << 32 | mark number`` as seq: should the node stop before the deletions are done, its next start
deletes what the marks still name (``dropped``) before it counts anything, so a purged message never comes
back.

Changes are staged and applied in one write transaction per ``commit``;
``sync`` makes committed changes durable and may run off the event loop while
new changes are staged.
"""
from __future__ import annotations

import bisect
import logging
import itertools
import os
import shutil
import struct
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

import lmdb
import numpy as np

from .lmdb_batch import open_env, sync

log = logging.getLogger("warren.queue_index")

KEY = struct.Struct(">IQ")
VALUE = struct.Struct(">QQIB")
KEY_DTYPE = np.dtype([("queue", ">u4"), ("seq", ">u8")])
VALUE_DTYPE = np.dtype([("msg_id", ">u8"), ("expiry", ">u8"), ("size", ">u4"), ("flags", "u1")])
TOTALS = struct.Struct(">QQQQ")
FLAG_DELIVERED = 1
FLAG_TRANSIENT = 2  # msg_id names a record of the transient store (gone at the next start)
RETURNS_SHIFT = 2  # the flags' upper six bits: how often the entry came back to its queue (a quorum queue's
MAX_RETURNS = 63  # x-delivery-count); more than this: the count is under ``COUNTS``
COMPACT_MIN_BYTES = 4 << 20
ARRAY_ACCOUNTING = 32  # entries of one commit from which totals are counted as arrays
POSITIONS = 0xFFFFFFFF  # reserved queue id: replicas' log positions (seq = queue id, msg_id = term, expiry = index,
# size = settings), and their next seqs (seq = queue id + NEXT_SEQS, msg_id = next seq)
NEXT_SEQS = 1 << 32
MARKS = 0xFFFFFFFE  # reserved queue id: streams' runs (seq = queue id << 32 | number, msg_id = first offset,
# expiry = publish ms, size = bytes, flags = the stream's)
DROPS = 0xFFFFFFFD  # reserved queue id: drop marks (seq = queue id << 32 | number, msg_id = start, expiry = end)
ENQUEUERS = 0xFFFFFFFC  # reserved queue id: replicas' enqueuers (seq = queue id << 32 | slot, msg_id = enqueuer,
# expiry = its next publish seq)
COUNTS = 0xFFFFFFFB  # reserved queue id: the delivery counts past MAX_RETURNS (``COUNT_KEY``, ``COUNT``)
COUNT_KEY = struct.Struct(">I12s")  # COUNTS, then the entry's key
COUNT = struct.Struct(">Q")
WAITING_SHIFT = 56  # a value under COUNTS: the count below these bits, above them an entry's waiting code + 1
COUNT_MASK = (1 << WAITING_SHIFT) - 1
WAITING_MASK = 0x7F  # (the code's bits, below FRONT)
FRONT = 1 << 63  # in a COUNTS row: the entry is served first
RESERVED = (POSITIONS, MARKS, DROPS, ENQUEUERS, COUNTS)


class IndexEntry(NamedTuple):
    """A NamedTuple, not a dataclass: a queue paging in makes one per message, and tuples are made fastest."""

    seq: int
    msg_id: int
    expiry: int  # epoch milliseconds, 0 for none
    size: int
    delivered: bool
    transient: bool = False
    returns: int = 0  # times returned to the queue (kept for quorum queues)


def _row(seq: int, msg_id: int, expiry: int, size: int, flags: int) -> IndexEntry:
    return IndexEntry(seq, msg_id, expiry, size, flags & FLAG_DELIVERED != 0, flags & FLAG_TRANSIENT != 0,
                      flags >> RETURNS_SHIFT)


class Totals(NamedTuple):
    """A queue's entries as the index holds them."""

    count: int = 0  # type: ignore[assignment]  # shadows tuple.count, which no caller wants
    bytes: int = 0
    expiring: int = 0
    transient: int = 0


def _entry(key: bytes, value: bytes) -> IndexEntry:
    return _row(KEY.unpack(key)[1], *VALUE.unpack(value))



def _compact(directory: str, map_size: int) -> None:
    """Rewrite the file if most of it is free pages: LMDB reuses freed pages but never shrinks its file,
    so after a large backlog was consumed the disk comes back at the next start."""
    path = os.path.join(directory, "data.mdb")
    if not os.path.exists(path) or os.path.getsize(path) < COMPACT_MIN_BYTES:
        return
    env = open_env(directory, map_size)
    try:
        stat = env.stat()
        used = (stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"] + 2) * stat["psize"]
        if used * 4 > os.path.getsize(path):
            return
        tmp = os.path.join(directory, "compact.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp)
        env.copy(tmp, compact=True)
    finally:
        env.close()
    copy = os.path.join(tmp, "data.mdb")
    with open(copy, "rb") as f:
        os.fsync(f.fileno())
    os.replace(copy, path)
    os.rmdir(tmp)


def _opened(directory: str, map_size: int) -> lmdb.Environment:
    """The index's environment, compacted if need be.  One LMDB cannot read (its meta pages damaged) is moved
    aside, kept for an operator, and the node starts with an empty index rather than failing at every start: the
    entries it held are lost (their messages are then unclaimed in the store, and go)."""
    try:
        _compact(directory, map_size)
        return open_env(directory, map_size)
    except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError) as exc:
        aside = f"{directory}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
        log.critical("queue index %s unreadable (%s): moved to %s; the messages of its queues are lost",
                     directory, exc, aside)
        os.rename(directory, aside)
        os.makedirs(directory)
        return open_env(directory, map_size)


class QueueIndex:
    def __init__(self, directory: str, map_size: int = 1 << 36, wipe: bool = False,
                 auto_commit: int | None = None, before_commit: Callable[[], None] | None = None) -> None:
        """``auto_commit``: commit whenever that many puts are staged (an index no group commit drives).
        ``before_commit``: run before each commit (the message store hands its buffered records to the
        operating system: an entry must never be on disk before its message, whoever commits — a read commits
        what is staged; a node killed then would find entries whose message it lost)."""
        if wipe:
            shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)
        self._env = _opened(directory, map_size)
        self._synced = -1  # the last transaction a sync covered
        self._puts: dict[bytes, bytes] = {}  # entries published in this batch (not yet on disk)
        self._updates: dict[bytes, bytes] = {}  # entries on disk marked delivered (their totals do not change)
        self._deletes: dict[bytes, None] = {}  # a dict: ordered, and a replica asks what is staged
        self._auto_commit = auto_commit
        self._before_commit = before_commit
        self._enqueuers: dict[int, dict[int, tuple[int, int]]] = {}  # queue id -> enqueuer -> (slot, seq) as staged
        self._drop_marks = itertools.count(1 + max((number for _queue, number, _s, _e in self._drop_marks_of(None)),
                                                   default=0))
        # entry key -> its delivery count, for those of MAX_RETURNS or more, as staged; and their changes since the
        # last commit (None: the row goes)
        self._counts: dict[bytes, int] = self._read_counts()
        self._counts_staged: dict[bytes, int | None] = {}

    def close(self) -> None:
        self._env.close()

    def publish(self, queue_id: int, seq: int, msg_id: int, expiry: int, size: int, delivered: bool = False,
                transient: bool = False, returns: int = 0, front: bool = False) -> None:
        """``front``: a quorum queue's ready entry served first (``FRONT``)."""
        key = KEY.pack(queue_id, seq)
        self._puts[key] = VALUE.pack(msg_id, expiry, size, (FLAG_DELIVERED if delivered else 0)
                                     | (FLAG_TRANSIENT if transient else 0)
                                     | (self._count(key, returns, front) if returns or front or self._counts else 0))
        if self._auto_commit is not None and len(self._puts) >= self._auto_commit:
            self.commit()

    def delivered(self, queue_id: int, seq: int, msg_id: int, expiry: int, size: int,
                  transient: bool = False, returns: int = 0) -> None:
        """Remember a delivery so that after a restart the message comes back redelivered (the arguments
        are the entry's, as published, and the times it came back)."""
        key = KEY.pack(queue_id, seq)
        value = VALUE.pack(msg_id, expiry, size, FLAG_DELIVERED | (FLAG_TRANSIENT if transient else 0)
                           | (self._count(key, returns) if returns or self._counts else 0))
        if key in self._puts:
            self._puts[key] = value
        else:
            self._updates[key] = value

    def _count(self, key: bytes, returns: int, front: bool = False) -> int:
        """The flags' bits for an entry that came back ``returns`` times; a count past ``MAX_RETURNS``, or any of an
        entry served first (``front``), is staged under ``COUNTS`` (one of ``MAX_RETURNS`` needs none: it reads
        so), and one the entry had there goes once it has less."""
        if returns > MAX_RETURNS or front:
            value = returns | FRONT if front else returns
            if self._counts.get(key) != value:
                self._counts[key] = self._counts_staged[key] = value
            return MAX_RETURNS << RETURNS_SHIFT
        self._uncount(key)
        return returns << RETURNS_SHIFT

    def _returns(self, key: bytes, entry: IndexEntry) -> IndexEntry:
        """``entry`` (of ``key``) with its delivery count from ``COUNTS`` if its flags say it is there."""
        if entry.returns < MAX_RETURNS:
            return entry
        return entry._replace(returns=self._counts.get(key, MAX_RETURNS) & COUNT_MASK)

    def returns(self, queue_id: int, seq: int) -> int:
        """The delivery count of an entry whose flags say ``MAX_RETURNS`` (as staged)."""
        return self._counts.get(KEY.pack(queue_id, seq), MAX_RETURNS) & COUNT_MASK

    def front(self, queue_id: int, seq: int) -> bool:
        """Whether the entry, whose flags say ``MAX_RETURNS``, is served first (as staged)."""
        return self._counts.get(KEY.pack(queue_id, seq), 0) & FRONT != 0

    def mark_waiting(self, queue_id: int, seq: int, code: int) -> None:
        """One entry, staged or committed, waits (``code``, < 127: its owner's reason; a quorum queue's dead letter
        no queue took yet) until it goes or is written otherwise: kept under ``COUNTS`` above its count, which its
        flags send a reader to."""
        key = KEY.pack(queue_id, seq)
        value = self._current(key)
        if value is None:
            return
        count = self._returns(key, _entry(key, value)).returns
        self._counts[key] = self._counts_staged[key] = count | (code + 1) << WAITING_SHIFT
        self._reflag(queue_id, seq, MAX_RETURNS << RETURNS_SHIFT, MAX_RETURNS << RETURNS_SHIFT)

    def waiting(self, queue_id: int, seq: int) -> int | None:
        """The code an entry whose flags say ``MAX_RETURNS`` waits for (``mark_waiting``, as staged); None: none."""
        code = self._counts.get(KEY.pack(queue_id, seq), 0) >> WAITING_SHIFT & WAITING_MASK
        return code - 1 if code else None

    def _uncount(self, key: bytes) -> None:
        """The entry of ``key`` goes: its count under ``COUNTS`` too, if it has one."""
        if key in self._counts:
            del self._counts[key]
            self._counts_staged[key] = None

    def _read_counts(self) -> dict[bytes, int]:
        lo, hi = COUNTS.to_bytes(4, "big"), (COUNTS + 1).to_bytes(4, "big")
        counts = {}
        with self._env.begin() as txn:
            cursor = txn.cursor()
            more = cursor.set_range(lo)
            while more and cursor.key() < hi:
                key = cursor.key()
                if len(key) == COUNT_KEY.size:
                    counts[key[4:]] = COUNT.unpack(cursor.value())[0]
                more = cursor.next()
        return counts

    def ack(self, queue_id: int, seq: int) -> None:
        key = KEY.pack(queue_id, seq)
        if self._counts:
            self._uncount(key)
        if self._puts.pop(key, None) is None:
            self._updates.pop(key, None)
            self._deletes[key] = None
        # else published and acked within one batch: never written

    def remove(self, queue_id: int, seq: int) -> IndexEntry | None:
        """Delete one entry, staged or committed, and return it (None if there is none): a replica's removal,
        which must release the store reference the entry holds."""
        key = KEY.pack(queue_id, seq)
        value = self._puts.pop(key, None)
        if value is None:
            if key in self._deletes:
                return None
            value = self._updates.pop(key, None) or self._committed(key)
            if value is None:
                return None
            self._deletes[key] = None
        entry = _entry(key, value)
        if self._counts:
            entry = self._returns(key, entry)
            self._uncount(key)
        return entry

    def has(self, queue_id: int, seq: int) -> bool:
        """An entry is there, staged or committed (and not staged for deletion)."""
        key = KEY.pack(queue_id, seq)
        return key in self._puts or (key not in self._deletes and self._committed(key) is not None)

    def mark_delivered(self, queue_id: int, seq: int) -> None:
        """Flag one entry, staged or committed, as delivered (a replica's copy of ``delivered``)."""
        self._reflag(queue_id, seq, FLAG_DELIVERED, FLAG_DELIVERED)

    def mark_returned(self, queue_id: int, seq: int, returns: int) -> None:
        """One entry, staged or committed, is no longer delivered and came back ``returns`` times (a quorum
        queue's entry a consumer held when its leader changed: back in its place)."""
        key = KEY.pack(queue_id, seq)
        if self._current(key) is not None:
            self._reflag(queue_id, seq, 0xFF & ~FLAG_TRANSIENT, self._count(key, returns))

    def peek(self, queue_id: int, seq: int) -> IndexEntry | None:
        """One entry, staged or committed (``get`` without a commit: what is staged stays uncommitted)."""
        key = KEY.pack(queue_id, seq)
        value = self._current(key)
        return self._returns(key, _entry(key, value)) if value is not None else None

    def relink(self, queue_id: int, seq: int, msg_id: int) -> None:
        """One entry, staged or committed, names another record of the store (a quorum queue's message rewritten
        with a modified outcome's annotations), all else as it was."""
        key = KEY.pack(queue_id, seq)
        value = self._current(key)
        if value is not None:
            _, expiry, size, flags = VALUE.unpack(value)
            self._restage(key, VALUE.pack(msg_id, expiry, size, flags))

    def _reflag(self, queue_id: int, seq: int, mask: int, flags: int) -> None:
        """The entry's flags become ``flags`` where ``mask`` has bits, as they were elsewhere."""
        key = KEY.pack(queue_id, seq)
        value = self._current(key)
        if value is None:
            return
        msg_id, expiry, size, old = VALUE.unpack(value)
        self._restage(key, VALUE.pack(msg_id, expiry, size, old & ~mask | flags))

    def _current(self, key: bytes) -> bytes | None:
        """An entry's value, staged or committed (None if there is none, or its deletion is staged)."""
        if key in self._deletes:
            return None
        return self._puts.get(key) or self._updates.get(key) or self._committed(key)

    def _restage(self, key: bytes, value: bytes) -> None:
        """A new value for an entry that is there (``_current``), staged where its last one is."""
        if key in self._puts:
            self._puts[key] = value
        else:
            self._updates[key] = value

    def _committed(self, key: bytes) -> bytes | None:
        with self._env.begin() as txn:
            return txn.get(key)

    def set_position(self, queue_id: int, term: int, index: int, settings: int = 0, next_seq: int = 0) -> None:
        """A replica's position in its group's log, committed with the entries staged with it, with ``settings``
        (a u32 its owner reads back with it: what its state applies ops by at that position) and the seq its
        next entry takes (which its rows need not show: the last ones may be gone).  Staged as updates, written
        over in place and counted in no totals, as the enqueuers are: a put of a key on disk would make the
        commit count each of its entries' totals one by one (a replica stages its position with every batch)."""
        for seq, value in ((queue_id, VALUE.pack(term, index, settings, 0)),
                           (queue_id + NEXT_SEQS, VALUE.pack(next_seq, 0, 0, 0))):
            key = KEY.pack(POSITIONS, seq)
            self._deletes.pop(key, None)
            self._updates[key] = value

    def position(self, queue_id: int) -> tuple[int, int]:
        """(term, index) last committed for a replica; (0, 0) for none."""
        entry = self.get(POSITIONS, queue_id)
        return (entry.msg_id, entry.expiry) if entry is not None else (0, 0)

    def position_settings(self, queue_id: int) -> tuple[int, int]:
        """The settings and the next seq last committed with a replica's position ((0, 0) for none)."""
        entry, following = self.get(POSITIONS, queue_id), self.get(POSITIONS, queue_id + NEXT_SEQS)
        return entry.size if entry is not None else 0, following.msg_id if following is not None else 0

    def forget_position(self, queue_id: int) -> None:
        """A replica's position, and its enqueuers, go (its copy is dropped)."""
        self.ack(POSITIONS, queue_id)
        self.ack(POSITIONS, queue_id + NEXT_SEQS)
        self.set_enqueuers(queue_id, {})

    def enqueuers(self, queue_id: int) -> dict[int, int]:
        """A replica's enqueuers as last staged: enqueuer -> its next publish seq."""
        return {enqueuer: seq for enqueuer, (_slot, seq) in self._slots(queue_id).items()}

    def set_enqueuers(self, queue_id: int, enqueuers: dict[int, int]) -> None:
        """A replica's enqueuers become ``enqueuers``, committed with the entries staged before: only those that
        changed are written (a few per commit), each in a slot of its own while it is kept."""
        slots = self._slots(queue_id)
        for enqueuer in [enqueuer for enqueuer in slots if enqueuer not in enqueuers]:
            key = KEY.pack(ENQUEUERS, queue_id << 32 | slots.pop(enqueuer)[0])
            self._updates.pop(key, None)
            self._deletes[key] = None
        used: set[int] | None = None
        for enqueuer, seq in enqueuers.items():
            known = slots.get(enqueuer)
            if known is not None and known[1] == seq:
                continue
            if known is not None:
                slot = known[0]
            else:
                used = used if used is not None else {slot for slot, _seq in slots.values()}
                slot = next(slot for slot in itertools.count() if slot not in used)
                used.add(slot)
            slots[enqueuer] = (slot, seq)
            # (an update: written over in place, after the deletes, counted in no totals)
            self._updates[KEY.pack(ENQUEUERS, queue_id << 32 | slot)] = VALUE.pack(enqueuer, seq, 0, 0)

    def _slots(self, queue_id: int) -> dict[int, tuple[int, int]]:
        slots = self._enqueuers.get(queue_id)
        if slots is None:  # (none staged: they are staged only once read here)
            slots = self._enqueuers[queue_id] = {
                enqueuer: (seq & 0xFFFFFFFF, publish)
                for seq, (enqueuer, publish, _size, _flags) in self._numbered(ENQUEUERS, queue_id)}
        return slots

    def put_mark(self, queue_id: int, number: int, first: int, ms: int, size: int, flags: int) -> None:
        """A stream's run, committed with the entries staged with it (as an earlier version kept streams)."""
        self._puts[KEY.pack(MARKS, queue_id << 32 | number)] = VALUE.pack(first, ms, min(size, 0xFFFFFFFF), flags)

    def marks(self, queue_id: int) -> list[tuple[int, int, int, int, int]]:
        """A stream's runs, in order: (number, first offset, publish ms, bytes, flags)."""
        self.commit()
        return [(seq & 0xFFFFFFFF, first, ms, size, flags)
                for seq, (first, ms, size, flags) in self._numbered(MARKS, queue_id)]

    def mark_dropped(self, queue_id: int, start: int, end: int) -> int:
        """The queue's entries with ``start <= key < end`` left it, though they are still here until ``take``
        deletes them: a start before then deletes them first (``dropped``).  Committed at once, with the changes
        staged before it (durable at the next ``sync``); returns the mark's number, which ``forget_dropped``
        takes once they are gone."""
        number = next(self._drop_marks) & 0xFFFFFFFF
        self._puts[KEY.pack(DROPS, queue_id << 32 | number)] = VALUE.pack(start, min(end, 2 ** 64 - 1), 0, 0)
        self.commit()
        return number

    def dropped(self, queue_id: int) -> list[tuple[int, int, int]]:
        """The queue's drop marks, staged ones committed first: (number, start, end)."""
        self.commit()
        return [(number, start, end) for _queue, number, start, end in self._drop_marks_of(queue_id)]

    def forget_dropped(self, queue_id: int, numbers: Iterable[int]) -> None:
        for number in numbers:
            self.ack(DROPS, queue_id << 32 | number)

    def _drop_marks_of(self, queue_id: int | None) -> list[tuple[int, int, int, int]]:
        """Committed drop marks, a queue's or (None) every queue's: (queue id, number, start, end)."""
        return [(seq >> 32, seq & 0xFFFFFFFF, start, end) for seq, (start, end, _size, _flags)
                in self._numbered(DROPS, queue_id)]

    def _numbered(self, reserved: int, queue_id: int | None) -> list[tuple[int, tuple[int, int, int, int]]]:
        """The committed rows of a reserved id numbered per queue (seq = queue id << 32 | number), a queue's or
        (None) every queue's: (seq, value's fields); a cursor bounded to them, whatever sorts after."""
        if queue_id is None:
            lo, hi = KEY.pack(reserved, 0), (reserved + 1).to_bytes(4, "big")
        else:
            lo, hi = KEY.pack(reserved, queue_id << 32), KEY.pack(reserved, (queue_id + 1) << 32)
        found = []
        with self._env.begin() as txn:
            cursor = txn.cursor()
            more = cursor.set_range(lo)
            while more and cursor.key() < hi:
                found.append((KEY.unpack(cursor.key())[1], VALUE.unpack(cursor.value())))
                more = cursor.next()
        return found

    @property
    def pending(self) -> bool:
        return bool(self._puts or self._updates or self._deletes or self._counts_staged)

    def commit(self) -> None:
        """Apply the staged changes in one transaction (durable after the next ``sync``)."""
        if not (self._puts or self._updates or self._deletes or self._counts_staged):
            return
        if self._before_commit is not None:
            self._before_commit()
        puts, updates, deletes = self._puts, self._updates, list(self._deletes)
        changes: dict[bytes, list[int]] = {}
        with self._env.begin(write=True) as txn:
            if deletes:
                removed = list(map(txn.pop, deletes))  # None where nothing was there
                _account(changes, list(itertools.compress(deletes, removed)), list(filter(None, removed)), -1)
            items = sorted(puts.items())
            if items and txn.cursor().putmulti(items, overwrite=False)[1] == len(items):
                keys, values = zip(*items)
                _account(changes, keys, values, 1)
            else:  # some key was on disk already: count what each put replaced
                for key, value in items:
                    old = txn.replace(key, value)
                    if old is not None and old != value:
                        _account(changes, [key], [old], -1)
                    _account(changes, [key], [value], 1)
            if updates:
                txn.cursor().putmulti(sorted(updates.items()))
            for key, count in self._counts_staged.items():  # (counted in no totals, as the updates)
                if count is None:
                    txn.delete(COUNT_KEY.pack(COUNTS, key))
                else:
                    txn.put(COUNT_KEY.pack(COUNTS, key), COUNT.pack(count))
            for prefix, change in changes.items():
                current = txn.get(prefix)
                totals = TOTALS.unpack(current) if current is not None else (0, 0, 0, 0)
                totals = tuple(max(0, t + c) for t, c in zip(totals, change))
                if totals[0]:
                    txn.put(prefix, TOTALS.pack(*totals))
                else:  # no entry left: no totals either, so queue_ids names only queues with entries
                    txn.delete(prefix)
        # only now: a transaction the disk refused leaves them staged, for the group commit to try again
        self._puts, self._updates, self._deletes, self._counts_staged = {}, {}, {}, {}

    def sync(self) -> None:
        self._synced = sync(self._env, self._synced)

    def entries(self, queue_id: int, start: int = 0) -> Iterator[IndexEntry]:
        """A queue's committed entries with ``seq >= start``, in order."""
        prefix = queue_id.to_bytes(4, "big")
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(KEY.pack(queue_id, start)):
                return
            key_unpack, value_unpack = KEY.unpack, VALUE.unpack
            for key, value in cursor:
                if key[:4] != prefix:
                    break
                yield self._returns(key, _row(key_unpack(key)[1], *value_unpack(value)))

    def columns(self, queue_id: int, batch: int = 65536,
                start: int = 0) -> Iterator[tuple["np.ndarray", "np.ndarray"]]:
        """A queue's committed entries from ``seq >= start`` as arrays, ``batch`` at a time: seqs, and values
        with fields ``msg_id``, ``expiry``, ``size``, ``flags`` (a restart walks a deep queue this way)."""
        while True:
            keys, values = self._walk(queue_id, start, batch)
            if not keys:
                return
            seqs, rows = as_columns(keys, values)
            yield seqs, rows
            if len(seqs) < batch:
                return
            start = int(seqs[-1]) + 1

    def values(self, queue_id: int, count: int, batch: int = 65536) -> Iterator["np.ndarray"]:
        """The values of a queue's committed entries (``columns`` without the seqs, a third cheaper), taking
        its totals' ``count`` as where they end.  The totals change with the entries, so they agree; should
        they not, the rest is walked with its keys (never an entry of another queue is given, none of this
        queue's is left out)."""
        prefix = queue_id.to_bytes(4, "big")
        last_good = None
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(KEY.pack(queue_id, 0)):
                return
            rows = cursor.iternext(keys=False, values=True)
            read = 0
            while read < count:
                wanted = min(batch, count - read)
                values = b"".join(itertools.islice(rows, wanted))
                key = cursor.key()
                if len(values) != wanted * VALUE.size or key[:4] != prefix or len(key) != KEY.size:
                    break
                yield np.frombuffer(values, dtype=VALUE_DTYPE)
                last_good, read = key, read + wanted
            else:
                if not cursor.next() or cursor.key()[:4] != prefix:
                    return
        log.warning("queue index %d: its totals do not match its entries; walking them", queue_id)
        start = KEY.unpack(last_good)[1] + 1 if last_good is not None else 0
        for _seqs, walked in self.columns(queue_id, batch, start):
            yield walked

    def read(self, queue_id: int, start: int, limit: int) -> list[IndexEntry]:
        """Up to ``limit`` entries from ``seq >= start`` on, staged changes included (they are committed
        first: durable only after the next ``sync``, as any commit)."""
        self.commit()
        keys, values = self._walk(queue_id, start, limit)
        rows = [_row(seq, *value) for (_queue, seq), value in zip(KEY.iter_unpack(keys), VALUE.iter_unpack(values))]
        if self._counts:
            rows = [self._returns(KEY.pack(queue_id, row.seq), row) for row in rows]
        return rows

    def _walk(self, queue_id: int, start: int, limit: int) -> tuple[bytes, bytes]:
        return walk(self._env, queue_id, start, limit)

    @property
    def path(self) -> str:
        """The index's directory, for a reader in another process (``open_reader``, ``walk``)."""
        return self._env.path()

    def take(self, queue_id: int, start: int, end: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Delete up to ``limit`` entries with ``start <= seq < end`` (staged changes committed first) and
        return them as ``as_columns`` does, so the caller can release what they held: purge, commit and
        deletion a batch at a time, as arrays."""
        self.commit()
        keys, values = self._walk(queue_id, start, limit)
        seqs, rows = as_columns(keys, values)
        below = _count_below(seqs, end)
        if below:
            self._deletes.update(dict.fromkeys(keys[at:at + KEY.size] for at in range(0, below * KEY.size, KEY.size)))
            if self._counts:
                lo, hi = keys[:KEY.size], keys[(below - 1) * KEY.size:below * KEY.size]
                for key in [key for key in self._counts if lo <= key <= hi]:
                    self._uncount(key)
            self.commit()
        return seqs[:below], rows[:below]

    def tally(self, queue_id: int, start: int, end: int, limit: int) -> tuple[int, int, int | None]:
        """How many of the first ``limit`` entries from ``seq >= start`` lie below ``end``, their sizes' sum, and
        the seq to go on from (None: no entry is left below ``end``): a range counted a batch at a time,
        without a row made per entry."""
        self.commit()
        keys, values = self._walk(queue_id, start, limit)
        seqs, rows = as_columns(keys, values)
        below = _count_below(seqs, end)
        following = int(seqs[-1]) + 1 if below == limit else None
        return below, int(rows["size"][:below].sum()), following

    def get(self, queue_id: int, seq: int) -> IndexEntry | None:
        self.commit()
        key = KEY.pack(queue_id, seq)
        with self._env.begin() as txn:
            value = txn.get(key)
        return self._returns(key, _entry(key, value)) if value is not None else None

    def totals(self, queue_id: int) -> Totals | None:
        """The queue's committed totals; None if the index has none for it (a queue from before they were
        kept has entries but no totals: ``recount`` makes them)."""
        with self._env.begin() as txn:
            value = txn.get(queue_id.to_bytes(4, "big"))
        return Totals(*TOTALS.unpack(value)) if value is not None else None

    def recount(self, queue_id: int) -> Totals:
        """Count the queue's entries and store the totals."""
        totals = [0, 0, 0, 0]
        for _seqs, values in self.columns(queue_id):
            totals[0] += len(values)
            totals[1] += int(values["size"].sum())
            totals[2] += int(np.count_nonzero(values["expiry"]))
            totals[3] += int(np.count_nonzero(values["flags"] & FLAG_TRANSIENT))
        if totals[0]:
            with self._env.begin(write=True) as txn:
                txn.put(queue_id.to_bytes(4, "big"), TOTALS.pack(*totals))
        return Totals(*totals)

    def last_seq(self, queue_id: int, below: int | None = None) -> int | None:
        """The highest committed seq of the queue (under ``below``), None if it has no entry."""
        with self._env.begin() as txn:
            cursor = txn.cursor()
            upper: bytes | None
            if below is not None:
                upper = KEY.pack(queue_id, below)
            else:
                upper = (queue_id + 1).to_bytes(4, "big") if queue_id < 0xFFFFFFFF else None
            if upper is None or not cursor.set_range(upper):
                if not cursor.last():
                    return None
            elif not cursor.prev():
                return None
            key = cursor.key()
            if key[:4] != queue_id.to_bytes(4, "big") or len(key) != KEY.size:
                return None
            return KEY.unpack(key)[1]

    def delete_queue(self, queue_id: int) -> None:
        prefix = queue_id.to_bytes(4, "big")
        self._puts = {k: v for k, v in self._puts.items() if k[:4] != prefix}
        self._updates = {k: v for k, v in self._updates.items() if k[:4] != prefix}
        self._deletes = {k: None for k in self._deletes if k[:4] != prefix}
        described = [(KEY.pack(reserved, queue_id << 32), KEY.pack(reserved, (queue_id + 1) << 32))
                     for reserved in (MARKS, DROPS, ENQUEUERS)]  # a stream's runs, drop marks, enqueuers
        self._enqueuers.pop(queue_id, None)
        for key in [key for key in self._counts if key[:4] == prefix]:
            del self._counts[key]
        self._counts_staged = {k: v for k, v in self._counts_staged.items() if k[:4] != prefix}
        described.append((COUNT_KEY.pack(COUNTS, KEY.pack(queue_id, 0)), (COUNTS + 1).to_bytes(4, "big")
                          if queue_id == 0xFFFFFFFF else COUNT_KEY.pack(COUNTS, KEY.pack(queue_id + 1, 0))))
        self._puts = {k: v for k, v in self._puts.items() if not any(lo <= k < hi for lo, hi in described)}
        self._updates = {k: v for k, v in self._updates.items() if not any(lo <= k < hi for lo, hi in described)}
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(prefix):
                while cursor.key()[:4] == prefix:
                    if not cursor.delete():
                        break
            for lo, hi in described:
                if cursor.set_range(lo):
                    while lo <= cursor.key() < hi:
                        if not cursor.delete():
                            break

    def queue_ids(self) -> set[int]:
        """Every queue id with entries or drop marks on disk (so the orphans of deleted queues can be
        dropped); not the reserved ids."""
        ids: set[int] = {queue_id for queue_id, _number, _start, _end in self._drop_marks_of(None)}
        with self._env.begin() as txn:
            cursor = txn.cursor()
            more = cursor.first()
            while more:
                queue_id = int.from_bytes(cursor.key()[:4], "big")
                if queue_id not in RESERVED:
                    ids.add(queue_id)
                more = cursor.set_range((queue_id + 1).to_bytes(4, "big")) if queue_id < 0xFFFFFFFF else False
        return ids


def walk(env: "lmdb.Environment", queue_id: int, start: int, limit: int) -> tuple[bytes, bytes]:
    """The keys and the values of up to ``limit`` committed entries from ``seq >= start``, each joined, without a
    (key, value) pair made per entry: a cursor walks the values, and when the entries it walked have every seq
    from the first to the last (a backlog's mostly do) their keys are made as an array, not walked; else
    another cursor walks the keys.  ``env`` may be this process's index or another's (``open_reader``)."""
    upper = (queue_id + 1).to_bytes(4, "big") if queue_id < 0xFFFFFFFF else b"\xff" * (KEY.size + 1)
    first = KEY.pack(queue_id, start)
    with env.begin() as txn:
        value_cursor = txn.cursor()
        if limit < 1 or not value_cursor.set_range(first) or value_cursor.key() >= upper:
            return b"", b""
        first_seq = KEY.unpack(value_cursor.key())[1]
        probe = txn.cursor()  # the last key before seq first + limit, and whether the queue has more after it
        found = probe.set_range(KEY.pack(queue_id, min(first_seq + limit, 2 ** 64 - 1)))
        more = found and probe.key() < upper
        if found:
            probe.prev()
        else:
            probe.last()
        last = probe.key()
        span = KEY.unpack(last)[1] - first_seq + 1  # entries from the first to the last, if no seq is missing
        rows = value_cursor.iternext(keys=False, values=True)
        values = list(itertools.islice(rows, span))
        if len(values) == span and value_cursor.key() == last and (span == limit or not more):
            return _keys(queue_id, first_seq, span), b"".join(values)
        key_cursor = txn.cursor()
        key_cursor.set_range(first)
        keys = list(itertools.islice(key_cursor.iternext(keys=True, values=False), limit))
        end = bisect.bisect_left(keys, upper)
        values.extend(itertools.islice(rows, max(0, end - len(values))))
        return b"".join(keys[:end]), b"".join(values[:end])


def _keys(queue_id: int, first_seq: int, count: int) -> bytes:
    """The keys of the queue's entries ``first_seq`` to ``first_seq + count - 1``, joined."""
    keys = np.empty(count, KEY_DTYPE)
    keys["queue"] = queue_id
    keys["seq"] = np.arange(first_seq, first_seq + count, dtype=np.uint64)
    return keys.tobytes()


def as_columns(keys: bytes, values: bytes) -> tuple["np.ndarray", "np.ndarray"]:
    """``walk``'s bytes as arrays: seqs, and values with fields ``msg_id``, ``expiry``, ``size``, ``flags``."""
    return np.frombuffer(keys, dtype=KEY_DTYPE)["seq"], np.frombuffer(values, dtype=VALUE_DTYPE)


@dataclass
class IndexRows:
    """Walked entries as native, contiguous arrays (``as_rows``), for work on many at a time: the big-endian
    fields of ``as_columns`` are read through a byte swap at every step."""

    seqs: "np.ndarray"  # int64
    msg_ids: "np.ndarray"  # int64
    expiry: "np.ndarray"  # int64, ms; 0: none
    sizes: "np.ndarray"  # uint32
    flags: "np.ndarray"  # uint8

    DTYPES = {"seqs": np.int64, "msg_ids": np.int64, "expiry": np.int64, "sizes": np.uint32, "flags": np.uint8}

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, rows: "slice | np.ndarray") -> "IndexRows":
        """The rows at ``rows`` (a slice: views, no copy)."""
        return IndexRows(*(getattr(self, name)[rows] for name in self.DTYPES))

    @classmethod
    def empty(cls) -> "IndexRows":
        return cls(*(np.zeros(0, kind) for kind in cls.DTYPES.values()))


def as_rows(keys: bytes, values: bytes) -> IndexRows:
    """``walk``'s bytes as ``IndexRows``."""
    seqs, rows = as_columns(keys, values)
    return IndexRows(seqs.astype(np.int64), rows["msg_id"].astype(np.int64), rows["expiry"].astype(np.int64),
                     rows["size"].astype(np.uint32), rows["flags"].copy())


def _count_below(seqs: "np.ndarray", end: int) -> int:
    """How many of the walked ``seqs`` (in order) are below ``end`` (compared as uint64, not as a float: keys use
    all 64 bits)."""
    return int(np.searchsorted(seqs, np.uint64(min(end, 2 ** 64 - 1))))


def open_reader(path: str) -> "lmdb.Environment":
    """An index another process writes, opened to read (LMDB readers never block its writer)."""
    return lmdb.open(path, readonly=True, lock=True, max_dbs=0, readahead=False)


def _account(changes: dict[bytes, list[int]], keys: Sequence[bytes], values: Sequence[bytes], sign: int) -> None:
    """Add (sign 1) or take (-1) entries' weight to their queues' changes of totals: in Python for a few, as
    arrays for a batch (a busy queue commits hundreds of entries at a time)."""
    if len(keys) >= ARRAY_ACCOUNTING:
        entries = np.frombuffer(b"".join(values), dtype=VALUE_DTYPE)
        queues = np.frombuffer(b"".join(keys), dtype=KEY_DTYPE)["queue"]
        if (queues == queues[0]).all():  # one queue: no grouping
            change = changes.setdefault(keys[0][:4], [0, 0, 0, 0])
            for field, amount in enumerate((len(entries), int(entries["size"].sum()),
                                            int(np.count_nonzero(entries["expiry"])),
                                            int(np.count_nonzero(entries["flags"] & FLAG_TRANSIENT)))):
                change[field] += sign * amount
            return
        ids, which = np.unique(queues, return_inverse=True)
        columns = (np.bincount(which), np.bincount(which, entries["size"]),
                   np.bincount(which, entries["expiry"] != 0),
                   np.bincount(which, (entries["flags"] & FLAG_TRANSIENT) != 0))
        for i, queue_id in enumerate(ids.tolist()):
            change = changes.setdefault(queue_id.to_bytes(4, "big"), [0, 0, 0, 0])
            for field, column in enumerate(columns):
                change[field] += sign * int(column[i])
        return
    unpack = VALUE.unpack
    for key, value in zip(keys, values):
        found = changes.get(key[:4])
        if found is None:
            found = changes[key[:4]] = [0, 0, 0, 0]
        change = found
        _msg_id, expiry, size, flags = unpack(value)
        change[0] += sign
        change[1] += sign * size
        if expiry:
            change[2] += sign
        if flags & FLAG_TRANSIENT:
            change[3] += sign
