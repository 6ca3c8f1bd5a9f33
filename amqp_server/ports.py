"""What the broker core asks of its front ends, as Protocols: the core imports no front end.

The AMQP channel and connection (``amqp091/channel.py``, ``amqp091/connection.py``), the forwarder's session for
consumers on other nodes (``forwarder/peers/owner_side.py``) and its replication (``forwarder/quorum/groups.py``)
implement these; queues and the broker hold them without knowing which one they have.

This module imports nothing of the project, so that the core and the front ends both import it and no import
cycle runs through it: where a protocol names an object of the core (a queue, a consumer, an entry, a message),
it takes that object's class as a type parameter, which the core fills in (``DeliveryTarget[Consumer, Entry]``).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol, TypeVar

ConsumerT = TypeVar("ConsumerT", contravariant=True)  # a consumer (queue.Consumer, direct_reply.ReplyConsumer)
EntryT = TypeVar("EntryT", contravariant=True)  # a queue's entry (queue.Entry)
MessageT = TypeVar("MessageT", contravariant=True)  # a message (message.Message)
OpT = TypeVar("OpT", contravariant=True)  # an op of a replicated queue's state (quorum_ops.LogOp)
QueueT = TypeVar("QueueT")  # a queue (queue.Queue)
StreamT = TypeVar("StreamT", contravariant=True)  # a stream (stream_queue.StreamQueue)
TargetT = TypeVar("TargetT", contravariant=True)  # a queue a publisher's target names (queue.Queue)
UNLIMITED = 0xFFFFFFFF  # a ``SharedLimit``'s grant once the channel has no shared limit: the queue's own window only


class ClientChannel(NamedTuple):
    """The client's channel a consumer belongs to, wherever it is: what the HTTP API lists with the consumer."""

    connection: str  # the connection's name
    number: int
    peer: tuple[str, int]  # the client's address
    user: str
    node: str  # the node the client is connected to


class QueueTarget(Protocol[TargetT]):
    """A publisher whose target names one queue (an AMQP 1.0 link to ``/queues/q``): told when the queue goes."""

    def target_deleted(self, queue: TargetT) -> None:
        """The queue was deleted."""


class DeliveryTarget(Protocol[ConsumerT, EntryT]):
    """Where a consumer's messages go: an AMQP channel, or the link to the node its client is on."""

    def client(self) -> ClientChannel:
        """The client's channel (the link: as the client's node described it)."""

    def can_deliver(self, shared: bool) -> bool:
        """Room for another delivery now (prefetch aside: the queue counts that per consumer); ``shared``: for a
        consumer whose queue takes a limit the target's consumers share into account (basic.qos global)."""

    def deliver(self, consumer: ConsumerT, entry: EntryT) -> None:
        """Send ``entry`` to ``consumer``'s client; it stays unacked unless the consumer is no-ack.

        The queue has already counted it against the consumer's prefetch (``consumer.unacked``); the target
        hands it back through ``Broker.settle_taken``, which counts it off again."""

    def cancelled_by_broker(self, consumer: ConsumerT) -> None:
        """The queue went away (deleted, or its node went down): tell the client."""

    def failed(self, consumer: ConsumerT, reason: str) -> None:
        """The consumer's next message cannot be read (a stream record too large to decode): its client is
        failed as RabbitMQ fails it, with 541 INTERNAL_ERROR."""

    def handed_over(self, consumer: ConsumerT, old: Any, new: Any) -> None:
        """Another object stands for the consumer's queue (a quorum queue's leader moved): the consumer goes on
        with it (``Queue.take_consumer``), its client unaware."""


class Grantee(Protocol):
    """A consumer of another node's queue as its channel's ``SharedLimit`` grants it room."""

    def grant(self, count: int) -> None:
        """The queue's node may send it ``count`` more (``UNLIMITED``: the channel has no shared limit now)."""

    def recall(self) -> None:
        """What it was granted and has not used is wanted back (another of the channel's queues waits for room)."""

    def limit(self) -> None:
        """Its channel has a shared limit from now on (basic.qos global after it consumed, as rabbit_channel's
        ``activate_limit_all`` tells the queues it consumes from): the queue's node sends only what is granted."""


class SharedLimit(Protocol[ConsumerT]):
    """A channel's shared prefetch (basic.qos global) as another node's queue is held to it: as
    rabbit_limiter:can_send is asked before each delivery, the queue's node sends a consumer of this node only
    what the channel granted it out of its room (reserved until it arrives or comes back unused)."""

    global_prefetch: int

    def want(self, consumer: ConsumerT, grantee: Grantee) -> None:
        """The queue has (or may soon have) a message for ``consumer`` and no credit for it (rabbit_limiter's
        blocked queue): ``grantee`` is granted room once the channel has some."""

    def arrived(self) -> None:
        """A delivery granted arrived: it takes its room as an unacked delivery now."""

    def unreserve(self, consumer: ConsumerT, count: int) -> None:
        """``count`` deliveries granted to ``consumer`` came back unused, or will not come (it is gone): the room
        goes to the queues waiting for it."""


class ReplyTarget(Protocol[ConsumerT, MessageT]):
    """The channel of an ``amq.rabbitmq.reply-to`` consumer: replies bypass queues."""

    def deliver_reply(self, consumer: ConsumerT, message: MessageT) -> None: ...


class ReplyNode(Protocol[MessageT]):
    """Another node (cluster mode), as direct reply-to reaches the reply consumers of its clients."""

    def send_reply(self, name: str, message: MessageT) -> None:
        """Hand a reply to its consumer ``name`` there, over the link (nothing is answered: none is awaited)."""

    async def has_reply_consumer(self, name: str) -> bool:
        """Whether its consumer ``name`` is there (False while the link is down)."""


class ExclusiveOwner(Protocol[QueueT]):
    """A client connection: it owns its exclusive queues, and the broker may close it."""

    name: str
    vhost_name: str
    peer: tuple[str, int]  # the client's address (the HTTP API shows it)
    exclusive_queues: set[QueueT]

    def force_close(self, reason: str) -> None:
        """Close with 320 CONNECTION_FORCED and ``reason``."""


class ClientRegistry(Protocol):
    """The node's client connections, as far as the broker must reach them."""

    def close_vhost(self, name: str, reason: str) -> None:
        """Close every connection to vhost ``name`` with 320 CONNECTION_FORCED and ``reason``."""


class ConfirmSink(Protocol):
    """The confirm-mode channel whose publish is being routed: copies forwarded to other nodes confirm here."""

    def forwarded(self) -> int:
        """The publish sequence number a forwarded copy will confirm."""

    def remote_confirmed(self, seq: int, rejected: bool) -> None: ...

    def waiting(self, change: int) -> None:
        """``change`` more (or fewer) of its publishes wait for a quorum queue's leader: a publisher that can be
        held back is, while more than a few do (``publisher_flow.LEADER_WAITS``)."""


class Replicator(Protocol[OpT]):
    """Where the leader of a replicated queue sends its state machine's ops (``forwarder.quorum.oplog``): the
    core only hands them over, in the order it applied them."""

    index: int  # the index in its term's log of the latest op appended
    committed: int  # the highest index a majority of the group's copies has
    term: int  # the leader's: what its checkouts are named by, with their seqs (``Checkout.term``)
    agreed_below: int  # the seqs below it were made by ops a majority has: every later leader's copy has them
    base: tuple[int, int]  # (term, index) where the leader's copy stood as its term began
    base_seq: int  # no entry made since has a seq below this

    def append(self, op: OpT, confirm: ConfirmSink | None = None) -> None:
        """An op applied; ``confirm`` (an enqueue's publish, if any) is told once the queue's group has it."""

    def tag(self) -> tuple[int, int]:
        """(enqueuer, seq) of a confirmed publish made on this node: what the state takes once."""

    def confirm_later(self, confirm: ConfirmSink) -> None:
        """``confirm`` (a publish the queue took before) is told once every op so far is on the group's majority."""

    def flush(self) -> None:
        """Send what was reported so far now (else it goes at the end of the loop turn)."""

    def allowance(self, window: int) -> int:
        """How many deliveries the queue may make now, to consumers whose prefetch adds up to ``window``: none
        unless this node surely still leads (its lease is alive); the replicator asks the queue to deliver again
        (``deliver_ready``) once it may make more."""

    def when_agreed(self, done: Callable[[bool], None]) -> bool:
        """``done(False)`` once every op so far is on a majority, ``done(True)`` if the leader is deposed (or its
        queue deleted) first; False, ``done`` never called, when a majority has them already."""


class ShovelRunner(Protocol):
    """The node's dynamic shovels (``shovel.Shovels``), as the HTTP API reaches them through the broker."""

    def changed(self) -> None:
        """A shovel parameter was set or cleared here: look again now."""

    def status(self) -> list[dict[str, Any]]:
        """The shovels this node runs, as RabbitMQ's /api/shovels lists them."""

    async def restart(self, vhost: str, name: str) -> bool:
        """Restart a shovel this node runs (False: it runs none such)."""


class FederationRunner(Protocol):
    """The node's federation links (``federation.Federation``), as the HTTP API reaches them through the broker."""

    def changed(self) -> None:
        """A federation parameter was set or cleared here: look again now."""

    def status(self) -> list[dict[str, Any]]:
        """The links this node runs, as RabbitMQ's /api/federation-links lists them."""

    async def restart(self, vhost: str, link_id: str) -> bool:
        """Restart a link this node runs (False: it runs none such)."""


class StreamListener(Protocol[StreamT]):
    """A stream-protocol connection reading or writing a stream (``stream.reader``): told of what the stream
    does, so that it reads on or lets go."""

    def appended(self, stream: StreamT) -> None:
        """A chunk was appended (cheap: the reading waits for the end of the loop turn)."""

    def deleted(self, stream: StreamT) -> None:
        """The stream was deleted."""
