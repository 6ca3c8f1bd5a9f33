"""Exchange types for Warren: binding bookkeeping and message routing only.

Offers `Exchange` (abstract base), `Binding`, one class per AMQP exchange type
(direct, fanout, topic, headers, and the plugins' x-consistent-hash,
x-delayed-message and x-federation-upstream, and x-local-random; one module each, as in RabbitMQ) and a registry
`EXCHANGE_TYPES` / `exchange_class()` mapping a declared type name to its class.
Knows nothing of sockets or storage; destinations are opaque hashable objects.
"""

from __future__ import annotations

from .base import Binding, Exchange
from .consistent_hash import ConsistentHashExchange
from .delayed import DEFERRED, DelayedExchange, delay_of
from .direct import DirectExchange
from .fanout import FanoutExchange
from .federation_upstream import FederationUpstreamExchange
from .headers import HeadersExchange
from .local_random import LocalRandomExchange
from .topic import TopicExchange

EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    cls.type_name: cls
    for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange, ConsistentHashExchange,
                DelayedExchange, FederationUpstreamExchange, LocalRandomExchange)
}
DelayedExchange.types = EXCHANGE_TYPES  # (it cannot import the registry, which imports it)


def exchange_class(type_name: str) -> type[Exchange] | None:
    """Class for a declared exchange type, or None (the broker answers 503 COMMAND_INVALID).

    Constructing one may raise ValueError for invalid arguments (406 PRECONDITION_FAILED)
    or LookupError naming an unknown type they refer to (503 COMMAND_INVALID).
    """
    return EXCHANGE_TYPES.get(type_name)


__all__ = [
    "Binding", "Exchange", "EXCHANGE_TYPES", "exchange_class",
    "DirectExchange", "FanoutExchange", "TopicExchange", "HeadersExchange", "ConsistentHashExchange",
    "DelayedExchange", "DEFERRED", "delay_of", "FederationUpstreamExchange", "LocalRandomExchange",
]
