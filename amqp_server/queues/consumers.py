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
from typing import Any, Callable

from .queue_args import QueueArgs


class ConsumerGroup:
    """The consumers of one priority that receive messages, and where round-robin among them resumes."""

    __slots__ = ("priority", "consumers", "rr")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.consumers: list[Any] = []  # queue.Consumer
        self.rr = 0


def _priority(consumer: Any) -> int:
    return consumer.priority


class Consumers(list[Any]):
    """A queue's consumers (``queue.Consumer``), in registration order: the list itself; those that receive, in
    priority groups (``groups``, highest first), of which with single active consumer the one active consumer
    is the only member; and the x-expires countdown, which they keep from running."""

    __slots__ = ("groups", "active", "had_consumer", "_args", "_on_unused", "_expires_timer")

    def __init__(self, args: QueueArgs, unused: Callable[[], None]) -> None:
        super().__init__()
        self.groups: list[ConsumerGroup] = []  # consumers that receive, by descending priority
        self.active: Any = None  # x-single-active-consumer: the one that receives
        self.had_consumer = False
        self._args = args
        self._on_unused = unused  # x-expires ran out with no consumer
        self._expires_timer: asyncio.TimerHandle | None = None

    def set_args(self, args: QueueArgs) -> None:
        """The queue's effective arguments changed: x-expires cleared stops the countdown."""
        self._args = args
        if args.expires is None:
            self.stop()

    def touch(self) -> None:
        """Used (declared, consumed, got from): restart the x-expires countdown."""
        expires = self._args.expires
        if expires is None:
            return
        if self._expires_timer is not None:
            self._expires_timer.cancel()
        self._expires_timer = asyncio.get_running_loop().call_later(expires / 1000, self._expired)

    def _expired(self) -> None:
        self._expires_timer = None
        if not self:  # consumers keep it alive; the countdown restarts when the last one leaves
            self._on_unused()

    def stop(self) -> None:
        """No countdown any more (the queue is deleted, or x-expires cleared)."""
        if self._expires_timer is not None:
            self._expires_timer.cancel()
            self._expires_timer = None

    def join(self, consumer: Any) -> None:
        self.append(consumer)
        self.had_consumer = True
        if not self._args.single_active_consumer:
            self._join_group(consumer)
        elif self.active is None:
            self._activate(consumer)

    def leave(self, consumer: Any) -> bool:
        """The consumer is cancelled or its channel closed; a single active one hands over.  False if it was not
        one of them."""
        try:
            super().remove(consumer)
        except ValueError:
            return False
        if not self._args.single_active_consumer:
            self._leave_group(consumer)
        elif consumer is self.active:
            self._activate(max(self, key=_priority, default=None))
        return True

    def reset(self) -> None:
        """Nobody receives any more (the queue is deleted)."""
        self.groups = []
        self.active = None

    def _join_group(self, consumer: Any) -> None:
        groups = self.groups
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
        for group in self.groups:
            if group.priority == consumer.priority:
                index = group.consumers.index(consumer)
                del group.consumers[index]
                if index < group.rr:
                    group.rr -= 1
                if not group.consumers:
                    self.groups.remove(group)
                return

    def _activate(self, consumer: Any) -> None:
        self.active = consumer
        self.groups = []
        if consumer is not None:
            self._join_group(consumer)
