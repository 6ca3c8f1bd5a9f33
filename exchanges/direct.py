"""Direct exchange: a message goes to destinations bound with exactly its routing key."""

from __future__ import annotations

from typing import Any

from .base import NO_DESTINATIONS, Binding, DestinationSet, Exchange


class DirectExchange(Exchange):
    """Hash lookup per publish; returns a shared immutable set, no allocation."""

    __slots__ = ("_routes",)

    type_name = "direct"

    @property
    def routes_each_key(self) -> bool:
        return True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._routes: dict[str, DestinationSet] = {}

    def route(self, routing_key: str, message: Any) -> frozenset:
        dests = self._routes.get(routing_key)
        return dests.members if dests is not None else NO_DESTINATIONS

    def _add(self, binding: Binding) -> None:
        dests = self._routes.get(binding.routing_key)
        if dests is None:
            dests = self._routes[binding.routing_key] = DestinationSet()
        dests.add(binding.destination)

    def _remove(self, binding: Binding) -> None:
        dests = self._routes[binding.routing_key]
        dests.discard(binding.destination)
        if not dests:
            del self._routes[binding.routing_key]
