"""Finds every expired entry of a queue, wherever it sits — not only at the head.

A min-heap of (expiry, seq) with lazy deletion: entries that left the queue
some other way are skipped when they surface.
"""
from __future__ import annotations

import heapq


class ExpiryHeap:
    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, expiry: int, seq: int) -> None:
        heapq.heappush(self._heap, (expiry, seq))

    def next_deadline(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: int) -> list[int]:
        """Sequence numbers whose expiry is at or before ``now`` (some may be gone already)."""
        heap = self._heap
        due = []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[1])
        return due

    def clear(self) -> None:
        self._heap.clear()
