"""Durable definitions (vhosts, users, permissions, exchanges, queues, bindings) in LMDB.

Each definition is one JSON record under ``kind/key``.  LMDB lets the admin CLI
write while the broker runs; the broker reads users and permissions from here
at login, so such changes take effect on the next connection.

The map grows: a write that finds it full doubles it and tries again, so no write, and above all no delete, fails
for want of map space (RabbitMQ keeps definitions in Mnesia, which has no fixed size either).  What clients may
add is bounded instead: :meth:`DefinitionStore.room` refuses a client's new definition once the records kept
would pass ``max_size`` (``--definitions-max-size``); administrators' records (users, permissions, vhosts),
the node's own bookkeeping and every delete go through regardless.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Callable, Iterator, TypeVar

import lmdb

MAX_KEY = 480  # LMDB's default key limit is 511 bytes
INITIAL_MAP_SIZE = 1 << 30  # address space only: the file holds what is written
DEFAULT_MAX_SIZE = 1 << 30  # bytes of definitions clients may make, all vhosts together
RECORD_OVERHEAD = 512  # bytes a record takes beyond its arguments (names, flags, key, LMDB's node header)

T = TypeVar("T")
log = logging.getLogger("warren.definitions")


class StoreFull(Exception):
    """A client's definition would take the store past its maximum size."""


class DefinitionStore:
    def __init__(self, data_dir: str, max_size: int = DEFAULT_MAX_SIZE, map_size: int = INITIAL_MAP_SIZE) -> None:
        path = os.path.join(data_dir, "definitions")
        os.makedirs(path, exist_ok=True)
        self.max_size = max_size
        self._env = lmdb.open(path, map_size=map_size, max_dbs=1)

    def close(self) -> None:
        self._env.close()

    @staticmethod
    def _key(kind: str, key: str) -> bytes:
        """``kind/key``; a key LMDB could not hold (over 511 bytes: long escaped names) is stored by its hash.
        Records carry every name, so nothing reads a name back from a key."""
        raw = f"{kind}/{key}".encode()
        if len(raw) > MAX_KEY:
            return f"{kind}/~".encode() + hashlib.sha256(raw).hexdigest().encode()
        return raw

    @property
    def used(self) -> int:
        """Bytes of the pages holding records now (pages freed by deletes are not counted: LMDB reuses them)."""
        stat = self._env.stat()
        return stat["psize"] * (stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"])

    @property
    def map_size(self) -> int:
        return int(self._env.info()["map_size"])

    def room(self, size: int) -> None:
        """Raises :class:`StoreFull` unless a new record of about ``size`` bytes keeps the store within
        ``max_size``.  For what clients declare; callers check before they change anything."""
        if self.used + size + RECORD_OVERHEAD > self.max_size:
            raise StoreFull(f"definitions store full ({self.used} of {self.max_size} bytes used)")

    def _write(self, change: Callable[[Any], T]) -> T:
        """One write transaction; a full map is doubled and the transaction run again, another process's
        growth (warren-admin) adopted."""
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    return change(txn)
            except lmdb.MapFullError:
                size = self.map_size * 2
                log.info("definitions store: map grown to %d bytes", size)
                self._env.set_mapsize(size)
            except lmdb.MapResizedError:
                self._env.set_mapsize(0)

    def _read(self, read: Callable[[Any], T]) -> T:
        while True:
            try:
                with self._env.begin() as txn:
                    return read(txn)
            except lmdb.MapResizedError:
                self._env.set_mapsize(0)

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        raw = self._read(lambda txn: txn.get(self._key(kind, key)))
        return None if raw is None else json.loads(raw)

    def put(self, kind: str, key: str, value: dict[str, Any]) -> None:
        raw = json.dumps(value, sort_keys=True).encode()
        self._write(lambda txn: txn.put(self._key(kind, key), raw))

    def delete(self, kind: str, key: str) -> bool:
        return self._write(lambda txn: txn.delete(self._key(kind, key)))

    def records(self, kind: str) -> list[dict[str, Any]]:
        """Every record of ``kind`` (records carry their names; keys are not read back)."""
        return [record for _, record in self.items(kind)]

    def items(self, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """Read in one transaction before the first is yielded: a write between two (growing the map) needs
        no transaction open."""
        prefix = f"{kind}/".encode()

        def read(txn: Any) -> list[tuple[bytes, bytes]]:
            cursor = txn.cursor()
            if not cursor.set_range(prefix):
                return []
            found = []
            for raw_key, raw in cursor:
                if not raw_key.startswith(prefix):
                    break
                found.append((raw_key, raw))
            return found

        for raw_key, raw in self._read(read):
            yield raw_key[len(prefix):].decode(), json.loads(raw)
