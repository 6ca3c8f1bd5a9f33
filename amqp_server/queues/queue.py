"""A queue: its ready messages, its consumers, and the round-robin that joins them (RabbitMQ's classic queue).

Delivery is synchronous: an enqueue with a consumer that has credit goes out
in the same call, so a message published and consumed on one broker touches
no scheduler.  The channel owns delivery tags and the unacked map; the queue
only hands entries over and takes them back.

A :class:`Queue` holds components, each with its own state, in a module of its own:

- its ready entries, a :class:`~ready_list.ReadyList` (:mod:`ready_list`): a deque in ``seq`` order whose tail,
  past ``window`` entries (a durable queue) or when memory runs short, goes to disk as queue index entries, so
  order holds; a priority queue's (``x-max-priority``, :mod:`priority_queue`) keeps one deque per level;
- its consumers (:mod:`consumers`), grouped by their ``x-priority``: a group gets messages only while every
  higher one is out of credit, round-robin within it; and its x-expires countdown;
- its expiry (:mod:`expiry`): expired entries are found through a heap wherever they sit.

The queue itself is what joins them: enqueue and delivery, settling (ack, reject, requeue), purge and deletion,
and the reads by seq the Spark bridge makes through its adapter (``spark_bridge.queue_reads.RecordSource``).
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Protocol

from ..clock import now_ms
from .consumers import ConsumerGroup, Consumers
from .expiry import Expiry
from ..message import RELEASE_FROM, Message
from .queue_args import QueueArgs
from .queue_type import DELIVERY_HEADER, GLOBAL_QOS, STORES_ALL
from .ready import Entry
from .ready_list import CONSUMED_WINDOW, MIN_WINDOW, ReadyList, TransientPages
from ..stats import MessageStats

if TYPE_CHECKING:
    from queue_index import IndexEntry

    from .persistence import Persistence, QueueRows
    from .policy import Policy
    from ..framing.file_out import Loan
    from ..ports import ConfirmSink, DeliveryTarget, ExclusiveOwner, Grantee, SharedLimit
    from .queue_type import QueueType

# what the rest of the node takes from a queue
__all__ = ["AnyQueue", "Checked", "Consumer", "ConsumerGroup", "Entry", "LocalQueue", "Queue", "ParkedSettle",
           "QueueHost", "SettleMode"]

# how a client settled what it held, as kept for a later leader or sent across a cluster link: acked, requeued
# (a delivery counted), rejected (dead-lettered), or released (requeued uncounted: AMQP 1.0's ``released``)
SettleMode = Literal["ack", "requeue", "reject", "release"]
# an entry a consumer holds, as a quorum queue's leader checked it out: (seq, term, agreed).  The seq and the term
# of its checkout name one message in every copy that has the checkout (``quorum_ops.Checkout``; a term of 0 names
# none); ``agreed``: the op that made the seq was on a majority, so every later leader's copy has that message
# under that seq, checked out or not (``QuorumQueue.adopt``)
Checked = tuple[int, int, bool]
# a settle kept for the queue's next leader: mode, entry, its checkout, a modified outcome's annotations (b"": none)
ParkedSettle = tuple[SettleMode, Entry, Checked, bytes]
# a quorum queue consumer's settles kept for a new leader, until a majority has them, at most (beyond: the oldest
# go; a leader delivers for manual ack only what a majority checked out, so what waits is about a prefetch window)
RESETTLE_MAX = 10_000


class QueueHost(Protocol):
    """What a queue asks of the broker that owns it."""

    def dead_letter(self, queue: Any, entries: list[Entry], reason: str) -> list[Entry]: ...

    def expire_queue(self, queue: Any) -> None: ...

    def load_body(self, message: Message) -> None: ...

    @property
    def node_name(self) -> str: ...


class Consumer:
    """basic.consume on one queue; ``prefetch`` 0 means unlimited."""

    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "arguments", "prefetch",
                 "unacked", "prefix", "priority", "counted", "shares_limit", "filter_set", "sends_from", "limiter",
                 "grantee")

    def __init__(self, tag: str, channel: "DeliveryTarget[Consumer, Entry]", queue: "AnyQueue", no_ack: bool,
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
        # its queue takes the channel's shared prefetch (basic.qos global) into account: a classic queue's does, a
        # quorum queue's consumers are credited by the queue alone, as rabbit_fifo's
        self.shares_limit = GLOBAL_QOS in queue.type.capabilities
        self.filter_set: bytes | None = None  # an AMQP 1.0 consumer's filters, encoded, for a stream's owner to apply
        self.sends_from = 0  # stored bodies this large it sends from the store's file, unread (0: none; ``took``)
        # its channel's shared prefetch, which another node's queue is granted credit from (an AMQP 0-9-1 channel's)
        self.limiter: "SharedLimit[Consumer] | None" = None
        # a consumer of another node's queue that shares its channel's limit: its hold there (set by the queue's proxy)
        self.grantee: "Grantee | None" = None

    def has_credit(self) -> bool:
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver(self.shares_limit)


class AnyQueue(Protocol):
    """A queue as the rest of the node uses it, wherever it lives and whatever its type (RabbitMQ's
    rabbit_queue_type): what the broker's services, the channel, AMQP 1.0's sessions, the stream protocol and the
    HTTP API call on a queue.  A queue of this node is its type's ``queue_class`` (a :class:`Queue`, or a stream's
    ``stream_queue.StreamQueue``: each a :class:`LocalQueue`); a queue of another node is a proxy of it
    (``forwarder.peers.remote_queue.RemoteQueue``).  What a queue can do is asked of its ``type``; where it lives,
    of ``node``, ``available`` and ``remote``.  Code that needs what only a queue of this node holds (its entries,
    its storage, a commit of the Spark bridge) asks ``local()`` for it and takes None for an answer."""

    type: "QueueType"
    name: str
    vhost: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]
    args: QueueArgs  # the effective arguments (its own and its policies')
    policy: "Policy | None"  # the user / operator policy applied (see policy.py)
    operator_policy: "Policy | None"
    consumers: Consumers  # its consumers on this node, and who receives
    stats: MessageStats  # what this node did with it
    deleted: bool
    unacked: int  # entries taken from it through this node, not settled yet
    counts_deliveries: bool  # its deliveries' content header is the queue's (``delivery_header``), made here

    @property
    def exclusive_owner(self) -> "ExclusiveOwner[Queue] | None":
        """The connection whose exclusive queue it is (such a queue is always of this node)."""

    @property
    def exclusive(self) -> bool: ...

    @property
    def node(self) -> str:
        """The node it lives on."""

    @property
    def available(self) -> bool:
        """Whether it can be used now (a proxy's is not while its node is down)."""

    @property
    def leaderless(self) -> bool:
        """A quorum queue's proxy while no leader is known here, or the leader's node is unreachable: what its
        leader must answer (basic.get, basic.consume, a declare's counts) waits a while for one (``VHost.reached``)."""

    @property
    def remote(self) -> bool:
        """Another node's: basic.get and queue.purge are awaited there (``fetch``, ``purged``)."""

    def local(self) -> LocalQueue | None:
        """The queue of this node (itself), or None for a proxy of another node's."""

    @property
    def message_count(self) -> int:
        """Its ready messages (a proxy's: as its node last said)."""

    @property
    def ready_bytes(self) -> int:
        """Bytes of its ready messages' bodies (a proxy knows none: 0)."""

    @property
    def active_consumer(self) -> Consumer | None: ...

    @property
    def unused_auto_delete(self) -> bool: ...

    # enqueue
    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool | None:
        """A published message: False if refused (a length limit), None if it cannot be taken now (unroutable)."""

    def set_args(self, args: QueueArgs) -> None: ...

    def touch(self) -> None: ...

    # consume
    def add_consumer(self, consumer: Consumer) -> None: ...

    def accepted(self, consumer: Consumer) -> asyncio.Future[None] | None: ...

    def remove_consumer(self, consumer: Consumer) -> None: ...

    def deliver_ready(self) -> None:
        """Credit came back: what is ready goes to the consumers that have credit."""

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes: ...

    def returns(self, entry: Entry) -> int:
        """How many times ``entry`` came back counted (a quorum queue's x-delivery-count): an AMQP 1.0 reader's
        header ``delivery-count``; 0 where a queue counts none."""

    def take_consumer(self, consumer: Consumer, held: list[tuple[Entry, Checked]]) -> list[Entry | None]: ...

    def release(self, consumer: Consumer, entries: list[Entry]) -> tuple[list[Checked], list[ParkedSettle]]:
        ...

    def keep_settles(self, settles: list[ParkedSettle]) -> None:
        """Settles a consumer handed over kept for the queue's next leader, which this object took nothing back
        for (``take_consumer``): a quorum queue's leader keeps them for the leader after it."""

    def agreed(self, seq: int) -> bool:
        """Whether every later leader's copy has ``seq`` as the message it is here (a quorum queue's)."""

    def when_agreed(self, done: Callable[[bool], None]) -> bool:
        """``done(deposed)`` once a majority of the queue's copies has what was done to it so far (a quorum
        queue's ops), or once its leader here was deposed first: False, and no call, if nothing waits."""

    # settle
    def settle(self, entries: list[Entry]) -> None: ...

    def reject(self, entries: list[Entry]) -> None: ...

    def requeue(self, entries: Iterable[Entry]) -> None: ...

    def requeue_left(self, entries: Iterable[Entry]) -> None:
        """Requeued as ``requeue`` does, because their consumer or its channel went away: a quorum queue serves
        them first (``rabbit_fifo``'s ``return_all`` of a consumer that went down)."""

    def requeue_released(self, entries: Iterable[Entry]) -> None:
        """Requeued as ``requeue`` does, but counting no delivery (AMQP 1.0's ``released``): only a queue that
        counts deliveries (a quorum queue's x-delivery-count) tells the two apart."""

    def modify(self, entries: list[Entry], requeue: bool, counted: bool, annotations: bytes) -> None:
        """AMQP 1.0's modified outcome with message annotations (their encoded map): requeued (``counted`` or
        not) or rejected; only a quorum queue sets the annotations on the messages, as in RabbitMQ 4.x."""

    # get, purge, delete
    async def fetch(self, no_ack: bool, sends_from: int = 0) -> Entry | None: ...

    async def purged(self) -> int: ...

    async def counted(self) -> tuple[int, int]:
        """(Ready messages, consumers) as the queue's node has them now, for queue.declare-ok and AMQP 1.0's
        management: a proxy asks its node, as a RabbitMQ channel asks the queue's process."""

    async def deleted_by_node(self, if_unused: bool, if_empty: bool) -> int | None:
        """queue.delete decided by the queue's node (``Queues.delete_anywhere``): a proxy of another node's
        classic queue asks that node, which deletes it unless it refuses (raised here), and answers the count of
        ready messages it had; None where this node decides (a queue of its own, or one the cluster deletes
        through its record)."""

    def drop_all(self) -> None: ...


class LocalQueue(AnyQueue, Protocol):
    """A queue of this node, whatever its type (what ``AnyQueue.local`` answers): what the broker's services, the
    stream protocol, the cluster link's owner side and the Spark bridge ask of the queue that holds the messages
    here.  The classic queue (:class:`Queue`, and the types built on it) and the stream (``stream_queue``) each
    provide it; where an operation means nothing to a type, its answer says so (a stream pages nothing out)."""

    index_id: int  # its id in this node's storage (0: a transient queue's)
    next_seq: int  # the seq the next message gets (a restart sets it no lower than it was)
    committed: int  # the Spark bridge's commit cursor
    persists_all: bool  # a durable one stores transient messages too
    host: QueueHost | None

    @property
    def persistence(self) -> "Persistence | None":
        """A durable queue's store."""

    @property
    def held_bytes(self) -> int:
        """Bytes of ready messages' bodies memory holds, that ``page_out`` could free."""

    @property
    def term(self) -> int:
        """The term a replicated queue's leader checks entries out in (``Checked``); 0 for the others."""

    @property
    def committed_drops(self) -> int: ...

    def filter_consumer(self, consumer: Consumer, accepts: Callable[[Message], bool]) -> None: ...

    def get(self, no_ack: bool, sends_from: int = 0) -> Entry | None: ...

    def purge(self) -> int: ...

    def peek(self, offset: int = 0, count: int = 10, after: Entry | None = None) -> list[Entry]: ...

    def forget(self, entry: Entry) -> None: ...

    def logged_body(self, message: Message) -> "tuple[int, int, Loan | None] | None":
        """Where a body its own log holds and ``message`` does not (a stream's large one) lies, to be sent from
        there: a descriptor of the caller's own and the body's position; None for others (a stored body is the
        store's: ``Persistence.body_file``)."""

    def adopt(self, held: list[Checked]) -> list[Entry | None]: ...

    def checked(self, entry: Entry) -> Checked: ...

    def holds(self, checked: Checked) -> bool: ...

    def page_out(self, keep: int, written: dict[int, tuple[Message, int]] | None = None) -> int: ...

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None: ...

    def restarted(self) -> None: ...

    def stop_timers(self) -> None: ...

    def remove_upto(self, offset: int) -> int: ...

    def count_committed(self) -> bool: ...

    def offsets(self) -> tuple[int, int]: ...

    def read_range(self, start: int, end: int, step: int, limit: int | None = None) -> Iterator[list[Entry]]: ...


def taken_over(queue: LocalQueue, consumer: Consumer, held: list[tuple[Entry, Checked]]) -> list[Entry | None]:
    """``AnyQueue.take_consumer`` of a queue of this node: the consumer goes on with ``queue``, which takes back
    what it can of what the consumer held (``LocalQueue.adopt``)."""
    consumer.queue = queue
    consumer.counted = queue.counts_deliveries
    queue.add_consumer(consumer)
    return queue.adopt([checked for _, checked in held])


class Queue:
    """A FIFO of entries plus its consumers, as RabbitMQ's classic queue behaves."""

    available = True  # (as AnyQueue says: this node's queue is)
    leaderless = False
    remote = False

    def __init__(self, name: str, vhost: str, durable: bool = False,
                 exclusive_owner: "ExclusiveOwner[Queue] | None" = None, auto_delete: bool = False,
                 arguments: dict[str, Any] | None = None, args: QueueArgs | None = None,
                 host: QueueHost | None = None, *, queue_type: "QueueType") -> None:
        self.type = queue_type  # what the rest of the node asks, rather than branching on the class
        # (its type's capabilities, read once: the hot path asks them)
        self.counts_deliveries = DELIVERY_HEADER in queue_type.capabilities  # its deliveries' header: delivery_header
        self.persists_all = STORES_ALL in queue_type.capabilities  # a durable one stores transient messages too
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
        self.consumers = Consumers(self.args, self._unused)  # in registration order, and who receives
        self.unacked = 0
        self.unacked_bytes = 0
        self.next_seq = 0
        self.deleted = False
        self.stats = MessageStats()
        self.index_id = 0
        self.persistence: "Persistence | None" = None  # set for durable queues
        self.rows: "QueueRows | None" = None  # and where their entries are indexed, keyed as their type keys them
        self.pager: "TransientPages | None" = None  # set for a queue that may page
        self.window: int | None = None  # entries kept in memory before the tail pages out (durable queues)
        self.expiry = Expiry(self.expire_due)  # per-message TTL
        self.ready: ReadyList = queue_type.ready_list(self, self.expiry.expiring)  # swapped by the type
        self._new_entry = self.ready.entry_type
        self.fresh = -1  # seq of the entry being published: not expired on its way to a waiting consumer
        # deliveries for manual ack that ``deliver_ready`` holds back rather than writes, while a list (a quorum
        # leader's, written once their checkouts are on a majority)
        self.held_back: list[tuple[Consumer, Entry]] | None = None
        self.committed = 0  # offset cursor of remove_upto (Spark bridge): only moves forward; in memory
        self.policy: "Policy | None" = None  # the user / operator policy applied (see policy.py)
        self.operator_policy: "Policy | None" = None
        self.touch()

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    def local(self) -> Queue:
        return self

    def filter_consumer(self, consumer: Consumer, accepts: Callable[[Message], bool]) -> None:
        """The consumer takes only the messages ``accepts`` says (an AMQP 1.0 source's filters): a stream reads past
        the others (``StreamQueue``); other types take no filters, as RabbitMQ's ignore them."""

    @property
    def node(self) -> str:
        """The node the queue lives on: this one (a proxy's is its owner's)."""
        return self.host.node_name if self.host is not None else ""

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}/{self.name}>"

    # -- what the rest of the node reads of its ready list ----------------------------------------

    @property
    def message_count(self) -> int:
        ready = self.ready
        return len(ready.entries) - ready.gone + ready.tail.count

    @property
    def ready_bytes(self) -> int:
        """Bytes of the ready messages' bodies (in memory and on disk)."""
        return self.ready.bytes

    @property
    def paged(self) -> int:
        """Ready entries on disk only."""
        return self.ready.tail.count

    @property
    def paged_bytes(self) -> int:
        """Their bodies' bytes (in ``ready_bytes`` too)."""
        return self.ready.tail.bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of the ready messages' bodies memory holds (RabbitMQ's ``message_bytes_ram``): not those on disk,
        nor those in memory whose body is in the store only (a large one released, one paged in unread)."""
        return self.ready_bytes - self.ready.tail.bytes - self.ready.unheld

    def row_key(self, entry: Entry) -> int:
        """Where ``entry`` is in the queue index (a priority queue's storage asks: its seq for other types)."""
        return self.ready.row_key(entry)

    def page_out(self, keep: int, written: dict[int, tuple[Message, int]] | None = None) -> int:
        """Memory runs short (``Pager.page_out``): the ready entries after the first ``keep`` go to disk; the bytes
        of bodies that left memory."""
        return self.ready.page_out(keep, written)

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        """At start-up: the queue index holds ``count`` entries of ``size`` bytes up to ``last_seq``, all on
        disk until they near the head; ``expiries`` are the (expiry, key) of those that have one."""
        last_seq, expiries = self.ready.recover(count, size, last_seq, expiries)
        if last_seq is not None:
            self.next_seq = max(self.next_seq, last_seq + 1)
        for expiry, key in expiries:
            self.expiry.schedule(expiry, key)

    def restarted(self) -> None:
        """The node started again and recovered the queue from its storage (a replicated queue reads back its
        state then)."""

    # -- consumers (the Consumers component) and x-expires ---------------------------------------

    def touch(self) -> None:
        """Used (declared, consumed, got from): restart the x-expires countdown."""
        if not self.deleted:
            self.consumers.touch()

    def _unused(self) -> None:
        """x-expires ran out with no consumer: the queue goes."""
        if self.host is not None and not self.deleted:
            self.host.expire_queue(self)

    def accepted(self, consumer: Consumer) -> asyncio.Future[None] | None:
        """What basic.consume-ok waits for: nothing here (a proxy waits for its node to accept the consumer)."""
        return None

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.join(consumer)
        self.touch()

    def remove_consumer(self, consumer: Consumer) -> None:
        """The consumer is cancelled or its channel closed; a single active one hands over (run the queue after)."""
        if self.consumers.leave(consumer) and not self.consumers:
            self.touch()

    @property
    def active_consumer(self) -> Consumer | None:
        """x-single-active-consumer: the one that receives."""
        return self.consumers.active

    @property
    def unused_auto_delete(self) -> bool:
        """An auto-delete queue goes once its last consumer has gone."""
        return self.auto_delete and self.consumers.had_consumer and not self.consumers

    # -- in -----------------------------------------------------------------------------------

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """Add a published message; False if the queue's length limit rejects it (reject-publish).

        ``confirm`` matters only to a queue of another node or a replicated one, whose group must have the
        message first; otherwise a confirm follows the fsync."""
        args = self.args
        limited = self._limited
        if limited and args.overflow != "drop-head" and self.full(message.body_size):
            if args.overflow == "reject-publish-dlx":
                self.dead_letter([Entry(self.next_seq, message)], "maxlen", persisted=False)
            return False
        expiry = Expiry.deadline(args.message_ttl, message) if self._ttl or message.has_expiration else 0
        entry = self._new_entry(self.next_seq, message, False, expiry)
        self.next_seq += 1
        self.stats.publish += 1
        stored = self.persistence is not None and (self.persists_all or message.persistent)
        if stored:
            self.store_entry(entry, confirm)  # before anything else can remove the entry
        ready = self.ready
        if ready.tail.count or expiry:
            self.append_entry(entry)
        else:  # append_entry's common case, inline: this is the hot path
            ready.bytes += message.body_size
            ready.entries.append(entry)
        if self.consumers:
            self.fresh = entry.seq  # TTL 0 (or a deadline passing this ms): a waiting consumer still gets it
            self.deliver_ready()
            self.fresh = -1
        if limited:  # (after a waiting consumer took it, as rabbit_amqqueue_process's deliver_or_enqueue)
            self.drop_overflow()
        if stored and message.body_size >= RELEASE_FROM and entry.seq > ready.taken_upto:
            self.release_body(entry)
        depth, pager = len(ready.entries), self.pager
        # a cheap test first (the hot path): could the window, whatever it is now, be exceeded?
        if self.window is not None and depth > MIN_WINDOW and pager is not None and (
                depth > pager.share or depth > (CONSUMED_WINDOW if self.consumers else self.window)):
            window = ready.window()
            if depth > window:
                ready.page_out(window // 2)
        if expiry and self.expiry.is_due(now_ms()):
            self.expire_due()  # TTL 0: delivered above or expired now
        return True

    def store_entry(self, entry: Entry, confirm: "ConfirmSink | None") -> None:
        """A durable queue's persistent entry goes to storage (a replicated queue's to its group too)."""
        assert self.rows is not None  # (durable: attach gave it its type's)
        self.rows.write(self, entry)

    def release_body(self, entry: Entry) -> None:
        """A large body this queue stored (its file has it: ``MessageStore.write`` wrote it at once) is not held
        by its ready entry: a delivery sends it from the file, or reads it back; so what a queue of large
        messages holds in memory is not its bodies.  (Other queues the message went to keep theirs: a transient
        queue's is only in memory.  A queue that stores every message, a quorum queue, stores a transient one
        as a copy of its own, ``stored_copy``; it stores none it does not take, ``QuorumQueue.store_entry``.)"""
        message = entry.message
        if message.msg_id and (self.persists_all or message.persistent):
            self.ready.release_body(entry)

    def stored_copy(self, message: Message) -> Message:
        """The message as a queue that stores every message (``persists_all``) keeps it: a transient one not
        yet stored becomes a copy of its own, so the other queues it went to keep theirs in memory."""
        if not message.persistent and self.persistence is not None and not message.msg_id:
            return message.copy()
        return message

    def append_entry(self, entry: Entry) -> None:
        """A ready entry joins the tail: on disk if the tail is there (so order holds), else in memory."""
        ready = self.ready
        if ready.push(entry):
            if entry.expiry:
                self.expiry.schedule(entry.expiry, ready.row_key(entry))
        elif entry.expiry:
            self.expiry.track(entry, ready.row_key(entry))

    def set_args(self, args: QueueArgs) -> None:
        """The effective arguments changed (a policy was set or cleared): limits and x-expires apply now.

        Messages already queued keep the expiry they were given, as in RabbitMQ.
        """
        self.args = args
        self._limited = args.limited
        self._ttl = args.message_ttl is not None
        self.drop_overflow()
        self.consumers.set_args(args)
        self.touch()

    def full(self, incoming: int) -> bool:
        """Whether the length limits refuse a message of ``incoming`` bytes."""
        args = self.args
        return ((args.max_length is not None and self.message_count >= args.max_length)
                or (args.max_length_bytes is not None and self.ready_bytes + incoming > args.max_length_bytes))

    def drop_overflow(self) -> None:
        """drop-head: the oldest messages go (dead-lettered as maxlen) until the limits hold (a quorum queue's
        state machine names them): after a publish none took, a requeue, or a policy's new limit."""
        args = self.args
        if not self._limited or args.overflow != "drop-head":
            return
        dropped = []
        while ((args.max_length is not None and self.message_count > args.max_length)
               or (args.max_length_bytes is not None and self.ready_bytes > args.max_length_bytes)):
            entry = self.pop_ready()
            if entry is None:
                break
            self.ready.unhold(entry)
            dropped.append(entry)
        if dropped:
            self.dead_letter(dropped, "maxlen")

    # -- out ----------------------------------------------------------------------------------

    def deliver_ready(self) -> None:
        """Hand ready entries to consumers with credit: the highest priority group first, round-robin within.

        Credit only shrinks during one call, so a group none of whose consumers can take more is done.
        """
        ready = self.ready
        entries, tail, front = ready.entries, ready.tail, ready.front
        if len(entries) == ready.gone and not tail.count and not front:
            return
        held_back = self.held_back
        for group in self.consumers.groups:
            consumers = group.consumers
            n = len(consumers)
            i = group.rr
            idle = 0
            while (entries or tail.count or front) and idle < n:
                if i >= n:
                    i = 0
                consumer = consumers[i]
                i += 1
                if not consumer.has_credit():
                    idle += 1
                    continue
                entry = self.pop_ready()
                if entry is None:
                    break
                idle = 0
                if consumer.no_ack:
                    self.stats.deliver_no_ack += 1
                    consumer.channel.deliver(consumer, self.take(entry, True, consumer.sends_from))
                    continue
                self.stats.deliver += 1
                consumer.unacked += 1  # against its prefetch until settled (Broker.settle_taken)
                entry = self.take(entry, False, consumer.sends_from)
                if held_back is None:
                    consumer.channel.deliver(consumer, entry)
                else:
                    held_back.append((consumer, entry))
            group.rr = i

    def pop_ready(self) -> Entry | None:
        """The head live entry, leaving the ready list; expired ones met on the way are expired now (a quorum
        queue's state machine names the entry, and the ready list hands over its message)."""
        ready = self.ready
        while True:
            entry = ready.pop_head()
            if entry is None:
                return None
            if entry.expiry:
                self.expiry.expiring.pop(ready.row_key(entry), None)
                if entry.expiry <= now_ms() and entry.seq != self.fresh:
                    ready.unhold(entry)
                    self.dead_letter([entry], "expired")
                    continue
            return entry

    def take(self, entry: Entry, no_ack: bool, sends_from: int = 0) -> Entry:
        """An entry leaves the ready list for a consumer or basic.get (a type that overrides ``forget`` overrides
        this too: its storage goes on the ready list's own, one call less on the delivery path)."""
        self.took(entry, no_ack, sends_from)
        if no_ack:
            if entry.message.body is None:  # left in the store for the file (``took``): forgotten once sent
                return entry
            self.ready.forget(entry)
        elif entry.message.msg_id and self.rows is not None and not entry.redelivered:
            self.rows.delivered(self, entry)
        return entry

    def took(self, entry: Entry, no_ack: bool, sends_from: int = 0) -> None:
        """What ``take`` counts, and the body it loads; its storage is the caller's.  A body the consumer sends
        from the store's file (``sends_from``: one this large, stored) is not read back: a redelivery of a large
        body, or of one recovered after a restart (whose header alone is read), costs no copy of it.  Taken
        without ack, such an entry keeps its store reference until the caller has the body's file and forgets the
        entry."""
        message = entry.message
        if entry.redelivered:
            self.stats.redeliver += 1
        ready = self.ready
        if entry.seq > ready.taken_upto:
            ready.taken_upto = entry.seq
        if message.body is None:
            ready.unheld -= message.body_size  # (as ``ReadyList.unhold``: it left the ready list, ``pop_ready``)
            if 0 < sends_from <= message.body_size and message.msg_id and self.persistence is not None:
                if message.header is None:  # recovered (or paged in unread): its header only, the body stays
                    self.persistence.load_head(message)
            else:
                self.host.load_body(message)
        if not no_ack:
            self.unacked += 1
            self.unacked_bytes += message.body_size

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        """The content header a consumer (``get``: basic.get) receives for ``entry`` (the hot path asks only
        where ``counts_deliveries``)."""
        return entry.message.header

    def returns(self, entry: Entry) -> int:
        return 0

    def adopt(self, held: list[Checked]) -> list[Entry | None]:
        """A consumer that outlived a change of leader takes back what it held (a quorum queue's); here, none."""
        return [None] * len(held)

    @property
    def term(self) -> int:
        """The term a replicated queue's leader checks entries out in (``Checked``); 0 for the others."""
        return 0

    def checked(self, entry: Entry) -> Checked:
        """How a consumer names ``entry`` to a later leader (a quorum queue's; here, as nothing it takes back)."""
        return entry.seq, 0, False

    def agreed(self, seq: int) -> bool:
        """Whether every later leader's copy has ``seq`` as the message it is here (a quorum queue's)."""
        return False

    def when_agreed(self, done: Callable[[bool], None]) -> bool:
        return False  # (one copy)

    def holds(self, checked: Checked) -> bool:
        """Whether a consumer may hold ``checked`` here: a quorum queue's entry checked out in that term (a
        classic queue's consumers never move)."""
        return False

    def take_consumer(self, consumer: Consumer, held: list[tuple[Entry, Checked]]) -> list[Entry | None]:
        """A consumer of the object that stood for this queue before (a quorum queue's leader moved) goes on
        with this one, taking back what it holds (``held``: its entries there, and their checkouts in the
        queue): the entries that stand for them here (None: not taken back)."""
        return taken_over(self, consumer, held)

    def release(self, consumer: Consumer, entries: list[Entry]) -> tuple[list[Checked], list[ParkedSettle]]:
        """The consumer goes on with another object standing for this queue (``take_consumer``): the queue's
        checkouts of the entries it holds, and the settles (their mode; entry, checkout) it made that this
        object kept for the queue's next leader (a proxy's).  Here, none that a next leader could take back."""
        return [self.checked(entry) for entry in entries], []

    def keep_settles(self, settles: list[ParkedSettle]) -> None:
        """Nothing to keep: a classic queue has no next leader."""

    def get(self, no_ack: bool, sends_from: int = 0) -> Entry | None:
        """basic.get: the head entry, or None (``sends_from``: as ``took``'s)."""
        self.touch()
        entry = self.pop_ready()
        if entry is None:
            self.stats.get_empty += 1
            return None
        if no_ack:
            self.stats.get_no_ack += 1
        else:
            self.stats.get += 1
        return self.take(entry, no_ack, sends_from)

    async def fetch(self, no_ack: bool, sends_from: int = 0) -> Entry | None:
        """basic.get wherever the queue lives (a proxy asks its node): here, at once (``sends_from``: as
        ``took``'s)."""
        return self.get(no_ack, sends_from)

    async def purged(self) -> int:
        """queue.purge wherever the queue lives (a proxy asks its node): here, at once."""
        return self.purge()

    async def counted(self) -> tuple[int, int]:
        return self.message_count, len(self.consumers)

    async def deleted_by_node(self, if_unused: bool, if_empty: bool) -> int | None:
        return None  # (this node's: ``delete_queue`` decides)

    def peek(self, offset: int = 0, count: int = 10, after: Entry | None = None) -> list[Entry]:
        """Ready entries from ``offset`` on, without taking them: order, redelivered flags and stats stay.
        ``after``: those that follow this entry instead (a long browse goes on where its last slice ended,
        without walking the queue from its head again).  A large body the store alone holds stays there, the
        entry's route and header read (its reader reads what it needs of it, ``stored_bodies.body_head``)."""
        host, persistence = self.host, self.persistence
        return [self.loaded(entry, host, persistence) for entry in self.ready.peek(offset, count, after)]

    @staticmethod
    def loaded(entry: Entry, host: QueueHost | None, heads: Persistence | None = None) -> Entry:
        """``entry`` with its body, for a reader: where the store alone holds it, read into a copy of the entry,
        so that the ready entry goes on leaving it there (``ReadyList.unheld``: a large body released stays out
        of memory however often it is browsed).  ``heads``: of a large body this store holds, the copy has the
        route and header only."""
        message = entry.message
        if message.body is not None or host is None:
            return entry
        copy = Message.stored(message.msg_id, message.body_size, message.transient_id)
        if heads is not None and message.msg_id and message.body_size >= RELEASE_FROM:
            heads.load_head(copy)
        else:
            host.load_body(copy)
        return entry.with_message(copy)

    # -- settling: what consumers and basic.get took comes back --------------------------------

    def settle(self, entries: list[Entry]) -> None:
        """Entries taken for manual ack were acked."""
        self.settled(entries)
        self.stats.ack += len(entries)
        for entry in entries:
            self.forget(entry)

    def reject(self, entries: list[Entry]) -> None:
        """Rejected or nacked without requeue: dead-lettered (if configured) and settled."""
        self.settled(entries)
        self.dead_letter(entries, "rejected")

    def settled(self, entries: list[Entry]) -> None:
        """Unacked entries are no longer."""
        self.unacked -= len(entries)
        self.unacked_bytes -= sum(entry.message.body_size for entry in entries)

    def requeue(self, entries: Iterable[Entry]) -> None:
        """Put unacked entries back in their original places, marked redelivered.  Newest first: each goes
        in front of the ready head at once (oldest first, every one after the first went into the middle of
        the deque, and 50,000 requeued into a queue of 150,000 held the loop 5 s)."""
        count = 0
        ready = self.ready
        for entry in sorted(entries, key=lambda e: e.seq, reverse=True):
            entry.redelivered = True
            count += 1
            ready.bytes += entry.message.body_size
            self.unacked_bytes -= entry.message.body_size
            if entry.expiry:
                self.expiry.track(entry, ready.row_key(entry))
            ready.put_back(entry)
        self.unacked -= count
        if count:
            self.deliver_ready()
            self.drop_overflow()  # (rabbit_amqqueue_process's requeue_and_run: maybe_drop_head)
            if self.expiry.expiring:
                self.expire_due()

    def requeue_released(self, entries: Iterable[Entry]) -> None:
        self.requeue(entries)

    def requeue_left(self, entries: Iterable[Entry]) -> None:
        self.requeue(entries)

    def modify(self, entries: list[Entry], requeue: bool, counted: bool, annotations: bytes) -> None:
        """The annotations are not kept: RabbitMQ 4.x's classic queues ignore them."""
        if not requeue:
            self.reject(entries)
        elif counted:
            self.requeue(entries)
        else:
            self.requeue_released(entries)

    def forget(self, entry: Entry) -> None:
        """An entry leaves the queue for good: its index entry and its store reference go."""
        self.ready.forget(entry)

    def logged_body(self, message: Message) -> None:
        """(A stored body is in the store's file: ``Persistence.body_file``.)"""

    # -- entries leaving for good ---------------------------------------------------------------

    def expire_due(self) -> None:
        """Mark every entry whose time is up as gone, wherever it is, and dead-letter it."""
        ready, expiry = self.ready, self.expiry
        expiring = expiry.expiring
        expired = []
        for key in expiry.pop_due(now_ms()):
            entry = expiring.pop(key, None)
            if entry is None:
                if ready.tail.count and key >= ready.disk_floor:
                    entry = ready.expire_paged(key)
                    if entry is not None:
                        expired.append(entry)
                continue  # delivered or already expired
            ready.mark_gone(entry)
            expired.append(entry)
        if expired:
            self.dead_letter(expired, "expired")
            if ready.gone > 1024 and ready.gone * 2 > len(ready.entries):
                ready.compact()
        expiry.arm()

    def dead_letter(self, entries: list[Entry], reason: str, persisted: bool = True) -> None:
        """Entries leave the queue for good: to the dead-letter exchange if one is set."""
        if self.args.dead_letter_exchange is not None and self.host is not None:
            self.host.dead_letter(self, entries, reason)  # (it reads a body the store alone holds as it goes)
        if persisted:
            for entry in entries:
                self.forget(entry)

    def purge(self) -> int:
        """Every ready entry leaves the queue; how many (those on disk in the background: ``ReadyList.purge``)."""
        count = self.message_count
        self.ready.purge(self.next_seq)
        self.expiry.clear()
        return count

    def drop_all(self) -> None:
        """The queue is deleted: its ready entries go, and its index rows (``ReadyList.drop_all``); nobody
        receives any more, and no timer runs."""
        self.ready.drop_all()
        self.expiry.clear()
        self.consumers.reset()
        self.stop_timers()

    def detach(self) -> None:
        """This object stops standing for the queue, whose storage lives on without it (a replicated queue's
        leader was deposed): it takes nothing more, forgets what it held in memory and touches no storage;
        what its clients still settle is dropped."""
        self.deleted = True
        self.persistence = None
        self.window = None
        self.clear_ready()
        self.stop_timers()
        if self.pager is not None:
            self.pager.shallow(self)

    def stop_timers(self) -> None:
        """No x-expires countdown or message expiry fires from now on (the queue is gone, this object no longer
        stands for it, or the node closes its storage)."""
        self.consumers.stop()
        self.expiry.stop()

    def clear_ready(self) -> None:
        """Nothing is ready any more (what was is forgotten already, or another's to forget)."""
        self.ready.clear()
        self.expiry.clear()

    # -- a commit (the Spark bridge's) ------------------------------------------------------------

    def remove_upto(self, offset: int) -> int:
        """Remove every ready entry with ``seq < offset`` as an ack would (index and store updated).

        Idempotent and monotonic: ``committed`` never goes back, an offset at or below it removes
        nothing more.  Returns how many entries were removed: those in memory; the ones on disk, where the
        ready list drops them later, are left to ``count_committed`` (``ReadyList.remove_below``).  An offset
        past the tail commits up to the tail: the cursor never passes offsets not given out yet, which a later
        commit could then not reach.
        """
        offset = min(offset, self.next_seq)
        if offset <= self.committed:
            return 0
        self.committed = offset
        removed = self.remove_below(offset)
        self.stats.ack += removed
        if removed:
            self.touch()
        return removed

    def remove_below(self, offset: int) -> int:
        """``remove_upto``'s removals, without its cursor and counts: how many entries left now."""
        return self.ready.remove_below(offset)

    @property
    def committed_drops(self) -> int:
        """Entries on disk removed by commits, in all (what a commit's answer counts)."""
        return self.ready.committed_drops

    def count_committed(self) -> bool:
        """Count a batch more of a commit's entries on disk (``ReadyList.count_committed``): whether more is left."""
        return self.ready.count_committed()

    # -- reads by seq (the Spark bridge's, through spark_bridge.queue_reads.RecordSource; a replica's snapshot) --

    def offsets(self) -> tuple[int, int]:
        """(head, tail): the lowest seq of a live ready entry (``next_seq`` if none), and ``next_seq``."""
        head = next((entry.seq for entry in self.ready.from_seq(0) if not entry.gone), self.next_seq)
        first_on_disk = self.ready.first_paged(0)
        return min(head, first_on_disk) if first_on_disk is not None else head, self.next_seq

    def browse(self, start: int, end: int, limit: int | None = None) -> list[Entry]:
        """Ready entries with ``start <= seq < end``, in seq order, at most ``limit``; nothing changes.

        No redelivered flag, no delivery, no stats: a retried read sees the same entries.  Entries whose
        TTL ran out are skipped.  Bodies on disk are loaded.  A priority queue's entries come in seq
        (publish) order too, not in delivery order.
        """
        found: list[Entry] = []
        for batch in self.read_range(start, end, 4096, limit):
            found.extend(batch)
        return found

    def read_range(self, start: int, end: int, step: int, limit: int | None = None) -> Iterator[list[Entry]]:
        """``browse`` a batch of at most ``step`` entries at a time, so a long read can let others run
        between batches while the queue changes: each batch is what is ready when it is read."""
        remaining = limit
        for entries in self.ready.range_slices(start, end, step):
            batch = self.readable(entries, remaining)
            if batch:
                yield batch
            if remaining is not None:
                remaining -= len(batch)
                if remaining <= 0:
                    return

    def read_parts(self, start: int, end: int, step: int) -> Iterator[tuple[list[Entry], list[IndexEntry]]]:
        """``read_range`` with no body loaded, each batch as its ready entries in memory and the index rows of
        those on disk (``ReadyList.range_parts``: no entry is made for them), for a reader of the store's
        records (a quorum queue's snapshot)."""
        for entries, rows in self.ready.range_parts(start, end, step):
            now = now_ms()
            yield self.readable(entries, load=False), [row for row in rows if not row.expiry or row.expiry > now]

    def readable(self, entries: Iterable[Entry], limit: int | None = None, load: bool = True) -> list[Entry]:
        """Of ``entries``, those still ready and unexpired, at most ``limit``, bodies loaded if ``load``."""
        found: list[Entry] = []
        if limit is not None and limit <= 0:
            return found
        now = now_ms()
        host = self.host if load else None
        for entry in entries:
            if entry.gone or (entry.expiry and entry.expiry <= now):
                continue
            found.append(self.loaded(entry, host))
            if limit is not None and len(found) >= limit:
                break
        return found
