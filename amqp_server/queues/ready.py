"""A queue's ready list: its entries, each a message's place in the queue, kept in ``seq`` order.

A classic queue's ready list is one deque; a priority queue (:mod:`priority_queue`) keeps one per level.  These
helpers keep a deque in order as entries come back (requeued) and leave (committed) anywhere in it.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from copy import copy
from collections import deque
from itertools import islice
from typing import Iterator

from ..message import Message

SETTLED = Message.stored(0, 0)  # the message of an entry that stands for one settled already (a settle sent again)


class Entry:
    """A message's place in one queue: its sequence number keeps requeues in order."""

    __slots__ = ("seq", "message", "redelivered", "expiry", "gone", "transient")

    def __init__(self, seq: int, message: Message, redelivered: bool = False, expiry: int = 0,
                 transient: int = 0) -> None:
        self.seq = seq
        self.message = message
        self.redelivered = redelivered
        self.expiry = expiry  # epoch ms, 0 for none
        self.gone = False  # expired while in the ready list: skipped when reached
        # paged in from the transient store: the record this entry holds a reference to, and whose index
        # entry it has (the entry's own, not the message's: a message moved to another queue is not the
        # other queue's to release)
        self.transient = transient

    def __lt__(self, other: "Entry") -> bool:
        return self.seq < other.seq

    def with_message(self, message: Message) -> "Entry":
        """A copy of the entry (its type's: a priority queue's knows its level) that holds ``message`` instead."""
        other = copy(self)
        other.message = message
        return other


def put_back(ready: deque[Entry], entry: Entry) -> None:
    """Insert a requeued entry where its ``seq`` puts it (usually at one end)."""
    if not ready or entry.seq > ready[-1].seq:
        ready.append(entry)
    elif entry.seq < ready[0].seq:
        ready.appendleft(entry)
    else:
        insort(ready, entry)


def from_seq(ready: deque[Entry], start: int) -> Iterator[Entry]:
    first = bisect_left(ready, start, key=_seq) if ready and ready[0].seq < start else 0
    return islice(ready, first, None)


def pop_below(ready: deque[Entry], offset: int) -> Iterator[Entry]:
    while ready and ready[0].seq < offset:
        yield ready.popleft()


def _seq(entry: Entry) -> int:
    return entry.seq
