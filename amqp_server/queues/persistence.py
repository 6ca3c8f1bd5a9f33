"""Durable messages: the persistent message store, the queue index, and group commit.

A persistent message routed to a durable queue is written to the store once
(reference counted per queue) and gets one index entry per queue.  Writes
staged during one event-loop turn are flushed together, and a single fsync of
the touched segment files plus one LMDB sync — run in a worker thread so the
loop keeps serving — makes the whole batch durable.  Channels waiting to
confirm publishes are told which batch became durable.

This is what every durable queue shares.  What one type keeps apart is its type's storage, built with the broker
and handed to its queues: a priority queue's rows keyed by level (``priority_queue.RankedRows``), the quorum
queues' copies (``replica_store.ReplicaStore``), the streams' logs (``stream_log.log.StreamLogs``, a journal of the
group commit here).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, AbstractSet, Callable, Iterable, Iterator, Protocol, Sequence

import lmdb
import numpy as np
from msg_store import DEFAULT_CACHE_BYTES, DEFAULT_SEGMENT_SIZE, MessageStore
from msg_store.store import SPARE_LIFE
from queue_index import FLAG_TRANSIENT, QueueIndex, Totals

from ..logs import Throttle
from ..message import RELEASE_FROM, Message

if TYPE_CHECKING:
    from msg_store.segment import Segment

    from .ready import Entry

log = logging.getLogger("warren.persistence")
_refused = Throttle(log, burst=1, interval=10.0)  # a full disk refuses every retry: said once in a while

COMPACTION_INTERVAL = 0.05
WRITE_RETRY = 1.0  # seconds before a group commit whose writes the disk refused (full, for one) is tried again
COMPACTION_QUIET = 1.0  # a segment consumers are emptying is left to die whole rather than copied


class SyncWaiter(Protocol):
    def synced(self, batch: int) -> None: ...

    def refused(self, batch: int) -> None:
        """Group commit ``batch`` failed, or came after one that did: what waited for it (or before) is refused."""


class RecoveredQueue(Protocol):
    """A durable queue as its recovery sees it: its id in the queue index, and the totals it takes back."""

    index_id: int

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None: ...


class StoredQueue(RecoveredQueue, Protocol):
    """A durable queue whose entries are rows of the queue index: where an entry is keyed there (its type's
    storage asks, if it keys otherwise than by seq)."""

    def row_key(self, entry: Entry) -> int: ...


class QueueRows(Protocol):
    """Where a durable queue's entries are written in the queue index, keyed as its type keys them: by seq
    (``Persistence`` itself) or by level, then seq (a priority queue's ``priority_queue.RankedRows``)."""

    def write(self, queue: StoredQueue, entry: Entry) -> None: ...

    def delivered(self, queue: StoredQueue, entry: Entry, returns: int = 0) -> None: ...

    def remove(self, queue: StoredQueue, entry: Entry) -> None: ...


class Journal(Protocol):
    """Another store made durable by the same group commit as the queue index (the delayed-message schedule,
    the streams' logs): its writes are taken on the loop as a commit begins, and synced off it."""

    def commit(self) -> None: ...

    def sync(self) -> None: ...


class Persistence:
    def __init__(self, data_dir: str, segment_size: int = DEFAULT_SEGMENT_SIZE, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 compaction_threshold: float = 0.5) -> None:
        self.store = MessageStore(os.path.join(data_dir, "msg_store_persistent"), segment_size, cache_bytes,
                                  compaction_threshold, compaction_quiet=COMPACTION_QUIET, sidecars=True)
        self.index = QueueIndex(os.path.join(data_dir, "queue_index"), before_commit=self._before_commit)
        self.batch = 1  # the commit that will cover what is staged now
        self.synced = 0  # the last commit known durable
        self._scheduled = False
        self._syncing = False
        self._dirty = False
        self.waiters: set[SyncWaiter] = set()
        # what stages, a loop turn late, changes that go with rows staged now (a quorum leader's position): done
        # before any commit of the index, which must never hold the rows without them (``_before_commit``)
        self.due: set[Callable[[], None]] = set()
        self.journals: list[Journal] = []
        self.claims: list[Callable[[MessageStore], None]] = []  # what takes back its store references at recovery
        self.recovered: list[Callable[[], None]] = []  # what waits for the store's recovery (a stream's old entries)
        self.lost_copies: set[int] = set()  # replicas whose entries lost their message at recovery (``recover``)
        self._compactor: asyncio.TimerHandle | None = None
        self._spares_expire: asyncio.TimerHandle | None = None  # a commit, later, to remove spares left unused
        self.loop = asyncio.get_running_loop()
        self._fsyncer = ThreadPoolExecutor(1, "group-commit")  # one fsync at a time, off the loop
        self._fsyncing: Future | None = None  # the one under way: close waits for it before closing the files
        self._closed = False
        self.failed = False  # a group commit failed: nothing is confirmed again (``_committed``)

    # -- writes -------------------------------------------------------------------------------

    def write(self, queue: StoredQueue, entry: Entry) -> None:
        """Store a persistent message for a durable queue (once per message) and index the entry by its seq."""
        message = entry.message
        self.keep(message)
        self.index.publish(queue.index_id, entry.seq, message.msg_id, entry.expiry, len(message.body))

    def keep(self, message: Message) -> None:
        """Take a reference to the message in the store, writing it there the first time, or again if its record
        went with the last reference: a queue the same publish reached first may have let its copy go at once
        (an auto-ack consumer took it, TTL 0, drop-head)."""
        store = self.store
        msg_id = message.msg_id
        if msg_id and msg_id in store:
            store.add_ref(msg_id)
        else:
            message.msg_id = store.new_id()
            store.write(message.msg_id, message.payload(), 1)
        self.stage()

    def release(self, message: Message) -> None:
        """Drop a reference taken with ``keep``.  If it was the last, the message lives on in memory only
        (held by transient queues), so it forgets its msg_id: nothing may load it from the store again."""
        msg_id = message.msg_id
        if self.store.refs(msg_id) <= 1:
            message.msg_id = 0
        self.store.remove(msg_id)
        self.stage()

    def delivered(self, queue: StoredQueue, entry: Entry, returns: int = 0) -> None:
        """The entry went to a consumer that must ack it (``returns``: the times it came back before)."""
        message = entry.message
        self.index.delivered(queue.index_id, entry.seq, message.msg_id, entry.expiry, message.body_size,
                             returns=returns)
        self.stage()

    def remove(self, queue: StoredQueue, entry: Entry) -> None:
        self.index.ack(queue.index_id, entry.seq)
        self.store.remove(entry.message.msg_id)
        self.stage()

    def drop(self, queue_id: int, runs: list[tuple[int, int]]) -> None:
        """The queue's entries with keys in ``runs`` (``[start, end)``) go, with their store references, a batch
        at a time."""
        for start, end in runs:
            for _seqs, rows in self._take(queue_id, start, end):
                self.store.remove_many(rows["msg_id"])
        self.stage()

    def _take(self, queue_id: int, start: int, end: int) -> Iterator[tuple["np.ndarray", "np.ndarray"]]:
        """Delete the queue's entries with ``start <= key < end``, yielding them a batch at a time."""
        while len((taken := self.index.take(queue_id, start, end, 65536))[0]):
            yield taken
            start = int(taken[0][-1]) + 1

    def delete_queue(self, queue: StoredQueue) -> None:
        """The queue's index entries go (its ready entries' references were released as it purged)."""
        self.index.delete_queue(queue.index_id)
        self.stage()

    def load_body(self, message: Message) -> None:
        """Fill a recovered message's route, header and body from the store.  A large body (one its queue leaves
        to the store, ``RELEASE_FROM``) is read apart from the rest, into its own bytes, and not kept in the
        read cache: a dead-lettering of many such bodies held four in the cache and a copy of each."""
        if message.body_size < RELEASE_FROM:
            message.fill_from(self.store.read(message.msg_id))
            return
        self.load_head(message)
        message.body = self.store.read_tail(message.msg_id, message.body_size)

    def records(self, msg_ids: list[int]) -> list[bytes | None]:
        """The store's records of stored messages (what ``load_body`` fills them from), read a run of neighbours
        at a time and left out of the messages and the read cache; None for one the store lacks."""
        return self.store.read_many(msg_ids, sys.maxsize)

    def load_head(self, message: Message) -> None:
        """Fill a recovered message's route and header from the store, its body left there (to be sent from
        its file: ``body_file``)."""
        message.fill_head_from(self.store.read_head(message.msg_id, message.body_size))

    def body_head(self, message: Message, size: int | None = None) -> bytes | None:
        """The first ``size`` bytes (all by default) of the body of ``message``, which the store holds and the
        message does not, read from the store that much only; None if the store has no such record."""
        if message.msg_id not in self.store:
            return None
        return self.store.read_tail(message.msg_id, message.body_size, size)

    def body_file(self, message: Message) -> tuple[int, int, Segment] | None:
        """Where the stored body of ``message`` lies, to be sent from its file: a descriptor of the caller's own
        (``MessageStore.open_payload``: the caller closes it and tells the segment, its loan), the body's offset
        there (the body ends the record) and the segment; None if it is not in a file."""
        found = self.store.open_payload(message.msg_id)
        if found is None:
            return None
        fd, offset, size, segment = found
        return fd, offset + size - message.body_size, segment

    # -- group commit -------------------------------------------------------------------------

    @property
    def staged(self) -> bool:
        """Changes wait for a group commit: batch number ``batch`` will make them durable."""
        return self._dirty

    def stage(self) -> None:
        """Something written waits for the next group commit (what the store and the index hold, a journal's)."""
        self._dirty = True
        if not self._scheduled and not self._syncing:
            self._scheduled = True
            self.loop.call_soon(self._commit)

    def _before_commit(self) -> None:
        """Before any commit of the index, whoever makes it: what is ``due`` is staged, and the store hands its
        buffered records to the operating system — an entry must never be on disk without its message, nor a
        quorum leader's rows without the position that covers them (killed between two commits, its copy came
        back with entries of ops past its position, which no other copy had; adopted at that position by the
        next leader, it kept them in place of that leader's own)."""
        while self.due:
            self.due.pop()()
        self.store.flush()

    def _commit(self) -> None:
        self._scheduled = False
        if not self._dirty or self._closed:
            return
        try:
            self.store.flush()
            self.index.commit()  # before the journals: a crash in between repeats a delayed message, never loses it
            for journal in self.journals:
                journal.commit()
        except (OSError, lmdb.Error) as exc:  # the disk refused a write: what it was to hold stays staged
            _refused.warning("group commit %d not written: %s; tried again every %ss", self.batch, exc, WRITE_RETRY)
            self._scheduled = True
            self.loop.call_later(WRITE_RETRY, self._commit)
            return
        self._dirty = False
        sealed = self.store.take_sealed()
        doomed = self.store.take_doomed()
        fds = self.store.dirty_fds()
        batch = self.batch
        self.batch += 1
        self._syncing = True
        self._fsyncing = self._fsyncer.submit(self._fsync, fds, sealed, doomed)
        asyncio.wrap_future(self._fsyncing, loop=self.loop).add_done_callback(lambda f: self._committed(batch, f))
        if self.store.needs_compaction and self._compactor is None:
            self._compactor = self.loop.call_later(COMPACTION_INTERVAL, self._compact)

    def _fsync(self, fds: list[int], sealed: list, doomed: list[Segment]) -> None:
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError as exc:  # a segment closed meanwhile (by a compaction's own sync): nothing to keep
                if exc.errno != errno.EBADF:  # (an I/O error is the disk's: the commit fails)
                    raise
                log.debug("fsync skipped: %s", exc)
        self.store.write_sidecars(sealed)  # full segments, synced just now
        self.index.sync()
        for journal in self.journals:
            journal.sync()
        # segments deleted before the commit began (their fds are not among ``fds``), once the removals that
        # deleted them are durable: a file kept as a spare is written again at once (``MessageStore.unlink``)
        self.store.unlink(doomed)

    def _committed(self, batch: int, future: asyncio.Future) -> None:
        """A group commit is durable: its waiters are confirmed, and so on for every later one — unless one
        failed.  Then nothing is confirmed again: a later commit's fsync need not cover the failed one's writes
        (after an I/O error the kernel may have dropped its dirty pages, and a retried fsync succeeds), and a
        confirm promises the data is on disk; as RabbitMQ's message store crashes, the node must be restarted.  What
        waited is refused meanwhile (a publish nacked), as RabbitMQ's channel rejects the publishes a queue that
        crashed had not confirmed (``rabbit_classic_queue:handle_event``, down)."""
        self._syncing = False
        if future.exception() is not None:
            self.failed = True
            log.critical("group commit %d failed: %s; nothing more is confirmed until the node restarts", batch,
                         future.exception())
        if self.failed:
            for waiter in list(self.waiters):
                waiter.refused(batch)
        else:
            self.synced = batch
            for waiter in list(self.waiters):
                waiter.synced(batch)
        if self._dirty:
            self._scheduled = True
            self.loop.call_soon(self._commit)
        elif self.store.has_spares and self._spares_expire is None:  # the store may have gone quiet: its disk back
            self._spares_expire = self.loop.call_later(SPARE_LIFE, self._expire_spares)

    def _expire_spares(self) -> None:
        self._spares_expire = None
        self.stage()  # its take_doomed gives up the spares kept too long

    def _compact(self) -> None:
        self._compactor = None
        if self.store.compact_step():
            self._compactor = self.loop.call_later(COMPACTION_INTERVAL, self._compact)

    def commit_now(self) -> None:
        """Synchronous commit, for shutdown."""
        self.store.sync()
        self.index.commit()
        self.index.sync()
        for journal in self.journals:
            journal.commit()
            journal.sync()

    def close(self) -> None:
        if self._compactor is not None:
            self._compactor.cancel()
        if self._spares_expire is not None:
            self._spares_expire.cancel()
        self._closed = True
        if self._fsyncing is not None:  # its files must stay open until it is done
            wait([self._fsyncing])
        self._fsyncer.shutdown()
        self.commit_now()
        self.store.close()
        self.index.close()

    # -- recovery -----------------------------------------------------------------------------

    def recover(self, queues: Sequence[RecoveredQueue], copies: AbstractSet[int] = frozenset()) -> None:
        """Give each durable queue its totals from the index; its entries stay on disk until they near the
        head.  Entries are walked only where they must be: after a crash (to count the store's references),
        for a queue holding transient entries (dropped: their store is gone) or entries with an expiry (the
        expiry heap must know them)."""
        started = time.monotonic()
        self.store.recover()
        clean = self.store.clean
        known = {queue.index_id for queue in queues} | copies
        for orphan in self.index.queue_ids() - known:
            self.index.delete_queue(orphan)
        held = self._drop_marked([queue.index_id for queue in queues], clean)
        walk = _Walk(self.index, self.store)
        totals_of: dict[int, Totals] = {}
        for queue in queues:
            queue_id = queue.index_id
            totals = totals_of[queue_id] = self.index.totals(queue_id) or self.index.recount(queue_id)
            if totals.count and (not clean or totals.transient or totals.expiring):
                walk.queue(queue_id, totals)
        for queue_id in copies:  # their references count too (their expiries are their leader's business)
            totals = self.index.totals(queue_id) or self.index.recount(queue_id)
            if totals.count and not clean:
                walk.queue(queue_id, totals)
        walk.finish()
        count = 0
        for queue in queues:
            totals = totals_of[queue.index_id]
            if queue.index_id in walk.expiries:
                totals = self.index.totals(queue.index_id) or Totals()
            queue.recover(totals.count, totals.bytes, self.index.last_seq(queue.index_id),
                          walk.expiries.get(queue.index_id, ()))
            count += totals.count
        walked, lost = len(walk.expiries), walk.lost
        self.lost_copies = walk.lost_in & set(copies)  # they hold less than their position says
        for claim in self.claims:
            claim(self.store)
        dead = self.store.finish_recovery()
        if len(held):
            self.store.remove_many(held)
        for release in self.recovered:
            release()
        self.recovered.clear()
        self.index.commit()
        log.info("recovered %d messages in %d durable queues in %.3fs (%s; %d queues walked, %d dead records, "
                 "%d missing)", count, len(queues), time.monotonic() - started,
                 "clean shutdown" if clean else "segments scanned", walked, dead, lost)

    def _drop_marked(self, queue_ids: list[int], clean: bool) -> "np.ndarray":
        """The entries drop marks still name (the node stopped during a purge's deletions) go before anything
        is counted.  Returns the persistent store references they held where a clean shutdown's snapshot
        counted them (after a crash the walk counts references, and finds none of these), for release once
        the store has recovered."""
        held = [np.zeros(0, np.uint64)]
        for queue_id in queue_ids:
            for number, start, end in self.index.dropped(queue_id):
                for _seqs, rows in self._take(queue_id, start, end):
                    if clean:
                        held.append(rows["msg_id"][(rows["flags"] & FLAG_TRANSIENT) == 0])
                self.index.forget_dropped(queue_id, [number])
        return np.concatenate(held)


class _Walk:
    """Recovery's walk over queues' index entries, as arrays: the store's references are claimed a million
    ids at a time across queues (ids of neighbouring queues share the store's chunks), transient entries
    and entries whose message the store lost are dropped, and each queue's (expiry, seq) pairs collected."""

    CLAIM_BATCH = 1 << 20
    READ_BATCH = 1 << 16  # entries read from the index at a time (the +1 that ends a short queue included)

    def __init__(self, index: QueueIndex, store: MessageStore) -> None:
        self.index = index
        self.store = store
        self.expiries: dict[int, list[tuple[int, int]]] = {}
        self.lost = 0
        self.lost_in: set[int] = set()  # queues that lost some
        self._pending: list[tuple[int, "np.ndarray | None", "np.ndarray", "np.ndarray"]] = []
        self._pending_ids = 0

    def queue(self, queue_id: int, totals: Totals) -> None:
        self.expiries[queue_id] = []
        batches: Iterable[tuple[np.ndarray | None, np.ndarray]]
        if totals.transient or totals.expiring:  # seqs are wanted: to drop entries, or for the expiry heap
            batches = self.index.columns(queue_id, min(totals.count + 1, self.READ_BATCH))
        else:  # only a lost message would need its seq: found again below if one is
            batches = ((None, values) for values in self.index.values(queue_id, totals.count, self.READ_BATCH))
        for seqs, values in batches:
            kept = (values["flags"] & FLAG_TRANSIENT) == 0
            self._pending.append((queue_id, seqs, values, kept))
            self._pending_ids += len(values)
            if self._pending_ids >= self.CLAIM_BATCH:
                self._claim()

    def finish(self) -> None:
        self._claim()
        self.index.commit()

    def _claim(self) -> None:
        if not self._pending:
            return
        found_all = self.store.claim_many(np.concatenate([values["msg_id"][kept]
                                                          for _q, _s, values, kept in self._pending]))
        start = 0
        for queue_id, seqs, values, kept in self._pending:
            found = np.zeros(len(values), dtype=bool)
            found[kept] = found_all[start:start + int(kept.sum())]
            start += int(kept.sum())
            lost = int((kept & ~found).sum())
            if lost:
                self.lost += lost
                self.lost_in.add(queue_id)
            if seqs is None:
                if not found.all():
                    self._drop_lost(queue_id, values["msg_id"][~found])
                continue
            for seq in seqs[~found].tolist():  # transient (their store is gone) or lost
                self.index.ack(queue_id, seq)
            expiring = found & (values["expiry"] != 0)
            self.expiries[queue_id].extend(zip(values["expiry"][expiring].tolist(), seqs[expiring].tolist()))
        self._pending = []
        self._pending_ids = 0

    def _drop_lost(self, queue_id: int, msg_ids: "np.ndarray") -> None:
        """Entries whose message the store lost, found by id (a values-only walk has no seqs)."""
        for seqs, values in self.index.columns(queue_id, self.READ_BATCH):
            for seq in seqs[np.isin(values["msg_id"], msg_ids)].tolist():
                self.index.ack(queue_id, seq)
