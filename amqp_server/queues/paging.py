"""Where the transient part of queues' disk tails lives, and paging under memory pressure.

A queue keeps in memory only the head of its ready list (a durable queue its first
``--queue-window`` entries; any queue once memory runs short); the rest is on disk as
queue index entries (:meth:`ReadyList.page_out`, :meth:`ReadyList.page_in`).  A persistent
message of a durable queue is on disk already.  Any other message is written here:
its payload to the transient store (wiped at every start), and, for a non-durable
queue, its entry to the transient queue index (wiped too).  A durable queue's entry
for a transient message goes to the durable index marked transient, and is dropped
at the next start.

Transient store records are reference counted like persistent ones: every queue
entry that names one holds a reference, released when the entry leaves its queue.

The queues that are deep share ``MEMORY_BUDGET`` entries in memory (``window``), so
a thousand deep queues hold no more than one.

A deleted deep queue's entries on disk are dropped in the background (``drop_later``), a batch
of index rows at a time, a pause as long between batches: at once, a backlog of a million held
every other client for seconds.  Its index id is never used again, so its rows may go at any pace; a crash meanwhile
leaves them to recovery, which drops the rows of ids no durable queue has (and the store's
references with them: they are counted from the index after a crash).  A purged deep queue's
entries on disk go the same way: the queue forgets them at once, and drop marks in the index name
them until they are gone, for recovery to drop should the node stop first.  ``close`` finishes
what is left, so a clean shutdown's store snapshot counts no reference of a dropped entry.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from msg_store import MessageStore
from queue_index import QueueIndex

from .ready_list import DROP_BATCH, MIN_WINDOW, PAGED_WINDOW
from ..message import Message

if TYPE_CHECKING:
    from .persistence import Persistence
    from .queue import LocalQueue, Queue

log = logging.getLogger("warren.paging")

MEMORY_BUDGET = 1 << 19  # ready entries in memory across the queues that are deep, at most (~180 MB)
TRANSIENT_CACHE = 8 * 1024 * 1024
TRANSIENT_COMMIT = 8192  # staged transient index entries that make a commit (nothing else drives one)


async def paced(step: Callable[[], bool]) -> None:
    """Call ``step`` until it returns False, after each call pausing as long as it took: work done a batch at a
    time in the background leaves the loop free half the time or more."""
    while True:
        began = time.monotonic()
        if not step():
            return
        await asyncio.sleep(time.monotonic() - began)


@dataclass
class _Drop:
    """What is left to drop of a queue's rows in an index: ``ready`` key ranges, whose rows' store references
    go with them (``release``); then ``then`` (a deleted queue's other rows go, whose references their holders
    release; a purge's or a commit's drop marks are forgotten)."""

    index: QueueIndex
    queue_id: int
    ready: list[tuple[int, int]]
    release: Callable[[np.ndarray], None]
    then: Callable[[], None]

    def step(self) -> bool:
        """Drop one batch; False once nothing is left."""
        while self.ready:
            start, end = self.ready[0]
            seqs, rows = self.index.take(self.queue_id, start, end, DROP_BATCH)
            if len(seqs):
                self.release(rows)
                self.ready[0] = (int(seqs[-1]) + 1, end)
                return True
            self.ready.pop(0)
        self.then()
        return False


class Pager:
    def __init__(self, data_dir: str, segment_size: int, persistence: "Persistence") -> None:
        self.store = MessageStore(os.path.join(data_dir, "msg_store_transient"), segment_size, TRANSIENT_CACHE,
                                  wipe=True)
        self.store.start()
        self.index = QueueIndex(os.path.join(data_dir, "queue_index_transient"), wipe=True,
                                auto_commit=TRANSIENT_COMMIT)
        self.persistence = persistence
        self.paged_out = 0  # bytes of message bodies moved out of memory under pressure, since start
        self._next_page_id = 1
        self._deep: set[Queue] = set()  # queues with part of them on disk (some may have drained: pruned)
        self.share = MEMORY_BUDGET  # what each deep queue may keep in memory at most
        self._drops: deque[_Drop] = deque()
        self._dropping: asyncio.Task | None = None

    def drop_later(self, index: QueueIndex, queue_id: int, ready: list[tuple[int, int]],
                   release: Callable[[np.ndarray], None], then: Callable[[], None]) -> None:
        """Drop a queue's rows in ``index`` with keys in the ``ready`` ranges in the background (see the module's
        docstring), releasing their store references (``release``), then call ``then``.  At once when no event
        loop runs."""
        drop = _Drop(index, queue_id, list(ready), release, then)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            while drop.step():
                pass
            return
        self._drops.append(drop)
        if self._dropping is None or self._dropping.done():
            self._dropping = loop.create_task(self._drop())

    async def _drop(self) -> None:
        def step() -> bool:
            if not self._drops[0].step():
                self._drops.popleft()
            return bool(self._drops)

        await paced(step)

    @property
    def dropping(self) -> bool:
        """Whether deleted queues' rows are still being dropped."""
        return bool(self._drops)

    def finish_drops(self) -> None:
        """Drop what is left now (at shutdown)."""
        if self._dropping is not None:
            self._dropping.cancel()
        while self._drops:
            if not self._drops[0].step():
                self._drops.popleft()

    def deep(self, queue: "Queue") -> None:
        """``queue`` has part of it on disk: the deep queues share ``MEMORY_BUDGET`` entries in memory, so one
        keeps its whole window and a thousand keep a few hundred entries each."""
        if queue not in self._deep:
            self._deep.add(queue)
            self._reshare()

    def shallow(self, queue: "Queue") -> None:
        """``queue`` was deleted (drained ones are found at the next housekeeping)."""
        self._deep.discard(queue)
        self._reshare()

    def _reshare(self) -> None:
        self.share = max(MIN_WINDOW, MEMORY_BUDGET // max(1, len(self._deep)))

    def new_page_id(self) -> int:
        """An id in the transient index for a non-durable queue that pages."""
        page_id = self._next_page_id
        self._next_page_id += 1
        return page_id

    def load_body(self, message: Message) -> None:
        if message.msg_id:
            self.persistence.load_body(message)
        else:
            message.fill_from(self.store.read(message.transient_id))

    def write(self, message: Message) -> int:
        """A new transient store record of the message (one reference); its id."""
        if message.body is None:
            self.load_body(message)
        transient_id = self.store.new_id()
        self.store.write(transient_id, message.payload(), 1)
        return transient_id

    def page_out(self, queues: Iterable["LocalQueue"], keep: int = PAGED_WINDOW) -> int:
        """Memory runs short: every queue keeps its first ``keep`` ready entries in memory, the rest goes to
        disk, those holding the most bodies in memory first (not those whose bodies are in the store already);
        returns bytes of message bodies freed."""
        written: dict[int, tuple[Message, int]] = {}  # a message held by several queues is written once
        freed = sum(queue.page_out(keep, written)
                    for queue in sorted(queues, key=lambda q: q.held_bytes, reverse=True))
        self.store.flush()
        self.index.commit()
        self.paged_out += freed
        if freed:
            log.info("paged out %d bytes of message bodies", freed)
        return freed

    def housekeeping(self) -> None:
        self._deep = {queue for queue in self._deep if queue.paged and not queue.deleted}
        self._reshare()
        self.store.flush()
        self.store.unlink(self.store.take_doomed())  # (files of segments emptied since: nothing is synced here)
        self.index.commit()
        if self.store.needs_compaction:
            self.store.compact_step()

    def close(self) -> None:
        self.finish_drops()
        self.store.close(snapshot=False)  # wiped at the next start anyway
        self.index.close()
