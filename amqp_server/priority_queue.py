"""Priority queues (``x-max-priority``), as RabbitMQ's classic queues have them.

A message's level is its ``priority`` property (0 when unset), capped at the queue's maximum.
Delivery (consumers, basic.get, peek) takes the highest non-empty level first and is FIFO
(by ``seq``) within a level; a requeued entry goes back to its place in its level.  Offsets (the
Spark bridge) stay in ``seq`` order across levels.

A separate class so that a plain queue's ready list stays a bare deque: publish and deliver
pay nothing for priorities.  Everything else (TTL, limits, dead-lettering, persistence) is
:class:`~amqp_server.queue.Queue`'s, working through the ready list's deque-like surface.
"""
from __future__ import annotations

import heapq
from collections import deque
from itertools import chain, takewhile
from typing import Any, Iterable, Iterator

from .queue import Entry, Queue, from_seq, pop_below, put_back


class PriorityReady:
    """Ready entries in one deque per level 0..max; iteration and ``popleft`` go highest level first."""

    __slots__ = ("levels", "top", "count")

    def __init__(self, max_priority: int) -> None:
        self.levels: list[deque[Entry]] = [deque() for _ in range(max_priority + 1)]
        self.top = -1  # no level above this one holds entries
        self.count = 0

    def level(self, entry: Entry) -> deque[Entry]:
        """The deque ``entry`` belongs in; a level above ``top`` raises ``top``."""
        index = min(entry.message.priority, len(self.levels) - 1)
        if index > self.top:
            self.top = index
        return self.levels[index]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Entry]:
        return chain.from_iterable(reversed(self.levels[:self.top + 1]))

    def append(self, entry: Entry) -> None:
        self.level(entry).append(entry)
        self.count += 1

    def popleft(self) -> Entry:
        if not self.count:
            raise IndexError("pop from an empty ready list")
        levels = self.levels
        top = self.top
        while not levels[top]:
            top -= 1
        self.top = top
        self.count -= 1
        return levels[top].popleft()

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self.top = -1
        self.count = 0


class PriorityQueue(Queue):
    """A queue whose ready list is a :class:`PriorityReady`."""

    ready: PriorityReady  # type: ignore[assignment]
    pageable = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ready = PriorityReady(self.args.max_priority or 0)

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        """Every entry comes into memory at start-up: delivery order depends on all of them."""
        super().recover(count, size, last_seq, expiries)
        while self.paged:
            self._page_in()

    def _admit(self, entry: Entry) -> None:
        if entry.message.body is None:
            self.host.load_body(entry.message)  # the priority is in the header, which is in the store
        self.ready.append(entry)

    def _put_back(self, entry: Entry) -> None:
        put_back(self.ready.level(entry), entry)
        self.ready.count += 1

    def _from_seq(self, start: int) -> Iterable[Entry]:
        return heapq.merge(*(from_seq(level, start) for level in self.ready.levels if level))

    def span(self, start: int, end: int) -> list[Entry]:
        """The levels' entries in ``[start, end)``, merged into seq order."""
        return list(takewhile(lambda entry: entry.seq < end, self._from_seq(start))) if end > start else []

    def _pop_below(self, offset: int) -> Iterator[Entry]:
        ready = self.ready
        for level in ready.levels:
            for entry in pop_below(level, offset):
                ready.count -= 1
                yield entry

    def _compact_ready(self) -> None:
        ready = self.ready
        ready.levels = [deque(e for e in level if not e.gone) for level in ready.levels]
        ready.count = sum(map(len, ready.levels))
