"""LMDB environments as the queue index and the schedule use them: changes staged in memory,
written in one transaction, made durable by a separate sync (which may run off the event loop)."""
from __future__ import annotations

import os
from typing import Iterable

import lmdb


def open_env(directory: str, map_size: int) -> lmdb.Environment:
    os.makedirs(directory, exist_ok=True)
    return lmdb.open(directory, map_size=map_size, sync=False, metasync=False, writemap=False, max_dbs=0,
                     readahead=False)


def write_batch(env: lmdb.Environment, puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> None:
    """Deletes, then puts (sorted, one cursor), in one write transaction."""
    with env.begin(write=True) as txn:
        for key in deletes:
            txn.delete(key)
        if puts:
            txn.cursor().putmulti(sorted(puts.items()))
