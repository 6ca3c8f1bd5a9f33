"""Local random exchange (RabbitMQ 4.0's ``x-local-random``), for request-reply: each message goes to one queue
picked at random among the bound queues that live on the publisher's node (the node routing it), or to none.

As RabbitMQ (rabbit_exchange_type_local_random) it takes only bindings with an empty key to classic queues;
others are refused with its texts (a 406).  A queue is local unless it is a cluster proxy of a queue another node
holds (``remote``)."""

from __future__ import annotations

import random
from typing import Any, Collection

from .base import NO_DESTINATIONS, Binding, DestinationSet, Exchange


class LocalRandomExchange(Exchange):
    """Routing picks from the snapshot of local destinations, rebuilt when bindings change."""

    __slots__ = ("_dests", "_local", "_local_of")

    type_name = "x-local-random"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dests = DestinationSet()
        self._local: tuple[object, ...] = ()
        self._local_of: frozenset | None = None  # the destination set _local was computed from

    def route(self, routing_key: str, message: Any) -> Collection[object]:
        members = self._dests.members
        if members is not self._local_of:
            self._local = tuple(dest for dest in members if not getattr(dest, "remote", False))
            self._local_of = members
        local = self._local
        if not local:
            return NO_DESTINATIONS
        return (local[0],) if len(local) == 1 else (random.choice(local),)

    def _add(self, binding: Binding) -> None:
        if binding.routing_key:
            raise ValueError(f"Non empty binding '{binding.routing_key}' key not permitted")
        queue_type = getattr(getattr(binding.destination, "type", None), "name", None)
        if queue_type is None or isinstance(binding.destination, Exchange):
            raise ValueError("Destination not found")
        if queue_type != "classic":
            raise ValueError(f"Queue type rabbit_{queue_type}_queue not valid for this exchange type")
        self._dests.add(binding.destination)

    def _remove(self, binding: Binding) -> None:
        self._dests.discard(binding.destination)
