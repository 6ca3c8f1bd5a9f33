"""Finds every expired entry of a queue, wherever it sits — not only at the head.

A min-heap with lazy deletion: entries that left the queue some other way are
skipped when they surface.  Each item is one integer, ``expiry << 64 | seq``
(about 48 bytes with its list slot, where a tuple of two would take some 130),
since a deep queue with a TTL holds one per message, on disk or not.
"""
from __future__ import annotations

import heapq

_SEQ_BITS = 64
_SEQ_MASK = (1 << _SEQ_BITS) - 1


class ExpiryHeap:
    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, expiry: int, seq: int) -> None:
        heapq.heappush(self._heap, expiry << _SEQ_BITS | seq)

    def next_deadline(self) -> int | None:
        return self._heap[0] >> _SEQ_BITS if self._heap else None

    def due(self, now: int) -> bool:
        """An expiry at or before ``now`` is waiting."""
        heap = self._heap
        return bool(heap) and heap[0] < (now + 1) << _SEQ_BITS

    def pop_due(self, now: int) -> list[int]:
        """Sequence numbers whose expiry is at or before ``now`` (some may be gone already)."""
        heap = self._heap
        due = []
        limit = (now + 1) << _SEQ_BITS
        while heap and heap[0] < limit:
            due.append(heapq.heappop(heap) & _SEQ_MASK)
        return due

    def clear(self) -> None:
        self._heap.clear()
