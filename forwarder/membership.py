"""Cluster membership: which nodes exist and where their links listen.

Each node writes ``/warren/members/<name>`` in etcd at start: where to dial its links.  A
node joins by starting with the same etcd endpoint and secret (one config entry); a stopped
node stays a member, its queues reported down, until it is forgotten (``warrenctl
forget-node``).  Being a member is not being reachable: a node is *up* here while our link to
it is (links carry heartbeats), which is what clients care about.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

import aetcd
from aetcd import rtypes

log = logging.getLogger("warren.forwarder.membership")

MEMBERS_PREFIX = b"/warren/members/"  # every node that joined, until forgotten
RETRY_INTERVAL = 1.0


class Membership:
    def __init__(self, client: aetcd.Client, name: str, address: dict[str, Any],
                 joined: Callable[[str, dict[str, Any]], None], left: Callable[[str], None]) -> None:
        self.client = client
        self.name = name
        self.address = address
        self.joined = joined  # called for every other node registered, with its address
        self.left = left  # called for a node forgotten
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self._register()
        reply = await self.client.get_prefix(MEMBERS_PREFIX)
        for kv in reply:
            self._seen(json.loads(kv.value))
        self._task = asyncio.get_running_loop().create_task(self._watch(reply.header.revision))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _register(self) -> None:
        await self.client.put(MEMBERS_PREFIX + self.name.encode(), json.dumps(self.address).encode())

    async def _watch(self, revision: int) -> None:
        while True:
            try:
                watch = await self.client.watch_prefix(MEMBERS_PREFIX, start_revision=revision + 1)
                async for event in watch:
                    revision = event.kv.mod_revision
                    if event.kind == rtypes.EventKind.PUT:
                        self._seen(json.loads(event.kv.value))
                    else:
                        self.left(event.kv.key[len(MEMBERS_PREFIX):].decode())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("etcd membership watch failed (%s); retrying", exc)
                await asyncio.sleep(RETRY_INTERVAL)

    async def forget(self, name: str) -> None:
        await self.client.delete(MEMBERS_PREFIX + name.encode())

    def _seen(self, address: dict[str, Any]) -> None:
        if address["name"] != self.name:
            self.joined(address["name"], address)
