"""The Spark bridge's commit, a service on the broker: it removes a queue's ready entries below an offset.  The
offsets a durable queue keeps across restarts are the broker's (``Queues.save_offsets``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..queues.paging import paced
from ..queues.queue import LocalQueue

if TYPE_CHECKING:
    from ..broker import Broker


class Commit:
    """The Spark bridge's commit on ``broker``'s queues."""

    def __init__(self, broker: Broker) -> None:
        self.queues = broker.queues

    async def commit_offset(self, queue: LocalQueue, offset: int) -> int:
        """Remove the queue's ready entries below ``offset`` (idempotent, monotonic): the Spark bridge's commit.

        A durable queue's commit cursor is saved with its offsets' ceiling (here, at shutdown, and when a reader
        is shown offsets above the ceiling: ``Queues.reserve_offsets``), so after a restart, ``kill -9`` included,
        offsets carry on above every offset a reader has seen, even when the entries at the tail were transient
        or removed.  The entries on disk leave once counted (at once when
        every one is below ``offset``, else a batch per loop turn: ``Queue.count_committed``); their index rows
        go in the background, named meanwhile by a drop mark in the queue index, which a restart drops first.
        Answers with how many were removed.
        """
        counted = queue.committed_drops
        removed = queue.remove_upto(offset)
        if queue.persistence is not None:
            self.queues.save_offsets(queue)
        await paced(queue.count_committed)
        return removed + queue.committed_drops - counted
