"""Another node as this one sees it: the link to it, forwarded publishes awaiting its confirm,
and this node's consumers of its queues.

The link is dialed and redialed for as long as the node is a member.  While it is down the
node's queues are unavailable: publishes to them are unroutable, declares and consumes answer
RabbitMQ's "home node ... is down" error, and their consumers here were sent basic.cancel (a quorum
queue's wait for its next leader instead: ``RemoteQueue.follow``).
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import struct
from typing import TYPE_CHECKING, Any

from amqp_server import errors, publisher_flow
from amqp_server.broker.vhost import home_node_down
from amqp_server.message import Message
from amqp_server.ports import UNLIMITED
from amqp_server.queues.quorum_machine import CHECKS, Broken
from amqp_server.queues.queue import Checked, Consumer, Entry

from . import node_link as link
from .remote_queue import Publish, RemoteConsumer, RemoteQueue

if TYPE_CHECKING:
    from amqp_server.broker import Broker
    from amqp_server.ports import ConfirmSink

log = logging.getLogger("warren.forwarder.peer")

REDIAL_INTERVAL = 0.5
# seconds a link's settles of a quorum queue's entries wait before the owner is asked whether a majority has them
# (one asking at a time): what its consumers keep for the next leader meanwhile (``RemoteConsumer.settled``)
SETTLES_ASK = 0.05


class Peer:
    def __init__(self, name: str, broker: "Broker", secret: bytes, flow: publisher_flow.PublisherFlow) -> None:
        self.name = name
        self.broker = broker
        self.flow = flow
        self._held_for = publisher_flow.link(name)  # the flow's reason while this link's buffer is full
        self.alarms: set[str] = set()  # the resources alarmed on the node, as it last said (ALARMS)
        self.secret = secret
        self.address: tuple[str, int] | None = None
        self.http: tuple[str, int] | None = None  # its management API (offset reads go there), if it serves one
        self.link: link.ClientLink | None = None
        self.up = False
        self._seq = 0
        # link seq -> (channel, its publish seq, the ids of the queues it went to)
        self._pending: dict[int, tuple["ConfirmSink", int, list[bytes]]] = {}
        self._enqueued: dict[int, Publish] = {}  # link seq -> a quorum queue's window's publish sent (ENQUEUE)
        self._ids = itertools.count(1)
        self.consumers: dict[int, tuple[RemoteQueue, RemoteConsumer]] = {}
        self._credit: dict[int, int] = {}
        self._acks: list[int] = []
        self._flush_scheduled = False
        self.stats: dict[str, list[int]] = {}  # the owner's last report on its queues
        self._requests: dict[int, tuple[asyncio.Future, RemoteQueue | None]] = {}  # (None: ``reached``'s)
        self._settles_mark = 1  # the mark of the next answer on settles (``settles_sent``)
        self._settles_unasked = False  # settles went since the latest asking
        self._asking = False  # an asking is scheduled or awaits its answer
        self.reached_revision = 0  # etcd's revision its definitions said they were at, as far as this node asked
        # publish gathering queues: message, channel, link seq, queue ids, frame type (PUBLISH or RELAY)
        self._open: tuple[Message, "ConfirmSink | None", int, list[bytes], int] | None = None
        self._send_open_cb = self._send_open
        self._dialer: asyncio.Task | None = None

    # -- the link -----------------------------------------------------------------------------

    def connect(self, host: str, port: int) -> None:
        self.address = (host, port)
        if self._dialer is None:
            self._dialer = asyncio.get_running_loop().create_task(self._dial())

    def close(self) -> None:
        if self._dialer is not None:
            self._dialer.cancel()
        if self.link is not None:
            self.link.close()

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            assert self.address is not None  # connect() set it before dialling
            host, port = self.address
            try:
                _, client = await loop.create_connection(
                    lambda: link.ClientLink(self.secret, self.broker.node_name, self.name, self), host, port)
                self.link = client
                await asyncio.wait_for(client.ready, 5)
            except (OSError, ConnectionError, asyncio.TimeoutError) as exc:
                log.debug("link to %s at %s:%d: %s", self.name, host, port, exc)
                if self.link is not None:
                    self.link.close()
                self.link = None
                await asyncio.sleep(REDIAL_INTERVAL)
                continue
            self._went_up()
            await client.closed
            self._went_down()
            await asyncio.sleep(REDIAL_INTERVAL)

    def _went_up(self) -> None:
        log.info("link to node %s up", self.name)
        self.up = True
        cluster = self.broker.cluster
        assert cluster is not None  # (a peer is the cluster's)
        cluster.quorum.peer_up(self.name)

    def _went_down(self) -> None:
        log.warning("link to node %s down", self.name)
        silent = self.link is not None and self.link.silent
        self.up = False
        self.link = None
        cluster = self.broker.cluster
        assert cluster is not None  # (a peer is the cluster's)
        cluster.quorum.peer_down(self.name, silent)
        self._open = None
        self.flow.unblock(self._held_for)  # what was buffered is gone with the link
        self._alarmed([])  # a node not reached holds no publishers here (RabbitMQ: its alarms go with it)
        pending, self._pending = self._pending, {}
        for channel, seq, _ in pending.values():  # their fate is unknown: nack, as for a crashed queue
            channel.remote_confirmed(seq, rejected=True)
        enqueued, self._enqueued = self._enqueued, {}
        for publish in enqueued.values():  # its window sends it again, to this node or the next leader
            publish.window.lost(publish)
        requests, self._requests = self._requests, {}
        for future, queue in requests.values():
            if future.done():
                continue
            if queue is None:
                future.set_result(({}, None))
            else:
                future.set_exception(home_node_down(queue))
        consumers, self.consumers = self.consumers, {}
        for consumer_id, (queue, remote) in consumers.items():
            if self._stale(consumer_id, remote):  # (it consumes at another node now, or here under a later id)
                continue
            if remote.accepted.done() and queue.replicated:  # it waits for the queue's (new) leader: ``follow``
                remote.attached = False
            elif remote.accepted.done():
                queue.cancelled(remote.consumer)
            elif queue.replicated:  # its basic.consume waits for the leader a while
                queue.unanswered(remote, home_node_down(queue))
            else:  # its basic.consume is still waiting: it fails as for a queue whose node is down
                queue.refused(remote.consumer)
                remote.accepted.set_exception(home_node_down(queue))
        self._credit.clear()
        self._acks.clear()

    # -- to the owner -------------------------------------------------------------------------

    def publish(self, queue: RemoteQueue, message: Message, channel: "ConfirmSink | None",
                relay: bool = False) -> bool | None:
        """Forward to the owner.  A message routed to several of its queues crosses the link once:
        the frame stays open while routing adds queues, and is sent before anything else.  ``relay``: a
        publish another node sent here, passed on (``owner_side.PeerSession``), which the owner passes on no further."""
        client = self.link
        if not self.up or client is None:
            return None
        open_ = self._open
        if open_ is not None and open_[0] is message and open_[1] is channel:
            open_[3].append(queue.link_id)
            return True
        seq = 0
        qids = [queue.link_id]
        if channel is not None:
            self._seq += 1
            seq = self._seq
            self._pending[seq] = (channel, channel.forwarded(), qids)
        client.hold(self._send_open_cb)
        self._open = (message, channel, seq, qids, link.RELAY if relay else link.PUBLISH)
        if client.write_paused:  # the link's buffer is full: publishers wait until it drains
            self.flow.block(self._held_for)
        return True

    def enqueue(self, queue: RemoteQueue, publish: Publish) -> bool:
        """Send a publish of a quorum queue's window (``remote_queue.Window``) to the leader; False if the link
        is down.  Its answer goes to the window, which sends it again to a next leader if need be."""
        client = self.link
        if not self.up or client is None:
            return False
        self._seq += 1
        self._enqueued[self._seq] = publish
        window = publish.window
        qid = queue.link_id
        head = link.PUBLISH_HEAD.pack(self._seq, len(qid)) + qid + link.ENQUEUER_HEAD.pack(window.id, publish.seq,
                                                                                          window.floor)
        client.send_message(link.ENQUEUE, head, publish.message)
        if client.write_paused:
            self.flow.block(self._held_for)
        return True

    def send_reply(self, name: str, message: Message) -> None:
        """A reply to the direct reply-to consumer ``name`` of a client there (``ports.ReplyNode``); while the link
        is down it is dropped, as a reply to a consumer gone is."""
        client = self.link
        if not self.up or client is None:
            return
        raw = name.encode()
        client.send_message(link.DIRECT_REPLY, link.QID.pack(len(raw)) + raw, message)
        if client.write_paused:
            self.flow.block(self._held_for)

    async def has_reply_consumer(self, name: str) -> bool:
        if self.link is None or not self.up:
            return False
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._requests[rid] = (future, None)  # (the link going down answers it: no consumer)
        self.link.send(link.REQUEST, link.encode_json({"rid": rid, "op": "reply", "name": name}))
        reply, _ = await future
        return reply.get("exists") is True

    def _send_open(self) -> None:
        open_, self._open = self._open, None
        if open_ is None or self.link is None:
            return
        message, _, seq, qids, ftype = open_
        qid_block = qids[0] if len(qids) == 1 else b"".join(qids)
        self.link.send_message(ftype, link.PUBLISH_HEAD.pack(seq, len(qid_block)) + qid_block, message)

    def consume(self, queue: RemoteQueue, consumer: Consumer, remote: RemoteConsumer | None = None,
                adopt: list[Checked] | None = None, settled: list[tuple[int, Checked]] | None = None
                ) -> RemoteConsumer:
        """Consume at the owner; ``remote``: a consumer of a quorum queue that outlived a change of leader,
        consuming again at the new one, which takes back what it holds (the queue's checkouts ``adopt``) and
        applies the settles it sent lately (``settled``: (mode, checkout)) that the previous leader had not
        replicated; ``was``, its id before: what else it held under that id is not coming back to it."""
        was = None
        if remote is None:
            remote = RemoteConsumer(next(self._ids), consumer)
        else:
            was, remote.id = remote.id, next(self._ids)
        remote.owner = self
        self.consumers[remote.id] = (queue, remote)
        if self.link is not None:
            arguments, timestamps = link.portable_arguments(consumer.arguments)
            client = consumer.channel.client()
            request = {
                "id": remote.id, "vhost": queue.vhost, "queue": queue.name, "tag": consumer.tag,
                "exclusive": consumer.exclusive, "arguments": arguments, "timestamps": timestamps,
                "prefetch": 0 if consumer.no_ack else consumer.prefetch, "shared": remote.shared,
                "client": [client.connection, client.number, *client.peer, client.user]}
            if adopt is not None:
                request.update(adopt=adopt, buffered=len(remote.buffer),
                               settled=[[mode, *checked] for mode, checked in settled or ()], was=was)
            if consumer.filter_set is not None:
                request["filter_set"] = base64.b64encode(consumer.filter_set).decode()
            self.link.send(link.CONSUME, link.encode_json(request))
            if remote.shared:  # its share of the channel's room goes with it, lest its first messages go elsewhere
                self._wanted(remote)
        return remote

    def forget(self, remote: RemoteConsumer) -> None:
        """The consumer goes on elsewhere (a quorum queue's leader moved): gone here, uncancelled."""
        if remote.owner is not self:  # (it consumes here no more: ``remote.id`` may be another consumer's here)
            return
        self.consumers.pop(remote.id, None)
        if self.link is not None:
            self.link.send(link.CANCEL, link.ID.pack(remote.id))

    def cancel(self, remote: RemoteConsumer) -> None:
        if remote.owner is not None and remote.owner is not self:  # (its latest consume went to another node)
            remote.owner.cancel(remote)
            return
        self.consumers.pop(remote.id, None)
        if not remote.accepted.done():
            remote.accepted.cancel()  # its basic.consume waits no more
        if self.link is not None:  # (what its buffer holds goes back with the queue's ``give_back``)
            self.link.send(link.CANCEL, link.ID.pack(remote.id))

    async def request(self, queue: RemoteQueue, op: str, **fields: Any) -> tuple[dict[str, Any], Message | None]:
        """Ask the owner (basic.get, purge, delete: ``fields``, its arguments); its error is raised here as the same
        channel error."""
        if self.link is None or not self.up:
            raise home_node_down(queue)
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._requests[rid] = (future, queue)
        self.link.send(link.REQUEST, link.encode_json({**fields, "rid": rid, "op": op, "vhost": queue.vhost,
                                                       "queue": queue.name}))
        reply, message = await future
        if reply.get("error"):
            code, text = reply["error"]
            raise errors.ChannelError(code, text.split(" - ", 1)[-1])
        if "count" in reply and "key" in reply:
            last = self.stats.get(reply["key"], [0, 0])
            self.stats[reply["key"]] = [reply["count"], reply.get("consumers", last[1])]
        return reply, message

    async def reached(self, revision: int) -> None:
        """Until the node's definitions are etcd's at ``revision`` (it says so once its watch brought them), or it
        gives up waiting for them (``Cluster.reached``), or the link goes down."""
        if self.link is None or not self.up:
            return
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._requests[rid] = (future, None)
        self.link.send(link.REQUEST, link.encode_json({"rid": rid, "op": "sync", "revision": revision}))
        reply, _ = await future
        if reply.get("reached") is True:
            self.reached_revision = max(self.reached_revision, revision)

    def settle(self, mode: int, entries: list[Entry], annotations: bytes = b"") -> None:
        self.settle_tags(mode, [e.seq for e in entries], annotations)

    def settle_tags(self, mode: int, tags: list[int], annotations: bytes = b"") -> None:
        """``annotations``: a modified outcome's, for the owner to set on the messages (a MODIFY frame)."""
        if self.link is not None and tags:
            if annotations:
                self.link.send(link.MODIFY, link.MODIFY_HEAD.pack(mode, len(annotations)), annotations,
                               struct.pack(f">{len(tags)}Q", *tags))
            else:
                self.link.send(link.SETTLE, bytes((mode,)), struct.pack(f">{len(tags)}Q", *tags))

    def settles_sent(self) -> int:
        self._settles_unasked = True
        self._ask_soon()
        return self._settles_mark

    def _ask_soon(self) -> None:
        if self._settles_unasked and not self._asking:
            self._asking = True
            asyncio.get_running_loop().call_later(SETTLES_ASK, self._ask_settled)

    def _ask_settled(self) -> None:
        """Whether the owner's queues have on a majority what this link's settles did to them so far: its
        answer comes after those settles, once their ops are agreed (``OwnerSide``'s ``settled``)."""
        if self.link is None or not self.up or not self._settles_unasked:
            self._asking = False  # (a link that went down: its consumers send their settles again, and ask anew)
            return
        self._settles_unasked = False
        mark, self._settles_mark = self._settles_mark, self._settles_mark + 1
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._requests[rid] = (future, None)
        self.link.send(link.REQUEST, link.encode_json({"rid": rid, "op": "settled"}))
        future.add_done_callback(lambda done: self._settles_answered(mark, done.result()[0]))

    def _settles_answered(self, mark: int, reply: dict[str, Any]) -> None:
        if reply.get("agreed") is True:
            for _, remote in self.consumers.values():
                remote.agreed(self, mark)
        self._asking = False
        self._ask_soon()

    def passed_on(self, remote: RemoteConsumer, entry: Entry, no_ack: bool) -> None:
        """A delivery reached the client: its credit returns to the owner (and no-ack ones are acked there)."""
        self._credit[remote.id] = self._credit.get(remote.id, 0) + 1
        if no_ack:
            self._acks.append(entry.seq)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        client = self.link
        if client is None:
            return
        if self._acks:
            self.settle_tags(link.SETTLE_ACK, self._acks)
            self._acks.clear()
        for consumer_id, count in self._credit.items():
            client.send(link.CREDIT, link.CREDIT_BODY.pack(consumer_id, count))
        self._credit.clear()

    # -- from the owner -----------------------------------------------------------------------

    def frame(self, ftype: int, payload: bytes) -> None:
        if ftype == link.DELIVER:
            self._deliver(payload)
        elif ftype == link.CONFIRMS:
            enqueued = self._enqueued
            for seq, status in link.CONFIRM_BODY.iter_unpack(payload):
                publish = enqueued.pop(seq, None)
                if publish is not None:
                    publish.window.answered(publish, status)
                else:
                    self._confirmed(seq, status)
        elif ftype == link.CONFIRM:
            seq, status = link.CONFIRM_BODY.unpack_from(payload)
            publish = self._enqueued.pop(seq, None)
            if publish is not None:
                hint = None
                if status == link.CONFIRM_MOVED and len(payload) > link.CONFIRM_BODY.size:
                    term = link.MOVED_HINT.unpack_from(payload, link.CONFIRM_BODY.size)[0]
                    hint = (payload[link.CONFIRM_BODY.size + link.MOVED_HINT.size:].decode(errors="replace"), term)
                publish.window.answered(publish, status, hint)
                return
            self._confirmed(seq, status)
        elif ftype == link.CONSUMED:
            self._consumed(json.loads(payload))
        elif ftype == link.CANCELLED:
            self._cancelled(link.ID.unpack(payload)[0])
        elif ftype == link.STATS:
            self.stats = json.loads(payload)
        elif ftype == link.ALARMS:
            self._alarmed(json.loads(payload))
        elif ftype == link.REPLICATED:
            cluster = self.broker.cluster
            assert cluster is not None  # (a peer is the cluster's)
            cluster.quorum.replicated(self.name, payload)
        elif ftype == link.REPLY:
            self._reply(payload)
        elif ftype == link.WANT:
            found = self.consumers.get(link.ID.unpack(payload)[0])
            if found is not None and not self._stale(found[1].id, found[1]):
                self._wanted(found[1])
        elif ftype == link.UNUSED:
            consumer_id, count = link.CREDIT_BODY.unpack(payload)
            found = self.consumers.get(consumer_id)
            if found is not None and not self._stale(consumer_id, found[1]):
                found[1].recalled = False
                found[1].ungranted(count)

    def _wanted(self, remote: RemoteConsumer) -> None:
        """The owner has a message for a consumer of a channel with a shared prefetch, which has granted it
        nothing (or it has just consumed): granted once the channel has room."""
        limiter = remote.consumer.limiter
        if limiter is not None and remote.shared:
            limiter.want(remote.consumer, remote)

    def grant(self, remote: RemoteConsumer, count: int) -> None:
        if self.link is None or self.consumers.get(remote.id, (None, None))[1] is not remote:
            limiter = remote.consumer.limiter
            if count != UNLIMITED and limiter is not None:  # (gone meanwhile: the room is back)
                limiter.unreserve(remote.consumer, count)
            return
        if count != UNLIMITED:
            remote.granted += count
        else:  # (the owner sends it what it has again, until it is ``limit``ed)
            remote.shared = False
        self.link.send(link.SHARE, link.CREDIT_BODY.pack(remote.id, count))

    def recall(self, remote: RemoteConsumer) -> None:
        if self.link is not None:
            self.link.send(link.RECALL, link.ID.pack(remote.id))

    def _alarmed(self, resources: list[str]) -> None:
        """The node's alarms (ALARMS): each holds this node's publishers until the node says it cleared."""
        alarms = {resource for resource in publisher_flow.RESOURCES if resource in resources}
        for resource in publisher_flow.RESOURCES:
            reason = publisher_flow.alarm_on(resource, self.name)
            if resource in alarms:
                self.flow.block(reason, resource)
            else:
                self.flow.unblock(reason)
        self.alarms = alarms

    def _confirmed(self, seq: int, status: int) -> None:
        """The answer to a PUBLISH: its publisher is told."""
        pending = self._pending.pop(seq, None)
        if pending is not None:
            pending[0].remote_confirmed(pending[1], status not in (link.CONFIRM_OK, link.CONFIRM_NO_QUEUE))

    def _reply(self, payload: bytes) -> None:
        size = link.REPLY_HEAD.unpack_from(payload)[0]
        start = link.REPLY_HEAD.size
        reply = json.loads(payload[start:start + size])
        message = None
        if len(payload) > start + size:
            message = link.read_message(payload, start + size)
        future, _ = self._requests.pop(reply["rid"], (None, None))
        if future is not None and not future.done():
            future.set_result((reply, message))

    def _deliver(self, payload: bytes) -> None:
        consumer_id, tag, seq, flags = link.DELIVER_HEAD.unpack_from(payload)
        found = self.consumers.get(consumer_id)
        if found is None:  # cancelled meanwhile: back to the queue
            self.settle_tags(link.SETTLE_REQUEUE, [tag])
            return
        queue, remote = found
        message = link.read_message(payload, link.DELIVER_HEAD.size)
        # (through an earlier consume of it: checked out in a term it no longer knows, never taken back)
        term = 0 if self._stale(consumer_id, remote) else remote.term
        if flags & link.GRANTED:
            remote.arrived()
        queue.delivered(remote, Entry(tag, message, bool(flags & link.REDELIVERED)),
                        (seq, term, bool(flags & link.AGREED)))

    def _stale(self, consumer_id: int, remote: RemoteConsumer) -> bool:
        """``consumer_id`` here is an earlier consume of ``remote``, which consumed again since (a quorum queue's
        consumer following its leader, or trying again), here or at another node: what comes of it is no news."""
        return remote.owner is not self or remote.id != consumer_id

    def _consumed(self, reply: dict[str, Any]) -> None:
        found = self.consumers.get(reply["id"])
        if found is None:
            return
        queue, remote = found
        error = reply["error"]
        if self._stale(reply["id"], remote):  # it consumed again since, here or at another node: the owner's
            del self.consumers[reply["id"]]  # consumer of that id goes (what it delivers meanwhile comes back:
            if error is None and self.link is not None:  # ``_deliver``), and the consumer does not hear of it
                self.link.send(link.CANCEL, link.ID.pack(reply["id"]))
            return
        # consuming again at a quorum queue's new leader, maybe before the answer to its first consume came (lost
        # with its link, or never sent: its link was down then)
        again = remote.accepted.done() or "tags" in reply
        if error is None:
            term = reply.get("term")
            remote.term = term if type(term) is int and term >= 0 else 0
            if not remote.accepted.done():
                remote.accepted.set_result(None)
            if again:
                held = reply.get("held")
                queue.reattached(remote, True, reply.get("tags") or [],
                                 [link.read_checked(c) for c in held] if isinstance(held, list) else [])
            if CHECKS and not remote.attached:
                raise Broken(f"{queue!r}: consumer {remote.id} accepted by {self.name} but not attached (its "
                             "settles would wait for good)")
            return
        del self.consumers[remote.id]
        if remote.accepted.done():
            queue.reattached(remote, False, [], [])
            return
        code, text = reply["error"]
        error = errors.ChannelError(code, text.split(" - ", 1)[-1])
        if queue.replicated and code == errors.NOT_FOUND:  # (that node does not lead it, or no longer)
            queue.unanswered(remote, error)
            return
        queue.refused(remote.consumer)
        remote.accepted.set_exception(error)

    def _cancelled(self, consumer_id: int) -> None:
        found = self.consumers.pop(consumer_id, None)
        if found is not None and not self._stale(consumer_id, found[1]):
            queue, remote = found
            queue.cancelled(remote.consumer)  # (which gives back what its buffer holds)

    def writable(self) -> None:
        """The link drained: publishers held for it may go on (unless another reason holds them)."""
        self.flow.unblock(self._held_for)
