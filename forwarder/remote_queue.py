"""A queue owned by another node, as routing and consumers on this node see it.

It is a :class:`Queue` to everything here — exchanges bind it, ``Broker.route`` returns it,
channels consume from it and settle its entries — but it holds no messages: an enqueue goes
over the link to the owner, and deliveries arrive from the owner for the local consumers,
wait in a small per-consumer buffer while those have no credit (QoS, a slow client) and
leave in order.  Acks, rejects and requeues go back to the owner by delivery tag.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from amqp_server.message import Message
from amqp_server.queue import Consumer, Entry, Queue
from amqp_server.queue_args import QueueArgs
from amqp_server.queue_type import REPLICATED, QueueType

from . import link

if TYPE_CHECKING:
    from amqp_server.ports import ConfirmSink

HOLD = 5.0  # seconds a publish to a quorum queue waits for a leader before it is nacked
HOLD_MAX = 100_000  # publishes held at most per queue (beyond: nacked at once)
REATTACH_RETRY = 0.5  # seconds between tries of a quorum queue's consumer to consume at its new leader
REATTACH_TRIES = 20  # then it is cancelled (the leader refuses it: exclusive use, ...)
RESETTLE_AGE = 10.0  # seconds a quorum queue's consumer's settles are sent again to a new leader
RESETTLE_MAX = 10_000  # of them at most


class Relayed:
    """The confirm of a publish passed on (a held one, or one a deposed leader had not confirmed) stands for
    the confirm its publisher is waiting for, under the seq that was given it then."""

    __slots__ = ("confirm", "seq")

    def __init__(self, confirm: "ConfirmSink", seq: int) -> None:
        self.confirm, self.seq = confirm, seq

    def forwarded(self) -> int:
        return self.seq

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        self.confirm.remote_confirmed(self.seq, rejected)


class Held:
    """Publishes to a quorum queue while no leader of it is known here, or its node is unreachable: each one's
    confirm waits, and once a leader is known all are passed on to it (``forward``), which confirms them; after
    ``HOLD`` seconds without one they are nacked.  A publisher is so slowed by its own window of unconfirmed
    messages rather than answered with a nack per message at full speed; RabbitMQ, too, holds such publishes
    until a leader takes them.  Nothing is stored here: a nacked message was never confirmed."""

    def __init__(self) -> None:
        self.leaderless = False
        # passes a publish on to the leader known now; False or None: it did not take it (nacked)
        self.forward: Callable[[Message, Relayed], bool | None] | None = None
        self._waiting: list[tuple["ConfirmSink", int, Message]] = []
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, confirm: "ConfirmSink | None", message: Message) -> bool:
        """True if the publish's confirm now waits here; False (refused, nacked at once) without confirms or
        with too many held."""
        if confirm is None or len(self._waiting) >= HOLD_MAX:
            return False
        self._waiting.append((confirm, confirm.forwarded(), message))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(HOLD, self.release, True)
        return True

    def release(self, give_up: bool = False) -> None:
        """A leader is known: what waits is passed on to it; nacked if it waited long enough (``give_up``), or
        no leader takes it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, []
        forward = None if give_up or self.leaderless else self.forward
        for confirm, seq, message in waiting:
            if forward is None or not forward(message, Relayed(confirm, seq)):
                confirm.remote_confirmed(seq, True)


class RemoteConsumer:
    """One local consumer of a remote queue: its id on the link and the deliveries not yet passed on."""

    __slots__ = ("id", "consumer", "buffer", "accepted", "attached", "adopting", "parked", "tries", "settled")

    def __init__(self, consumer_id: int, consumer: Consumer) -> None:
        self.id = consumer_id
        self.consumer = consumer
        self.buffer: deque[Entry] = deque()
        self.accepted = asyncio.get_running_loop().create_future()  # the owner's answer to CONSUME
        # a quorum queue's consumer outlives a change of leader: while it is not attached to one (none known, or
        # its answer to consuming again is on its way), its settles are parked; ``adopting``: the entries
        # whose seqs it asked the new leader to take back
        self.attached = True
        self.adopting: list[Entry] = []
        self.parked: list[tuple[int, Entry]] = []
        self.tries = 0
        # its latest settles sent to the leader (loop time, mode, the queue's seq): sent again to the next one,
        # which applies those its predecessor had not replicated (as RabbitMQ's channel resends its settles)
        self.settled: deque[tuple[float, int, int]] = deque(maxlen=RESETTLE_MAX)

    def resettles(self) -> list[list[int]]:
        """(mode, seq) of the settles sent in the last ``RESETTLE_AGE`` seconds."""
        settled = self.settled
        oldest = asyncio.get_running_loop().time() - RESETTLE_AGE
        while settled and settled[0][0] < oldest:
            settled.popleft()
        return [[mode, seq] for _, mode, seq in settled]


class Owner(Protocol):
    """The link to the node that owns a remote queue (``peer.Peer``), as the queue's proxy uses it."""

    name: str
    up: bool
    stats: dict[str, list[int]]  # the owner's last report on its queues

    def publish(self, queue: RemoteQueue, message: Message, channel: ConfirmSink | None,
                relay: bool = False) -> bool | None: ...

    def consume(self, queue: RemoteQueue, consumer: Consumer, remote: RemoteConsumer | None = None,
                adopt: list[int] | None = None, settled: list[list[int]] | None = None) -> RemoteConsumer: ...

    def cancel(self, remote: RemoteConsumer) -> None: ...

    def settle(self, mode: int, entries: list[Entry]) -> None: ...

    def passed_on(self, remote: RemoteConsumer, entry: Entry, no_ack: bool) -> None: ...

    async def request(self, queue: RemoteQueue, op: str) -> tuple[dict[str, Any], Message | None]: ...

    def forget(self, remote: RemoteConsumer) -> None:
        """The consumer goes on elsewhere (a quorum queue's leader moved): gone here, uncancelled."""


class RemoteQueue(Queue):
    def __init__(self, name: str, vhost: str, durable: bool, auto_delete: bool, arguments: dict[str, Any],
                 queue_type: QueueType, args: QueueArgs, peer: Owner) -> None:
        super().__init__(name, vhost, durable, None, auto_delete, arguments, args, None, queue_type=queue_type)
        self.counts_deliveries = self.persists_all = False  # (the owner's: it stores, and adds the headers)
        self.peer = peer
        self.key = f"{vhost}\0{name}"
        qid = self.key.encode()
        self.link_id = link.QID.pack(len(qid)) + qid  # as a publish frame lists it
        self.by_consumer: dict[Consumer, RemoteConsumer] = {}
        self.members: list[str] = []  # a quorum queue's group (forwarder.quorum)
        self.held: Held | None = None  # a quorum queue's publishes waiting for a leader (forwarder.quorum)
        self.replicated = REPLICATED in queue_type.capabilities
        # a quorum queue's deliveries not yet settled: the consumer, and the entry's seq in the queue (what a
        # new leader takes back for it)
        self.taken: dict[Entry, tuple[RemoteConsumer, int]] = {}
        # a quorum queue's: asks etcd who leads, when the node followed as the leader refuses a consumer
        self.recheck: Callable[[], None] | None = None

    @property
    def node(self) -> str:
        return self.peer.name

    @property
    def available(self) -> bool:  # type: ignore[override]  # Queue's is a plain attribute (always True)
        return self.peer.up

    remote = True

    @property
    def message_count(self) -> int:
        """As the owner last reported it (every second, and with every basic.get)."""
        return self.peer.stats.get(self.key, (0, 0))[0]

    def __repr__(self) -> str:
        return f"<RemoteQueue {self.vhost}/{self.name} on {self.peer.name}>"

    def touch(self) -> None:
        """x-expires is the owner's business."""

    # -- in -----------------------------------------------------------------------------------

    def enqueue(self, message: Message,  # type: ignore[override]  # None: its node is down (unroutable)
                confirm: "ConfirmSink | None" = None, relay: bool = False) -> bool | None:
        """Forward to the owner, which confirms to ``confirm``.  While it is down: None (unroutable); a quorum
        queue's publish waits for a leader instead (``Held``), since its group elects another one.  ``relay``: a
        publish another node sent here, which the owner passes on no further."""
        held = self.held
        if held is not None and (held.leaderless or not self.peer.up):
            return held.hold(confirm, message)
        accepted = self.peer.publish(self, message, confirm, relay)
        if accepted is None and REPLICATED in self.type.capabilities:  # its group elects another leader: the
            return False  # publisher sends it again
        return accepted

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        super().add_consumer(consumer)
        self.by_consumer[consumer] = self.peer.consume(self, consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        remote = self.by_consumer.pop(consumer, None)
        if remote is not None:
            self.peer.cancel(remote)

    def accepted(self, consumer: Consumer) -> asyncio.Future[None] | None:
        """Done once the owner accepted the consumer; its refusal (e.g. exclusive use) is raised by it.  None if the
        consumer is gone already (channel closed)."""
        remote = self.by_consumer.get(consumer)
        return remote.accepted if remote is not None else None

    def refused(self, consumer: Consumer) -> None:
        Queue.remove_consumer(self, consumer)
        self.by_consumer.pop(consumer, None)

    def delivered(self, remote: RemoteConsumer, entry: Entry, seq: int) -> None:
        """A delivery from the owner (``seq``: the entry's in the queue): straight to the client if it has
        credit, else in the buffer."""
        if self.replicated:
            self.taken[entry] = (remote, seq)
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
        if (self.held is not None and self.held.leaderless) or not self.peer.up:
            return  # it waits for a leader (``follow``), or for its link (``attach_waiting``)
        taken = self.taken
        remote.adopting = [entry for entry, (holder, _) in taken.items() if holder is remote]
        self.peer.consume(self, remote.consumer, remote, [taken[entry][1] for entry in remote.adopting],
                          remote.resettles())

    def reattached(self, remote: RemoteConsumer, ok: bool, tags: list[int]) -> None:
        """The leader's answer: the tags it took the held entries back under (0: not taken back, gone or
        returned: the client's settle of it goes nowhere), or a refusal, tried again for a while (a leader
        just elected may not have its queue yet; this node may not have heard of the next one, ``recheck``)
        before the consumer is cancelled."""
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
        for entry, tag in zip(adopting, tags):
            entry.seq = tag
            if not tag:
                self.taken.pop(entry, None)
        if any(not entry.seq for entry in remote.buffer):
            remote.buffer = deque(entry for entry in remote.buffer if entry.seq)
        remote.attached = True
        parked, remote.parked = remote.parked, []
        for mode, entry in parked:
            self._settle(mode, [entry])
        self._drain(remote)

    def _try_again(self, remote: RemoteConsumer, refused_id: int) -> None:
        if remote.id == refused_id and not remote.attached and self.by_consumer.get(remote.consumer) is remote:
            self._attach(remote)

    def take_consumer(self, consumer: Consumer, held: list[tuple[Entry, int]]) -> list[Entry | None]:
        """A consumer of the queue's object here before (this node led it) goes on through this proxy: the
        leader takes back what it holds, under the same entries."""
        consumer.queue = self
        consumer.counted = False
        Queue.add_consumer(self, consumer)
        remote = self.by_consumer[consumer] = RemoteConsumer(0, consumer)
        remote.accepted.set_result(None)
        for entry, seq in held:
            if seq >= 0:
                self.taken[entry] = (remote, seq)
        self._attach(remote)
        return [entry if seq >= 0 else None for entry, seq in held]

    def release(self, consumer: Consumer, entries: list[Entry]) -> tuple[list[int], list[tuple[str, Entry, int]]]:
        """The consumer goes on with the queue's new object (this node leads it now): gone from the old
        leader, uncancelled; the queue's seqs of the entries it holds (-1: unknown), and its parked settles."""
        Queue.remove_consumer(self, consumer)
        remote = self.by_consumer.pop(consumer, None)
        parked = []
        if remote is not None:
            self.peer.forget(remote)
            for mode, entry in remote.parked:
                found = self.taken.pop(entry, None)
                if found is not None:
                    parked.append((_MODES[mode], entry, found[1]))
            # (and, sent again, its latest settles: no entry here stands for them any more)
            parked.extend((_MODES[mode], Entry(0, _GONE), seq) for mode, seq in remote.resettles())
        seqs = []
        for entry in entries:
            found = self.taken.pop(entry, None)
            seqs.append(found[1] if found is not None else -1)
        return seqs, parked

    # -- settling -----------------------------------------------------------------------------

    def settle(self, entries: list[Entry]) -> None:
        self._settle(link.SETTLE_ACK, entries)

    def requeue(self, entries: Iterable[Entry]) -> None:
        self._settle(link.SETTLE_REQUEUE, list(entries))

    def reject(self, entries: list[Entry]) -> None:
        self._settle(link.SETTLE_REJECT, entries)

    def _settle(self, mode: int, entries: list[Entry]) -> None:
        """By delivery tag, to the owner; a quorum queue's consumer not attached to a leader (or while none is
        known: the old one takes settles it no longer replicates) parks them."""
        taken = self.taken
        if taken:
            waiting = (self.held is not None and self.held.leaderless) or not self.peer.up
            send = []
            now = asyncio.get_running_loop().time()
            for entry in entries:
                found = taken.get(entry)
                if found is not None:
                    if waiting or not found[0].attached:
                        found[0].parked.append((mode, entry))
                        continue
                    del taken[entry]
                    found[0].settled.append((now, mode, found[1]))
                if entry.seq:
                    send.append(entry)
            entries = send
        self.peer.settle(mode, entries)

    async def fetch(self, no_ack: bool) -> Entry | None:
        """basic.get at the owner: the entry stays unacked there until settled from here."""
        reply, message = await self.peer.request(self, "get")
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

    def drop_all(self) -> None:
        for remote in self.by_consumer.values():
            self.peer.cancel(remote)
        self.by_consumer.clear()


_MODES = {link.SETTLE_ACK: "ack", link.SETTLE_REQUEUE: "requeue", link.SETTLE_REJECT: "reject"}
_GONE = Message.stored(0, 0)  # the message of an entry settled already


def proxy_of(queues: Mapping[str, Queue], name: str) -> RemoteQueue | None:
    """The proxy through which this node reaches the queue of that name, if another node holds it (or, for a
    quorum queue between leaders, none is known to yet); None for a queue of this node, or none."""
    queue = queues.get(name)
    return queue if isinstance(queue, RemoteQueue) else None
