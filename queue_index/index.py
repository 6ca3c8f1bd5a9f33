"""Per-queue ordered entries in LMDB (RabbitMQ's rabbit_queue_index).

Key ``queue id (u32) | seq (u64)``, big-endian, so one cursor walk returns a
queue's entries in order; value ``msg_id (u64) | expiry ms (u64, 0 = none) |
size (u32) | flags (u8)``.  Changes are staged and applied in one write
transaction per ``commit``; ``sync`` makes committed changes durable and may run
off the event loop while new changes are staged.
"""
from __future__ import annotations

import os
import shutil
import struct
from typing import Iterator, NamedTuple

from .lmdb_batch import open_env, write_batch

KEY = struct.Struct(">IQ")
VALUE = struct.Struct(">QQIB")
FLAG_DELIVERED = 1
COMPACT_MIN_BYTES = 4 << 20


class IndexEntry(NamedTuple):
    """A NamedTuple, not a dataclass: recovery makes one per message, and tuples are made fastest."""

    seq: int
    msg_id: int
    expiry: int  # epoch milliseconds, 0 for none
    size: int
    delivered: bool


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


class QueueIndex:
    def __init__(self, directory: str, map_size: int = 1 << 36) -> None:
        os.makedirs(directory, exist_ok=True)
        _compact(directory, map_size)
        self._env = open_env(directory, map_size)
        self._puts: dict[bytes, bytes] = {}
        self._deletes: list[bytes] = []
        self._fresh: set[bytes] = set()  # keys first published in this batch (not yet on disk)

    def close(self) -> None:
        self._env.close()

    def publish(self, queue_id: int, seq: int, msg_id: int, expiry: int, size: int, delivered: bool = False) -> None:
        key = KEY.pack(queue_id, seq)
        self._puts[key] = VALUE.pack(msg_id, expiry, size, FLAG_DELIVERED if delivered else 0)
        self._fresh.add(key)

    def delivered(self, queue_id: int, seq: int, msg_id: int, expiry: int, size: int) -> None:
        """Remember a delivery so that after a restart the message comes back redelivered."""
        # an update of an entry that may already be on disk: not fresh, so an ack must still delete it
        self._puts[KEY.pack(queue_id, seq)] = VALUE.pack(msg_id, expiry, size, FLAG_DELIVERED)

    def ack(self, queue_id: int, seq: int) -> None:
        key = KEY.pack(queue_id, seq)
        self._puts.pop(key, None)
        if key in self._fresh:
            self._fresh.discard(key)  # published and acked within one batch, never written
        else:
            self._deletes.append(key)

    @property
    def pending(self) -> bool:
        return bool(self._puts or self._deletes)

    def commit(self) -> None:
        """Apply the staged changes in one transaction (durable after the next ``sync``)."""
        if not (self._puts or self._deletes):
            return
        puts, deletes = self._puts, self._deletes
        self._puts, self._deletes = {}, []
        self._fresh = set()
        write_batch(self._env, puts, deletes)

    def sync(self) -> None:
        self._env.sync(True)

    def entries(self, queue_id: int) -> Iterator[IndexEntry]:
        """A queue's entries in order (used at recovery)."""
        prefix = queue_id.to_bytes(4, "big")
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(prefix):
                return
            key_unpack, value_unpack = KEY.unpack, VALUE.unpack
            for key, value in cursor:
                if key[:4] != prefix:
                    break
                msg_id, expiry, size, flags = value_unpack(value)
                yield IndexEntry(key_unpack(key)[1], msg_id, expiry, size, bool(flags & FLAG_DELIVERED))

    def delete_queue(self, queue_id: int) -> None:
        prefix = queue_id.to_bytes(4, "big")
        self._puts = {k: v for k, v in self._puts.items() if k[:4] != prefix}
        self._deletes = [k for k in self._deletes if k[:4] != prefix]
        self._fresh = {k for k in self._fresh if k[:4] != prefix}
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor()
            if cursor.set_range(prefix):
                while cursor.key()[:4] == prefix:
                    if not cursor.delete():
                        break

    def queue_ids(self) -> set[int]:
        """Every queue id with entries on disk (so the orphans of deleted queues can be dropped)."""
        ids: set[int] = set()
        with self._env.begin() as txn:
            cursor = txn.cursor()
            more = cursor.first()
            while more:
                queue_id = int.from_bytes(cursor.key()[:4], "big")
                ids.add(queue_id)
                more = cursor.set_range((queue_id + 1).to_bytes(4, "big")) if queue_id < 0xFFFFFFFF else False
        return ids
