"""Replicated (quorum) queues: a leader that serves clients, followers that keep a copy on their disks.

Leadership comes from etcd: the leader of a queue holds ``/warren/leaders/<queue>`` under its node's
lease, and the key's create revision is its *term*.  A node whose lease lapses (it died, or lost etcd)
loses every key it held; the members left elect a new leader among themselves:

1. each stops taking the old leader's log, and writes its position (term, index) under
   ``/warren/positions/<queue>/<node>``;
2. once a majority of the members have written one, the member with the highest position among them
   claims the key (an etcd transaction that only one can win).  A committed entry is on a majority, so
   any majority holds a member that has it, and the highest position of a majority has them all.

The log (:mod:`oplog`) is the queue's changes, shipped by the leader over the node-to-node links.  A
follower takes ops only from the leader of the term it follows and only in order (else it asks to catch
up), applies them to its own message store and queue index (under its own index id for the queue) with its
position in the same transaction, and answers ``REPLICATED`` once the group commit that holds them is
fsynced.  A publish is confirmed once a majority (the leader counting itself) has it durably.

A new leader recovers the queue from its copy as a restart would, but for what consumers held: as RabbitMQ's,
a quorum queue's consumers outlive a change of leader, their clients unaware.  Each node's consumers consume
again at the new leader (``RemoteQueue.follow``; those of a leader deposed, or of a node that now leads, move
to the queue's new object here, ``Broker.replace_queue``) with the queue's seqs of what they hold, which the
leader kept for them (``QuorumQueue.adopt``) and gives back under new delivery tags; what none took back
within ``HANDOVER_GRACE`` comes back redelivered (or later, up to ``HANDOVER_MAX``, while the node of a member
whose link fell silent may come back: ``_unreached``); a deposed leader's consumers also take the settles made
there lately, which it may not have got onto a majority (``QuorumQueue.release``).  A leader that sees a later
term, or whose lease lapsed, stops: its consumers are dropped there, uncancelled.  A confirmed publish through a
node goes through that node's window of the queue (``remote_queue.Window``, an enqueuer of the queue's state as
``rabbit_fifo``'s are): what the leader has not confirmed, the window sends again to the next leader as soon as
it is known, which takes each publish once; a deposed leader's own unconfirmed publishes join its node's window.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Protocol

import aetcd
import lmdb
import numpy as np
from aetcd import rtypes

from amqp_server import patterns
from amqp_server.queues import queue_args, types as queue_types
from amqp_server.queues import quorum_machine as machine
from amqp_server.logs import untrusted
from amqp_server.queues.quorum_machine import CHECKS, State
from amqp_server.queues import quorum_queue
from amqp_server.records import QueueRecord
from amqp_server.broker.vhost import VHost
from amqp_server.errors import ChannelError
from amqp_server.tasks import stop_tasks

from ..peers import node_link as link
from .oplog import (ACKED, ADOPT_OP, ANNOTATED, CHECK_SHARE, CONT, CONTINUE_OP, DIFF, DIFF_OP, ENTRY_OP, HEAD, MARK,
                    MORE_OP, REPLAY_OP, RESET_OP, Diverged, History, LogBudget, OpLogShipper, SpareRows, check_copy,
                    skip)
from .oplog import apply as apply_ops
from ..peers.remote_queue import Publish, Relayed, RemoteQueue, Window, proxy_of
from ..peers.owner_side import PeerSession

if TYPE_CHECKING:
    from amqp_server.broker import Broker

    from ..metadata.mirror import Metadata
    from ..peers.peer import Peer

log = logging.getLogger("warren.forwarder.quorum")

LEADERS = b"/warren/leaders/"
POSITIONS = b"/warren/positions/"
LEASE_TTL = 3  # seconds: a dead leader's keys go this long after its last refresh (a loaded machine stalls its
# nodes and etcd for seconds: 2 s lapsed then, and the queues elected leader after leader); shorter than the
# links' heartbeat timeout (a silent link revokes no lease: the lease lapses first)
ELECTION_POLL = 0.1
ELECTION_TIMEOUT = 10.0
ELECTION_GRACE = 2.0  # a queue found without a leader: time for its declaring node to claim it first
PASSED_OVER = 2.0  # a copy ahead of a majority's waits this long for a copy further ahead to claim (``_stand``)
ELECTION_TOLD = 3.0  # an election still going on logs what it waits for this often
RETRY_INTERVAL = 1.0  # etcd did not answer: asked again after this
CATCH_UP_RETRY = 2.0  # a follower that asked to catch up and still misses ops asks again after this
CATCH_UP_TRIES = 5  # how many times at most, while its copy does not move
ELECTION_RETRY = LEASE_TTL / 8  # an election's write or read failed (etcd away, or our lease just lapsed): again
REPLICA = "replica"  # definition-store kind: queue key -> this node's index ids for its copy, and its spare
DEFAULT_GROUP_SIZE = 3
STORAGE_ERRORS = (OSError, lmdb.Error)  # a follower's disk refused a write (``_unstored``)

def queue_key(vhost: str, name: str) -> str:
    return f"{vhost}\0{name}"

class GroupsHost(Protocol):
    """The cluster as the replicated queues use it (``cluster.Cluster``): this node and its broker, the other
    nodes, etcd and the definitions there."""

    @property
    def name(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def client(self) -> aetcd.Client: ...

    @property
    def metadata(self) -> Metadata: ...

    @property
    def peers(self) -> Mapping[str, Peer]: ...

    def nodes(self) -> list[tuple[str, bool]]: ...

    def peer(self, name: str) -> Peer: ...


@dataclass
class IncomingSnapshot:
    """A snapshot coming in from the leader of ``term``: the state as it stood at index ``at``, the rows of the
    queue's entries then, the ops since.  It is written under the copy's spare index id, beside the copy it
    replaces, which stays whole meanwhile (it stands in elections, may lead, and may yet be caught up from a
    leader's log), as a Raft follower keeps its log until a snapshot it is sent is complete.  Its end (the
    first REPLAY frame) makes it the copy (``QuorumGroups._install``)."""

    term: int
    at: int
    state: State = field(default_factory=State)
    frames: int = 0  # of it taken so far
    rows: SpareRows = field(default_factory=SpareRows)


@dataclass
class Group:
    """One quorum queue as this node knows it: its members, its leader, and this node's copy."""

    vhost: str
    name: str
    members: list[str]
    record: QueueRecord
    index_id: int = 0  # this node's copy, if a member
    spare: int = 0  # the index id a snapshot comes into (``IncomingSnapshot``), once one has
    state: State = field(default_factory=State)  # that copy's state (the leader's queue applies ops to it)
    leader: str = ""
    term: int = 0  # the term this node follows (0: none, during an election)
    over: int = 0  # the latest term known to be over (its key gone): a node that names its leader is behind
    applied_term: int = 0  # the term of the last op this node's copy has
    applied: int = 0  # the index of that op
    # the index of the last op that annotated a row of the copy (kept with its index ids): a copy diverged from a
    # leader's log before it keeps its rows of the entries both had then (``OpLogShipper.catch_up``)
    annotated: int = 0
    incoming: IncomingSnapshot | None = None  # a snapshot coming in
    vouched: tuple[int, int] = (0, 0)  # where the copy stood whole before its restart found it lost messages
    leader_lease: int = 0  # the etcd lease the leader holds its key under
    asked: tuple[int, int, float] = (0, 0, 0.0)  # (term, index) we last asked to catch up from, on a gap, and when
    replicator: OpLogShipper | None = None
    # (batch, to, term, index) to answer: the term of the leader whose ops those are, which alone may count them
    acks: list[tuple[int, "PeerSession", int, int]] = field(default_factory=list)
    electing: asyncio.Task | None = None
    rechecking: asyncio.Task | None = None  # asking etcd who leads (``_recheck``)
    hinted: bool = False  # the leader followed is one another node named (``_hinted``), not etcd's key yet
    ballot_out: bool = False  # our position may be in etcd (an election's): no op is acknowledged (``_withdraw``)
    unsent: tuple[int, "PeerSession", int] | None = None  # (term, to, index) durable, not yet acknowledged
    window: Window = field(default_factory=Window)  # confirmed publishes through this node, until a leader answers
    history: History = field(default_factory=History)  # the ops the copy applied last (a leader's log)
    unchecked: int = 0  # (``CHECKS``) ops applied since the copy's rows were last checked whole (``check_copy``)

    @property
    def key(self) -> str:
        return queue_key(self.vhost, self.name)

    @property
    def position(self) -> tuple[int, int]:
        """(term, index) of the last op this node's copy holds: what it stands for in an election and asks a
        leader from; (0, index) for a copy not whole (``_lost_rows``), so that it never wins, nor is taken for
        whole by a new leader."""
        return self.applied_term, self.applied

    @property
    def whole(self) -> bool:
        """The copy holds every op up to its position: its restart did not find it lost messages (its
        position's term is 0 then, past index 0)."""
        return self.applied_term > 0 or self.applied == 0

    @property
    def ballot(self) -> list[int]:
        """What this copy stands for in an election: its position and 1 if whole; else where it stood whole
        before it lost messages, and 0 — it cannot lead, but it may have had (and acknowledged) ops up to
        there, which whoever leads must have too."""
        return [*self.position, 1] if self.whole else [*self.vouched, 0]


class QuorumGroups:
    """Every quorum queue of the cluster, as this node takes part in them."""

    def __init__(self, cluster: GroupsHost) -> None:
        self.cluster = cluster
        self.broker = cluster.broker
        self.name = cluster.name
        self.client: aetcd.Client = cluster.client
        self.groups: dict[str, Group] = {}
        self.logs = LogBudget()  # what the copies' logs of their latest ops hold together
        # (loop time) until when a peer whose link fell silent may still have consumers coming back: inf while
        # its link is down, a grace after it comes back (``_unreached``)
        self._reach: dict[str, float] = {}
        self.lease: aetcd.Lease | None = None
        self._renewed = 0.0  # (loop time) when the last refresh etcd took was sent
        self._lapsed = False  # etcd answered a refresh that the lease is gone
        self.ready = asyncio.Event()  # the lease is granted and the watch runs
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._renewed = loop.time()
        self.lease = await self.client.lease(LEASE_TTL)
        self._tasks = [loop.create_task(self._keep_lease()), loop.create_task(self._watch())]
        self.ready.set()

    async def stop(self) -> None:
        await stop_tasks(*self._tasks, *(group.electing for group in self.groups.values()))
        if self.lease is not None:
            try:
                await asyncio.wait_for(self.lease.revoke(), 2)  # the others need not wait for it to lapse
            except (aetcd.ClientError, asyncio.TimeoutError):
                pass

    @property
    def lease_sure(self) -> bool:
        """The lease is alive for sure: a refresh etcd took was sent less than half its TTL ago (etcd counts the
        TTL from when it took it, later).  A queue led here with no follower delivers only while it is
        (``OpLogShipper.allowance``); one with followers, while they answer."""
        return asyncio.get_running_loop().time() - self._renewed <= LEASE_TTL / 2

    async def _keep_lease(self) -> None:
        """Refresh the lease every eighth of it, each refresh answered in its own time (``_refresh``), and go on
        refreshing while etcd does not answer (a queue of no follower delivers nothing once it may have lapsed:
        ``lease_sure``).  Etcd answers that it is alive: nobody else could claim our queues meanwhile (a key
        lives as long as its lease), so they deliver again with no change of leader — after a pause of this
        node or of its loop, etcd frozen for less than the lease or restarted (it keeps its leases).  Etcd
        answers that it is gone: lead nothing, and a new lease."""
        loop = asyncio.get_running_loop()
        refreshing: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(LEASE_TTL / 8)
                if self._lapsed:
                    await self._new_lease()
                    continue
                assert self.lease is not None  # (start got one; _new_lease, awaited above, leaves one)
                task = loop.create_task(self._refresh(self.lease))
                refreshing.add(task)
                task.add_done_callback(refreshing.discard)
        finally:
            for task in refreshing:
                task.cancel()

    async def _refresh(self, lease: aetcd.Lease) -> None:
        """One refresh, waited for up to the lease, not less: a loop slowed by long turns (a deep queue's
        snapshots under load) sends and hears late, and a refresh given up sooner may never have left — the
        lease lapsed so, every new term's snapshots slowed the next, and the leader changed every few seconds.
        The next refresh does not wait for this one."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        try:
            reply = await asyncio.wait_for(lease.refresh(), LEASE_TTL)
        except (aetcd.ClientError, asyncio.TimeoutError):
            return
        if lease is not self.lease or sent <= self._renewed:
            return  # a lapsed lease's, or answered after a later one
        if reply.TTL <= 0:
            self._lapsed = True
            return
        unsure = not self.lease_sure
        self._renewed = sent
        if unsure:
            for group in list(self.groups.values()):
                if group.replicator is not None and self._cut_off(group):
                    self._step_down(group)  # (found cut off while etcd was away too: ``_step_down``)
                elif group.replicator is not None:
                    group.replicator.queue.deliver_ready()

    async def _new_lease(self) -> None:
        """The lease lapsed (etcd says so, and dropped its keys): lead nothing; then a new lease, asked for until
        etcd grants one, and every queue left without a leader elects one."""
        if any(group.replicator is not None for group in self.groups.values()):
            log.warning("etcd lease lapsed: leading no queue")
        self._step_down_everywhere()
        self.lease = None
        self._lapsed = False
        loop = asyncio.get_running_loop()
        lapsed = loop.time()
        while self.lease is None:
            sent = loop.time()
            try:
                self.lease = await asyncio.wait_for(self.client.lease(LEASE_TTL), LEASE_TTL)
                self._renewed = sent
            except (aetcd.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(LEASE_TTL / 8)
        log.info("%s's etcd lease had lapsed: a new one after %.1f s", self.name, loop.time() - lapsed)
        for group in self.groups.values():
            if not group.leader and self.name in group.members:
                self._elect(group)

    def _step_down_everywhere(self) -> None:
        for group in self.groups.values():
            if group.leader == self.name:
                self._follow(group, "", 0)  # (the only member of a group keeps leading it)

    # -- definitions ---------------------------------------------------------------------------

    def members_for(self, arguments: dict[str, Any], first: str) -> list[str]:
        """The group of a new queue: its placed node, then running nodes by name, up to the group size."""
        size = queue_args.parse(arguments, "", "").group_size or DEFAULT_GROUP_SIZE
        others = sorted(name for name, up in self.cluster.nodes() if up and name != first)
        if first != self.name:
            others = sorted(set(others) | {self.name} - {first})
        return [first, *others][:size]

    def put_queue(self, vhost: VHost, record: QueueRecord) -> None:
        key = queue_key(vhost.name, record.name)
        group = self.groups.get(key)
        if group is not None:
            self._regroup(vhost, group, record)
            return
        group = self.groups[key] = Group(vhost.name, record.name, list(record.members), record,
                                         history=History(self.logs))
        group.window.send = functools.partial(self._send, group)  # (each publish: a partial is no frame more)
        group.window.recheck = lambda: self._recheck(group)
        group.window.hinted = lambda leader, term: self._hinted(group, leader, term)
        if self.name in group.members:
            self._open_copy(group)
        elif (saved := self.broker.store.get(REPLICA, group.key)) is not None:
            # removed from the group while this node was down (the mirror had the change before any copy here
            # acted on it): its copy goes, as it would have had the node been up (``_regroup``); kept, its rows and
            # messages stayed on disk for good, and a later re-add took the stale copy up
            group.index_id, group.spare = saved["index_id"], saved.get("spare", 0)
            self._drop_copy(group)
        # until the leader is known, clients here reach another member (which refuses what needs a leader), so
        # that the queue exists here at once and is never declared anew
        others = [record.node] if record.node != self.name else [m for m in group.members if m != self.name]
        if others:
            self._proxy(vhost, group, others[0])
        asyncio.get_running_loop().create_task(self._learn_leader(group))

    def _open_copy(self, group: Group) -> None:
        """This node's copy of the queue: the index id it has (or a new one), and where its log stands.  Of the
        copy and its spare, the copy is the one whose position is whole and furthest: a snapshot's position is
        written only by its end, in the group commit that also takes the copy it replaces away
        (``_install``), so a restart before that commit keeps the copy it had.  The other's rows go."""
        saved = self.broker.store.get(REPLICA, group.key)
        if saved is None:
            saved = {"index_id": self.broker.next_index_id()}
            self.broker.store.put(REPLICA, group.key, saved)
        copy, spare = saved["index_id"], saved.get("spare", 0)
        positions = self.broker.persistence.index
        if spare and positions.position(spare)[0] > 0 and positions.position(spare) > positions.position(copy):
            copy, spare = spare, copy
            self.broker.store.put(REPLICA, group.key, {**saved, "index_id": copy, "spare": spare})
        if spare:
            self.broker.replicas.clear(spare)
            positions.forget_position(spare)
        group.index_id, group.spare = copy, spare
        term, index = saved.get("vouched", (0, 0))
        group.vouched = (term, index)
        group.applied_term, group.applied = self.broker.persistence.index.position(group.index_id)
        group.annotated = saved.get("annotated", group.applied)  # (not kept yet: as if by its last op)
        group.state = self.broker.replicas.copy_state(group.index_id)
        if group.index_id in self.broker.persistence.lost_copies:
            self._lost_rows(group)

    def _lost_rows(self, group: Group) -> None:
        """The copy's recovery dropped entries whose message was not on disk: it holds less than its position
        says.  It stands where it stood in elections (it may have acknowledged ops up to there: no member behind
        may lead) but never leads, nor is taken for whole by a leader, which sends it a snapshot — adopted as it
        was, it went on without those messages, and a leader elected from it never delivered them."""
        log.warning("%s's copy of %s lost messages it had at %s: it takes a snapshot", self.name,
                    untrusted(group.key), group.position)
        self.broker.persistence.lost_copies.discard(group.index_id)
        if group.whole:
            self._vouch(group)
        group.applied_term = 0  # of no term: not whole, until a snapshot replaces it
        self.broker.replicas.position(group.index_id, *group.position, group.state)

    def _drop_copy(self, group: Group) -> None:
        if not group.index_id:
            return
        self.broker.replicas.clear(group.index_id)
        self.broker.persistence.index.forget_position(group.index_id)
        if group.spare:
            self.broker.replicas.clear(group.spare)
        self.broker.store.delete(REPLICA, group.key)
        group.index_id = group.spare = group.applied = group.applied_term = 0
        group.history.clear()
        group.incoming = None
        group.vouched = (0, 0)
        group.state = State()

    # -- membership changes (warrenctl, HTTP) -----------------------------------------------------

    async def change_members(self, vhost: str, name: str, add: str = "", remove: str = "") -> None:
        """A node joins (``add``) or leaves (``remove``) a queue's group, as ``rabbit_quorum_queue:add_member`` and
        ``delete_member`` have it: a node that is a member already joins, and one that is not leaves, as a no-op.
        The queue's leader makes the change (asked over its link from another node): it alone knows whether the
        change before is on a majority of the members yet (``OpLogShipper.regroup_agreed``).
        LookupError: no such quorum queue; ValueError: a change that cannot be made (now)."""
        group = self.groups.get(queue_key(vhost, name))
        if group is None:
            raise LookupError(f"no quorum queue '{name}' in vhost '{vhost}'")
        if not (add or remove):
            raise ValueError("no node named")
        if (add and add in group.members) or (remove and remove not in group.members):
            return
        if group.replicator is not None:
            self.change_here(vhost, name, add, remove)
            return
        vhost_object = self.broker.vhosts.get(vhost)
        proxy = proxy_of(vhost_object.queues, name) if vhost_object is not None else None
        peer = self.cluster.peers.get(group.leader)
        if proxy is None or peer is None:
            raise ValueError(f"queue '{name}' has no leader now: its members elect one")
        try:
            reply, _ = await peer.request(proxy, "members", add=add, remove=remove)
        except ChannelError:
            raise ValueError(f"the leader of queue '{name}', node '{peer.name}', is out of reach") from None
        if isinstance(reply.get("refused"), str):
            raise (LookupError if reply.get("missing") is True else ValueError)(reply["refused"])

    def change_here(self, vhost: str, name: str, add: str = "", remove: str = "") -> None:
        """``change_members`` at the queue's leader (this node), written to etcd for every node to regroup."""
        group = self.groups.get(queue_key(vhost, name))
        if group is None:
            raise LookupError(f"no quorum queue '{name}' in vhost '{vhost}'")
        if group.replicator is None:
            raise ValueError(f"node '{self.name}' no longer leads queue '{name}': try again")
        members = list(group.members)
        if add and add not in members:
            running = dict(self.cluster.nodes())
            if add != self.name and add not in running:
                raise ValueError(f"no node '{add}' in the cluster")
            if add != self.name and not running[add]:
                raise ValueError(f"node '{add}' is not running")  # (rabbit_quorum_queue's node_not_running)
            members.append(add)
        if remove and remove in members:
            if len(members) == 1:
                raise ValueError(f"queue '{name}' has only one member")  # (its last_node)
            members.remove(remove)
        if members == group.members:
            return
        if not group.replicator.regroup_agreed:
            raise ValueError(f"queue '{name}' is changing members: the change before is not on a majority of its "
                             "members yet")  # (Ra's cluster_change_not_permitted)
        record = replace(group.record, members=members)
        self.cluster.metadata.put(QueueRecord.kind, record.key, {k: v for k, v in record.to_json().items()
                                                                 if k != "index_id"})
        vhost_object = self.broker.vhosts.get(vhost)
        if vhost_object is not None:
            self._regroup(vhost_object, group, record)

    async def grow(self, node: str, strategy: str, vhost_pattern: str = ".*", queue_pattern: str = ".*") -> int:
        """Add ``node`` to every matching quorum queue (``strategy`` all) or those with an even number of
        members (even), as ``rabbit_quorum_queue:grow``: only a running node, and a queue that refuses (its last
        change not on a majority yet, its leader out of reach) is left as it is, logged; returns how many queues
        it joined."""
        running = dict(self.cluster.nodes())
        if node != self.name and node not in running:
            raise ValueError(f"no node '{node}' in the cluster")
        try:
            vhosts, queues = patterns.compile(vhost_pattern), patterns.compile(queue_pattern)
        except patterns.Error as exc:
            raise ValueError(f"invalid pattern: {exc}") from None
        if node != self.name and not running[node]:
            return 0
        joined = 0
        for group in list(self.groups.values()):
            if node in group.members or (strategy == "even" and len(group.members) % 2):
                continue
            if patterns.search(vhosts, group.vhost) and patterns.search(queues, group.name):
                try:
                    await self.change_members(group.vhost, group.name, add=node)
                except (LookupError, ValueError) as exc:
                    log.warning("%s did not join %s: %s", untrusted(node), untrusted(group.key), exc)
                    continue
                joined += 1
        return joined

    def _regroup(self, vhost: VHost, group: Group, record: QueueRecord) -> None:
        """The group changed: a new member takes a copy, a member that left drops it, the leader ships to
        the new set, and a leader that left steps down for the others to elect one."""
        members = list(record.members)
        group.record = record
        if members == group.members:
            return
        group.members = members
        if self.name in members and not group.index_id:
            self._open_copy(group)
            if group.leader and group.leader != self.name:
                self._ask_to_catch_up(group)
        proxy = proxy_of(vhost.queues, group.name)
        if proxy is not None:
            proxy.members = members
        if group.replicator is not None:
            if self.name in members:
                group.replicator.queue.members = [self.name] + [m for m in members if m != self.name]
                group.replicator.regroup(members)
            else:
                self._follow(group, "", 0)
                asyncio.get_running_loop().create_task(self._release(group))
        if self.name not in members:
            self._drop_copy(group)

    def delete_queue(self, vhost: VHost, record: QueueRecord) -> None:
        group = self.groups.pop(queue_key(vhost.name, record.name), None)
        if group is None:
            return
        if group.electing is not None:
            group.electing.cancel()
        group.window.close()
        if group.replicator is not None:  # the followers drop their copies themselves: nothing more to ship
            for confirm, seq, _ in group.replicator.stop():
                confirm.remote_confirmed(seq, True)
            group.replicator.queue.replicator = None
            group.replicator = None
        self.broker.delete_queue(vhost, record.name)
        self._drop_copy(group)
        if group.leader == self.name:
            asyncio.get_running_loop().create_task(self._release(group))

    async def _release(self, group: Group) -> None:
        try:
            await self.client.delete(LEADERS + group.key.encode())
        except aetcd.ClientError:
            pass

    # -- leadership ----------------------------------------------------------------------------

    async def claim_first(self, vhost: str, name: str) -> tuple[int, int] | None:
        """A queue declared here and placed here: claim its lead from the start; (term, lease) if won.  None
        too if etcd would not have it (this node's lease lapsed just then, or etcd is out of reach): the queue
        is declared all the same, and its members elect a leader as for any queue without one."""
        key = queue_key(vhost, name)
        try:
            await asyncio.wait_for(self.ready.wait(), LEASE_TTL * 5)
            return await self._claim(key)
        except (aetcd.ClientError, asyncio.TimeoutError) as exc:
            log.info("%s did not claim the lead of %s at its declaration (%s): its members elect one", self.name,
                     untrusted(key), untrusted(exc) or "timeout")
            return None

    def lead(self, vhost: str, name: str, term: int, lease: int) -> None:
        """Lead a queue just claimed (``claim_first``), before its declare-ok."""
        group = self.groups.get(queue_key(vhost, name))
        if group is not None:
            self._follow(group, self.name, term, lease)

    async def _learn_leader(self, group: Group) -> None:
        """A queue just known here: follow its leader, or elect one if it has none — after a grace period,
        in which the node that declared a new queue claims it (``claim_first``).  Asked again while etcd
        does not answer."""
        await self.ready.wait()
        graced = False
        while not group.leader and self.groups.get(group.key) is group:
            try:
                current = await self.client.get(LEADERS + group.key.encode())
            except aetcd.ClientError as exc:
                log.warning("etcd: leader of %s unknown (%s); asking again", untrusted(group.key), exc)
                await asyncio.sleep(RETRY_INTERVAL)
                continue
            if current is not None:
                self._follow(group, current.value.decode(), current.create_revision, current.lease)
                if not group.leader:  # (this node's earlier run's key, being revoked: its deletion elects)
                    await asyncio.sleep(RETRY_INTERVAL)
            elif graced:
                if self.name in group.members:
                    self._elect(group)
                return
            else:
                graced = True
                await asyncio.sleep(ELECTION_GRACE)

    def _send(self, group: Group, publish: Publish) -> bool:
        """A publish of the group's window goes to the leader: over its link, or into the queue if this node
        leads (which takes it once: the previous leader may have had it).  While no leader is known here, to a
        member reached: it takes it if it leads, else names the leader it knows (this node may be cut off from
        etcd, as a deposed leader often is), as a Ra member answers ``not_leader``.  False: none can be reached."""
        if group.replicator is not None:
            replicator = group.replicator
            window = publish.window
            verdict = replicator.queue.enqueue_from(publish.message.copy(), publish, window.id, publish.seq,
                                                    window.floor)  # (its own record: the old one is the copy's)
            if verdict == machine.AHEAD:
                asyncio.get_running_loop().call_soon(window.answered, publish, link.CONFIRM_RESEND)
            elif verdict == "refused":
                window.answered(publish, link.CONFIRM_REJECTED)
            elif not replicator.followers:
                window.answered(publish, link.CONFIRM_OK)
            return True
        vhost = self.broker.vhosts.get(group.vhost)
        proxy = proxy_of(vhost.queues, group.name) if vhost is not None else None
        if proxy is None:
            return False
        if group.leader:
            return group.leader == proxy.peer.name and proxy.peer.enqueue(proxy, publish)
        peers = self.cluster.peers
        return any(peers[name].enqueue(proxy, publish) for name in [proxy.peer.name, *group.members]
                   if name in peers and peers[name].up)

    def leader_of(self, key: str) -> tuple[str, int]:
        """The leader of a queue as known here, and its term (("", 0): none)."""
        group = self.groups.get(key)
        return (group.leader, group.term) if group is not None else ("", 0)

    def _hinted(self, group: Group, leader: str, term: int) -> None:
        """Another node named the leader of a later term than ours (our etcd watch may be stalled or cut): we
        follow it, and ask etcd, which has the last word if it answers: the node that named it may have been cut
        off since, and that leader gone with its key (its deletion, heard before the hint, would come no more:
        both live members once followed a dead leader so, electing nobody for 30 s).  A term known to be over is
        no news: a node whose watch missed its key's deletion named it again and again, and each time our
        election began anew."""
        if (term > max(group.term, group.over) and leader != self.name and leader in self.cluster.peers
                and self.groups.get(group.key) is group):
            log.info("%s leads %s in term %d, as another node says", leader, untrusted(group.key), term)
            self._follow(group, leader, term)
            group.hinted = True
            self._recheck(group)

    def _recheck(self, group: Group) -> None:
        """The node we take for the leader refused a consumer: ask etcd who leads (our watch may have stalled)."""
        if group.rechecking is None or group.rechecking.done():
            group.rechecking = asyncio.get_running_loop().create_task(self._ask_leader(group))

    async def _ask_leader(self, group: Group) -> None:
        """Etcd's key, followed if it is of our term or later; if we follow a leader only another node named,
        etcd's answer stands whatever it is (no key: an election), unless the leader changed meanwhile."""
        asked = (group.leader, group.term) if group.hinted else None
        try:
            current = await self.client.get(LEADERS + group.key.encode())
        except aetcd.ClientError:
            return  # (tried again at the next refusal)
        if self.groups.get(group.key) is not group:
            return
        if asked is not None and asked == (group.leader, group.term):
            if current is None:
                log.info("no leader of %s in etcd, though another node named %s: an election", untrusted(group.key),
                         group.leader)
                self._follow(group, "", 0)
                if self.name in group.members:
                    self._elect(group)
            else:
                self._follow(group, current.value.decode(), current.create_revision, current.lease)
        elif current is not None and current.create_revision >= group.term:
            self._follow(group, current.value.decode(), current.create_revision, current.lease)

    async def _watch(self) -> None:
        """Follow every queue's leader key; after a broken watch, start again from etcd's current state."""
        while True:
            try:
                reply = await self.client.get_prefix(LEADERS)
                current = {kv.key[len(LEADERS):].decode(): (kv.value.decode(), kv.create_revision, kv.lease)
                           for kv in reply}
                for key, group in list(self.groups.items()):
                    if key in current:
                        self._follow(group, *current[key])
                    elif self.name in group.members:
                        self._follow(group, "", 0)
                        self._elect(group)
                watch = await self.client.watch_prefix(LEADERS, start_revision=reply.header.revision + 1)
                async for event in watch:
                    changed = self.groups.get(event.kv.key[len(LEADERS):].decode())
                    if changed is None or event.kv.mod_revision < changed.term:
                        continue  # (older than the term followed, which a later term's ops told: ``replicate``)
                    if event.kind == rtypes.EventKind.PUT:
                        self._follow(changed, event.kv.value.decode(), event.kv.create_revision, event.kv.lease)
                    else:
                        self._follow(changed, "", 0)
                        if self.name in changed.members:
                            self._elect(changed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("etcd leader watch failed (%s); retrying", exc)
                await asyncio.sleep(1.0)

    def _elect(self, group: Group) -> None:
        if group.electing is None or group.electing.done():
            group.electing = asyncio.get_running_loop().create_task(self._election(group))

    async def _election(self, group: Group) -> None:
        """Write our position; once a majority has, the highest claims the key — or, should it not within
        ``PASSED_OVER`` seconds (a node too slow, or killed again, as it comes back), a copy at or past the
        positions of a majority, ours among them, as a Raft candidate needs the votes of a majority whose logs
        are no further ahead: whatever a majority has, one of them has, so that copy has it too.  Until a
        leader is known (the watch tells, or a claim lost finds it), the queue is gone, or this node is no
        member of it.  An etcd
        error is tried again, and the position is written again under each new lease (those under a lapsed
        one are gone).  Then our position is withdrawn (``_withdraw``), and if the leader went meanwhile, this
        node stands again."""
        key = group.key.encode()
        mine = POSITIONS + key + b"/" + self.name.encode()
        while self._standing(group):
            try:
                await self._stand(group, mine)
            finally:
                await self._withdraw(group, mine)

    def _standing(self, group: Group) -> bool:
        """An election of the queue goes on and this node stands in it: not once a group commit failed here (no
        copy here is durable again until the node restarts: elected, it would confirm nothing, ``unwritable``)."""
        return (not group.leader and self.groups.get(group.key) is group and self.name in group.members
                and not self.broker.persistence.failed)

    def _reaches_majority(self, group: Group) -> bool:
        """This node and the members its links reach are a majority of the group's (as a Raft member that
        hears no majority neither leads on nor is elected: RabbitMQ's Ra followers elect among themselves
        when their leader is cut off from them, however it still reaches etcd)."""
        peers = self.cluster.peers
        reached = sum(1 for name in group.members if name == self.name or name in peers and peers[name].up)
        return reached > len(group.members) // 2

    async def _stand(self, group: Group, mine: bytes) -> None:
        loop = asyncio.get_running_loop()
        written: tuple[int, list[int]] | None = None  # (lease, ballot) of our latest write
        deadline = 0.0
        passed_over = 0.0  # (loop time) since when a copy further ahead has not claimed, 0: none is
        told = loop.time()  # when the election's progress was last logged (``ELECTION_TOLD``)
        waits = "no etcd answer yet"  # what it waits for now
        while self._standing(group):
            if loop.time() - told >= ELECTION_TOLD:
                told = loop.time()
                log.info("%s's election for %s goes on: %s", self.name, untrusted(group.key), waits)
            lease = self.lease
            if not self._reaches_majority(group):  # (cut off: the members that reach one another elect)
                waits = "no majority of the members reached over links"
                await asyncio.sleep(ELECTION_POLL)
                continue
            try:
                ballot = group.ballot
                if lease is None:
                    waits = "no etcd lease"
                elif written != (lease.id, ballot) or loop.time() > deadline:
                    group.ballot_out = True  # (before: a write that fails may be in etcd all the same)
                    await self.client.put(mine, json.dumps(ballot).encode(), lease=lease)
                    written, deadline = (lease.id, ballot), loop.time() + ELECTION_TIMEOUT
                ballots = {kv.key.rsplit(b"/", 1)[1].decode(): json.loads(kv.value)
                           for kv in await self.client.get_prefix(mine.rsplit(b"/", 1)[0] + b"/")}
                ballots = {name: b for name, b in ballots.items() if name in group.members}
                if lease is not None:
                    waits = f"positions {untrusted(ballots)}, ours {ballot}"
                half = len(group.members) // 2
                if written is not None and len(ballots) > half and ballot[2]:
                    best = max((name for name, b in ballots.items() if b[2]),
                               key=lambda name: (ballots[name][:2], name))
                    behind = sum(ballot[:2] >= b[:2] for b in ballots.values())  # (ours among them)
                    if best == self.name and behind == len(ballots):
                        await self._claim_or_follow(group)
                    elif behind > half:
                        passed_over = passed_over or loop.time()
                        if loop.time() - passed_over >= PASSED_OVER:
                            await self._claim_or_follow(group)
                    else:
                        passed_over = 0.0
            except aetcd.ClientError as exc:
                waits = f"etcd ({untrusted(exc)})"
                log.warning("election for %s: %s; trying again", untrusted(group.key), exc)
                written = None
                await asyncio.sleep(ELECTION_RETRY)
            await asyncio.sleep(ELECTION_POLL)

    async def _withdraw(self, group: Group, mine: bytes) -> None:
        """Delete our position, trying again while etcd fails (it lapses with our lease otherwise, which may be
        never).  Until it is gone our copy acknowledges no op (``synced``): a later election could count the
        position as ours, lower than what we would have acknowledged since, and elect a member that lacks
        what a majority was confirmed with.  Then the leader hears how far we are."""
        while True:
            try:
                await self.client.delete(mine)
                break
            except aetcd.ClientError as exc:
                if self.groups.get(group.key) is not group:
                    return
                log.info("withdrawing our position for %s: %s; trying again", untrusted(group.key), exc)
                await asyncio.sleep(ELECTION_RETRY)
        group.ballot_out = False
        self._acknowledge(group)

    async def _claim_or_follow(self, group: Group) -> None:
        """Claim the lead; lost, follow the winner at once (its watch event may be late, or lost with a
        broken watch)."""
        claimed = await self._claim(group.key)
        if claimed is not None:
            self._follow(group, self.name, *claimed)
            return
        current = await self.client.get(LEADERS + group.key.encode())
        if current is not None:
            self._follow(group, current.value.decode(), current.create_revision, current.lease)

    async def _claim(self, key: str) -> tuple[int, int] | None:
        """Lead the queue unless it has a leader; (term, lease) if this node won.  The watch tells every node
        (this one too) who leads."""
        full = LEADERS + key.encode()
        ops = self.client.transactions
        lease = self.lease
        if lease is None:  # a new one is being asked for: none to claim under
            return None
        won, responses = await self.client.transaction(
            compare=[ops.create(full) == 0], success=[ops.put(full, self.name.encode(), lease)], failure=[])
        if not won:
            return None
        log.info("%s claimed the lead of %s", self.name, key)
        return responses[0].response_put.header.revision, lease.id

    def _follow(self, group: Group, leader: str, term: int, lease: int = 0) -> None:
        """The queue's leader is now ``leader`` (``""``: none, an election is on) in ``term``, holding the key
        under ``lease``."""
        if leader == self.name and (self.lease is None or lease != self.lease.id):
            # the key of an earlier run of this node (etcd keeps a lease through its own restart, and its
            # followers stop revoking it once this node is back, ``_revoking``), or of a lease it replaced: that
            # term is over.
            # Its copy here may lack ops its followers took from it that were not on its disk yet; leading on
            # would put a second op at their indexes.  As a restarted Ra member comes back a follower, the lease
            # goes (its keys with it) and the members elect a leader of a later term.
            asyncio.get_running_loop().create_task(self._revoke(lease))
            leader, term, lease = "", 0, 0
        group.leader_lease = lease
        group.hinted = False
        if leader == group.leader and term == group.term:
            return
        if not leader and group.members == [self.name] and group.replicator is not None:
            return  # the only member keeps leading while it claims the key again
        if not leader:
            group.over = max(group.over, group.term)
        group.leader, group.term = leader, term
        group.window.leaderless = not leader
        self._discard_incoming(group)  # (a snapshot of the term over, were it to go on, would end nowhere)
        vhost = self.broker.vhosts.get(group.vhost)
        if vhost is None:
            return
        if group.replicator is not None and leader != self.name:
            self._demote(group)
        if leader == self.name:
            if group.replicator is None:
                self._promote(vhost, group)
        elif leader:
            self._proxy(vhost, group, leader)
            if group.index_id:  # (a copy of this term too: back from a restart, the leader's probe may have come
                # before we knew the leader, and an idle queue ships no ops that would show us the gap)
                self._ask_to_catch_up(group)
        elif proxy_of(vhost.queues, group.name) is None:
            # deposed, none elected yet: publishes through here are refused by another member until one is
            others = [name for name in group.members if name != self.name]
            if others:
                self._proxy(vhost, group, others[0])
        if leader:
            group.window.resend()  # what a leader has not confirmed goes to this one

    # -- this node's queue object ---------------------------------------------------------------

    def _proxy(self, vhost: VHost, group: Group, leader: str) -> None:
        """Clients here reach the queue through the leader's node."""
        if leader == self.name:
            return
        current = vhost.queues.get(group.name)
        proxy = proxy_of(vhost.queues, group.name)
        if proxy is not None:
            proxy.follow(self.cluster.peer(leader))
            return
        record = group.record
        queue = RemoteQueue(record.name, vhost.name, True, False, record.arguments,
                            *queue_types.declared(record.arguments, record.name, vhost.name), self.cluster.peer(leader))
        queue.members = group.members
        queue.publishes = group.window
        queue.recheck = lambda: self._recheck(group)
        queue.leads = lambda: group.leader == queue.peer.name
        self._swap(vhost, current, queue)

    def _promote(self, vhost: VHost, group: Group) -> None:
        """This node leads: its copy becomes the queue clients use, and the followers are sent snapshots."""
        record = group.record
        kind, args = queue_types.declared(record.arguments, record.name, vhost.name)
        queue = kind.new(record.name, vhost.name, True, None, False, record.arguments, args, self.broker)
        queue.index_id = group.index_id
        self.broker.attach(queue, True)
        queue.members = [self.name] + [name for name in group.members if name != self.name]
        self.broker.replicas.recover_queue(queue)
        group.replicator = queue.replicator = OpLogShipper(self, group, queue, group.term, group.applied)
        queue.unreached = lambda: self._unreached(group)
        queue.start(group.state, handover=True)
        proxy = proxy_of(vhost.queues, group.name)
        if proxy is not None:  # (a basic.get waiting on it is answered here: ``RemoteQueue.fetch``)
            proxy.replaced = True
        self._swap(vhost, vhost.queues.get(group.name), queue)
        log.info("%s leads %s (term %d, %d messages)", self.name, group.key, group.term, queue.message_count)

    def _demote(self, group: Group) -> None:
        """Deposed: the queue object here takes nothing more (its storage is the copy's now); the proxy that
        replaces it (``_proxy``) takes its bindings and its consumers, which the new leader takes back."""
        replicator, group.replicator = group.replicator, None
        if replicator is None:  # (it led: it has one)
            return
        window = group.window
        for confirm, seq, op in replicator.stop():  # sent again to the next leader by the node they came from
            if isinstance(confirm, Publish):  # (this node's window: it sends them again at ``_follow``)
                continue
            if isinstance(confirm, PeerSession):  # (another node's: its window sends them to the leader we name)
                confirm.moved(seq, group.leader, group.term)
            elif op is None or op.enqueuer != window.id:  # (not made here: no window's to send again)
                confirm.remote_confirmed(seq, True)
            else:
                if op.message.body is None:
                    self.broker.load_body(op.message)
                window.adopt(op.publish, Relayed(confirm, seq), op.message)
        replicator.queue.detach()
        log.info("%s no longer leads %s", self.name, group.key)

    def _swap(self, vhost: VHost, old: Any, new: Any) -> None:
        if old is not None:
            self.broker.replace_queue(vhost, old, new)
        else:
            self.broker.add_remote_queue(vhost, new)

    # -- links ---------------------------------------------------------------------------------

    def peer_up(self, name: str) -> None:
        """A link came up: a leader sends that follower a snapshot; a follower of that leader without this
        term's snapshot asks for one (what either sent before the other knew the term was ignored)."""
        if name in self._reach:
            self._reach[name] = asyncio.get_running_loop().time() + quorum_queue.HANDOVER_GRACE
        for group in self.groups.values():
            if group.replicator is not None:
                group.replicator.peer_up(name)
            elif group.leader == name:
                group.window.resend()  # what the leader has not answered, over the new link
                vhost = self.broker.vhosts.get(group.vhost)
                proxy = proxy_of(vhost.queues, group.name) if vhost is not None else None
                if proxy is not None and proxy.peer.name == name:
                    proxy.attach_waiting()
                if group.index_id:
                    self._ask_to_catch_up(group)

    def _unreached(self, group: Group) -> bool:
        """A member's link fell silent and it is still out of reach, or came back within ``HANDOVER_GRACE`` (from
        when this is first asked, if one of its links fell silent after another came back)."""
        now = asyncio.get_running_loop().time()
        unreached = False
        for member in group.members:
            until = self._reach.get(member, 0.0)
            if until > now and member != self.name:
                if until == math.inf and self.cluster.peer(member).up:
                    until = self._reach[member] = now + quorum_queue.HANDOVER_GRACE
                unreached = True
        return unreached

    def peer_down(self, name: str, silent: bool = False) -> None:
        """A link dropped: a leader stops shipping to that follower; if the other end closed it (its node or
        host went down), the followers of that leader revoke its lease, so that its queues elect a leader now
        rather than when the lease lapses.  A link closed here because it fell ``silent`` revokes nothing: the
        leader may be alive with only our link to it cut (an asymmetric cut), and its lease, shorter than the
        heartbeats' silence, has lapsed by now if it is not.  A leader whose last link to a majority falls silent
        steps down if its lease is sure (``_step_down``)."""
        if silent:
            self._reach[name] = math.inf
        else:  # (its node went: so did its consumers)
            self._reach.pop(name, None)
        leases = set()
        for group in self.groups.values():
            if group.replicator is not None:
                group.replicator.peer_down(name)
                if silent and self.lease_sure and self._cut_off(group):
                    self._step_down(group)
            elif group.leader == name and group.index_id and group.leader_lease and not silent:
                leases.add(group.leader_lease)
        for lease in leases:
            asyncio.get_running_loop().create_task(self._revoke(lease, name))

    def _cut_off(self, group: Group) -> bool:
        """This node's links reach no majority of the group's members, and one of those it misses fell silent
        (members whose nodes went down, their links closed by the other end, leave nobody else to lead)."""
        return (not self._reaches_majority(group)
                and any(self._reach.get(member) == math.inf for member in group.members))

    def _step_down(self, group: Group) -> None:
        """A leader cut off from its followers (``_cut_off``) while its lease is sure: cut from them though not from
        etcd, it would keep its key and the queue would confirm nothing until the cut heals.  Its key goes, if it
        is still this term's, and the members that reach one another elect a leader (it stands in no election
        until it reaches a majority again).  A leader whose lease is not sure when its links fall silent (cut
        from etcd as well, or etcd away) leads on: its key lapses with its lease if etcd is there for the others,
        and if etcd is away nobody can be elected, so a leader that stepped down left the queue with none after
        the cut healed, until etcd was back (nemesis seed 266: a 13 s confirm gap for a 5.7 s cut, etcd
        restarting).  Should its lease be sure again while it is still cut off, it steps down then
        (``_refresh``)."""
        log.warning("%s reaches no majority of %s's members: no longer leading", self.name, untrusted(group.key))
        term = group.term
        self._follow(group, "", 0)
        asyncio.get_running_loop().create_task(self._release_term(group, term))

    async def _release_term(self, group: Group, term: int) -> None:
        """Delete the queue's leader key if it is still the one of ``term`` (a later term's is another's)."""
        full = LEADERS + group.key.encode()
        ops = self.client.transactions
        while self.groups.get(group.key) is group:
            try:
                await self.client.transaction(compare=[ops.create(full) == term], success=[ops.delete(full)],
                                              failure=[])
                return
            except aetcd.ClientError as exc:  # (etcd away: our lease lapses, with the key, if it stays so)
                log.debug("releasing %s: %s; trying again", untrusted(group.key), exc)
                await asyncio.sleep(ELECTION_RETRY)

    async def _revoke(self, lease: int, holder: str = "") -> None:
        """Revoke ``lease`` (gone already: nothing to do).  Etcd out of reach, again every ``ELECTION_RETRY`` for as
        long as the node of its ``holder`` stays down and a queue here still has its leader under it: etcd gives
        every lease its whole TTL anew when it restarts, so a leader killed while etcd was away held its queues'
        keys one lease longer after etcd's return, with no leader to confirm anything (nemesis seed 173: a
        12 s gap, 3.9 s of it after etcd was back)."""
        while True:
            try:
                await self.client.revoke_lease(lease)
                return
            except aetcd.ClientError as exc:
                log.debug("revoking lease %x: %s", lease, exc)
                if "not found" in str(exc) or not self._revoking(lease, holder):
                    return
            await asyncio.sleep(ELECTION_RETRY)
            if not self._revoking(lease, holder):
                return

    def _revoking(self, lease: int, holder: str) -> bool:
        """A revoke of ``holder``'s ``lease`` is still worth trying: its node is still down, and a queue here
        still follows a leader under that lease."""
        peer = self.cluster.peers.get(holder)
        return (peer is not None and not peer.up
                and any(group.leader_lease == lease for group in self.groups.values()))

    def _ask_to_catch_up(self, group: Group, tries: int = CATCH_UP_TRIES) -> None:
        """Following a leader (new, or newly heard of): it sends what we miss of its log, or its queue whole.  Asked
        again while our copy has not moved (``tries`` times, ``CATCH_UP_RETRY`` apart): the request, or its answer,
        may have been lost (a link just up), and an idle queue ships no ops that would show us the gap."""
        peer = self.cluster.peers.get(group.leader)
        if peer is not None and peer.up and peer.link is not None:
            peer.link.send(link.REPLICATED, *self._catch_up_request(group, group.term))
        self._catch_up_again(group, tries)

    def _catch_up_again(self, group: Group, tries: int = CATCH_UP_TRIES) -> None:
        """Ask to catch up again in ``CATCH_UP_RETRY`` if our copy has not moved by then, nor a snapshot come in
        further (see _ask_to_catch_up): our copy stands where it stood until a snapshot's end, and asked again
        meanwhile, the leader would start another once it had sent this one."""
        if tries <= 0:
            return
        asked = self._progress(group)

        def again() -> None:
            if (self.groups.get(group.key) is group and group.replicator is None
                    and self._progress(group) == asked):
                self._ask_to_catch_up(group, tries - 1)

        asyncio.get_running_loop().call_later(CATCH_UP_RETRY, again)

    @staticmethod
    def _progress(group: Group) -> tuple:
        """Where a follower's copy stands, and how far a snapshot coming into it has come."""
        incoming = group.incoming
        return (group.leader, group.term, group.position,
                (incoming.term, incoming.at, incoming.frames) if incoming is not None else None)

    @staticmethod
    def _catch_up_request(group: Group, term: int) -> tuple[bytes, ...]:
        """Where the copy stands; a whole one's also says what it holds (``Diverged``: a leader whose log it left
        sends only what it lacks)."""
        key = group.key.encode()
        applied_term, applied = group.position
        head = ACKED.pack(term, applied, applied_term, 1, len(key))
        if not group.whole or not applied_term:
            return head, key
        return head, key, ANNOTATED.pack(group.annotated), machine.encode_state(group.state)

    def annotated(self, key: str, index: int) -> None:
        """An op at ``index`` annotated rows of the queue's copy: kept (LMDB syncs it now, before the group commit
        that holds the rows), so that no leader takes them for its own after a restart either."""
        group = self.groups[key]
        group.annotated = index
        saved = self.broker.store.get(REPLICA, group.key) or {"index_id": group.index_id}
        self.broker.store.put(REPLICA, group.key, {**saved, "annotated": index})

    def replicate(self, session: "PeerSession", payload: bytes) -> None:
        """A leader's ops for our copy: applied, positioned, and answered once fsynced."""
        term, first, size = HEAD.unpack_from(payload)
        pos = HEAD.size
        key = payload[pos:pos + size].decode()
        pos += size
        group = self.groups.get(key)
        if group is None or not group.index_id:
            return
        sender = session.link.peer_name
        if term > group.term and group.replicator is not None:  # we lead, and a later term's leader ships ops
            # (only the member that won its claim does): deposed while etcd was out of our reach, we step down
            # now rather than once etcd answers
            log.info("%s leads %s in term %d, as its ops say: no longer leading", sender, key, term)
            self._follow(group, "", 0)
            return
        if term != group.term or group.leader != sender:  # fenced: not the leader we follow
            log.debug("ops for %s from %s in term %d ignored (following term %d)", key, session.link.peer_name,
                      term, group.term)
            return
        persistence = self.broker.persistence
        end = len(payload)
        marker = payload[pos] if pos < end else 0
        incoming = group.incoming
        if marker in (RESET_OP, DIFF_OP) or (marker == MORE_OP and incoming is not None and (
                incoming.term, incoming.at) == (term, first)):  # a snapshot, the queue as it is at index ``first``
            self._take_snapshot(group, term, first, payload, pos)
            return
        replaced = 0  # the copy a snapshot's end replaces
        if marker == REPLAY_OP and incoming is not None and (incoming.term, incoming.at + 1) == (term, first):
            replaced = self._install(group, incoming)  # its end: the ops since then follow, on the copy it makes
        # an earlier term's ops the leader applied, which continue our copy if it is whole and stands where they
        # start, at an op of the term they follow (else we ask to catch up, as for ops we miss)
        continued = marker == CONTINUE_OP
        ops_term = follows = term  # the term of the frame's ops, and that of the op they follow
        if continued:
            _, follows, ops_term = CONT.unpack_from(payload, pos)
            if first <= group.applied:  # an answer to an earlier request of ours: moved on
                return
        if (marker == ADOPT_OP and first == group.applied + 1
                and group.position[0] == MARK.unpack_from(payload, pos)[1]):  # our copy is where this term started
            group.applied_term = term
        elif pos < end and marker < ENTRY_OP and first <= group.applied and group.applied_term == term:
            # ops of our term, the first of which we have: a catch-up's log overlapping what was shipped meanwhile
            # (a term's op at an index is the same wherever it comes from)
            rest = skip(payload, pos, group.applied + 1 - first)
            if rest is None:  # all of them: nothing to do (asking to catch up again would only overlap again)
                return
            pos, first = rest, group.applied + 1
        if first != group.applied + 1 or (group.position[0] if continued else group.applied_term) != follows:
            # not in step: we missed ops of this term, or our copy is of an earlier term (it may hold ops this
            # leader never had), or this is the rest of a snapshot we do not take (begun before our restart)
            now = asyncio.get_running_loop().time()
            # once, the answer being on its way behind these; again after a while (the leader was not leading
            # yet when the request came, or it was lost)
            if group.asked[:2] != (term, group.applied) or now - group.asked[2] > CATCH_UP_RETRY:
                group.asked = (term, group.applied, now)
                log.info("ops for %s from %d, ours end at %d: asking to catch up", key, first, group.applied)
                session.link.send(link.REPLICATED, *self._catch_up_request(group, term))
                self._catch_up_again(group)
            return
        if group.incoming is not None:  # our copy moved on by other means (a catch-up from the log)
            self._discard_incoming(group)
        index_id = group.index_id
        bounds: list[int] = []
        annotated: list[int] = []
        try:
            group.state, count = apply_ops(group.state, self.broker.replicas, index_id, payload, pos, first, bounds,
                                           annotated=annotated)
        except STORAGE_ERRORS as exc:
            self._unstored(group, exc)
            return
        if annotated:
            self.annotated(group.key, annotated[-1])
        group.applied = first + count - 1
        group.applied_term = ops_term
        group.history.extend(ops_term, first, payload, bounds)
        self.broker.replicas.position(index_id, *group.position, group.state)
        if replaced:  # (only now: a commit with its rows gone but its position kept would make it the copy)
            self.broker.persistence.index.forget_position(replaced)
            self.broker.replicas.clear(replaced)
        if CHECKS:
            group.unchecked += count
            if group.unchecked * CHECK_SHARE >= group.state.messages + len(group.state.dead):
                check_copy(group.state, self.broker.replicas, index_id, payload, pos, group.unchecked)
                group.unchecked = 0
        group.acks.append((persistence.batch, session, term, group.applied))
        persistence.waiters.add(self)

    def _take_snapshot(self, group: Group, term: int, first: int, payload: bytes, pos: int) -> None:
        """A snapshot's frame, its start or more of its rows, goes into the spare (``IncomingSnapshot``): our copy
        neither moves nor answers until it ends.  A DIFF's start, made for our copy as it stands, is followed by
        our copy's rows the leader does not send (``_keep_rows``)."""
        kept = 0  # (a DIFF's: our entries below it that the state holds are ours)
        if payload[pos] == DIFF_OP:
            _, _, kept, *made_for = DIFF.unpack_from(payload, pos)
            if tuple(made_for) != group.position or not group.whole:  # (our copy moved since: a request of ours
                # answered late): no snapshot begun before takes its rows; they show us a gap, and we ask again
                self._discard_incoming(group)
                return
        if payload[pos] in (RESET_OP, DIFF_OP):
            if not group.spare:
                group.spare = self.broker.next_index_id()
                saved = self.broker.store.get(REPLICA, group.key) or {"index_id": group.index_id}
                # (LMDB syncs it now: before the group commit that holds the spare's first rows)
                self.broker.store.put(REPLICA, group.key, {**saved, "spare": group.spare})
            group.incoming = IncomingSnapshot(term, first)  # (its Restore clears what a snapshot begun before left)
        incoming = group.incoming
        assert incoming is not None  # (a MORE frame of it)
        incoming.frames += 1
        try:
            incoming.state, _ = apply_ops(incoming.state, self.broker.replicas, group.spare, payload, pos, first,
                                          spare=incoming.rows)
            if kept:
                self._keep_rows(group, incoming, kept)
        except STORAGE_ERRORS as exc:  # (our copy is as it was: the snapshot's rows go, and we ask again)
            log.error("%s's disk refused a snapshot's rows of %s: %s; asking again", self.name,
                      untrusted(group.key), exc)
            self._discard_incoming(group)
            self._catch_up_again(group)

    def _unstored(self, group: Group, exc: Exception) -> None:
        """The disk refused rows of a frame (full, or failing) after our copy's state had taken its ops: the copy
        holds less than its state says.  Caught up from the log, it skipped the ops its state had seen and
        acknowledged them, rows it never stored (a confirm counted on it).  As a copy that lost messages at its
        restart, it acknowledges nothing more and takes a snapshot (``_lost_rows``), as a Ra member whose log
        write failed restarts from what its log holds."""
        log.error("%s's disk refused rows of %s: %s", self.name, untrusted(group.key), exc)
        self._lost_rows(group)
        self._ask_to_catch_up(group)

    def _keep_rows(self, group: Group, incoming: IncomingSnapshot, below: int) -> None:
        """A DIFF: our copy's rows of the entries below ``below`` that the snapshot's state holds go into the spare
        too, flagged and counted as that state says (their records shared, a reference more each).  Our log and
        the leader's agree up to where its term started, and neither annotated a row since (``catch_up``): an
        entry below ``below`` was made by an op both had, and its record is the same in both copies; no op since
        makes one there, so the leader's rows of the others are all it sends.  The copy itself is untouched: it
        stays whole until the snapshot's end makes the spare the copy (``_install``), and a restart before keeps
        it (``_open_copy``)."""
        theirs = incoming.state
        out = theirs.checked_out | theirs.dead.keys()
        index, store = self.broker.persistence.index, self.broker.persistence.store
        spare = group.spare
        top = -1
        index.commit()  # (our copy's rows as they stand: nothing of it waits, it has not moved since it asked)
        for seqs, rows in index.columns(group.index_id):
            under = int(np.searchsorted(seqs, below))
            for seq, msg_id, expiry, size in zip(seqs[:under].tolist(), rows["msg_id"][:under].tolist(),
                                                 rows["expiry"][:under].tolist(), rows["size"][:under].tolist()):
                held = seq in out
                if held or seq in theirs.ready:
                    store.add_ref(msg_id)
                    index.publish(spare, seq, msg_id, expiry, size, held, returns=theirs.counts.get(seq, 0),
                                  front=seq in theirs.returns)
                    top = seq
            if under < len(seqs):
                break
        incoming.rows.top = top
        self.broker.persistence.stage()

    def _install(self, group: Group, incoming: IncomingSnapshot) -> int:
        """A snapshot's end: its copy becomes this node's, standing where the snapshot's state stood, and the
        copy it replaces becomes the spare; the index id of that, whose rows the caller removes once the new
        copy's position is staged (its first: a restart before a commit holds it keeps the old copy,
        ``_open_copy``).  Its rows may hold annotations of any op up to its index (they are the leader's), which
        this copy never applied: it counts as annotated there."""
        old = group.index_id
        group.index_id, group.spare, group.state, group.incoming = group.spare, old, incoming.state, None
        for reason in machine.REASONS:  # (a snapshot's rows are flagged held; which wait as dead letters, its
            # state says)
            waiting = sorted(seq for seq, why in group.state.dead.items() if why == reason)
            if waiting:
                self.broker.replicas.wait(group.index_id, waiting, reason)
        group.applied_term, group.applied = incoming.term, incoming.at
        group.annotated = max(group.annotated, incoming.at)
        group.history.clear()
        saved = self.broker.store.get(REPLICA, group.key) or {}
        self.broker.store.put(REPLICA, group.key, {**saved, "index_id": group.index_id, "spare": old,
                                                   "annotated": group.annotated})
        return old

    def _discard_incoming(self, group: Group) -> None:
        """A snapshot that will not end (another term's leader, or our copy caught up otherwise): its rows go."""
        if group.incoming is not None:
            group.incoming = None
            self.broker.replicas.clear(group.spare)

    def _vouch(self, group: Group) -> None:
        """Keep where the copy stood whole, before it was found to lack messages: in an election until a
        snapshot makes it whole (a restart too), no member behind it may lead (``Group.ballot``)."""
        group.vouched = group.position
        saved = self.broker.store.get(REPLICA, group.key) or {"index_id": group.index_id}
        # (LMDB syncs it now: before the group commit that writes the copy's position of no term)
        self.broker.store.put(REPLICA, group.key, {**saved, "vouched": list(group.vouched)})

    def synced(self, batch: int) -> None:
        """A group commit is on disk: tell each leader how far our copies are durable."""
        waiting = False
        for group in self.groups.values():
            acks = group.acks
            sent = None
            while acks and acks[0][0] <= batch:
                sent = acks.pop(0)
            if sent is not None:  # (ops of a term over by now are answered to nobody: ``_acknowledge``)
                group.unsent = (sent[2], sent[1], sent[3])
                if not group.ballot_out:
                    self._acknowledge(group)
            waiting = waiting or bool(acks)
        if not waiting:
            self.broker.persistence.waiters.discard(self)

    def refused(self, batch: int) -> None:
        """A group commit failed: our copies are acknowledged to their leaders no more, as a member whose log
        write failed gives its vote to nothing after it; each group goes on with its other members."""
        for group in self.groups.values():
            group.acks.clear()
        self.broker.persistence.waiters.discard(self)

    def unwritable(self, key: str) -> None:
        """A group commit failed while this node leads the queue: its copy never counts toward a majority again
        (until the node restarts), so its followers alone confirmed nothing, nor refused anything, for as long
        as they were no majority (one follower of three out of reach, or the other of two).  As a Ra server
        whose log write fails restarts a follower (``ra_log_wal`` exits, its supervisors restart the servers,
        ``ra_log_sup`` and ``ra_system_sup`` being one_for_all), it steps down and stands in no election
        (``_standing``): the other members elect one of them, and what waited here goes there (``_demote``: this
        node's window sends its publishes again), as ``rabbit_fifo_client`` resends its pending commands to a
        new leader.  The only member of its group leads on: its publishes are refused (nacked) as a classic
        queue's."""
        group = self.groups.get(key)
        if group is None or group.replicator is None or group.members == [self.name]:
            return
        log.error("%s's disk failed: no longer leading %s", self.name, untrusted(key))
        term = group.term
        self._follow(group, "", 0)
        asyncio.get_running_loop().create_task(self._release_term(group, term))

    @staticmethod
    def _acknowledge(group: Group) -> None:
        """Tell the leader how far our copy is durable (``unsent``), if it still leads the term of that."""
        unsent, group.unsent = group.unsent, None
        if unsent is not None and unsent[0] == group.term:
            key = group.key.encode()
            unsent[1].link.send(link.REPLICATED, ACKED.pack(unsent[0], unsent[2], unsent[0], 0, len(key)), key)

    def replicated(self, peer_name: str, payload: bytes) -> None:
        """A follower's answer: how far its copy is durable, or that it wants a snapshot."""
        term, index, applied_term, catch_up, size = ACKED.unpack_from(payload)
        end = ACKED.size + size
        group = self.groups.get(payload[ACKED.size:end].decode())
        if group is None or group.replicator is None:
            return
        replicator = group.replicator
        if term > replicator.term:  # a later leader exists: we were deposed
            self._follow(group, "", 0)
        elif catch_up:
            theirs = None
            if len(payload) > end:  # (a whole copy's: what it holds)
                state, _ = machine.decode_state(payload, end + ANNOTATED.size)
                theirs = Diverged(applied_term, index, ANNOTATED.unpack_from(payload, end)[0], state)
            replicator.catch_up(peer_name, applied_term, index, theirs)
        elif term == replicator.term:
            replicator.acked(peer_name, index)

    # -- what the API shows --------------------------------------------------------------------

    def critical(self) -> list[tuple[str, str]]:
        """(vhost, name) of each queue this node is a member of that would be left without a majority of running
        members if it stopped: no more than a bare majority runs now (RabbitMQ's list_with_minimum_quorum)."""
        running = {name for name, up in self.cluster.nodes() if up} | {self.name}
        return [(group.vhost, group.name) for group in self.groups.values() if self.name in group.members
                and sum(1 for m in group.members if m in running) <= len(group.members) // 2 + 1]

    def lag(self) -> dict[str, dict[str, int]]:
        """Per queue led here: how many ops each follower has yet to make durable."""
        return {group.key: group.replicator.lag for group in self.groups.values() if group.replicator is not None}

