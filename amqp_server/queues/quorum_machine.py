"""A quorum queue's replicated state as a pure state machine, as RabbitMQ's ``rabbit_fifo`` is on Ra.

``apply(meta, op, state) -> (state, effects)``: an op (enqueue, checkout to a consumer, settle, return, expire,
dead-letter, purge, ...) changes the state and says, as effects, what storage and the leader must do about
it.  Nothing here does I/O, reads a clock or knows who leads: the leader (``quorum_queue.QuorumQueue``)
makes the ops, applies them and carries out their effects on its queue; ``forwarder.quorum.oplog`` ships the
same ops to the followers, which apply them and carry out the storage effects on their copies.  The copies
agree because they apply the same ops in the same order to the same state.  The ops a leader makes, and their
codec, are :mod:`quorum_ops`'s (as ``rabbit_fifo``'s command records); ``Restore`` (a snapshot) is here.

The state is what a copy must agree on: the ready entries as runs of seqs (``SeqSet``: a queue's order is its
seqs' order, a returned entry going to the back under a new seq), those of them served first (``returns``:
returned entries ``rabbit_fifo`` keeps in its ``returns`` queue, in the order they came back, under their new
seqs), the entries out of the ready list (checked
out by a consumer, or dead letters waiting for a queue to take them), the delivery counts of entries that came
back, and the configuration ops depend on.  Beside them, as ``rabbit_fifo`` keeps each message's header, it
knows its entries' sizes and expiries (not their messages, which are in storage: an op that brings a message
carries it for the effect that stores it).  The leader's decisions are the state's: which entry a consumer
gets (``next_ready``), which ready entries' time is up at the leader's clock (``expired``), which a full queue
drops (``overflow``) and whether it refuses a publish (``over_limit``).  The leader makes the op that carries
a decision out (a ``Checkout``, an ``Expire``, a ``DeadLetter``), naming its seqs, so that a copy applies
exactly what the leader did whatever its own clock.

An op names the seqs it touches and those it creates, so that a copy that missed nothing applies it exactly
as the leader did; ops on seqs the state does not hold change nothing (a copy replaying what a snapshot
already had).  ``meta`` is what Ra gives ``rabbit_fifo`` beside the op: its index in the log and the time
the leader made it; the machine reads no clock.  The state is the caller's: ``apply`` changes it in place and
returns it, and the caller goes on with what it returns (a copy per op would cost the hot path time that
grows with the entries checked out).  The effects are a tuple, empty for none.

With ``WARREN_CHECK_INVARIANTS=1`` in the environment (the tests set it), every op is followed by ``check``:
a seq is in at most one place (ready, checked out, a waiting dead letter), below ``next_seq``, and counted
only while the queue has it; a broken rule raises :class:`Broken`, naming the op.
"""
from __future__ import annotations

import heapq
import os
import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Final, Iterable, Iterator, Mapping

from .quorum_ops import (REASONS, Checkout, Configure, DeadLetter, DeadLettered, Enqueue, Expire, LogOp, Purge,
                         Recover, Return, Settle)

CHECKS = os.environ.get("WARREN_CHECK_INVARIANTS") == "1"  # ``check`` after every op (tests)
ENQUEUERS_MAX = 1024  # enqueuers whose next publish seq the state keeps; the least lately heard of goes first
_SEQ_BITS = 64  # a deadline is ``expiry << _SEQ_BITS | seq``: one int (a tuple takes three times the memory)
_SEQ_MASK = (1 << _SEQ_BITS) - 1


class Broken(AssertionError):
    """An invariant of a quorum queue's state (or of a copy's storage against it) no longer holds."""


class SeqSet:
    """Seqs as sorted, disjoint ``[start, end)`` runs: a FIFO's ready entries take one run, or a few where
    entries in the middle left (expired, or checked out when a new term returned them in place)."""

    __slots__ = ("starts", "ends", "count")

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.count = 0
        for start, end in runs:
            self.add_run(start, end)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SeqSet) and self.starts == other.starts and self.ends == other.ends

    def __repr__(self) -> str:
        return f"SeqSet({list(self.runs())})"

    def __contains__(self, seq: int) -> bool:
        i = bisect_right(self.starts, seq) - 1
        return i >= 0 and seq < self.ends[i]

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self.starts, self.ends):
            yield from range(start, end)

    def runs(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.ends)

    def first(self) -> int | None:
        return self.starts[0] if self.starts else None

    def copy(self) -> "SeqSet":
        other = SeqSet()
        other.starts, other.ends, other.count = list(self.starts), list(self.ends), self.count
        return other

    def add(self, seq: int) -> None:
        """Add ``seq`` (not in the set): at the end, the common case, in O(1)."""
        ends = self.ends
        if ends and seq == ends[-1]:
            ends[-1] += 1
            self.count += 1
        elif not ends or seq > ends[-1]:
            self.starts.append(seq)
            ends.append(seq + 1)
            self.count += 1
        else:
            self.add_run(seq, seq + 1)

    def add_run(self, start: int, end: int) -> None:
        """Add ``[start, end)``, none of which is in the set."""
        if end <= start:
            return
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, start)
        self.count += end - start
        if i > 0 and ends[i - 1] == start:  # joins the run before
            ends[i - 1] = end
            if i < len(starts) and starts[i] == end:  # and the one after
                ends[i - 1] = ends[i]
                del starts[i], ends[i]
        elif i < len(starts) and starts[i] == end:  # joins the run after
            starts[i] = start
        else:
            starts.insert(i, start)
            ends.insert(i, end)

    def discard(self, seq: int) -> bool:
        """Remove ``seq``; whether it was there.  The head's removal (a checkout) is O(1)."""
        starts, ends = self.starts, self.ends
        if starts and seq == starts[0]:
            i = 0
        else:
            i = bisect_right(starts, seq) - 1
            if i < 0 or seq >= ends[i]:
                return False
        self.count -= 1
        if seq == starts[i]:
            if seq + 1 == ends[i]:
                del starts[i], ends[i]
            else:
                starts[i] = seq + 1
        elif seq + 1 == ends[i]:
            ends[i] = seq
        else:
            starts.insert(i + 1, seq + 1)
            ends.insert(i + 1, ends[i])
            ends[i] = seq
        return True

    def pop_below(self, bound: int) -> list[tuple[int, int]]:
        """Remove every seq below ``bound``; the runs removed."""
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, bound - 1)  # runs starting below bound
        if not i:
            return []
        runs = list(zip(starts[:i], ends[:i]))
        if ends[i - 1] > bound:  # the last one is cut
            runs[-1] = (runs[-1][0], bound)
            starts[i - 1] = bound
            i -= 1
        del starts[:i], ends[:i]
        self.count -= sum(end - start for start, end in runs)
        return runs


@dataclass(eq=True)
class State:
    """A quorum queue's replicated state (see the module's docstring)."""

    next_seq: int = 0  # above every seq the queue has given out
    ready: SeqSet = field(default_factory=SeqSet)  # ready entries, in order
    # held by consumers until settled or returned: the term each was checked out in (``Checkout.term``; 0: not
    # known, read back from rows), which with its seq names the message a consumer holds
    checked_out: dict[int, int] = field(default_factory=dict)
    dead: dict[int, str] = field(default_factory=dict)  # at-least-once dead letters no queue took yet: reason
    counts: dict[int, int] = field(default_factory=dict)  # times an entry came back (its x-delivery-count), if any
    delivery_limit: int | None = None  # returned more often than this: dead-lettered (delivery_limit)
    at_least_once: bool = False  # dead letters stay until a queue took them (x-dead-letter-strategy)
    returns: SeqSet = field(default_factory=SeqSet)  # ready entries served before the others (``Return.front``)
    # the next publish seq of each enqueuer (another node's window of publishes, ``Enqueue.enqueuer``), so that a
    # publish sent again to a new leader is taken once; least lately heard of first.  Not the queue's content:
    # a copy keeps them beside its rows (``ReplicaStore.position``), and reads them back at a restart
    enqueuers: dict[int, int] = field(default_factory=dict, compare=False)
    # what the leader decides by (``overflow``, ``expired``), as ``rabbit_fifo`` keeps a message's header: the size
    # of every entry the queue holds, the expiry of those that have one, the ready ones' bytes, and the deadlines
    # of ready ones (a heap of ``expiry << 64 | seq``, stale ones passed over when they surface).  A copy applying
    # the ops keeps them; one made otherwise (its rows, a snapshot) reads them back from its storage
    # (``add_facts``) before it leads.  Not on the wire, nor compared: they are the entries', as their messages.
    sizes: dict[int, int] = field(default_factory=dict, compare=False)
    expiries: dict[int, int] = field(default_factory=dict, compare=False)
    bytes: int = field(default=0, compare=False)
    deadlines: list[int] = field(default_factory=list, compare=False)

    @property
    def messages(self) -> int:
        """Entries in the queue: ready or checked out (waiting dead letters are no longer the queue's)."""
        return len(self.ready) + len(self.checked_out)

    def count(self, seq: int) -> int:
        return self.counts.get(seq, 0)

    def copy(self) -> "State":
        return State(self.next_seq, self.ready.copy(), dict(self.checked_out), dict(self.dead), dict(self.counts),
                     self.delivery_limit, self.at_least_once, self.returns.copy(), dict(self.enqueuers),
                     dict(self.sizes), dict(self.expiries), self.bytes, list(self.deadlines))

    @property
    def has_facts(self) -> bool:
        """Whether it knows the size of every entry it holds (else ``add_facts`` first: it was made from rows or
        a snapshot)."""
        return len(self.sizes) == len(self.ready) + len(self.checked_out) + len(self.dead)

    def add_facts(self, rows: Iterable[tuple[int, int, int]]) -> None:
        """The sizes and expiries of its entries, from storage: ``(seq, size, expiry)`` rows (others ignored)."""
        ready, held, dead = self.ready, self.checked_out, self.dead
        sizes, expiries, deadlines = self.sizes, self.expiries, self.deadlines
        sizes.clear()
        expiries.clear()
        deadlines.clear()
        self.bytes = 0
        for seq, size, expiry in rows:
            if seq in ready:
                self.bytes += size
                if expiry:
                    deadlines.append(expiry << _SEQ_BITS | seq)
            elif seq not in held and seq not in dead:
                continue
            sizes[seq] = size
            if expiry:
                expiries[seq] = expiry
        heapq.heapify(deadlines)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, bool, int, bool, str | None]], delivery_limit: int | None = None,
                  at_least_once: bool = False) -> "State":
        """The state a copy's storage stands for: ``(seq, out, returns, front, waiting)`` rows in seq order, ``out``
        the flag (``Held``) of an entry out of the ready list, ``front`` that of a ready one served first
        (``Move.front``), ``waiting`` the reason of one out that waits as a dead letter (``WaitingDead``), else
        None: checked out (its term unknown)."""
        state = cls(delivery_limit=delivery_limit, at_least_once=at_least_once)
        ready = state.ready
        for seq, out, returns, front, waiting in rows:
            if waiting is not None:
                state.dead[seq] = waiting
            elif out:
                state.checked_out[seq] = 0
            else:
                ready.add(seq)
                if front:
                    state.returns.add(seq)
            if returns:
                state.counts[seq] = returns
            state.next_seq = seq + 1
        return state


# -- ops (those the leader ships, and their codec, are :mod:`quorum_ops`'s) -------------------------


@dataclass(slots=True)
class Restore:
    """A snapshot: the leader's state replaces this copy's (its entries come apart, see ``quorum_log``)."""

    state: State


Op = LogOp | Restore


# -- effects --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Store:
    """Storage: an entry's row, with its message (and its body's size, which a copy's row keeps: the op knows it)."""

    seq: int
    expiry: int
    message: Any
    size: int = 0


@dataclass(slots=True)
class Held:
    """Storage: the entry's row is flagged out of the ready list (checked out, or a waiting dead letter), so
    that a new term returns it."""

    seq: int


@dataclass(slots=True)
class Move:
    """Storage: a returned entry's row goes to ``new`` (the back), unflagged, counting ``returns``; ``front``: it
    is served first (``State.returns``), which the row says, so that a copy read back from its rows knows."""

    old: int
    new: int
    returns: int
    front: bool = False


@dataclass(slots=True)
class Annotate:
    """Storage and the leader: the messages of these checked-out entries take ``annotations`` (a modified
    outcome's, ``Return.annotations``), before the effects that move or dead-letter them."""

    seqs: list[int]
    annotations: bytes


@dataclass(slots=True)
class Unhold:
    """Storage: the rows of ``(seq, returns)`` are ready again in their places, counting those returns."""

    rows: list[tuple[int, int]]


@dataclass(slots=True)
class Remove:
    """Storage: the entries' rows go, with their messages' references."""

    seqs: list[int]


@dataclass(slots=True)
class Drop:
    """Storage: the rows of the ready entries in ``runs`` go (the purge of every ready seq below ``below``)."""

    runs: list[tuple[int, int]]
    below: int


@dataclass(slots=True)
class WaitingDead:
    """Storage: the entries' rows (flagged, ``Held``) wait as dead letters, for ``reason``, so that a copy read
    back from its rows keeps them waiting rather than returning them as checked out."""

    seqs: list[int]
    reason: str


@dataclass(slots=True)
class Clear:
    """Storage: every row goes (a snapshot's state replaces the copy's)."""


@dataclass(slots=True)
class DeadLetterEntries:
    """The leader: republish these entries to the dead-letter exchange (before any ``Remove`` of them)."""

    seqs: list[int]
    reason: str


Effect = Store | Held | Annotate | Move | Unhold | Remove | Drop | Clear | WaitingDead | DeadLetterEntries
Effects = tuple[Effect, ...]


# -- apply ----------------------------------------------------------------------------------------


Meta = tuple[int, int]
"""What comes with an op besides itself, as Ra's command metadata: ``(index, system_time)``, its place in its
term's log (0: not replicated) and the leader's clock when it made the op, in ms.  No op's outcome depends on the
time: a decision that does (``expired``) reads the leader's, and its op names the seqs, so a copy's clock never
matters.  (A plain pair: one is made per op, and an object with named fields takes ten times as long to make.)"""


def apply(meta: Meta, op: Op, state: State) -> tuple[State, Effects]:
    """Apply ``op`` to ``state`` (the caller's: changed in place); the state and what must be done about it."""
    effects = _APPLY[type(op)](op, state)
    if CHECKS:
        check(state, op)
    return state, effects


def check(state: State, op: object = None) -> None:
    """The state's own rules (see the module's docstring); :class:`Broken` names ``op``, the op just applied."""
    ready, out, dead = state.ready, state.checked_out, state.dead
    problems = []
    if any(seq not in ready for seq in state.returns):
        problems.append(f"returns not ready: {[seq for seq in state.returns if seq not in ready][:10]}")
    twice = sorted(seq for seq in out if seq in ready or seq in dead)
    twice += sorted(seq for seq in dead if seq in ready)
    if twice:
        problems.append(f"seqs in two places: {twice[:10]}")
    high = max([ready.ends[-1] - 1 if ready.ends else -1, *out, *dead])
    if high >= state.next_seq:
        problems.append(f"seq {high} at or above next_seq {state.next_seq}")
    stray = sorted(seq for seq in state.counts if seq not in ready and seq not in out and seq not in dead)
    if stray:
        problems.append(f"counts for seqs the queue does not hold: {stray[:10]}")
    if len(ready) != sum(end - start for start, end in ready.runs()):
        problems.append(f"ready count {len(ready)} is not its runs' {list(ready.runs())[:10]}")
    if problems:
        raise Broken(f"after {op!r}: {'; '.join(problems)}")


def over_limit(state: State, max_length: int | None, max_bytes: int | None = None) -> bool:
    """``rabbit_fifo``'s ``is_over_limit``: more ready entries than ``max_length``, or more bytes than ``max_bytes``
    (RabbitMQ 3.10 takes the publish that reaches a limit: reject-publish refuses only the next)."""
    return ((max_length is not None and state.ready.count > max_length)
            or (max_bytes is not None and state.bytes > max_bytes))


def overflow(state: State, max_length: int | None, max_bytes: int | None) -> list[int]:
    """drop-head (``rabbit_fifo``'s ``evict_to_limit``): the ready entries, from the head, that must go for the
    queue to be within its limits; a ``DeadLetter`` (maxlen) names them."""
    seqs: list[int] = []
    if not over_limit(state, max_length, max_bytes):
        return seqs
    count, size, sizes = state.ready.count, state.bytes, state.sizes
    for seq in ready_order(state):
        seqs.append(seq)
        count -= 1
        size -= sizes.get(seq, 0)
        if not ((max_length is not None and count > max_length) or (max_bytes is not None and size > max_bytes)):
            break
    return seqs


def next_ready(state: State) -> int | None:
    """The seq a consumer gets next, if any: the first of the ``returns``, else the head of the ready entries
    (``rabbit_fifo``'s ``take_next_msg``)."""
    starts = state.returns.starts or state.ready.starts  # (SeqSet.first, inline: once per delivery)
    return starts[0] if starts else None


def ready_order(state: State) -> Iterator[int]:
    """The ready entries in the order they are served: the ``returns``, then the others in seq order."""
    returns = state.returns
    yield from returns
    if returns:
        yield from (seq for seq in state.ready if seq not in returns)
    else:
        yield from state.ready


def next_deadline(state: State) -> int | None:
    """When a ready entry may expire next (epoch ms; a stale deadline passes over nothing), if any."""
    return state.deadlines[0] >> _SEQ_BITS if state.deadlines else None


def expired(state: State, now: int, spare: int = -1) -> list[int]:
    """The ready entries whose time is up at ``now`` (the leader's clock, its ops' ``Meta``), wherever they are in the
    queue, which an ``Expire`` is to name; ``spare``: a seq not to expire yet (a publish on its way to a waiting
    consumer).  The deadlines read leave the heap: those of the seqs found go with the Expire, the others were
    stale (the entry left, or came back under another seq)."""
    deadlines, ready, expiries = state.deadlines, state.ready, state.expiries
    limit = (now + 1) << _SEQ_BITS
    found: list[int] = []
    seen: set[int] = set()
    kept = []
    while deadlines and deadlines[0] < limit:
        item = heapq.heappop(deadlines)
        seq = item & _SEQ_MASK
        if seq == spare:
            kept.append(item)
        elif seq in ready and expiries.get(seq) == item >> _SEQ_BITS and seq not in seen:
            seen.add(seq)
            found.append(seq)
    for item in kept:
        heapq.heappush(deadlines, item)
    return found


SEEN, NEXT, AHEAD = "seen", "next", "ahead"


def admit(state: State, enqueuer: int, publish: int, floor: int) -> str:
    """Where ``publish``, of the window ``enqueuer`` whose unanswered publishes start at ``floor``, stands:
    ``SEEN`` (taken before: a publish sent again), ``NEXT`` (to take) or ``AHEAD`` (one before it has not come;
    the window must send them again, in order)."""
    expected = state.enqueuers.get(enqueuer, floor)
    if expected < floor:
        expected = floor
    return SEEN if publish < expected else NEXT if publish == expected else AHEAD


def _enqueue(op: Enqueue, state: State) -> Effects:
    if not enqueue(state, op.seq, op.expiry, op.size, op.enqueuer, op.publish):
        return ()
    return (Store(op.seq, op.expiry, op.message, op.size),)


def enqueue(state: State, seq: int, expiry: int, size: int, enqueuer: int = 0, publish: int = 0) -> bool:
    """An ``Enqueue``'s change to ``state``, from its fields; whether the entry joined (its ``Store`` is due).  A
    follower applies its log's enqueues so (``oplog.apply``), with neither an op nor an effect object made per
    message; ``apply`` of an Enqueue makes this same change.  (The caller runs ``check`` under ``CHECKS``.)"""
    if seq < state.next_seq:  # a replay of what a snapshot brought
        return False
    if enqueuer:
        enqueuers = state.enqueuers
        expected = enqueuers.pop(enqueuer, 0)  # (put back last: the least lately heard of comes first)
        if publish < expected:
            enqueuers[enqueuer] = expected
            return False
        enqueuers[enqueuer] = publish + 1
        if not expected and len(enqueuers) > ENQUEUERS_MAX:  # (a new one)
            del enqueuers[next(iter(enqueuers))]
    ready = state.ready
    ends = ready.ends
    if ends and seq == ends[-1]:  # (SeqSet.add's common case, inline: the hot path)
        ends[-1] = seq + 1
        ready.count += 1
    else:
        ready.add(seq)
    state.next_seq = seq + 1
    state.sizes[seq] = size
    state.bytes += size
    if expiry:
        _add_deadline(state, seq, expiry)
    return True


def _add_deadline(state: State, seq: int, expiry: int) -> None:
    """A ready entry that expires (the heap is rebuilt when stale deadlines outnumber live ones: a copy that
    never expires anything itself, a follower, pops none)."""
    state.expiries[seq] = expiry
    deadlines = state.deadlines
    heapq.heappush(deadlines, expiry << _SEQ_BITS | seq)
    if len(deadlines) > 2 * len(state.expiries) + 1024:
        ready = state.ready
        deadlines[:] = [when << _SEQ_BITS | key for key, when in state.expiries.items() if key in ready]
        heapq.heapify(deadlines)


def _forget(state: State, seqs: Iterable[int]) -> None:
    """Entries left the queue: their facts go."""
    sizes, expiries = state.sizes, state.expiries
    for seq in seqs:
        sizes.pop(seq, None)
        if expiries:
            expiries.pop(seq, None)


def _unreturn(state: State, seqs: Iterable[int]) -> None:
    """Ready entries left: those served first are no longer."""
    returns = state.returns
    if returns:
        for seq in seqs:
            returns.discard(seq)


def _unready(state: State, seqs: Iterable[int]) -> None:
    """Entries left the ready list: their bytes are no longer ready ones'."""
    sizes = state.sizes
    state.bytes -= sum(sizes.get(seq, 0) for seq in seqs)


def _checkout(op: Checkout, state: State) -> Effects:
    seq = op.seq
    if not state.ready.discard(seq):
        return ()
    if state.returns:
        state.returns.discard(seq)
    state.bytes -= state.sizes.get(seq, 0)
    if op.settled:
        state.counts.pop(seq, None)
        _forget(state, (seq,))
        return (Remove([seq]),)
    state.checked_out[seq] = op.term
    return (Held(seq),)


def _settle(op: Settle, state: State) -> Effects:
    checked_out, counts = state.checked_out, state.counts
    gone = []
    for seq in op.seqs:
        if seq in checked_out:
            del checked_out[seq]
            counts.pop(seq, None)
            gone.append(seq)
    if not gone:
        return ()
    _forget(state, gone)
    return (Remove(gone),)


def _return(op: Return, state: State) -> Effects:
    checked_out, counts, limit = state.checked_out, state.counts, state.delivery_limit
    sizes, expiries = state.sizes, state.expiries
    effects: list[Effect] = []
    if op.annotations:
        annotated = sorted(seq for seq in op.seqs if seq in checked_out)
        if annotated:
            effects.append(Annotate(annotated, op.annotations))
    over = []
    new = op.first
    for seq in sorted(op.seqs):
        if seq not in checked_out:
            continue
        del checked_out[seq]
        returns = counts.get(seq, 0) + op.counted
        if limit is not None and returns > limit:  # (its count stays: it did not go back)
            over.append(seq)
            continue
        counts.pop(seq, None)
        state.ready.add(new)
        if op.front:
            state.returns.add(new)
        if returns:
            counts[new] = returns
        size = sizes.pop(seq, None)
        if size is not None:  # (else unknown, as the entry's was: a state from a snapshot, ``has_facts``)
            sizes[new] = size
            state.bytes += size
        expiry = expiries.pop(seq, 0) if expiries else 0
        if expiry:
            _add_deadline(state, new, expiry)
        effects.append(Move(seq, new, returns, op.front))
        new += 1
    state.next_seq = max(state.next_seq, new)
    if over:
        effects.extend(_dead_letter(state, over, "delivery_limit", False))
    return tuple(effects)


def _expire(op: Expire, state: State) -> Effects:
    ready = state.ready
    gone = [seq for seq in op.seqs if ready.discard(seq)]
    if not gone:
        return ()
    _unreturn(state, gone)
    _unready(state, gone)
    return _dead_letter(state, gone, "expired", True)


def _dead_letter_op(op: DeadLetter, state: State) -> Effects:
    ready, checked_out = state.ready, state.checked_out
    from_ready, from_out = [], []
    for seq in op.seqs:
        if ready.discard(seq):
            from_ready.append(seq)
        elif seq in checked_out:
            del checked_out[seq]
            from_out.append(seq)
    _unready(state, from_ready)
    _unreturn(state, from_ready)
    effects = _dead_letter(state, from_ready, op.reason, True) if from_ready else ()
    if not from_out:
        return effects
    if op.annotations:
        effects += (Annotate(from_out, op.annotations),)
    return effects + _dead_letter(state, from_out, op.reason, False)


def _dead_letter(state: State, seqs: list[int], reason: str, ready: bool) -> Effects:
    """Entries that left the queue go to the dead-letter exchange: gone at once (at most once), or waiting,
    flagged out of the ready list, until a queue takes them (at least once)."""
    if state.at_least_once:
        dead = state.dead
        for seq in seqs:
            dead[seq] = reason
        held: Effects = tuple(Held(seq) for seq in seqs) if ready else ()
        # (the dead letters last: a queue may take them at once, and they go)
        return (*held, WaitingDead(seqs, reason), DeadLetterEntries(seqs, reason))
    counts = state.counts
    for seq in seqs:
        counts.pop(seq, None)
    _forget(state, seqs)
    return (DeadLetterEntries(seqs, reason), Remove(seqs))


def _dead_lettered(op: DeadLettered, state: State) -> Effects:
    dead, counts = state.dead, state.counts
    gone = [seq for seq in op.seqs if dead.pop(seq, None) is not None]
    for seq in gone:
        counts.pop(seq, None)
    if not gone:
        return ()
    _forget(state, gone)
    return (Remove(gone),)


def _purge(op: Purge, state: State) -> Effects:
    runs = state.ready.pop_below(op.below)
    if not runs:
        return ()
    state.returns.pop_below(op.below)
    counts = state.counts
    if counts:
        starts = [start for start, _ in runs]
        for seq in [seq for seq in counts if seq < op.below]:
            i = bisect_right(starts, seq) - 1
            if i >= 0 and seq < runs[i][1]:
                del counts[seq]
    if state.ready:  # (part of it: a commit)
        for start, end in runs:
            _unready(state, range(start, end))
            _forget(state, range(start, end))
    else:  # (what is left is out of the ready list)
        kept = state.checked_out.keys() | state.dead.keys()
        state.sizes = {seq: size for seq, size in state.sizes.items() if seq in kept}
        state.expiries = {seq: when for seq, when in state.expiries.items() if seq in kept}
        state.bytes = 0
        state.deadlines = []
    return (Drop(runs, op.below),)


def _recover(op: Recover, state: State) -> Effects:
    counts, ready, checked_out = state.counts, state.ready, state.checked_out
    out = set(checked_out) if op.seqs is None else checked_out.keys() & set(op.seqs)
    over = past_limit_on_return(state, out)  # (its count stays: it does not go back, as at a Return)
    for seq in over:
        del checked_out[seq]
    out -= over
    for seq in out:
        counts[seq] = counts.get(seq, 0) + 1
    rows = []
    sizes, expiries = state.sizes, state.expiries
    for seq in sorted(out):
        ready.add_run(seq, seq + 1)
        rows.append((seq, counts.get(seq, 0)))
        state.bytes += sizes.get(seq, 0)
        expiry = expiries.get(seq)
        if expiry:
            _add_deadline(state, seq, expiry)
    for seq in out:
        del checked_out[seq]
    effects: Effects = (Unhold(rows),) if rows else ()
    return effects + _dead_letter(state, sorted(over), "delivery_limit", False) if over else effects


def past_limit_on_return(state: State, seqs: Iterable[int]) -> set[int]:
    """Those of ``seqs`` that one more counted return takes past the delivery limit: they are dead-lettered
    rather than returned."""
    limit, counts = state.delivery_limit, state.counts
    return set() if limit is None else {seq for seq in seqs if counts.get(seq, 0) >= limit}


def _configure(op: Configure, state: State) -> Effects:
    state.delivery_limit = op.delivery_limit
    if state.at_least_once and not op.at_least_once and state.dead:  # at most once now: one more try each
        state.at_least_once = False
        effects: list[Effect] = []
        waiting, state.dead = state.dead, {}
        for reason in REASONS:
            seqs = sorted(seq for seq, why in waiting.items() if why == reason)
            if seqs:
                effects.extend(_dead_letter(state, seqs, reason, False))
        return tuple(effects)
    state.at_least_once = op.at_least_once
    return ()


def _restore(op: Restore, state: State) -> Effects:
    new = op.state.copy()
    for name in State.__dataclass_fields__:
        setattr(state, name, getattr(new, name))
    return (Clear(),)


_APPLY: Final[Mapping[type, Callable[[Any, State], Effects]]] = MappingProxyType({
    Enqueue: _enqueue, Checkout: _checkout, Settle: _settle, Return: _return, Expire: _expire,
    DeadLetter: _dead_letter_op, DeadLettered: _dead_lettered, Purge: _purge, Recover: _recover,
    Configure: _configure, Restore: _restore,
})


# -- the state as bytes (a snapshot's first frame; a clean shutdown's saved state) -----------------

_HEAD = struct.Struct(">QqBIIIIII")  # next seq, delivery limit (-1: none), at least once, then the counts of:
# runs (start, end), checked out (seq, term), dead (seq, reason), counts (seq, count), enqueuers (id, next seq),
# and the runs of the returns served first (start, end)
_PAIR = struct.Struct(">QQ")
_DEAD = struct.Struct(">QB")


def encode_state(state: State) -> bytes:
    limit = -1 if state.delivery_limit is None else state.delivery_limit
    parts = [_HEAD.pack(state.next_seq, limit, state.at_least_once, len(state.ready.starts),
                        len(state.checked_out), len(state.dead), len(state.counts), len(state.enqueuers),
                        len(state.returns.starts))]
    parts.extend(_PAIR.pack(start, end) for start, end in state.ready.runs())
    parts.extend(_PAIR.pack(seq, term) for seq, term in sorted(state.checked_out.items()))
    parts.extend(_DEAD.pack(seq, REASONS.index(reason)) for seq, reason in sorted(state.dead.items()))
    parts.extend(_PAIR.pack(seq, count) for seq, count in sorted(state.counts.items()))
    parts.extend(_PAIR.pack(enqueuer, publish) for enqueuer, publish in state.enqueuers.items())
    parts.extend(_PAIR.pack(start, end) for start, end in state.returns.runs())
    return b"".join(parts)


def decode_state(data: bytes | memoryview, pos: int = 0) -> tuple[State, int]:
    """The state encoded at ``pos``, and where its encoding ends."""
    next_seq, limit, at_least_once, runs, out, dead, counts, enqueuers, returns = _HEAD.unpack_from(data, pos)
    pos += _HEAD.size
    state = State(next_seq, delivery_limit=None if limit < 0 else limit, at_least_once=bool(at_least_once))
    for _ in range(runs):
        state.ready.add_run(*_PAIR.unpack_from(data, pos))
        pos += _PAIR.size
    for _ in range(out):
        seq, term = _PAIR.unpack_from(data, pos)
        state.checked_out[seq] = term
        pos += _PAIR.size
    for _ in range(dead):
        seq, reason = _DEAD.unpack_from(data, pos)
        state.dead[seq] = REASONS[reason]
        pos += _DEAD.size
    for _ in range(counts):
        seq, count = _PAIR.unpack_from(data, pos)
        state.counts[seq] = count
        pos += _PAIR.size
    for _ in range(enqueuers):
        enqueuer, publish = _PAIR.unpack_from(data, pos)
        state.enqueuers[enqueuer] = publish
        pos += _PAIR.size
    for _ in range(returns):
        state.returns.add_run(*_PAIR.unpack_from(data, pos))
        pos += _PAIR.size
    return state, pos
