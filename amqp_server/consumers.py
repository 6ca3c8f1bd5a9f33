"""A queue's consumers and x-expires (RabbitMQ's rabbit_queue_consumers, and the expiry of an unused queue): who
receives, in which groups, and when a queue nobody uses goes.

Consumers are grouped by their ``x-priority``: a group gets messages only while every higher one is out of
credit, round-robin within it (``queue.Queue.deliver_ready``).  With ``x-single-active-consumer`` the only group is
the active consumer; when it leaves, the next (highest priority, then earliest registered) takes over.  A queue
with ``x-expires`` is deleted once that long has passed without a consumer, a declaration or a basic.get; an
auto-delete queue goes once its last consumer has gone.
"""
from __future__ import annotations

import asyncio
from typing import Any

from .spark_bridge.queue_reads import Offsets


class ConsumerGroup:
    """The consumers of one priority that receive messages, and where round-robin among them resumes."""

    __slots__ = ("priority", "consumers", "rr")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.consumers: list[Any] = []  # queue.Consumer
        self.rr = 0


def _priority(consumer: Any) -> int:
    return consumer.priority


class Consumers(Offsets):
    """Consumers and x-expires: a part of :class:`queue.Queue` (consumers are ``queue.Consumer``)."""

    def touch(self) -> None:
        """Used (declared, consumed, got from): restart the x-expires countdown."""
        expires = self.args.expires
        if expires is None or self.deleted:
            return
        if self._expires_timer is not None:
            self._expires_timer.cancel()
        self._expires_timer = asyncio.get_running_loop().call_later(expires / 1000, self._unused)

    def _unused(self) -> None:
        self._expires_timer = None
        if self.consumers:
            return  # consumers keep it alive; the countdown restarts when the last one leaves
        if self.host is not None and not self.deleted:
            self.host.expire_queue(self)

    def accepted(self, consumer: Any) -> asyncio.Future[None] | None:
        """What basic.consume-ok waits for: nothing here (a proxy waits for its node to accept the consumer)."""
        return None

    def add_consumer(self, consumer: Any) -> None:
        self.consumers.append(consumer)
        self.had_consumer = True
        if not self.args.single_active_consumer:
            self._join_group(consumer)
        elif self.active_consumer is None:
            self._activate(consumer)
        self.touch()

    def remove_consumer(self, consumer: Any) -> None:
        """The consumer is cancelled or its channel closed; a single active one hands over (run the queue after)."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if not self.args.single_active_consumer:
            self._leave_group(consumer)
        elif consumer is self.active_consumer:
            self._activate(max(self.consumers, key=_priority, default=None))
        if not self.consumers:
            self.touch()

    def _join_group(self, consumer: Any) -> None:
        groups = self._groups
        for position, group in enumerate(groups):  # noqa: B007 (the insertion point, read after the loop)
            if group.priority == consumer.priority:
                group.consumers.append(consumer)
                return
            if group.priority < consumer.priority:
                break
        else:
            position = len(groups)
        group = ConsumerGroup(consumer.priority)
        group.consumers.append(consumer)
        groups.insert(position, group)

    def _leave_group(self, consumer: Any) -> None:
        for group in self._groups:
            if group.priority == consumer.priority:
                index = group.consumers.index(consumer)
                del group.consumers[index]
                if index < group.rr:
                    group.rr -= 1
                if not group.consumers:
                    self._groups.remove(group)
                return

    def _activate(self, consumer: Any) -> None:
        self.active_consumer = consumer
        self._groups = []
        if consumer is not None:
            self._join_group(consumer)

    @property
    def unused_auto_delete(self) -> bool:
        """An auto-delete queue goes once its last consumer has gone."""
        return self.auto_delete and self.had_consumer and not self.consumers
