"""A quorum queue's log: its state machine's ops on the wire, the leader's side that ships them, and how a
follower applies them to its copy.

The ops are :mod:`amqp_server.queues.quorum_machine`'s, numbered by an index within the leader's term, and go on the
wire as :mod:`amqp_server.queues.quorum_ops` encodes them.  The leader's queue applies each to its state and hands
it to its :class:`OpLogShipper`, which encodes it, stages a turn's ops and ships them in one ``REPLICATE`` frame per
follower; it keeps the latest ops its copy applied, of its term and of earlier ones (``History``, ``LOG_BYTES``, and
the node's copies together ``NODE_LOG_BYTES``: ``LogBudget``), to
catch up a follower that missed a few (a copy of an earlier term these ops pass through too; one where the leader's
own stood when it took over, a failover's usual case, its term adopts as it is), and sends a snapshot to one that
missed more or whose copy holds ops it never had.  A snapshot is the state as it stood at an index (small: it does
not grow with the queue's depth), the rows of the queue's entries as they are when each chunk is read, then the ops
since that index.  A follower applies the ops to its own copy of the state with :func:`apply`, and carries out their
storage effects on its message store and queue index. Who leads, and which follower takes what, is :mod:`groups`'s
business.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import sys
import time
import weakref
from array import array
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Protocol

from amqp_server.queues import quorum_machine as machine
from amqp_server.queues.quorum_machine import CHECKS
from amqp_server.queues.quorum_ops import ENQUEUE_FROM_OP, ENQUEUE_OP, LogOp, decode, encode, enqueue_fields
from amqp_server.queues.quorum_queue import QuorumQueue

from ..peers import node_link as link
from ..peers.remote_queue import Window

if TYPE_CHECKING:
    from queue_index import IndexEntry

    from amqp_server.queues.replica_store import ReplicaStore
    from amqp_server.ports import ConfirmSink
    from amqp_server.queues.queue import Entry
    from amqp_server.broker import Broker

    from ..peers.peer import Peer

log = logging.getLogger("warren.forwarder.quorum_log")

HEAD = struct.Struct(">QQH")  # term, index of the first op, queue key length; then the key, then ops
# term followed, durable index, the term of the op at that index, wants to catch up, queue key length; then the key
ACKED = struct.Struct(">QQQBH")

# a snapshot's row, not an op (ops' kinds, ``quorum_ops``, are below it): seq, expiry, flags (``ROW_HELD``,
# ``ROW_FRONT``), times returned (its delivery count, of no bound: a byte kept 255 of a message returned 300 times),
# its body's size, record length; then the record
ENTRY = struct.Struct(">BQQBQII")
ENTRY_OP = 20
ROW_HELD = 1  # out of the ready list (checked out, or a waiting dead letter)
ROW_FRONT = 2  # ready, served first (``State.returns``)
# a frame's leading marker, not an op: kind, argument.  RESET (argument: the length of the state that follows):
# a snapshot starts, the state as it stood at the frame's index; MORE: its rows go on; REPLAY: the ops since
# the snapshot's index, their storage effects carried out idempotently (the rows are of later states); the
# snapshot is whole once one comes.  ADOPT (argument: a term): a copy at that term and at the frame's index
# before ``first`` is the new leader's own at the start of its term, so it follows on with no snapshot
MARK = struct.Struct(">BQ")
RESET_OP, MORE_OP, REPLAY_OP, ADOPT_OP = 30, 31, 32, 33
# CONTINUE (kind, the term of the copy's last op, the term of the frame's ops): ops of an earlier term the leader
# applied itself, which continue a copy that stands at ``first - 1`` in the first term
CONT = struct.Struct(">BQQ")
CONTINUE_OP = 34
# DIFF (kind, the state's length as RESET's, below, the follower's term and index): a snapshot for a copy whose
# log agrees with this one's up to where this term started (its own ops since were never this leader's): the
# follower keeps its rows of the state's entries below ``below`` that it has (``QuorumGroups._keep_rows``), and
# only the others come as rows; the state follows, then MORE and REPLAY frames as a snapshot's
DIFF = struct.Struct(">BQQQQ")
DIFF_OP = 35
# a catch-up request's tail (a whole copy's): the index of the last op that annotated a row of the copy, then
# its state (whose entries a DIFF need not send)
ANNOTATED = struct.Struct(">Q")
SNAPSHOT_CHUNK = 4096  # entries per frame of a snapshot (and ops per frame of a catch-up or a turn)
# bytes of ops (or a snapshot's rows) per frame, a larger one alone: a frame of many stays far below the link's
# ``MAX_FRAME`` (and a follower's loop turn short), however large the messages
FRAME_BYTES = 16 << 20
PROGRESS = 0.5  # seconds a leader goes on delivering while its ops wait for a majority (``allowance``)
UNCOMMITTED_DELIVERIES = 50  # deliveries a leader makes that no majority has yet: at most its consumers' prefetch,
# or this (``allowance``)
UNBOUNDED = sys.maxsize  # (a group of one: what it applies is committed)
LOG_BYTES = 64 << 20  # a copy keeps its latest ops up to this size, to catch up a follower that missed few
# and the node's copies keep this many together (``LogBudget``): 64 MiB each, a node holding copies of many queues of
# large messages kept gigabytes that only a lagging follower would ever read
NODE_LOG_BYTES = 256 << 20
# seconds after a follower is sent what it missed (a snapshot, or ops from the log) in which its request to catch up
# from before where that brings it is one it sent before the answer reached it (a second answer would send it all
# again: a second snapshot begun as the first arrives, or tens of thousands of ops twice); less than a follower's
# ``CATCH_UP_RETRY``, so that one that lost an answer is answered when it asks again
ANSWERED = 1.5
# (``CHECKS``, the tests') a follower walks its copy's rows whole (``check_copy``) once the ops it applied since the
# last walk are an eighth of its entries, a few rows' reading an op: walked after every frame, a deep copy held the
# loop for seconds in a turn of frames (the link reads up to 1,024), the leader heard nothing from it for 5 s and
# stepped down, and the queue had no leader
CHECK_SHARE = 8


def runs(ops: list[bytes]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of the runs of ``ops`` one frame each carries: at most ``SNAPSHOT_CHUNK`` ops and
    ``FRAME_BYTES`` bytes, an op larger than that alone.  None for no ops."""
    if len(ops) <= SNAPSHOT_CHUNK and sum(map(len, ops)) <= FRAME_BYTES:  # (a turn's ops: nearly always)
        if ops:
            yield 0, len(ops)
        return
    start = size = 0
    for i, op in enumerate(ops):
        if i > start and (size + len(op) > FRAME_BYTES or i - start >= SNAPSHOT_CHUNK):
            yield start, i
            start, size = i, 0
        size += len(op)
    yield start, len(ops)


def _by_size(sizes: list[int]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of the runs of entries whose bodies (of ``sizes``) come to about ``FRAME_BYTES``: what a
    snapshot reads into memory at once."""
    start = size = 0
    for i, body in enumerate(sizes):
        if i > start and size + body > FRAME_BYTES:
            yield start, i
            start, size = i, 0
        size += body
    if start < len(sizes):
        yield start, len(sizes)


def _entry(entry: "Entry", flags: int, returns: int) -> bytes:
    """A snapshot's row for ``entry``."""
    head, route, header, body = entry.message.payload()
    size = len(head) + len(route) + len(header) + len(body)
    return b"".join((ENTRY.pack(ENTRY_OP, entry.seq, entry.expiry, flags, returns, len(body), size), head,
                     route, header, body))


@dataclass
class SpareRows:
    """A snapshot's rows in the spare they come into, which its RESET empties: the highest seq written there so far.
    A row above it cannot be there yet, so it is written with no lookup; one at or below it may be (an entry read
    ready, then held by the time the held rows, the last, are read)."""

    top: int = -1


@dataclass
class Follower:
    """A follower as its leader sees it."""

    name: str
    joined: bool = False  # in step: it gets every op as it is shipped
    match: int = 0  # the highest index it has durably
    snapshot: asyncio.Task | None = None  # a snapshot being sent (it is not in step until it ends)
    rows: int = 0  # snapshot rows sent to it (all told: what a copy it could keep saves shows here)
    answered: tuple[int, float] = (0, 0.0)  # where what it was last sent to catch up brings it, and (loop time) when


class LogBudget:
    """What the node's copies keep of their latest ops (``History``), together at most ``limit`` bytes: once past
    it, every log longer than a common cap gives up its oldest ops down to that cap, the cap chosen so that all of
    them fit in seven eighths of the limit (the next trim comes an eighth of it later).  A follower that missed
    more than its leader's log holds gets a snapshot, as one that missed more than ``LOG_BYTES`` does."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = NODE_LOG_BYTES if limit is None else limit
        self.size = 0
        self.logs: weakref.WeakSet[History] = weakref.WeakSet()

    def shrink(self) -> None:
        logs = list(self.logs)
        sizes = sorted((log.size for log in logs), reverse=True)
        self.size = sum(sizes)  # (what a log dropped without ``clear`` held no longer counts)
        target = self.limit - self.limit // 8
        rest, cap = self.size, 0
        for i, size in enumerate(sizes):  # the first i + 1 logs capped, the others whole
            rest -= size
            cap = max(0, (target - rest) // (i + 1))
            if i + 1 == len(sizes) or cap >= sizes[i + 1]:
                break
        for log in logs:
            if log.size > cap:
                log.trim(cap)


class History:
    """The latest ops a copy applied, whoever led their terms (up to ``LOG_BYTES``), each with its term and index:
    a term's op at an index is the same wherever it was applied, so a copy that stands where these pass (an op
    of the term at its index, or at the next index the first op of a term that began there) is brought to this
    copy's state by the ops after it — after a change of leader too, with no snapshot.

    Kept as the batches they came in, ``[term, first index, source, bounds, ops trimmed]``: a leader's turn is
    its ops' own bytes (``source`` a list, ``bounds`` None), a follower's frame the frame itself with where each
    op starts and ends in it (``bounds``, an array), cut out only when a catch-up reads it.  (An object per op —
    a slice, or a tuple of where it lies — would be allocated for every message and walked by the garbage
    collector, hundreds of thousands of them in ``LOG_BYTES``.)"""

    def __init__(self, budget: LogBudget | None = None) -> None:
        self.batches: deque[list] = deque()  # the indexes in a row
        self.size = 0
        self.last = -1  # the index of the latest op kept (-1: none)
        self.budget = LogBudget() if budget is None else budget  # (the node's: ``QuorumGroups``)
        self.budget.logs.add(self)

    def add(self, term: int, first: int, ops: list[bytes]) -> None:
        """A leader's ops, each its own bytes, from index ``first`` on (a turn's, as they are shipped)."""
        if ops:
            self._add([term, first, ops, None, 0], len(ops), sum(map(len, ops)))

    def extend(self, term: int, first: int, frame: bytes, bounds: list[int]) -> None:
        """Ops of one frame, from index ``first`` on: ``bounds`` holds where each starts and ends in ``frame``."""
        if bounds:
            self._add([term, first, frame, array("Q", bounds), 0], len(bounds) // 2,
                      sum(bounds[1::2]) - sum(bounds[::2]))

    def _add(self, batch: list, count: int, size: int) -> None:
        if self.batches and self.last + 1 != batch[1]:  # (the copy moved by other means: a snapshot)
            self.clear()
        self.batches.append(batch)
        self.last = batch[1] + count - 1
        self.size += size
        budget = self.budget
        budget.size += size
        if self.size > LOG_BYTES:
            self.trim(LOG_BYTES)
        if budget.size > budget.limit:
            budget.shrink()

    @staticmethod
    def _span(batch: list, i: int) -> tuple[int, int]:
        """Where the batch's ``i``-th op lies in its source (a leader's: all of its own bytes)."""
        bounds = batch[3]
        return (0, len(batch[2][i])) if bounds is None else (bounds[2 * i], bounds[2 * i + 1])

    @staticmethod
    def _count(batch: list) -> int:
        return len(batch[2]) if batch[3] is None else len(batch[3]) // 2

    def trim(self, limit: int) -> None:
        """The oldest ops go, one by one, until the rest fit in ``limit`` bytes."""
        batches = self.batches
        before = self.size
        while self.size > limit and batches:
            batch = batches[0]
            start, end = self._span(batch, batch[4])
            self.size -= end - start
            batch[4] += 1
            if batch[4] == self._count(batch):
                batches.popleft()
        self.budget.size -= before - self.size
        if not batches:
            self.last = -1

    def clear(self) -> None:
        self.batches.clear()
        self.budget.size -= self.size
        self.size = 0
        self.last = -1

    def _first(self) -> int:
        """The index of the oldest op kept (past ``last`` if none)."""
        if not self.batches:
            return self.last + 1
        batch = self.batches[0]
        return batch[1] + batch[4]

    def _ops(self, index: int) -> Iterator[tuple[int, int, list, int]]:
        """(term, index, batch, position in it) of each op from ``index`` (kept) on."""
        for batch in self.batches:
            first, count = batch[1], self._count(batch)
            if first + count <= index:
                continue
            for i in range(max(index - first, batch[4]), count):
                yield batch[0], first + i, batch, i

    def after(self, index: int) -> list[tuple[int, int, bytes]] | None:
        """The ops after ``index``, up to the latest; None if the first of them is gone (or was never here)."""
        if not self.batches or self.last < index or self._first() > index + 1:
            return None
        ops = []
        for term, at, batch, i in self._ops(index + 1):
            if batch[3] is None:
                ops.append((term, at, batch[2][i]))  # (a leader's own op: the same bytes)
            else:
                start, end = self._span(batch, i)
                ops.append((term, at, batch[2][start:end]))
        return ops

    def passes(self, term: int, index: int) -> bool:
        """A copy that stands at (term, index) is at a state these ops pass through."""
        if term <= 0 or not self.batches:
            return False
        first = self._first()
        if not first - 1 <= index <= self.last:
            return False
        ops = [op[0] for op in itertools.islice(self._ops(max(index, first)), 2)]  # terms from there on
        at, following = (ops[0], ops[1] if len(ops) > 1 else 0) if index >= first else (0, ops[0])
        return at == term or following == term  # (the op at index, or the next: the first of a term begun there)


@dataclass
class Diverged:
    """What a whole copy asking to catch up says of itself (a request's tail, ``ANNOTATED``): where it stands,
    the index of the last op that annotated one of its rows, and its state (which entries it has rows of)."""

    term: int
    index: int
    annotated: int
    state: machine.State


def missing(ours: machine.State, theirs: machine.State, below: int) -> tuple[machine.SeqSet, set[int]]:
    """The entries of ``ours`` below seq ``below`` that ``theirs`` lacks: ready ones (as runs), and held ones."""
    has = theirs.checked_out.keys() | theirs.dead.keys()
    held = {seq for seq in ours.checked_out.keys() | ours.dead.keys()
            if seq < below and seq not in has and seq not in theirs.ready}
    ready = machine.SeqSet()
    other = list(theirs.ready.runs())
    i = 0
    for at, end in ours.ready.runs():
        end = min(end, below)
        while at < end:  # [at, end) less the runs of ``other``
            while i < len(other) and other[i][1] <= at:
                i += 1
            if i < len(other) and other[i][0] <= at:  # (theirs from here)
                at = other[i][1]
                continue
            stop = min(other[i][0] if i < len(other) else end, end)
            ready.add_run(at, stop)
            at = stop
    for seq in has:
        if seq in ready:
            ready.discard(seq)
    return ready, held


class ShippedGroup(Protocol):
    """A replicated queue as its leader's replicator sees it (``quorum.Group``): its members, where the leader's
    own copy stands, and the ops it applied last."""

    members: list[str]
    index_id: int
    applied_term: int
    applied: int
    annotated: int
    state: machine.State
    window: Window
    history: History

    @property
    def key(self) -> str: ...

    @property
    def position(self) -> tuple[int, int]: ...


class PeerNodes(Protocol):
    """The other nodes, by name (``cluster.Cluster``)."""

    @property
    def peers(self) -> Mapping[str, Peer]: ...


class Groups(Protocol):
    """This node's part in the replicated queues (``quorum.QuorumGroups``), as a replicator reaches the node."""

    @property
    def name(self) -> str: ...

    @property
    def lease_sure(self) -> bool: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def cluster(self) -> PeerNodes: ...

    def annotated(self, key: str, index: int) -> None: ...

    def unwritable(self, key: str) -> None: ...


class OpLogShipper:
    """The leader's side of one queue: stages its changes as log ops and ships them to the followers."""

    def __init__(self, groups: Groups, group: ShippedGroup, queue: QuorumQueue, term: int, index: int) -> None:
        self.groups = groups
        self.group = group
        self.queue = queue
        self.term = term
        self.index = index  # the last op's index
        self.followers = {name: Follower(name) for name in group.members if name != groups.name}
        self.base = group.position  # where the copy this term starts from stood: a follower's there too adopts it
        # no entry made since has a seq below this (the next seq of the state there, or less: one read from rows)
        self.base_seq = group.state.next_seq
        self.ops: list[bytes] = []
        self.first = index + 1  # index of ops[0]
        self.log = group.history  # this term's latest ops, after those the copy applied before
        # (enqueuer, seq) for a confirmed publish made here: this node's window's, so that the next leader takes it
        # once when the window sends it again there (``Window.adopt``)
        self.tag: Callable[[], tuple[int, int]] = group.window.take
        # (index, sink, its seq, the publish's Enqueue: None for one taken before), oldest first
        self.pending: list[tuple[int, "ConfirmSink", int, machine.Enqueue | None]] = []
        self.committed = 0  # the highest index a majority has durably, as their answers and our group commits tell
        # the last op before the members took their present set (this term's start, or a change since): the next
        # change waits until a majority of them has it (``regroup_agreed``)
        self.regrouped = index
        self.written = 0  # the highest index the leader's own copy has on disk (its group commits)
        self._writing: deque[tuple[int, int]] = deque()  # (group commit, the index it makes durable here)
        self.checkouts: deque[int] = deque()  # the indexes of deliveries (Checkout ops) past ``committed``
        # (the index a majority must have, what to call then): ``when_agreed``
        self._agreed_waiters: deque[tuple[int, Callable[[bool], None]]] = deque()
        # the seqs below it were made by ops a majority has, so every later leader's copy has them as here (a
        # consumer's delivery of one of them is taken back even if its checkout never reached one: ``adopt``);
        # (index, the state's next seq after it) of each batch of ops shipped since, to raise it by
        self.agreed_below = 0
        self._made: deque[tuple[int, int]] = deque([(index, self.base_seq)])  # (the copy the term starts from)
        # when a majority last answered, or ops began to wait for one; deliveries stopped since (``allowance``)
        self._progress = asyncio.get_running_loop().time()
        self._majority_at = self._progress  # when a majority last answered (``allowance``)
        self._stalled = False
        self._scheduled = False
        self._written_at(index)  # (the copy the term starts from may still wait for its group commit)
        for follower in self.followers.values():
            self.probe(follower)

    # -- what the queue does -------------------------------------------------------------------

    def append(self, op: LogOp, confirm: "ConfirmSink | None" = None) -> None:
        """The queue applied ``op``: it goes to the followers; ``confirm`` (an Enqueue's publish) is told once a
        majority has it."""
        self._op(encode(op))
        # (a copy diverged since an annotation keeps none of its rows: ``catch_up``)
        if isinstance(op, (machine.Return, machine.DeadLetter)) and op.annotations:
            self.groups.annotated(self.group.key, self.index)
        if isinstance(op, machine.Checkout) and self.followers:
            self.checkouts.append(self.index)
        if confirm is not None and self.followers:
            assert isinstance(op, machine.Enqueue)  # (only a publish is confirmed)
            self.pending.append((self.index, confirm, confirm.forwarded(), op))

    def confirm_later(self, confirm: "ConfirmSink") -> None:
        """A publish this queue has already (sent again by its window): confirmed once every op so far is on a
        majority, which the one that took it is among."""
        if self.followers:
            self.pending.append((self.index, confirm, confirm.forwarded(), None))

    def _op(self, op: bytes) -> None:
        if self.committed >= self.index:  # (the first op to wait for a majority)
            self._progress = asyncio.get_running_loop().time()
        self.index += 1
        self.ops.append(op)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
            self.groups.broker.persistence.due.add(self.flush)  # (or sooner: the rows of these ops are staged)

    def flush(self) -> None:
        self._scheduled = False
        self.groups.broker.persistence.due.discard(self.flush)
        if not self.ops:
            return
        ops, first = self.ops, self.first
        frames = [self._frame(first + start, ops[start:end]) for start, end in runs(ops)]
        self.log.add(self.term, first, ops)
        self._made.append((self.index, self.queue.state.next_seq))
        self.ops = []
        self.first = self.index + 1
        group = self.group  # the leader's own copy is where it stands too, should it run an election later
        group.applied_term, group.applied = self.term, self.index
        self.groups.broker.replicas.position(group.index_id, self.term, self.index, self.queue.state)
        self._written_at(self.index)
        for follower in self.followers.values():
            if follower.joined:
                for frame in frames:
                    self._send(follower, frame)

    def _written_at(self, index: int) -> None:
        """The leader's copy stands at ``index`` once the group commit staged now is on disk: until then it
        counts toward no majority, as a Raft leader counts its own log only once written (a confirm must
        survive a power loss of the members it counts, not only their processes' deaths)."""
        persistence = self.groups.broker.persistence
        persistence.stage()
        self._writing.append((persistence.batch, index))
        persistence.waiters.add(self)

    def synced(self, batch: int) -> None:
        """A group commit is on disk (``Persistence.waiters``): the leader's copy is durable as far as it covers."""
        writing = self._writing
        written = self.written
        while writing and writing[0][0] <= batch:
            written = writing.popleft()[1]
        if not writing:
            self.groups.broker.persistence.waiters.discard(self)
        if written > self.written:
            self.written = written
            self._advance()

    def refused(self, batch: int) -> None:
        """A group commit failed: the leader's copy is never counted durable again (its followers' may be), and
        with it no longer counted, its followers alone may be no majority: it steps down (``unwritable``)."""
        self.groups.broker.persistence.waiters.discard(self)
        self._writing.clear()
        self.groups.unwritable(self.group.key)

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

    def join(self, follower: Follower, theirs: Diverged | None = None) -> None:
        """Send the follower a snapshot in the background (see ``_snapshot``), of only what its copy lacks if
        ``theirs``; it is out of step until then."""
        self._stop_snapshot(follower)
        follower.joined = False
        self.flush()  # what is staged goes to the others; the snapshot covers it for this one
        follower.snapshot = task = asyncio.get_running_loop().create_task(self._snapshot(follower, theirs))
        task.add_done_callback(lambda _: self._snapshot_ended(follower, task))

    @staticmethod
    def _snapshot_ended(follower: Follower, task: asyncio.Task) -> None:
        """Sent, or given up (its link dropped: it asks again, or is probed, when the link is back)."""
        if follower.snapshot is task:
            follower.snapshot = None

    async def _snapshot(self, follower: Follower, theirs: Diverged | None = None) -> None:
        """The state as it stands now, then the queue's entries as rows, a frame (``runs``) and a loop turn at a
        time (so that nobody waits on a deep queue's), each as it is when it is read (those served first
        flagged so), the held ones at the end; then the ops since the state's index.  The follower applies those
        ops to the state as they were applied here, and carries out their storage effects idempotently (a row
        may be of a later state already), which brings its rows where the state is.  For a copy that diverged
        from where this term started (``theirs``), the rows of entries below ``base_seq`` it has are its own
        (``DIFF``): only the others go, those below first, in seq order as ever."""
        queue = self.queue
        start = self.index
        state = machine.encode_state(queue.state)
        counts = queue.state.counts
        spans: list[tuple[int, int]] = [(0, 1 << 63)]  # the seqs whose ready entries go as rows
        below, held = 0, set[int]()  # the held ones: those from ``below`` on, and these
        if theirs is None:
            marker = [MARK.pack(RESET_OP, len(state)), state]
            log.info("%s takes a snapshot of %s: %d messages", follower.name, self.group.key,
                     queue.message_count + len(queue.held))
        else:
            below = self.base_seq
            ready, held = missing(queue.state, theirs.state, below)
            spans = [*ready.runs(), (below, 1 << 63)]
            marker = [DIFF.pack(DIFF_OP, len(state), below, theirs.term, theirs.index), state]
            log.info("%s takes a snapshot of %s: %d messages, all but %d of those below seq %d its own copy's "
                     "(it diverged at %s)", follower.name, self.group.key, queue.message_count + len(queue.held),
                     len(ready) + len(held), below, self.base)
            if not self._send(follower, self._frame(start, marker)):  # (alone: the follower's rows come first)
                return
            marker = [MARK.pack(MORE_OP, 0)]

        def send(rows: list[bytes]) -> bool:
            nonlocal marker
            for first, end in list(runs(rows)) or [(0, 0)]:  # one at least: it may be the state's own
                if not self._send(follower, self._frame(start, [*marker, *rows[first:end]])):
                    return False
                follower.rows += end - first
                marker = [MARK.pack(MORE_OP, 0)]
            return True

        rows: list[bytes] = []
        size = 0
        for low, high in spans:
            for entries, paged in queue.read_parts(low, high, SNAPSHOT_CHUNK):  # entries that arrive meanwhile too
                for more in self._ready_rows(entries, paged, counts, queue.state.returns):
                    rows += more
                    size += sum(map(len, more))
                    if len(rows) >= SNAPSHOT_CHUNK or size >= FRAME_BYTES:
                        if not send(rows):
                            return
                        rows, size = [], 0
                        await asyncio.sleep(0)
        held_entries = sorted((entry for entry in queue.held.values() if entry.seq >= below or entry.seq in held),
                              key=lambda e: e.seq)
        if not send(rows + self._rows(held_entries, ROW_HELD, counts)):
            return
        self.flush()
        since = self.log.after(start) if self.index > start else []
        if since is None:  # the log lost ops meanwhile: again
            asyncio.get_running_loop().call_soon(self.join, follower)
            return
        missed = [op for _, _, op in since]
        for first, end in list(runs(missed)) or [(0, 0)]:  # one at least: the follower's copy is whole
            if not self._send(follower, self._frame(start + 1 + first, [MARK.pack(REPLAY_OP, 0), *missed[first:end]])):
                return
        follower.joined = True
        self._answered(follower)

    def _ready_rows(self, entries: list["Entry"], paged: list["IndexEntry"], counts: Mapping[int, int],
                    front: machine.SeqSet) -> Iterator[list[bytes]]:
        """The rows of a batch of ready entries (``Queue.read_parts``; those of ``front`` served first, all in
        memory), a run of about ``FRAME_BYTES`` of bodies at a time, each read when it is reached."""
        for first, end in _by_size([entry.message.body_size for entry in entries]):
            yield self._rows([entry for entry in entries[first:end] if not entry.gone], 0, counts, front)
        for first, end in _by_size([row.size for row in paged]):
            yield self._paged_rows(paged[first:end], counts)

    def _rows(self, entries: list["Entry"], flags: int, counts: Mapping[int, int],
              front: machine.SeqSet | None = None) -> list[bytes]:
        """A snapshot's rows of ``entries`` (``flags``: ``ROW_HELD``; ``ROW_FRONT`` those of ``front``): a message
        in memory as it is, the others as the store keeps their records, read a run of neighbours at a time and
        never into their messages (a snapshot of a deep queue brings no body into memory, nor into the store's
        read cache).  One the store lacks has no row: the leader's state drops it when it reaches it."""
        stored = [entry.message.msg_id for entry in entries if entry.message.body is None]
        records = iter(self.groups.broker.persistence.records(stored) if stored else ())
        rows = []
        for entry in entries:
            returns = counts.get(entry.seq, 0)
            row_flags = flags | ROW_FRONT if front and entry.seq in front else flags
            if entry.message.body is not None:
                rows.append(_entry(entry, row_flags, returns))
                continue
            record = next(records)
            if record is not None:
                rows.append(ENTRY.pack(ENTRY_OP, entry.seq, entry.expiry, row_flags, returns,
                                       entry.message.body_size, len(record)) + record)
        return rows

    def _paged_rows(self, paged: list["IndexEntry"], counts: Mapping[int, int]) -> list[bytes]:
        """``_rows`` of ready entries on disk, from their index rows (no entry made for them).  One whose message
        is in the transient store has no row, as one the store lacks."""
        paged = [row for row in paged if not row.transient]
        records = self.groups.broker.persistence.records([row.msg_id for row in paged]) if paged else []
        pack = ENTRY.pack
        return [pack(ENTRY_OP, row.seq, row.expiry, 0, counts.get(row.seq, 0), row.size, len(record))
                + record for row, record in zip(paged, records) if record is not None]

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
        self.regrouped = self.index

    @property
    def regroup_agreed(self) -> bool:
        """A majority of the members as they stand has every op up to their change (or this term's start): only
        then may they change again, as a Ra leader appends no membership change until the one before is committed
        (``ra_server:append_log_leader``, ``cluster_change_not_permitted``).  Else a confirmed message may be on
        no majority of the next set: n1 and n2 of three had it, n4 joined and n2 left before n4 had the log, and
        n3 and n4 elected a leader without it."""
        return self._majority_has() >= self.regrouped

    def _majority_has(self) -> int:
        """The highest index a majority of the copies, the leader's own among them, has on disk."""
        matches = sorted([self.written] + [f.match for f in self.followers.values()], reverse=True)
        return matches[len(self.group.members) // 2]

    def catch_up(self, name: str, applied_term: int, applied: int, theirs: Diverged | None = None) -> None:
        """A follower asks to catch up from ``applied``: the log from there if it still has it — this term's (a
        copy where this term started from adopted first), or earlier terms' for a copy they pass through
        (``History``: a copy of the previous leader's, after a change of leader) — else a snapshot.  A copy of
        the term this one started from, past where it started (ops this leader never had: a deposed leader's
        unconfirmed tail), agrees with this copy up to there: its rows of entries made before are this copy's,
        unless either annotated one since, and a snapshot sends only the others (``_snapshot``)."""
        follower = self.followers.get(name)
        if follower is None or follower.snapshot is not None:  # (what it asks for is on its way)
            return
        index, sent = follower.answered
        if (follower.joined and applied < index
                and asyncio.get_running_loop().time() - sent < ANSWERED):  # (so is what it asked before)
            return
        follower.joined = False  # what is staged goes to the others now (and to the log), to this one below
        self.flush()
        adopt = applied_term > 0 and (applied_term, applied) == self.base
        ours = applied_term == self.term or adopt
        since: list[tuple[int, int, bytes]] | None = None
        if applied == self.index and ours:
            since = []
        elif applied <= self.index and (ours or self.log.passes(applied_term, applied)):
            since = self.log.after(applied)
        if since is None:
            diverged = (theirs is not None and 0 < self.base[0] == applied_term and applied > self.base[1]
                        and theirs.annotated <= self.base[1] and self.group.annotated <= self.base[1])
            self.join(follower, theirs if diverged else None)
            return
        log.info("%s catches up on %s from the log: %d ops%s", name, self.group.key, len(since),
                 f" (its copy of term {applied_term} adopted)" if adopt
                 else "" if ours else f" (its copy of term {applied_term} continued)")
        follower.joined = True
        if ours:
            if adopt:  # its copy as it stands becomes this term's
                follower.joined = self._send(follower, self._frame(applied + 1, [MARK.pack(ADOPT_OP, applied_term)]))
            missed = [op for _, _, op in since]
            for start, end in runs(missed):
                frame = self._frame(applied + 1 + start, missed[start:end])
                follower.joined = follower.joined and self._send(follower, frame)
            self._answered(follower)
            return
        last = applied_term  # the term of the copy's last op, as the ops below move it
        for term, run in itertools.groupby(since, key=lambda entry: entry[0]):
            ops = list(run)
            encoded = [op for _, _, op in ops]
            for start, end in runs(encoded):
                frame = self._frame(ops[start][1], [CONT.pack(CONTINUE_OP, last, term), *encoded[start:end]])
                follower.joined = follower.joined and self._send(follower, frame)
                last = term
        if last != self.term:  # no op of this term yet: its copy is where this term started
            frame = self._frame(self.index + 1, [MARK.pack(ADOPT_OP, last)])
            follower.joined = follower.joined and self._send(follower, frame)
        self._answered(follower)

    def _answered(self, follower: Follower) -> None:
        """What the follower missed is on its way: what it asked for from further back meanwhile is too."""
        if follower.joined:
            follower.answered = (self.index, asyncio.get_running_loop().time())

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
        self._advance()

    def _advance(self) -> None:
        """Commit what a majority of the copies, the leader's own among them, has on disk."""
        committed = self._majority_has()
        if committed <= self.committed:
            return
        self.committed = committed
        self._progress = self._majority_at = asyncio.get_running_loop().time()
        checkouts = self.checkouts
        while checkouts and checkouts[0] <= committed:
            checkouts.popleft()
        made = self._made
        while made and made[0][0] <= committed:
            self.agreed_below = made.popleft()[1]
        self.confirm_committed()
        waiters = self._agreed_waiters
        while waiters and waiters[0][0] <= committed:
            waiters.popleft()[1](False)
        if self._stalled:
            self._stalled = False
            self.queue.deliver_ready()

    def confirm_committed(self) -> None:
        """Confirm what a majority has, whether or not etcd has answered lately (as Raft commits, by the log
        alone): a follower answers only the term it follows, and never once its position may be in an
        election (``QuorumGroups._withdraw``), so any member elected later, by a majority of positions at or
        past what each of them answered, has it.  Deposed, what waits goes to the next leader (``stop``)."""
        committed = self.committed
        pending = self.pending
        done = 0
        while done < len(pending) and pending[done][0] <= committed:
            _, sink, seq, _ = pending[done]
            sink.remote_confirmed(seq, False)
            done += 1
        del pending[:done]

    def allowance(self, window: int) -> int:
        """Deliveries go on while a majority answers: ops wait for one no longer than ``PROGRESS`` seconds, and
        no more than the consumers' ``window`` (their prefetch, at least ``UNCOMMITTED_DELIVERIES``) of
        deliveries wait for one.  A leader cut off from its followers would otherwise deliver (and take acks) on
        for as long as etcd keeps it, or as fast as its consumers ack for ``PROGRESS`` seconds (thousands), none
        of which it can commit: the next leader would deliver all of it again.  A ``rabbit_fifo`` leader
        delivers only what committed commands check out (a consumer's settles commit before it is given more): a
        deposed leader's consumer is delivered again at most its window there, twice that here, at as many
        deliveries per commit.  Once none is allowed, the next commit delivers again.  Whether etcd still holds
        the leader's lease does not matter while its followers answer, as a Raft leader serves while a majority
        hears it: a member that etcd let claim the queue would take them, and the commits here would stop (a
        leader with no follower has nobody to be replaced by).  But a leader whose lease may have lapsed and whose
        followers answered nothing for ``PROGRESS`` (a queue idle, or a node paused past its lease: the others may
        have elected another meanwhile) delivers one message, and more once a majority took its checkout: a
        paused leader that woke up delivered a window at once, given again by the next leader (the issue's fixed
        schedule: 24 and 29 messages twice, each within a second of a leader's pause)."""
        if not self.followers:
            return UNBOUNDED if self.groups.lease_sure else self._stall()
        now = asyncio.get_running_loop().time()
        if self.committed < self.index and now - self._progress > PROGRESS:
            return self._stall()
        room = max(window, UNCOMMITTED_DELIVERIES) - len(self.checkouts)
        if now - self._majority_at > PROGRESS and not self.groups.lease_sure:
            room = min(room, 1 - len(self.checkouts))  # (one delivery, to hear a majority by)
        return room if room > 0 else self._stall()

    def when_agreed(self, done: Callable[[bool], None]) -> bool:
        """``done(False)`` once a majority has every op so far, ``done(True)`` if deposed first (``stop``): what a
        leader's consumers are given waits for it (``QuorumQueue.deliver_ready``).  A consumer given an entry
        before then was given one no later leader may know of: a deposed leader's publish waiting for a
        majority went to the next leader, which enqueued it under a seq of its own and delivered it again, with
        no redelivered flag (the issue's fixed schedule: 43 and 50 messages twice, 0.6 s apart, after a leader's
        pause and etcd's freeze), and a checkout no follower had was given again as a first delivery once the
        leader's node died with the consumer's connection (a random schedule: 50, a consumer's prefetch)."""
        if not self.followers or self.committed >= self.index:
            return False
        self._agreed_waiters.append((self.index, done))
        return True

    def _stall(self) -> int:
        self._stalled = True
        return 0

    @property
    def lag(self) -> dict[str, int]:
        return {f.name: self.index - f.match for f in self.followers.values()}

    def stop(self) -> list[tuple["ConfirmSink", int, machine.Enqueue | None]]:
        """Deposed: nothing more is shipped or confirmed here; the publishes that wait for the group, with
        their confirms (the caller passes them on to the next leader, or refuses them)."""
        for follower in self.followers.values():
            self._stop_snapshot(follower)
        self._writing.clear()
        self.groups.broker.persistence.waiters.discard(self)
        waiters, self._agreed_waiters = self._agreed_waiters, deque()
        for _, done in waiters:
            done(True)
        pending, self.pending = self.pending, []
        return [(sink, seq, op) for _, sink, seq, op in pending]


def skip(payload: bytes, pos: int, count: int) -> int | None:
    """Where the ops of ``payload`` from ``pos`` go on past the first ``count`` of them; None if none is left."""
    data = memoryview(payload)
    end = len(data)
    for _ in range(count):
        if pos >= end:
            return None
        pos = decode(data, pos)[1]
    return pos if pos < end else None


def apply(state: machine.State, replicas: "ReplicaStore", index_id: int, payload: bytes, pos: int,
          first: int, bounds: list[int] | None = None, spare: SpareRows | None = None,
          annotated: list[int] | None = None) -> tuple[machine.State, int]:
    """A follower applies the ops of ``payload`` from ``pos``, the first of them at index ``first``, to its
    copy: to its ``state``, their storage effects to its rows (``index_id``).  Returns the state and how many
    log ops that was (a frame's leading marker, and a snapshot's rows, are none).  A snapshot's state replaces
    the copy's; its rows, and the storage effects of the ops that follow it, are carried out idempotently (a
    row the copy has is kept as it is).  The wire has no leader's clock: an op's ``Meta`` has this node's
    (no op's outcome depends on it).  An Enqueue, most of a log, is applied from its fields (``machine.enqueue``),
    its row written with no op or effect made for it; a frame's snapshot rows are written together.  ``bounds``:
    where each log op starts and ends in ``payload`` is added to it.  ``spare``: a snapshot coming into a spare
    (its rows above its ``top`` need no lookup).  ``annotated``: the index of each op that annotated rows is added
    to it."""
    data = memoryview(payload)
    end = len(data)
    marker = data[pos] if pos < end else 0
    idempotent = marker in (RESET_OP, MORE_OP, REPLAY_OP, DIFF_OP)
    if marker == RESET_OP or marker == DIFF_OP:
        head = MARK.size if marker == RESET_OP else DIFF.size
        size = MARK.unpack_from(data, pos)[1]
        snapshot, _ = machine.decode_state(data, pos + head)
        pos += head + size
        state, effects = machine.apply((first, _now()), machine.Restore(snapshot), state)
        _carry_out(replicas, index_id, effects, False)
    elif marker in (MORE_OP, REPLAY_OP, ADOPT_OP):
        pos += MARK.size
    elif marker == CONTINUE_OP:
        pos += CONT.size
    count = 0
    now = _now()
    has, store = replicas.has, replicas.store_row
    stored = False  # rows ``store`` wrote, staged once at the end
    rows: list[tuple[int, memoryview, int, int, bool, int, bool]] = []  # snapshot rows to write (``store_rows``)
    top = spare.top if spare is not None else 1 << 64  # (else every row is looked up)
    while pos < end:
        kind = data[pos]
        if kind == ENTRY_OP:
            _, seq, expiry, flags, returns, size, length = ENTRY.unpack_from(data, pos)
            pos += ENTRY.size
            fresh = seq > top
            if fresh:
                top = seq
            elif rows:  # (those before it first: it may be among them)
                replicas.store_rows(index_id, rows)
                rows = []
            if fresh or not has(index_id, seq):
                rows.append((seq, data[pos:pos + length], expiry, size, bool(flags & ROW_HELD), returns,
                             bool(flags & ROW_FRONT)))
                stored = True
            pos += length
            continue
        if rows:
            replicas.store_rows(index_id, rows)
            rows = []
        start = pos
        if kind == ENQUEUE_OP or kind == ENQUEUE_FROM_OP:  # the hot path: no op, no effect (``machine.enqueue``)
            seq, expiry, at, pos, size, enqueuer, publish = enqueue_fields(data, start)
            if machine.enqueue(state, seq, expiry, size, enqueuer, publish) and not (idempotent and has(index_id, seq)):
                store(index_id, seq, data[at:pos], expiry, size)
                stored = True
            if CHECKS:
                machine.check(state, f"Enqueue of {seq}")
        else:
            op, pos = decode(data, pos)
            state, effects = machine.apply((first + count, now), op, state)
            if _carry_out(replicas, index_id, effects, idempotent) and annotated is not None:
                annotated.append(first + count)
        if bounds is not None:
            bounds += (start, pos)
        count += 1
    if rows:
        replicas.store_rows(index_id, rows)
    if spare is not None:
        spare.top = top
    if stored:
        replicas.persistence.stage()
    return state, count


def _now() -> int:
    return time.time_ns() // 1_000_000


def _carry_out(replicas: "ReplicaStore", index_id: int, effects: machine.Effects, idempotent: bool) -> bool:
    """A follower's copy: the storage effects of an op (``idempotent``: a row may be there already, or gone);
    whether they annotated rows."""
    annotated = False
    for effect in effects:
        if isinstance(effect, machine.Store):
            if not (idempotent and replicas.has(index_id, effect.seq)):
                replicas.put(index_id, effect.seq, effect.message, effect.expiry, size=effect.size)
        elif isinstance(effect, machine.Held):
            replicas.delivered(index_id, effect.seq)
        elif isinstance(effect, machine.Remove):
            replicas.remove(index_id, effect.seqs)
        elif isinstance(effect, machine.Annotate):
            replicas.annotate(index_id, effect.seqs, effect.annotations)
            annotated = True
        elif isinstance(effect, machine.Move):
            replicas.move(index_id, effect.old, effect.new, effect.returns, effect.front)
        elif isinstance(effect, machine.Drop):
            replicas.drop(index_id, effect.runs)
        elif isinstance(effect, machine.Unhold):
            for seq, returns in effect.rows:
                replicas.unhold(index_id, seq, returns)
        elif isinstance(effect, machine.WaitingDead):
            replicas.wait(index_id, effect.seqs, effect.reason)
        elif isinstance(effect, machine.Clear):
            replicas.clear(index_id)
        # (DeadLetters: the leader's)
    return annotated


def check_copy(state: machine.State, replicas: "ReplicaStore", index_id: int, payload: bytes, pos: int,
               since: int) -> None:
    """A follower's rows are what its state says (``machine.CHECKS``), after the ops of ``payload`` from ``pos``,
    the last of the ``since`` ops applied since the last check: a row for each entry the state holds and none
    other, flagged if checked out or a waiting dead letter.  :class:`machine.Broken` names the frame's ops."""
    rows = replicas.copy_state(index_id)
    if (rows.ready == state.ready and rows.returns == state.returns
            and rows.checked_out.keys() == state.checked_out.keys() and rows.dead == state.dead):
        return
    data, end, ops = memoryview(payload), len(payload), []
    if pos < end and data[pos] >= RESET_OP:
        pos = end if data[pos] in (RESET_OP, DIFF_OP) else pos + (CONT.size if data[pos] == CONTINUE_OP else MARK.size)
    while pos < end and data[pos] != ENTRY_OP:
        op, pos = decode(data, pos)
        ops.append(op if not isinstance(op, machine.Enqueue) else machine.Enqueue(op.seq, op.expiry, None))
    raise machine.Broken(f"copy {index_id} after {since} ops, the last frame's {ops[:20]}: rows ready {rows.ready}, "
                         f"first {rows.returns}, out {sorted(rows.checked_out)[:10]}, waiting "
                         f"{sorted(rows.dead)[:10]}; state ready {state.ready}, first {state.returns}, out "
                         f"{sorted(state.checked_out)[:10]}, waiting {sorted(state.dead)[:10]}")

