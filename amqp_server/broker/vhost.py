"""A virtual host: its exchanges and queues by name, the lookups every operation starts with."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from exchanges import Exchange, exchange_class

from .. import errors
from ..errors import ChannelError

if TYPE_CHECKING:
    from ..queues.queue import AnyQueue
    from ..records import BindingRecord

LEADER_WAIT = 10.0  # seconds what needs a quorum queue's leader waits for one to be known and reached (``reached``)
REACH_POLL = 0.05  # seconds between looks meanwhile

DEFAULT_EXCHANGES = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


class VHost:
    """One virtual host's exchanges and queues."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, AnyQueue] = {}
        self.e2e_bindings = 0  # exchange-to-exchange bindings: routing takes the slow path while > 0
        self.binding_serial = 0  # counts binding changes: federation links follow their exchange's by it
        # destination -> the exchanges with a binding to it: deleting a queue costs O(its bindings)
        self.sources: dict[AnyQueue | Exchange, dict[Exchange, None]] = {}
        for ex_name, type_name in DEFAULT_EXCHANGES:
            kind = exchange_class(type_name)
            assert kind is not None  # a built-in type
            self.exchanges[ex_name] = kind(ex_name, durable=True)

    def exchange(self, name: str) -> Exchange:
        try:
            return self.exchanges[name]
        except KeyError:
            raise errors.not_found(f"no exchange '{name}' in vhost '{self.name}'") from None

    def queue(self, name: str) -> AnyQueue:
        queue = self.queues.get(name)
        if queue is None:
            raise errors.not_found(f"no queue '{name}' in vhost '{self.name}'")
        if not queue.available:
            raise home_node_down(queue)
        return queue

    async def reached(self, name: str) -> None:
        """A quorum queue whose leader cannot be reached from here now (an election, its leader's node just gone,
        this node's view not yet current): wait up to ``LEADER_WAIT`` for one, as any member of a RabbitMQ
        quorum queue answers while a majority leads it, rather than fail at once; what follows fails as before if
        none is reached by then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LEADER_WAIT
        while (queue := self.queues.get(name)) is not None and queue.leaderless and loop.time() < deadline:
            await asyncio.sleep(REACH_POLL)

    def bound(self, exchange: Exchange, destination: AnyQueue | Exchange) -> None:
        """``exchange`` got a binding to ``destination``."""
        self.binding_serial += 1
        if isinstance(destination, Exchange):
            self.e2e_bindings += 1
        sources = self.sources.get(destination)
        if sources is None:
            sources = self.sources[destination] = {}
        sources[exchange] = None

    def unbound(self, exchange: Exchange, destination: AnyQueue | Exchange, count: int = 1) -> None:
        """``count`` of ``exchange``'s bindings to ``destination`` went."""
        self.binding_serial += 1
        if isinstance(destination, Exchange):
            self.e2e_bindings -= count
        if not exchange.binds_to(destination):
            sources = self.sources.get(destination)
            if sources is not None:
                sources.pop(exchange, None)
                if not sources:
                    del self.sources[destination]

    def binding_ends(self, binding: BindingRecord) -> tuple[Exchange | None, AnyQueue | Exchange | None]:
        """A stored binding's source and destination, None for one that is not (or no longer) here."""
        table = self.queues if binding.destination_type == "queue" else self.exchanges
        return self.exchanges.get(binding.source), table.get(binding.destination)


def home_node_down(queue: AnyQueue) -> ChannelError:
    """A queue whose owner node is unreachable, in RabbitMQ's words."""
    return errors.not_found(f"home node '{queue.node}' of durable queue '{queue.name}' in vhost '{queue.vhost}' "
                            "is down or inaccessible")
