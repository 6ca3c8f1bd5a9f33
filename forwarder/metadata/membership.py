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

from amqp_server.tasks import stop_tasks

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
        self.known: set[str] = set()  # the other members

    async def start(self) -> None:
        await self._register()
        revision = await self._read()
        self._task = asyncio.get_running_loop().create_task(self._watch(revision))

    async def stop(self) -> None:
        await stop_tasks(self._task)

    async def _register(self) -> None:
        await self.client.put(MEMBERS_PREFIX + self.name.encode(), json.dumps(self.address).encode())

    async def _read(self) -> int:
        """Every member etcd has now (a node gone from it meanwhile has left); returns the revision read."""
        reply = await self.client.get_prefix(MEMBERS_PREFIX)
        present = [json.loads(kv.value) for kv in reply]
        for name in self.known - {address["name"] for address in present}:
            self._gone(name)
        for address in present:
            self._seen(address)
        return reply.header.revision

    async def _watch(self, revision: int) -> None:
        """Follow the members from ``revision``; after an error, read them all again (etcd may have compacted
        the history a resume would need) and follow on from there."""
        while True:
            try:
                watch = await self.client.watch_prefix(MEMBERS_PREFIX, start_revision=revision + 1)
                async for event in watch:
                    if event.kind == rtypes.EventKind.PUT:
                        self._seen(json.loads(event.kv.value))
                    else:
                        self._gone(event.kv.key[len(MEMBERS_PREFIX):].decode())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("etcd membership watch failed (%s); reading the members again", exc)
                await asyncio.sleep(RETRY_INTERVAL)
            try:
                revision = await self._read()
            except aetcd.ClientError:
                pass  # the watch fails again, and so on until etcd answers

    async def forget(self, name: str) -> None:
        await self.client.delete(MEMBERS_PREFIX + name.encode())

    def _seen(self, address: dict[str, Any]) -> None:
        if address["name"] != self.name:
            self.known.add(address["name"])
            self.joined(address["name"], address)

    def _gone(self, name: str) -> None:
        self.known.discard(name)
        self.left(name)
