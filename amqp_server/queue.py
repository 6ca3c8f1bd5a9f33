"""A queue: its ready messages, its consumers, and the round-robin that joins them.

Delivery is synchronous: an enqueue with a consumer that has credit goes out
in the same call, so a message published and consumed on one broker touches
no scheduler.  The channel owns delivery tags and the unacked map; the queue
only hands entries over and takes them back.

Expired entries are found through an expiry heap wherever they sit (:mod:`expiry`).

Only the head of the ready list need be in memory: past ``window`` entries (a
durable queue) or when memory runs short (any queue but a priority one), the
tail goes to disk as queue index entries (:mod:`disk_tail`), so order holds.

The ready list is a deque in ``seq`` order; a priority queue (``x-max-priority``,
:mod:`priority_queue`) keeps one per priority level.  Consumers are grouped by their
``x-priority``: a group gets messages only while every higher one is out of
credit, round-robin within it (:mod:`consumers`).

:class:`Queue` is enqueue and delivery; its other concerns are its parts, each in a module of its own
(:mod:`queue_base` lists them): consumers and x-expires in :mod:`consumers`, settling in :mod:`settle`, the
Spark bridge's reads and commits in :mod:`spark_bridge.queue_reads`.
"""
from __future__ import annotations

import asyncio
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING, Any

from queue_index import ExpiryHeap

from .clock import now_ms
from .disk_tail import CONSUMED_WINDOW, MIN_WINDOW
from .message import Message
from .consumers import ConsumerGroup, Consumers
from .queue_args import QueueArgs
from .queue_base import QueueHost, TailCount, TransientPages
from .ready import Entry
from .spark_bridge.queue_reads import DiskSpan
from .stats import MessageStats

if TYPE_CHECKING:
    from .persistence import Persistence
    from .policy import Policy
    from .ports import ConfirmSink, DeliveryTarget, ExclusiveOwner
    from .queue_type import QueueType

__all__ = ["Consumer", "ConsumerGroup", "DiskSpan", "Entry", "Queue"]  # what the rest of the node takes from a queue


class Consumer:
    """basic.consume on one queue; ``prefetch`` 0 means unlimited."""

    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "arguments", "prefetch",
                 "unacked", "prefix", "priority", "counted")

    def __init__(self, tag: str, channel: "DeliveryTarget[Consumer, Entry]", queue: "Queue", no_ack: bool,
                 exclusive: bool, arguments: dict, prefetch: int, prefix: bytes, priority: int = 0) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self.prefetch = prefetch
        self.unacked = 0
        self.prefix = prefix  # encoded Basic.Deliver class/method + consumer tag
        self.priority = priority  # x-priority
        self.counted = queue.counts_deliveries  # its deliveries' header is the queue's (delivery_header)

    def has_credit(self) -> bool:
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()


class Queue(Consumers):
    """A FIFO of entries plus its consumers, as RabbitMQ's classic queue behaves."""

    available = True  # a cluster proxy (forwarder.RemoteQueue) is not while its home node is down
    remote = False  # a cluster proxy: basic.get and purge are awaited (fetch, purged)
    ranked = False  # a priority queue keys its index entries by level, then seq (row_key)
    entry_type = Entry  # a priority queue's entries know their level
    counts_deliveries = False  # a quorum queue sets x-delivery-count on each delivery (delivery_header)
    persists_all = False  # a durable quorum queue stores transient messages too (a copy of its own)
    DROPS_COMMITTED_LATER = True  # a commit counts its entries on disk (count_committed); they go in the background
    PURGES_LATER = True  # a purge's entries on disk leave in the background (Pager.drop_later), marked dropped

    def __init__(self, name: str, vhost: str, durable: bool = False,
                 exclusive_owner: "ExclusiveOwner[Queue] | None" = None, auto_delete: bool = False,
                 arguments: dict[str, Any] | None = None, args: QueueArgs | None = None,
                 host: QueueHost | None = None, *, queue_type: "QueueType") -> None:
        self.type = queue_type  # what the rest of the node asks, rather than branching on the class
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.args = args or QueueArgs()
        self._limited = self.args.limited
        self._ttl = self.args.message_ttl is not None
        self.host = host
        self.ready: deque[Entry] = deque()
        self.gone_in_ready = 0
        self.ready_bytes = 0
        self.consumers: list[Consumer] = []  # in registration order
        self.active_consumer: Consumer | None = None  # x-single-active-consumer: the one that receives
        self._groups: list[ConsumerGroup] = []  # consumers that receive, by descending priority
        self.unacked = 0
        self.unacked_bytes = 0
        self.next_seq = 0
        self.had_consumer = False
        self.deleted = False
        self.stats = MessageStats()
        self.index_id = 0
        self.persistence: "Persistence | None" = None  # set for durable queues
        self._expiring: dict[int, Entry] = {}
        self._expiry = ExpiryHeap()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expires_timer: asyncio.TimerHandle | None = None
        self._fresh = -1  # seq of the entry being published: not expired on its way to a consumer
        self.pager: "TransientPages | None" = None  # set for a queue that may page
        self.window: int | None = None  # entries kept in memory before the tail pages out (durable queues)
        self.tail = TailCount()  # ready entries on disk only, all with seq >= paged_from, and their bytes
        self.paged_from = 0
        self.page_id = 0  # a non-durable queue's id in the transient index, once it pages
        self._taken_upto = -1  # the highest seq ever taken by a consumer or basic.get
        self.committed = 0  # offset cursor of remove_upto (Spark bridge): only moves forward; in memory
        self._drop_below = 0  # entries on disk from paged_from to here are committed away, being counted
        self._counting = (0, 0, 0)  # where that count goes on from, the entries and bytes counted so far
        self._drop_marks: list[int] = []  # the index's drop marks naming them, forgotten once they are gone
        self.committed_drops = 0  # entries on disk removed by commits, in all (what a commit's answer counts)
        self.policy: "Policy | None" = None  # the user / operator policy applied (see policy.py)
        self.operator_policy: "Policy | None" = None
        self.touch()

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def node(self) -> str:
        """The node the queue lives on: this one (a proxy's is its owner's)."""
        return self.host.node_name if self.host is not None else ""

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}/{self.name}>"

    # -- in -----------------------------------------------------------------------------------

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """Add a published message; False if the queue's length limit rejects it (reject-publish).

        ``confirm`` matters only to a queue of another node or a replicated one, whose group must have the
        message first; otherwise a confirm follows the fsync."""
        args = self.args
        limited = self._limited
        if limited and args.overflow != "drop-head" and self._full(message.body_size):
            if args.overflow == "reject-publish-dlx":
                self._dead_letter([Entry(self.next_seq, message)], "maxlen", persisted=False)
            return False
        expiry = self._expiry_for(message) if self._ttl or message.has_expiration else 0
        entry = self.entry_type(self.next_seq, message, False, expiry)
        self.next_seq += 1
        self.stats.publish += 1
        if self.persistence is not None and (self.persists_all or message.persistent):
            self._store(entry, confirm)  # before anything else can remove the entry
        if self.tail.count or expiry:
            self._append(entry)
        else:  # _append's common case, inline: this is the hot path
            self.ready_bytes += message.body_size
            self.ready.append(entry)
        if limited and args.overflow == "drop-head":
            self._drop_overflow()
        if self.consumers:
            self._fresh = entry.seq  # TTL 0 (or a deadline passing this ms): a waiting consumer still gets it
            self.deliver_ready()
            self._fresh = -1
        depth, pager = len(self.ready), self.pager
        # a cheap test first (the hot path): could the window, whatever it is now, be exceeded?
        if self.window is not None and depth > MIN_WINDOW and pager is not None and (
                depth > pager.share or depth > (CONSUMED_WINDOW if self.consumers else self.window)):
            window = self._window()
            if depth > window:
                self.page_out(window // 2)
        if expiry and self._expiry.due(now_ms()):
            self._expire_due()  # TTL 0: delivered above or expired now
        return True

    def restarted(self) -> None:
        """The node started again and recovered the queue from its storage (a replicated queue reads back its
        state then)."""

    def _store(self, entry: Entry, confirm: "ConfirmSink | None") -> None:
        """A durable queue's persistent entry goes to storage (a replicated queue's to its group too)."""
        assert self.persistence is not None  # (durable: attach gave it the node's)
        self.persistence.write(self, entry)

    def _stored_copy(self, message: Message) -> Message:
        """The message as a queue that stores every message (``persists_all``) keeps it: a transient one not
        yet stored becomes a copy of its own, so the other queues it went to keep theirs in memory."""
        if not message.persistent and self.persistence is not None and not message.msg_id:
            return message.copy()
        return message

    def _append(self, entry: Entry) -> None:
        """A ready entry joins the tail: on disk if the tail is there (so order holds), else in memory."""
        size = entry.message.body_size
        self.ready_bytes += size
        if self._tail_on_disk(entry):
            self._page_write(entry)
            self._count_paged(entry, size)
            if entry.expiry:
                self._schedule_expiry(entry.expiry, self.row_key(entry))
        else:
            self.ready.append(entry)
            if entry.expiry:
                self._track_expiry(entry)

    def set_args(self, args: QueueArgs) -> None:
        """The effective arguments changed (a policy was set or cleared): limits and x-expires apply now.

        Messages already queued keep the expiry they were given, as in RabbitMQ.
        """
        self.args = args
        self._limited = args.limited
        self._ttl = args.message_ttl is not None
        if self._limited and args.overflow == "drop-head":
            self._drop_overflow()
        if args.expires is None and self._expires_timer is not None:
            self._expires_timer.cancel()
            self._expires_timer = None
        self.touch()

    def _full(self, incoming: int) -> bool:
        args = self.args
        return ((args.max_length is not None and self.message_count >= args.max_length)
                or (args.max_length_bytes is not None and self.ready_bytes + incoming > args.max_length_bytes))

    def _drop_overflow(self) -> None:
        """drop-head: the oldest messages go (dead-lettered as maxlen) until the limits hold."""
        args = self.args
        dropped = []
        while ((args.max_length is not None and self.message_count > args.max_length)
               or (args.max_length_bytes is not None and self.ready_bytes > args.max_length_bytes)):
            entry = self._pop_ready()
            if entry is None:
                break
            dropped.append(entry)
        if dropped:
            self._dead_letter(dropped, "maxlen")

    # -- out ----------------------------------------------------------------------------------

    def deliver_ready(self) -> None:
        """Hand ready entries to consumers with credit: the highest priority group first, round-robin within.

        Credit only shrinks during one call, so a group none of whose consumers can take more is done.
        """
        ready = self.ready
        if len(ready) == self.gone_in_ready and not self.tail.count:
            return
        for group in self._groups:
            consumers = group.consumers
            n = len(consumers)
            i = group.rr
            idle = 0
            while (ready or self.tail.count) and idle < n:
                if i >= n:
                    i = 0
                consumer = consumers[i]
                i += 1
                if not consumer.has_credit():
                    idle += 1
                    continue
                entry = self._pop_ready()
                if entry is None:
                    break
                idle = 0
                if consumer.no_ack:
                    self.stats.deliver_no_ack += 1
                else:
                    self.stats.deliver += 1
                    consumer.unacked += 1  # against its prefetch until settled (Broker.settle_taken)
                consumer.channel.deliver(consumer, self._take(entry, consumer.no_ack))
            group.rr = i

    def _pop_ready(self) -> Entry | None:
        """The head live entry, leaving the ready list; expired ones met on the way are expired now."""
        ready = self.ready
        while True:
            if self.tail.count and self._page_due():
                self._page_in()
            if not ready:
                return None
            entry = ready.popleft()
            if entry.gone:
                self.gone_in_ready -= 1
                continue
            self.ready_bytes -= entry.message.body_size
            if entry.expiry:
                self._expiring.pop(self.row_key(entry), None)
                if entry.expiry <= now_ms() and entry.seq != self._fresh:
                    self._dead_letter([entry], "expired")
                    continue
            return entry

    def _take(self, entry: Entry, no_ack: bool) -> Entry:
        """An entry leaves the ready list for a consumer or basic.get."""
        self._took(entry, no_ack)
        if no_ack:
            self._forget(entry)
        elif entry.message.msg_id and self.persistence is not None and not entry.redelivered:
            self.persistence.delivered(self, entry)
        return entry

    def _took(self, entry: Entry, no_ack: bool) -> None:
        """What ``_take`` counts, and the body it loads; its storage is the caller's."""
        message = entry.message
        if entry.redelivered:
            self.stats.redeliver += 1
        if entry.seq > self._taken_upto:
            self._taken_upto = entry.seq
        if message.body is None:
            self.host.load_body(message)
        if not no_ack:
            self.unacked += 1
            self.unacked_bytes += message.body_size

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        """The content header a consumer (``get``: basic.get) receives for ``entry`` (the hot path asks only
        where ``counts_deliveries``)."""
        return entry.message.header

    def adopt(self, seqs: list[int]) -> list[Entry | None]:
        """A consumer that outlived a change of leader takes back what it held (a quorum queue's); here, none."""
        return [None] * len(seqs)

    def take_consumer(self, consumer: Consumer, held: list[tuple[Entry, int]]) -> list[Entry | None]:
        """A consumer of the object that stood for this queue before (a quorum queue's leader moved) goes on
        with this one, taking back what it holds (``held``: its entries there, and their seqs in the queue):
        the entries that stand for them here (None: not taken back)."""
        consumer.queue = self
        consumer.counted = self.counts_deliveries
        self.add_consumer(consumer)
        return self.adopt([seq for _, seq in held])

    def release(self, consumer: Consumer, entries: list[Entry]) -> tuple[list[int], list[tuple[str, Entry, int]]]:
        """The consumer goes on with another object standing for this queue (``take_consumer``): the queue's
        seqs of the entries it holds, and the settles (ack, requeue or reject; entry, seq) it made that
        this object kept for the queue's next leader (a proxy's)."""
        return [entry.seq for entry in entries], []

    def get(self, no_ack: bool) -> Entry | None:
        """basic.get: the head entry, or None."""
        self.touch()
        entry = self._pop_ready()
        if entry is None:
            self.stats.get_empty += 1
            return None
        if no_ack:
            self.stats.get_no_ack += 1
        else:
            self.stats.get += 1
        return self._take(entry, no_ack)

    async def fetch(self, no_ack: bool) -> Entry | None:
        """basic.get wherever the queue lives (a proxy asks its node): here, at once."""
        return self.get(no_ack)

    async def purged(self) -> int:
        """queue.purge wherever the queue lives (a proxy asks its node): here, at once."""
        return self.purge()

    def peek(self, offset: int = 0, count: int = 10, after: Entry | None = None) -> list[Entry]:
        """Ready entries from ``offset`` on, without taking them: order, redelivered flags and stats stay.
        ``after``: those that follow this entry instead (a long browse goes on where its last slice ended,
        without walking the queue from its head again)."""
        if after is not None:
            following = list(islice((e for e in self._from_seq(after.seq + 1) if not e.gone), count))
            if len(following) < count and self.paged:
                following.extend(self._paged_entry(row)
                                 for row in self._paged_rows(after.seq + 1, count - len(following)))
            return self._with_bodies(following)
        entries: list[Entry] = []
        skipped = 0
        for entry in self.ready:
            if entry.gone:
                continue
            if skipped < offset:
                skipped += 1
                continue
            if len(entries) >= count:
                break
            entries.append(entry)
        if len(entries) < count and self.tail.count:
            rows = self._paged_rows(0, offset - skipped + count - len(entries))
            entries.extend(self._paged_entry(row) for row in rows[offset - skipped:])
        return self._with_bodies(entries)

    def _with_bodies(self, entries: list[Entry]) -> list[Entry]:
        for entry in entries:
            if entry.message.body is None and self.host is not None:
                self.host.load_body(entry.message)
        return entries
