"""A queue owned by another node, as routing and consumers on this node see it.

It is a queue to everything here (an ``AnyQueue``: a proxy, not a :class:`Queue` of this node) — exchanges bind
it, ``Broker.route`` returns it, channels consume from it and settle its entries — but it holds no messages: an
enqueue goes over the link to the owner, and deliveries arrive from the owner for the local consumers, wait in a
small per-consumer buffer while those have no credit (QoS, a slow client) and leave in order.  Acks, rejects and
requeues go back to the owner by delivery tag.
"""
from __future__ import annotations

import asyncio
import random
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from amqp_server.broker.vhost import LEADER_WAIT
from amqp_server.errors import NOT_FOUND, ChannelError
from amqp_server.queues.consumers import Consumers
from amqp_server.message import Message
from amqp_server.ports import UNLIMITED
from amqp_server.queues.queue import RESETTLE_MAX, AnyQueue, Checked, Consumer, Entry, ParkedSettle
from amqp_server.queues.ready import SETTLED
from amqp_server.queues.queue_args import QueueArgs
from amqp_server.queues.queue_type import LOG, REPLICATED, QueueType
from amqp_server.queues.quorum_queue import DELIVERY_COUNT
from amqp_server.stats import MessageStats

from . import node_link as link

if TYPE_CHECKING:
    from amqp_server.queues.policy import Policy
    from amqp_server.ports import ConfirmSink

HOLD_MAX = 100_000  # publishes waiting at most per queue (beyond: nacked at once; its publishers are held long before)
RESEND_RETRY = 0.5  # seconds before a window sends again to the node that said it does not lead
REATTACH_RETRY = 0.5  # seconds between tries of a quorum queue's consumer to consume at its new leader
REATTACH_TRIES = 20  # then it is cancelled (the leader refuses it: exclusive use, ...)


class Relayed:
    """The confirm of a publish passed on (one a deposed leader had not confirmed) stands for the confirm its
    publisher is waiting for, under the seq that was given it then."""

    __slots__ = ("confirm", "seq")

    def __init__(self, confirm: "ConfirmSink", seq: int) -> None:
        self.confirm, self.seq = confirm, seq

    def forwarded(self) -> int:
        return self.seq

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        self.confirm.remote_confirmed(self.seq, rejected)

    def waiting(self, change: int) -> None:
        self.confirm.waiting(change)


class Publish:
    """One publish of a :class:`Window`; the confirm sink of each copy sent (``forwarded``: its seq there)."""

    __slots__ = ("window", "seq", "confirm", "confirm_seq", "message", "round")

    def __init__(self, window: "Window", seq: int, confirm: "ConfirmSink", message: Message) -> None:
        self.window, self.seq, self.confirm, self.message = window, seq, confirm, message
        self.confirm_seq = confirm.forwarded()
        self.round = 0  # the window's round it was last sent in

    def forwarded(self) -> int:
        return self.seq

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        self.window.answered(self, link.CONFIRM_REJECTED if rejected else link.CONFIRM_OK)

    def waiting(self, change: int) -> None:
        """(A queue's sink: what waits for a leader is counted by its window, against its publisher.)"""


class Window:
    """This node's confirmed publishes to a quorum queue led by another node (or by none known), until a leader
    confirms or refuses each.  As ``rabbit_fifo_client``'s pending commands, each has a seq in the window,
    which is an enqueuer of its own (``id``, new with each run of the node); the window sends what is
    unanswered again, in order, to each new leader as soon as it is known (and to the same one over a new
    link), and the queue's state takes each publish once whatever the number of copies
    (``QuorumQueue.enqueue_from``).  A publisher whose leader paused so gets its confirms at the election,
    neither a nack after the link falls silent nor a duplicate.  While no leader can be reached, or one answers
    that it does not lead, the window waits (``held``), however long, as ``rabbit_fifo_client`` keeps its
    pending commands: nothing is nacked but at the queue's deletion.  Meanwhile each publish waiting counts against
    its channel, whose connection is read no more while more than a few do (``Channel.waiting``, as RabbitMQ's
    credit flow blocks a channel past ``rabbit_fifo_client``'s soft limit): memory stays bounded, and only
    publishers to the queue are slowed."""

    def __init__(self) -> None:
        self.id = random.getrandbits(63) | 1
        self.leaderless = False  # no leader known: what is sent goes to a member, which names the leader if it knows
        # sends a publish to the leader known now (a proxy's node, or this one's queue); False: it cannot now
        self.send: Callable[[Publish], bool] | None = None
        self.recheck: Callable[[], None] | None = None  # asks etcd who leads (a node said it does not)
        self.hinted: Callable[[str, int], None] | None = None  # follows the leader (and term) a node named
        self.publishes: dict[int, Publish] = {}  # unanswered, by seq: oldest first
        self._next = 1
        self._floor = 1  # no unanswered seq is below it (``floor``)
        self._round = 0
        self.held = False  # no leader to send to: each publish here counts against its channel (``waiting``)
        self._retry: asyncio.TimerHandle | None = None

    @property
    def floor(self) -> int:
        """The oldest unanswered seq: what is below it the leader need not wait for.  Found by walking up from the
        last one over the seqs answered since (one per publish, in the usual order of answers): the first key of a
        dict whose oldest keys go, as these do, is found past every slot they left, hundreds of them."""
        floor, publishes, end = self._floor, self.publishes, self._next
        while floor < end and floor not in publishes:
            floor += 1
        self._floor = floor
        return floor

    def publish(self, confirm: "ConfirmSink | None", message: Message) -> bool:
        """Send a publish to the leader, and again to each next one until one answers; False (nacked at once)
        without confirms or with too many waiting."""
        if confirm is None or len(self.publishes) >= HOLD_MAX:
            return False
        publish = self.publishes[self._next] = Publish(self, self._next, confirm, message)
        self._next += 1
        publish.round = self._round
        if self.held:
            confirm.waiting(1)
        if self.send is None or not self.send(publish):
            self.stalled()
        return True

    def take(self) -> tuple[int, int]:
        """(window id, seq) for a publish this node's queue takes while it leads (``adopt``)."""
        self._next += 1
        return self.id, self._next - 1

    def adopt(self, seq: int, confirm: "ConfirmSink", message: Message) -> None:
        """A publish taken under ``take``'s seq by this node's queue, which was deposed before its group had
        it: sent to the next leader as the window's own (which takes it once)."""
        publishes = self.publishes
        publish = Publish(self, seq, confirm, message)
        publish.round = -1  # (not sent yet: ``resend`` sends it)
        later = [p for p in publishes.values() if p.seq > seq]
        for p in later:
            del publishes[p.seq]
        publishes[seq] = publish
        for p in later:
            publishes[p.seq] = p
        self._floor = min(self._floor, seq)
        if self.held:
            confirm.waiting(1)
        self.stalled()

    def resend(self) -> None:
        """A leader is known (a new one, or the same over a new link): what is unanswered goes to it, in order."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._round += 1
        if not self.publishes:
            self.held = False
            return
        if self.send is None:
            self.stalled()
            return
        for publish in list(self.publishes.values()):
            if self.publishes.get(publish.seq) is publish:  # (a leader here may answer at once)
                publish.round = self._round
                if not self.send(publish):
                    self.stalled()
                    return
        self._sent()

    def answered(self, publish: Publish, status: int, hint: tuple[str, int] | None = None) -> None:
        """A node's answer to a copy: confirmed or refused (the publisher is told), or not taken — the node does
        not lead (``CONFIRM_MOVED``: we follow the leader it names, ``hint``, if of a later term than ours, as
        ``rabbit_fifo_client`` follows a ``not_leader`` reply; else ask etcd, and send again a while later unless a
        leader is known first), or an earlier publish never reached it (``CONFIRM_RESEND``: sent again now).
        Only the answer to a copy of the latest round sends again."""
        if self.publishes.get(publish.seq) is not publish:
            return  # answered before
        if status in (link.CONFIRM_MOVED, link.CONFIRM_RESEND):
            if publish.round != self._round:
                return
            self._round += 1  # (the others' answers in that round do nothing more)
            if status == link.CONFIRM_RESEND:
                asyncio.get_running_loop().call_soon(self.resend)
                return
            self.stalled()
            if hint is not None and hint[0] and self.hinted is not None:
                self.hinted(*hint)
            elif self.recheck is not None:
                self.recheck()
            return
        del self.publishes[publish.seq]
        if self.held:
            publish.confirm.waiting(-1)
        publish.confirm.remote_confirmed(publish.confirm_seq, status != link.CONFIRM_OK)

    def lost(self, publish: Publish) -> None:
        """The link a copy went over dropped: the window waits for it to come back, or for a new leader."""
        if self.publishes.get(publish.seq) is publish:
            self.stalled()

    def stalled(self) -> None:
        """No leader takes what the window holds for now: it waits, counted against its publishers' channels, and
        is sent again a while later (to the leader known then, or to a member that may name it)."""
        if not self.held:
            self.held = True
            for publish in self.publishes.values():
                publish.confirm.waiting(1)
        if self._retry is None and self.publishes:
            self._retry = asyncio.get_running_loop().call_later(RESEND_RETRY, self.resend)

    def _sent(self) -> None:
        """Everything went to a leader: its publishers are read again (their own windows of unconfirmed
        publishes, and the link's flow, bound what follows)."""
        if self.held:
            self.held = False
            for publish in self.publishes.values():
                publish.confirm.waiting(-1)

    def close(self) -> None:
        """The queue is gone: every publish waiting is nacked."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._sent()
        self._round += 1
        publishes, self.publishes = self.publishes, {}
        for publish in publishes.values():
            publish.confirm.remote_confirmed(publish.confirm_seq, True)


class RemoteConsumer:
    """One local consumer of a remote queue: its id on the link and the deliveries not yet passed on."""

    __slots__ = ("id", "owner", "consumer", "buffer", "accepted", "attached", "adopting", "parked", "tries",
                 "settled", "term", "shared", "granted", "recalled")

    def __init__(self, consumer_id: int, consumer: Consumer) -> None:
        self.id = consumer_id
        # its channel's shared prefetch bounds what the owner sends it (``ports.SharedLimit``), a no-ack consumer's
        # too (rabbit_limiter:can_send stops it while the channel is at its limit; its deliveries take no room):
        # ``shared`` while the owner sends only what was granted, ``granted`` of its room, not yet delivered here
        # nor given back
        limiter = consumer.limiter
        self.shared = bool(limiter is not None and limiter.global_prefetch and consumer.shares_limit)
        self.granted = 0
        self.recalled = False  # what it has not used of its grant was asked back, and the owner has not answered
        # the node it last consumed at, under ``id`` (ids are a link's own: another node's may be the same number);
        # an answer to an earlier consume, there or elsewhere, is stale
        self.owner: Owner | None = None
        self.consumer = consumer
        self.buffer: deque[Entry] = deque()
        self.accepted = asyncio.get_running_loop().create_future()  # the owner's answer to CONSUME
        # a quorum queue's consumer outlives a change of leader: while it is not attached to one (none known, or
        # its answer to consuming again is on its way), its settles are parked; ``adopting``: the entries
        # whose seqs it asked the new leader to take back
        self.attached = True
        self.adopting: list[Entry] = []
        self.parked: list[tuple[int, Entry, bytes]] = []  # (mode, entry, a modified outcome's annotations)
        self.tries = 0
        # its settles sent to the leader and not yet known to be on a majority there (the leader they went to, the
        # mark of its link's answer that will tell, mode, the queue's checkout): sent again to the next leader,
        # which applies those its predecessor had not replicated (as RabbitMQ's channel resends its settles)
        self.settled: deque[tuple[Owner, int, int, Checked]] = deque(maxlen=RESETTLE_MAX)
        self.term = 0  # what the owner checks out its deliveries under ``id`` in (its answer to consuming)

    def grant(self, count: int) -> None:
        """(``ports.Grantee``)"""
        if self.owner is not None:
            self.owner.grant(self, count)
        elif count != UNLIMITED and self.consumer.limiter is not None:  # (never sent: the room is back)
            self.consumer.limiter.unreserve(self.consumer, count)

    def recall(self) -> None:
        if self.granted and not self.recalled and self.owner is not None:
            self.recalled = True
            self.owner.recall(self)

    def limit(self) -> None:
        """(``ports.Grantee``) The owner holds it to its grants from now on (none yet), and it asks for room."""
        limiter = self.consumer.limiter
        if self.shared or self.owner is None or limiter is None:
            return
        self.shared = True
        self.owner.grant(self, 0)
        limiter.want(self.consumer, self)

    def arrived(self) -> None:
        """A delivery of its grant came (before it goes on to the client, which counts it unacked then; a no-ack
        consumer's takes no room: it is free again at once)."""
        limiter = self.consumer.limiter
        if self.granted and limiter is not None:
            self.granted -= 1
            if self.consumer.no_ack:
                limiter.unreserve(self.consumer, 1)
            else:
                limiter.arrived()

    def ungranted(self, count: int) -> None:
        """``count`` of its grant came back unused, or never will come (it is gone)."""
        count = min(count, self.granted)
        limiter = self.consumer.limiter
        if count and limiter is not None:
            self.granted -= count
            limiter.unreserve(self.consumer, count)

    def resettles(self) -> list[tuple[int, Checked]]:
        """(mode, checkout) of the settles no leader has said a majority has, however long ago they were sent: a
        leader cut off with no majority anywhere for long lost what a consumer acked as the cut began (nemesis
        seed 178: 50 messages again, 10.5 s apart), and one that lost them across two changes of leader had them
        sent to it once already (seeds 208 and 228: 22 to 31 s apart).  One that a majority had is taken back
        by no leader (``adopt``), and does nothing."""
        return [(mode, checked) for _, _, mode, checked in self.settled]

    def resent(self, owner: "Owner") -> None:
        """The settles went again to ``owner`` (``resettles``, with consuming there): its answer tells of them."""
        mark = owner.settles_sent()
        self.settled = deque(((owner, mark, mode, checked) for _, _, mode, checked in self.settled),
                             maxlen=RESETTLE_MAX)

    def agreed(self, owner: "Owner", mark: int) -> None:
        """``owner`` has on a majority the settles it was sent before its answer ``mark``: they are kept no more."""
        settled = self.settled
        while settled and settled[0][0] is owner and settled[0][1] == mark:
            settled.popleft()
        if settled and settled[0][1] != mark and any(item[0] is owner and item[1] == mark for item in settled):
            self.settled = deque((item for item in settled if item[0] is not owner or item[1] != mark),
                                 maxlen=RESETTLE_MAX)


class Owner(Protocol):
    """The link to the node that owns a remote queue (``peer.Peer``), as the queue's proxy uses it."""

    name: str
    up: bool
    stats: dict[str, list[int]]  # the owner's last report on its queues

    def publish(self, queue: RemoteQueue, message: Message, channel: ConfirmSink | None,
                relay: bool = False) -> bool | None: ...

    def enqueue(self, queue: RemoteQueue, publish: Publish) -> bool: ...

    def consume(self, queue: RemoteQueue, consumer: Consumer, remote: RemoteConsumer | None = None,
                adopt: list[Checked] | None = None, settled: list[tuple[int, Checked]] | None = None
                ) -> RemoteConsumer: ...

    def cancel(self, remote: RemoteConsumer) -> None: ...

    def grant(self, remote: RemoteConsumer, count: int) -> None:
        """Its channel's shared prefetch grants ``remote`` ``count`` more deliveries (``ports.UNLIMITED``: no limit
        of it now); what cannot be sent comes back to the channel at once."""

    def recall(self, remote: RemoteConsumer) -> None:
        """What ``remote`` has not used of its grant is asked back (answered by its ``ungranted``)."""

    def settle(self, mode: int, entries: list[Entry], annotations: bytes = b"") -> None: ...

    def settles_sent(self) -> int:
        """Settles went to the owner: the mark of its answer that tells whether a majority has them
        (``RemoteConsumer.agreed``)."""

    def passed_on(self, remote: RemoteConsumer, entry: Entry, no_ack: bool) -> None: ...

    async def request(self, queue: RemoteQueue, op: str, **fields: Any) -> tuple[dict[str, Any], Message | None]: ...

    def forget(self, remote: RemoteConsumer) -> None:
        """The consumer goes on elsewhere (a quorum queue's leader moved): gone here, uncancelled."""


class AnotherNodesConnection:
    """The owner of another node's exclusive queue as this node sees it (an ``ExclusiveOwner``): a connection
    of that node, so every connection of this one is another connection to it (405 RESOURCE_LOCKED), as
    rabbit_amqqueue:check_exclusive_access compares the queue's owner pid with the channel's connection."""

    peer = ("", 0)

    def __init__(self, node: str, vhost: str) -> None:
        self.name = f"a connection of {node}"
        self.vhost_name = vhost
        self.exclusive_queues: set[Any] = set()

    def force_close(self, reason: str) -> None:
        """(Its node closes it.)"""


class RemoteQueue:
    """The proxy of another node's queue (an ``AnyQueue``): what is done to it here goes to its owner."""

    remote = True
    counts_deliveries = False  # the owner adds its deliveries' headers (and stores what it must)

    def __init__(self, name: str, vhost: str, durable: bool, auto_delete: bool, arguments: dict[str, Any],
                 queue_type: QueueType, args: QueueArgs, peer: Owner, exclusive: bool = False) -> None:
        # an exclusive queue of a connection of the owner (cluster mode): locked to this node's connections
        self.exclusive_owner = AnotherNodesConnection(peer.name, vhost) if exclusive else None
        self.exclusive = exclusive
        self.type = queue_type
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.args = args
        self.policy: "Policy | None" = None
        self.operator_policy: "Policy | None" = None
        self.consumers = Consumers(args, _unused)  # who receives here (x-expires is the owner's business)
        self.stats = MessageStats()  # (what this node did with it; the owner's figures are its own)
        self.deleted = False
        self.unacked = 0
        self.peer = peer
        self.key = f"{vhost}\0{name}"
        qid = self.key.encode()
        self.link_id = link.QID.pack(len(qid)) + qid  # as a publish frame lists it
        self.by_consumer: dict[Consumer, RemoteConsumer] = {}
        self.members: list[str] = []  # a quorum queue's group (forwarder.quorum.groups)
        self.publishes: Window | None = None  # a quorum queue's unconfirmed publishes through here
        # (forwarder.quorum.groups)
        self.replicated = REPLICATED in queue_type.capabilities
        # a quorum queue's deliveries not yet settled: the consumer, and the entry's seq in the queue (what a
        # new leader takes back for it)
        self.taken: dict[Entry, tuple[RemoteConsumer, Checked]] = {}
        # a quorum queue's: asks etcd who leads, when the node followed as the leader refuses a consumer
        self.recheck: Callable[[], None] | None = None
        self.leads: Callable[[], bool] | None = None  # a quorum queue's: whether its node is the leader known here
        # a quorum queue's whose leader came to this node: the node's own queue stands for it now (``fetch``)
        self.replaced = False

    @property
    def node(self) -> str:
        return self.peer.name

    @property
    def available(self) -> bool:
        return self.peer.up

    @property
    def leaderless(self) -> bool:
        """A quorum queue's whose node is not the leader known here (``leads``), or is down."""
        return self.leads is not None and not (self.peer.up and self.leads())

    def local(self) -> None:
        """(Not a queue of this node.)"""
        return None

    @property
    def message_count(self) -> int:
        """As the owner last reported it (every second, and with every basic.get)."""
        return self.peer.stats.get(self.key, (0, 0))[0]

    ready_bytes = 0  # (the owner's figure: not reported)

    @property
    def active_consumer(self) -> Consumer | None:
        """x-single-active-consumer: the one of this node's that receives."""
        return self.consumers.active

    @property
    def unused_auto_delete(self) -> bool:
        """Never here: an auto-delete queue goes once its last consumer has gone, which its owner tells, counting
        every node's (a consumer of this node's is one of its queue's, and its cancel goes there), as RabbitMQ's
        queue process decides (rabbit_amqqueue_process: ``should_auto_delete``, ``is_unused``)."""
        return False

    def __repr__(self) -> str:
        return f"<RemoteQueue {self.vhost}/{self.name} on {self.peer.name}>"

    def set_args(self, args: QueueArgs) -> None:
        """A policy changed the effective arguments: the owner applies them; here, who receives."""
        self.args = args
        self.consumers.set_args(args)

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        """The owner made its deliveries' headers (``counts_deliveries`` is False): as they came."""
        return entry.message.header

    def returns(self, entry: Entry) -> int:
        """The count the owner wrote in the delivery's header (a quorum queue's ``x-delivery-count``)."""
        if REPLICATED not in self.type.capabilities:
            return 0
        count = entry.message.header_value(DELIVERY_COUNT) if entry.message.has_headers else None
        return count if isinstance(count, int) and count > 0 else 0

    def touch(self) -> None:
        """x-expires is the owner's business."""

    # -- in -----------------------------------------------------------------------------------

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None, relay: bool = False) -> bool | None:
        """Forward to the owner, which confirms to ``confirm``.  While it is down: None (unroutable).  A quorum
        queue's confirmed publish goes through its window (``Window``), which sends it to each leader until one
        confirms it.  ``relay``: a publish another node sent here, which the owner passes on no further."""
        publishes = self.publishes
        if publishes is not None and confirm is not None:
            return publishes.publish(confirm, message)
        if publishes is not None and (publishes.leaderless or not self.peer.up):
            return False
        accepted = self.peer.publish(self, message, confirm, relay)
        if accepted is None and REPLICATED in self.type.capabilities:  # its group elects another leader: the
            return False  # publisher sends it again
        return accepted

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.join(consumer)
        remote = self.by_consumer[consumer] = self.peer.consume(self, consumer)
        if consumer.limiter is not None and consumer.shares_limit:
            consumer.grantee = remote
        if self.publishes is not None and (self.publishes.leaderless or not self.peer.up):
            remote.attached = False  # (not sent: it consumes once a leader is known, ``follow``, or reached)

    def remove_consumer(self, consumer: Consumer) -> None:
        self.consumers.leave(consumer)
        remote = self.by_consumer.pop(consumer, None)
        if remote is not None:
            self.peer.cancel(remote)
            self.give_back(remote)

    def accepted(self, consumer: Consumer) -> asyncio.Future[None] | None:
        """Done once the owner accepted the consumer; its refusal (e.g. exclusive use) is raised by it.  None if the
        consumer is gone already (channel closed)."""
        remote = self.by_consumer.get(consumer)
        return remote.accepted if remote is not None else None

    def refused(self, consumer: Consumer) -> None:
        self.consumers.leave(consumer)
        remote = self.by_consumer.pop(consumer, None)
        if remote is not None:
            self.give_back(remote)

    def give_back(self, remote: RemoteConsumer) -> None:
        """The consumer is gone (cancelled here or by the owner, its channel closed, the queue deleted): the
        deliveries its client never got go back to the queue, in place, at the node it consumes at (its consumer
        there is gone too, so nothing else settles them), and nothing of them stays here.  A quorum queue's
        consumer not attached to a leader sends nothing (its entries are named by another node's tags): the next
        leader returns what no consumer took back, as it does the entries of the settles such a consumer parked,
        which go too."""
        buffer, remote.buffer = remote.buffer, deque()
        remote.ungranted(remote.granted)
        taken = self.taken
        if taken:
            for entry in buffer:
                taken.pop(entry, None)
            for _, entry, _ in remote.parked:
                taken.pop(entry, None)
            remote.parked = []
        returned = [entry for entry in buffer if entry.seq]
        if returned and remote.attached:
            (remote.owner or self.peer).settle(link.SETTLE_REQUEUE, returned)

    def delivered(self, remote: RemoteConsumer, entry: Entry, checked: Checked) -> None:
        """A delivery from the owner (``checked``: the entry's checkout in the queue): straight to the client if
        it has credit, else in the buffer."""
        if self.replicated:
            self.taken[entry] = (remote, checked)
        remote.buffer.append(entry)
        self._drain(remote)

    def _drain(self, remote: RemoteConsumer) -> None:
        if not remote.accepted.done():
            return  # deliveries wait for consume-ok to reach the client first
        buffer = remote.buffer
        consumer = remote.consumer
        peer = self.peer
        while buffer and consumer.has_credit():
            entry = buffer.popleft()
            if not consumer.no_ack:
                consumer.unacked += 1
            elif self.replicated:
                self.taken.pop(entry, None)
            consumer.channel.deliver(consumer, entry)
            peer.passed_on(remote, entry, consumer.no_ack)

    def deliver_ready(self) -> None:
        """Credit came back (ack, QoS, writes drained): pass buffered deliveries on."""
        for remote in list(self.by_consumer.values()):
            if remote.buffer:
                self._drain(remote)

    def cancelled(self, consumer: Consumer) -> None:
        """The owner cancelled the consumer (queue deleted) or went down."""
        self.refused(consumer)
        consumer.channel.cancelled_by_broker(consumer)

    # -- a quorum queue's consumers outlive a change of leader ------------------------------------

    def follow(self, peer: Owner) -> None:
        """The quorum queue has a new leader (or the same one in a new term): its consumers here consume there,
        and it takes back what they hold; their clients notice nothing (RabbitMQ's do not either)."""
        old, self.peer = self.peer, peer  # (its publishes still unconfirmed there: it passes them on to the leader)
        for remote in list(self.by_consumer.values()):
            old.forget(remote)
            self._attach(remote)

    def attach_waiting(self) -> None:
        """The leader's link is back: the consumers that lost it consume again."""
        for remote in list(self.by_consumer.values()):
            if not remote.attached:
                self._attach(remote)

    def _attach(self, remote: RemoteConsumer) -> None:
        remote.attached = False
        remote.adopting = []
        if (self.publishes is not None and self.publishes.leaderless) or not self.peer.up:
            return  # it waits for a leader (``follow``), or for its link (``attach_waiting``)
        taken = self.taken
        remote.adopting = [entry for entry, (holder, _) in taken.items() if holder is remote]
        self.peer.consume(self, remote.consumer, remote, [taken[entry][1] for entry in remote.adopting],
                          remote.resettles())

    def reattached(self, remote: RemoteConsumer, ok: bool, tags: list[int], held: list[Checked]) -> None:
        """The leader's answer: the tags it took the held entries back under (0: not taken back, gone or
        returned: the client's settle of it goes nowhere) and their checkouts there (``held``), or a refusal,
        tried again for a while (a leader just elected may not have its queue yet; this node may not have heard
        of the next one, ``recheck``) before the consumer is cancelled."""
        adopting, remote.adopting = remote.adopting, []
        if not ok:
            remote.attached = False  # (a deposed leader's word that the consumer is not there any more)
            remote.tries += 1
            if self.by_consumer.get(remote.consumer) is not remote:
                return
            if self.recheck is not None:
                self.recheck()
            if remote.tries > REATTACH_TRIES:
                self.cancelled(remote.consumer)
                return
            asyncio.get_running_loop().call_later(REATTACH_RETRY, self._try_again, remote, remote.id)
            return
        remote.tries = 0
        tags = tags + [0] * (len(adopting) - len(tags))
        held = held + [(-1, 0, False)] * (len(adopting) - len(held))
        untaken: dict[Entry, Checked] = {}  # (not taken back: their checkouts)
        for entry, tag, checked in zip(adopting, tags, held):
            entry.seq = tag
            if not tag:
                found = self.taken.pop(entry, None)
                if found is not None:
                    untaken[entry] = found[1]
            elif entry in self.taken:
                self.taken[entry] = (remote, checked)
        if any(not entry.seq for entry in remote.buffer):
            remote.buffer = deque(entry for entry in remote.buffer if entry.seq)
        remote.attached = True
        parked, remote.parked = remote.parked, []
        if remote.owner is not None:  # (its settles went with its consume: that leader's answer tells of them)
            # and so do those it held back of entries the leader took nothing back for: its copy may have them
            # carried out in a deposed leader's ops no majority has (that leader's own consumer's settles, handed
            # over), so they are kept for the next leader as those sent are, until a majority has what it has
            remote.settled.extend((remote.owner, 0, mode, untaken[entry]) for mode, entry, _ in parked
                                  if entry in untaken)
            remote.resent(remote.owner)
        for mode, entry, modified in parked:
            if entry not in untaken:
                self._settle(mode, [entry], modified)
        self._drain(remote)

    def _try_again(self, remote: RemoteConsumer, refused_id: int) -> None:
        if remote.id == refused_id and not remote.attached and self.by_consumer.get(remote.consumer) is remote:
            self._attach(remote)

    def unanswered(self, remote: RemoteConsumer, error: ChannelError) -> None:
        """A new consumer of a quorum queue that the node it went to did not take: that node no longer leads
        (this one had not heard yet), or its link dropped before it answered.  It consumes at the leader as one
        that outlived a change of leader does, once one is known and reached; if none has taken it within
        ``LEADER_WAIT``, its basic.consume fails with ``error``."""
        remote.attached = False
        loop = asyncio.get_running_loop()
        loop.call_later(LEADER_WAIT, self._unanswered, remote, error)
        if self.recheck is not None:
            self.recheck()
        loop.call_later(REATTACH_RETRY, self._try_again, remote, remote.id)

    def _unanswered(self, remote: RemoteConsumer, error: ChannelError) -> None:
        if remote.accepted.done() or self.by_consumer.get(remote.consumer) is not remote:
            return
        remote.accepted.set_exception(error)
        self.remove_consumer(remote.consumer)

    def agreed(self, seq: int) -> bool:
        return False  # (what the owner delivers from here, it names itself: ``delivered``)

    def when_agreed(self, done: Callable[[bool], None]) -> bool:
        """What was settled through here went on to the queue's leader: who asked is not told of it (its
        consumers send their settles to that leader again, as they follow it)."""
        done(True)
        return True

    def take_consumer(self, consumer: Consumer, held: list[tuple[Entry, Checked]]) -> list[Entry | None]:
        """A consumer of the queue's object here before (this node led it) goes on through this proxy: the
        leader takes back what it holds, under the same entries."""
        consumer.queue = self
        consumer.counted = False
        self.consumers.join(consumer)
        remote = self.by_consumer[consumer] = RemoteConsumer(0, consumer)
        remote.accepted.set_result(None)
        kept = [checked[1] > 0 or checked[2] for _, checked in held]  # (the others name nothing a leader has)
        for (entry, checked), keep in zip(held, kept):
            if keep:
                self.taken[entry] = (remote, checked)
        self._attach(remote)
        return [entry if keep else None for (entry, _), keep in zip(held, kept)]

    def release(self, consumer: Consumer, entries: list[Entry]) -> tuple[list[Checked], list[ParkedSettle]]:
        """The consumer goes on with the queue's new object (this node leads it now): gone from the old
        leader, uncancelled; the queue's checkouts of the entries it holds ((-1, 0, False): unknown), and its
        parked settles."""
        self.consumers.leave(consumer)
        remote = self.by_consumer.pop(consumer, None)
        parked: list[ParkedSettle] = []
        if remote is not None:
            if not remote.accepted.done():  # its basic.consume waited for the leader: the new object took it
                remote.accepted.set_result(None)
            self.peer.forget(remote)
            for mode, entry, modified in remote.parked:
                found = self.taken.pop(entry, None)
                if found is not None:
                    parked.append((link.SETTLE_MODES[mode], entry, found[1], modified))
            # (and, sent again, its latest settles: no entry here stands for them any more)
            parked.extend((link.SETTLE_MODES[mode], Entry(0, SETTLED), checked, b"")
                          for mode, checked in remote.resettles())
        held = []
        for entry in entries:
            found = self.taken.pop(entry, None)
            held.append(found[1] if found is not None else (-1, 0, False))
        return held, parked

    def keep_settles(self, settles: list[ParkedSettle]) -> None:
        """Nothing to keep: what it took nothing back for (``take_consumer``) names nothing a leader has."""

    # -- settling -----------------------------------------------------------------------------

    def settle(self, entries: list[Entry]) -> None:
        self._settle(link.SETTLE_ACK, entries)

    def requeue(self, entries: Iterable[Entry]) -> None:
        self._settle(link.SETTLE_REQUEUE, list(entries))

    def requeue_released(self, entries: Iterable[Entry]) -> None:
        self._settle(link.SETTLE_RELEASE, list(entries))

    def requeue_left(self, entries: Iterable[Entry]) -> None:
        """A requeue across the link, which names no consumer gone: the owner's queue takes it as a nack's."""
        self.requeue(entries)

    def reject(self, entries: list[Entry]) -> None:
        self._settle(link.SETTLE_REJECT, entries)

    def modify(self, entries: list[Entry], requeue: bool, counted: bool, annotations: bytes) -> None:
        self._settle(link.SETTLE_REJECT if not requeue else link.SETTLE_REQUEUE if counted else link.SETTLE_RELEASE,
                     entries, annotations)

    def _settle(self, mode: int, entries: list[Entry], annotations: bytes = b"") -> None:
        """By delivery tag, to the owner (with a modified outcome's ``annotations``, if any); a quorum queue's
        consumer not attached to a leader (or while none is known: the old one takes settles it no longer
        replicates) parks them.  (One sent again to a new leader, ``RemoteConsumer.resettles``, is its mode.)"""
        taken = self.taken
        if taken:
            waiting = (self.publishes is not None and self.publishes.leaderless) or not self.peer.up
            send = []
            peer, mark = self.peer, 0
            for entry in entries:
                found = taken.get(entry)
                if found is not None:
                    if waiting or not found[0].attached:
                        found[0].parked.append((mode, entry, annotations))
                        continue
                    del taken[entry]
                    mark = mark or peer.settles_sent()
                    found[0].settled.append((peer, mark, mode, found[1]))
                if entry.seq:
                    send.append(entry)
            entries = send
        self.peer.settle(mode, entries, annotations)

    async def fetch(self, no_ack: bool, sends_from: int = 0) -> Entry | None:
        """basic.get at the owner: the entry stays unacked there until settled from here.  A quorum queue's node
        that answers it does not lead (any more: this node had not heard) is asked again once this node knows
        the leader, for up to ``LEADER_WAIT``; if this node comes to lead meanwhile, the error is raised at once
        for the caller to get through the node's own queue (``Messages.get_anywhere``).  (``sends_from`` does not
        apply: the body comes with the reply.)"""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LEADER_WAIT
        while True:
            try:
                reply, message = await self.peer.request(self, "get")
                break
            except ChannelError as exc:
                if (not self.replicated or exc.code != NOT_FOUND or self.deleted or self.replaced
                        or loop.time() >= deadline):
                    raise
            if self.recheck is not None:
                self.recheck()
            await asyncio.sleep(REATTACH_RETRY)
            while self.leaderless and not self.replaced and loop.time() < deadline:
                await asyncio.sleep(REATTACH_RETRY / 10)
        if message is None:
            return None
        entry = Entry(reply["tag"], message, reply["redelivered"])
        if no_ack:
            self.peer.settle(link.SETTLE_ACK, [entry])
        return entry

    async def purged(self) -> int:
        """queue.purge at the owner."""
        reply, _ = await self.peer.request(self, "purge")
        return reply["count"]

    async def counted(self) -> tuple[int, int]:
        """The owner's figures now (its consumers include other nodes'); as it last reported them if it cannot
        answer (a quorum queue's node that leads it no more, say)."""
        try:
            reply, _ = await self.peer.request(self, "count")
        except ChannelError:
            reply = {}
        count, consumers = reply.get("count"), reply.get("consumers")
        if type(count) is int and type(consumers) is int and count >= 0 and consumers >= 0:
            return count, consumers
        return self.message_count, self.peer.stats.get(self.key, (0, 0))[1]

    async def deleted_by_node(self, if_unused: bool, if_empty: bool) -> int | None:
        """queue.delete at the owner, which decides (its refusal is raised here) and counts the messages the queue
        had; None for a quorum queue or a stream, which the cluster deletes through its record (each member drops
        its copy)."""
        if self.replicated or LOG in self.type.capabilities:
            return None
        reply, _ = await self.peer.request(self, "delete", if_unused=if_unused, if_empty=if_empty)
        count = reply.get("deleted")
        return count if type(count) is int and count >= 0 else 0

    def drop_all(self) -> None:
        for remote in self.by_consumer.values():
            self.peer.cancel(remote)
            self.give_back(remote)
        self.by_consumer.clear()


def _unused() -> None:
    """(A proxy's x-expires never runs out here: the owner's does.)"""


def proxy_of(queues: Mapping[str, AnyQueue], name: str) -> RemoteQueue | None:
    """The proxy through which this node reaches the queue of that name, if another node holds it (or, for a
    quorum queue between leaders, none is known to yet); None for a queue of this node, or none."""
    queue = queues.get(name)
    return queue if isinstance(queue, RemoteQueue) else None


_: type[AnyQueue] = RemoteQueue  # (mypy checks that the proxy is a queue as the rest of the node uses one)
