"""Routing (RabbitMQ's rabbit_router): the queues a message goes to, through exchange-to-exchange bindings,
alternate exchanges, sender-selected keys (CC, BCC), direct reply-to and delayed exchanges.
"""
from __future__ import annotations

from typing import Collection, cast

from exchanges import DEFERRED, Exchange

from . import sender_selected
from .delayed_messages import DelayedMessages, MandatoryPublisher
from .direct_reply import ReplyConsumers
from ..message import Message
from .vhost import VHost
from .definitions import Destination


class Router:
    """Routing, for publish, dead letters and delayed messages: to queues, direct reply-to consumers
    (``replies``) and delayed exchanges (``delayed``)."""

    def __init__(self, replies: ReplyConsumers, delayed: DelayedMessages) -> None:
        self.replies = replies
        self.delayed = delayed

    def route(self, vhost: VHost, exchange: Exchange, message: Message,
              publisher: MandatoryPublisher | None = None) -> Collection[Destination]:
        """The queues a message goes to, through exchange-to-exchange bindings and alternate exchanges.

        A reply to an AMQP 0-9-1 direct reply-to consumer is delivered here and is no queue's (``ReplyConsumers``).

        A delayed exchange on the way that defers the message hands it to ``delayed``, and its alternate
        exchange, if it has one, routes it now as well (rabbit_exchange:route1/3's process_alternate sees the
        plugin's []); if nothing else took it, the answer is ``DEFERRED`` (empty, but not unroutable).
        """
        if message.has_headers:
            extra = sender_selected.routing_keys(message)
            if extra:
                return self._route_keys(vhost, exchange, message, (message.routing_key, *extra), publisher)
        if exchange.name == "":
            queue = vhost.queues.get(message.routing_key)
            return (queue,) if queue is not None else self.replies.route(message.routing_key, message)
        destinations = exchange.route(message.routing_key, message)
        if not vhost.e2e_bindings and (destinations or exchange.alternate is None):
            if destinations is DEFERRED:
                self.delayed.defer(vhost, exchange, message, publisher)
            return cast("Collection[Destination]", destinations)  # (no exchange-to-exchange binding: queues)
        return self._route_keys(vhost, exchange, message, (message.routing_key,), publisher)

    def _route_keys(self, vhost: VHost, exchange: Exchange, message: Message,
                    keys: tuple[str, ...], publisher: MandatoryPublisher | None = None) -> Collection[Destination]:
        """Route by several keys (CC/BCC) at once: each queue once, an alternate exchange only for an
        exchange none of the keys routes through.  An exchange type that routes once per message
        (``Exchange.routes_each_key`` false) is asked once, with the first key."""
        queues: dict[Destination, None] = {}
        if exchange.name == "":
            for key in dict.fromkeys(keys):  # (each reply consumer once, as rabbit_exchange:route/2's usort)
                queue = vhost.queues.get(key)
                queues.update(dict.fromkeys((queue,) if queue is not None else self.replies.route(key, message)))
            return queues.keys()
        seen: set[Exchange] = set()
        pending = [exchange]
        deferred = False
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            routed = current.route(keys[0], message)
            if routed is DEFERRED:  # whatever the key: the delay is the message's; held, it routed nowhere now,
                self.delayed.defer(vhost, current, message, publisher)  # so its alternate exchange takes it too
                deferred = True
            elif len(keys) > 1 and current.routes_each_key:  # (others: once per message, by the first key)
                routed = [destination for key in keys for destination in current.route(key, message)]
            for destination in routed:
                if isinstance(destination, Exchange):  # (an exchange's binding)
                    pending.append(destination)
                else:
                    queues[cast("Destination", destination)] = None
            if not routed:
                alternate = vhost.exchanges.get(current.alternate or "")
                if alternate is not None and alternate.name:
                    pending.append(alternate)
        return DEFERRED if deferred and not queues else queues.keys()
