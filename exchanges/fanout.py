"""Fanout exchange: every bound destination gets every message; the key is ignored."""

from __future__ import annotations

from typing import Any

from .base import Binding, DestinationSet, Exchange


class FanoutExchange(Exchange):
    """Routing returns one shared immutable snapshot of all destinations."""

    __slots__ = ("_dests",)

    type_name = "fanout"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dests = DestinationSet()

    def route(self, routing_key: str, message: Any) -> frozenset:
        return self._dests.members

    def _add(self, binding: Binding) -> None:
        self._dests.add(binding.destination)

    def _remove(self, binding: Binding) -> None:
        self._dests.discard(binding.destination)
