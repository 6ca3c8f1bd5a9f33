"""A group commit whose fsync fails confirms nothing, then or ever after: a later commit's fsync need not cover
the failed one's writes (after an I/O error the kernel may drop the dirty pages, and the next fsync of the file
succeeds), and a confirm says the message is on disk.  Before, the next commit confirmed the failed one's waiters
with its own, and an I/O error on a segment's fsync was taken for a segment closed meanwhile and skipped."""
from __future__ import annotations

import asyncio
import errno
import os

import pytest

from amqp_server.message import Message
from amqp_server.queues import persistence as persistence_module
from amqp_server.queues.persistence import Persistence
from amqp_server.queues.ready import Entry

pytestmark = pytest.mark.timeout(30)


class Stored:
    index_id, ranked = 7, False

    def row_key(self, entry: Entry) -> int:
        return entry.seq

    def recover(self, count: int, size: int, last_seq: int | None, expiries: object) -> None:
        pass


class Waiter:
    def __init__(self) -> None:
        self.batches: list[int] = []

    def synced(self, batch: int) -> None:
        self.batches.append(batch)


async def committed(persistence: Persistence, seq: int) -> int:
    """Write one message, and wait for the group commit it is in to end (well or not); its batch."""
    batch = persistence.batch
    persistence.write(Stored(), Entry(seq, Message("", "q", b"", b"", b"body %d" % seq)))
    while persistence.batch == batch or persistence._syncing:
        await asyncio.sleep(0.01)
    return batch


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC])
async def test_a_failed_group_commit_confirms_nothing_then_or_later(tmp_path, monkeypatch, error):
    persistence = Persistence(str(tmp_path))
    try:
        persistence.recover([Stored()])
        waiter = Waiter()
        persistence.waiters.add(waiter)
        first = await committed(persistence, 0)
        assert waiter.batches == [first] and persistence.synced == first
        fsync = os.fsync

        def failing(fd: int) -> None:
            raise OSError(error, os.strerror(error))

        monkeypatch.setattr(persistence_module.os, "fsync", failing)
        await committed(persistence, 1)
        monkeypatch.setattr(persistence_module.os, "fsync", fsync)
        await committed(persistence, 2)  # its fsync succeeds, but the failed commit's writes may not be on disk
        assert waiter.batches == [first]
        assert persistence.synced == first
    finally:
        persistence.close()
