"""One AMQP channel (RabbitMQ's rabbit_channel): content assembly, consumers, acks, QoS, confirms, tx.

Publish and deliver are the hot path and work on bytes (see :mod:`framing.codec`);
every other method arrives as a pamqp object and is dispatched by type.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import insort
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Collection, Coroutine, Protocol

from pamqp import commands
from pamqp.base import Frame

from exchanges import Exchange

from ..framing import codec, properties
from ..broker import direct_reply
from .. import errors
from ..broker import server_name
from ..framing.codec import CONTENT_UNIT_BITS
from .consumer_timeout import AckTimeout
from ..broker.direct_reply import ReplyConsumer
from ..errors import AMQPError, ChannelError, ConnectionError
from ..frontend.front_end import grow
from ..frontend.stored_bodies import SEND_FROM_FILE, body_out, forget_left, release_body
from ..logs import untrusted
from ..memory import MEMORY_CHECK_BYTES
from ..message import RELEASE_FROM, Message
from ..payload import route_names
from ..ports import UNLIMITED, ClientChannel, ExclusiveOwner, Grantee
from ..queues.queue import AnyQueue, Consumer, Entry, Queue
from ..stats import MessageStats

if TYPE_CHECKING:
    from ..access_control import Principal, User
    from ..broker import Broker
    from ..config import Config
    from ..publisher_flow import PublisherFlow
    from ..frontend.front_end import Registry
    from ..broker.vhost import VHost
    from ..broker.definitions import Destination

log = logging.getLogger("warren.channel")

EXPECT_METHOD, EXPECT_HEADER, EXPECT_BODY = range(3)
NO_ROUTE_TEXT = "NO_ROUTE"
_PUBLISH = commands.Basic.Publish()  # the method a publish that waits for the cluster's definitions names in errors
BODY_ROOM = 1024 * 1024  # a body's buffer is set aside this large at first (at most its size), then doubled (_room)
SHARED_MAX = 256  # distinct routes / content headers remembered per channel
TOPIC_CHECKS_KEPT = 12  # (exchange, routing key) pairs a topic permission allowed, remembered per channel as RabbitMQ


class ChannelHost(ExclusiveOwner[Queue], Protocol):
    """What a channel asks of its connection (``connection.Connection``), which owns the exclusive queues its
    channels declare."""

    broker: Broker
    config: Config
    flow: PublisherFlow
    clients: Registry
    protocol: str
    loop: asyncio.AbstractEventLoop
    vhost: VHost | None
    user: User | None
    principal: Principal | None
    client_capabilities: dict[str, Any]
    out: list[bytes]
    large_out: bool
    file_out: bool
    frame_max: int
    deliver_budget: int
    write_paused: bool

    def schedule_flush(self) -> None: ...

    def content_out(self, size: int) -> None: ...

    def send_method(self, channel: int, method: Frame) -> None: ...

    def suspend(self, channel: Channel, method: Frame, work: Coroutine[Any, Any, None]) -> None: ...

    def channel_closed(self, ch: int, awaiting_close_ok: bool) -> None: ...

    def close_with(self, error: errors.AMQPError) -> None: ...

    def hold(self, alarm: str | None) -> None: ...

    def release(self) -> None: ...

    def leader_waits(self, change: int) -> None: ...


class Channel:
    def __init__(self, connection: ChannelHost, number: int) -> None:
        self.connection = connection
        self.number = number
        self.broker = connection.broker
        self.broker.churn.channel_created += 1
        vhost, user, principal = connection.vhost, connection.user, connection.principal
        assert vhost is not None and user is not None and principal is not None  # the connection is open
        self.vhost: VHost = vhost
        self.user: User = user
        self.principal: Principal = principal  # what broker operations check
        self.out = connection.out
        self.open = True
        self.flow_active = True
        # content assembly
        self.expect = EXPECT_METHOD
        self._route = b""
        self._mandatory = False
        self._header = b""
        self._size = 0
        self._body: bytearray | None = None  # a body that spans frames (or reads): filled in place
        self._received = 0
        # a backlog of messages shares one copy of each distinct route and content header
        self._routes: dict[bytes, tuple[bytes, str, str]] = {}
        self._headers: dict[bytes, bytes] = {}
        # consuming
        self.consumers: dict[str, Consumer] = {}
        # consumers whose basic.consume waits for their queue's node to accept them (``_accepted``): its method
        self.unanswered: dict[Consumer, commands.Basic.Consume] = {}
        self.reply_consumer: ReplyConsumer | None = None  # consuming amq.rabbitmq.reply-to
        self.unacked: dict[int, tuple[Entry, AnyQueue, Consumer | None]] = {}
        self.delivery_tag = 0
        self.prefetch = 0  # basic.qos global=false: for consumers created afterwards
        self.global_prefetch = 0  # basic.qos global=true: shared by the channel's consumers
        self.unacked_for_global = 0
        # of the shared limit, what other nodes' queues were granted for its consumers and have not yet delivered
        # here or given back; the consumers whose queues wait for a grant, in the order they asked; those granted
        self.reserved = 0
        self.wanting: dict[Consumer, Grantee] = {}
        self.granted: dict[Consumer, Grantee] = {}
        self.ack_timeout = AckTimeout(self)
        # publishing
        self.confirm_mode = False
        self.publish_seq = 0
        self.confirmed = 0
        self.unsynced: deque[tuple[int, int]] = deque()  # (publish seq, group commit batch) awaiting fsync
        # the group commit each tx.commit-ok waits for, in order (0: none, only the ones before it): a client may
        # send its next tx.commit before the previous one is answered
        self.tx_commits: deque[int] = deque()
        self.rejected: deque[int] = deque()  # publish seqs to nack
        self.remote_unconfirmed: dict[int, int] = {}  # publish seq -> copies other nodes have yet to accept
        self.leader_waits = 0  # of its publishes, how many wait for a quorum queue's leader (``waiting``)
        self.confirm_pending = False
        self.tx: list[Callable[[], object]] | None = None  # a transaction's acks, nacks and rejects
        # its publishes: each with the queues basic.publish routed it to, delivered at tx.commit
        self.tx_publishes: list[tuple[Exchange, Message, bool, Collection[Destination]]] = []
        self.tx_held: dict[int, tuple[Entry, AnyQueue, Consumer | None]] = {}  # settled in the open transaction
        self.last_queue = ""
        self._cancels: list[str] | None = None  # broker cancels raised by the method being handled
        self._write_checked: dict[str, Exchange] = {}  # (an exchange deleted and made again is checked again)
        self._topic_checked: dict[tuple[str, str], None] = {}  # the latest TOPIC_CHECKS_KEPT, oldest first
        self.stats = MessageStats()
        self.vhost_stats = self.broker.vhost_stats(self.vhost.name)
        self.max_message_size = connection.config.message_size_limit

    # -- hot path: publish --------------------------------------------------------------------

    def on_publish(self, route: bytes, flags: int) -> None:
        if self.expect != EXPECT_METHOD:
            raise _unexpected_content(self.expect)
        if flags & 2:
            raise ConnectionError(errors.NOT_IMPLEMENTED, "immediate=true", 60, 40)
        self._route = route
        self._mandatory = (flags & 1) == 1
        self.expect = EXPECT_HEADER

    def on_header(self, header: bytes) -> None:
        if self.expect != EXPECT_HEADER:
            raise _unexpected_content(self.expect)
        if header[2] or header[3]:  # rabbit_command_assembler:process takes a header of weight 0 alone
            raise ConnectionError(errors.UNEXPECTED_FRAME, "expected content header for class 60, got non content "
                                  "header frame instead", 60, 40)
        if header[0] != 0 or header[1] != 60:
            raise ConnectionError(errors.UNEXPECTED_FRAME, "expected content header for class 60, got one for "
                                  f"class {header[0] << 8 | header[1]} instead", 60, 40)
        size = codec.BODY_SIZE.unpack_from(header, 4)[0]
        shared = self._headers.get(header)
        if shared is None:
            try:
                properties.check(header)
            except properties.MalformedProperties as exc:
                # RabbitMQ cannot decode such properties either: its channel crashes, the client gets a bare 541
                log.warning("malformed content header on channel %d of %s: %s", self.number,
                            self.connection.name, untrusted(exc))
                raise ConnectionError(errors.INTERNAL_ERROR, "") from None
            if len(self._headers) >= SHARED_MAX:
                self._headers.clear()
            shared = self._headers[header] = header
        self._header = shared
        if size == 0:
            self.expect = EXPECT_METHOD
            self._publish(b"")
            return
        if size > self.max_message_size:
            self.expect = EXPECT_BODY
            self._size = size
            raise _publish_error(errors.message_too_large(size, self.max_message_size))
        self._size = size
        self._received = 0
        self.expect = EXPECT_BODY

    @property
    def body_size(self) -> int:
        """The size the content header declared for the body being received (or the last one)."""
        return self._size

    def on_body(self, buf: bytes | bytearray, start: int, end: int) -> None:
        """A body frame, whose payload is ``buf[start:end]``."""
        if self.expect != EXPECT_BODY:
            raise _unexpected_content(self.expect)
        if self._body is None and self._received + end - start == self._size:
            self.expect = EXPECT_METHOD  # the whole body in one frame; a large one is copied once (a bytearray)
            self._publish(buf[start:end] if end - start >= codec.ZERO_COPY_FROM else bytes(buf[start:end]))
            return
        self.body_part(buf, start, end)
        if self._received == self._size:
            body, self._body = self._body, None
            self.expect = EXPECT_METHOD
            self._publish(body)  # type: ignore[arg-type]  # (set: the size was reached)

    def body_part(self, buf: bytes | bytearray | memoryview, start: int, end: int) -> None:
        """Part of a body frame (the connection hands over a large frame's bytes as they are read), put in
        the message's buffer."""
        if self.expect != EXPECT_BODY:
            return  # (the channel failed meanwhile: the rest of the frame is dropped)
        received = self._received + end - start
        if received > self._size:
            # rabbit_command_assembler never completes such a message: later body frames are taken
            # and dropped (nothing kept here), and the next method or header is a 505
            self._body = None
            self._received = self._size + 1
            return
        with self._room(end - start) as into, memoryview(buf) as view:
            into[:] = view[start:end]
        self._took(received)

    def body_into(self, size: int, ahead: int = 0) -> memoryview | None:
        """Where the next ``size`` octets of a large body frame are read to, straight from the socket: the
        message's buffer (not through a read buffer: no copy), with up to ``ahead`` octets more as far as the
        declared size leaves room (``read_ahead``); ``body_read`` says how many came, and only those count
        (what was set aside and not read is never part of a message).  None if this channel takes no such
        part (it failed meanwhile, or the part overruns the declared size): ``body_part`` deals with those."""
        if self.expect != EXPECT_BODY or self._received + size > self._size:
            return None
        return self._room(min(size + ahead, self._size - self._received))

    def _room(self, size: int) -> memoryview:
        """The message's buffer from what was received, ``size`` octets, set aside uninitialised: what arrives
        writes every octet, and zeroing them first (bytearray's only way to grow) cost 0.5 ms a MiB, as much as
        a copy.  It grows by doubling from ``BODY_ROOM`` to the declared size, so that a header alone makes the
        node set aside nothing and the reallocations are few."""
        body = self._body
        if body is None:
            body = self._body = bytearray()
        received = self._received
        if len(body) < received + size:
            grow(body, min(self._size, max(received + size, 2 * len(body), BODY_ROOM)))
        return memoryview(body)[received:received + size]

    def body_read(self, size: int) -> None:
        """``size`` octets came into the view ``body_into`` gave."""
        self._took(self._received + size)

    def read_ahead(self, size: int) -> bytes:
        """The ``size`` octets read past a body frame into the room after it (``body_into``'s ``ahead``): no
        part of the body, which the next frame's bytes overwrite."""
        body = self._body
        assert body is not None  # (body_into set it aside)
        return bytes(body[self._received:self._received + size])

    def _took(self, received: int) -> None:
        if received // MEMORY_CHECK_BYTES != self._received // MEMORY_CHECK_BYTES:
            self.connection.flow.recheck()  # a large message can outrun the once-a-second memory check
        if self.connection.flow.blocked:  # a large message arriving during an alarm waits with the rest
            self.connection.flow.published(self.connection)
        self._received = received

    def _publish(self, body: bytes | bytearray, waited: bool = False) -> None:
        """``waited``: again, once the cluster's definitions were awaited (``_when_current``)."""
        shared = self._routes.get(self._route)
        if shared is None:
            if len(self._routes) >= SHARED_MAX:
                self._routes.clear()
            route = self._route
            shared = self._routes[route] = (route, *route_names(route))
        route, exchange_name, routing_key = shared
        # a bytearray body (the buffer it arrived in) is read as bytes everywhere, and never changed
        message = Message(exchange_name, routing_key, route, self._header, body)  # type: ignore[arg-type]
        vhost = self.vhost
        exchange = vhost.exchanges.get(exchange_name)
        principal = self.principal
        try:
            # once per exchange (the hot path stays lean), in rabbit_channel's order: write permission, then that
            # the exchange exists (Messages.publish_target)
            if exchange is None or self._write_checked.get(exchange_name) is not exchange:
                try:
                    exchange = self.broker.publish_target(vhost, exchange_name, principal, routing_key)
                except ChannelError as exc:
                    cluster = self.broker.cluster
                    if (exc.code == errors.NOT_FOUND and cluster is not None and not waited
                            and not cluster.current):  # declared elsewhere a moment ago?
                        self.connection.suspend(self, _PUBLISH, self._when_current(body))
                        return
                    raise
                self._write_checked[exchange_name] = exchange
                self._topic_allowed(exchange, routing_key)
            elif principal.topics and (exchange_name, routing_key) not in self._topic_checked:
                self.broker.check_topic_write(vhost, exchange, principal, routing_key)
                self._topic_allowed(exchange, routing_key)
        except ChannelError as exc:
            raise _publish_error(exc) from None
        if message.needs_checks:
            if message.property_str(codec.FLAG_REPLY_TO) == direct_reply.PSEUDO_QUEUE:  # first: maybe_set_fast_reply_to
                if self.reply_consumer is None:
                    raise _publish_error(errors.precondition_failed("fast reply consumer does not exist"))
                message = direct_reply.with_reply_to(message, self.reply_consumer.name)
            try:
                self.broker.check_message(vhost, exchange, principal, message, self.user)
            except ChannelError as exc:
                raise _publish_error(exc) from None
        if self.confirm_mode:
            self.publish_seq += 1
        if self.connection.flow.blocked:
            self.connection.flow.published(self.connection)
        mandatory = self._mandatory
        if self.tx is not None:  # routed now, delivered at tx.commit (rabbit_channel: {Delivery, QNames} in the tx)
            self.tx_publishes.append((exchange, message, mandatory,
                                      self.broker.route(vhost, exchange, message, self if mandatory else None)))
            return
        routed, rejected = self.broker.publish(vhost, exchange, message, self if mandatory else None,
                                               self if self.confirm_mode else None)
        if not routed:
            cluster = self.broker.cluster
            current = cluster is None or cluster.current or direct_reply.is_reply(exchange_name, routing_key)
            if not current and not waited:  # a queue or binding made elsewhere may be missing here
                self.connection.suspend(self, _PUBLISH, self._routed_when_current(exchange, message, mandatory))
                return
            rejected = self._nowhere(message, mandatory, current)
        self._published(message, rejected)

    def _published(self, message: Message, rejected: bool) -> None:
        self.stats.publish += 1
        self.vhost_stats.publish += 1
        if self.confirm_mode:
            self._to_confirm(message, rejected)

    async def _when_current(self, body: bytes | bytearray) -> None:
        """Cluster mode, a publish to an exchange unknown here while this node's definitions may be behind etcd's:
        published again once they are current, or the wait is over (the frames after it wait meanwhile)."""
        assert self.broker.cluster is not None  # (only called in cluster mode)
        await self.broker.cluster.caught_up()
        if self.open:
            self._publish(body, waited=True)

    async def _routed_when_current(self, exchange: Exchange, message: Message, mandatory: bool) -> None:
        """Cluster mode, a publish routed nowhere while this node's definitions may be behind etcd's: routed again
        once they are current; if they are not within the wait, nacked (confirm mode) rather than confirmed as
        unroutable.  The frames after it wait meanwhile, so that the channel's order holds."""
        assert self.broker.cluster is not None  # (only called in cluster mode)
        current = await self.broker.cluster.caught_up()
        if not self.open:
            return
        routed = rejected = False
        again = self.vhost.exchanges.get(exchange.name)
        if again is not None:
            routed, rejected = self.broker.publish(self.vhost, again, message, self if mandatory else None,
                                                   self if self.confirm_mode else None)
        if not routed:
            rejected = self._nowhere(message, mandatory, current)
        self._published(message, rejected)

    def _nowhere(self, message: Message, mandatory: bool, current: bool) -> bool:
        """Routed to no queue by definitions known ``current`` (or, waited for, still not): whether it is nacked,
        not confirmed as unroutable, because the definitions were not current (confirm mode)."""
        if not current and self.confirm_mode:
            return True
        self._unroutable(message, mandatory)
        return False

    def _topic_allowed(self, exchange: Exchange, routing_key: str) -> None:
        """Remember a routing key a topic permission allowed (the latest ``TOPIC_CHECKS_KEPT``, as RabbitMQ's
        channel does: a permission changed meanwhile does not refuse them)."""
        if self.principal.topics and exchange.type_name == "topic":
            checked = self._topic_checked
            checked[(exchange.name, routing_key)] = None
            if len(checked) > TOPIC_CHECKS_KEPT:
                del checked[next(iter(checked))]

    def _deliver_routed(self, exchange: Exchange, message: Message, mandatory: bool,
                        queues: Collection[Destination], verdicts: TxVerdicts | None = None) -> bool:
        """A transaction's publish at tx.commit: enqueued on the queues it was routed to at basic.publish that are
        still there (returned if mandatory and none are); True if a queue's length limit rejected it.  Another
        node's queue (or a replicated queue's group) answers later, to ``verdicts``."""
        broker = self.broker
        routed, rejected = broker.deliver(exchange, message, broker.still_routed(self.vhost, queues), verdicts)
        if not routed:
            self._unroutable(message, mandatory)
        return rejected

    def _unroutable(self, message: Message, mandatory: bool) -> None:
        """Routed to no queue: returned if mandatory, else dropped."""
        if mandatory:
            self.basic_return(message)
        else:
            self.stats.drop_unroutable += 1
            self.vhost_stats.drop_unroutable += 1

    def basic_return(self, message: Message) -> None:
        """basic.return NO_ROUTE for a mandatory message that reached no queue (now, or when it fell due)."""
        self.stats.return_unroutable += 1
        self.vhost_stats.return_unroutable += 1
        self.connection.large_out |= codec.append_return(self.out, self.number, errors.NO_ROUTE, NO_ROUTE_TEXT,
                                                         message.route, message.header, message.body,
                                                         self.connection.frame_max)
        self.connection.schedule_flush()
        self.connection.content_out(len(message.header) + message.body_size)

    def _to_confirm(self, message: Message, rejected: bool) -> None:
        """A publish is confirmed at once, or — if it went to disk — when its batch is fsynced.

        One a queue refused (reject-publish) is nacked, in order with the acks around it.
        """
        if rejected:
            self.rejected.append(self.publish_seq)
        if message.awaits_commit:
            persistence = self.broker.persistence
            self.unsynced.append((self.publish_seq, persistence.batch))
            persistence.waiters.add(self)
        if not self.unsynced:
            self.confirm_pending = True
            self.connection.schedule_flush()

    def synced(self, batch: int) -> None:
        """Group commit ``batch`` is durable: confirm (or tx.commit-ok) what waited for it."""
        commits = self.tx_commits
        if commits:
            while commits and commits[0] <= batch:
                commits.popleft()
                self.reply(commands.Tx.CommitOk())
            if not commits:
                self.broker.persistence.waiters.discard(self)
            return
        unsynced = self.unsynced
        while unsynced and unsynced[0][1] <= batch:
            unsynced.popleft()
        if not unsynced:
            self.broker.persistence.waiters.discard(self)
        self.confirm_pending = True
        self.connection.schedule_flush()

    def refused(self, batch: int) -> None:
        """Group commit ``batch`` failed: what waited for it is nacked; a tx.commit that did closes the connection
        with 541 (a transaction has no nack)."""
        if self.tx_commits:
            self.broker.persistence.waiters.discard(self)
            self.connection.close_with(errors.ConnectionError(errors.INTERNAL_ERROR, "transaction not written"))
            return
        unsynced = self.unsynced
        while unsynced and unsynced[0][1] <= batch:
            insort(self.rejected, unsynced.popleft()[0])
        if not unsynced:
            self.broker.persistence.waiters.discard(self)
        self.confirm_pending = True
        self.connection.schedule_flush()

    def forwarded(self) -> int:
        """A copy of the publish being routed went to its queue's owner node: its confirm waits for that node."""
        seq = self.publish_seq
        self.remote_unconfirmed[seq] = self.remote_unconfirmed.get(seq, 0) + 1
        return seq

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        """An owner node accepted (and, if persistent on a durable queue, fsynced) or refused its copy."""
        left = self.remote_unconfirmed.pop(seq, 1) - 1
        if left:
            self.remote_unconfirmed[seq] = left
        if rejected and seq not in self.rejected:
            insort(self.rejected, seq)
        if self.open:
            self.confirm_pending = True
            self.connection.schedule_flush()

    def waiting(self, change: int) -> None:
        """``change`` more (or fewer) of its publishes wait for a quorum queue's leader (``remote_queue.Window``):
        its connection is read no more while too many do, rather than have them nacked."""
        if self.open:
            self.leader_waits += change
            self.connection.leader_waits(change)

    def emit_confirms(self) -> None:
        """One basic.ack(multiple) covers every publish up to the first one still waiting for fsync."""
        self.confirm_pending = False
        upto = self.unsynced[0][0] - 1 if self.unsynced else self.publish_seq
        if self.remote_unconfirmed:
            upto = min(upto, next(iter(self.remote_unconfirmed)) - 1)
        rejected = self.rejected
        acked = upto - self.confirmed
        while rejected and rejected[0] <= upto:
            seq = rejected.popleft()
            acked -= 1
            if seq - 1 > self.confirmed:
                self.out.append(codec.basic_ack(self.number, seq - 1, True))
            self.out.append(codec.basic_nack(self.number, seq, False))
            self.confirmed = seq
        if upto > self.confirmed:
            self.confirmed = upto
            self.out.append(codec.basic_ack(self.number, upto, True))
        if acked > 0:
            self.stats.confirm += acked
            self.vhost_stats.confirm += acked

    # -- hot path: deliver --------------------------------------------------------------------

    def can_deliver(self, shared: bool) -> bool:
        connection = self.connection
        if not self.flow_active or connection.write_paused or connection.deliver_budget <= 0:
            return False
        if not (shared and self.global_prefetch) or self.unacked_for_global + self.reserved < self.global_prefetch:
            return True
        if self.reserved and self.unacked_for_global < self.global_prefetch:
            self._recall()  # another node's queue holds room it does not use
        return False

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        self.delivery_tag += 1
        tag = self.delivery_tag
        stats = self.stats
        if consumer.no_ack:
            stats.deliver_no_ack += 1
        else:
            self.unacked[tag] = (entry, consumer.queue, consumer)
            self.unacked_for_global += consumer.shares_limit
            stats.deliver += 1
        if entry.redelivered:
            stats.redeliver += 1
        message = entry.message
        connection = self.connection
        left = consumer.no_ack and message.body is None  # in the store for the file (Queue.took): forgotten once sent
        connection.large_out |= codec.append_deliver(
            self.out, self.number, consumer.prefix, tag, entry.redelivered, message.route,
            consumer.queue.delivery_header(entry) if consumer.counted else message.header,
            body_out(connection, message, consumer.queue) if message.body_size >= SEND_FROM_FILE else message.body,
            connection.frame_max)
        if left:
            forget_left(consumer.queue, entry)
        connection.deliver_budget -= 1 + (message.body_size >> CONTENT_UNIT_BITS)
        connection.schedule_flush()
        if message.body_size >= RELEASE_FROM and not consumer.no_ack:
            release_body(entry, consumer.queue)

    def deliver_reply(self, consumer: ReplyConsumer, message: Message) -> None:
        """A reply to this channel's amq.rabbitmq.reply-to name: delivered at once, never acknowledged."""
        self.delivery_tag += 1
        self.stats.deliver_no_ack += 1
        connection = self.connection
        connection.large_out |= codec.append_deliver(self.out, self.number, consumer.prefix, self.delivery_tag, False,
                                                     message.route, message.header, message.body, connection.frame_max)
        connection.schedule_flush()

    def want(self, consumer: Consumer, grantee: Grantee) -> None:
        """(``ports.SharedLimit``) Another node's queue has a message for ``consumer``: granted room now or once
        some is free, in the order the queues asked (rabbit_limiter resumes the queues it blocked); with none free,
        the unused room of the channel's other queues is asked back."""
        if not self.global_prefetch:
            grantee.grant(UNLIMITED)
            return
        self.wanting[consumer] = grantee
        self._grant()
        if self.wanting and self.reserved:
            self._recall()

    def arrived(self) -> None:
        self.reserved = max(0, self.reserved - 1)

    def unreserve(self, consumer: Consumer, count: int) -> None:
        self.reserved = max(0, self.reserved - count)
        if not self.open:  # (its consumers leaving as it closes: nothing more goes to it)
            return
        if self.wanting:
            self._grant()
        if self.unacked_for_global + self.reserved < self.global_prefetch:
            self.resume_deliveries()  # (a queue of this node's may have waited for that room)

    def _grant(self) -> None:
        """The room the shared limit has left, shared among the queues that wait for it."""
        wanting = self.wanting
        while wanting:  # (a grant to a consumer gone meanwhile comes back at once: the room is counted anew)
            room = self.global_prefetch - self.unacked_for_global - self.reserved
            if room <= 0:
                return
            share = max(1, room // len(wanting))
            consumer = next(iter(wanting))
            grantee = self.granted[consumer] = wanting.pop(consumer)
            self.reserved += share
            grantee.grant(share)

    def _recall(self) -> None:
        for consumer, grantee in self.granted.items():
            if consumer not in self.wanting:
                grantee.recall()

    def resume_deliveries(self) -> None:
        for queue in {consumer.queue for consumer in self.consumers.values()}:
            queue.deliver_ready()

    # -- acks ---------------------------------------------------------------------------------

    def _take_unacked(self, delivery_tag: int, multiple: bool) -> list[tuple[Entry, AnyQueue, Consumer | None]]:
        """The entries a basic.ack, nack or reject settles, out of the unacked map (rabbit_channel's collect_acks):
        the tag itself must be outstanding, else 406 ``unknown delivery tag N`` and nothing is taken; with
        ``multiple`` every outstanding tag up to it too, and tag 0 means every outstanding one (none is no error).
        Inside a transaction they are held until its commit, and a rollback puts them back."""
        unacked = self.unacked
        if multiple and delivery_tag == 0:
            tags = list(unacked)
        elif delivery_tag not in unacked:
            raise errors.precondition_failed(f"unknown delivery tag {delivery_tag}")
        elif multiple:
            tags = []
            for tag in unacked:  # in delivery order: tags only grow, and a rollback restores the order
                tags.append(tag)
                if tag == delivery_tag:
                    break
        else:
            tags = [delivery_tag]
        if self.tx is not None:
            return [self._hold(tag, unacked.pop(tag)) for tag in tags]
        return [unacked.pop(tag) for tag in tags]

    def _hold(self, tag: int, item: tuple[Entry, AnyQueue, Consumer | None]) -> tuple[Entry, AnyQueue, Consumer | None]:
        self.tx_held[tag] = item
        return item

    def _release_held(self) -> None:
        """A rollback (or the channel closing) inside a transaction: its settled tags are outstanding again."""
        if self.tx_held:
            merged = {**self.unacked, **self.tx_held}
            self.unacked = {tag: merged[tag] for tag in sorted(merged)}
            self.tx_held = {}

    def _settle(self, taken: list[tuple[Entry, AnyQueue, Consumer | None]], requeue: bool, nack: bool = False,
                left: bool = False) -> None:
        """Acked, requeued (``left``: the channel closed), or (``nack``) nacked or rejected: credit returns, and the
        queues may deliver again; every queue the channel consumes from if its shared limit held them all (as
        ``rabbit_limiter`` wakes the queues it blocked), not only those the settled entries came from."""
        held = self.global_prefetch and self.unacked_for_global >= self.global_prefetch
        self.unacked_for_global -= sum(1 for _, _, consumer in taken if consumer is not None and consumer.shares_limit)
        if nack:
            self.broker.nack_taken(taken, requeue)
        else:
            self.broker.settle_taken(taken, requeue, left=left)
        if self.wanting:
            self._grant()
        if held:
            self.resume_deliveries()

    def _ack(self, method: commands.Basic.Ack) -> None:
        taken = self._take_unacked(method.delivery_tag, method.multiple)
        if self.tx is not None:
            self.tx.append(lambda: self._acked(taken))
            return
        self._acked(taken)

    def _acked(self, taken: list[tuple[Entry, AnyQueue, Consumer | None]]) -> None:
        self.stats.ack += len(taken)  # once per basic.ack frame, not per message
        self._settle(taken, False)

    def _nack(self, method: commands.Basic.Nack | commands.Basic.Reject) -> None:
        tag = method.delivery_tag or 0  # (a frame read has one)
        taken = self._take_unacked(tag, getattr(method, "multiple", False))
        requeue = method.requeue
        if self.tx is not None:
            self.tx.append(lambda: self._settle(taken, requeue, nack=True))
            return
        self._settle(taken, requeue, nack=True)

    # -- method dispatch ----------------------------------------------------------------------

    def on_method(self, method: Frame) -> None:
        if self.expect != EXPECT_METHOD:
            raise _unexpected_content(self.expect)
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise ConnectionError(errors.COMMAND_INVALID, "unimplemented method",  # a client-bound method
                                  *divmod(method.index, 0x10000))
        self._cancels = []
        try:
            handler(self, method)
        except AMQPError as exc:
            if not exc.class_id:
                exc.class_id, exc.method_id = divmod(method.index, 0x10000)
            raise
        finally:
            cancels, self._cancels = self._cancels, None
        self._send_cancels(cancels)

    def _send_cancels(self, cancels: list[str]) -> None:
        """The broker's cancels raised by the method handled, after its reply (queue.delete-ok first), as RabbitMQ."""
        for tag in cancels if self.open else ():
            self.reply(commands.Basic.Cancel(consumer_tag=tag, nowait=True))

    def reply(self, method: Frame) -> None:
        self.connection.send_method(self.number, method)

    def _remote(self, name: str) -> bool:
        """The queue is another node's (cluster mode): the operation is awaited (permission is checked there).
        Where a queue lives is asked here, not its type: a queue of this node answers basic.get and queue.purge
        within the frame's turn, in order with the frames after it; another node's suspends the channel."""
        queue = self.vhost.queues.get(name)
        return queue is not None and queue.remote

    def _queue_name(self, name: str) -> str:
        """An empty queue name means the last queue declared on this channel."""
        if name:
            return name
        if not self.last_queue:
            raise errors.not_found("no previously declared queue")
        return self.last_queue

    # channel.*

    def _channel_open(self, method: commands.Channel.Open) -> None:
        raise ConnectionError(errors.CHANNEL_ERROR, "second 'channel.open' seen")

    def _channel_flow(self, method: commands.Channel.Flow) -> None:
        """active=false closes the connection with 540, as RabbitMQ does (clients' tests rely on it); with the
        node's ``channel_flow`` option it pauses deliveries to this channel, as the AMQP spec defines it."""
        if not method.active and not self.connection.config.channel_flow:
            raise ConnectionError(errors.NOT_IMPLEMENTED, "active=false", 20, 20)
        self.flow_active = bool(method.active)
        self.reply(commands.Channel.FlowOk(active=method.active))
        if method.active:
            self.resume_deliveries()

    def _channel_close(self, method: commands.Channel.Close) -> None:
        self.closed()
        self.connection.channel_closed(self.number, awaiting_close_ok=False)
        self.reply(commands.Channel.CloseOk())

    # exchange.*

    def _exchange_declare(self, m: commands.Exchange.Declare) -> None:
        if not m.passive:
            if self.broker.cluster is not None and m.exchange not in self.vhost.exchanges:
                self.connection.suspend(self, m, self._agreed_exchange(m))
                return
        self._declare_exchange(m)

    async def _agreed_exchange(self, m: commands.Exchange.Declare) -> None:
        await self.broker.declare_exchange_agreed(self.vhost, m.exchange, m.exchange_type, m.durable, m.auto_delete,
                                                  m.internal, m.arguments, self.principal)
        if not m.nowait and self.open:
            self.reply(commands.Exchange.DeclareOk())

    def _declare_exchange(self, m: commands.Exchange.Declare) -> None:
        self.broker.declare_exchange(self.vhost, m.exchange, m.exchange_type, m.passive, m.durable,
                                     m.auto_delete, m.internal, m.arguments, self.principal)
        if not m.nowait:
            self.reply(commands.Exchange.DeclareOk())

    def _exchange_delete(self, m: commands.Exchange.Delete) -> None:
        self.broker.delete_exchange(self.vhost, m.exchange, m.if_unused, self.principal)
        self._write_checked.pop(m.exchange, None)
        if not m.nowait:
            self._answer_agreed(m, commands.Exchange.DeleteOk())

    def _exchange_binding(self, m: commands.Exchange.Bind | commands.Exchange.Unbind) -> None:
        bind = isinstance(m, commands.Exchange.Bind)
        operation = self.broker.bind if bind else self.broker.unbind
        operation(self.vhost, m.source, "exchange", m.destination, m.routing_key, m.arguments,
                  who=self.principal)
        if not m.nowait:
            self._answer_agreed(m, commands.Exchange.BindOk() if bind else commands.Exchange.UnbindOk())

    def _answer_agreed(self, m: Frame, answer: Frame) -> None:
        """The answer to a change of definitions; in cluster mode once etcd has the change (``Broker.agreed``),
        so that a crash of this node right after cannot undo what the client was told."""
        if self.broker.cluster is None:
            self.reply(answer)
        else:
            self.connection.suspend(self, m, self._answered_when_agreed(answer))

    async def _answered_when_agreed(self, answer: Frame) -> None:
        await self.broker.agreed()
        if self.open:
            self.reply(answer)

    # queue.*

    def _queue_declare(self, m: commands.Queue.Declare) -> None:
        name = m.queue  # a passive declare of "" looks for a queue named "" (RabbitMQ: no last-queue shortcut)
        if not name and not m.passive:
            name = server_name("amq.gen-")
        if m.passive and name.startswith(direct_reply.PSEUDO_QUEUE):
            self._declare_reply_queue(m, name)
            return
        if self.broker.cluster is not None and (name not in self.vhost.queues or self._remote(name)):
            self.connection.suspend(self, m, self._agreed_declare(m, name))
            return
        self._declare(m, name)

    async def _agreed_declare(self, m: commands.Queue.Declare, name: str) -> None:
        """Cluster mode, a queue unknown here: agree on it (or, passive, look for it) in the cluster first; one
        whose leader is not reached from here now: wait a while for one (``VHost.reached``).  Another node's
        queue: declare-ok has its figures from that node (``counted``).  A new queue is answered once the nodes this
        one reaches have it (``Broker.agreed``), as RabbitMQ answers once every node's Mnesia has it: a publish through
        another node right after declare-ok (an RPC server's reply to an exclusive queue) is routed there."""
        if name in self.vhost.queues:
            await self.vhost.reached(name)
        elif m.passive:
            await self.broker.find_queue(self.vhost, name)
        async with (contextlib.nullcontext() if m.passive else
                    self.broker.declaring(self.vhost, name, m.durable, m.exclusive, m.auto_delete, m.arguments,
                                          self.principal)):
            if not self.open:
                return
            queue = self._declared(m, name)
        if not m.nowait and self.open:
            count, consumers = await queue.counted()
            if self.open:
                self.reply(commands.Queue.DeclareOk(queue=queue.name, message_count=count, consumer_count=consumers))

    def _leaderless(self, name: str) -> bool:
        """A quorum queue known here whose leader cannot be reached now (``AnyQueue.leaderless``)."""
        queue = self.vhost.queues.get(name)
        return queue is not None and queue.leaderless

    def _declare(self, m: commands.Queue.Declare, name: str) -> None:
        queue = self._declared(m, name)
        if not m.nowait:
            self.reply(commands.Queue.DeclareOk(queue=queue.name, message_count=queue.message_count,
                                                consumer_count=len(queue.consumers)))

    def _declared(self, m: commands.Queue.Declare, name: str) -> AnyQueue:
        queue = self.broker.declare_queue(self.vhost, name, m.passive, m.durable, m.exclusive, m.auto_delete,
                                          m.arguments, self.connection, server_named=not m.queue,
                                          who=self.principal)
        self.last_queue = queue.name
        return queue

    def _declare_reply_queue(self, m: commands.Queue.Declare, name: str) -> None:
        """Passive declare of amq.rabbitmq.reply-to (or a reply-to name) answers as RabbitMQ does; the name of
        another node's consumer is asked there (rabbit_channel's declare_fast_reply_to calls the channel)."""
        if name == direct_reply.PSEUDO_QUEUE:
            consumers = 1 if self.reply_consumer is not None else 0
        elif self.broker.replies.get(name) is not None:
            consumers = 1
        else:
            found = self.broker.replies.found_elsewhere(name)
            if found is None:
                raise errors.not_found(f"no queue '{name}' in vhost '{self.vhost.name}'")
            self.connection.suspend(self, m, self._declare_reply_elsewhere(m, name, found))
            return
        if not m.nowait:
            self.reply(commands.Queue.DeclareOk(queue=name, message_count=0, consumer_count=consumers))

    async def _declare_reply_elsewhere(self, m: commands.Queue.Declare, name: str,
                                       found: Coroutine[None, None, bool]) -> None:
        if not await found:
            raise errors.not_found(f"no queue '{name}' in vhost '{self.vhost.name}'")
        if not m.nowait and self.open:
            self.reply(commands.Queue.DeclareOk(queue=name, message_count=0, consumer_count=1))

    def _queue_binding(self, m: commands.Queue.Bind | commands.Queue.Unbind) -> None:
        name = self._queue_name(m.queue)
        routing_key = m.routing_key if (m.queue or m.routing_key) else name
        if isinstance(m, commands.Queue.Bind):
            self.broker.bind(self.vhost, m.exchange, "queue", name, routing_key, m.arguments, self.connection,
                             self.principal)
            if not m.nowait:
                self._answer_agreed(m, commands.Queue.BindOk())
            return
        self.broker.unbind(self.vhost, m.exchange, "queue", name, routing_key, m.arguments, self.connection,
                           self.principal)
        self._answer_agreed(m, commands.Queue.UnbindOk())

    def _queue_purge(self, m: commands.Queue.Purge) -> None:
        name = self._queue_name(m.queue)
        if self._remote(name):
            self.connection.suspend(self, m, self._remote_purge(m, name))
            return
        self._purged(m, self.broker.purge_local(self.vhost, name, self.connection, self.principal))

    async def _remote_purge(self, m: commands.Queue.Purge, name: str) -> None:
        count = await self.broker.purge_anywhere(self.vhost, name, self.connection, self.principal)
        if self.open:
            self._purged(m, count)

    def _purged(self, m: commands.Queue.Purge, count: int) -> None:
        if not m.nowait:
            self.reply(commands.Queue.PurgeOk(message_count=count))

    def _queue_delete(self, m: commands.Queue.Delete) -> None:
        name = self._queue_name(m.queue)
        if self._remote(name):
            self.connection.suspend(self, m, self._remote_delete(m, name))
            return
        count = self.broker.delete_queue(self.vhost, name, m.if_unused, m.if_empty, self.connection,
                                         self.principal)
        if not m.nowait:
            self._answer_agreed(m, commands.Queue.DeleteOk(message_count=count))

    async def _remote_delete(self, m: commands.Queue.Delete, name: str) -> None:
        """Another node's queue: its node decides (``Broker.delete_anywhere``), and cancels this channel's consumers
        of it before it answers: their basic.cancel follows queue.delete-ok all the same."""
        self._cancels = []
        try:
            count = await self.broker.delete_anywhere(self.vhost, name, m.if_unused, m.if_empty, self.connection,
                                                      self.principal)
            await self.broker.agreed()  # (what this node changed: a quorum queue's record)
        finally:
            cancels, self._cancels = self._cancels, None
        if self.open and not m.nowait:
            self.reply(commands.Queue.DeleteOk(message_count=count))
        self._send_cancels(cancels)

    # basic.*

    def _basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise ConnectionError(errors.NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        was = self.global_prefetch
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:  # for consumers made from now on; the channel's shared limit goes (rabbit_channel: unlimit_prefetch)
            self.prefetch = m.prefetch_count
            self.global_prefetch = 0
        if not self.global_prefetch:  # what waited for room of it waits no more
            self.reserved = 0
            wanting, self.wanting = self.wanting, {}
            for grantee in wanting.values():
                grantee.grant(UNLIMITED)
        elif not was:  # other nodes' queues it consumes from are held to it now too (``activate_limit_all``)
            for consumer in list(self.consumers.values()):
                if consumer.grantee is not None:
                    consumer.grantee.limit()
        if self.wanting:
            self._grant()
        self.reply(commands.Basic.QosOk())
        self.resume_deliveries()

    def _basic_consume(self, m: commands.Basic.Consume) -> None:
        if m.queue == direct_reply.PSEUDO_QUEUE:
            self._consume_replies(m)
            return
        name = self._queue_name(m.queue)
        tag = m.consumer_tag or server_name("amq.ctag-")
        if tag in self.consumers:  # before anything else, as rabbit_channel
            raise ConnectionError(errors.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if self._leaderless(name):
            self.connection.suspend(self, m, self._consume_when_reached(m, name, tag))
            return
        consumer, accepted = self._consumer(m, name, tag)
        if accepted is not None:
            self.connection.suspend(self, m, self._accepted(m, consumer, accepted))
            return
        self._consuming(m, consumer)

    async def _consume_when_reached(self, m: commands.Basic.Consume, name: str, tag: str) -> None:
        """A quorum queue whose leader is not reached from here now: consume once one is (``VHost.reached``)."""
        await self.vhost.reached(name)
        if not self.open:
            return
        consumer, accepted = self._consumer(m, name, tag)
        if accepted is not None:
            await self._accepted(m, consumer, accepted)
        else:
            self._consuming(m, consumer)

    def _consumer(self, m: commands.Basic.Consume, name: str, tag: str) -> tuple[Consumer, asyncio.Future[None] | None]:
        """The consumer, made; and what its queue's node answers, if it must accept it first."""
        queue = self.broker.consumable(self.vhost, name, self.connection, self.principal)
        consumer = self.broker.consume(queue, self, tag, m.no_ack, m.exclusive, m.arguments or {}, self.prefetch,
                                       self.global_prefetch, limiter=self)
        consumer.sends_from = SEND_FROM_FILE
        self.consumers[tag] = consumer
        if not m.no_ack:
            self.ack_timeout.watch(queue, consumer)
        return consumer, queue.accepted(consumer)

    async def _accepted(self, m: commands.Basic.Consume, consumer: Consumer, accepted: asyncio.Future[None]) -> None:
        """The queue's node must accept the consumer (another node checks exclusivity) before consume-ok."""
        self.unanswered[consumer] = m
        try:
            await accepted
        except ChannelError:
            self.consumers.pop(consumer.tag, None)
            raise
        finally:
            unanswered = self.unanswered.pop(consumer, None) is not None
        if unanswered and self.open and consumer.tag in self.consumers:
            self._consuming(m, consumer)

    def _consuming(self, m: commands.Basic.Consume, consumer: Consumer) -> None:
        if not m.nowait:
            self.reply(commands.Basic.ConsumeOk(consumer_tag=consumer.tag))
        consumer.queue.deliver_ready()

    def _consume_replies(self, m: commands.Basic.Consume) -> None:
        """basic.consume on amq.rabbitmq.reply-to: no-ack only, one per channel; a tag a queue consumer of the
        channel has is refused before anything else, as rabbit_channel looks it up first."""
        if m.consumer_tag in self.consumers:
            raise ConnectionError(errors.NOT_ALLOWED, f"attempt to reuse consumer tag '{m.consumer_tag}'")
        if not m.no_ack:
            raise errors.precondition_failed("reply consumer cannot acknowledge")
        if self.reply_consumer is not None:
            raise errors.precondition_failed("reply consumer already set")
        tag = m.consumer_tag or server_name("amq.ctag-")
        self.reply_consumer = self.broker.replies.add(self, tag, codec.deliver_prefix(tag))
        if not m.nowait:
            self.reply(commands.Basic.ConsumeOk(consumer_tag=tag))

    def _cancel_replies(self) -> None:
        if self.reply_consumer is not None:
            self.broker.replies.remove(self.reply_consumer)
            self.reply_consumer = None

    def _basic_cancel(self, m: commands.Basic.Cancel) -> None:
        if self.reply_consumer is not None and m.consumer_tag == self.reply_consumer.tag:
            self._cancel_replies()  # only it: rabbit_channel's first basic.cancel clause (reply_consumer = {Tag, ...})
            if not m.nowait:
                self.reply(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))
            return
        consumer = self.consumers.pop(m.consumer_tag or "", None)  # (a frame read has a tag)
        if not m.nowait:
            self.reply(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))
        if consumer is not None:
            self._remove_consumer(consumer)
            consumer.queue.deliver_ready()  # a single active consumer's successor takes over

    def _remove_consumer(self, consumer: Consumer) -> None:
        self.wanting.pop(consumer, None)
        self.granted.pop(consumer, None)
        self.broker.remove_consumer(consumer)

    def client(self) -> ClientChannel:
        connection = self.connection
        return ClientChannel(connection.name, self.number, connection.peer, self.user.name, self.broker.node_name)

    def cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away: tell clients that understand basic.cancel from the server."""
        self.consumers.pop(consumer.tag, None)
        self.wanting.pop(consumer, None)
        self.granted.pop(consumer, None)
        if not self.connection.client_capabilities.get("consumer_cancel_notify"):
            return
        if self._cancels is not None:
            self._cancels.append(consumer.tag)
        else:
            self.reply(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    def failed(self, consumer: Consumer, reason: str) -> None:
        """A message the consumer was to get cannot be read: the connection closes with 541, as RabbitMQ's does
        when its channel fails."""
        if self.open and self.consumers.get(consumer.tag) is consumer:
            self.connection.close_with(errors.ConnectionError(errors.INTERNAL_ERROR, reason))

    def handed_over(self, consumer: Consumer, old: AnyQueue, new: AnyQueue) -> None:
        """(What the consumer holds goes on under the same delivery tags: ``Broker.hand_over``.)  A consumer whose
        basic.consume still waited for the old object's node goes on with the new one: consume-ok now, before the
        new one delivers to it."""
        m = self.unanswered.pop(consumer, None)
        if m is not None and not m.nowait:
            self.reply(commands.Basic.ConsumeOk(consumer_tag=consumer.tag))
        unacked = self.unacked
        tags = [tag for tag, (_, queue, held_by) in unacked.items() if held_by is consumer and queue is old]
        for tag, entry in zip(tags, self.broker.hand_over(consumer, old, new, [unacked[tag][0] for tag in tags])):
            if entry is not None:
                unacked[tag] = (entry, new, consumer)

    def _basic_get(self, m: commands.Basic.Get) -> None:
        name = self._queue_name(m.queue)
        if self._remote(name):
            self.connection.suspend(self, m, self._remote_get(m, name))
            return
        self._got(m, *self.broker.get_local(self.vhost, name, m.no_ack, self.connection, self.principal,
                                            SEND_FROM_FILE))

    async def _remote_get(self, m: commands.Basic.Get, name: str) -> None:
        queue, entry = await self.broker.get_anywhere(self.vhost, name, m.no_ack, self.connection,
                                                      self.principal)
        if not self.open:
            if entry is not None and not m.no_ack:
                self.broker.settle(queue, [entry], requeue=True)
            return
        self._got(m, queue, entry)

    def _got(self, m: commands.Basic.Get, queue: AnyQueue, entry: Entry | None) -> None:
        if entry is None:
            self.stats.get_empty += 1
            self.reply(commands.Basic.GetEmpty())
            return
        if m.no_ack:
            self.stats.get_no_ack += 1
        else:
            self.stats.get += 1
        self.delivery_tag += 1
        if not m.no_ack:
            self.unacked[self.delivery_tag] = (entry, queue, None)
            self.ack_timeout.watch(queue, None)
        message = entry.message
        header = queue.delivery_header(entry, get=True)
        left = m.no_ack and message.body is None  # in the store for the file (Queue.took): forgotten once sent
        body = body_out(self.connection, message, queue) if message.body_size >= SEND_FROM_FILE else message.body
        if left:
            forget_left(queue, entry)
        self.connection.large_out |= codec.append_get_ok(self.out, self.number, self.delivery_tag, entry.redelivered,
                                                         message.route, queue.message_count, header, body,
                                                         self.connection.frame_max)
        self.connection.schedule_flush()
        self.connection.content_out(len(header) + message.body_size)
        if message.body_size >= RELEASE_FROM and not m.no_ack:
            release_body(entry, queue)

    def _basic_recover(self, m: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        if not m.requeue:
            raise ConnectionError(errors.NOT_IMPLEMENTED, "requeue=false")
        taken = list(self.unacked.values())
        self.unacked.clear()
        self._settle(taken, True)
        if isinstance(m, commands.Basic.Recover):
            self.reply(commands.Basic.RecoverOk())

    # confirm.* and tx.*

    def _confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx is not None:
            raise errors.precondition_failed("cannot switch from tx to confirm mode")
        self.confirm_mode = True
        if not m.nowait:
            self.reply(commands.Confirm.SelectOk())

    def _tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirm_mode:
            raise errors.precondition_failed("cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = []
        self.reply(commands.Tx.SelectOk())

    def _tx_commit(self, m: commands.Tx.Commit) -> None:
        if self.tx is None:
            raise errors.precondition_failed("channel is not transactional")
        publishes, self.tx_publishes = self.tx_publishes, []
        settles, self.tx = self.tx, []
        self.tx_held = {}
        failed = False  # a queue refused a publish (reject-publish): rabbit_channel's record_rejects, tx = failed
        verdicts = TxVerdicts(self)
        for exchange, message, mandatory, queues in publishes:  # every publish first, then the settles, as
            failed |= self._deliver_routed(exchange, message, mandatory, queues, verdicts)  # rabbit_channel's
        for settle in settles:  # tx.commit
            settle()
        if failed:  # complete_tx(#ch{tx = failed})
            raise errors.precondition_failed("partial tx completion")
        persistence = self.broker.persistence
        batch = persistence.batch if persistence.staged else 0  # the group commit that makes its writes durable
        if verdicts.awaited():  # other nodes' queues have yet to answer (maybe_complete_tx waits for unconfirmed)
            self.connection.suspend(self, m, self._committed_when_answered(verdicts, batch))
            return
        self._commit_ok(batch)

    async def _committed_when_answered(self, verdicts: TxVerdicts, batch: int) -> None:
        """tx.commit once every other node's queue answered its publishes: refused by one, it fails as a refusal
        here does."""
        await verdicts.answered
        if verdicts.refused:
            raise errors.precondition_failed("partial tx completion")
        if self.open:
            self._commit_ok(batch)

    def _commit_ok(self, batch: int) -> None:
        """commit-ok as a confirm would go: once group commit ``batch`` (0: none) is fsynced, and in order."""
        persistence = self.broker.persistence
        if batch > persistence.synced or self.tx_commits:
            self.tx_commits.append(batch if batch > persistence.synced else 0)
            persistence.waiters.add(self)
            return
        self.reply(commands.Tx.CommitOk())

    def _tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if self.tx is None:
            raise errors.precondition_failed("channel is not transactional")
        self.tx.clear()
        self.tx_publishes.clear()
        self._release_held()
        self.reply(commands.Tx.RollbackOk())

    # -- closing ------------------------------------------------------------------------------

    def fail(self, error: ChannelError) -> None:
        """A soft error: close the channel with its reply code; the connection carries on."""
        log.info("channel %d on %s closed: %s", self.number, self.connection.name, untrusted(error.text))
        self.closed()
        self.connection.channel_closed(self.number, awaiting_close_ok=True)
        self.reply(commands.Channel.Close(reply_code=error.code, reply_text=error.text[:255],
                                          class_id=error.class_id, method_id=error.method_id))

    def closed(self) -> None:
        """Channel gone: its unacked messages go back to their queues, its consumers leave."""
        if not self.open:
            return
        self.open = False
        self._body = None  # a partial message's body goes now, not with the channel object
        self.expect = EXPECT_METHOD
        self._header = self._route = b""
        self._headers.clear()
        self._routes.clear()
        self.tx = None
        self.tx_publishes.clear()
        self._release_held()
        if self.leader_waits:  # (its publishes still wait in their windows, for no one now)
            self.connection.leader_waits(-self.leader_waits)
            self.leader_waits = 0
        self.broker.churn.channel_closed += 1
        self.connection.clients.fold(self.connection.protocol, self.stats)
        self.broker.persistence.waiters.discard(self)
        self.ack_timeout.stop()
        self._cancel_replies()
        taken = list(self.unacked.values())
        self.unacked.clear()
        queues = {consumer.queue for consumer in self.consumers.values()}
        for consumer in list(self.consumers.values()):
            self._remove_consumer(consumer)
        self.consumers.clear()
        self._settle(taken, True, left=True)
        for queue in queues:  # after the requeue: a single active consumer's successor gets those first
            queue.deliver_ready()


class TxVerdicts:
    """A ``ConfirmSink`` for one tx.commit's publishes: the answers of other nodes' queues (and of replicated
    queues' groups), which the commit waits for (rabbit_channel's ``tx = committing`` until its unconfirmed are
    answered); a refusal fails it (``record_rejects``: ``tx = failed``, ``partial tx completion``)."""

    __slots__ = ("channel", "pending", "refused", "answered", "_sealed")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.pending = 0
        self.refused = False
        self.answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sealed = False

    def awaited(self) -> bool:
        """Every publish went: whether answers are still awaited (``answered`` is done once they came)."""
        self._sealed = True
        if not self.pending:
            self.answered.set_result(None)
            return False
        return True

    def forwarded(self) -> int:
        self.pending += 1
        return 0

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        self.pending -= 1
        self.refused |= rejected
        if not self.pending and self._sealed and not self.answered.done():
            self.answered.set_result(None)

    def waiting(self, change: int) -> None:
        self.channel.waiting(change)


def _publish_error(error: ChannelError) -> ChannelError:
    error.class_id, error.method_id = 60, 40
    return error


def _unexpected_content(expect: int) -> ConnectionError:
    """A frame out of order, with rabbit_command_assembler's texts for the state we are in."""
    if expect == EXPECT_METHOD:
        return ConnectionError(errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
    return ConnectionError(errors.UNEXPECTED_FRAME, _UNEXPECTED[expect], 60, 40)


_UNEXPECTED = {EXPECT_HEADER: "expected content header for class 60, got non content header frame instead",
               EXPECT_BODY: "expected content body, got non content body frame instead"}

_HANDLERS: dict[type, Callable[[Channel, Any], None]] = {
    commands.Channel.Open: Channel._channel_open,
    commands.Channel.Flow: Channel._channel_flow,
    commands.Channel.Close: Channel._channel_close,
    commands.Exchange.Declare: Channel._exchange_declare,
    commands.Exchange.Delete: Channel._exchange_delete,
    commands.Exchange.Bind: Channel._exchange_binding,
    commands.Exchange.Unbind: Channel._exchange_binding,
    commands.Queue.Declare: Channel._queue_declare,
    commands.Queue.Bind: Channel._queue_binding,
    commands.Queue.Unbind: Channel._queue_binding,
    commands.Queue.Purge: Channel._queue_purge,
    commands.Queue.Delete: Channel._queue_delete,
    commands.Basic.Qos: Channel._basic_qos,
    commands.Basic.Consume: Channel._basic_consume,
    commands.Basic.Cancel: Channel._basic_cancel,
    commands.Basic.Get: Channel._basic_get,
    commands.Basic.Ack: Channel._ack,
    commands.Basic.Nack: Channel._nack,
    commands.Basic.Reject: Channel._nack,
    commands.Basic.Recover: Channel._basic_recover,
    commands.Basic.RecoverAsync: Channel._basic_recover,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}
