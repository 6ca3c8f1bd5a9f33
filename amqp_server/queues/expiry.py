"""Per-message TTL, a component of a queue: its expired entries are found through an expiry heap wherever they sit,
so expiring a message in the middle of a long queue costs O(log n).  The queue marks them gone in place (they are
skipped when the ready list reaches them) and dead-letters them (``Queue.expire_due``).
"""
from __future__ import annotations

import asyncio
from typing import Callable, Iterable

from queue_index import ExpiryHeap

from ..clock import now_ms
from ..message import Message
from .ready import Entry


class Expiry:
    """The ready entries in memory that have an expiry (``expiring``, by their key in the queue index), the
    deadlines of those and of the entries on disk, and the timer of the next one, which calls ``due``."""

    __slots__ = ("expiring", "_heap", "_timer", "_due", "_stopped")

    def __init__(self, due: Callable[[], None]) -> None:
        self.expiring: dict[int, Entry] = {}
        self._heap = ExpiryHeap()
        self._timer: asyncio.TimerHandle | None = None
        self._due = due
        self._stopped = False

    @staticmethod
    def deadline(ttl: int | None, message: Message) -> int:
        """When a message published now expires (epoch ms, 0 for never): the queue's TTL or the message's
        expiration, the lower."""
        expiration = message.expiration_ms
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        return now_ms() + ttl if ttl is not None else 0

    def track(self, entry: Entry, key: int) -> None:
        """A ready entry in memory with an expiry (``key``: its key in the queue index)."""
        self.expiring[key] = entry
        self.schedule(entry.expiry, key)

    def schedule(self, expiry: int, key: int) -> None:
        """The entry keyed ``key`` expires at ``expiry`` (epoch ms), wherever it is."""
        heap = self._heap
        first = heap.next_deadline()
        heap.push(expiry, key)
        if first is None or expiry < first or self._timer is None:
            self.arm()

    def arm(self) -> None:
        """The timer for the next deadline (none once stopped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._heap.next_deadline()
        if deadline is not None and not self._stopped:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, (deadline - now_ms()) / 1000), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._due()

    def is_due(self, now: int) -> bool:
        """Whether a deadline has passed."""
        return self._heap.due(now)

    def pop_due(self, now: int) -> Iterable[int]:
        """The keys whose deadline has passed, out of the heap (those no longer expiring are the caller's to
        pass over)."""
        return self._heap.pop_due(now)

    def clear(self) -> None:
        """Nothing ready any more."""
        self.expiring.clear()
        self._heap.clear()

    def stop(self) -> None:
        """The queue is gone, or this object no longer stands for it: no timer from now on."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
