"""Delivery acknowledgement timeout (RabbitMQ's consumer_timeout): a channel holding a delivery too long is closed.

Nothing is recorded per delivery.  A channel that may hold unacked deliveries ticks
every few seconds (a fraction of its shortest timeout); each tick notes the channel's
latest delivery tag with the time.  The oldest unacked delivery was therefore made no
later than the first noted tick whose tag reaches it, so only that one delivery is
looked at, and a timeout fires at most one tick late.  As in RabbitMQ the channel is
closed with PRECONDITION_FAILED and its unacked messages go back to their queues.

Which timeout applies: the consumer's ``x-consumer-timeout`` argument, else the
queue's (the lower of its ``x-consumer-timeout`` argument and ``consumer-timeout``
policy), else the node's ``consumer_timeout``; 0 disables.
"""
from __future__ import annotations

import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Mapping, Protocol

from .. import errors

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop, TimerHandle

    from ..config import Config
    from ..errors import ChannelError
    from ..queues.queue import AnyQueue, Consumer, Entry

MAX_TICK = 5.0  # seconds between checks, whatever the timeout
TICKS_PER_TIMEOUT = 4  # a shorter timeout is checked this many times within it
MIN_TICK = 0.05


class WatchedConnection(Protocol):
    """The connection of a watched channel: the node's settings and its loop."""

    @property
    def config(self) -> Config: ...

    @property
    def loop(self) -> AbstractEventLoop: ...


class Watched(Protocol):
    """A channel as its timeout sees it (``channel.Channel``): the deliveries it holds unacknowledged, by tag."""

    @property
    def connection(self) -> WatchedConnection: ...

    @property
    def number(self) -> int: ...

    @property
    def open(self) -> bool: ...

    @property
    def delivery_tag(self) -> int: ...

    @property
    def unacked(self) -> Mapping[int, tuple[Entry, AnyQueue, Consumer | None]]: ...

    def fail(self, error: ChannelError) -> None: ...


def timeout_for(queue: "AnyQueue", consumer: "Consumer | None", default: int) -> int:
    """The timeout (ms, 0 for none) of a delivery from ``queue`` to ``consumer`` (None: basic.get)."""
    if consumer is not None:
        value = consumer.arguments.get("x-consumer-timeout")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    value = queue.args.consumer_timeout
    return default if value is None else value


def timed_out_text(channel: int, timeout: int) -> str:
    return (f"delivery acknowledgement on channel {channel} timed out. Timeout value used: {timeout} ms. "
            "This timeout value can be configured, see consumers doc guide to learn more")


class AckTimeout:
    """One channel's watch over its oldest unacknowledged delivery."""

    __slots__ = ("_channel", "tick", "_ticks", "_timer")

    def __init__(self, channel: Watched) -> None:
        self._channel = weakref.ref(channel)  # no Channel <-> AckTimeout cycle: a closed channel is freed at once
        self.tick = 0.0  # seconds; 0 while nothing is watched
        self._ticks: deque[tuple[int, float]] = deque()  # (latest delivery tag, monotonic time) per tick
        self._timer: TimerHandle | None = None

    def watch(self, queue: "AnyQueue", consumer: "Consumer | None") -> None:
        """Manual-ack deliveries may follow (basic.consume or basic.get): tick often enough for their timeout."""
        channel = self._channel()
        if channel is None:  # (its channel calls it: never)
            return
        timeout = timeout_for(queue, consumer, channel.connection.config.consumer_timeout)
        if not timeout:
            return
        tick = max(MIN_TICK, min(MAX_TICK, timeout / 1000 / TICKS_PER_TIMEOUT))
        if self.tick and self.tick <= tick:
            return
        self.tick = tick
        if self._timer is not None:
            self._timer.cancel()
        self._timer = channel.connection.loop.call_later(tick, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.tick = 0.0
        self._ticks.clear()

    def _check(self) -> None:
        channel = self._channel()
        self._timer = None
        if channel is None or not channel.open:
            return
        unacked = channel.unacked
        ticks = self._ticks
        if not unacked:
            ticks.clear()
        else:
            now = time.monotonic()
            oldest = next(iter(unacked))
            while ticks and ticks[0][0] < oldest:
                ticks.popleft()
            if not ticks or ticks[-1][0] != channel.delivery_tag:
                ticks.append((channel.delivery_tag, now))
            _, queue, consumer = unacked[oldest]
            timeout = timeout_for(queue, consumer, channel.connection.config.consumer_timeout)
            if timeout and (now - ticks[0][1]) * 1000 >= timeout:
                channel.fail(errors.precondition_failed(timed_out_text(channel.number, timeout)))
                return
        self._timer = channel.connection.loop.call_later(self.tick, self._check)
