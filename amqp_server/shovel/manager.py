"""The node's dynamic shovels: one :class:`worker.Worker` per ``shovel`` runtime parameter this node runs.

Parameters are durable definitions (LMDB, and etcd in a cluster), so a shovel comes back after a restart or a
``kill -9`` of its node.  The manager looks at them every :data:`RECONCILE_INTERVAL` (and at once when one is set
or cleared here) and starts, restarts (value changed) or stops workers to match.  In a cluster each shovel runs on
one node: the live member that ranks first for it by a stable hash of (vhost, name, node) — rendezvous hashing —
so that when that node dies its shovels move to the others, and only those move.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from ..logs import untrusted
from .definition import Definition
from .uri import AMQPURI
from .worker import Endpoint, Worker

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("warren.shovel")
COMPONENT = "shovel"
RECONCILE_INTERVAL = 0.5


def _rank(vhost: str, name: str, node: str) -> bytes:
    return hashlib.sha256(f"{vhost}\0{name}\0{node}".encode()).digest()


class Shovels:
    def __init__(self, broker: "Broker", amqp_host: str, amqp_port: int) -> None:
        self.broker = broker
        self.node = broker.node_name
        self._local = (amqp_host if amqp_host not in ("", "0.0.0.0", "::") else "127.0.0.1", amqp_port)
        self.workers: dict[tuple[str, str], tuple[Worker, dict[str, Any]]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._reconcile_loop(), name="shovels")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for worker, _ in list(self.workers.values()):
            await worker.stop()
        self.workers.clear()

    def changed(self) -> None:
        """A shovel parameter was set or cleared: look again now."""
        self._changed.set()

    def owner(self, vhost: str, name: str) -> str:
        cluster = self.broker.cluster
        live = [self.node] + ([node for node, up in cluster.nodes() if up] if cluster is not None else [])
        return max(live, key=lambda node: _rank(vhost, name, node))

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:  # keep managing shovels whatever one pass met
                log.exception("shovel reconciliation failed")
            try:
                await asyncio.wait_for(self._changed.wait(), RECONCILE_INTERVAL)
            except asyncio.TimeoutError:
                pass
            self._changed.clear()

    async def reconcile(self) -> None:
        wanted = {(r["vhost"], r["name"]): r for r in self.broker.access.parameters() if r["component"] == COMPONENT}
        for key in list(self.workers):
            record = wanted.get(key)
            worker, running = self.workers[key]
            if record is None or record != running or self.owner(*key) != self.node:
                del self.workers[key]
                await worker.stop()
        for key, record in wanted.items():
            if key in self.workers or self.owner(*key) != self.node:
                continue
            try:
                definition = Definition.parse(record["value"])
            except (KeyError, TypeError, ValueError) as exc:  # (validated when set: a record from elsewhere)
                log.warning("shovel %s in vhost %s not started: %s", untrusted(key[1]), untrusted(key[0]), exc)
                continue
            worker = Worker(key[0], key[1], definition, self._resolver(record.get("user") or ""),
                            self.broker.access.cluster_name(self.node), self._finisher(key))
            self.workers[key] = (worker, record)
            worker.start()

    def _resolver(self, setter: str):
        access = self.broker.access
        host, port = self._local

        def resolve(uri: AMQPURI) -> Endpoint:
            if uri.direct:
                return Endpoint(host, port, uri.user or setter, access.direct_secret)
            return Endpoint(uri.host, uri.port, uri.user if uri.user is not None else "guest",
                            uri.password if uri.password is not None else "guest")
        return resolve

    def _finisher(self, key: tuple[str, str]):
        async def finished() -> None:
            self.workers.pop(key, None)
            self.broker.access.clear_parameter(key[0], COMPONENT, key[1])
        return finished

    def status(self) -> list[dict[str, Any]]:
        """This node's shovels as RabbitMQ's /api/shovels lists them."""
        return [{"node": self.node, **worker.status()} for worker, _ in self.workers.values()]

    async def restart(self, vhost: str, name: str) -> bool:
        """Stop and start again (DELETE /api/shovels/vhost/{vhost}/{name}/restart); False if not running here."""
        entry = self.workers.pop((vhost, name), None)
        if entry is None:
            return False
        await entry[0].stop()
        self.changed()
        return True
