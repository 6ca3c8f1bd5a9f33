"""What every part of a queue shares (``queue.py`` puts the parts together as :class:`queue.Queue`): the state the
parts use, what a queue asks of the broker that owns it (``QueueHost``), and the slow paths of the ready list, which
a priority queue (:mod:`priority_queue`) keeps one per level.

A queue's parts, each a class on the one before and a module named for its concern: ``disk_tail`` (its tail on
disk: paging out and in, the entries there leaving), ``expiry`` (TTL, and dead-lettering what leaves for good),
``settle`` (ack, reject, requeue, purge, delete), ``spark_bridge.queue_reads`` (the Spark bridge's reads by seq and
its commits), ``consumers`` (consumers, their priority groups, the single active one, and x-expires), and ``queue``
itself (enqueue and delivery).
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol

from queue_index import ExpiryHeap, QueueIndex

from .message import Message
from .queue_args import QueueArgs
from .queue_type import QueueType
from .ready import Entry, from_seq, pop_below, put_back
from .stats import MessageStats

if TYPE_CHECKING:
    import numpy as np

    from msg_store import MessageStore

    from .persistence import Persistence


class TailCount:
    """How many of a queue's ready entries are on disk, and their bodies' bytes: counted in this one object, the two
    always together (a priority queue's levels' tails in one too).  The queue's ``ready_bytes`` counts these bytes as
    well; ``DiskTail._left_disk`` moves it with them when entries leave the queue from disk."""

    __slots__ = ("count", "bytes")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0

    def add(self, count: int, size: int) -> None:
        """``count`` entries of ``size`` bytes in all went to disk (paged out, joined the tail there, recovered)."""
        self.count += count
        self.bytes += size

    def remove(self, count: int, size: int) -> None:
        """``count`` entries of ``size`` bytes in all are no longer on disk (paged in, or gone)."""
        self.count -= count
        self.bytes -= size

    def clear(self) -> int:
        """None is on disk any more: the bytes that were."""
        size = self.bytes
        self.count = self.bytes = 0
        return size


class QueueHost(Protocol):
    """What a queue asks of the broker that owns it."""

    def dead_letter(self, queue: Any, entries: list[Entry], reason: str) -> list[Entry]: ...

    def expire_queue(self, queue: Any) -> None: ...

    def load_body(self, message: Message) -> None: ...

    @property
    def node_name(self) -> str: ...


class TransientPages(Protocol):
    """Where a queue's tail goes when its messages are not in the persistent store, and how much of a
    queue stays in memory (paging.Pager)."""

    store: "MessageStore"
    index: QueueIndex
    share: int

    def deep(self, queue: Any) -> None: ...

    def shallow(self, queue: Any) -> None: ...

    def new_page_id(self) -> int: ...

    def write(self, message: Message) -> int: ...

    def drop_later(self, index: QueueIndex, queue_id: int, ready: list[tuple[int, int]],
                   release: Callable[[np.ndarray], None], then: Callable[[], None]) -> None: ...


class QueueBase:
    """The state a queue's parts use (``Queue.__init__`` sets it), and the operations of ``queue.py`` they call."""

    type: QueueType
    name: str
    vhost: str
    args: QueueArgs
    host: QueueHost | None
    stats: MessageStats
    deleted: bool
    ready: deque[Entry]
    gone_in_ready: int
    ready_bytes: int
    consumers: list[Any]  # queue.Consumer
    active_consumer: Any  # queue.Consumer | None
    _groups: list[Any]  # consumers.ConsumerGroup
    had_consumer: bool
    auto_delete: bool
    unacked: int
    unacked_bytes: int
    next_seq: int
    index_id: int
    persistence: Persistence | None
    _expiring: dict[int, Entry]
    _expiry: ExpiryHeap
    _expiry_timer: asyncio.TimerHandle | None
    _expires_timer: asyncio.TimerHandle | None
    pager: TransientPages | None
    window: int | None
    tail: TailCount
    paged_from: int
    page_id: int
    _taken_upto: int
    committed: int
    _drop_below: int
    _counting: tuple[int, int, int]
    _drop_marks: list[int]
    committed_drops: int
    ranked: bool
    DROPS_COMMITTED_LATER: bool
    PURGES_LATER: bool

    @property
    def message_count(self) -> int:
        return len(self.ready) - self.gone_in_ready + self.tail.count

    @property
    def paged(self) -> int:
        """Ready entries on disk only."""
        return self.tail.count

    @property
    def paged_bytes(self) -> int:
        """Their bodies' bytes (in ``ready_bytes`` too)."""
        return self.tail.bytes

    def touch(self) -> None:
        """Used: the x-expires countdown starts again (``consumers.py``)."""
        raise NotImplementedError

    def deliver_ready(self) -> None:
        """Hand ready entries to consumers with credit (``queue.py``)."""
        raise NotImplementedError

    def _schedule_expiry(self, expiry: int, seq: int) -> None:
        """The entry keyed ``seq`` expires at ``expiry`` (epoch ms), wherever it is (``expiry.py``)."""
        raise NotImplementedError

    # -- the ready list's slow paths (a priority queue has one deque per level) ------------------

    def _put_back(self, entry: Entry) -> None:
        put_back(self.ready, entry)

    def _from_seq(self, start: int) -> Iterable[Entry]:
        """Ready entries with ``seq >= start``, in seq order."""
        return from_seq(self.ready, start)

    def _pop_below(self, offset: int) -> Iterator[Entry]:
        """Take every ready entry with ``seq < offset`` out of the ready list."""
        return pop_below(self.ready, offset)

    def _compact_ready(self) -> None:
        """Drop the entries marked gone."""
        self.ready = deque(e for e in self.ready if not e.gone)
