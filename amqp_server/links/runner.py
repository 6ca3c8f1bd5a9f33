"""What keeps a node's links running as its definitions say (the shovels' and federation's managers): a pass
every :data:`RECONCILE_INTERVAL`, and at once when told that something changed, starts and stops links to match.
In a cluster a link whose placement is free runs on one node: the live member that ranks first for it by a
stable hash of its key and the node's name — rendezvous hashing — so that when that node dies its links move to
the others, and only those move.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from .link import Link, Resolve, local_address, resolver

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("warren.link")
RECONCILE_INTERVAL = 0.5


class Runner:
    """Subclasses give :meth:`reconcile`; ``links`` maps each link's key to it and what it was started from."""

    what = "links"  # for logs

    def __init__(self, broker: "Broker", amqp_host: str, amqp_port: int) -> None:
        self.broker = broker
        self.node = broker.node_name
        self._local = local_address(amqp_host, amqp_port)
        self.links: dict[Any, tuple[Link, Any]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._reconcile_loop(), name=self.what)

    async def stop(self) -> None:
        """The node stops: links stop without undoing what they made (they go on from it when it is back)."""
        if self._task is not None:
            self._task.cancel()
        for link, _ in list(self.links.values()):
            await link.stop(cleanup=False)
        self.links.clear()

    def changed(self) -> None:
        """A definition links follow was set or cleared here: look again now."""
        self._changed.set()

    def owner(self, *key: str) -> str:
        """The node that runs the link of ``key``."""
        cluster = self.broker.cluster
        live = [self.node] + ([node for node, up in cluster.nodes() if up] if cluster is not None else [])
        return max(live, key=lambda node: hashlib.sha256("\0".join((*key, node)).encode()).digest())

    def resolver(self, setter: str) -> Resolve:
        return resolver(self.broker.access, self._local, setter)

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:  # keep managing links whatever one pass met
                log.exception("%s: reconciliation failed", self.what)
            try:
                await asyncio.wait_for(self._changed.wait(), RECONCILE_INTERVAL)
            except asyncio.TimeoutError:
                pass
            self._changed.clear()

    async def reconcile(self) -> None:
        raise NotImplementedError

    async def drop(self, key: Any) -> None:
        """Stop the link of ``key`` for good."""
        entry = self.links.pop(key, None)
        if entry is not None:
            await entry[0].stop()
