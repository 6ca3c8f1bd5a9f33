"""A quorum queue's log: its changes as ops on the wire, the leader's side that ships them, and how a
follower applies them to its copy.

The ops are the queue's changes — an entry put (with its message), marked delivered, moved to the back when
it comes back (with its delivery count), removed — numbered by an index within the leader's term.  The
leader (:class:`Replicator`) stages a turn's ops and ships them in one ``REPLICATE`` frame per follower; it
keeps its term's latest ops (``LOG_BYTES``) to catch up a follower that missed a few, and sends a snapshot
(a reset, then every entry, ready or unacked) to one that missed more or whose copy is of another term —
unless that copy is where the leader's own stood when it took over (a failover's usual case: the members
left were in step), which the leader's term then adopts as it is.
A follower applies ops with :func:`apply` to its own message store and queue index.  Who leads, and which
follower takes what, is :mod:`quorum`'s business.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Protocol

from amqp_server.message import Message
from amqp_server.quorum_queue import QuorumQueue

from . import link

if TYPE_CHECKING:
    from amqp_server.persistence import Persistence
    from amqp_server.ports import ConfirmSink
    from amqp_server.queue import Entry
    from amqp_server.broker import Broker

    from .peer import Peer

log = logging.getLogger("warren.forwarder.quorum_log")

HEAD = struct.Struct(">QQH")  # term, index of the first op, queue key length; then the key, then ops
OP = struct.Struct(">BQ")  # kind, seq
PUT = struct.Struct(">QBBHII")  # expiry, delivered, returns, route, header and body lengths; then those bytes
MOVE = struct.Struct(">QI")  # after a MOVED op (seq: the old one): the new seq, how often the entry came back
# term followed, durable index, the term of the op at that index, wants to catch up, queue key length; then the key
ACKED = struct.Struct(">QQQBH")
# MORE: the snapshot goes on; REPLAY: the ops since the snapshot began, applied idempotently as it was (the
# snapshot is whole once one comes); ADOPT (seq: a term): a copy at that term and the frame's index before
# ``first`` is the new leader's own at the start of its term, so it follows on with no snapshot
PUT_OP, DELIVERED_OP, REMOVE_OP, RESET_OP, MORE_OP, MOVED_OP, REPLAY_OP, ADOPT_OP = 1, 2, 3, 4, 5, 6, 7, 8
SNAPSHOT_CHUNK = 4096  # entries per frame of a snapshot (and ops per frame of a catch-up)
LOG_BYTES = 64 << 20  # a leader keeps its latest ops up to this size, to catch up a follower that missed few



def _encode_put(entry: "Entry", delivered: bool, returns: int = 0) -> bytes:
    message = entry.message
    return b"".join((OP.pack(PUT_OP, entry.seq), PUT.pack(entry.expiry, delivered, min(returns, 255),
                                                           len(message.route), len(message.header),
                                                           len(message.body)),
                     message.route, message.header, message.body))


@dataclass
class Follower:
    """A follower as its leader sees it."""

    name: str
    joined: bool = False  # in step: it gets every op as it is shipped
    match: int = 0  # the highest index it has durably
    snapshot: asyncio.Task | None = None  # a snapshot being sent (it is not in step until it ends)


class Group(Protocol):
    """A replicated queue as its leader's replicator sees it (``quorum.Group``): its members, and where the leader's
    own copy stands."""

    members: list[str]
    index_id: int
    applied_term: int
    applied: int

    @property
    def key(self) -> str: ...

    @property
    def position(self) -> tuple[int, int]: ...


class Cluster(Protocol):
    """The other nodes, by name (``cluster.Cluster``)."""

    @property
    def peers(self) -> Mapping[str, Peer]: ...


class Groups(Protocol):
    """This node's part in the replicated queues (``quorum.QuorumGroups``), as a replicator reaches the node."""

    @property
    def name(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def cluster(self) -> Cluster: ...


class Replicator:
    """The leader's side of one queue: stages its changes as log ops and ships them to the followers."""

    def __init__(self, groups: Groups, group: Group, queue: QuorumQueue, term: int, index: int) -> None:
        self.groups = groups
        self.group = group
        self.queue = queue
        self.term = term
        self.index = index  # the last op's index
        self.followers = {name: Follower(name) for name in group.members if name != groups.name}
        self.base = group.position  # where the copy this term starts from stood: a follower's there too adopts it
        self.ops: list[bytes] = []
        self.first = index + 1  # index of ops[0]
        self.log: deque[tuple[int, bytes]] = deque()  # (index, op): this term's latest ops, LOG_BYTES at most
        self.log_bytes = 0
        self.pending: list[tuple[int, "ConfirmSink", int]] = []  # (index, sink, its seq), oldest first
        self.committed = index
        self._scheduled = False
        for follower in self.followers.values():
            self.probe(follower)

    # -- what the queue does -------------------------------------------------------------------

    def enqueued(self, entry: "Entry", confirm: "ConfirmSink | None") -> None:
        self._op(_encode_put(entry, False))
        if confirm is not None and self.followers:
            self.pending.append((self.index, confirm, confirm.forwarded()))

    def delivered(self, seq: int) -> None:
        self._op(OP.pack(DELIVERED_OP, seq))

    def moved(self, old_seq: int, new_seq: int, returns: int) -> None:
        self._op(OP.pack(MOVED_OP, old_seq) + MOVE.pack(new_seq, returns))

    def removed(self, seq: int) -> None:
        self._op(OP.pack(REMOVE_OP, seq))

    def _op(self, op: bytes) -> None:
        self.index += 1
        self.ops.append(op)
        log_ = self.log
        log_.append((self.index, op))
        self.log_bytes += len(op)
        while self.log_bytes > LOG_BYTES:
            self.log_bytes -= len(log_.popleft()[1])
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self.ops:
            return
        frame = self._frame(self.first, self.ops)
        self.ops = []
        self.first = self.index + 1
        group = self.group  # the leader's own copy is where it stands too, should it run an election later
        group.applied_term, group.applied = self.term, self.index
        self.groups.broker.persistence.replica_position(group.index_id, self.term, self.index)
        for follower in self.followers.values():
            if follower.joined:
                self._send(follower, frame)

    def _frame(self, first: int, ops: list[bytes]) -> list[bytes]:
        key = self.group.key.encode()
        return [HEAD.pack(self.term, first, len(key)), key, *ops]

    def _send(self, follower: Follower, parts: list[bytes]) -> bool:
        peer = self.groups.cluster.peers.get(follower.name)
        if peer is None or not peer.up or peer.link is None:
            follower.joined = False
            return False
        peer.link.send(link.REPLICATE, *parts)
        peer.link.flush()  # now: what an op records (a delivery) must not reach a client before the op leaves
        return True

    # -- followers -----------------------------------------------------------------------------

    def join(self, follower: Follower) -> None:
        """Send the follower a snapshot in the background (see ``_snapshot``); it is out of step until then."""
        self._stop_snapshot(follower)
        follower.joined = False
        self.flush()  # what is staged goes to the others; the snapshot covers it for this one
        follower.snapshot = task = asyncio.get_running_loop().create_task(self._snapshot(follower))
        task.add_done_callback(lambda _: self._snapshot_ended(follower, task))

    @staticmethod
    def _snapshot_ended(follower: Follower, task: asyncio.Task) -> None:
        """Sent, or given up (its link dropped: it asks again, or is probed, when the link is back)."""
        if follower.snapshot is task:
            follower.snapshot = None

    async def _snapshot(self, follower: Follower) -> None:
        """The queue, a chunk per frame and per loop turn (so that nobody waits on a deep queue's): a reset,
        every ready entry as it is when its chunk is read, every unacked one at the end; then the ops
        since the start again.  As the queue changes meanwhile, the follower applies all this idempotently
        (an entry it has is kept), which brings it where replaying those ops on the start's state would."""
        queue = self.queue
        start = self.index
        log.info("%s takes a snapshot of %s: %d messages", follower.name, self.group.key,
                 queue.message_count + len(queue.held))
        returns = queue.state.counts
        ops = [OP.pack(RESET_OP, 0)]
        for batch in queue.read_range(0, 1 << 63, SNAPSHOT_CHUNK):  # entries that arrive meanwhile too
            ops.extend(_encode_put(entry, False, returns.get(entry.seq, 0)) for entry in batch)
            if len(ops) >= SNAPSHOT_CHUNK:
                if not self._send(follower, self._frame(start, ops)):
                    return
                ops = [OP.pack(MORE_OP, 0)]
                await asyncio.sleep(0)
        ops.extend(_encode_put(entry, True, returns.get(entry.seq, 0))
                   for entry in sorted(queue.held.values(), key=lambda e: e.seq))
        if not self._send(follower, self._frame(start, ops)):
            return
        self.flush()
        log_ = self.log
        if self.index > start and (not log_ or log_[0][0] > start + 1):  # the log lost ops meanwhile: again
            asyncio.get_running_loop().call_soon(self.join, follower)
            return
        missed = [op for index, op in log_ if index > start]
        for first in range(0, max(len(missed), 1), SNAPSHOT_CHUNK):  # one at least: the follower's copy is whole
            chunk = [OP.pack(REPLAY_OP, 0), *missed[first:first + SNAPSHOT_CHUNK]]
            if not self._send(follower, self._frame(start + 1 + first, chunk)):
                return
        follower.joined = True

    def _stop_snapshot(self, follower: Follower) -> None:
        if follower.snapshot is not None:
            follower.snapshot.cancel()
            follower.snapshot = None

    def probe(self, follower: Follower) -> None:
        """An empty frame at the next index: a follower in step takes it, one that is not asks to catch up
        (with its position, so that it gets the log it missed or, failing that, a snapshot)."""
        if follower.snapshot is not None:
            return  # it is brought into step by the snapshot
        self.flush()
        follower.joined = self._send(follower, self._frame(self.index + 1, []))

    def peer_up(self, name: str) -> None:
        follower = self.followers.get(name)
        if follower is not None and not follower.joined:
            self.probe(follower)

    def regroup(self, members: list[str]) -> None:
        """The group changed: followers that joined get a snapshot, those that left nothing more."""
        for name in list(self.followers):
            if name not in members:
                self._stop_snapshot(self.followers.pop(name))
        for name in members:
            if name != self.groups.name and name not in self.followers:
                self.probe(self.followers.setdefault(name, Follower(name)))

    def catch_up(self, name: str, applied_term: int, applied: int) -> None:
        """A follower asks to catch up from ``applied``: the log from there if this term's log still has it (a
        copy where this term started from adopted first), else a snapshot."""
        follower = self.followers.get(name)
        if follower is None or follower.snapshot is not None:  # (what it asks for is on its way)
            return
        log_ = self.log
        adopt = applied_term > 0 and (applied_term, applied) == self.base
        if (applied_term != self.term and not adopt) or applied > self.index or (applied < self.index and (
                not log_ or log_[0][0] > applied + 1)):
            self.join(follower)
            return
        follower.joined = False  # what is staged goes to the others now, to this one with the rest below
        self.flush()
        missed = [op for index, op in log_ if index > applied]
        log.info("%s catches up on %s from the log: %d ops%s", name, self.group.key, len(missed),
                 f" (its copy of term {applied_term} adopted)" if adopt else "")
        follower.joined = True
        if adopt:  # its copy as it stands becomes this term's
            follower.joined = self._send(follower, self._frame(applied + 1, [OP.pack(ADOPT_OP, applied_term)]))
        for start in range(0, len(missed), SNAPSHOT_CHUNK):
            frame = self._frame(applied + 1 + start, missed[start:start + SNAPSHOT_CHUNK])
            follower.joined = follower.joined and self._send(follower, frame)

    def peer_down(self, name: str) -> None:
        follower = self.followers.get(name)
        if follower is not None:
            follower.joined = False
            self._stop_snapshot(follower)

    def acked(self, name: str, index: int) -> None:
        follower = self.followers.get(name)
        if follower is None:
            return
        follower.match = max(follower.match, index)
        matches = sorted([self.index] + [f.match for f in self.followers.values()], reverse=True)
        committed = matches[len(self.group.members) // 2]  # the highest index a majority has
        if committed <= self.committed:
            return
        self.committed = committed
        pending = self.pending
        done = 0
        while done < len(pending) and pending[done][0] <= committed:
            _, sink, seq = pending[done]
            sink.remote_confirmed(seq, False)
            done += 1
        del pending[:done]

    @property
    def lag(self) -> dict[str, int]:
        return {f.name: self.index - f.match for f in self.followers.values()}

    def stop(self) -> None:
        """Deposed: what waits for the group is refused (nack), never confirmed later."""
        for follower in self.followers.values():
            self._stop_snapshot(follower)
        pending, self.pending = self.pending, []
        for _, sink, seq in pending:
            sink.remote_confirmed(seq, True)


def apply(persistence: "Persistence", index_id: int, payload: bytes, pos: int) -> int:
    """A follower applies the ops of ``payload`` from ``pos`` to its copy (``index_id``); returns how many
    log ops that was (a frame's leading marker is not one).  A snapshot's frames after its first, and a
    replay, are applied idempotently: an entry the copy has is kept as it is."""
    count = 0
    end = len(payload)
    idempotent = pos < end and payload[pos] in (MORE_OP, REPLAY_OP)
    if idempotent or (pos < end and payload[pos] == ADOPT_OP):
        pos += OP.size
    while pos < end:
        kind, seq = OP.unpack_from(payload, pos)
        pos += OP.size
        if kind == PUT_OP:
            expiry, delivered, returns, route_len, header_len, body_len = PUT.unpack_from(payload, pos)
            pos += PUT.size
            route = payload[pos:pos + route_len]
            pos += route_len
            header = payload[pos:pos + header_len]
            pos += header_len
            body = payload[pos:pos + body_len]
            pos += body_len
            if not (idempotent and persistence.index.has(index_id, seq)):
                persistence.replica_put(index_id, seq, Message("", "", route, header, body), expiry,
                                        bool(delivered), returns)
        elif kind == DELIVERED_OP:
            persistence.replica_delivered(index_id, seq)
        elif kind == MOVED_OP:
            new_seq, returns = MOVE.unpack_from(payload, pos)
            pos += MOVE.size
            persistence.replica_move(index_id, seq, new_seq, returns)
        elif kind == REMOVE_OP:
            persistence.replica_remove(index_id, seq)
        elif kind == RESET_OP:
            persistence.replica_clear(index_id)
        count += 1
    return count
