"""Delayed-message exchange, as RabbitMQ's rabbitmq_delayed_message_exchange plugin defines it.

Declared with ``x-delayed-type`` naming the type that routes (direct, topic,
fanout, headers, ...).  A message whose ``x-delay`` header is a positive number
of milliseconds (at most 2^32 - 1) is not routed now: ``route`` answers
:data:`DEFERRED` and the broker keeps the message until it is due, then routes
it again with ``x-delay`` negated, which this exchange routes at once.  Holding
and timing messages is the broker's business; this module only decides.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from .base import Binding, Exchange

MAX_DELAY = 4294967295  # the plugin's limit (Erlang's largest timer); longer delays route at once


class _Deferred(frozenset):
    """An empty route result that means "held for later", not "unroutable"."""

    __slots__ = ()


DEFERRED: frozenset = _Deferred()


def delay_of(message: Any) -> int:
    """The message's ``x-delay`` in ms, read as the plugin does: integers, numeric strings, floats truncated;
    anything else is no delay.  Messages offer ``header_value(name)``."""
    value = message.header_value("x-delay")
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, (str, bytes)):
        try:
            return int(value)
        except ValueError:
            return 0
    return 0


class DelayedExchange(Exchange):
    """Bindings and routing are the underlying type's; only the decision to defer is added."""

    __slots__ = ("inner",)

    type_name = "x-delayed-message"
    # the underlying types by name: the registry's (``exchanges/__init__``)
    types: ClassVar[Mapping[str, type[Exchange]]] = {}

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        inner_type = self.arguments.get("x-delayed-type")
        if inner_type == self.type_name:
            raise ValueError("Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
        if not isinstance(inner_type, str):
            raise ValueError("Invalid argument, 'x-delayed-type' must be an existing exchange type")
        cls = self.types.get(inner_type)
        if cls is None:
            raise LookupError(inner_type)
        self.inner: Exchange = cls(name, *args, **kwargs)

    @property
    def routes_each_key(self) -> bool:
        return self.inner.routes_each_key  # (the plugin's route/2 calls the underlying type's)

    def route(self, routing_key: str, message: Any) -> Any:
        if 0 < delay_of(message) <= MAX_DELAY:
            return DEFERRED
        return self.inner.route(routing_key, message)

    def _add(self, binding: Binding) -> None:
        self.inner._add(binding)

    def _remove(self, binding: Binding) -> None:
        self.inner._remove(binding)
