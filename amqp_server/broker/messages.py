"""Messages in and out (RabbitMQ's rabbit_basic and the channel's checks): publish, basic.get, settle (ack,
reject, requeue), peek, purge and move.  An AMQP channel, the HTTP API and the forwarder all come through these.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Iterable

from exchanges import DEFERRED, Exchange

from ..framing import codec
from .. import errors
from . import sender_selected
from ..access_control import Principal, User
from .delayed_messages import MandatoryPublisher
from .direct_reply import NodeReply, ReplyConsumer
from ..errors import AMQPError, resource_name
from ..message import Message, expiration_error
from ..queues.queue import AnyQueue, Consumer, Entry, ParkedSettle, Queue, SettleMode
from .vhost import VHost
from .definitions import Destination, check_exclusive
from .routing import Router

if TYPE_CHECKING:
    from ..ports import ConfirmSink, ExclusiveOwner


class Messages:
    """The broker's operations on messages."""

    def __init__(self, router: Router) -> None:
        self._route = router.route  # (once: publish's hot path)

    def purge_local(self, vhost: VHost, name: str, owner: "ExclusiveOwner[Queue] | None" = None,
                    who: Principal | None = None) -> int:
        """queue.purge of a queue of this node for ``who`` (read); see purge_anywhere."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        check_exclusive(queue, owner)
        local = queue.local()
        return local.purge() if local is not None else queue.message_count  # (another node's: see purge_anywhere)

    def publish(self, vhost: VHost, exchange: Exchange, message: Message,
                publisher: MandatoryPublisher | None = None, confirm: "ConfirmSink | None" = None) -> tuple[bool, bool]:
        """Route and enqueue: (routed to some queue or held by a delayed exchange, a queue's length limit
        rejected it).  ``publisher`` is the channel of a mandatory publish, for a delayed message's return;
        ``confirm`` the confirm-mode channel that copies forwarded to other nodes confirm to.

        A queue whose home node is down takes nothing (enqueue answers None): routed only to such
        queues, the message is unroutable.
        """
        return self.deliver(exchange, message, self._route(vhost, exchange, message, publisher), confirm)

    @staticmethod
    def deliver(exchange: Exchange, message: Message, queues: "Collection[Destination]",
                confirm: "ConfirmSink | None" = None) -> tuple[bool, bool]:
        """Enqueue a message routed (``Router.route``) to ``queues``: ``publish``'s answer.  A transaction routes
        at basic.publish and delivers at tx.commit (``still_routed``), as rabbit_channel's deliver_to_queues."""
        exchange.publish_in += 1
        if queues:
            exchange.publish_out += 1
        rejected = False
        unavailable = 0
        for queue in queues:
            accepted = queue.enqueue(message, confirm)
            if not accepted:
                if accepted is None:
                    unavailable += 1
                else:
                    rejected = True
        return len(queues) > unavailable or queues is DEFERRED, rejected

    @staticmethod
    def still_routed(vhost: VHost, queues: "Collection[Destination]") -> "Collection[Destination]":
        """The queues a publish was routed to earlier, by their names now (rabbit_amqqueue:lookup(QNames) at a
        tx.commit): one deleted since is left out, one declared again by the name takes it; a direct reply-to
        consumer as it was."""
        if queues is DEFERRED:
            return queues
        now: list[Destination] = []
        for destination in queues:
            if isinstance(destination, (ReplyConsumer, NodeReply)):
                now.append(destination)
            else:
                queue = vhost.queues.get(destination.name)
                if queue is not None:
                    now.append(queue)
        return now

    @staticmethod
    def check_publish(vhost: VHost, exchange: Exchange, who: Principal | None, routing_key: str) -> None:
        """May ``who`` publish to the exchange with ``routing_key``: write on it, it is not internal, and
        ``check_topic_write``.  A channel may skip this for an exchange it checked, but for the latter."""
        if who is not None:
            who.check("write", "exchange", vhost.name, exchange.name)
        Messages._check_publish_to(vhost, exchange, who, routing_key)

    @staticmethod
    def publish_target(vhost: VHost, name: str, who: Principal | None, routing_key: str) -> Exchange:
        """The exchange a publish names, checked in rabbit_channel's order for basic.publish: write permission on
        the name first (a missing exchange the user may not write to is refused, not not_found), then that it
        exists, then ``check_publish``'s others."""
        if who is not None:
            who.check("write", "exchange", vhost.name, name)
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            raise errors.not_found(f"no exchange '{name}' in vhost '{vhost.name}'")
        Messages._check_publish_to(vhost, exchange, who, routing_key)
        return exchange

    @staticmethod
    def _check_publish_to(vhost: VHost, exchange: Exchange, who: Principal | None, routing_key: str) -> None:
        if exchange.internal:
            raise errors.access_refused(
                f"cannot publish to internal {resource_name('exchange', exchange.name, vhost.name)}")
        Messages.check_topic_write(vhost, exchange, who, routing_key)

    @staticmethod
    def check_topic_write(vhost: VHost, exchange: Exchange, who: Principal | None, routing_key: str) -> None:
        """On a topic exchange, the user's topic permission there (if it has one now) must let it publish with
        ``routing_key``.  Topic permissions may change while a channel is open: checked for every message."""
        if who is not None and who.topics and exchange.type_name == "topic":
            who.check_topic("write", vhost.name, exchange.name, routing_key)

    @staticmethod
    def check_message(vhost: VHost, exchange: Exchange, who: Principal | None, message: Message,
                      user: User | None) -> None:
        """A published message's user_id must be the publisher's (``user``) name, unless it is tagged impersonator
        (rabbit_channel's check_user_id_header), its expiration an integer, CC/BCC arrays of keys that
        ``check_topic_write`` allows as it allows the routing key (RabbitMQ 3.10 let them past the topic
        permission; later versions check every key, as here)."""
        user_id = message.property_str(codec.FLAG_USER_ID)
        if user_id is not None and (user is None or user_id != user.name and "impersonator" not in user.tags):
            raise errors.precondition_failed(
                f"user_id property set to '{user_id}' but authenticated user was '{user.name if user else ''}'")
        expiration = message.property_str(codec.FLAG_EXPIRATION)
        if expiration is not None:
            error = expiration_error(expiration)
            if error is not None:
                raise errors.precondition_failed(f"invalid expiration '{expiration}': {error}")
        if message.has_headers:
            for key in sender_selected.check(message):
                Messages.check_topic_write(vhost, exchange, who, key)

    def get_local(self, vhost: VHost, name: str, no_ack: bool, owner: "ExclusiveOwner[Queue] | None" = None,
                  who: Principal | None = None, sends_from: int = 0) -> tuple[AnyQueue, Entry | None]:
        """basic.get of a queue of this node for ``who`` (read): the queue and its head entry (None if empty);
        with no_ack=False the caller settles it.  ``sends_from``: ``Queue.took``'s (the caller then forgets an
        entry taken without ack whose body it left in the store).  See get_anywhere for any node's queue."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        check_exclusive(queue, owner)
        local = queue.local()
        return queue, local.get(no_ack, sends_from) if local is not None else None  # (another node's: see get_anywhere)

    async def get_anywhere(self, vhost: VHost, name: str, no_ack: bool, owner: "ExclusiveOwner[Queue] | None" = None,
                    who: Principal | None = None, sends_from: int = 0) -> tuple[AnyQueue, Entry | None]:
        """basic.get on any queue, one owned by another node (cluster mode) included (a quorum queue's leader
        waited for a while if none is reached now: ``reached``); ``sends_from``: as ``get_local``'s, for a queue
        of this node.  A quorum queue whose leader moved while the get waited on the object that stood for it
        here (the leader's node died, and this node leads now) is asked again through the one that stands for it
        now, as RabbitMQ's channel asks the new leader rather than fail."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        while True:
            await vhost.reached(name)
            queue = vhost.queue(name)
            check_exclusive(queue, owner)
            try:
                return queue, await queue.fetch(no_ack, sends_from)
            except errors.ChannelError as exc:
                now = vhost.queues.get(name)
                if exc.code != errors.NOT_FOUND or now is None or now is queue:
                    raise

    def peek(self, queue: AnyQueue, offset: int, count: int, who: Principal | None = None,
             after: Entry | None = None) -> list[Entry]:
        """Ready entries from ``offset`` (or following ``after``) without taking them (management API) for
        ``who`` (read); another connection's exclusive queue is locked, as it is to basic.get."""
        if who is not None:
            who.check("read", "queue", queue.vhost, queue.name)
        check_exclusive(queue, None)
        local = queue.local()
        return local.peek(offset, count, after) if local is not None else []  # (another node's: its node answers)

    async def purge_anywhere(self, vhost: VHost, name: str, owner: "ExclusiveOwner[Queue] | None" = None,
                             who: Principal | None = None) -> int:
        """queue.purge on any queue, one owned by another node (cluster mode) included."""
        if who is not None:
            who.check("read", "queue", vhost.name, name)
        queue = vhost.queue(name)
        check_exclusive(queue, owner)
        return await queue.purged()

    @staticmethod
    def settle(queue: AnyQueue, entries: list[Entry], requeue: bool, reject: bool = False,
               counted: bool = True, annotations: bytes = b"", left: bool = False) -> None:
        """Entries taken with manual ack were acked (reject=False), rejected/nacked, or are requeued (not
        ``counted``: released, no delivery counted against them; ``left``: their channel or session went away,
        ``AnyQueue.requeue_left``); ``annotations``: an AMQP 1.0 modified outcome's (``AnyQueue.modify``)."""
        if queue.deleted:
            queue.settle(entries)
        elif annotations:
            queue.modify(entries, requeue, counted, annotations)
            if not requeue:
                queue.deliver_ready()
        elif requeue:
            if left:
                queue.requeue_left(entries)
            elif counted:
                queue.requeue(entries)
            else:
                queue.requeue_released(entries)
        else:
            if reject:
                queue.reject(entries)
            else:
                queue.settle(entries)
            queue.deliver_ready()

    def nack_taken(self, taken: list[tuple[Entry, AnyQueue, Consumer | None]], requeue: bool,
                   counted: bool = True, annotations: bytes = b"") -> None:
        """basic.nack or basic.reject of what a client held: requeued or rejected (dead-lettered), unless a queue
        refuses them (a stream: the connection closes, and what the frame named is requeued first, as the rest
        of what the connection held is as it closes).  ``annotations``: see ``settle``."""
        try:
            for queue in {queue for _, queue, _ in taken}:
                queue.type.check_nack(queue.name, queue.vhost)
        except AMQPError:
            self.settle_taken(taken, True)
            raise
        self.settle_taken(taken, requeue, reject=not requeue, counted=counted, annotations=annotations)

    def settle_taken(self, taken: Iterable[tuple[Entry, AnyQueue, Consumer | None]], requeue: bool,
                     reject: bool = False, counted: bool = True, annotations: bytes = b"", left: bool = False) -> None:
        """Settle what a client held (by a consumer, or None: by basic.get), each queue's entries in one call;
        the consumers get their credit back.  A requeue not ``counted`` counts no delivery (``requeue_released``);
        ``left``: the client's channel or session went away (``requeue_left``)."""
        by_queue: dict[AnyQueue, list[Entry]] = {}
        for entry, queue, consumer in taken:
            if consumer is not None:
                consumer.unacked -= 1
            entries = by_queue.get(queue)
            if entries is None:
                by_queue[queue] = [entry]
            else:
                entries.append(entry)
        settle = self.settle
        for queue, entries in by_queue.items():
            settle(queue, entries, requeue, reject, counted, annotations, left)

    def settle_as(self, taken: Iterable[tuple[Entry, AnyQueue, Consumer | None]], mode: SettleMode,
                  annotations: bytes = b"") -> None:
        """``settle_taken`` by a settle's mode, as one kept for a later leader or sent over a cluster link names it
        (``annotations``: a modified outcome's)."""
        self.settle_taken(taken, mode in ("requeue", "release"), mode == "reject", counted=mode != "release",
                          annotations=annotations)

    def hand_over(self, consumer: Consumer, old: AnyQueue, new: AnyQueue, held: list[Entry]) -> list[Entry | None]:
        """A quorum queue's leader moved: the consumer goes on with the object that stands for the queue now,
        which takes back what it holds (``held``, its entries of the old one), as RabbitMQ's consumers outlive a
        change of leader unaware.  The settles the old one kept for a leader to come are carried out; those the
        new one takes nothing back for it keeps for the leader after it (``keep_settles``).  Returns the new
        object's entry for each held one; None: not taken back (it stays with the old one, where a settle does
        nothing)."""
        checked, parked = old.release(consumer, held)
        taken = new.take_consumer(consumer, [*zip(held, checked), *((entry, c) for _, entry, c, _ in parked)])
        kept: list[ParkedSettle] = []
        for settle, entry in zip(parked, taken[len(held):]):  # settled while no leader took them
            mode, _, _, modified = settle
            if entry is None:
                kept.append(settle)
            else:  # (counted off the consumer's prefetch then)
                self.settle_as([(entry, new, None)], mode, modified)
        if kept:
            new.keep_settles(kept)
        return taken[:len(held)]

    def move_messages(self, source: AnyQueue, destination: AnyQueue, count: int | None = None,
                      who: Principal | None = None) -> int:
        """Move up to ``count`` (default all) ready messages from one queue to the tail of another, in order,
        for ``who`` (read on the source, write on the destination); neither may be another connection's
        exclusive queue.

        Each message keeps its properties, exchange and routing key (replaying a dead-letter queue).
        A destination that refuses a message (reject-publish) stops the move; that message stays.
        """
        if who is not None:
            who.check("read", "queue", source.vhost, source.name)
            who.check("write", "queue", destination.vhost, destination.name)
        check_exclusive(source, None)
        check_exclusive(destination, None)
        if source is destination:
            raise errors.precondition_failed("source and destination are the same queue")
        local = source.local()  # (another node's: its node moves them)
        moved = 0
        while local is not None and (count is None or moved < count):
            entry = local.get(no_ack=False)
            if entry is None:
                break
            message = entry.message
            if message.msg_id and not message.persistent:  # a quorum queue's stored copy: transient elsewhere
                message = message.copy()
            if destination.deleted or not destination.enqueue(message):
                self.settle(source, [entry], requeue=True)
                break
            self.settle(source, [entry], requeue=False)
            moved += 1
        return moved
