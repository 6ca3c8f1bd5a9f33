"""In-process stand-ins for what forwarder.quorum.groups drives: etcd (keys, leases, watches, transactions) and the
node-to-node links, so that elections, replication and catch-up run in one event loop, with real brokers and
storage but no etcd, no processes and no sockets.

``FakeEtcd`` keeps keys with revisions, leases that lapse unless refreshed, watches and the one transaction
``quorum`` makes; it can be frozen (calls wait, as a stopped etcd's do) or made unreachable (calls fail).
``Network`` holds the nodes (``Node``: a Broker and its ``QuorumGroups``), delivers frames between them in
order, a loop turn later, and cuts, heals, kills and restarts them.
"""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aetcd
from aetcd import rtypes
from pamqp import commands

from amqp_server.broker import Broker
from amqp_server.amqp091.channel import Channel
from amqp_server.framing.file_out import FileRange
from amqp_server.payload import encode
from amqp_server.ports import ClientChannel
from amqp_server.publisher_flow import PublisherFlow
from amqp_server.records import QueueRecord
from forwarder.peers import node_link as link
from forwarder.quorum import groups as quorum
from forwarder.peers.peer import Peer
from forwarder.peers.owner_side import Orphans, PeerSession


@dataclass
class KV:
    key: bytes
    value: bytes
    create_revision: int
    lease: int = 0
    mod_revision: int = 0


@dataclass
class Event:
    kind: Any
    kv: KV
    revision: int


@dataclass
class LeaseState:
    ttl: float
    expires: float
    keys: set[bytes] = field(default_factory=set)


class FakeEtcd:
    """One etcd member, as far as forwarder.quorum.groups uses it."""

    def __init__(self) -> None:
        self.revision = 1
        self.kvs: dict[bytes, KV] = {}
        self.leases: dict[int, LeaseState] = {}
        self.history: list[Event] = []
        self.watchers: list[tuple[bytes, asyncio.Queue]] = []
        self.frozen = asyncio.Event()
        self.frozen.set()  # (set: running)
        self.unreachable = False
        self._ids = itertools.count(0x1000)
        self._expiry = asyncio.get_running_loop().create_task(self._expire())

    def client(self) -> "FakeClient":
        return FakeClient(self)

    def close(self) -> None:
        self._expiry.cancel()

    def freeze(self) -> None:
        self.frozen.clear()

    def stop(self) -> None:
        """Down, as for a restart: every call fails and every watch breaks; no lease lapses meanwhile."""
        self.unreachable = True

    def start(self) -> None:
        """Up again: every lease has its whole TTL anew, as etcd's lessor grants when its member leads again."""
        now = asyncio.get_running_loop().time()
        for state in self.leases.values():
            state.expires = now + state.ttl
        self.unreachable = False

    def thaw(self) -> None:
        self.frozen.set()

    async def gate(self) -> None:
        """Every call: failed while unreachable, held while frozen."""
        if self.unreachable:
            raise aetcd.ConnectionFailedError("etcd unreachable")
        await self.frozen.wait()
        if self.unreachable:
            raise aetcd.ConnectionFailedError("etcd unreachable")

    async def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.02)
            await self.frozen.wait()
            if self.unreachable:
                continue
            for lease_id, state in list(self.leases.items()):
                if state.expires <= loop.time():
                    self.revoke(lease_id)

    def _notify(self, kind: Any, kv: KV) -> None:
        self.revision += 1
        event = Event(kind, kv, self.revision)
        self.history.append(event)
        for prefix, queue in self.watchers:
            if kv.key.startswith(prefix):
                queue.put_nowait(event)

    def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        if lease and lease not in self.leases:
            raise aetcd.ClientError("etcdserver: requested lease not found")
        old = self.kvs.get(key)
        if old is not None and old.lease in self.leases:
            self.leases[old.lease].keys.discard(key)
        kv = KV(key, value, old.create_revision if old is not None else self.revision + 1, lease, self.revision + 1)
        self.kvs[key] = kv
        if lease:
            self.leases[lease].keys.add(key)
        self._notify(rtypes.EventKind.PUT, kv)
        return self.revision

    def delete(self, key: bytes) -> None:
        kv = self.kvs.pop(key, None)
        if kv is not None:
            if kv.lease in self.leases:
                self.leases[kv.lease].keys.discard(key)
            self._notify(rtypes.EventKind.DELETE, replace(kv, mod_revision=self.revision + 1))

    def revoke(self, lease_id: int) -> None:
        state = self.leases.pop(lease_id, None)
        if state is None:
            raise aetcd.ClientError("etcdserver: requested lease not found")
        for key in sorted(state.keys):
            self.delete(key)


class FakeLease:
    def __init__(self, client: "FakeClient", lease_id: int) -> None:
        self.client = client
        self.id = lease_id

    async def refresh(self) -> SimpleNamespace:
        etcd = self.client.etcd
        await self.client.gate()
        await asyncio.sleep(self.client.refresh_delay)
        state = etcd.leases.get(self.id)
        if state is None:
            return SimpleNamespace(TTL=-1)
        state.expires = asyncio.get_running_loop().time() + state.ttl
        return SimpleNamespace(TTL=state.ttl)

    async def revoke(self) -> None:
        await self.client.gate()
        self.client.etcd.revoke(self.id)


class FakeClient:
    """The calls forwarder.quorum.groups makes of an aetcd.Client."""

    def __init__(self, etcd: FakeEtcd) -> None:
        self.etcd = etcd
        self.unreachable = False  # this node cut off from etcd (the others reach it)
        self.failing_deletes = 0  # so many deletes fail next (etcd went away just then)
        self.deaf = False  # its watches hear nothing, and fail not (a stream stalled on a cut): events wait
        self.refresh_delay = 0.0  # seconds before a lease refresh reaches etcd (a loop slowed by long turns)
        self.transactions = SimpleNamespace(create=lambda key: _Created(key),
                                            put=lambda key, value, lease: ("put", key, value, lease),
                                            delete=lambda key: ("delete", key, b"", None))

    async def gate(self) -> None:
        if self.unreachable:
            raise aetcd.ConnectionFailedError("etcd unreachable from here")
        await self.etcd.gate()

    async def lease(self, ttl: float) -> FakeLease:
        etcd = self.etcd
        await self.gate()
        lease_id = next(etcd._ids)
        etcd.leases[lease_id] = LeaseState(ttl, asyncio.get_running_loop().time() + ttl)
        return FakeLease(self, lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self.gate()
        self.etcd.revoke(lease_id)

    async def get(self, key: bytes) -> KV | None:
        await self.gate()
        return self.etcd.kvs.get(key)

    async def get_prefix(self, prefix: bytes) -> "Reply":
        await self.gate()
        etcd = self.etcd
        return Reply([kv for key, kv in sorted(etcd.kvs.items()) if key.startswith(prefix)], etcd.revision)

    async def put(self, key: bytes, value: bytes, lease: FakeLease | None = None) -> None:
        await self.gate()
        self.etcd.put(key, value, lease.id if lease is not None else 0)

    async def delete(self, key: bytes) -> None:
        await self.gate()
        if self.failing_deletes:
            self.failing_deletes -= 1
            raise aetcd.ConnectionFailedError("etcd went away")
        self.etcd.delete(key)

    async def transaction(self, compare: list, success: list, failure: list) -> tuple[bool, list]:
        await self.gate()
        etcd = self.etcd
        won = all((etcd.kvs[key].create_revision if key in etcd.kvs else 0) == value
                  for key, value in compare)
        responses = []
        for kind, key, value, lease in (success if won else failure):
            if kind == "delete":
                etcd.delete(key)
                responses.append(SimpleNamespace(response_delete_range=SimpleNamespace()))
                continue
            revision = etcd.put(key, value, lease.id if lease is not None else 0)
            responses.append(SimpleNamespace(response_put=SimpleNamespace(header=SimpleNamespace(revision=revision))))
        return won, responses

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> "Watch":
        await self.gate()
        queue: asyncio.Queue = asyncio.Queue()
        for event in self.etcd.history:
            if event.revision >= start_revision and event.kv.key.startswith(prefix):
                queue.put_nowait(event)
        self.etcd.watchers.append((prefix, queue))
        return Watch(self, prefix, queue)


class _Created:
    """``transactions.create(key) == 0``: the key's create revision, compared."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def __eq__(self, value: object) -> Any:
        return (self.key, value)


class Reply(list):
    def __init__(self, kvs: list[KV], revision: int) -> None:
        super().__init__(kvs)
        self.header = SimpleNamespace(revision=revision)


class Watch:
    """Events as they happen; broken (an error) once the client cannot reach etcd."""

    def __init__(self, client: FakeClient, prefix: bytes, queue: asyncio.Queue) -> None:
        self.client, self.prefix, self.queue = client, prefix, queue

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> Event:
        etcd = self.client.etcd
        try:
            while self.queue.empty() or not etcd.frozen.is_set() or self.client.deaf:
                if self.client.unreachable or etcd.unreachable:
                    raise aetcd.ConnectionFailedError("watch broken")
                await asyncio.sleep(0.01)
            return self.queue.get_nowait()
        except BaseException:
            etcd.watchers = [w for w in etcd.watchers if w[1] is not self.queue]
            raise


# -- nodes and links ------------------------------------------------------------------------------


class FakeLink:
    """One node's link to another, one way: frames arrive in order, a loop turn later, unless the two are cut
    apart.  What a node's ``Peer`` sends reaches the other's ``Session`` for it, and the other way round, as on
    a real link (``deliver`` tells them apart by frame type)."""

    write_paused = False
    silent = False  # closed after its heartbeats went unheard (``Network.fall_silent``)
    file_out = False  # (``stored_bodies.body_out`` sets it: its output holds a file's range)

    def __init__(self, network: "Network", source: str, peer_name: str) -> None:
        self.network, self.source, self.peer_name = network, source, peer_name
        self._held: Any = None

    def send(self, ftype: int, *parts: bytes) -> None:
        self._complete_held()
        network = self.network
        if network.connected(self.source, self.peer_name):
            frame = (self.source, self.peer_name, ftype, b"".join(parts))
            held = network.held.get((self.source, self.peer_name))
            if held is not None:
                held.append(frame)
            else:
                asyncio.get_running_loop().call_soon(network.deliver, *frame)

    def send_message(self, ftype: int, head: bytes, message: Any, header: bytes | None = None,
                     body: bytes | FileRange | None = None) -> None:
        if message is None:
            self.send(ftype, head)
            return
        if isinstance(body, FileRange):  # (from the store's file, ``stored_bodies.body_out``: read for the frame)
            stored = body
            try:
                body = stored.read()
            finally:
                stored.close()
        self.send(ftype, head, *encode(message.route, message.header if header is None else header,
                                       message.body if body is None else body, message.amqp10))

    def hold(self, complete: Any) -> None:
        """A publish gathering its queues: sent before any other frame, at the latest at the end of the turn."""
        self._complete_held()
        self._held = complete
        asyncio.get_running_loop().call_soon(self._complete_held)

    def _complete_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held()

    def flush(self) -> None:
        self._complete_held()

    def close(self) -> None:
        pass


_TO_OWNER = {link.PUBLISH, link.RELAY, link.ENQUEUE, link.CONSUME, link.CANCEL, link.SETTLE, link.MODIFY, link.CREDIT,
             link.REQUEST, link.REPLICATE}  # what a dialer's Peer sends; the owner's Session answers with the others


class Node:
    """What QuorumGroups asks of its cluster: a broker, a name, etcd, the other nodes (real ``Peer``s, their
    links fake)."""

    def __init__(self, network: "Network", name: str, data_dir: Path) -> None:
        self.network, self.name, self.data_dir = network, name, data_dir
        self.broker = Broker(str(data_dir))
        self.broker.cluster = self  # type: ignore[assignment]  # what the forwarder's parts reach through it
        self.client = network.etcd.client()
        self.flow = PublisherFlow()
        self.peers = {other: Peer(other, self.broker, b"secret", self.flow) for other in network.names if other != name}
        self.metadata = SimpleNamespace(put=network.put_definition)
        self.quorum = quorum.QuorumGroups(self)  # type: ignore[arg-type]  # the fake cluster stands in for Cluster
        self.orphans = Orphans(self.broker)

    def nodes(self) -> list[tuple[str, bool]]:
        return [(name, peer.up) for name, peer in sorted(self.peers.items())]

    def peer(self, name: str) -> Peer:
        return self.peers[name]

    def defined(self, kind: str, key: str, record: dict[str, Any]) -> None:
        pass

    def undefined(self, kind: str, key: str) -> None:
        pass


class Network:
    """Nodes on one event loop, linked two by two (``cut``/``heal``), and one etcd."""

    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root
        self.names = names
        self.etcd = FakeEtcd()
        self.cuts: set[frozenset[str]] = set()
        self.held: dict[tuple[str, str], list[tuple[str, str, int, bytes]]] = {}  # slow links: frames waiting
        self.down: set[str] = set()
        self.nodes: dict[str, Node] = {}
        self.sessions: dict[tuple[str, str], PeerSession] = {}  # (node, the node whose link it serves): its session
        self.records: list[QueueRecord] = []

    async def start(self) -> "Network":
        """Every node's broker first (opening one holds the loop a while), then their leases and watches."""
        for name in self.names:
            self.nodes[name] = Node(self, name, self.root / name)
        for name in self.names:
            await self.start_node(name, self.nodes[name])
        while len(self.etcd.watchers) < len(self.names):  # (a watch's first look elects where none leads)
            await asyncio.sleep(0.01)
        return self

    async def start_node(self, name: str, node: Node | None = None) -> Node:
        """``name`` (back) up as a real node starts (``Cluster.start``): its queues from its mirror, its links, then
        its join, tried until etcd answers (``Cluster._join``)."""
        self.down.discard(name)
        node = self.nodes[name] = node or Node(self, name, self.root / name)
        for record in self.records:
            node.quorum.put_queue(node.broker.vhosts["/"], record)
        for other in self.names:
            if other != name and other not in self.down:
                self._link(name, other, True)
        while name not in self.down:  # (killed meanwhile: a dead process joins nothing)
            try:
                await node.quorum.start()
            except aetcd.ClientError:
                await asyncio.sleep(0.1)
                continue
            if name in self.down:  # (killed while its join waited for etcd's answer)
                await self._halt(node)
            break
        return node

    def connected(self, a: str, b: str) -> bool:
        return a not in self.down and b not in self.down and frozenset((a, b)) not in self.cuts

    def deliver(self, source: str, destination: str, ftype: int, payload: bytes) -> None:
        if not self.connected(source, destination):
            return  # (cut while it was on its way)
        if len(payload) > link.MAX_FRAME:  # a real link's reader refuses it and closes the link; the dialer dials again
            self._link(source, destination, False)
            asyncio.get_running_loop().call_later(0.05, self._redial, source, destination)
            return
        if ftype in _TO_OWNER:
            session = self.sessions.get((destination, source))
            if session is not None:
                session.frame(ftype, payload)
        elif ftype == link.REPLICATED:  # (either way: a follower's answer, or its request to catch up)
            self.nodes[destination].quorum.replicated(source, payload)
        elif ftype != link.STATS:
            self.nodes[destination].peers[source].frame(ftype, payload)

    def _link(self, a: str, b: str, up: bool, silent: bool = False) -> None:
        """Each side sees the other come or go, as a node does when its link opens or drops (with it, what a
        slow link still held); ``silent``: closed for its heartbeats went unheard."""
        for here, there in ((a, b), (b, a)):
            if not up and (here, there) in self.held:
                self.held[(here, there)] = []
            node = self.nodes.get(here)
            if node is None or here in self.down or node.peers[there].up == up:
                continue
            peer = node.peers[there]
            if up:  # (its link to there, and its session for there's link to it)
                self.sessions[(here, there)] = PeerSession(node.broker, FakeLink(self, here, there), node.orphans)  # type: ignore[arg-type]  # a fake link stands in for the listener's
                peer.link = FakeLink(self, here, there)  # type: ignore[assignment]  # and for the dialer's
                peer._went_up()
            else:
                session = self.sessions.pop((here, there), None)
                if silent:
                    for side in (peer.link, session.link if session is not None else None):
                        if side is not None:
                            side.silent = True
                peer._went_down()
                if session is not None:
                    session.closed()

    def _redial(self, a: str, b: str) -> None:
        if self.connected(a, b):
            self._link(a, b, True)

    def hold(self, a: str, b: str) -> None:
        """The link from ``a`` to ``b`` goes on, but its frames wait (a slow link, a stalled reader)."""
        self.held.setdefault((a, b), [])

    def release(self, a: str, b: str) -> None:
        for frame in self.held.pop((a, b), []):
            asyncio.get_running_loop().call_soon(self.deliver, *frame)

    def release_one(self, a: str, b: str) -> bool:
        """The oldest frame held from ``a`` to ``b`` goes on, the others still wait; False if none waits."""
        held = self.held.get((a, b))
        if not held:
            return False
        asyncio.get_running_loop().call_soon(self.deliver, *held.pop(0))
        return True

    def fall_silent(self, dialer: str, listener: str) -> None:
        """An asymmetric cut: ``dialer``'s link to ``listener`` falls silent and both ends close it (heartbeats);
        ``listener``'s own link to ``dialer`` goes on.  ``heal`` brings it back."""
        peer = self.nodes[dialer].peers[listener]
        assert peer.link is not None
        peer.link.silent = True
        peer._went_down()
        session = self.sessions.pop((listener, dialer), None)
        if session is not None:
            session.closed()

    def cut(self, a: str, b: str, silent: bool = False) -> None:
        """``a`` and ``b`` hear each other no more: their links drop at once (a node's host said so), or, ``silent``,
        once their heartbeats went unheard (a node paused, its traffic dropped)."""
        self.cuts.add(frozenset((a, b)))
        self._link(a, b, False, silent)

    def heal(self, a: str, b: str) -> None:
        self.cuts.discard(frozenset((a, b)))
        if self.connected(a, b):
            self._link(a, b, True)

    async def kill(self, name: str) -> None:
        """The node stops at once: its links drop, its lease lapses (or is revoked by the others), its disk stays
        as its last group commit left it."""
        node = self.nodes[name]
        self.down.add(name)  # (first: a dead node sees nothing go)
        # as a kill -9: no group commit more, and what was staged since the last one is lost with the process
        # (what that commit wrote stays, in the page cache, synced or not)
        persistence = node.broker.persistence
        persistence._closed = True
        persistence.commit_now = lambda: None  # type: ignore[method-assign]
        for key in [key for key in self.sessions if key[0] == name]:
            del self.sessions[key]
        for other in self.names:
            if other != name:
                self._link(name, other, False)
        await self._halt(node)
        node.orphans.close()
        node.broker.close()

    @staticmethod
    async def _halt(node: Node) -> None:
        """The node's quorum groups do nothing more: their tasks end, their snapshots stop."""
        groups = node.quorum
        tasks = [*groups._tasks, *(group.electing for group in groups.groups.values() if group.electing)]
        for group in groups.groups.values():
            if group.replicator is not None:
                for follower in group.replicator.followers.values():
                    group.replicator._stop_snapshot(follower)
        while not all(task.done() for task in tasks):  # (Python 3.11's wait_for may swallow a cancel)
            for task in tasks:
                task.cancel()
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        for name in list(self.nodes):
            if name not in self.down:
                await self.kill(name)
        self.etcd.close()

    # -- queues ---------------------------------------------------------------------------------

    def put_definition(self, kind: str, key: str, raw: dict[str, Any]) -> None:
        """A definition a node writes to etcd: a quorum queue's record (a change of its members) reaches every
        running node a loop turn later, as their watches bring it (``Cluster._put_queue``); a node started later
        reads it from its mirror."""
        if kind != QueueRecord.kind:
            return
        record = QueueRecord.from_json(raw)
        self.records = [old for old in self.records if old.key != record.key] + [record]
        for name, node in self.nodes.items():
            if name not in self.down:
                asyncio.get_running_loop().call_soon(node.quorum.put_queue, node.broker.vhosts["/"], replace(record))

    async def declare(self, name: str, first: str, **arguments: Any) -> None:
        """A quorum queue placed on ``first``, which claims its lead at once (as its declaring node does)."""
        members = [first, *sorted(other for other in self.names if other != first)]
        members = members[:arguments.pop("x-quorum-initial-group-size", len(members))]
        record = QueueRecord("/", name, True, False, {"x-queue-type": "quorum", **arguments}, node=first,
                             members=members)
        self.records.append(record)
        for node in self.nodes.values():
            node.quorum.put_queue(node.broker.vhosts["/"], replace(record))
        claimed = await self.nodes[first].quorum.claim_first("/", name)
        assert claimed is not None
        self.nodes[first].quorum.lead("/", name, *claimed)


CLOCK = itertools.count()  # orders the events of every client


class Client:
    """A consuming client's AMQP channel on a node (``ports.DeliveryTarget``), as
    ``amqp_server.amqp091.channel.Channel`` keeps its unacked deliveries and hands its consumers over to a quorum
    queue's new object."""

    handed_over = Channel.handed_over

    def __init__(self, node: Node, prefetch: int = 50, queue: str = "q") -> None:
        self.node, self.broker, self.prefetch, self.queue_name = node, node.broker, prefetch, queue
        self.unacked: dict[int, tuple[Any, Any, Any]] = {}
        self.tag = 0
        self.received: list[bytes] = []
        # (when, "deliver"/"redeliver"/"ack", body, the entry's seq in the queue), on ``CLOCK``
        self.events: list[tuple[int, str, bytes, int]] = []
        self.consumer: Any = None
        self.cancelled = False
        self.unanswered: dict[Any, commands.Basic.Consume] = {}  # as the channel's: a consume not answered yet
        self.replies: list[Any] = []  # the methods the channel sent its client (consume-ok)
        self.reading = True  # False: a client that does not read (its connection's writes paused)

    def client(self) -> ClientChannel:
        return ClientChannel("test", 1, ("127.0.0.1", 1), "guest", self.node.name)

    def can_deliver(self, shared: bool) -> bool:
        return self.reading

    def deliver(self, consumer: Any, entry: Any) -> None:
        self.tag += 1
        self.unacked[self.tag] = (entry, consumer.queue, consumer)
        self.received.append(entry.message.body)
        seq = getattr(consumer.queue, "taken", {}).get(entry, (None, (entry.seq, 0)))[1][0]
        self.events.append((next(CLOCK), "redeliver" if entry.redelivered else "deliver", entry.message.body, seq))

    def cancelled_by_broker(self, consumer: Any) -> None:
        self.cancelled = True

    def failed(self, consumer: Any, reason: str) -> None:
        raise AssertionError(f"a quorum queue's consumer failed: {reason}")  # (only a stream's can)

    def consume(self) -> "Client":
        queue = self.node.broker.vhosts["/"].queues[self.queue_name]
        self.consumer = self.broker.consume(queue, self, "ctag", False, False, {}, self.prefetch)
        accepted = queue.accepted(self.consumer)
        if accepted is not None:  # (another node's queue: consume-ok once it accepts; refused, the channel fails)
            self.unanswered[self.consumer] = commands.Basic.Consume(queue=self.queue_name, consumer_tag="ctag")
            accepted.add_done_callback(self._answered)
        else:
            self.reply(commands.Basic.ConsumeOk(consumer_tag="ctag"))
        queue.deliver_ready()
        return self

    def _answered(self, accepted: Any) -> None:
        unanswered = self.unanswered.pop(self.consumer, None) is not None
        if accepted.cancelled() or accepted.exception() is not None:
            self.cancelled = True
        elif unanswered:
            self.reply(commands.Basic.ConsumeOk(consumer_tag="ctag"))

    def reply(self, method: Any) -> None:
        self.replies.append(method)

    def ack(self, count: int | None = None, requeue: bool = False) -> int:
        """Acks (or requeues) the oldest ``count`` deliveries held (all by default); how many."""
        tags = sorted(self.unacked)[:count]
        taken = [self.unacked.pop(tag) for tag in tags]
        if not requeue:
            self.events.extend((next(CLOCK), "ack", entry.message.body, 0) for entry, _, _ in taken)
        self.broker.settle_taken(taken, requeue)
        return len(taken)

    def close(self) -> None:
        """The channel closes: its consumer goes, what it held goes back."""
        if self.consumer is not None and not self.cancelled:
            self.broker.remove_consumer(self.consumer)
        self.ack(requeue=True)
