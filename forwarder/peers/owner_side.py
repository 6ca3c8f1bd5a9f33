"""The owner's side of a link: publishes into local queues, consumers on behalf of another node.

A remote consumer is an ordinary :class:`Consumer` on the local queue whose "channel" is a
:class:`RemoteConsumerChannel`: the queue's round-robin, prefetch and requeue logic stay the
queue's own.  Deliveries are always taken with manual ack here; the consuming node acks at once
for its no-ack consumers, so a message in flight when a link drops is requeued, not lost.  Each
consumer has a credit window: deliveries the consuming node has not yet passed to its client, at most
``CREDIT_WINDOW`` of them and ``BYTE_WINDOW`` of their bodies, so that a client that does not read makes its node
hold a few large bodies, not its prefetch of them.  A consumer whose channel has a shared prefetch (basic.qos
global) gets, besides, only what its node granted it of the channel's room (``RemoteConsumerChannel.grant``), as
RabbitMQ's queue asks the channel's limiter before each delivery: the rest goes to the queue's other consumers.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, cast

from amqp_server import errors
from amqp_server.errors import AMQPError
from amqp_server.logs import untrusted
from amqp_server.ports import UNLIMITED, ClientChannel
from amqp_server.frontend.stored_bodies import SEND_FROM_FILE, body_out, release_body
from amqp_server.message import RELEASE_FROM, Message
from amqp_server.queues.queue import RESETTLE_MAX, AnyQueue, Checked, Consumer, Entry, LocalQueue
from amqp_server.queues import quorum_machine as machine
from amqp_server.queues.queue_type import REPLICATED
from amqp_server.broker.vhost import home_node_down
from amqp_server.amqp1 import filters

from . import node_link as link
from .remote_queue import RemoteQueue, proxy_of

if TYPE_CHECKING:
    from amqp_server.broker import Broker
    from amqp_server.queues.quorum_queue import QuorumQueue

log = logging.getLogger("warren.forwarder.session")

CREDIT_WINDOW = 2000
BYTE_WINDOW = 8 << 20  # bodies' bytes sent to a consumer's node and not yet passed to its client (one more may go)
SYNCS_MAX = 256  # another node's changes of definitions waited for here at once; past them, answered "not yet"
# seconds a quorum queue keeps what a node's consumers hold when their link falls silent (heartbeats unheard):
# the node may only be paused or cut off a while, as RabbitMQ does not notice a node gone silent before its
# net_ticktime (60 s) has passed
SILENT_GRACE = 60.0
RECONCILE = 5.0  # seconds, once that node's link is back, for its consumers to take back what they held
_tags = itertools.count(time.time_ns())  # unique across sessions: a stale ack never hits a new delivery


class InFlight:
    """A remote consumer's deliveries its node has not yet passed to its client: their bodies' sizes, in the order
    sent, since its node gives credit back by count, in that order (``Peer.passed_on``)."""

    __slots__ = ("sizes", "bytes")

    def __init__(self) -> None:
        self.sizes: deque[int] = deque()
        self.bytes = 0

    def sent(self, size: int) -> None:
        self.sizes.append(size)
        self.bytes += size

    def credited(self, count: int) -> None:
        sizes = self.sizes
        for _ in range(min(count, len(sizes))):
            self.bytes -= sizes.popleft()

    def carried_over(self, count: int) -> None:
        """A consumer taken over from the previous leader: ``count`` deliveries it sent are still on their way
        to the client (of sizes unknown here: counted as empty)."""
        self.sizes = deque(itertools.repeat(0, min(count, CREDIT_WINDOW)))
        self.bytes = 0


class RemoteConsumerChannel:
    """Stands in for the AMQP channel of a consumer on another node."""

    __slots__ = ("session", "id", "in_flight", "_client", "grant", "wants")

    def __init__(self, session: "PeerSession", consumer_id: int, client: ClientChannel, shared: bool) -> None:
        self.session = session
        self.id = consumer_id
        self.in_flight = InFlight()
        self._client = client
        # ``shared``: deliveries its node granted of its channel's shared prefetch and not yet sent (None: the
        # channel has none); with none left, a delivery due asks for more (WANT) once until granted
        self.grant: int | None = 0 if shared else None
        self.wants = False

    def client(self) -> ClientChannel:
        return self._client

    def can_deliver(self, shared: bool) -> bool:
        in_flight = self.in_flight
        if len(in_flight.sizes) >= CREDIT_WINDOW or in_flight.bytes >= BYTE_WINDOW or self.session.link.write_paused:
            return False
        if self.grant is None or self.grant > 0:
            return True
        if not self.wants:  # rabbit_limiter:can_send said suspend: the channel resumes the queue when it has room
            self.wants = True
            self.session.link.send(link.WANT, link.ID.pack(self.id))
        return False

    def granted(self, count: int) -> None:
        """Its node granted ``count`` more (``UNLIMITED``: its channel has no shared limit now); what it does not
        use is kept for the queue's next messages until its node asks for it back (``PeerSession._recall``)."""
        self.wants = False
        self.grant = None if count == UNLIMITED else (self.grant or 0) + count

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        if self.grant is not None:
            self.grant -= 1
        tag = next(_tags)
        self.in_flight.sent(entry.message.body_size)
        session = self.session
        session.unacked[tag] = (entry, consumer.queue, consumer)
        queue = consumer.queue
        flags = entry.redelivered | (link.AGREED if queue.agreed(entry.seq) else 0) \
            | (link.GRANTED if self.grant is not None else 0)
        session.send_entry(link.DELIVER, link.DELIVER_HEAD.pack(self.id, tag, entry.seq, flags), entry, queue,
                           queue.delivery_header(entry) if consumer.counted else None)

    def cancelled_by_broker(self, consumer: Consumer) -> None:
        self.session.consumers.pop(self.id, None)
        self.session.link.send(link.CANCELLED, link.ID.pack(self.id))

    def failed(self, consumer: Consumer, reason: str) -> None:
        """(A message it was to get cannot be read: its node is told the consumer is gone.)"""
        consumer.queue.remove_consumer(consumer)
        self.cancelled_by_broker(consumer)

    def handed_over(self, consumer: Consumer, old: AnyQueue, new: AnyQueue) -> None:
        """This node no longer leads the quorum queue: the consumer is dropped here, uncancelled; its node
        takes it, and what it holds, to the new leader (``RemoteQueue.follow``).  Its node is told (as a
        refusal to consume again), lest it wait here for deliveries should it not have heard of the new leader
        (its etcd watch stalled): it asks etcd, and tries again meanwhile."""
        session = self.session
        session.consumers.pop(self.id, None)
        for tag in [tag for tag, (_, _, held_by) in session.unacked.items() if held_by is consumer]:
            del session.unacked[tag]
        error = home_node_down(new)
        session.link.send(link.CONSUMED, link.encode_json({"id": self.id, "error": [error.code, error.text]}))


class Orphans:
    """What the consumers of a node whose link fell silent held of the quorum queues led here: neither
    redelivered nor returned while the node may still come back (a pause, a cut shorter than ``SILENT_GRACE``).
    Each of its consumers takes its own back when it consumes again over the node's next link (``Session._adopt``;
    the rest of what it held, lost on the way to it, is returned then), and the settles it resends apply to it;
    what none took back within ``RECONCILE`` seconds of that link, or within ``SILENT_GRACE`` if the node never
    comes back, is returned then.  A queue deposed meanwhile is the next leader's business
    (``QuorumQueue.adopt``): its entries here are dropped, not returned."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker
        # node -> (queue, its seq) -> (entry, the id on the node's link of the consumer that held it)
        self.held: dict[str, dict[tuple[AnyQueue, int], tuple[Entry, int]]] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._links: dict[str, int] = {}  # node -> its links open here

    def keep(self, node: str, taken: list[tuple[Entry, AnyQueue, int]]) -> None:
        held = self.held.setdefault(node, {})
        for entry, queue, consumer_id in taken:
            held[(queue, entry.seq)] = (entry, consumer_id)
        self._release_in(node, RECONCILE if self._links.get(node) else SILENT_GRACE)  # (back already, or not)

    def opened(self, node: str) -> None:
        """A link of the node: its consumers have ``RECONCILE`` seconds to take back what they held."""
        self._links[node] = self._links.get(node, 0) + 1
        if node in self.held:
            self._release_in(node, RECONCILE)

    def closed(self, node: str) -> None:
        left = self._links.get(node, 0) - 1
        if left > 0:
            self._links[node] = left
        else:
            self._links.pop(node, None)

    def take(self, node: str, queue: AnyQueue, seq: int) -> Entry | None:
        held = self.held.get(node)
        found = held.pop((queue, seq), None) if held else None
        return found[0] if found is not None else None

    def taken_back(self, node: str, consumer_id: int) -> None:
        """The node's consumer once ``consumer_id`` took back what it holds: what else it held goes back now."""
        held = self.held.get(node)
        if held:
            self._return(node, [key for key, (_, holder) in held.items() if holder == consumer_id])

    def _release_in(self, node: str, delay: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        current = self._timers.get(node)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        self._timers[node] = (due, loop.call_at(due, self.release, node))

    def release(self, node: str) -> None:
        """Return what the node's consumers did not take back."""
        timer = self._timers.pop(node, None)
        if timer is not None:
            timer[1].cancel()
        self._return(node, list(self.held.get(node, ())))

    def close(self) -> None:
        """The node stops: no grace runs out on its closed broker."""
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _return(self, node: str, keys: list[tuple[AnyQueue, int]]) -> None:
        """Those entries go back to their queues (those still led here)."""
        held = self.held.get(node, {})
        taken = [(held.pop(key)[0], key[0], None) for key in keys]
        if not held:
            self.held.pop(node, None)
        taken = [item for item in taken if not item[1].deleted]
        if taken:
            log.info("%d messages held for node %s's consumers returned", len(taken), node)
            self.broker.settle_taken(taken, True)


class PeerSession:
    def __init__(self, broker: "Broker", server_link: link.ServerLink, orphans: Orphans) -> None:
        """``orphans``: the node's (``Cluster.orphans``), which outlives its sessions."""
        self.broker = broker
        self.link = server_link
        self.orphans = orphans
        self.orphans.opened(server_link.peer_name)
        self.unacked: dict[int, tuple[Entry, AnyQueue, Consumer | None]] = {}
        self.consumers: dict[int, Consumer] = {}
        self.unsynced: deque[tuple[int, int, int]] = deque()  # (link seq, status, group commit batch)
        # link seq -> [copies a replicated queue's group has yet to take, status once fsynced (or None),
        # answered already (a group refused it: nacked at once)]
        self.replicating: dict[int, list] = {}
        self._publishing = 0  # the link seq being enqueued (what ``forwarded`` hands out)
        self._confirms: list[bytes] = []  # this turn's confirms, one CONFIRMS frame (``_send_confirm``)
        self._send_confirms_cb = self._send_confirms
        self._queues: dict[bytes, LocalQueue] = {}  # publish targets by queue id
        self._syncs: set[asyncio.Task[Any]] = set()  # changes of definitions waited for here (the other node's, ours)
        self._settling: set[AnyQueue] = set()  # the queues the link's settles went to since it last asked (``_agree``)
        self._unknown_settles = False  # one of them named a delivery tag unknown here (its consumer was handed over)
        self.gone = False  # its link closed: answers waited for go nowhere
        self._handlers = {link.PUBLISH: self._publish, link.RELAY: self._relayed, link.ENQUEUE: self._enqueue,
                          link.CONSUME: self._consume,
                          link.CANCEL: self._cancel, link.SETTLE: self._settle, link.MODIFY: self._modify,
                          link.CREDIT: self._credit, link.SHARE: self._share,
                          link.RECALL: self._recall,
                          link.REQUEST: self._request, link.REPLICATE: self._replicate,
                          link.REPLICATED: self._replicated, link.DIRECT_REPLY: self._direct_reply}

    def frame(self, ftype: int, payload: bytes) -> None:
        self._handlers[ftype](payload)

    # -- publishes ----------------------------------------------------------------------------

    def _relayed(self, payload: bytes) -> None:
        self._publish(payload, relayed=True)

    def _publish(self, payload: bytes, relayed: bool = False) -> None:
        """One message for one or more queues here: stored once, confirmed once (refused if any refused)."""
        seq, qids_len = link.PUBLISH_HEAD.unpack_from(payload)
        pos = link.PUBLISH_HEAD.size
        qids = link.read_queue_ids(payload, pos, pos + qids_len)
        message = link.read_message(payload, pos + qids_len)  # (the last read of it: it may take the payload)
        found = rejected = False
        self._publishing = seq
        sink = self if seq else None
        for qid in qids:
            queue = self._queue(qid)
            if queue is not None:
                found = True
                rejected = not queue.enqueue(message, sink) or rejected
            elif (proxy := self._elsewhere(qid)) is not None:  # a quorum queue whose leader moved
                taken = self._pass_on(proxy, message, sink, relayed)
                found = found or taken
                rejected = rejected or not taken
        status = link.CONFIRM_REJECTED if rejected else link.CONFIRM_OK if found else link.CONFIRM_NO_QUEUE
        if seq:
            self._answer(seq, status, message)

    def _enqueue(self, payload: bytes) -> None:
        """A publish of another node's window for a quorum queue (``remote_queue.Window``): taken by the queue if
        it leads here and has not taken it before, confirmed once its group has it.  Not passed on: the window
        sends it to the leader itself, once its node knows it (told ``CONFIRM_MOVED``, it asks etcd)."""
        seq, qids_len = link.PUBLISH_HEAD.unpack_from(payload)
        pos = link.PUBLISH_HEAD.size
        qids = link.read_queue_ids(payload, pos, pos + qids_len)
        pos += qids_len
        enqueuer, publish, floor = link.ENQUEUER_HEAD.unpack_from(payload, pos)
        queue = self._queue(qids[0]) if len(qids) == 1 else None
        if queue is None or REPLICATED not in queue.type.capabilities:  # (not a replicated queue led here)
            if len(qids) == 1 and self._elsewhere(qids[0]) is not None:
                cluster = self.broker.cluster
                assert cluster is not None  # (a session is the cluster's)
                self.moved(seq, *cluster.quorum.leader_of(qids[0].decode()))
            else:
                self._answer(seq, link.CONFIRM_NO_QUEUE)
            return
        message = link.read_message(payload, pos + link.ENQUEUER_HEAD.size)
        self._publishing = seq
        verdict = cast("QuorumQueue", queue).enqueue_from(message, self, enqueuer, publish, floor)
        if verdict == machine.AHEAD:
            self._answer(seq, link.CONFIRM_RESEND)
        elif verdict == machine.SEEN:
            self._confirm(seq, link.CONFIRM_OK)  # (on a majority's disks: once what the leader has is)
        else:
            self._answer(seq, link.CONFIRM_REJECTED if verdict == "refused" else link.CONFIRM_OK, message)

    def _direct_reply(self, payload: bytes) -> None:
        """A reply the other node routed to a direct reply-to consumer of this node's (``ReplyConsumers.route``)."""
        size = link.QID.unpack_from(payload)[0]
        name = bytes(payload[link.QID.size:link.QID.size + size]).decode()
        self.broker.replies.deliver(name, link.read_message(payload, link.QID.size + size))

    def moved(self, seq: int, leader: str, term: int) -> None:
        """A publish of another node's window this node does not take (it does not lead the queue, or was
        deposed before its group had it): the window sends it to the leader, which we name if we know it."""
        self.replicating.pop(seq, None)
        self.link.send(link.CONFIRM, link.CONFIRM_BODY.pack(seq, link.CONFIRM_MOVED), link.MOVED_HINT.pack(term),
                       leader.encode())

    def _answer(self, seq: int, status: int, message: Message | None = None) -> None:
        """Confirm (or refuse) the publish ``seq``: once on disk here if it was stored, and taken by its group."""
        if message is not None and message.awaits_commit:
            persistence = self.broker.persistence
            self.unsynced.append((seq, status, persistence.batch))
            persistence.waiters.add(self)
        else:
            self._confirm(seq, status)

    def _confirm(self, seq: int, status: int) -> None:
        """The publish is on disk here: confirmed now, or once the groups of its replicated queues have it."""
        waiting = self.replicating.get(seq)
        if waiting is None:
            self._send_confirm(seq, status)
            return
        waiting[1] = status
        self._settled(seq, waiting)

    def _send_confirm(self, seq: int, status: int) -> None:
        """A publish's answer joins this turn's CONFIRMS frame, held on the link (``FrameLink.hold``): sent before
        any other frame, so in the order the answers were given, and at the latest at the end of the turn.  (A
        frame each cost both nodes a frame's work per publish.)"""
        confirms = self._confirms
        if not confirms:
            self.link.hold(self._send_confirms_cb)
        confirms.append(link.CONFIRM_BODY.pack(seq, status))

    def _send_confirms(self) -> None:
        confirms, self._confirms = self._confirms, []
        self.link.send(link.CONFIRMS, *confirms)

    def forwarded(self) -> int:
        """A replicated queue led here took the publish: its confirm also waits for the queue's group."""
        seq = self._publishing
        waiting = self.replicating.setdefault(seq, [0, None, False])
        waiting[0] += 1
        return seq

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        waiting = self.replicating.get(seq)
        if waiting is None:
            return
        waiting[0] -= 1
        if rejected and not waiting[2]:
            waiting[2] = True
            self._send_confirm(seq, link.CONFIRM_REJECTED)
        self._settled(seq, waiting)

    def waiting(self, change: int) -> None:
        """(Another node's publishes passed on here: that node's own window holds its publishers back.)"""

    def _settled(self, seq: int, waiting: list) -> None:
        """Both on disk here and taken by every group: confirmed, unless nacked already."""
        if waiting[0] == 0 and waiting[1] is not None:
            del self.replicating[seq]
            if not waiting[2]:
                self._send_confirm(seq, waiting[1])

    @staticmethod
    def _pass_on(proxy: RemoteQueue, message: Message, sink: "PeerSession | None", relayed: bool) -> bool:
        """A publish for a quorum queue this node no longer leads (the sending node has not learned of the new
        leader yet, its etcd watch broken or cut off): passed on to the leader known here, which confirms it
        once its group has it — rather than refused, which its publisher would answer by sending it again at
        once, a flood of nacks until its node learns.  Held while no leader is known here either (``Held``).
        Refused (False) only if it was passed on once already: a publish crosses at most two links, never
        loops between nodes that disagree on the leader."""
        if sink is not None and proxy.publishes is not None:
            return proxy.publishes.publish(sink, message)
        return not relayed and bool(proxy.enqueue(message, sink, relay=True))

    def _elsewhere(self, qid: bytes) -> RemoteQueue | None:
        """The proxy of a quorum queue led by another node (or by none known), if that is what ``qid`` is here."""
        vhost_name, _, name = qid.decode().partition("\0")
        vhost = self.broker.vhosts.get(vhost_name)
        proxy = proxy_of(vhost.queues, name) if vhost is not None else None
        return proxy if proxy is not None and REPLICATED in proxy.type.capabilities else None

    def _queue(self, qid: bytes) -> LocalQueue | None:
        """A publish target by its id (vhost, NUL, name); None if there is no such queue here."""
        queue = self._queues.get(qid)
        if queue is None or queue.deleted:
            vhost_name, _, name = qid.decode().partition("\0")
            try:
                queue = self._queues[qid] = self._local_queue(vhost_name, name)
            except AMQPError:
                return None
        return queue

    def synced(self, batch: int) -> None:
        """Group commit ``batch`` is on disk: confirm the publishes that waited for it."""
        unsynced = self.unsynced
        while unsynced and unsynced[0][2] <= batch:
            seq, status, _ = unsynced.popleft()
            self._confirm(seq, status)
        if not unsynced:
            self.broker.persistence.waiters.discard(self)

    def refused(self, batch: int) -> None:
        """Group commit ``batch`` failed: the publishes that waited for it are refused (nacked to their publisher)."""
        unsynced = self.unsynced
        while unsynced and unsynced[0][2] <= batch:
            self._confirm(unsynced.popleft()[0], link.CONFIRM_REJECTED)
        if not unsynced:
            self.broker.persistence.waiters.discard(self)

    # -- consumers ----------------------------------------------------------------------------

    def _consume(self, payload: bytes) -> None:
        request = json.loads(payload)
        consumer_id = request["id"]
        try:
            queue = self._local_queue(request["vhost"], request["queue"])
            accepts = _filters(request.get("filter_set"))
            # the client's channel, as its node tells it (not told by a node of an earlier version)
            connection, number, host, port, user = request.get("client") or ("", 0, "?", 0, "")
            client = ClientChannel(connection, number, (host, port), user, self.link.peer_name)
            consumer = self.broker.consume(queue, RemoteConsumerChannel(self, consumer_id, client,
                                                                        request.get("shared") is True),
                                           request["tag"], False, request["exclusive"],
                                           link.arguments_from(request["arguments"], request["timestamps"]),
                                           request["prefetch"])
            consumer.sends_from = SEND_FROM_FILE
        except AMQPError as exc:
            self.link.send(link.CONSUMED, link.encode_json({"id": consumer_id, "error": [exc.code, exc.text]}))
            return
        if accepts is not None:
            queue.filter_consumer(consumer, accepts)
        self.consumers[consumer_id] = consumer
        # ``term``: what the deliveries through this consumer are checked out in (``Checked``)
        reply: dict[str, Any] = {"id": consumer_id, "error": None, "term": queue.term}
        if "adopt" in request:  # a consumer that outlived a change of leader: what it holds, taken back
            self._resettle(queue, request.get("settled"))
            reply["tags"], reply["held"] = self._adopt(consumer, request["adopt"], request.get("buffered"))
            if not all(reply["tags"]):  # (what is not taken back is delivered again, or was settled: the logs tell)
                log.info("%s's consumer %s of %s took back %d of the %d entries it held",
                         untrusted(self.link.peer_name), untrusted(consumer_id), untrusted(queue.name),
                         sum(1 for tag in reply["tags"] if tag), len(reply["tags"]))
            if isinstance(request.get("was"), int):
                self.orphans.taken_back(self.link.peer_name, request["was"])
        self.link.send(link.CONSUMED, link.encode_json(reply))
        queue.deliver_ready()

    def _resettle(self, queue: LocalQueue, settled: Any) -> None:
        """Settles a consumer sent the previous leader (mode, then its checkout: ``[mode, seq, term, agreed]``),
        sent again: those of entries still kept for a consumer to take back (``QuorumQueue.adopt``; the
        previous leader had not replicated them) are carried out; the others were, or the entry is no longer
        the consumer's: nothing to do.  Either way, its node's next question on settles (``_agree``) is answered
        once a majority has all this leader has now: its copy may have carried out those settles, or its node's
        held back for the entries not taken back (``RemoteQueue.reattached``), in a deposed leader's ops no
        majority has, and its node keeps them for the next leader until then.  (Answered at once, it forgot
        them, and this leader deposed before its followers had those ops left the next to deliver them again.)"""
        self._settling.add(queue)
        by_mode: dict[int, list[Checked]] = {}
        for settle in settled[:RESETTLE_MAX] if isinstance(settled, list) else ():
            if isinstance(settle, list) and len(settle) == 4 and settle[0] in range(len(link.SETTLE_MODES)):
                by_mode.setdefault(settle[0], []).append(link.read_checked(settle[1:]))
        for mode, held in by_mode.items():
            found = self._taken_back(queue, held, queue.adopt(held))
            taken = [(entry, queue, None) for entry in found if entry is not None]
            if taken:
                self.broker.settle_as(taken, link.SETTLE_MODES[mode])
                log.info("%s's consumer of %s: %d of the %d %s settles it sent again carried out here",
                         untrusted(self.link.peer_name), untrusted(queue.name), len(taken), len(held),
                         link.SETTLE_MODES[mode])

    def _adopt(self, consumer: Consumer, held: Any, buffered: Any) -> tuple[list[int], list[Checked | None]]:
        """The entries the queue kept for a consumer of the previous leader (``held``: their checkouts) become
        this consumer's unacked, under new tags (0: not taken back; its client's settle of it is a no-op), and
        their checkouts here; ``buffered`` of them are not yet passed to the client (the link's credit counts
        them)."""
        checked = [link.read_checked(c) for c in held] if isinstance(held, list) else []  # (a peer's)
        buffered = buffered if type(buffered) is int and buffered >= 0 else 0
        queue = consumer.queue
        local = queue.local()  # (the consumer's queue: this node's, unless its leader moved away since)
        cast(RemoteConsumerChannel, consumer.channel).in_flight.carried_over(buffered)
        if local is None:
            return [0] * len(checked), [None] * len(checked)
        unacked = self.unacked
        tags: list[int] = []
        held_here: list[Checked | None] = []
        for entry in self._taken_back(local, checked, local.adopt(checked)):
            if entry is None:
                tags.append(0)
                held_here.append(None)
                continue
            tag = next(_tags)
            unacked[tag] = (entry, queue, consumer)
            consumer.unacked += 1
            tags.append(tag)
            held_here.append(local.checked(entry))
        return tags, held_here

    def _taken_back(self, queue: LocalQueue, held: list[Checked], found: list[Entry | None]) -> list[Entry | None]:
        """Besides what ``queue`` kept for a consumer to take back (``found``), the entries of ``held`` that this
        link's consumers consuming here before held (the consumer's node told it to consume again here, as if
        the leader had changed: a change of term it heard late, a retry crossing a change of leader), and those
        its node's consumers held when its link fell silent (``Orphans``): left to consumers that are gone, they
        would stay unacked for good.  Each only if checked out here in the term the consumer names."""
        if None not in found:
            return found
        unacked, node = self.unacked, self.link.peer_name
        gone = {entry.seq: tag for tag, (entry, held_in, holder) in unacked.items()
                if held_in is queue and holder is not None and holder not in queue.consumers}
        taken: list[Entry | None] = []
        for entry, checked in zip(found, held):
            if entry is None and queue.holds(checked):
                seq = checked[0]
                entry = unacked.pop(gone[seq])[0] if seq in gone else self.orphans.take(node, queue, seq)
            taken.append(entry)
        return taken

    def _local_queue(self, vhost_name: str, name: str) -> LocalQueue:
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None or (queue := vhost.queues.get(name)) is None:
            raise errors.not_found(f"no queue '{name}' in vhost '{vhost_name}'")
        local = queue.local()
        if local is None:  # (a quorum queue's leader moved, or is being elected): it exists
            raise home_node_down(queue)
        return local

    def _cancel(self, payload: bytes) -> None:
        consumer = self.consumers.pop(link.ID.unpack(payload)[0], None)
        if consumer is not None:
            self.broker.remove_consumer(consumer)


    def _credit(self, payload: bytes) -> None:
        consumer_id, count = link.CREDIT_BODY.unpack(payload)
        consumer = self.consumers.get(consumer_id)
        if consumer is not None:
            channel = cast(RemoteConsumerChannel, consumer.channel)  # (a session's consumers deliver to it)
            channel.in_flight.credited(count)
            consumer.queue.deliver_ready()

    def _share(self, payload: bytes) -> None:
        consumer_id, count = link.CREDIT_BODY.unpack(payload)
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            return  # (gone: its node forgot the grant with it)
        cast(RemoteConsumerChannel, consumer.channel).granted(count)
        consumer.queue.deliver_ready()

    def _recall(self, payload: bytes) -> None:
        """Its node wants back what the consumer was granted and has not used (another queue of its channel
        waits for room): given back, even none, which tells its node it may ask again."""
        consumer_id = link.ID.unpack(payload)[0]
        consumer = self.consumers.get(consumer_id)
        unused = 0
        if consumer is not None:
            channel = cast(RemoteConsumerChannel, consumer.channel)
            if channel.grant is not None:
                unused, channel.grant = channel.grant, 0
        self.link.send(link.UNUSED, link.CREDIT_BODY.pack(consumer_id, unused))

    def _settle(self, payload: bytes, at: int = 1, annotations: bytes = b"") -> None:
        mode = payload[0]
        pop = self.unacked.pop
        taken = []
        for (tag,) in link.TAG.iter_unpack(payload[at:]):
            item = pop(tag, None)
            if item is not None:
                taken.append(item)
            else:  # unknown: from before a reconnect, already requeued, or its consumer handed over to a next leader
                self._unknown_settles = True
        for queue in {item[1] for item in taken}:
            if REPLICATED in queue.type.capabilities:  # whether a majority has these settles is asked (``_agree``)
                self._settling.add(queue)
        self.broker.settle_as(taken, link.SETTLE_MODES[mode], annotations)

    def _modify(self, payload: bytes) -> None:
        size = link.MODIFY_HEAD.unpack_from(payload)[1]
        at = link.MODIFY_HEAD.size + size
        self._settle(payload, at, payload[link.MODIFY_HEAD.size:at])

    def _replicate(self, payload: bytes) -> None:
        cluster = self.broker.cluster
        assert cluster is not None  # (a session is the cluster's)
        cluster.quorum.replicate(self, payload)

    def _replicated(self, payload: bytes) -> None:
        cluster = self.broker.cluster
        assert cluster is not None  # (a session is the cluster's)
        cluster.quorum.replicated(self.link.peer_name, payload)

    def _request(self, payload: bytes) -> None:
        request = json.loads(payload)
        if not isinstance(request, dict):
            return  # (a peer's frame: a request is a JSON object)
        if request.get("op") == "sync":
            self._sync(request)
            return
        if request.get("op") == "settled":
            self._agree(request.get("rid"))
            return
        if request.get("op") == "members":
            self._members(request)
            return
        if request.get("op") == "reply":  # (a passive queue.declare of a reply name made here)
            name = request.get("name")
            self._reply({"rid": request.get("rid"),
                         "exists": isinstance(name, str) and self.broker.replies.get(name) is not None})
            return
        reply: dict[str, Any] = {"rid": request["rid"], "key": f"{request['vhost']}\0{request['queue']}"}
        entry: Entry | None = None
        try:
            queue = self._local_queue(request["vhost"], request["queue"])
            if request["op"] == "get":
                entry = queue.get(no_ack=False, sends_from=SEND_FROM_FILE)
                if entry is not None:
                    tag = next(_tags)
                    self.unacked[tag] = (entry, queue, None)
                    reply.update(tag=tag, redelivered=entry.redelivered)
                reply["count"] = queue.message_count
            elif request["op"] == "count":  # (queue.declare-ok's figures, through another node)
                reply.update(count=queue.message_count, consumers=len(queue.consumers))
            elif request["op"] == "purge":  # the broker's operation (the asking node checked permissions)
                reply["count"] = self.broker.purge_local(self.broker.vhosts[request["vhost"]], queue.name)
            elif request["op"] == "delete":  # the broker's, deciding on the queue here (permissions: as purge's)
                reply["deleted"] = self.broker.delete_queue(self.broker.vhosts[request["vhost"]], queue.name,
                                                            request.get("if_unused") is True,
                                                            request.get("if_empty") is True)
                self._reply_agreed(reply)
                return
            else:
                raise errors.ChannelError(errors.NOT_IMPLEMENTED, "no such request")
        except AMQPError as exc:
            reply["error"] = [exc.code, exc.text]
        raw = link.encode_json(reply)
        head = link.REPLY_HEAD.pack(len(raw)) + raw
        if entry is None:
            self.link.send(link.REPLY, head)
        else:
            self.send_entry(link.REPLY, head, entry, queue, queue.delivery_header(entry, get=True))

    def _members(self, request: dict[str, Any]) -> None:
        """The other node's administrator changes the members of a quorum queue led here (``QuorumGroups.
        change_members``): made here, or refused with why."""
        fields = [request.get(name, "") for name in ("vhost", "queue", "add", "remove")]
        cluster = self.broker.cluster
        reply: dict[str, Any] = {"rid": request.get("rid")}
        if cluster is None or not all(isinstance(field, str) for field in fields):
            reply["refused"] = "not a change of members"
        else:
            try:
                cluster.quorum.change_here(*fields)
            except LookupError as exc:
                reply.update(refused=str(exc), missing=True)
            except ValueError as exc:
                reply["refused"] = str(exc)
        self._reply(reply)

    def _sync(self, request: dict[str, Any]) -> None:
        """The other node made a change of definitions: the answer once this node's are etcd's at its revision
        (``reached``: true), or it gave up waiting for them."""
        rid, revision = request.get("rid"), request.get("revision")
        if type(rid) is not int or type(revision) is not int:
            return
        cluster = self.broker.cluster
        assert cluster is not None  # (a session is the cluster's)
        if len(self._syncs) >= SYNCS_MAX:  # (each waits at most SPREAD_WAIT: a peer's flood keeps no more)
            self._synced(rid, False)
            return
        task = asyncio.get_running_loop().create_task(cluster.reached(revision))
        self._syncs.add(task)

        def answer(done: asyncio.Task[bool]) -> None:
            self._syncs.discard(done)
            if not done.cancelled():
                self._synced(rid, done.result())

        task.add_done_callback(answer)

    def _reply_agreed(self, reply: dict[str, Any]) -> None:
        """The answer to a change of definitions made here for the other node (its client deleted a queue of this
        node): sent once etcd has it, and the nodes this one reaches, as a change answered to a client of this
        node is (``Broker.agreed``); a 506 if etcd does not take it in time."""
        task = asyncio.get_running_loop().create_task(self.broker.agreed())
        self._syncs.add(task)

        def answer(done: asyncio.Task[None]) -> None:
            self._syncs.discard(done)
            if done.cancelled():
                return
            error = done.exception()
            if isinstance(error, AMQPError):
                reply["error"] = [error.code, error.text]
            elif error is not None:
                log.error("a change made for node %s not agreed", untrusted(self.link.peer_name), exc_info=error)
                reply["error"] = [errors.INTERNAL_ERROR, "INTERNAL_ERROR - the change was not agreed"]
            self._reply(reply)

        task.add_done_callback(answer)

    def _synced(self, rid: int, reached: bool) -> None:
        self._reply({"rid": rid, "reached": reached})

    def _reply(self, reply: dict[str, Any]) -> None:
        raw = link.encode_json(reply)
        self.link.send(link.REPLY, link.REPLY_HEAD.pack(len(raw)) + raw)

    def _agree(self, rid: Any) -> None:
        """The other node asks whether what its settles did to the queues here is on a majority of their copies:
        the answer (``agreed``) once every one's ops so far are, or false if one was deposed first, or if a settle
        named a delivery tag this node no longer knew (it did nothing here).  Its consumers keep their settles for
        the next leader until then (``RemoteConsumer.settled``), and send those again as they consume anew."""
        if type(rid) is not int:
            return  # (a peer's frame: ids are integers)
        queues, self._settling = self._settling, set()
        waiting = [1, not self._unknown_settles]  # (ops to wait for, the registering below among them; all agreed)
        self._unknown_settles = False

        def one(deposed: bool) -> None:
            waiting[0] -= 1
            waiting[1] = waiting[1] and not deposed
            if not waiting[0] and not self.gone:
                self._reply({"rid": rid, "agreed": waiting[1]})

        for queue in queues:
            waiting[0] += 1
            if not queue.when_agreed(one):
                one(False)
        one(False)

    def send_entry(self, ftype: int, head: bytes, entry: Entry, queue: AnyQueue, header: bytes | None) -> None:
        """A frame of ``head`` and an entry taken for ack, as its queue delivers it: a large body its queue
        stored goes from the store's file (``stored_bodies.body_out``), and the entry waiting for its ack
        holds no body (``release_body``), so that what the link carries costs this node no copy of its bodies."""
        message = entry.message
        body = body_out(self.link, message, queue) if message.body_size >= SEND_FROM_FILE else message.body
        self.link.send_message(ftype, head, message, header, body)
        if message.body_size >= RELEASE_FROM:
            release_body(entry, queue)

    def writable(self) -> None:
        for queue in {consumer.queue for consumer in self.consumers.values()}:
            queue.deliver_ready()

    def closed(self) -> None:
        """The other node went away: its consumers leave, and what it held unacked goes back to the queues —
        but what its consumers held of quorum queues if the link fell ``silent``: that is kept for them
        (``Orphans``), as their node may only have paused; RabbitMQ's quorum queues return it only once the
        node is found down, after its net_ticktime."""
        log.info("link from node %s closed", self.link.peer_name)
        self.gone = True
        self._settling.clear()
        self.broker.persistence.waiters.discard(self)
        for task in self._syncs:
            task.cancel()
        queues = set()
        for consumer in list(self.consumers.values()):
            self.broker.remove_consumer(consumer)
            queues.add(consumer.queue)
        self.consumers.clear()
        taken = list(self.unacked.values())
        self.unacked.clear()
        self.orphans.closed(self.link.peer_name)
        if self.link.silent:
            kept = [(entry, queue, cast(RemoteConsumerChannel, consumer.channel).id) for entry, queue, consumer in taken
                    if consumer is not None and REPLICATED in queue.type.capabilities]
            if kept:
                self.orphans.keep(self.link.peer_name, kept)
                taken = [item for item in taken if item[2] is None or REPLICATED not in item[1].type.capabilities]
        self.broker.settle_taken(taken, True)
        for queue in queues:
            if not queue.deleted:
                queue.deliver_ready()


def _filters(filter_set: Any) -> Callable[[Message], bool] | None:
    """What the filters a consumer's node told with it accept (base64 of an AMQP 1.0 filter-set, its
    ``Consumer.filter_set``); None if none were told.  Ones that cannot be read refuse the consumer: delivering
    what they would leave out is not an answer."""
    if filter_set is None:
        return None
    try:
        accepts = filters.decode(base64.b64decode(filter_set, validate=True)) if isinstance(filter_set, str) \
            else None
    except ValueError:
        accepts = None
    if accepts is None:
        raise errors.precondition_failed("the filters told with the consumer cannot be read")
    return accepts
