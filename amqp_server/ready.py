"""The ready list a queue hands entries out of: one FIFO, or one FIFO per priority level.

Both offer what :class:`~amqp_server.queue.Queue` needs: ``append`` / ``popleft`` / ``len`` /
iteration in delivery order, plus putting a requeued entry back at its place, compaction of
expired entries, and walks in ``seq`` order for the offset readers (the Spark bridge).

A plain queue's list *is* a deque (a subclass adds only the slow-path methods), so publish and
deliver pay nothing for priorities.  A priority queue (``x-max-priority``) keeps a deque per
level: delivery takes the highest non-empty level first, FIFO (by ``seq``) within a level.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from itertools import chain, islice
from typing import TYPE_CHECKING, Iterable, Iterator

if TYPE_CHECKING:
    from .queue import Entry


def _seq(entry: "Entry") -> int:
    return entry.seq


def _put_back(ready: deque, entry: "Entry") -> None:
    """Insert a requeued entry where its ``seq`` puts it (usually at one end)."""
    if not ready or entry.seq > ready[-1].seq:
        ready.append(entry)
    elif entry.seq < ready[0].seq:
        ready.appendleft(entry)
    else:
        insort(ready, entry)


def _from_seq(ready: deque, start: int) -> Iterator["Entry"]:
    first = bisect_left(ready, start, key=_seq) if ready and ready[0].seq < start else 0
    return islice(ready, first, None)


def _pop_below(ready: deque, offset: int) -> Iterator["Entry"]:
    while ready and ready[0].seq < offset:
        yield ready.popleft()


def _compact(ready: deque) -> None:
    live = [entry for entry in ready if not entry.gone]
    ready.clear()
    ready.extend(live)


class FifoReady(deque):
    """A plain queue's ready entries, in ``seq`` order."""

    def put_back(self, entry: "Entry") -> None:
        _put_back(self, entry)

    def from_seq(self, start: int) -> Iterator["Entry"]:
        """Entries with ``seq >= start``, in ``seq`` order."""
        return _from_seq(self, start)

    def pop_below(self, offset: int) -> Iterator["Entry"]:
        """Take out every entry with ``seq < offset``."""
        return _pop_below(self, offset)

    def compact(self) -> None:
        """Drop the entries marked gone (expired in place)."""
        _compact(self)


class PriorityReady:
    """A priority queue's ready entries: a FIFO per level 0..max, the highest level first.

    A message's level is its ``priority`` property (0 when unset), capped at the queue's maximum.
    """

    __slots__ = ("levels", "top", "count")

    def __init__(self, max_priority: int) -> None:
        self.levels: list[deque["Entry"]] = [deque() for _ in range(max_priority + 1)]
        self.top = -1  # no level above this one holds entries
        self.count = 0

    def _level(self, entry: "Entry") -> int:
        return min(entry.message.priority, len(self.levels) - 1)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator["Entry"]:
        """Delivery order: highest level first, ``seq`` order within a level."""
        return chain.from_iterable(reversed(self.levels[:self.top + 1]))

    def append(self, entry: "Entry") -> None:
        level = self._level(entry)
        self.levels[level].append(entry)
        self.count += 1
        if level > self.top:
            self.top = level

    def popleft(self) -> "Entry":
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

    def put_back(self, entry: "Entry") -> None:
        level = self._level(entry)
        _put_back(self.levels[level], entry)
        self.count += 1
        if level > self.top:
            self.top = level

    def from_seq(self, start: int) -> Iterable["Entry"]:
        """Entries with ``seq >= start`` across all levels, in ``seq`` (publish) order."""
        return heapq.merge(*(_from_seq(level, start) for level in self.levels if level))

    def pop_below(self, offset: int) -> Iterator["Entry"]:
        for level in self.levels:
            for entry in _pop_below(level, offset):
                self.count -= 1
                yield entry

    def compact(self) -> None:
        for level in self.levels:
            _compact(level)
        self.count = sum(len(level) for level in self.levels)
