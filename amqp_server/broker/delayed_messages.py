"""Delayed messages (``x-delayed-message`` exchanges): held until due, then routed as if just published.

A message sent to a durable delayed exchange is stored — the message in the
persistent store, an entry keyed by (due time, seq) in the LMDB schedule — in
the same group commit (and fsync) as queue writes, so it survives a restart and
is routed when due, or at once if it fell due while the node was down: the
plugin keeps every delivery in disc_copies tables, whatever its delivery mode.
A persistent one's publish is confirmed once that is durable (so it survives a
kill -9 too); a transient one's is confirmed at once.  A message sent to a
non-durable exchange is held in memory: the exchange does not outlive a restart.

One timer serves every delayed exchange.  A heap holds what falls due soon:
in-memory messages, and stored entries due within ``WINDOW_MS`` (as references,
not bodies); stored entries due later stay on disk and are read in, in order,
by a cursor as the window moves.  So with millions pending, memory holds the
store's small per-message index and a window of entries, not bodies.

Unlike the plugin, ``mandatory`` works: a delayed message that finally routes
nowhere goes back to its publisher as basic.return — if that channel is still
open.  If it is gone (closed, or the node restarted) the message is dropped,
logged and counted in ``returns_dropped``.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import os
import struct
from array import array
from collections import Counter
from typing import TYPE_CHECKING, Protocol

from exchanges import DelayedExchange, Exchange, delay_of
from msg_store import MessageStore
from queue_index import Schedule, ScheduledEntry

from ..message import Message
from ..clock import now_ms
from ..logs import untrusted

if TYPE_CHECKING:
    from ..queues.persistence import Persistence
    from .vhost import VHost

log = logging.getLogger("warren.delayed")

WINDOW_MS = 2000  # stored entries due this far ahead are in the heap
LOAD_LIMIT = 1000  # stored entries read in per loop turn (more follow in the next turns)
ROUTE_BATCH = 200  # messages routed per loop turn, so clients keep being served while a backlog drains
_TAG_LEN = struct.Struct(">H")
MAX_SEQ = (1 << 64) - 1
LATENESS_BUCKETS = 10_000  # ms; later ones count in the last bucket


class MandatoryPublisher(Protocol):
    """The channel that published a mandatory delayed message."""

    open: bool

    def basic_return(self, message: Message) -> None: ...


class Host(Protocol):
    """What due messages need of the broker: its store, its vhosts, and publishing."""

    persistence: Persistence
    vhosts: dict[str, VHost]

    def publish(self, vhost: VHost, exchange: Exchange, message: Message) -> tuple[bool, bool]: ...


class _Held:
    """A delayed message kept in memory (transient, or sent to a non-durable exchange)."""

    __slots__ = ("target", "message", "publisher")

    def __init__(self, target: tuple[str, str], message: Message, publisher: MandatoryPublisher | None) -> None:
        self.target = target  # (vhost, exchange)
        self.message = message
        self.publisher = publisher


class DelayedMessages:
    def __init__(self, broker: Host, data_dir: str) -> None:
        self.broker = broker
        self.persistence = broker.persistence
        self.schedule = Schedule(os.path.join(data_dir, "delayed_index"))
        self.persistence.journals.append(self)
        self.persistence.claims.append(self.claim)
        self.loop = asyncio.get_running_loop()
        self.pending: Counter[tuple[str, str]] = Counter()  # (vhost, exchange) -> messages waiting
        self.returns_dropped = 0  # mandatory and unroutable when due, but the publisher's channel was gone
        self.dropped = 0  # due after their exchange was deleted
        self.lateness = array("Q", bytes(8 * LATENESS_BUCKETS))  # routed messages by ms between due and routing
        # (due, seq, msg_id, size, tag) of a stored message, (due, seq, 0, 0, _Held) of a held one: a stored
        # one's item holds only ints and bytes, so the garbage collector stops tracking it
        self._heap: list[tuple[int, int, int, int, bytes | _Held]] = []
        self._seq = 0
        self._horizon = (0, 0)  # every stored entry with a (due, seq) up to this is in the heap
        self._beyond = 0  # stored entries due after the horizon (on disk only)
        self._returns: dict[int, MandatoryPublisher] = {}  # seq of a stored mandatory message -> its publisher
        self._timer: asyncio.Handle | None = None  # call_later's, or call_soon's when overdue
        self._timer_due = 0

    # -- the persistence journal: committed, synced and recovered with the queue index --------

    def commit(self) -> None:
        self.schedule.commit()

    def sync(self) -> None:
        self.schedule.sync()

    def claim(self, store: MessageStore) -> None:
        """At recovery: take back each scheduled message's store reference; forget those the store lost."""
        lost = 0
        for entry in self.schedule.entries():
            self._seq = max(self._seq, entry.seq + 1)
            if store.claim(entry.msg_id):
                self.pending[_untag(entry.tag)] += 1
                self._beyond += 1
            else:
                self.schedule.delete(entry.due, entry.seq)
                lost += 1
        self.schedule.commit()
        if self._beyond or lost:
            log.info("recovered %d delayed messages (%d missing from the store)", self._beyond, lost)

    def start(self) -> None:
        """After recovery: read in what is due (or overdue) and set the timer."""
        self._advance(now_ms())
        self._rearm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.schedule.close()
        routed = sum(self.lateness)
        if routed:
            log.info("delayed messages routed: %d, ms late p50 %d p99 %d max %d", routed,
                     *(self.late_percentile(p) for p in (50, 99, 100)))

    def late_percentile(self, percent: float) -> int:
        """Milliseconds between falling due and being routed, for ``percent`` of the messages routed so far."""
        rank = sum(self.lateness) * percent / 100
        seen = 0
        for ms, count in enumerate(self.lateness):
            seen += count
            if count and seen >= rank:
                return ms
        return 0

    # -- in ------------------------------------------------------------------------------------

    def defer(self, vhost: "VHost", exchange: Exchange, message: Message, publisher: MandatoryPublisher | None) -> None:
        """Hold a message its delayed exchange deferred; ``publisher`` is set if it was published mandatory."""
        delay = delay_of(message)
        # the copy routed when due, x-delay negated as the plugin's swap_delay_header: routed once, not again; a
        # queue the same publish reached at once (through another binding upstream) keeps the message as sent
        held = message.copy()
        held.set_int_header("x-delay", -delay)
        due = now_ms() + delay
        seq = self._seq
        self._seq += 1
        target = (vhost.name, exchange.name)
        self.pending[target] += 1
        if not exchange.durable:
            self._push((due, seq, 0, 0, _Held(target, held, publisher)))
            return
        self.persistence.keep(held)
        if message.persistent:  # (stored apart: its publish is confirmed once the stored copy is durable)
            message.logged = True
        entry = ScheduledEntry(due, seq, held.msg_id, held.body_size, _tag(vhost.name, exchange.name))
        self.schedule.put(entry)
        if publisher is not None:
            self._returns[seq] = publisher
        if (due, seq) <= self._horizon:
            self._push((due, seq, entry.msg_id, entry.size, entry.tag))
        else:
            self._beyond += 1
            self._rearm()

    def _push(self, item: tuple[int, int, int, int, bytes | _Held]) -> None:
        heapq.heappush(self._heap, item)
        if self._timer is None or item[0] < self._timer_due:
            self._rearm()

    # -- timing --------------------------------------------------------------------------------

    def _next_wake(self) -> int | None:
        wake = self._heap[0][0] if self._heap else None
        if self._beyond:
            move = self._horizon[0] - WINDOW_MS // 2
            wake = move if wake is None else min(wake, move)
        return wake

    def _rearm(self) -> None:
        wake = self._next_wake()
        if wake is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        if self._timer is not None:
            if self._timer_due == wake:
                return
            self._timer.cancel()
        self._timer_due = wake
        self._timer = self.loop.call_later(max(0, wake - now_ms()) / 1000, self._fire)

    def _advance(self, now: int) -> None:
        """Move the window: read in stored entries due before ``now + WINDOW_MS``, at most ``LOAD_LIMIT``
        (the rest in later turns)."""
        entries = self.schedule.between(self._horizon, now + WINDOW_MS, LOAD_LIMIT)
        if len(entries) == LOAD_LIMIT:
            self._horizon = (entries[-1].due, entries[-1].seq)
        else:
            self._horizon = (now + WINDOW_MS, MAX_SEQ)
        self._beyond -= len(entries)
        for entry in entries:
            heapq.heappush(self._heap, (entry.due, entry.seq, entry.msg_id, entry.size, entry.tag))

    def _fire(self) -> None:
        self._timer = None
        now = now_ms()
        if self._beyond and now >= self._horizon[0] - WINDOW_MS // 2:
            self._advance(now)
        heap = self._heap
        routed = 0
        lateness = self.lateness
        while heap and heap[0][0] <= now and routed < ROUTE_BATCH:
            item = heapq.heappop(heap)
            lateness[min(now - item[0], LATENESS_BUCKETS - 1)] += 1
            self._route(*item)
            routed += 1
        if heap and heap[0][0] <= now:
            self._timer_due = now
            self._timer = self.loop.call_soon(self._fire)
            return
        self._rearm()

    # -- out -----------------------------------------------------------------------------------

    def _route(self, due: int, seq: int, msg_id: int, size: int, item: bytes | _Held) -> None:
        held = isinstance(item, _Held)
        if isinstance(item, _Held):
            key, message, publisher = item.target, item.message, item.publisher
        else:
            key = _untag(item)
            publisher = self._returns.pop(seq, None)
            self.schedule.delete(due, seq)
            message = Message.stored(msg_id, size)
            self.persistence.load_body(message)
        self._forget(key)
        vhost = self.broker.vhosts.get(key[0])
        exchange = vhost.exchanges.get(key[1]) if vhost is not None else None
        if vhost is None or not isinstance(exchange, DelayedExchange):
            self.dropped += 1
            log.debug("delayed message for deleted exchange %s in vhost %s dropped", untrusted(key[1]),
                      untrusted(key[0]))
        else:
            routed, _ = self.broker.publish(vhost, exchange, message)
            if not routed and publisher is not None:
                if publisher.open:
                    publisher.basic_return(message)
                else:
                    self.returns_dropped += 1
                    log.info("mandatory delayed message for exchange %s in vhost %s routed nowhere and its channel is "
                             "closed: dropped", untrusted(key[1]), untrusted(key[0]))
        if not held:
            self.persistence.release(message)

    def _forget(self, key: tuple[str, str]) -> None:
        count = self.pending[key] - 1
        if count > 0:
            self.pending[key] = count
        else:
            del self.pending[key]


def _tag(vhost: str, exchange: str) -> bytes:
    raw = vhost.encode()
    return _TAG_LEN.pack(len(raw)) + raw + exchange.encode()


def _untag(tag: bytes) -> tuple[str, str]:
    length = _TAG_LEN.unpack_from(tag)[0]
    start = _TAG_LEN.size
    return tag[start:start + length].decode(), tag[start + length:].decode()
