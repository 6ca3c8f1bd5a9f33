"""The Spark bridge's commit, a broker operation (a part of :class:`~amqp_server.broker.Broker`): it removes a
queue's ready entries below an offset, and saves the offsets a durable queue keeps across restarts.
"""
from __future__ import annotations

from ..broker.core import BrokerCore
from ..paging import paced
from ..queue import Queue


class Offsets(BrokerCore):
    """The Spark bridge's commit and the offsets durable queues keep."""

    async def commit_offset(self, queue: Queue, offset: int) -> int:
        """Remove the queue's ready entries below ``offset`` (idempotent, monotonic): the Spark bridge's commit.

        A durable queue's offset high-water mark and commit cursor are saved (here and at shutdown), so
        after a restart offsets carry on above every offset a reader has seen, even when the entries
        at the tail were transient or removed.  The entries on disk leave once counted (at once when
        every one is below ``offset``, else a batch per loop turn: ``Queue.count_committed``); their index rows
        go in the background, named meanwhile by a drop mark in the queue index, which a restart drops first.
        Answers with how many were removed.
        """
        counted = queue.committed_drops
        removed = queue.remove_upto(offset)
        if queue.persistence is not None:
            self._save_offsets(queue)
        await paced(queue.count_committed)
        return removed + queue.committed_drops - counted

    def _save_offsets(self, queue: Queue) -> None:
        self.store.put("queue_offsets", str(queue.index_id), {"next_seq": queue.next_seq, "committed": queue.committed})
