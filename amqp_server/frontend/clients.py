"""The node's client connections and their pending output: transport state, kept out of the broker core.

The node (``node/server.py``) owns one :class:`Clients`; connections register with it and schedule their
output through it, so that everything one read of the socket produced, on any connection, goes out
in one write per connection.  The broker reaches it only through ``ports.ClientRegistry``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..config import Config
from .front_end import ClientConnection, Unauthenticated
from ..stats import MessageStats

if TYPE_CHECKING:
    from ..amqp091.connection import Connection


class Clients:
    def __init__(self, config: Config | None = None) -> None:
        self.connections: set[ClientConnection] = set()  # AMQP's and the stream protocol's
        # connections to the client ports (AMQP, AMQPS, stream, HTTP, HTTPS) until they log in: a deadline, and a
        # place among at most handshakes_max, one pool for every port (file descriptors are the process's)
        config = config or Config()
        self.handshakes = Unauthenticated("client", config.handshakes_max, config.handshake_timeout / 1000,
                                          logging.getLogger("warren.connection"))
        self._dirty: list[Connection] = []  # connections with output to write
        self._gone: dict[str, MessageStats] = {}  # by protocol: the counters of channels and sessions gone

    def fold(self, protocol: str, stats: MessageStats) -> None:
        """The counters of a channel, session or connection of ``protocol`` that is gone, kept in its protocol's
        totals (RabbitMQ's global counters, which never go down)."""
        _add(self._gone, protocol, stats)

    def stats_by_protocol(self) -> dict[str, MessageStats]:
        """Each protocol's message counters: those folded in plus every live connection's.  Nothing more is
        counted per message than what a channel or session counts for itself."""
        totals: dict[str, MessageStats] = {}
        for protocol, stats in self._gone.items():
            _add(totals, protocol, stats)
        for connection in list(self.connections):
            for stats in connection.message_stats():
                _add(totals, connection.protocol, stats)
        return totals

    def add(self, connection: ClientConnection) -> None:
        self.connections.add(connection)

    def remove(self, connection: ClientConnection) -> None:
        self.connections.discard(connection)

    def schedule_flush(self, connection: Connection) -> None:
        """Write ``connection``'s output once the current read is processed (or the loop turns)."""
        dirty = self._dirty
        if not dirty:
            asyncio.get_running_loop().call_soon(self.flush)
        dirty.append(connection)

    def flush(self) -> None:
        """Write every connection's pending output (flushing one may give another output: loop)."""
        dirty = self._dirty
        while dirty:
            connections = dirty[:]
            dirty.clear()
            for connection in connections:
                connection.flush()

    def close_vhost(self, name: str, reason: str) -> None:
        for connection in list(self.connections):
            if connection.vhost_name == name:
                connection.force_close(reason)

    def close_all(self, reason: str) -> None:
        for connection in list(self.connections):
            connection.force_close(reason)


def _add(totals: dict[str, MessageStats], protocol: str, stats: MessageStats) -> None:
    total = totals.get(protocol)
    if total is None:
        total = totals[protocol] = MessageStats()
    total.add(stats)
