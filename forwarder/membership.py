"""Cluster membership: which nodes exist and where their links listen.

Each node registers ``/warren/nodes/<name>`` in etcd under a lease it keeps alive; the record
says where to dial it.  A node joins by starting with the same etcd endpoint and secret (one
config entry).  A stopped node stays a member (its queues are reported down) until its entry
under ``/warren/members/`` is deleted.  Being registered is not being reachable: a node is *up*
here while our link to it is.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

import aetcd
from aetcd import rtypes

log = logging.getLogger("warren.forwarder.membership")

NODES_PREFIX = b"/warren/nodes/"
KNOWN_PREFIX = b"/warren/members/"  # permanent: nodes that ever joined, until forgotten
LEASE_TTL = 5
RETRY_INTERVAL = 1.0


class Membership:
    def __init__(self, client: aetcd.Client, name: str, address: dict[str, Any],
                 joined: Callable[[str, dict[str, Any]], None], left: Callable[[str], None]) -> None:
        self.client = client
        self.name = name
        self.address = address
        self.joined = joined  # called for every other node registered, with its address
        self.left = left  # called for a node forgotten
        self.members: dict[str, dict[str, Any]] = {}
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self._register()
        reply = await self.client.get_prefix(KNOWN_PREFIX)
        for kv in reply:
            self._seen(json.loads(kv.value))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keep_alive()), loop.create_task(self._watch(reply.header.revision))]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _register(self) -> None:
        self.lease = await self.client.lease(LEASE_TTL)
        value = json.dumps(self.address).encode()
        await self.client.put(NODES_PREFIX + self.name.encode(), value, lease=self.lease)
        await self.client.put(KNOWN_PREFIX + self.name.encode(), value)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(LEASE_TTL / 3)
            try:
                await self.lease.refresh()
            except Exception as exc:
                log.warning("etcd lease refresh failed (%s); registering again", exc)
                try:
                    await self._register()
                except Exception:
                    pass

    async def _watch(self, revision: int) -> None:
        while True:
            try:
                watch = await self.client.watch_prefix(KNOWN_PREFIX, start_revision=revision + 1)
                async for event in watch:
                    revision = event.kv.mod_revision
                    if event.kind == rtypes.EventKind.PUT:
                        self._seen(json.loads(event.kv.value))
                    else:
                        name = event.kv.key[len(KNOWN_PREFIX):].decode()
                        self.members.pop(name, None)
                        self.left(name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("etcd membership watch failed (%s); retrying", exc)
                await asyncio.sleep(RETRY_INTERVAL)

    async def forget(self, name: str) -> None:
        await self.client.delete(KNOWN_PREFIX + name.encode())
        await self.client.delete(NODES_PREFIX + name.encode())

    def _seen(self, address: dict[str, Any]) -> None:
        name = address["name"]
        self.members[name] = address
        if name != self.name:
            self.joined(name, address)
