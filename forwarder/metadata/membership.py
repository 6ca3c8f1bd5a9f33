"""Cluster membership: which nodes exist and where their links listen.

Each node writes ``/warren/members/<name>`` in etcd at start: where to dial its links.  A
node joins by starting with the same etcd endpoint and secret (one config entry); a stopped
node stays a member, its queues reported down, until it is forgotten (``warrenctl
forget-node``).  Being a member is not being reachable: a node is *up* here while our link to
it is (links carry heartbeats), which is what clients care about.

A running node also holds ``/warren/alive/<name>`` under a lease of ``NODE_TTL`` seconds, refreshed while etcd
hears it: the key is gone once etcd (a majority of its members) has not heard from the node for that long, or at
once when it stops cleanly.  That is the cluster's agreed word that the node is down, what the other nodes delete
its transient queues on (``Cluster``), as RabbitMQ's nodes do on ``rabbit_node_monitor``'s node-down.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

import aetcd
from aetcd import rtypes

from amqp_server.tasks import stop_tasks

log = logging.getLogger("warren.forwarder.membership")

MEMBERS_PREFIX = b"/warren/members/"  # every node that joined, until forgotten
ALIVE_PREFIX = b"/warren/alive/"  # every node etcd heard from within its lease: its run's id, under that lease
# seconds etcd keeps a node's alive key after its last refresh: longer than a loaded machine stalls a node's loop
# (a few seconds) and than the links' heartbeat timeout, so that a node's link is down before it is taken for dead
NODE_TTL = 15
RETRY_INTERVAL = 1.0


class Membership:
    def __init__(self, client: aetcd.Client, name: str, run: str, address: dict[str, Any],
                 joined: Callable[[str, dict[str, Any]], None], left: Callable[[str], None],
                 lapsed: Callable[[str], None]) -> None:
        self.client = client
        self.name = name
        self.run = run
        self.address = address
        self.joined = joined  # called for every other node registered, with its address
        self.left = left  # called for a node forgotten
        self.lapsed = lapsed  # called for another member whose alive key is gone (or found missing)
        self._tasks: list[asyncio.Task] = []
        self.known: set[str] = set()  # the other members
        self.alive: set[str] = set()  # the other nodes whose alive key etcd holds, as last heard
        self._lease: aetcd.Lease | None = None

    async def start(self) -> None:
        await self._register()
        await self._live()
        revision = await self._read()
        alive_revision = await self._read_alive()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._watch(MEMBERS_PREFIX, self._read, self._member, revision)),
                       loop.create_task(self._watch(ALIVE_PREFIX, self._read_alive, self._liveness, alive_revision)),
                       loop.create_task(self._keep_alive())]

    async def stop(self) -> None:
        await stop_tasks(*self._tasks)
        if self._lease is not None:
            try:
                await asyncio.wait_for(self._lease.revoke(), 2)  # down now for the others, not in NODE_TTL
            except (aetcd.ClientError, asyncio.TimeoutError):
                pass

    async def _register(self) -> None:
        await self.client.put(MEMBERS_PREFIX + self.name.encode(), json.dumps(self.address).encode())

    async def _live(self) -> None:
        """A new lease, and this node's alive key under it."""
        self._lease = await self.client.lease(NODE_TTL)
        await self.client.put(ALIVE_PREFIX + self.name.encode(), self.run.encode(), lease=self._lease)

    async def _keep_alive(self) -> None:
        """Refresh the lease five times within it; one etcd says is gone (this node was taken for dead: its
        transient queues may be deleted already) is replaced, with the key."""
        while True:
            await asyncio.sleep(NODE_TTL / 5)
            try:
                if self._lease is None:
                    await self._live()
                    continue
                reply = await asyncio.wait_for(self._lease.refresh(), NODE_TTL / 5)
                if reply.TTL <= 0:
                    log.warning("etcd had not heard from this node for %d s: taken for down by the cluster", NODE_TTL)
                    self._lease = None
            except (aetcd.ClientError, asyncio.TimeoutError):
                pass

    async def _read(self) -> int:
        """Every member etcd has now (a node gone from it meanwhile has left); returns the revision read."""
        reply = await self.client.get_prefix(MEMBERS_PREFIX)
        present = [json.loads(kv.value) for kv in reply]
        for name in self.known - {address["name"] for address in present}:
            self._gone(name)
        for address in present:
            self._seen(address)
        return reply.header.revision

    async def _read_alive(self) -> int:
        """The nodes etcd holds alive keys of now: a member without one is down."""
        reply = await self.client.get_prefix(ALIVE_PREFIX)
        self.alive = {kv.key[len(ALIVE_PREFIX):].decode() for kv in reply} - {self.name}
        for name in self.known - self.alive:
            self.lapsed(name)
        return reply.header.revision

    async def _watch(self, prefix: bytes, read: Callable[[], Awaitable[int]], changed: Callable[[Any], None],
                     revision: int) -> None:
        """Follow the keys under ``prefix`` from ``revision``; after an error, read them all again (etcd may have
        compacted the history a resume would need) and follow on from there."""
        while True:
            try:
                watch = await self.client.watch_prefix(prefix, start_revision=revision + 1)
                async for event in watch:
                    changed(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("etcd watch of %s failed (%s); reading them again", prefix.decode(), exc)
                await asyncio.sleep(RETRY_INTERVAL)
            try:
                revision = await read()
            except aetcd.ClientError:
                pass  # the watch fails again, and so on until etcd answers

    def _member(self, event: Any) -> None:
        if event.kind == rtypes.EventKind.PUT:
            self._seen(json.loads(event.kv.value))
        else:
            self._gone(event.kv.key[len(MEMBERS_PREFIX):].decode())

    async def forget(self, name: str) -> None:
        await self.client.delete(MEMBERS_PREFIX + name.encode())

    def _seen(self, address: dict[str, Any]) -> None:
        if address["name"] != self.name:
            self.known.add(address["name"])
            self.joined(address["name"], address)

    def _gone(self, name: str) -> None:
        self.known.discard(name)
        self.alive.discard(name)
        self.left(name)

    def _liveness(self, event: Any) -> None:
        name = event.kv.key[len(ALIVE_PREFIX):].decode()
        if name == self.name:
            return
        if event.kind == rtypes.EventKind.PUT:
            self.alive.add(name)
        else:
            self.alive.discard(name)
            if name in self.known:
                self.lapsed(name)
