"""A group commit whose fsync fails confirms nothing, then or ever after: a later commit's fsync need not cover
the failed one's writes (after an I/O error the kernel may drop the dirty pages, and the next fsync of the file
succeeds), and a confirm says the message is on disk.  Before, the next commit confirmed the failed one's waiters
with its own, and an I/O error on a segment's fsync was taken for a segment closed meanwhile and skipped."""
from __future__ import annotations

import asyncio
import errno
import os
from types import SimpleNamespace

import lmdb
import pytest
from msg_store import MessageStore
from msg_store import store as store_module

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
        self.refusals: list[int] = []

    def synced(self, batch: int) -> None:
        self.batches.append(batch)

    def refused(self, batch: int) -> None:
        self.refusals.append(batch)


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


async def settled(persistence: Persistence, waiter: Waiter, within: float) -> None:
    """Wait (up to ``within`` seconds) for the waiter to be told of a batch after the ones it knows."""
    known = len(waiter.batches)
    deadline = asyncio.get_running_loop().time() + within
    while len(waiter.batches) == known and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)


def index_entries(directory: str) -> list[int]:
    reopened = Persistence(directory)
    try:
        return [entry.seq for entry in reopened.index.entries(Stored.index_id)]
    finally:
        reopened.close()


async def test_a_short_write_of_the_tail_confirms_nothing_until_the_whole_tail_is_written(tmp_path, monkeypatch):
    """A full disk takes part of a write and refuses the rest: the record was confirmed though half of it was
    on disk (the tail's write took its count for granted), and cut off as torn at the next recovery."""
    persistence = Persistence(str(tmp_path))
    try:
        persistence.recover([Stored()])
        waiter = Waiter()
        persistence.waiters.add(waiter)
        pwrite = os.pwrite

        def full(fd: int, data: bytes, offset: int) -> int:
            if len(data) < 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return pwrite(fd, bytes(data)[:len(data) // 2], offset)

        monkeypatch.setattr(store_module.os, "pwrite", full)
        persistence.write(Stored(), Entry(0, Message("", "q", b"", b"", b"body" * 100)))
        await settled(persistence, waiter, 0.5)
        assert waiter.batches == [] and persistence.synced == 0
        monkeypatch.setattr(store_module.os, "pwrite", pwrite)  # space again: the commit is tried again
        await settled(persistence, waiter, 5)
        assert waiter.batches and persistence.synced
    finally:
        persistence.close()
    reopened = MessageStore(str(tmp_path / "msg_store_persistent"))
    reopened.recover()
    assert reopened.read(1).endswith(b"body" * 100)
    reopened.close()


class FailingCommit:
    """A write transaction of the queue index whose commit the disk refuses (LMDB writes its pages then)."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.txn = env.begin(write=True)

    def __enter__(self) -> lmdb.Transaction:
        return self.txn

    def __exit__(self, *exc: object) -> None:
        self.txn.abort()
        raise lmdb.DiskError("mdb_txn_commit: No space left on device")


async def test_an_index_commit_the_disk_refuses_confirms_nothing_until_it_is_written(tmp_path, monkeypatch):
    """The index dropped its staged entries before its transaction committed: a refused commit lost them, and
    the next group commit confirmed the publish, whose message no entry named after a restart."""
    persistence = Persistence(str(tmp_path))
    try:
        persistence.recover([Stored()])
        waiter = Waiter()
        persistence.waiters.add(waiter)
        env = persistence.index._env
        monkeypatch.setattr(persistence.index, "_env", SimpleNamespace(begin=lambda write: FailingCommit(env)))
        persistence.write(Stored(), Entry(0, Message("", "q", b"", b"", b"body")))
        await settled(persistence, waiter, 0.5)
        assert waiter.batches == [] and persistence.synced == 0
        monkeypatch.setattr(persistence.index, "_env", env)  # space again: the commit is tried again
        persistence.write(Stored(), Entry(1, Message("", "q", b"", b"", b"next")))
        await settled(persistence, waiter, 5)
        assert waiter.batches and persistence.synced
    finally:
        persistence.close()
    assert index_entries(str(tmp_path)) == [0, 1]
