"""Quorum queues (``x-queue-type: quorum``) as RabbitMQ 3.10 has them, on top of the classic queue.

What a client sees differs from a classic queue:

- a message that comes back (nack, reject or a consumer gone) gets a new offset (a classic queue puts it back
  in its place): a nack or reject without a delivery limit sends it to the back; one with a delivery limit,
  and every return of a consumer or channel gone, serves it before the others, in the order they came back
  (RabbitMQ 3.10's ``rabbit_fifo`` ``returns``: docs/compatibility.md);
- a delivery carries an ``x-delivery-count`` header: how many times the message came back (nack or
  reject with requeue, a consumer or channel gone with it unacked, a restart while a consumer held it,
  or a new leader that no consumer took it back from, ``adopt``); RabbitMQ 3.10 sets it on every
  basic.get-ok, and on a basic.deliver only from the first return on;
- ``x-delivery-limit``: a message returned more often than that is dead-lettered (reason
  ``delivery_limit``) or dropped;
- ``x-overflow: reject-publish`` refuses only once the queue is over its limit (RabbitMQ 3.10 takes the
  publish that goes over it);
- the queue is durable, shared and kept (the declaration's properties are checked in
  its type, :mod:`types.quorum`), and global QoS is refused at basic.consume;
- ``x-dead-letter-strategy: at-least-once`` (with ``x-overflow: reject-publish``, as RabbitMQ requires;
  otherwise at-most-once): a dead letter no queue takes stays with the queue, counted apart
  (``messages_dlx``), and is tried again every ``DLX_RETRY`` seconds until one does;
- the HTTP API shows its leader and members.

Its replicated state is :mod:`quorum_machine`'s: every change is an op, applied to ``state`` (which decides
what it means: where a returned entry goes, whether it passed the delivery limit, which rows a purge drops),
then carried out here on the queue (its storage, its dead letters, the messages of its ready entries).  The
state is also the one source of the leader's decisions: which entry a consumer gets next (``next_ready``),
which ready entries' time is up at the leader's clock (``expired``, the deadlines its own), which a full
queue drops or whether it refuses a publish (``overflow``, ``over_limit``: it knows the entries' sizes), and
what the queue counts (its ready entries and their bytes).  The ready list (``ready_list.ReadyList``) only
holds the messages of the ready entries, in memory and paged to disk, in the state's order: it hands over
the entry of the seq the state names.  A
queue's replicas are the cluster's business (``forwarder.quorum.groups``, told of every change through
``replicator``); on a single node the group is this node.  The delivery counts are the state's, so they
survive an entry paging out and back, and the rows' (whatever their size: ``queue_index.COUNTS``), so they
survive a restart and, replicated, a failover.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable

from .. import errors
from ..clock import now_ms
from ..framing import header_table
from . import quorum_machine as machine
from ..message import Message
from .queue import RESETTLE_MAX, Checked, Consumer, Entry, ParkedSettle, Queue, SettleMode
from .ready import SETTLED
from .quorum_ops import LogOp

if TYPE_CHECKING:
    from .persistence import Persistence
    from .replica_store import ReplicaStore
    from ..ports import ConfirmSink, Replicator

DELIVERY_COUNT = "x-delivery-count"
DLX_RETRY = 1.0  # seconds between tries of at-least-once dead letters that no queue took
REFUSED_MAX = 1024  # enqueuers whose latest refused publish the leader keeps in mind
UNLIMITED_WINDOW = 1000  # a consumer with no prefetch, as many deliveries wait for a majority (``_window``)
HANDOVER_GRACE = 5.0  # seconds a new leader keeps what consumers held for them to take back (``adopt``)
HANDOVER_MAX = 30.0  # seconds at most it keeps them while a member's node may yet come back (``unreached``)


class QuorumQueue(Queue):
    persistence: Persistence  # durable: the node's, from attach on (before any op)
    replicas: ReplicaStore  # and its type's storage: what its machine decides of its rows, beyond writes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = machine.State()
        self.replicator: "Replicator[LogOp] | None" = None  # a leader in cluster mode: ships the ops
        self.members: list[str] = []  # the nodes holding a replica, leader first (set by the broker)
        self.held: dict[int, Entry] = {}  # entries out of the ready list: unacked, or waiting dead letters
        self.detached = False  # deposed (``detach``): its state and storage are no longer this object's
        self._context: dict[int, Entry] = {}  # the ready entries an op being carried out names, by seq
        self._running = 0  # ops being carried out (an effect may run one of its own)
        self._dlx_timer: asyncio.TimerHandle | None = None
        self._taken_count = (-1, 0)  # (seq, delivery count) of the entry a delivery or get just took
        self._left = -1  # the seq of the entry being taken without ack whose body stays in the store (``take``)
        self._awaiting: set[int] = set()  # held entries a consumer of the previous leader may take back
        self._agreed_below = 0  # deposed: the replicator's ``agreed_below`` as it stood (``agreed``)
        self._grace_timer: asyncio.TimerHandle | None = None
        self._grace_until = 0.0  # (loop time) the latest ``_grace_over`` may wait for an unreached member
        # a member's node is out of reach but may come back, or came back just now (set by the cluster): its
        # consumers may yet take back what they hold
        self.unreached: Callable[[], bool] = lambda: False
        self._from = (0, 0)  # (enqueuer, its seq) of the publish being enqueued (``enqueue_from``)
        self._allowed = -1  # deliveries the replicator still allows in the ``deliver_ready`` under way (-1: none is)
        self._refused: dict[int, int] = {}  # enqueuer -> the seq after its latest publish refused (reject-publish)
        # (the log index a majority must have, how, seq, its checkout's term, whether its seq was agreed, a modified
        # outcome's annotations) of the acks and rejects not yet known to be on a majority: for the next leader
        self._settled_lately: deque[tuple[int, SettleMode, int, int, bool, bytes]] = deque(maxlen=RESETTLE_MAX)
        self._expiry_timer: asyncio.TimerHandle | None = None  # at the state's next deadline (``_expiry_at``)
        self._expiry_at = 0
        self._configure(apply=False)
        self.ready.keep_apart = self._keep_apart
        self.ready.returned = self._returned
        self.ready.lost = self._lost

    # -- ops --------------------------------------------------------------------------------------

    def run(self, op: LogOp, entries: "list[Entry] | tuple[Entry, ...]" = ()) -> None:
        """Apply ``op`` to the replicated state, then carry out its effects here; ``entries``: those it names
        that are not held (ready ones)."""
        if self.detached:
            return
        self.state, effects = machine.apply(self.meta(), op, self.state)
        if self.replicator is not None:
            self.replicator.append(op)
        if not effects:
            return
        outer = self._context
        if entries:
            self._context = {entries[0].seq: entries[0]} if len(entries) == 1 else {e.seq: e for e in entries}
        self._running += 1
        try:  # (an effect may run ops of its own: a dead letter a queue took leaves)
            carry_out = self._CARRY_OUT
            for effect in effects:
                carry_out[type(effect)](self, effect)
        finally:
            self._context = outer
            self._running -= 1
        if machine.CHECKS and not self._running and not self.deleted:  # (deleted: its ready list is no more)
            self.check(op)

    def meta(self) -> machine.Meta:
        """What the next op comes with: its index in the log (0 on a single node) and this leader's clock."""
        replicator = self.replicator
        return 0 if replicator is None else replicator.index + 1, now_ms()

    def check(self, op: object = None) -> None:
        """The queue holds what its state says (``machine.CHECKS``): its held entries are the checked-out ones
        and waiting dead letters, and its ready ones as many as the state's."""
        state = self.state
        problems = []
        held, out = self.held.keys(), state.checked_out.keys() | state.dead.keys()
        if held != out:
            problems.append(f"held but not out: {sorted(held - out)[:10]}, out but not held: {sorted(out - held)[:10]}")
        ready = self.ready
        if ready.message_count != len(state.ready) or (state.has_facts and ready.bytes != state.bytes):
            problems.append(f"{ready.message_count} ready of {ready.bytes} bytes, the state has {len(state.ready)} "
                            f"of {state.bytes}")
        if [entry.seq for entry in ready.front] != list(state.returns):
            problems.append(f"front {[entry.seq for entry in ready.front][:10]}, the state's {state.returns}")
        if problems:
            raise machine.Broken(f"{self.name}: after {op!r}: {'; '.join(problems)}")

    def _entry(self, seq: int) -> Entry:
        entry = self.held.get(seq)
        return entry if entry is not None else self._context[seq]

    def _carry_out_held(self, effect: machine.Held) -> None:
        seq = effect.seq
        entry = self.held[seq] = self._context[seq]
        self.persistence.delivered(self, entry, self.state.counts.get(seq, 0))

    def _carry_out_remove(self, effect: machine.Remove) -> None:
        for seq in effect.seqs:
            if seq != self._left:  # (a body left in the store for the file: forgotten once sent, ``take``)
                self.forget(self._entry(seq))

    def _carry_out_move(self, effect: machine.Move) -> None:
        """A returned entry goes to the back as ``new``, or (``front``) to the end of the front."""
        entry = self.held.pop(effect.old)
        old, entry.seq = entry.seq, effect.new
        entry.redelivered = True
        self.next_seq = max(self.next_seq, effect.new + 1)
        self.replicas.returned(self, old, entry, effect.returns, effect.front)
        if effect.front:
            self.ready.push_front(entry)
        else:
            self.append_entry(entry)

    def _carry_out_annotate(self, effect: machine.Annotate) -> None:
        """Held entries' messages take a modified outcome's annotations: each a message of its own, written to the
        store, its row pointing there (as a copy's rows do: ``ReplicaStore.annotate``); a body left in the store
        stays there, copied to the new record without being read into memory."""
        persistence = self.persistence
        for seq in effect.seqs:
            entry = self.held[seq]
            message = entry.message
            entry.message = self.replicas.annotated(message, effect.annotations)
            persistence.index.relink(self.index_id, seq, entry.message.msg_id)
            persistence.release(message)

    def _carry_out_drop(self, effect: machine.Drop) -> None:
        Queue.remove_below(self, effect.below)

    def _carry_out_unhold(self, effect: machine.Unhold) -> None:
        """Entries back in their places: in memory too, those held here (a restart's are on disk)."""
        held = self.held
        for seq, returns in effect.rows:
            self.replicas.unhold(self.index_id, seq, returns)
            entry = held.pop(seq, None)
            if entry is None:
                continue
            size = entry.message.body_size
            self.ready.bytes += size
            self.unacked -= 1
            self.unacked_bytes -= size
            entry.redelivered = True
            self.ready.put_back(entry)

    def _carry_out_waiting(self, effect: machine.WaitingDead) -> None:
        self.replicas.wait(self.index_id, effect.seqs, effect.reason)

    def _carry_out_dead_letters(self, effect: machine.DeadLetterEntries) -> None:
        self._send_dead_letters([self._entry(seq) for seq in effect.seqs], effect.reason)

    _CARRY_OUT: ClassVar[dict[type, Callable[[Any, Any], None]]] = {
        machine.Held: _carry_out_held, machine.Annotate: _carry_out_annotate, machine.Remove: _carry_out_remove,
        machine.Move: _carry_out_move,
        machine.Drop: _carry_out_drop, machine.Unhold: _carry_out_unhold, machine.WaitingDead: _carry_out_waiting,
        machine.DeadLetterEntries: _carry_out_dead_letters}  # (Store: see store_entry; Clear: followers only)

    def _configure(self, apply: bool = True) -> None:
        """The state's arguments follow the queue's (declared, or a policy's)."""
        args = self.args
        at_least_once = (args.dead_letter_strategy == "at-least-once" and args.overflow == "reject-publish"
                         and args.dead_letter_exchange is not None and self.host is not None)
        limit = args.delivery_limit
        state = self.state
        if (state.delivery_limit, state.at_least_once) == (limit, at_least_once) and apply:
            return
        op = machine.Configure(limit, at_least_once)
        if apply:
            self.run(op)
        else:
            self.state = machine.apply(self.meta(), op, state)[0]

    def restarted(self) -> None:
        self.start(self.replicas.copy_state(self.index_id))

    def start(self, state: machine.State, handover: bool = False) -> None:
        """The queue comes back from its storage (a restart, or a new leader's copy), whose state is ``state``:
        after a restart, what consumers held before is returned, in place (``machine.Recover``).  A new leader
        (``handover``) returns only the waiting dead letters: as RabbitMQ's, consumers outlive a change of
        leader, and take back what they held (``adopt``); what none took back within ``HANDOVER_GRACE``
        seconds is returned then."""
        self.state = state
        self.next_seq = state.next_seq = max(self.next_seq, state.next_seq)
        if state.returns:
            self.ready.load_front(list(state.returns))
        if not state.has_facts:  # (made from rows, or from a snapshot: its entries' sizes and expiries are in them)
            state.add_facts(self._stored_facts())
        self._configure()
        if state.dead:
            self._keep_dead(set(state.dead), set(state.checked_out))
        if not handover:
            if state.checked_out:
                self._recover(None)
        elif state.checked_out:
            self._await_consumers(set(state.checked_out))
        self._expire_or_arm()

    def _keep_dead(self, seqs: set[int], out: set[int]) -> None:
        """At-least-once dead letters no queue took yet still wait, outside the queue's messages, and are tried
        again, as ``rabbit_fifo``'s dlx state does whose worker a new leader (or a restart) starts again; their
        entries on disk come into memory, held, and the checked-out ``out`` read on the way too (until a
        ``Recover`` or the consumers they wait for take them).  Those whose message the store lost leave."""
        self._page_in_held(seqs | out)
        self._awaiting = set()
        lost = sorted(seqs - self.held.keys())
        if lost:
            self.run(machine.DeadLettered(lost), [Entry(seq, Message.stored(0, 0)) for seq in lost])
        if self.state.dead and self._dlx_timer is None:
            self._dlx_timer = asyncio.get_running_loop().call_later(DLX_RETRY, self._retry_dead_letters)

    def _await_consumers(self, awaiting: set[int]) -> None:
        """A new leader keeps the entries checked out before (``awaiting``) apart for the consumers that outlive
        the change of leader, until they take them back or ``HANDOVER_GRACE`` is over."""
        self._page_in_held(awaiting)
        loop = asyncio.get_running_loop()
        self._grace_until = loop.time() + HANDOVER_MAX
        self._grace_timer = loop.call_later(HANDOVER_GRACE, self._grace_over)

    def _recover(self, seqs: list[int] | None) -> None:
        """``machine.Recover``: what it dead-letters, past the delivery limit, comes into memory first (a restart's
        entries are on disk), and is no longer unacked."""
        state = self.state
        out = state.checked_out.keys() if seqs is None else state.checked_out.keys() & set(seqs)
        over = machine.past_limit_on_return(state, out)
        if over:
            awaiting = self._awaiting
            self._page_in_held(over)
            self._awaiting = awaiting
            lost = sorted(over - self.held.keys())  # (the store lost their messages: they leave as settled)
            if lost:
                self.run(machine.Settle(lost), [Entry(seq, Message.stored(0, 0)) for seq in lost])
            for seq in over.difference(lost):
                self.unacked -= 1
                self.unacked_bytes -= self.held[seq].message.body_size
        self.run(machine.Recover(seqs))

    def _page_in_held(self, seqs: set[int]) -> None:
        """Checked-out entries on disk (``seqs``) come into memory, held (``_keep_apart``): those a consumer may
        take back, or that leave as dead letters."""
        self._awaiting = seqs
        ready = self.ready
        while self.paged and not seqs <= self.held.keys():  # (they come first: each was the head once)
            if not ready.page_in():
                break

    def _keep_apart(self, entry: Entry) -> bool:
        """An entry paged in that a consumer may take back waits for it out of the ready list, unacked; a waiting
        dead letter (``_keep_dead``) waits out of it too, no consumer's."""
        seq = entry.seq
        dead = seq in self.state.dead
        if seq in self.held or not (dead or seq in self._awaiting):
            return False
        self.held[seq] = entry
        size = entry.message.body_size
        self.ready.bytes -= size
        if not dead:
            self.unacked += 1
            self.unacked_bytes += size
        return True

    def adopt(self, held: list[Checked]) -> list[Entry | None]:
        """A consumer that outlived the change of leader takes back what it held (its checkouts, ``held``): the
        entries still waiting for it that this copy has checked out in the same term, and those still ready here
        whose seq names the same message here (``_same_message``; the previous leader gave them out without
        getting the delivery onto a majority).  None for the others: settled before, given to another consumer
        since, or given out by a leader whose op this copy never had, which is delivered again, as RabbitMQ
        delivers again what its leader had not committed.  A seq alone will not do: a copy that never had a
        deposed leader's entry may have given its seq to another message, which the consumer's ack would then
        remove undelivered.  The caller counts them against the consumer's prefetch, and settles them as any it
        delivered."""
        awaiting, entries, ready = self._awaiting, self.held, self.state.ready
        found: list[Entry | None] = []
        for checked in held:
            seq = checked[0]
            if seq in awaiting and seq in entries and self.holds(checked):
                awaiting.discard(seq)
                found.append(entries[seq])
            elif seq in ready and self._same_message(checked):
                found.append(self._take_ready(seq))
            else:
                found.append(None)
        return found

    def _take_ready(self, seq: int) -> Entry | None:
        """The ready entry ``seq`` is checked out, as a delivery takes one, wherever it is in the ready list."""
        entry = self.ready.take_out(seq, leaving=False)
        if entry is None:
            return None
        self.unacked += 1
        self.unacked_bytes += entry.message.body_size
        self.run(machine.Checkout(seq, False, self.term), [entry])
        return entry

    def _same_message(self, checked: Checked) -> bool:
        """Whether the seq of an entry checked out by the leader of the term ``checked`` names names the same
        message here: it was agreed there (every later leader's copy has it), or this leader's copy ran through
        that term's log and the seq is one it had made by then (``base_seq``: both logs made it, in the ops
        they share)."""
        seq, term, agreed = checked
        replicator = self.replicator
        return agreed or (replicator is not None and 0 < term == replicator.base[0] and seq < replicator.base_seq)

    def holds(self, checked: Checked) -> bool:
        """Checked out here in the term ``checked`` names; or, in a term this copy does not know (read back from
        its rows, which keep no terms: ``State.from_rows``), an agreed seq, which names the same message in
        every later leader's copy.  (Refused, a consumer's settles sent again to a leader whose copy was read
        back were not carried out, and it delivered those messages again: in-process nemesis seed 28.)"""
        seq, term, agreed = checked
        here = self.state.checked_out.get(seq)
        return term > 0 and (here == term or here == 0 and agreed)

    def checked(self, entry: Entry) -> Checked:
        seq = entry.seq
        return seq, self.state.checked_out.get(seq, 0), self.agreed(seq)

    def agreed(self, seq: int) -> bool:
        return seq < (self.replicator.agreed_below if self.replicator is not None else self._agreed_below)

    def when_agreed(self, done: Callable[[bool], None]) -> bool:
        if self.detached:
            done(True)
            return True
        return self.replicator is not None and self.replicator.when_agreed(done)

    @property
    def term(self) -> int:
        """The term this leader checks entries out in (0 on a single node: no other leader takes them back)."""
        return self.replicator.term if self.replicator is not None else 0

    def _grace_over(self) -> None:
        """What no consumer took back goes back in its place, counted as returned — once no member's node that may
        hold a consumer of them is out of reach (a cut heals: its consumers take theirs back, as RabbitMQ's
        consumers on a node cut off for less than its net tick time keep theirs), or after ``HANDOVER_MAX``."""
        self._grace_timer = None
        loop = asyncio.get_running_loop()
        if self.unreached() and loop.time() < self._grace_until and not (self.detached or self.deleted):
            self._grace_timer = loop.call_later(HANDOVER_GRACE / 5, self._grace_over)
            return
        awaiting, self._awaiting = self._awaiting, set()
        if self.detached or self.deleted:
            return
        seqs = [seq for seq in sorted(awaiting) if seq in self.held]
        if not seqs:
            return
        self._recover(seqs)
        self.deliver_ready()
        self._expire_or_arm()

    # -- what clients do --------------------------------------------------------------------------

    def _stored_facts(self) -> Iterable[tuple[int, int, int]]:
        """``(seq, size, expiry)`` of every entry in this copy's storage."""
        for seqs, values in self.persistence.index.columns(self.index_id):
            yield from zip(seqs.tolist(), values["size"].tolist(), values["expiry"].tolist())

    def enqueue(self, message: Message, confirm: "ConfirmSink | None" = None) -> bool:
        """A transient message is stored as a copy of its own (``stored_copy``), whose publish is confirmed, as a
        persistent one's, once the group commit is durable (``Message.awaits_commit``): RabbitMQ's quorum queues
        confirm every message once it is in the log, on disk."""
        stored = self.stored_copy(message)
        taken = super().enqueue(stored, confirm)
        if taken and stored is not message:  # (one it refused it did not store: nacked at once)
            message.logged = True
        if self.state.deadlines:  # (TTL 0 expires now, unless delivered, whatever timer an entry gone since left)
            self._expire_or_arm()
        return taken

    def enqueue_from(self, message: Message, confirm: "ConfirmSink | None", enqueuer: int, publish: int,
                     floor: int) -> str:
        """A publish of another node's window (``enqueuer``; its seq there ``publish``, its oldest unanswered
        ``floor``), which it sends again to each new leader until one confirms it: taken once whatever the
        number of copies, as ``rabbit_fifo`` takes its enqueuers' commands.  ``machine.NEXT``: taken now;
        ``machine.SEEN``: taken before, confirmed once what this leader has is on a majority; ``machine.AHEAD``:
        one before it never came (lost with a link or a leader), the window must send again from its oldest;
        "refused": the queue refused it (reject-publish)."""
        refused = self._refused
        verdict = machine.admit(self.state, enqueuer, publish, max(floor, refused.get(enqueuer, 0)) if refused
                                else floor)
        if verdict == machine.SEEN:
            if self.replicator is not None and confirm is not None:
                self.replicator.confirm_later(confirm)
        elif verdict == machine.NEXT:
            self._from = (enqueuer, publish)
            try:
                if not self.enqueue(message, confirm):  # (the window's next publishes need not wait for it)
                    if len(self._refused) >= REFUSED_MAX:
                        self._refused.clear()
                    self._refused[enqueuer] = publish + 1
                    return "refused"
            finally:
                self._from = (0, 0)
        return verdict

    def store_entry(self, entry: Entry, confirm: "ConfirmSink | None") -> None:
        """The hot path's ``run``: an Enqueue's one effect is the Store of its entry, so the state takes it from
        its fields (``machine.enqueue``), with no Meta nor effect made, and the op is made only to be shipped."""
        if self.detached:
            return
        replicator = self.replicator
        message = entry.message
        enqueuer, publish = self._from if self._from[0] or confirm is None or replicator is None else replicator.tag()
        if not machine.enqueue(self.state, entry.seq, entry.expiry, message.body_size, enqueuer, publish):
            return
        if machine.CHECKS:
            machine.check(self.state, f"Enqueue of {entry.seq}")
        self.persistence.write(self, entry)
        if replicator is not None:
            replicator.append(machine.Enqueue(entry.seq, entry.expiry, message, enqueuer, publish, message.body_size),
                              confirm)

    def delivery_header(self, entry: Entry, get: bool = False) -> bytes:
        """The content header a consumer (``get``: basic.get) receives: the message's, with ``x-delivery-count``."""
        count = self.returns(entry)
        if not count and not get:
            return entry.message.header
        return header_table.with_int_set(entry.message.header, DELIVERY_COUNT, count)

    def returns(self, entry: Entry) -> int:
        seq = entry.seq
        return self.state.counts.get(seq) or (self._taken_count[1] if self._taken_count[0] == seq else 0)

    @property
    def message_count(self) -> int:
        return len(self.state.ready)

    @property
    def ready_bytes(self) -> int:
        return self.state.bytes

    def append_entry(self, entry: Entry) -> None:
        """A ready entry's message joins the ready list (its deadline is the state's); a returned one's body its
        delivery left to the store (``stored_bodies.release_body``) is counted as the store's."""
        if not self.ready.push(entry):
            self.ready.came_back(entry)

    def full(self, incoming: int) -> bool:
        """RabbitMQ 3.10's quorum queues refuse a publish (reject-publish) only once they are over a limit: the
        one that reaches it is taken."""
        args = self.args
        return machine.over_limit(self.state, args.max_length, args.max_length_bytes)

    def drop_overflow(self) -> None:
        """drop-head: the state names the ready entries that go (dead-lettered as maxlen), from the head."""
        args = self.args
        if not args.limited or args.overflow != "drop-head":
            return
        state, ready = self.state, self.ready
        taken = []
        for seq in machine.overflow(state, args.max_length, args.max_length_bytes):
            ready.fill()
            if seq in state.ready:  # (else its message was found lost as the tail came in: it left the state)
                entry = self._take_head(seq)
                ready.unhold(entry)
                taken.append(entry)
        if taken:
            self.run(machine.DeadLetter([entry.seq for entry in taken], "maxlen"), taken)

    def pop_ready(self) -> Entry | None:
        """The entry the state delivers next (``next_ready``): the ready list's head; if the head's time is up,
        what is due is expired first."""
        allowed = self._allowed
        replicator = self.replicator
        if allowed >= 0:  # (delivering: ``deliver_ready``)
            if not allowed and replicator is not None:  # (what it allowed is used up: any more?)
                allowed = replicator.allowance(self._window())
                if not allowed:
                    return None
            self._allowed = allowed - 1
        seq = self._head()
        if seq is None:
            return None
        state = self.state
        expiry = state.expiries.get(seq) if state.expiries else None  # (the timer finds the others)
        if expiry is not None and expiry <= now_ms() and seq != self.fresh:
            self.expire_due()
            seq = self._head()
            if seq is None:
                return None
        return self._take_head(seq)

    def _head(self) -> int | None:
        """The state's head, with the ready list's in memory: the tail comes in first if memory runs short, so a
        message the store lost that is found there leaves the state (``_lost``) before the head is named."""
        ready = self.ready
        if ready.tail.count:
            ready.fill()
        return machine.next_ready(self.state)

    def _take_head(self, seq: int) -> Entry:
        """The ready list's head, which holds the message of ``seq``, the state's head."""
        entry = self.ready.pop_head()
        if entry is None or entry.seq != seq:
            raise machine.Broken(f"{self.name}: the ready list's head is {entry and entry.seq}, the state's {seq}")
        return entry

    def _lost(self, seqs: list[int]) -> None:
        """The store lost the messages of ready entries (the ready list dropped them as it read them back): they
        leave the state too, on every copy, as entries taken with no ack would."""
        for seq in seqs:
            if seq in self.state.ready:
                self.run(machine.Checkout(seq, True), (Entry(seq, Message.stored(0, 0)),))  # (its row is gone)

    def expire_due(self) -> None:
        """The ready entries the state says are past their deadline at this leader's clock (``machine.expired``)
        leave, wherever they are in the queue: dead-lettered (expired).  At least once, their rows stay until a
        queue takes their dead letters: those on disk come into memory first (``ReadyList.take_out``), or a
        page-in would read them back as ready."""
        if self.detached or self.deleted:
            return
        state = self.state
        seqs = machine.expired(state, now_ms(), self.fresh)
        if seqs:
            ready, leaving = self.ready, not state.at_least_once
            entries = [ready.take_out(seq, leaving) for seq in seqs]
            found = [entry for entry in entries if entry is not None]
            self.run(machine.Expire([entry.seq for entry in found]), found)
            if ready.gone > 1024 and ready.gone * 2 > len(ready.entries):
                ready.compact()
        self._arm_expiry()

    def _expire_or_arm(self) -> None:
        """Expire what is due now, else make sure the timer runs for the state's next deadline."""
        deadline = machine.next_deadline(self.state)
        if deadline is not None and deadline <= now_ms():
            self.expire_due()
        else:
            self._arm_expiry()

    def _arm_expiry(self) -> None:
        deadline = machine.next_deadline(self.state)
        timer = self._expiry_timer
        if deadline is None or self.detached or self.deleted:
            if timer is not None:
                timer.cancel()
                self._expiry_timer = None
            return
        if timer is not None:
            if self._expiry_at <= deadline:
                return
            timer.cancel()
        self._expiry_at = deadline
        self._expiry_timer = asyncio.get_running_loop().call_later(max(0.0, (deadline - now_ms()) / 1000),
                                                                   self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry_timer = None
        self.expire_due()

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        """At start-up: the messages on disk; their deadlines are the state's (``start``)."""
        super().recover(count, size, last_seq, ())

    def deliver_ready(self) -> None:
        """Deliver as many as the replicator allows (``Replicator.allowance``): a leader that may have been
        deposed would go on feeding its consumers what no majority will ever have, all of it delivered again by
        the next leader.  A delivery for manual ack is written to its consumer only once a majority has its
        checkout (``Replicator.when_agreed``), as a ``rabbit_fifo`` leader delivers only what committed commands
        check out: whatever a client was given, every later leader knows it was, and gives it again flagged
        redelivered.  (Written at once, the next leader of a copy that missed the checkout gave it as a first
        delivery, to a consumer whose node had died with the leader.)"""
        replicator = self.replicator
        if replicator is None:
            super().deliver_ready()
            return
        allowed = replicator.allowance(self._window())
        if allowed:
            self._allowed = allowed
            held = self.held_back = []
            try:
                super().deliver_ready()
            finally:
                self._allowed = -1
                self.held_back = None
            self._ship()
            if held and not replicator.when_agreed(lambda deposed: self._write_held(held, deposed)):
                self._write_held(held, False)

    def _write_held(self, held: list[tuple[Consumer, Entry]], deposed: bool) -> None:
        """Deliveries held back until their checkouts are on a majority go to their consumers.  Deposed first, they
        are dropped unseen: the next leader gives those it has ready as first deliveries, and those whose
        checkout it has, flagged, once no consumer took them back (``HANDOVER_GRACE``).  A consumer cancelled
        meanwhile has its entries back in their places, counted as no delivery (it never was)."""
        gone: list[Entry] = []
        consumers = set(self.consumers)  # (once a batch: a list's ``in`` was a scan of every consumer a delivery)
        for consumer, entry in held:
            if not deposed and consumer in consumers:
                consumer.channel.deliver(consumer, entry)
                continue
            consumer.unacked -= 1
            if not deposed:
                gone.append(entry)
        if gone:
            self.requeue_released(gone)

    def _window(self) -> int:
        """What the consumers may hold: their prefetch added up (``UNLIMITED_WINDOW`` for one with none)."""
        return sum(consumer.prefetch or UNLIMITED_WINDOW for consumer in self.consumers)

    def get(self, no_ack: bool, sends_from: int = 0) -> Entry | None:
        if self.args.single_active_consumer:  # (rabbit_fifo refuses the dequeue)
            raise errors.resource_locked(
                f"cannot obtain access to locked {errors.resource_name('queue', self.name, self.vhost)}. basic.get "
                "operations are not supported by quorum queues with single active consumer")
        entry = super().get(no_ack, sends_from)
        self._ship()
        return entry

    def _ship(self) -> None:
        """The deliveries just made go to the followers before any reaches a client (connections write at
        the end of the loop turn), so that a new leader redelivers whatever a client may have seen."""
        if self.replicator is not None:
            self.replicator.flush()

    def take(self, entry: Entry, no_ack: bool, sends_from: int = 0) -> Entry:
        """A large body the consumer sends from the store's file is not read back (``took``); taken without ack,
        its entry leaves the state now but keeps its store reference until the caller has the body's file and
        forgets it (``stored_bodies.forget_left``), as a classic queue's does."""
        seq = entry.seq
        self._taken_count = (seq, self.state.counts.get(seq, 0))  # (no-ack: the state forgets it now)
        self.took(entry, no_ack, sends_from)
        if no_ack and entry.message.body is None:
            self._left = seq
        try:
            self.run(machine.Checkout(seq, no_ack, self.term), (entry,))
        finally:
            self._left = -1
        return entry

    def settle(self, entries: list[Entry]) -> None:
        self.settled(entries)
        self.stats.ack += len(entries)
        seqs = [entry.seq for entry in entries]
        terms = self._checkouts(seqs)
        self.run(machine.Settle(seqs))
        self._remember("ack", seqs, terms)

    def reject(self, entries: list[Entry]) -> None:
        seqs = [entry.seq for entry in entries]
        terms = self._checkouts(seqs)
        super().reject(entries)
        self._remember("reject", seqs, terms)

    def _checkouts(self, seqs: list[int]) -> list[int]:
        out = self.state.checked_out
        return [out.get(seq, 0) for seq in seqs]

    def _remember(self, mode: SettleMode, seqs: list[int], terms: list[int], annotations: bytes = b"") -> None:
        """A settle just made, which this leader may not get onto a majority before it is deposed (``release``);
        those a majority has now are forgotten."""
        replicator = self.replicator
        if replicator is not None:
            lately, committed = self._settled_lately, replicator.committed
            while lately and lately[0][0] <= committed:
                lately.popleft()
            index = replicator.index
            lately.extend((index, mode, seq, term, False, annotations) for seq, term in zip(seqs, terms))

    def keep_settles(self, settles: list[ParkedSettle]) -> None:
        """Settles a consumer made under an earlier leader that this one took nothing back for: its copy has them
        carried out already, in that leader's ops, or the entry left since.  Those ops may be on no majority: kept
        as its own consumers' settles are (``_remember``), until a majority has all this leader has now, they go
        on to the next leader should this one be deposed first (``release``), as ``rabbit_fifo_client`` keeps a
        settle pending until a leader applied it.  (Dropped, a leader deposed again before any follower had its
        ops lost them, and the next delivered those messages again.)"""
        replicator = self.replicator
        if replicator is not None:
            index = replicator.index
            self._settled_lately.extend((index, mode, checked[0], checked[1], checked[2], annotations)
                                        for mode, _, checked, annotations in settles)

    def release(self, consumer: Consumer, entries: list[Entry]) -> tuple[list[Checked], list[ParkedSettle]]:
        """Deposed, as a proxy's consumers do, this leader's consumers take to the next one, besides what they
        hold, the settles made here lately: this leader may not have got them onto a majority, and the next
        would otherwise deliver those messages again (RabbitMQ's consumers send theirs again to a new leader).
        The next leader carries out those of entries it keeps for a consumer to take back (``adopt``), once.
        All that no majority was known to have go, however long ago they were made: a leader learns it was
        deposed only once its cut heals (``RemoteConsumer.resettles``)."""
        lately, self._settled_lately = self._settled_lately, deque(maxlen=RESETTLE_MAX)
        return ([self.checked(entry) for entry in entries],
                [(mode, Entry(0, SETTLED), (seq, term, agreed or self.agreed(seq)), annotations)
                 for _, mode, seq, term, agreed, annotations in lately])

    def requeue(self, entries: Iterable[Entry], counted: bool = True, annotations: bytes = b"",
                left: bool = False) -> None:
        """Returned entries count one more return and come back under new seqs: served first if the queue has a
        delivery limit or their consumer went away (``left``), else at the back, as ``rabbit_fifo_client``'s
        return, which ``rabbit_fifo``'s leader turns into a ``requeue`` (to the back) only without a limit; those
        past the delivery limit leave for good.  Not ``counted`` (``requeue_released``), they keep the count they
        had."""
        entries = list(entries)
        self.settled(entries)
        front = left or self.state.delivery_limit is not None
        self.run(machine.Return([entry.seq for entry in entries], self.state.next_seq, counted, annotations, front))
        self.deliver_ready()
        self.drop_overflow()  # (rabbit_fifo's checkout, then evaluate_limit)
        self._expire_or_arm()

    def requeue_released(self, entries: Iterable[Entry]) -> None:
        self.requeue(entries, counted=False)

    def requeue_left(self, entries: Iterable[Entry]) -> None:
        self.requeue(entries, left=True)

    def modify(self, entries: list[Entry], requeue: bool, counted: bool, annotations: bytes) -> None:
        """As RabbitMQ 4.x's quorum queues take a modified outcome: the annotations go with the messages, into
        the log op that returns or dead-letters them (``machine.Annotate``)."""
        if requeue:
            self.requeue(entries, counted, annotations)
        else:
            self.settled(entries)
            seqs = [entry.seq for entry in entries]
            terms = self._checkouts(seqs)
            self.run(machine.DeadLetter(seqs, "rejected", annotations), entries)
            self._remember("reject", seqs, terms, annotations)

    def dead_letter(self, entries: list[Entry], reason: str, persisted: bool = True) -> None:
        if not persisted:  # (refused at the door: never the queue's)
            super().dead_letter(entries, reason, persisted)
            return
        seqs = [entry.seq for entry in entries]
        self.run(machine.Expire(seqs) if reason == "expired" else machine.DeadLetter(seqs, reason), entries)

    def remove_below(self, offset: int) -> int:
        before = len(self.state.ready)
        self.run(machine.Purge(offset))
        return before - len(self.state.ready)

    def purge(self) -> int:
        count = len(self.state.ready)
        self.run(machine.Purge(self.state.next_seq))
        self.clear_ready()
        return count

    def set_args(self, args: Any) -> None:
        super().set_args(args)
        self._configure()

    # -- dead letters ------------------------------------------------------------------------------

    @property
    def dlx_count(self) -> int:
        return len(self.state.dead)

    @property
    def dlx_bytes(self) -> int:
        sizes = self.state.sizes
        return sum(sizes.get(seq, 0) for seq in self.state.dead)

    def _send_dead_letters(self, entries: list[Entry], reason: str) -> None:
        """``machine.DeadLetters``: at most once, the entries leave whatever becomes of their dead letters; at
        least once, they stay until a queue took them (``machine.DeadLettered``), tried again meanwhile."""
        host = self.host
        if self.args.dead_letter_exchange is None or host is None:
            return
        left = host.dead_letter(self, entries, reason)  # (it reads a body the store alone holds as it goes)
        if not self.state.at_least_once:
            return
        untaken = {id(entry) for entry in left}
        taken = [entry.seq for entry in entries if id(entry) not in untaken]
        if taken:
            self.run(machine.DeadLettered(taken))
        if self.state.dead and self._dlx_timer is None and not self.deleted:
            self._dlx_timer = asyncio.get_running_loop().call_later(DLX_RETRY, self._retry_dead_letters)

    def _retry_dead_letters(self) -> None:
        self._dlx_timer = None
        if self.deleted:
            return
        waiting = self.state.dead
        for reason in machine.REASONS:
            entries = [self.held[seq] for seq, why in sorted(waiting.items()) if why == reason]
            if entries:
                self._send_dead_letters(entries, reason)

    def drop_all(self) -> None:
        """Deleted: the dead letters still waiting go too, and what no consumer took back."""
        self._stop_dead_letters()
        for seq in self._awaiting:
            entry = self.held.get(seq)
            if entry is not None:
                self.forget(entry)
        self._stop_grace()
        super().drop_all()
        self._arm_expiry()  # (deleted: stopped)

    def detach(self) -> None:
        super().detach()
        self.detached = True
        if self.replicator is not None:  # (what its consumers hold is named by it still: ``release``)
            self._agreed_below = self.replicator.agreed_below
        self.replicator = None
        self._stop_dead_letters()
        self._stop_grace()
        self._arm_expiry()  # (detached: stopped)

    def stop_timers(self) -> None:
        super().stop_timers()
        self._stop_grace()

    def _stop_grace(self) -> None:
        self._awaiting = set()
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None

    def _stop_dead_letters(self) -> None:
        for seq in list(self.state.dead):
            entry = self.held.get(seq)
            if entry is not None:
                self.forget(entry)
        if self._dlx_timer is not None:
            self._dlx_timer.cancel()
            self._dlx_timer = None

    # -- storage ----------------------------------------------------------------------------------

    def forget(self, entry: Entry) -> None:
        self.held.pop(entry.seq, None)
        super().forget(entry)

    def _returned(self, seq: int) -> bool:
        """An entry read back from disk that came back before is redelivered (its count is the state's)."""
        return self.state.count(seq) > 0
