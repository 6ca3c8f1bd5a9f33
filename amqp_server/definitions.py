"""Durable definitions (vhosts, users, permissions, exchanges, queues, bindings) in LMDB.

Each definition is one JSON record under ``kind/key``.  LMDB lets the admin CLI
write while the broker runs; the broker reads users and permissions from here
at login, so such changes take effect on the next connection.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterator

import lmdb

MAX_KEY = 480  # LMDB's default key limit is 511 bytes


class DefinitionStore:
    def __init__(self, data_dir: str) -> None:
        path = os.path.join(data_dir, "definitions")
        os.makedirs(path, exist_ok=True)
        self._env = lmdb.open(path, map_size=1 << 30, max_dbs=1)

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

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        with self._env.begin() as txn:
            raw = txn.get(self._key(kind, key))
        return None if raw is None else json.loads(raw)

    def put(self, kind: str, key: str, value: dict[str, Any]) -> None:
        with self._env.begin(write=True) as txn:
            txn.put(self._key(kind, key), json.dumps(value, sort_keys=True).encode())

    def delete(self, kind: str, key: str) -> bool:
        with self._env.begin(write=True) as txn:
            return txn.delete(self._key(kind, key))

    def records(self, kind: str) -> list[dict[str, Any]]:
        """Every record of ``kind`` (records carry their names; keys are not read back)."""
        return [record for _, record in self.items(kind)]

    def items(self, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
        prefix = f"{kind}/".encode()
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_range(prefix):
                return
            for raw_key, raw in cursor:
                if not raw_key.startswith(prefix):
                    break
                yield raw_key[len(prefix):].decode(), json.loads(raw)
