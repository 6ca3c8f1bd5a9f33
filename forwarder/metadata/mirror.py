"""Cluster definitions in etcd, mirrored into this node's LMDB.

etcd (Raft) is the one place definitions are agreed: ``/warren/def/<kind>/<key>`` holds one
JSON record per exchange, queue (with its owner node), binding and (operator) policy.  Each node applies the
changes it watches to its broker and keeps them, with the last revision applied, in its own
definition store: reads stay local, and a node starts from its mirror without etcd.  On start, and
again after any error of the watch, it reads etcd's whole current state, applies what differs from
its mirror (deletions included) and watches from that revision on: never a resume from a revision
seen before, which etcd may have compacted away (or a restored etcd never had).  A watch can also go
quiet without an error (a stream the server ended): every ``CHECK_INTERVAL`` the keys and revisions
etcd holds are compared with the mirror's, and a difference still there at the next check, which no
event in flight explains, reads the whole state again.

Writes made by this node go through one ordered writer, so a binding never reaches etcd before
its queue; :meth:`written` waits until etcd has those asked for so far, so that a change is answered only
once a crash of this node can no longer lose it.  A new queue is different: :meth:`create` is a transaction that
only succeeds if the key does not exist yet, so of two concurrent declarations exactly one wins and both nodes see
it.  The revision of the last change made here is ``made``; another node's :meth:`reached` waits until its
definitions are etcd's at a revision (its watch brought them that far), so that a change is answered only once the
other nodes route by it too (``Cluster.written``).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

import aetcd
from aetcd import rtypes

from amqp_server.definition_store import DefinitionStore
from amqp_server.logs import untrusted
from amqp_server.tasks import stop_tasks

from .signing import Signer

log = logging.getLogger("warren.forwarder.metadata")

DEF_PREFIX = b"/warren/def/"
MIRROR = "cluster_def"  # LMDB kind: etcd key -> {"key" (the etcd key), "record", "revision"}
# LMDB kind: etcd key -> {"key", "record" (None: a delete)} of a change made here that etcd has not taken yet
UNWRITTEN = "cluster_unwritten"
RETRY_INTERVAL = 1.0
CHECK_INTERVAL = 10.0  # seconds between comparisons of etcd's keys with the mirror's
ORDER = {"vhost": 0, "global_parameter": 0, "user": 1, "permission": 2, "topic_permission": 2, "vhost_limits": 2,
         "user_limits": 2, "parameter": 2, "exchange": 3, "queue": 4, "binding": 5,
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
    def __init__(self, client: aetcd.Client, store: DefinitionStore, apply: Apply,
                 signer: Signer | None = None) -> None:
        self.client = client
        self.signer = signer  # None: records are taken as they are (no cluster secret to check them with)
        self.store = store
        self.apply = apply
        self._writes: asyncio.Queue[tuple[bytes, dict[str, Any] | None]] = asyncio.Queue()
        self._unwritten: dict[bytes, int] = {}  # etcd key -> its writes queued and not yet taken by etcd
        self._queued = self._done = 0  # writes put on _writes, and those etcd has taken
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []  # (writes to be done, its waiter)
        self._tasks: list[asyncio.Task] = []
        self._cancels: set[asyncio.Task] = set()  # watches being cancelled: held, or the loop may drop them midway
        self.caught_up = asyncio.Event()  # the first full read is done
        # set while the mirror is known to be etcd's state: a full read done and its watch following, with no error
        # since (clear before the first read, and from a watch's failure until the next full read)
        self.current = asyncio.Event()
        self.reloads = 0  # full reads of etcd's state (the first included)
        # etcd key -> revision of every mirrored definition, as the mirror has it (for the checks)
        self._revisions = {key: saved["revision"] for key, saved in self._items()}
        self._floor = 0  # the revision of the last full read: an event up to it is in the mirror already
        self.revision = 0  # etcd's revision the definitions here are at (events applied, full reads, own changes)
        self.made = 0  # the revision of the last change made here
        self._reaching: list[tuple[int, asyncio.Future[None]]] = []  # (revision, waiter) of ``reached``

    # -- the local mirror ---------------------------------------------------------------------

    def mirrored(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(kind, key, record) of every mirrored definition, each after what it depends on."""
        records = [(_kind(k.encode()), _name(k.encode()), v["record"]) for k, v in self._items()]
        return sorted(records, key=lambda kr: ORDER.get(kr[0], 9))

    def unwritten(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(kind, key, record) of what this node's last run made here but etcd never took (its writes queued
        when it died, etcd unreachable), that the mirror does not hold: to be undone at start, as a Raft member
        drops the entries no majority committed (their answers were never sent: they waited for etcd).  A change
        to a definition the mirror holds, or a deletion, is undone by applying the mirror.  Forgotten once read."""
        found = []
        for stored, saved in list(self.store.items(UNWRITTEN)):
            key = saved["key"]
            if saved["record"] is not None and self.store.get(MIRROR, key) is None:
                found.append((_kind(key.encode()), _name(key.encode()), saved["record"]))
            self.store.delete(UNWRITTEN, stored)
        return sorted(found, key=lambda kr: -ORDER.get(kr[0], 9))  # (what depends on others first)

    def _items(self) -> list[tuple[str, dict[str, Any]]]:
        """(etcd key, saved) of every mirrored definition.  The key is read from the record: the store keeps a
        long one (a name of many escaped characters) under its hash.  Such an entry saved without its key (as
        this node once did) is dropped: etcd's copy of it comes back with the next full read."""
        items = []
        for stored, saved in list(self.store.items(MIRROR)):
            key = saved.get("key", stored)
            if key.startswith(DEF_PREFIX.decode()):
                items.append((key, saved))
            else:
                self.store.delete(MIRROR, stored)
        return items

    def _mirror(self, key: bytes, record: dict[str, Any] | None, revision: int) -> None:
        name = key.decode()
        if record is None:
            self.store.delete(MIRROR, name)
            self._revisions.pop(name, None)
        else:
            self.store.put(MIRROR, name, {"key": name, "record": record, "revision": revision})
            self._revisions[name] = revision

    def _content(self, key: bytes, value: bytes) -> dict[str, Any]:
        """The record a value holds, signed or not (what a delete removed)."""
        return json.loads(value) if self.signer is None else self.signer.open(key, value)[0]

    def _seal(self, key: bytes, record: dict[str, Any]) -> bytes:
        return json.dumps(record).encode() if self.signer is None else self.signer.seal(key, record)

    def _open(self, key: bytes, value: bytes, revision: int, upgrade: bool = False) -> dict[str, Any] | None:
        """The record a value holds; None (logged, and its revision noted so that the checks do not read
        everything again for it) if it is not signed with the cluster secret.  With ``upgrade`` (a full read), such
        a record that this node applied already (its mirror has it as it is: written before definitions were
        signed, or under another cluster secret) is taken, and signed again."""
        if self.signer is None:
            return json.loads(value)
        record, signed = self.signer.open(key, value)
        if signed:
            return record
        if upgrade:
            saved = self.store.get(MIRROR, key.decode())
            if saved is not None and saved["record"] == record:
                self._write(key, record)
                return record
        self.signer.refused(key, revision)
        self._revisions[key.decode()] = revision
        return None

    # -- writes -------------------------------------------------------------------------------

    async def create(self, kind: str, key: str, record: dict[str, Any]) -> dict[str, Any]:
        """Put the record unless the key exists; either way, the record the cluster now has."""
        full = etcd_key(kind, key)
        ops = self.client.transactions
        won, responses = await self.client.transaction(
            compare=[ops.create(full) == 0], success=[ops.put(full, self._seal(full, record))],
            failure=[ops.get(full)])
        if won:
            revision = responses[0].response_put.header.revision
            self._mirror(full, record, revision)
            self._made(revision)
            return record
        value, meta = responses[0][0]
        current = self._open(full, value, meta.mod_revision)
        if current is None:
            raise aetcd.exceptions.ClientError(f"{kind} {key} in etcd is not signed with the cluster secret")
        self._mirror(full, current, meta.mod_revision)
        self._made(meta.mod_revision)  # (another node's declaration, answered here: the others may lag too)
        return current

    async def delete_unless(self, records: list[tuple[str, str]], guard: bytes) -> bool:
        """Delete the records (kind, key) as the mirror has them, in one transaction, unless etcd holds ``guard``
        then or one of them changed since (or went): whether they were deleted.  Their deletion reaches this node's
        broker through the watch, as it reaches every other node's."""
        keys = [etcd_key(kind, key) for kind, key in records]
        revisions = [self._revisions.get(key.decode(), 0) for key in keys]
        if not all(revisions):
            return False
        ops = self.client.transactions
        won, _ = await self.client.transaction(
            compare=[ops.version(guard) == 0, *(ops.mod(key) == revision for key, revision in zip(keys, revisions))],
            success=[ops.delete(key) for key in keys], failure=[])
        return bool(won)

    async def fetch(self, kind: str, key: str) -> dict[str, Any] | None:
        """The record etcd has now (it reaches the mirror through the watch)."""
        full = etcd_key(kind, key)
        reply = await self.client.get(full)
        return None if reply is None else self._open(full, reply.value, reply.mod_revision)

    def put(self, kind: str, key: str, record: dict[str, Any]) -> None:
        self._write(etcd_key(kind, key), record)

    def delete(self, kind: str, key: str) -> None:
        self._write(etcd_key(kind, key), None)

    def _write(self, key: bytes, record: dict[str, Any] | None) -> None:
        self.store.put(UNWRITTEN, key.decode(), {"key": key.decode(), "record": record})
        self._unwritten[key] = self._unwritten.get(key, 0) + 1
        self._queued += 1
        self._writes.put_nowait((key, record))

    async def written(self) -> None:
        """Returns once etcd has every write asked for so far (those of ``put`` and ``delete``)."""
        if self._done >= self._queued:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((self._queued, waiter))
        await waiter

    def _wrote(self) -> None:
        self._done += 1
        still = []
        for upto, waiter in self._waiting:
            if upto <= self._done:
                if not waiter.done():
                    waiter.set_result(None)
            elif not waiter.done():
                still.append((upto, waiter))
        self._waiting = still

    async def _writer(self) -> None:
        while True:
            key, record = await self._writes.get()
            while True:
                try:
                    if record is None:
                        deleted = await self.client.delete(key)
                        self._mirror(key, None, 0)
                        if deleted is not None:  # (None: not there, no change)
                            self._made(deleted.header.revision)
                    else:
                        reply = await self.client.put(key, self._seal(key, record))
                        self._mirror(key, record, reply.header.revision)
                        self._made(reply.header.revision)
                    self._taken(key)
                    self._wrote()
                    break
                except aetcd.exceptions.ClientError as exc:
                    log.warning("etcd write of %s failed (%s); retrying", untrusted(key), exc)
                    await asyncio.sleep(RETRY_INTERVAL)

    def _taken(self, key: bytes) -> None:
        """etcd took a write of ``key`` (after the mirror has it): once it took the last queued, none is unwritten."""
        left = self._unwritten.pop(key) - 1
        if left:
            self._unwritten[key] = left
        else:
            self.store.delete(UNWRITTEN, key.decode())

    def _made(self, revision: int) -> None:
        self.made = max(self.made, revision)
        self._at(revision)

    # -- how far the definitions here are --------------------------------------------------------

    def _at(self, revision: int) -> None:
        """The definitions here are etcd's at ``revision`` at least."""
        if revision <= self.revision:
            return
        self.revision = revision
        still = []
        for wanted, waiter in self._reaching:
            if wanted <= revision:
                if not waiter.done():
                    waiter.set_result(None)
            elif not waiter.done():
                still.append((wanted, waiter))
        self._reaching = still

    async def reached(self, revision: int) -> None:
        """Returns once the definitions here are etcd's at ``revision`` at least (the caller bounds the wait)."""
        if revision <= self.revision:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._reaching.append((revision, waiter))
        await waiter

    # -- watching -----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._writer()), loop.create_task(self._watch())]

    async def stop(self) -> None:
        await stop_tasks(*self._tasks)

    async def _watch(self) -> None:
        """Read etcd's whole state and follow it from there; after an error, or a watch found quiet while
        etcd changed (``_check``), read the whole state again."""
        loop = asyncio.get_running_loop()
        while True:
            follow = check = None
            try:
                revision = await self._reload()
                watch = await self.client.watch_prefix(DEF_PREFIX, start_revision=revision + 1, prev_kv=True)
                self.current.set()
                follow, check = loop.create_task(self._follow(watch)), loop.create_task(self._check())
                done, _ = await asyncio.wait((follow, check), return_when=asyncio.FIRST_COMPLETED)
                if follow in done:
                    follow.result()  # its error, if it has one
                cancel = loop.create_task(self._cancel(watch))
                self._cancels.add(cancel)
                cancel.add_done_callback(self._cancels.discard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # etcd unreachable: keep serving from the mirror (known stale), retry
                self.current.clear()
                log.warning("etcd watch of definitions failed (%s); reading them all again", exc)
                await asyncio.sleep(RETRY_INTERVAL)
            finally:
                self.current.clear()
                for task in (follow, check):
                    if task is not None:
                        task.cancel()

    async def _follow(self, watch: Any) -> None:
        async for event in watch:
            self._event(event)

    @staticmethod
    async def _cancel(watch: Any) -> None:
        """Tell etcd we watch no more (its stream may be gone already, or stuck: then nothing)."""
        try:
            await asyncio.wait_for(watch.cancel(), RETRY_INTERVAL)
        except Exception:
            pass

    async def _check(self) -> None:
        """Every ``CHECK_INTERVAL``, the keys etcd holds (and their revisions) against the mirror's; returns once
        a difference is found again at the next check (the first time it may be an event on its way), or etcd
        does not answer."""
        suspect: set[tuple[str, int]] = set()
        while True:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                reply = await self.client.get_prefix(DEF_PREFIX, keys_only=True)
            except aetcd.exceptions.ClientError:
                log.warning("etcd unreachable for a check of definitions; reading them all again once it answers")
                return  # a watch cut off from etcd may not fail for long: the mirror is no longer known current
            held = {kv.key.decode(): kv.mod_revision for kv in reply}
            mirrored = self._revisions
            differ = {(key, revision) for key, revision in held.items() if mirrored.get(key, 0) < revision}
            differ.update((key, 0) for key in mirrored if key not in held)
            if differ & suspect:
                log.warning("etcd watch of definitions quiet while %d of them changed; reading them all again",
                            len(differ & suspect))
                return
            suspect = differ

    def _event(self, event: Any) -> None:
        key = event.kv.key
        revision = event.kv.mod_revision
        if revision <= self._floor:
            return  # the last full read had it (or what came after it)
        self._apply_event(event, key, revision)
        self._at(revision)

    def _apply_event(self, event: Any, key: bytes, revision: int) -> None:
        saved = self.store.get(MIRROR, key.decode())
        if event.kind == rtypes.EventKind.PUT:
            if saved is not None and saved["revision"] >= revision:
                return  # our own write, or seen already
            record = self._open(key, event.kv.value, revision)
            if record is None:
                return
            self._mirror(key, record, revision)
            self.apply(_kind(key), _name(key), record, saved["record"] if saved else None)
        else:
            if saved is not None and saved["revision"] > revision:
                return  # re-created since
            self._mirror(key, None, revision)
            old = saved["record"] if saved else (self._content(key, event.prev_kv.value) if event.prev_kv else None)
            if old is not None:
                self.apply(_kind(key), _name(key), None, old)

    async def _reload(self) -> int:
        """Apply etcd's whole current state; returns its revision."""
        reply = await self.client.get_prefix(DEF_PREFIX)
        revision = reply.header.revision
        self.reloads += 1
        present, refused = {}, set()
        for kv in reply:
            record = self._open(kv.key, kv.value, kv.mod_revision, upgrade=True)
            if record is None:
                refused.add(kv.key.decode())  # what the mirror has of it stays
            else:
                present[kv.key.decode()] = record
        for key, mirrored in self._items():
            if key not in present and key not in refused:
                self._mirror(key.encode(), None, revision)
                self.apply(_kind(key.encode()), _name(key.encode()), None, mirrored["record"])
        for key, record in sorted(present.items(), key=lambda kv: ORDER.get(_kind(kv[0].encode()), 9)):
            saved = self.store.get(MIRROR, key)
            self._mirror(key.encode(), record, revision)
            if saved is None or saved["record"] != record:
                self.apply(_kind(key.encode()), _name(key.encode()), record, saved["record"] if saved else None)
        self._floor = revision
        self._at(revision)
        self.caught_up.set()
        return revision
