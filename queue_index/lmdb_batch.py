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


def sync(env: lmdb.Environment, synced: int) -> int:
    """Make the environment's committed transactions durable, unless none came since the one ``synced`` covered:
    an fdatasync of a file nothing was written to still waits for the disk (milliseconds on a busy one, in every
    group commit of a node whose writes go elsewhere: a stream's log).  Returns the transaction it covered."""
    last = env.info()["last_txnid"]
    if last != synced:
        env.sync(True)
    return last


def write_batch(env: lmdb.Environment, puts: dict[bytes, bytes], deletes: Iterable[bytes]) -> None:
    """Deletes, then puts (sorted, one cursor), in one write transaction."""
    with env.begin(write=True) as txn:
        for key in deletes:
            txn.delete(key)
        if puts:
            txn.cursor().putmulti(sorted(puts.items()))
