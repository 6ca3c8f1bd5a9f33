"""Cluster definitions in etcd, mirrored into this node's LMDB.

etcd (Raft) is the one place definitions are agreed: ``/warren/def/<kind>/<key>`` holds one
JSON record per exchange, queue (with its owner node), binding and (operator) policy.  Each node applies the
changes it watches to its broker and keeps them, with the last revision applied, in its own
definition store: reads stay local, a node starts from its mirror without etcd, and after
downtime it loads etcd's current state, applies what differs from its mirror (deletions
included) and watches from that revision on; a broken watch resumes after the last revision
seen, or — if etcd compacted that history away — reloads the whole prefix.

Writes made by this node go through one ordered writer, so a binding never reaches etcd before
its queue.  A new queue is different: :meth:`create` is a transaction that only succeeds if the
key does not exist yet, so of two concurrent declarations exactly one wins and both nodes see it.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

import aetcd
from aetcd import rtypes

from amqp_server.definitions import DefinitionStore

log = logging.getLogger("warren.forwarder.metadata")

DEF_PREFIX = b"/warren/def/"
MIRROR = "cluster_def"  # LMDB kind: etcd key -> {"record", "revision"}
RETRY_INTERVAL = 1.0
ORDER = {"vhost": 0, "global_parameter": 0, "user": 1, "permission": 2, "topic_permission": 2, "vhost_limits": 2,
         "user_limits": 2, "exchange": 3, "queue": 4, "binding": 5,
         "policy": 6, "operator_policy": 6}  # dependencies first

Apply = Callable[[str, str, dict[str, Any] | None, dict[str, Any] | None], None]  # kind, key, new (None: gone), old


def etcd_key(kind: str, key: str) -> bytes:
    return DEF_PREFIX + f"{kind}/{key}".encode()


def _kind(etcd_key_: bytes) -> str:
    return etcd_key_[len(DEF_PREFIX):].decode().split("/", 1)[0]


def _name(etcd_key_: bytes) -> str:
    """The definition's key within its kind (a user's name, a vhost's escaped name, ...)."""
    return etcd_key_[len(DEF_PREFIX):].decode().split("/", 1)[1]


class Metadata:
    def __init__(self, client: aetcd.Client, store: DefinitionStore, apply: Apply) -> None:
        self.client = client
        self.store = store
        self.apply = apply
        self._writes: asyncio.Queue[tuple[bytes, dict[str, Any] | None]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self.caught_up = asyncio.Event()

    # -- the local mirror ---------------------------------------------------------------------

    def mirrored(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(kind, key, record) of every mirrored definition, each after what it depends on."""
        records = [(_kind(k.encode()), _name(k.encode()), v["record"]) for k, v in self.store.items(MIRROR)]
        return sorted(records, key=lambda kr: ORDER.get(kr[0], 9))

    def _mirror(self, key: bytes, record: dict[str, Any] | None, revision: int) -> None:
        if record is None:
            self.store.delete(MIRROR, key.decode())
        else:
            self.store.put(MIRROR, key.decode(), {"record": record, "revision": revision})

    # -- writes -------------------------------------------------------------------------------

    async def create(self, kind: str, key: str, record: dict[str, Any]) -> dict[str, Any]:
        """Put the record unless the key exists; either way, the record the cluster now has."""
        full = etcd_key(kind, key)
        ops = self.client.transactions
        won, responses = await self.client.transaction(
            compare=[ops.create(full) == 0], success=[ops.put(full, json.dumps(record).encode())],
            failure=[ops.get(full)])
        if won:
            self._mirror(full, record, responses[0].response_put.header.revision)
            return record
        value, meta = responses[0][0]
        current = json.loads(value)
        self._mirror(full, current, meta.mod_revision)
        return current

    async def fetch(self, kind: str, key: str) -> dict[str, Any] | None:
        """The record etcd has now (it reaches the mirror through the watch)."""
        reply = await self.client.get(etcd_key(kind, key))
        return None if reply is None else json.loads(reply.value)

    def put(self, kind: str, key: str, record: dict[str, Any]) -> None:
        self._writes.put_nowait((etcd_key(kind, key), record))

    def delete(self, kind: str, key: str) -> None:
        self._writes.put_nowait((etcd_key(kind, key), None))

    async def _writer(self) -> None:
        while True:
            key, record = await self._writes.get()
            while True:
                try:
                    if record is None:
                        await self.client.delete(key)
                        self._mirror(key, None, 0)
                    else:
                        reply = await self.client.put(key, json.dumps(record).encode())
                        self._mirror(key, record, reply.header.revision)
                    break
                except aetcd.exceptions.ClientError as exc:
                    log.warning("etcd write of %s failed (%s); retrying", key.decode(), exc)
                    await asyncio.sleep(RETRY_INTERVAL)

    # -- watching -----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._writer()), loop.create_task(self._watch())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch(self) -> None:
        """Load etcd's state once, then follow it, resuming after the last event seen when the watch breaks."""
        start: int | None = None
        while True:
            try:
                if start is None:
                    start = await self._reload()
                watch = await self.client.watch_prefix(DEF_PREFIX, start_revision=start + 1, prev_kv=True)
                async for event in watch:
                    self._event(event)
                    start = event.kv.mod_revision
            except aetcd.exceptions.RevisionCompactedError:
                log.warning("etcd history after revision %s is compacted: reloading definitions", start)
                start = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # etcd unreachable: keep serving from the mirror, retry
                log.warning("etcd watch failed (%s); retrying", exc)
                await asyncio.sleep(RETRY_INTERVAL)

    def _event(self, event: Any) -> None:
        key = event.kv.key
        revision = event.kv.mod_revision
        saved = self.store.get(MIRROR, key.decode())
        if event.kind == rtypes.EventKind.PUT:
            if saved is not None and saved["revision"] >= revision:
                return  # our own write, or seen already
            record = json.loads(event.kv.value)
            self._mirror(key, record, revision)
            self.apply(_kind(key), _name(key), record, saved["record"] if saved else None)
        else:
            if saved is not None and saved["revision"] > revision:
                return  # re-created since
            self._mirror(key, None, revision)
            old = saved["record"] if saved else (json.loads(event.prev_kv.value) if event.prev_kv else None)
            if old is not None:
                self.apply(_kind(key), _name(key), None, old)

    async def _reload(self) -> int:
        """Apply etcd's whole current state; returns its revision."""
        reply = await self.client.get_prefix(DEF_PREFIX)
        revision = reply.header.revision
        present = {}
        for kv in reply:
            present[kv.key.decode()] = json.loads(kv.value)
        for key, saved in list(self.store.items(MIRROR)):
            if key not in present:
                self._mirror(key.encode(), None, revision)
                self.apply(_kind(key.encode()), _name(key.encode()), None, saved["record"])
        for key, record in sorted(present.items(), key=lambda kv: ORDER.get(_kind(kv[0].encode()), 9)):
            saved = self.store.get(MIRROR, key)
            self._mirror(key.encode(), record, revision)
            if saved is None or saved["record"] != record:
                self.apply(_kind(key.encode()), _name(key.encode()), record, saved["record"] if saved else None)
        self.caught_up.set()
        return revision
