"""The ``x-federation-upstream`` exchange, as RabbitMQ's federation plugin registers it
(rabbit_federation_upstream_exchange): what a downstream's federation link declares on its upstream, between the
federated exchange and the link's queue.

A fanout that drops a message which has already made ``x-max-hops`` hops (entries in its ``x-received-from``
header) or which came through the downstream before (an entry naming the downstream's cluster, argument
``x-downstream-name``, and vhost, ``x-downstream-vhost``), so that a message does not travel back round a loop
of federated exchanges.
"""

from __future__ import annotations

from typing import Any

from .fanout import FanoutExchange

MAX_HOPS = "x-max-hops"
DOWNSTREAM_NAME = "x-downstream-name"
DOWNSTREAM_VHOST = "x-downstream-vhost"
ROUTING_HEADER = "x-received-from"


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def already_seen(name: Any, vhost: Any, hops: list[Any]) -> bool:
    """A hop of ``hops`` (x-received-from's entries) came from cluster ``name``'s vhost ``vhost``."""
    return any(isinstance(hop, dict) and _text(hop.get("cluster-name")) == name and _text(hop.get("vhost")) == vhost
               for hop in hops)


def should_forward(headers: dict[str, Any] | None, max_hops: int, name: Any, vhost: Any) -> bool:
    """rabbit_federation_util:should_forward: fewer hops than ``max_hops``, none through (``name``, ``vhost``)."""
    hops = (headers or {}).get(ROUTING_HEADER)
    if not isinstance(hops, list):
        return True
    return len(hops) < max_hops and not already_seen(name, vhost, hops)


class FederationUpstreamExchange(FanoutExchange):
    __slots__ = ("_max_hops", "_name", "_vhost")

    type_name = "x-federation-upstream"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        max_hops = self.arguments.get(MAX_HOPS)
        if max_hops is None:
            raise ValueError(f"Argument {MAX_HOPS} missing")
        if not isinstance(max_hops, int) or isinstance(max_hops, bool):
            raise ValueError(f"Argument {MAX_HOPS} must be of type long")
        self._max_hops = max_hops
        # (missing before RabbitMQ 3.3.0 / 3.8.9: no entry matches then)
        self._name = _text(self.arguments.get(DOWNSTREAM_NAME, object()))
        self._vhost = _text(self.arguments.get(DOWNSTREAM_VHOST, object()))

    def route(self, routing_key: str, message: Any) -> frozenset:
        if message.has_headers and not should_forward(message.headers, self._max_hops, self._name, self._vhost):
            return frozenset()
        return super().route(routing_key, message)
