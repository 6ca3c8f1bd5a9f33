"""This node in a cluster: applies agreed definitions to its broker, places queues, runs the links.

The broker calls back (``Broker.cluster``) when a definition is made here; definitions made
elsewhere arrive from :mod:`metadata.mirror` and are applied through the same Broker operations a
channel uses, with ``applying`` set so they are not echoed back to etcd.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import aetcd

from amqp_server import errors
from amqp_server.queues import types as queue_types
from amqp_server.access_control import Permissions, TopicPermission, User
from amqp_server.broker.definitions import storable
from amqp_server.errors import AMQPError, resource_name
from amqp_server.logs import untrusted
from amqp_server.queues.policy import Policy
from amqp_server.publisher_flow import RESOURCES, PublisherFlow
from amqp_server.queues.queue_type import REPLICATED
from amqp_server.records import BindingRecord, ExchangeRecord, QueueRecord, Record
from amqp_server.broker.vhost import VHost
from amqp_server.tasks import stop_tasks

from .metadata import etcd
from .peers.node_link import ALARMS, STATS, ServerLink, encode_json, listener
from .metadata.membership import ALIVE_PREFIX, Membership
from .metadata.mirror import DEF_PREFIX, Metadata
from .peers.peer import Peer
from .quorum.groups import QuorumGroups
from .peers.remote_queue import RemoteQueue
from .peers.owner_side import Orphans, PeerSession
from .metadata.signing import Signer

if TYPE_CHECKING:
    from amqp_server.broker import Broker
    from amqp_server.config import Config

log = logging.getLogger("warren.forwarder")

AGREE_TIMEOUT = 10.0
STATS_INTERVAL = 1.0
STARTUP_TIMEOUT = 10.0
CURRENT_TIMEOUT = 5.0  # how long a publish routed nowhere waits for this node's definitions to be current
SPREAD_WAIT = 2.0  # how long a change of definitions answered here waits for another node to have it too
DOWN_POLL = 1.0  # a node etcd took for down whose link here is still up is looked at again this often
BALANCED = ("balanced", "least-leaders", "random")
ACCESS_KINDS = ("user", "vhost", "permission", "topic_permission", "vhost_limits", "user_limits", "global_parameter",
                "parameter", "federation_suffix")


class Cluster:
    def __init__(self, broker: "Broker", config: "Config", flow: PublisherFlow) -> None:
        self.broker = broker
        self.config = config
        self.flow = flow
        self.name = config.node_name
        self.run = uuid.uuid4().hex  # this run of the node: its exclusive queues' records name it
        self.secret = config.cluster_secret.encode()
        self.client = etcd.client(config)
        self.metadata = Metadata(self.client, broker.store, self.apply, Signer(self.secret))
        self.link_port = config.cluster_port or config.amqp_port + 20000
        host = config.cluster_advertise or (config.bind if config.bind not in ("0.0.0.0", "::") else "127.0.0.1")
        self.membership = Membership(self.client, self.name, self.run, {
            "name": self.name, "host": host, "link_port": self.link_port, "amqp_port": config.amqp_port,
            "mgmt_port": config.mgmt_port if config.mgmt_enabled else 0,
            "stream": [config.stream_host or host, config.stream_advertised_port or config.stream_port]
            if config.stream_enabled else None}, self._joined, self._left, self._lapsed)
        self._down: dict[str, asyncio.Task[None]] = {}  # nodes etcd took for down: their transient queues go
        self._streams: dict[str, tuple[str, int]] = {}  # where the other nodes serve the stream protocol
        self.peers: dict[str, Peer] = {}
        self.quorum = QuorumGroups(self)
        self.sessions: set[PeerSession] = set()
        self.orphans = Orphans(broker)  # what consumers of nodes whose link fell silent held: outlives the sessions
        self.applying = False
        self._lost: list[tuple[VHost, str]] = []  # transient queues of ours that did not survive a restart
        self._stale: list[tuple[VHost, QueueRecord]] = []  # exclusive queues of an earlier run of this node
        self._server: asyncio.base_events.Server | None = None
        # kind -> (record from JSON, create or change it here, delete it here)
        self._appliers: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[[VHost, Any], None],
                                        Callable[[VHost, Any], None]]] = {
            QueueRecord.kind: (QueueRecord.from_json, self._put_queue, self._delete_queue),
            ExchangeRecord.kind: (ExchangeRecord.from_json, self._put_exchange, self._delete_exchange),
            BindingRecord.kind: (BindingRecord.from_json, self._put_binding, self._delete_binding),
            "policy": (Policy.from_json, partial(self._put_policy, kind="policy"),
                       partial(self._delete_policy, kind="policy")),
            "operator_policy": (Policy.from_json, partial(self._put_policy, kind="operator_policy"),
                                partial(self._delete_policy, kind="operator_policy")),
        }

    async def start(self) -> None:
        """etcd's check of our credentials (a refusal stops the node), definitions from the mirror (no etcd
        needed), then links, then etcd's current state."""
        await etcd.check(self.client, self.config.cluster_etcd, DEF_PREFIX)
        self.broker.cluster = self
        self.broker.replies.clustered(self.name, self.peers)
        self.broker.access.listener = self
        self.broker.policies.listener = self
        for kind, key, record in self.metadata.unwritten():  # (made here, never the cluster's)
            self.apply(kind, key, None, record)
        mirrored = self.metadata.mirrored()
        for kind, key, record in mirrored:
            self.apply(kind, key, record, None)
        counts = {kind: sum(1 for k, _, _ in mirrored if k == kind) for kind in ("exchange", "queue", "binding")}
        log.info("cluster definitions from this node's mirror: %d exchanges, %d queues, %d bindings",
                 counts["exchange"], counts["queue"], counts["binding"])
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(listener(self.secret, self.name, self._session),
                                                self.config.bind, self.link_port, reuse_address=True)
        self.metadata.start()
        self._stats = loop.create_task(self._report_stats())
        self._joining = loop.create_task(self._join())
        self._dropping = loop.create_task(self._drop_stale_when_caught_up())
        try:
            await asyncio.wait_for(asyncio.shield(self._joining), STARTUP_TIMEOUT)
            await asyncio.wait_for(self.metadata.caught_up.wait(), STARTUP_TIMEOUT)
        except asyncio.TimeoutError:
            log.error("etcd at %s not reachable: serving the definitions mirrored here until it is",
                      self.config.cluster_etcd)
        lost, self._lost = self._lost, []
        for vhost, name in lost:  # as in RabbitMQ, a node's transient queues die with it
            queue = vhost.queues.get(name)
            if queue is not None and queue.node == self.name and not queue.durable:
                self.broker.delete_queue(vhost, name)
        log.info("cluster node %s: links on port %d, %d other node(s) known", self.name, self.link_port,
                 len(self.peers))

    async def _drop_stale_when_caught_up(self) -> None:
        await self.metadata.caught_up.wait()
        self._drop_stale()

    def _drop_stale(self) -> None:
        """The exclusive queues of an earlier run of this node are deleted cluster-wide, as RabbitMQ deletes a
        down node's exclusive queues (rabbit_amqqueue:on_node_down): their connections went with that run.  Done
        once etcd's state is read (the mirror's may be older), and only for a name nothing here took since."""
        stale, self._stale = self._stale, []
        for vhost, record in stale:
            if record.name not in vhost.queues:
                log.info("exclusive %s of this node's earlier run deleted",
                         untrusted(resource_name("queue", record.name, vhost.name)))
                self.metadata.delete(record.kind, record.key)

    async def _join(self) -> None:
        """Register and learn the other nodes; retried until etcd answers."""
        while True:
            try:
                await self.membership.start()
                await self.quorum.start()
                return
            except aetcd.exceptions.ClientError as exc:
                log.warning("etcd membership: %s; retrying", exc)
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        await stop_tasks(self._stats, self._joining, self._dropping, *self._down.values())
        await self.quorum.stop()
        self.orphans.close()
        await self.membership.stop()
        await self.metadata.stop()
        for peer in self.peers.values():
            peer.close()
        if self._server is not None:
            self._server.close()
        await self.client.close()

    # -- nodes --------------------------------------------------------------------------------

    def peer(self, name: str) -> Peer:
        peer = self.peers.get(name)
        if peer is None:
            peer = self.peers[name] = Peer(name, self.broker, self.secret, self.flow)
        return peer

    def _joined(self, name: str, address: dict[str, Any]) -> None:
        peer = self.peer(name)
        peer.http = (address["host"], address["mgmt_port"]) if address.get("mgmt_port") else None
        if address.get("stream"):
            self._streams[name] = (str(address["stream"][0]), int(address["stream"][1]))
        else:
            self._streams.pop(name, None)
        peer.connect(address["host"], address["link_port"])

    def stream_address(self, node: str) -> tuple[str, int] | None:
        """Where ``node`` serves the stream protocol (what metadata names as a stream's leader), while it is up."""
        peer = self.peers.get(node)
        return self._streams.get(node) if peer is not None and peer.up else None

    def _left(self, name: str) -> None:
        self._streams.pop(name, None)
        peer = self.peers.pop(name, None)
        if peer is not None:
            peer.close()
            log.info("node %s left the cluster", name)

    def _lapsed(self, name: str) -> None:
        """etcd has not heard from ``name`` for its lease (``membership.NODE_TTL``), or it stopped: down for the
        cluster.  Its transient queues go once this node's link to it is down too (``_transient_go``)."""
        if name not in self._down:
            task = self._down[name] = asyncio.get_running_loop().create_task(self._transient_go(name))
            task.add_done_callback(lambda _: self._down.pop(name, None))

    async def _transient_go(self, name: str) -> None:
        """Delete the non-durable queues (exclusive ones among them) of ``name`` cluster-wide, with their bindings,
        as RabbitMQ's nodes do on its node-down (rabbit_amqqueue:on_node_down deletes a down node's queues that are
        not replicated: its durable ones stay, down).  Only once this node's link to it is down too: a node cut off
        from one peer still refreshes its key, and one cut off from etcd alone is still reached here, and neither
        loses anything.  Each queue goes in an etcd transaction that holds only while etcd has no alive key of the
        node and the records are those seen here: of the nodes that see it down one deletes it, and a queue the
        node made again after it came back stays."""
        guard = ALIVE_PREFIX + name.encode()
        while True:
            peer = self.peers.get(name)
            if peer is None or name in self.membership.alive:
                return
            if not peer.up:
                break
            await asyncio.sleep(DOWN_POLL)
        bindings = [BindingRecord.from_json(record) for kind, _, record in self.metadata.mirrored()
                    if kind == BindingRecord.kind]
        removed = 0
        for vhost in list(self.broker.vhosts.values()):
            for queue in [queue for queue in vhost.queues.values() if queue.node == name and not queue.durable]:
                own = [binding for binding in bindings if binding.vhost == vhost.name
                       and binding.destination_type == "queue" and binding.destination == queue.name]
                bindings = [binding for binding in bindings if binding not in own]
                while True:
                    try:
                        deleted = await self.metadata.delete_unless(
                            self._taken_with(vhost, queue.name, own, bindings), guard)
                        break
                    except aetcd.exceptions.ClientError:
                        await asyncio.sleep(DOWN_POLL)  # (etcd away: the same question once it answers)
                removed += deleted
        if removed:
            log.info("%d transient queue(s) of node %s, down, deleted", removed, name)

    @staticmethod
    def _taken_with(vhost: VHost, name: str, own: list[BindingRecord], others: list[BindingRecord]
                    ) -> list[tuple[str, str]]:
        """(kind, key) of queue ``name``'s record and of what its deletion takes with it, as
        rabbit_binding:remove_transient_for_destination does: its bindings (``own``), and an auto-delete exchange
        they leave with none (of ``others``), with the bindings to that exchange."""
        records = [(QueueRecord.kind, QueueRecord(vhost.name, name).key)] + [(BindingRecord.kind, b.key) for b in own]
        for source in {binding.source for binding in own}:
            exchange = vhost.exchanges.get(source)
            if exchange is None or not exchange.auto_delete or any(
                    b.vhost == vhost.name and b.source == source for b in others):
                continue
            records.append((ExchangeRecord.kind, ExchangeRecord(vhost.name, source, exchange.type_name).key))
            records += [(BindingRecord.kind, b.key) for b in others
                        if b.vhost == vhost.name and b.destination_type == "exchange" and b.destination == source]
        return records

    async def forget(self, name: str) -> None:
        """Remove a stopped node for good: its queues (and their bindings) go, then its membership."""
        peer = self.peers.get(name)
        if peer is not None and peer.up:
            raise ValueError(f"node {name} is running: stop it before forgetting it")
        for vhost in list(self.broker.vhosts.values()):
            for queue in list(vhost.queues.values()):
                if queue.node == name:  # (an exclusive queue's too: no connection of this node owns it)
                    self.broker.remove_queue(vhost, queue)
        await self.membership.forget(name)

    def _session(self, server_link: ServerLink) -> PeerSession:
        session = PeerSession(self.broker, server_link, self.orphans)
        self.sessions.add(session)
        server_link.closed.add_done_callback(lambda _: self.sessions.discard(session))
        return session

    async def _report_stats(self) -> None:
        """Every second, tell the other nodes how many messages the queues owned here hold, and the alarms that
        stand here (which hold their publishers too, as RabbitMQ's alarms hold the cluster's)."""
        while True:
            await asyncio.sleep(STATS_INTERVAL)
            if not self.sessions:
                continue
            report = encode_json({f"{q.vhost}\0{q.name}": [q.message_count, len(q.consumers)]
                                  for q in self.broker.all_queues() if q.node == self.name})
            alarms = encode_json([resource for resource in RESOURCES if self.flow.alarmed(resource)])
            for session in self.sessions:
                session.link.send(STATS, report)
                session.link.send(ALARMS, alarms)

    def nodes(self) -> list[tuple[str, bool]]:
        """(name, running) of every other member."""
        return [(name, peer.up) for name, peer in sorted(self.peers.items())]

    # -- placement ----------------------------------------------------------------------------

    def _place(self, arguments: dict[str, Any]) -> str:
        """x-queue-leader-locator: client-local (default) or balanced (the running node owning fewest queues)."""
        if arguments.get("x-queue-leader-locator") not in BALANCED:
            return self.name
        owned = {self.name: 0, **{name: 0 for name, peer in self.peers.items() if peer.up}}
        for queue in self.broker.all_queues():
            owner = queue.node
            if owner in owned:
                owned[owner] += 1
        return min(owned, key=lambda name: (owned[name], name))

    # -- definitions made here ----------------------------------------------------------------

    def defined(self, kind: str, key: str, record: dict[str, Any]) -> None:
        if self.applying:
            return
        record = {k: v for k, v in record.items() if k != "index_id"}
        if kind == "queue":
            record["node"] = self.name
            if record.get("exclusive"):
                record["run"] = self.run
        self.metadata.put(kind, key, record)

    def undefined(self, kind: str, key: str) -> None:
        if not self.applying:
            self.metadata.delete(kind, key)

    async def written(self) -> None:
        """Every definition change made here so far is in etcd (506 if etcd does not take them within
        AGREE_TIMEOUT: they stay made here and reach etcd once it answers), and the other nodes this one reaches
        have them too, or were waited for ``SPREAD_WAIT``: a client told of a change (declare-ok, bind-ok) finds
        it through any node at once, as RabbitMQ answers once every node's Mnesia has it.  A node whose watch lags
        behind etcd would otherwise route a publish by its older view (to no queue: confirmed and dropped)."""
        try:
            await asyncio.wait_for(self.metadata.written(), AGREE_TIMEOUT)
        except asyncio.TimeoutError:
            raise errors.ChannelError(errors.RESOURCE_ERROR, "cluster metadata store unavailable: timeout") from None
        revision = self.metadata.made
        behind = [peer.reached(revision) for peer in self.peers.values()
                  if peer.up and peer.reached_revision < revision]
        if behind:
            await asyncio.wait([asyncio.ensure_future(ask) for ask in behind], timeout=SPREAD_WAIT)

    async def reached(self, revision: int) -> bool:
        """Whether the definitions here became etcd's at ``revision`` within ``SPREAD_WAIT`` (another node made a
        change and waits for this one to have it)."""
        if not self.current:  # (a publish routed nowhere here waits until it is: ``caught_up``)
            return False
        try:
            await asyncio.wait_for(self.metadata.reached(revision), SPREAD_WAIT)
        except asyncio.TimeoutError:
            return False
        return True

    async def agree(self, record: Record) -> None:
        """A new exchange or queue: created in etcd unless it exists; this node then has the cluster's one."""
        if isinstance(record, QueueRecord):
            node = self.name if record.exclusive else self._place(record.arguments)
            record = replace(record, node=node, run=self.run if record.exclusive else "")
            if REPLICATED in queue_types.of(record.arguments).capabilities:
                record = replace(record, members=self.quorum.members_for(record.arguments, node))
        kind, key = record.kind, record.key
        try:
            current = await asyncio.wait_for(self.metadata.create(kind, key, record.to_json()), AGREE_TIMEOUT)
            if self._earlier_run(current):  # (a client declaring its exclusive queue again after a restart)
                self.metadata.delete(kind, key)
                await asyncio.wait_for(self.metadata.written(), AGREE_TIMEOUT)
                current = await asyncio.wait_for(self.metadata.create(kind, key, record.to_json()), AGREE_TIMEOUT)
        except (asyncio.TimeoutError, aetcd.exceptions.ClientError) as exc:
            raise errors.ChannelError(errors.RESOURCE_ERROR,
                                      f"cluster metadata store unavailable: {exc or 'timeout'}") from None
        claimed = None
        queue = record if isinstance(record, QueueRecord) else None
        if queue is not None and current.get("members") and current.get("node") == self.name:
            claimed = await self.quorum.claim_first(queue.vhost, queue.name)
        self.apply(kind, key, current, None)
        if queue is not None and claimed is not None:  # leads it before declare-ok
            self.quorum.lead(queue.vhost, queue.name, *claimed)

    def _earlier_run(self, record: dict[str, Any]) -> bool:
        """An exclusive queue's record of this node's earlier run (stale: its connection is gone)."""
        return bool(record.get("exclusive")) and record.get("node") == self.name and record.get("run") != self.run

    async def look_up(self, kind: str, key: str) -> None:
        """Not known here (yet): if the cluster has it, apply it now rather than when the watch brings it."""
        try:
            record = await asyncio.wait_for(self.metadata.fetch(kind, key), AGREE_TIMEOUT)
        except (asyncio.TimeoutError, aetcd.exceptions.ClientError):
            return  # etcd unreachable: the local view answers
        if record is not None:
            self.apply(kind, key, record, None)

    @property
    def current(self) -> bool:
        return self.metadata.current.is_set()

    async def caught_up(self) -> bool:
        """Waits up to CURRENT_TIMEOUT for the definitions here to be etcd's (a full read, and its watch on)."""
        try:
            await asyncio.wait_for(self.metadata.current.wait(), CURRENT_TIMEOUT)
        except asyncio.TimeoutError:
            return False
        return True

    # -- definitions agreed elsewhere ---------------------------------------------------------

    def apply(self, kind: str, key: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        """A definition changed in etcd (``new`` None: deleted): make this node's the same."""
        latest = new if new is not None else old
        if latest is None:  # (a change has one side at least)
            return
        self.applying = True
        try:
            if kind in ACCESS_KINDS:
                self._apply_access(kind, key, new, latest)
            else:
                parse, put, delete = self._appliers[kind]
                record = parse(latest)
                vhost = self.broker.vhosts.get(record.vhost)
                if vhost is None:
                    return  # its vhost is gone (or not yet here): nothing to apply to
                (put if new is not None else delete)(vhost, record)
        except AMQPError as exc:
            log.warning("cannot apply %s %s: %s", kind, untrusted(key), untrusted(exc.text))
        finally:
            self.applying = False

    def _apply_access(self, kind: str, key: str, new: dict[str, Any] | None, latest: dict[str, Any]) -> None:
        """``latest``: ``new``, or the definition deleted."""
        access = self.broker.access
        if kind == "user":
            if new is None:
                access.delete_user(key)
            else:
                access.put_user(User(key, new["password_hash"], list(new.get("tags", []))))
        elif kind == "vhost":
            if new is None:
                self.broker.delete_vhost(latest["name"])
            else:
                self.broker.add_vhost(new["name"], **{k: v for k, v in new.items() if k != "name"})
        elif kind == "global_parameter":
            if new is None:
                access.clear_global_parameter(latest["name"])
            else:
                access.set_global_parameter(new["name"], new["value"])
        elif kind == "parameter":
            if new is None:
                access.clear_parameter(latest["vhost"], latest["component"], latest["name"])
            else:
                access.set_parameter(new["vhost"], new["component"], new["name"], new["value"], new.get("user", ""))
        elif kind == "federation_suffix":
            access.set_federation_suffix(latest["vhost"], latest["exchange"], latest["upstream"],
                                         latest["upstream_exchange"], new["suffix"] if new is not None else None)
        elif kind in ("vhost_limits", "user_limits"):
            access.set_limits(kind, latest["vhost" if kind == "vhost_limits" else "user"],
                              new["value"] if new is not None else {})
        elif kind == "topic_permission":
            if new is None:
                access.clear_topic_permission(latest["vhost"], latest["user"], latest["exchange"])
            else:
                access.set_topic_permission(new["vhost"], new["user"],
                                            TopicPermission(new["exchange"], new["write"], new["read"]))
        elif new is None:
            access.clear_permissions(latest["vhost"], latest["user"])
        else:
            access.set_permissions(new["vhost"], new["user"], Permissions(new["configure"], new["write"], new["read"]))

    def _put_queue(self, vhost: VHost, record: QueueRecord) -> None:
        if record.members:
            self.quorum.put_queue(vhost, record)
            return
        existing = vhost.queues.get(record.name)
        storable(record.arguments, resource_name("queue", record.name, vhost.name), queue=True)  # as a declaration
        if record.exclusive and record.node == self.name:
            if record.run != self.run:  # its connection went with an earlier run of this node: so does it
                self._stale.append((vhost, record))
                if self.metadata.caught_up.is_set():
                    self._drop_stale()
            # else its connection declares it here (``Queues.declare_queue``), or it went and etcd hears of it
        elif record.node == self.name:
            if existing is None:
                self.broker.declare_queue(vhost, record.name, durable=record.durable, auto_delete=record.auto_delete,
                                          arguments=record.arguments)
                if not record.durable and not self.metadata.caught_up.is_set():
                    self._lost.append((vhost, record.name))
        elif existing is None:
            self.broker.add_remote_queue(vhost, RemoteQueue(
                record.name, vhost.name, record.durable, record.auto_delete, record.arguments,
                *queue_types.declared(record.arguments, record.name, vhost.name), self.peer(record.node),
                record.exclusive))

    def _delete_queue(self, vhost: VHost, record: QueueRecord) -> None:
        if record.members:
            self.quorum.delete_queue(vhost, record)
            return
        queue = vhost.queues.get(record.name)
        if queue is not None:  # (another node's exclusive queue too: this is no connection's use of it)
            self.broker.remove_queue(vhost, queue)

    def _put_exchange(self, vhost: VHost, record: ExchangeRecord) -> None:
        if record.name not in vhost.exchanges:
            self.broker.declare_exchange(vhost, record.name, record.type, durable=record.durable,
                                         auto_delete=record.auto_delete, internal=record.internal,
                                         arguments=record.arguments)

    def _delete_exchange(self, vhost: VHost, record: ExchangeRecord) -> None:
        self.broker.delete_exchange(vhost, record.name)

    def _put_policy(self, vhost: VHost, policy: Policy, kind: str) -> None:
        if self.broker.policies.get(kind, vhost.name, policy.name) != policy:
            self.broker.policies.put(kind, policy, vhost)

    def _delete_policy(self, vhost: VHost, policy: Policy, kind: str) -> None:
        self.broker.policies.delete(kind, vhost, policy.name)

    def _put_binding(self, vhost: VHost, record: BindingRecord) -> None:
        source, destination = vhost.binding_ends(record)
        if source is not None and destination is not None:
            self.broker.add_binding(vhost, record.source, destination, record.routing_key, record.arguments)

    def _delete_binding(self, vhost: VHost, record: BindingRecord) -> None:
        source, destination = vhost.binding_ends(record)
        if source is not None and destination is not None:
            self.broker.remove_binding(vhost, record.source, destination, record.routing_key, record.arguments)
