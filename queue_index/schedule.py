"""Messages held until a time (the delayed exchange's schedule), in LMDB, ordered by due time.

Key ``due ms (u64) | seq (u64)``, big-endian, so a cursor walks entries in the
order they fall due; value ``msg_id (u64) | size (u32) | tag`` where the tag is
the caller's (it names where the message goes).  Changes are staged, applied in
one write transaction per ``commit`` and made durable by ``sync``, like
:class:`QueueIndex`, so both join one group commit.  Reads see staged changes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from .lmdb_batch import open_env, sync, write_batch

KEY = struct.Struct(">QQ")
VALUE = struct.Struct(">QI")


@dataclass(frozen=True, slots=True)
class ScheduledEntry:
    due: int  # epoch milliseconds
    seq: int
    msg_id: int
    size: int
    tag: bytes


class Schedule:
    def __init__(self, directory: str, map_size: int = 1 << 36) -> None:
        self._env = open_env(directory, map_size)
        self._synced = -1  # the last transaction a sync covered
        self._puts: dict[bytes, bytes] = {}
        self._deletes: set[bytes] = set()

    def close(self) -> None:
        self._env.close()

    def put(self, entry: ScheduledEntry) -> None:
        self._puts[KEY.pack(entry.due, entry.seq)] = VALUE.pack(entry.msg_id, entry.size) + entry.tag

    def delete(self, due: int, seq: int) -> None:
        key = KEY.pack(due, seq)
        if self._puts.pop(key, None) is None:  # staged and gone in one batch: never written
            self._deletes.add(key)

    def commit(self) -> None:
        """Apply the staged changes in one transaction (durable after the next ``sync``)."""
        if not (self._puts or self._deletes):
            return
        write_batch(self._env, self._puts, self._deletes)
        self._puts, self._deletes = {}, set()  # only now: a refused transaction leaves them to be tried again

    def sync(self) -> None:
        self._synced = sync(self._env, self._synced)

    def between(self, after: tuple[int, int], upto: int, limit: int) -> list[ScheduledEntry]:
        """The first ``limit`` entries after the key (due, seq) ``after`` and due at or before ``upto``,
        staged ones included, in (due, seq) order."""
        found: dict[bytes, bytes] = {}
        deletes = self._deletes
        start = KEY.pack(*after)
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(start):
                for key, value in cursor:
                    if KEY.unpack(key)[0] > upto or len(found) >= limit:
                        break
                    if key != start and key not in deletes:
                        found[key] = value
        for key, value in self._puts.items():
            if start < key and KEY.unpack(key)[0] <= upto:
                found[key] = value
        return [_entry(key, found[key]) for key in sorted(found)[:limit]]

    def entries(self) -> Iterator[ScheduledEntry]:
        """Every committed entry in order (used at recovery)."""
        with self._env.begin() as txn:
            for key, value in txn.cursor():
                yield _entry(key, value)


def _entry(key: bytes, value: bytes) -> ScheduledEntry:
    due, seq = KEY.unpack(key)
    msg_id, size = VALUE.unpack_from(value)
    return ScheduledEntry(due, seq, msg_id, size, bytes(value[VALUE.size:]))
