"""Dead-lettering (RabbitMQ's rabbit_dead_letter): entries that left a queue for good are republished to its
dead-letter exchange.  How a dead letter's message is made is ``dlx_message.py``'s.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Iterator

from exchanges import DEFERRED

from .dlx_message import cycle_detected, dead_letter_message
from ..logs import untrusted
from ..message import Message
from ..queues.queue import AnyQueue, Entry
from .vhost import VHost
from .routing import Router

log = logging.getLogger("warren.broker")


class DeadLetters:
    """Dead-lettering, for the queues (``queue.QueueHost``)."""

    def __init__(self, vhosts: dict[str, VHost], router: Router, load_body: Callable[[Message], None]) -> None:
        self.vhosts = vhosts
        self.router = router
        self.load_body = load_body  # (the pager's: from whichever store holds a body)

    def dead_letter(self, queue: AnyQueue, entries: list[Entry], reason: str) -> list[Entry]:
        """Republish entries that left ``queue`` for good to its dead-letter exchange; returns those no queue
        took (no such exchange, routed nowhere, refused), which at-most-once dead-lettering drops as
        RabbitMQ does and at-least-once keeps for a retry."""
        vhost, name = self.vhosts.get(queue.vhost), queue.args.dead_letter_exchange
        exchange = vhost.exchanges.get(name) if vhost is not None and name is not None else None
        if vhost is None or exchange is None:
            return entries
        untaken = []
        for entry in self._with_bodies(entries):
            try:
                message = dead_letter_message(entry.message, queue.name, reason, exchange.name,
                                              queue.args.dead_letter_routing_key)
            except ValueError as exc:  # a definition stored before its arguments were checked at declare
                log.error("dead letter from queue %s in vhost %s dropped: %s", untrusted(queue.name),
                          untrusted(queue.vhost), untrusted(exc))
                continue
            routed = self.router.route(vhost, exchange, message)
            if routed is DEFERRED:  # a delayed exchange holds it
                continue
            targets = [target for target in routed if not cycle_detected(message, target.name)]
            accepted = [bool(target.enqueue(message)) for target in targets]
            if not any(accepted) and (targets or not routed):  # (routed only into a cycle: dropped)
                untaken.append(entry)
        return untaken

    def _with_bodies(self, entries: Iterable[Entry]) -> Iterator[Entry]:
        """The entries, each with its body while its dead letter is made and routed: a body the store alone
        holds is read for it then, and left to the store again after it (its target queues hold what they
        keep), so that a nack of many large messages, or their expiry, holds one body at a time, not all."""
        for entry in entries:
            message = entry.message
            if message.body is not None:
                yield entry
                continue
            self.load_body(message)
            try:
                yield entry
            finally:
                message.body = None  # (as Message.stored's)
