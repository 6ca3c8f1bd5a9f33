"""The quorum queue's state machine (amqp_server.queues.quorum_machine) against a simple model: a FIFO with
at-least-once delivery and a delivery count per message, whose messages have sizes and deadlines, and whose
messages returned to the front are served first, in the order they came back.

A driver plays the leader: it makes the ops a leader makes (the head goes to a consumer, the seqs it names
are those the state holds; those that expire or that a full queue drops, the machine names), applies them,
and carries out their storage effects on rows kept in a dict.  After every step the machine's state, read
through the rows, must be the model's; the rows must stand for the state (a copy restarting from them gets
the same state); and a follower that applies the same ops, or joins later from a snapshot of the state and
the rows, must end where the leader is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from amqp_server import payload
from amqp_server.queues import quorum_machine as m
from amqp_server.queues import quorum_ops as ops
from amqp_server.queues.quorum_machine import SeqSet, State

META = (1, 1_700_000_000_000)


def size_of(message: int) -> int:
    """A test message's body size (some are empty)."""
    return message % 7


@dataclass
class Row:
    message: int
    held: bool = False  # flagged out of the ready list
    returns: int = 0
    front: bool = False  # flagged served first (``Move.front``)
    waiting: str | None = None  # the reason it waits as a dead letter for, if it does


class Rows(dict[int, Row]):
    """A copy's storage: seq -> Row, changed only by effects."""

    def carry_out(self, effects: m.Effects, lenient: bool = False) -> list[tuple[list[int], str]]:
        """The storage effects done; the dead letters sent, as (seqs, reason)."""
        sent: list[tuple[list[int], str]] = []
        for effect in effects:
            if isinstance(effect, m.Store):
                assert lenient or effect.seq not in self
                self.setdefault(effect.seq, Row(effect.message))
            elif isinstance(effect, m.Held):
                self[effect.seq].held = True
            elif isinstance(effect, m.WaitingDead):
                for seq in effect.seqs:
                    self[seq].waiting = effect.reason
            elif isinstance(effect, m.Move):
                row = self.pop(effect.old)
                self[effect.new] = Row(row.message, False, effect.returns, effect.front)
            elif isinstance(effect, m.Unhold):
                for seq, returns in effect.rows:
                    self[seq].held, self[seq].returns, self[seq].front = False, returns, False
            elif isinstance(effect, m.Remove):
                for seq in effect.seqs:
                    del self[seq]
            elif isinstance(effect, m.Drop):
                for start, end in effect.runs:
                    for seq in range(start, end):
                        del self[seq]
            elif isinstance(effect, m.Clear):
                self.clear()
            else:
                assert isinstance(effect, m.DeadLetterEntries)
                sent.append((list(effect.seqs), effect.reason))
        return sent

    def copy(self) -> "Rows":
        return Rows({seq: Row(row.message, row.held, row.returns, row.front, row.waiting) for seq, row in self.items()})


class Model:
    """A FIFO: ready messages in the order they will be delivered (those returned to the front first), messages
    held by consumers, waiting dead letters, how often each came back, and where each message that left went."""

    def __init__(self) -> None:
        self.ready: list[int] = []
        self.firsts: set[int] = set()  # messages returned to the front (those still ready lead ``ready``)
        self.position: dict[int, int] = {}  # a message's place in the order (a return gives it a new one)
        self.out: set[int] = set()
        self.dead: dict[int, str] = {}
        self.counts: dict[int, int] = {}
        self.left: dict[int, str] = {}  # acked, dead-lettered (reason), purged
        self.places = 0
        self.delivery_limit: int | None = None
        self.at_least_once = False
        self.expiry: dict[int, int] = {}  # a message's deadline (0: none); it keeps it when it comes back

    def over(self, count: int, size: int, max_length: int | None, max_bytes: int | None) -> bool:
        return (max_length is not None and count > max_length) or (max_bytes is not None and size > max_bytes)

    def place(self, message: int) -> None:
        self.position[message] = self.places
        self.places += 1

    def back_in_place(self, messages) -> None:
        """Back in their places, behind the front."""
        self.firsts.difference_update(messages)
        front = self.front()
        self.ready = front + sorted([*self.ready[len(front):], *messages], key=self.position.__getitem__)

    def front(self) -> list[int]:
        front = [message for message in self.ready if message in self.firsts]
        assert self.ready[:len(front)] == front
        return front

    def leave(self, messages, why: str) -> None:
        for message in messages:
            self.left[message] = why
            self.counts.pop(message, None)

    def count_return(self, messages: set[int]) -> set[int]:
        """Those of ``messages`` one more return takes past the limit; the others' counts go up by one."""
        limit, counts = self.delivery_limit, self.counts
        over = {message for message in messages if limit is not None and counts.get(message, 0) >= limit}
        for message in messages - over:
            counts[message] = counts.get(message, 0) + 1
        return over

    def dead_letter(self, messages: list[int], reason: str) -> None:
        if self.at_least_once:
            self.dead.update(dict.fromkeys(messages, reason))
        else:
            self.leave(messages, reason)


class QuorumMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State()
        self.rows = Rows()
        self.model = Model()
        self.messages = 0
        self.log: list = []  # every op applied, in order
        self.followers: list[tuple[State, Rows, int]] = []  # (state, rows, ops applied)
        self.sent: list[tuple[list[int], str]] = []
        self._gone: dict[int, int] = {}
        self.index = 0  # the latest op's, in the log
        self.now = 1_700_000_000_000  # the leader's clock (its ops' Meta's time)

    def run(self, op) -> tuple:
        self.index += 1
        self.state, effects = m.apply((self.index, self.now), op, self.state)
        assert isinstance(effects, tuple)
        self.log.append(op)
        self.sent.extend((list(map(self.message_at_or_gone, seqs)), reason)
                         for seqs, reason in self.rows.carry_out(effects))
        return effects

    def message_at(self, seq: int) -> int:
        return self.rows[seq].message

    def message_at_or_gone(self, seq: int) -> int:
        row = self.rows.get(seq)
        return row.message if row is not None else self._gone[seq]

    def seq_of(self, message: int) -> int:
        (seq,) = [seq for seq, row in self.rows.items() if row.message == message]
        return seq

    def expect_sent(self, messages: list[int], reason: str) -> None:
        """The dead letters just sent are ``messages``, for ``reason``."""
        self.expect_all_sent({reason: messages} if messages else {})

    def expect_all_sent(self, expected: dict[str, list[int]]) -> None:
        sent: dict[str, list[int]] = {}
        for messages, reason in self.sent:
            sent.setdefault(reason, []).extend(messages)
        assert {reason: sorted(messages) for reason, messages in sent.items()} == {
            reason: sorted(messages) for reason, messages in expected.items()}
        self.sent = []

    def remember(self, seqs) -> None:
        """Keep the messages at ``seqs``, whose rows an op may remove before its dead letters are read."""
        self._gone = {seq: self.message_at(seq) for seq in seqs}

    # -- rules: what a leader does ---------------------------------------------------------------

    @initialize(limit=st.one_of(st.none(), st.integers(0, 3)), at_least_once=st.booleans())
    def configure_first(self, limit, at_least_once) -> None:
        self.configure(limit, at_least_once)

    @rule(limit=st.one_of(st.none(), st.integers(0, 3)), at_least_once=st.booleans())
    def configure(self, limit, at_least_once) -> None:
        model = self.model
        waiting = dict(model.dead) if model.at_least_once and not at_least_once else {}
        self.remember(self.state.dead)
        assert self.run(m.Configure(limit, at_least_once)) == () or waiting
        model.delivery_limit, model.at_least_once = limit, at_least_once
        for message, reason in waiting.items():  # one more try each, at most once now
            del model.dead[message]
            model.leave([message], reason)
        expected: dict[str, list[int]] = {}
        for message, reason in waiting.items():
            expected.setdefault(reason, []).append(message)
        self.expect_all_sent(expected)

    @rule(count=st.integers(1, 5), ttl=st.one_of(st.none(), st.integers(0, 20)))
    def enqueue(self, count, ttl) -> None:
        expiry = 0 if ttl is None else self.now + ttl
        for _ in range(count):
            message = self.messages
            self.messages += 1
            seq = self.state.next_seq
            size = size_of(message)
            assert self.run(m.Enqueue(seq, expiry, message, size=size)) == (m.Store(seq, expiry, message, size),)
            self.model.ready.append(message)
            self.model.place(message)
            self.model.expiry[message] = expiry

    @rule(ms=st.integers(0, 10))
    def time_passes(self, ms) -> None:
        self.now += ms

    @rule(spare=st.booleans())
    def expire_due(self, spare) -> None:
        """The machine names the ready messages past their deadline, wherever they are (one spared: a publish
        on its way to a waiting consumer); they are dead-lettered."""
        model = self.model
        kept = self.seq_of(model.ready[-1]) if spare and model.ready else -1
        seqs = m.expired(self.state, self.now, kept)
        due = [message for message in model.ready if 0 < model.expiry[message] <= self.now
               and (kept < 0 or message != model.ready[-1])]
        assert sorted(self.message_at(seq) for seq in seqs) == sorted(due)
        if kept >= 0 and 0 < model.expiry[model.ready[-1]] <= self.now:  # (spared, not forgotten)
            assert kept in m.expired(self.state.copy(), self.now)
        if not seqs:
            return
        self.remember(seqs)
        self.run(m.Expire(seqs))
        model.ready = [message for message in model.ready if message not in due]
        model.dead_letter(due, "expired")
        self.expect_sent(due, "expired")

    @rule(max_length=st.one_of(st.none(), st.integers(0, 6)), max_bytes=st.one_of(st.none(), st.integers(0, 30)))
    def drop_head(self, max_length, max_bytes) -> None:
        """drop-head: the machine names the head messages that must go for the queue to be within its limits."""
        model = self.model
        seqs = m.overflow(self.state, max_length, max_bytes)
        count, size = len(model.ready), sum(map(size_of, model.ready))
        dropped = []
        for message in model.ready:
            if not model.over(count, size, max_length, max_bytes):
                break
            dropped.append(message)
            count, size = count - 1, size - size_of(message)
        assert [self.message_at(seq) for seq in seqs] == dropped
        if not seqs:
            return
        self.remember(seqs)
        self.run(m.DeadLetter(seqs, "maxlen"))
        model.ready = model.ready[len(dropped):]
        model.dead_letter(dropped, "maxlen")
        self.expect_sent(dropped, "maxlen")

    @precondition(lambda self: self.model.ready)
    @rule(settled=st.booleans())
    def checkout(self, settled) -> None:
        """The head goes to a consumer: the model's oldest ready message, with the model's delivery count."""
        model = self.model
        seq = m.next_ready(self.state)
        assert seq is not None  # the precondition: there is a ready message
        message = self.message_at(seq)
        assert message == model.ready[0]
        assert self.state.count(seq) == model.counts.get(message, 0)  # its x-delivery-count
        self.run(m.Checkout(seq, settled))
        model.ready.pop(0)
        if settled:
            model.leave([message], "acked")
        else:
            model.out.add(message)

    @precondition(lambda self: self.model.out)
    @rule(data=st.data())
    def settle(self, data) -> None:
        messages = data.draw(st.lists(st.sampled_from(sorted(self.model.out)), min_size=1, unique=True))
        self.run(m.Settle([self.seq_of(message) for message in messages]))
        self.model.out -= set(messages)
        self.model.leave(messages, "acked")

    @precondition(lambda self: self.model.out)
    @rule(data=st.data())
    def return_(self, data) -> None:
        """Back to the queue, each counted once more (unless released: not counted), behind everything else, or
        (``front``) behind the others returned to the front; past the limit, dead-lettered."""
        model = self.model
        messages = data.draw(st.lists(st.sampled_from(sorted(model.out)), min_size=1, unique=True))
        counted, front = data.draw(st.booleans()), data.draw(st.booleans())
        seqs = [self.seq_of(message) for message in messages]
        self.remember(seqs)
        self.run(m.Return(seqs, self.state.next_seq, counted, front=front))
        over = []
        for message in sorted(messages, key=model.position.__getitem__):
            model.out.remove(message)
            returns = model.counts.get(message, 0) + counted
            if model.delivery_limit is not None and returns > model.delivery_limit:
                over.append(message)
                continue
            if returns:
                model.counts[message] = returns
            if front:
                model.ready.insert(len(model.front()), message)
                model.firsts.add(message)
            else:
                model.ready.append(message)
                model.firsts.discard(message)
            model.place(message)
        model.dead_letter(over, "delivery_limit")
        self.expect_sent(over, "delivery_limit")

    @precondition(lambda self: self.model.ready)
    @rule(data=st.data())
    def expire(self, data) -> None:
        model = self.model
        messages = data.draw(st.lists(st.sampled_from(model.ready), min_size=1, unique=True))
        seqs = [self.seq_of(message) for message in messages]
        self.remember(seqs)
        self.run(m.Expire(seqs))
        model.ready = [message for message in model.ready if message not in messages]
        model.dead_letter(messages, "expired")
        self.expect_sent(messages, "expired")

    @precondition(lambda self: self.model.ready or self.model.out)
    @rule(data=st.data())
    def dead_letter(self, data) -> None:
        """A full queue's head dropped (maxlen), or held messages rejected (rejected)."""
        model = self.model
        if model.ready and data.draw(st.booleans()):
            messages, reason = model.ready[:data.draw(st.integers(1, len(model.ready)))], "maxlen"
            model.ready = model.ready[len(messages):]
        elif model.out:
            messages = data.draw(st.lists(st.sampled_from(sorted(model.out)), min_size=1, unique=True))
            reason = "rejected"
            model.out -= set(messages)
        else:
            return
        seqs = [self.seq_of(message) for message in messages]
        self.remember(seqs)
        self.run(m.DeadLetter(seqs, reason))
        model.dead_letter(messages, reason)
        self.expect_sent(messages, reason)

    @precondition(lambda self: self.model.dead)
    @rule(data=st.data())
    def dead_lettered(self, data) -> None:
        messages = data.draw(st.lists(st.sampled_from(sorted(self.model.dead)), min_size=1, unique=True))
        self.run(m.DeadLettered([self.seq_of(message) for message in messages]))
        for message in messages:
            self.model.leave([message], self.model.dead.pop(message))

    @rule(data=st.data())
    def purge(self, data) -> None:
        """The ready messages below a seq go (all of them: queue.purge; some: a commit below an offset), those
        returned to the front among them."""
        model = self.model
        count = data.draw(st.integers(0, len(model.ready)))
        ready = list(self.state.ready)
        below = ready[count] if count < len(ready) else self.state.next_seq
        purged = [message for message in model.ready if self.seq_of(message) < below]
        self.run(m.Purge(below))
        model.leave(purged, "purged")
        model.ready = [message for message in model.ready if message not in purged]

    @rule()
    def recover(self) -> None:
        """A new term: what consumers held is back in its place, counted as returned (past the limit,
        dead-lettered); waiting dead letters still wait."""
        model = self.model
        self.remember([self.seq_of(message) for message in model.out])
        over = model.count_return(model.out)
        model.back_in_place(model.out - over)
        model.out = set()
        self.run(m.Recover())
        model.dead_letter(sorted(over), "delivery_limit")
        self.expect_sent(sorted(over), "delivery_limit")

    @rule(data=st.data())
    def recover_some(self, data) -> None:
        """A new leader: what no consumer took back within its grace period is back in place, counted as
        returned; the rest stays checked out, and waiting dead letters named too still wait."""
        model = self.model
        named = data.draw(st.sets(st.sampled_from(sorted(model.out | model.dead.keys() | {-1}))))
        named.discard(-1)
        back = named & model.out
        self.remember([self.seq_of(message) for message in back])
        over = model.count_return(back)
        model.back_in_place(back - over)
        model.out -= back
        seqs = [self.seq_of(message) for message in named]
        seqs.append(self.state.next_seq + 5)  # no such seq, and a ready one: ignored
        if len(self.state.ready):
            first = self.state.ready.first()
            assert first is not None
            seqs.append(first)
        self.run(m.Recover(data.draw(st.permutations(seqs))))
        model.dead_letter(sorted(over), "delivery_limit")
        self.expect_sent(sorted(over), "delivery_limit")

    @rule()
    def follower_joins(self) -> None:
        """A follower from a snapshot: the state as bytes, then the rows (a leader sends them a chunk at a time)."""
        state, rows = State(next_seq=7, checked_out={1: 2}), Rows({1: Row(-1)})  # whatever it had goes
        snapshot, _ = m.decode_state(m.encode_state(self.state))
        state, effects = m.apply((self.index, 0), m.Restore(snapshot), state)
        rows.carry_out(effects)
        assert rows == {} and state == self.state
        rows.update(self.rows.copy())
        self.followers.append((state, rows, len(self.log)))

    # -- what must hold ----------------------------------------------------------------------------

    @invariant()
    def the_state_is_the_models(self) -> None:
        state, model = self.state, self.model
        assert [self.message_at(seq) for seq in m.ready_order(state)] == model.ready
        assert [self.message_at(seq) for seq in state.returns] == model.front()
        head = m.next_ready(state)
        assert (self.message_at(head) if head is not None else None) == (model.ready[0] if model.ready else None)
        assert all(m.over_limit(state, limit) == (len(model.ready) > limit) for limit in (0, 1, 5))
        assert not m.over_limit(state, None)
        ready_bytes = sum(map(size_of, model.ready))
        assert state.bytes == ready_bytes
        assert all(m.over_limit(state, None, limit) == (ready_bytes > limit) for limit in (0, 3, 10))
        assert len(state.ready) == len(model.ready) and state.messages == len(model.ready) + len(model.out)
        assert {self.message_at(seq) for seq in state.checked_out} == model.out
        assert {self.message_at(seq): reason for seq, reason in state.dead.items()} == model.dead
        in_queue = [*model.ready, *model.out, *model.dead]
        assert {self.message_at(seq): count for seq, count in state.counts.items()} == {
            message: model.counts[message] for message in in_queue if model.counts.get(message)}
        assert sorted([*in_queue, *model.left]) == list(range(self.messages))  # nothing lost, nothing twice
        assert not self.sent

    @invariant()
    def the_rows_stand_for_the_state(self) -> None:
        state, rows = self.state, self.rows
        assert set(rows) == set(state.ready) | state.checked_out.keys() | state.dead.keys()
        for seq, row in rows.items():
            assert row.held == (seq not in state.ready)
            assert row.returns == state.count(seq)
            assert row.held or row.front == (seq in state.returns)
        assert all(seq < state.next_seq for seq in rows)
        restarted = State.from_rows(((seq, row.held, row.returns, row.front, row.waiting)
                                     for seq, row in sorted(rows.items())), state.delivery_limit, state.at_least_once)
        assert restarted.ready == state.ready and restarted.returns == state.returns
        assert restarted.checked_out == dict.fromkeys(state.checked_out, 0)
        assert restarted.dead == state.dead
        assert restarted.counts == state.counts

    @invariant()
    def the_state_knows_its_entries_sizes_and_deadlines(self) -> None:
        """What the leader decides by: every held entry's size and expiry (a returned one keeps its expiry)."""
        state = self.state
        assert state.has_facts
        assert state.sizes == {seq: size_of(row.message) for seq, row in self.rows.items()}
        assert state.expiries == {seq: self.model.expiry[row.message] for seq, row in self.rows.items()
                                  if self.model.expiry[row.message]}
        live = {seq for seq in state.ready if seq in state.expiries}
        assert live <= {item & ((1 << 64) - 1) for item in state.deadlines}  # (expiry << 64 | seq)

    def facts(self, rows: Rows) -> list[tuple[int, int, int]]:
        """(seq, size, expiry) of a copy's rows, as its storage has them."""
        return [(seq, size_of(row.message), self.model.expiry[row.message]) for seq, row in sorted(rows.items())]

    @invariant()
    def followers_end_where_the_leader_is(self) -> None:
        """They apply the leader's ops; one that joined from a snapshot reads its entries' facts from its rows
        (as a copy does before it leads); then their facts are the leader's too."""
        for i, (state, rows, applied) in enumerate(self.followers):
            for index, op in enumerate(self.log[applied:], applied + 1):
                state, effects = m.apply((index, 0), op, state)
                rows.carry_out(effects, lenient=True)
            self.followers[i] = (state, rows, len(self.log))
            assert state == self.state
            assert rows == self.rows
            if not state.has_facts:
                state.add_facts(self.facts(rows))
            assert (state.sizes, state.expiries, state.bytes) == (self.state.sizes, self.state.expiries,
                                                                  self.state.bytes)
            assert m.expired(state.copy(), self.now) == m.expired(self.state.copy(), self.now)

    @invariant()
    def the_state_survives_its_encoding(self) -> None:
        assert m.decode_state(m.encode_state(self.state)) == (self.state, len(m.encode_state(self.state)))


QuorumMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
test_the_state_machine_is_a_fifo_with_at_least_once_delivery = pytest.mark.long(
    pytest.mark.timeout(600)(QuorumMachine.TestCase))  # (a fixed amount of work: minutes on a loaded machine)


def test_seq_sets_keep_runs_sorted_and_disjoint():
    seqs = SeqSet()
    for seq in (0, 1, 2, 5, 6, 9):
        seqs.add(seq)
    assert list(seqs.runs()) == [(0, 3), (5, 7), (9, 10)] and len(seqs) == 6
    seqs.add(3)
    seqs.add_run(4, 5)  # joins both neighbours
    assert list(seqs.runs()) == [(0, 7), (9, 10)]
    assert seqs.discard(3) and not seqs.discard(3) and not seqs.discard(8)
    assert list(seqs.runs()) == [(0, 3), (4, 7), (9, 10)]
    assert seqs.pop_below(5) == [(0, 3), (4, 5)]
    assert list(seqs.runs()) == [(5, 7), (9, 10)] and len(seqs) == 3 and seqs.first() == 5
    assert 6 in seqs and 7 not in seqs and 4 not in seqs


def test_a_publish_sent_again_by_its_enqueuer_is_taken_once_and_in_order():
    """As ``rabbit_fifo``'s enqueuers: a window's seqs are taken once each, in order; one sent again (to a new
    leader) is seen, one whose predecessor never came is ahead (the window sends again from its oldest), and
    the oldest unanswered (``floor``) lets the state skip what the window gave up on."""
    state = State()
    assert m.admit(state, 7, 1, 1) == m.NEXT
    state = m.apply(META, m.Enqueue(0, 0, b"a", 7, 1), state)[0]
    assert m.admit(state, 7, 1, 1) == m.SEEN
    assert m.admit(state, 7, 3, 2) == m.AHEAD
    assert m.admit(state, 7, 3, 3) == m.NEXT  # (2 was answered: the window no longer waits for it)
    assert m.admit(state, 8, 5, 5) == m.NEXT  # (a window never heard of starts where it says)
    assert m.apply(META, m.Enqueue(1, 0, b"a again", 7, 1), state)[1] == ()  # (the state too takes it once)
    state = m.apply(META, m.Enqueue(1, 0, b"b", 7, 3), state)[0]
    assert (state.next_seq, state.enqueuers, len(state.ready)) == (2, {7: 4}, 2)
    restored, _ = m.decode_state(m.encode_state(state))
    assert restored.enqueuers == {7: 4}


def test_the_state_keeps_the_enqueuers_lately_heard_of(monkeypatch):
    monkeypatch.setattr(m, "ENQUEUERS_MAX", 3)
    state = State()
    for seq, enqueuer in enumerate([1, 2, 3, 1, 4]):
        state = m.apply(META, m.Enqueue(seq, 0, b"x", enqueuer, seq + 1), state)[0]
    assert list(state.enqueuers) == [3, 1, 4]


def test_an_entry_of_unknown_size_returned_stays_of_unknown_size():
    """A state from a snapshot knows no entry's size (they are not on the wire): one of its entries returned to the
    back is still of unknown size there, so the state still says it must read them from its rows before it leads
    (``has_facts``).  Taken for 0, once every such entry had moved so, a new leader's ready bytes were short of
    its queue's (the invariant check broke at its first delivery)."""
    snapshot = State(next_seq=2)
    snapshot.ready.add_run(0, 2)
    state = m.apply(META, m.Restore(snapshot), State())[0]
    for seq, new in ((0, 2), (1, 3)):
        state = m.apply(META, m.Checkout(seq), state)[0]
        state = m.apply(META, ops.Return([seq], new, True), state)[0]
    assert list(state.ready) == [2, 3] and not state.has_facts
    state.add_facts([(2, 5, 0), (3, 7, 0)])
    assert state.has_facts and state.bytes == 12


def test_apply_is_a_value_with_its_effects_as_a_tuple():
    """As ``rabbit_fifo:apply/3``: the caller goes on with the state returned; effects are an immutable tuple,
    empty for none, and the module keeps nothing mutable that an op could leave something in."""
    state = State()
    state, effects = m.apply(META, m.Enqueue(0, 0, b"a"), state)
    assert effects == (m.Store(0, 0, b"a"),)
    state, effects = m.apply((2, 1_700_000_000_001), m.Settle([0]), state)
    assert effects == ()  # (not checked out: nothing to settle)
    state, effects = m.apply((3, 1_700_000_000_002), m.Checkout(0, term=3), state)
    assert effects == (m.Held(0),) and state.checked_out == {0: 3} and not state.ready
    mutable = {name: type(value).__name__ for name, value in vars(m).items()
               if isinstance(value, (list, dict, set, bytearray)) and not name.startswith("__")}
    assert mutable == {}


class Payload:
    """A leader's message as the codec reads it: the parts of its store record (``payload.encode``'s)."""

    def payload(self) -> tuple[bytes, bytes, bytes, bytes]:
        return payload.encode(b"r", b"hdr", b"body")


ANNOTATIONS = b"\xc1\x0d\x02\xa3\x07x-opt-a\xa1\x01b"

# every op the leader ships, with its bytes as the wire has carried them (link version 3)
WIRE: list[tuple[ops.LogOp, str]] = [
    # an Enqueue's body size after its record's length (link version 9: a follower reads it from the record no more)
    (m.Enqueue(7, 0, Payload(), size=4),
     "01000000000000000700000000000000000000000e0000000400010000000372686472626f6479"),
    (m.Enqueue(2**40, 1_700_000_000_000, Payload(), 3, 99, 4),
     "0d00000100000000000000018bcfe568000000000e000000040000000000000003000000000000006300010000000372686472626f6479"),
    (m.Checkout(5, term=9), "1100000000000000050000000000000009"),  # (a checkout of no term, kind 2, before)
    (m.Checkout(5, True), "030000000000000005"),
    (m.Settle([1, 2, 3]), "0400000003000000000000000100000000000000020000000000000003"),
    (m.Settle([]), "0400000000"),
    (m.Return([4, 9], 12), "05000000000000000c0000000200000000000000040000000000000009"),
    (m.Return([4], 12, False), "0e000000000000000c000000010000000000000004"),
    (m.Expire([8]), "06000000010000000000000008"),
    (m.DeadLetter([1, 2], "rejected"), "07020000000200000000000000010000000000000002"),
    (m.DeadLetter([3], "delivery_limit"), "0703000000010000000000000003"),
    # a modified outcome's annotations (an encoded map: {x-opt-a: "b"}): kinds of their own, the others unchanged
    (m.Return([4], 12, False, ANNOTATIONS), "0f000000000000000c00000000010000000f0000000000000004" + ANNOTATIONS.hex()),
    (m.DeadLetter([3], "rejected", ANNOTATIONS), "1002000000010000000f0000000000000003" + ANNOTATIONS.hex()),
    (m.DeadLettered([6, 7]), "080000000200000000000000060000000000000007"),
    (m.Purge(100), "090000000000000064"),
    # a return served first (link version 13): kinds of their own, a modified one's flags byte says so (2)
    (m.Return([4], 12, front=True), "12000000000000000c000000010000000000000004"),
    (m.Return([4], 12, False, front=True), "13000000000000000c000000010000000000000004"),
    (m.Return([4], 12, True, ANNOTATIONS, True),
     "0f000000000000000c03000000010000000f0000000000000004" + ANNOTATIONS.hex()),
    (m.Recover(), "0a"),
    (m.Recover([3, 4]), "0c0000000200000000000000030000000000000004"),
    (m.Configure(None, False), "0bffffffffffffffff00"),
    (m.Configure(20, True), "0b000000000000001401"),
]


def test_every_shipped_op_keeps_its_wire_bytes_and_comes_back_the_same():
    """The codec is a table in quorum_ops; the bytes are those the wire has always carried, and each op
    decodes to itself (an Enqueue's message as its store record, a slice of the frame), from where it starts
    in a frame of several, up to where the next begins."""
    assert {type(op) for op, _ in WIRE} == set(get_args(ops.LogOp))
    frame = b"".join(bytes.fromhex(wire) for _, wire in WIRE)
    pos = 0
    for op, wire in WIRE:
        assert ops.encode(op).hex() == wire
        decoded, end = ops.decode(memoryview(frame), pos)
        if isinstance(op, m.Enqueue):
            assert isinstance(decoded, m.Enqueue) and bytes(decoded.message) == b"".join(op.message.payload())
            decoded.message = op.message
        assert (decoded, end) == (op, pos + len(bytes.fromhex(wire)))
        pos = end
    assert pos == len(frame)
    assert ops.decode(memoryview(bytes.fromhex("020000000000000005")), 0) == (m.Checkout(5), 9)


def test_an_amqp10_publish_reaches_a_follower_with_its_sections():
    """A follower's copy of a message published over AMQP 1.0 is the message as sent: its Enqueue carries the
    sections, and the message the follower makes of the record (as a new leader, or read back) has them."""
    from amqp_server.message import Message
    sent = Message("", "q", b"\x00\x01q", b"\x00\x3c\x00\x00" + bytes(10), b"body")
    sent.amqp10 = b"\x00\x53\x73\x45"  # an empty properties section
    data = ops.encode(m.Enqueue(1, 0, sent, size=4))
    decoded, _ = ops.decode(memoryview(data), 0)
    assert isinstance(decoded, m.Enqueue) and decoded.size == 4
    copy = Message.stored(0, 4)
    copy.fill_from(bytes(decoded.message))
    assert (copy.amqp10, copy.body, copy.routing_key) == (sent.amqp10, b"body", "q")


@given(st.lists(st.integers(0, 2**64 - 1), max_size=50), st.integers(0, 2**64 - 1), st.sampled_from(m.REASONS))
def test_ops_of_seqs_round_trip(seqs, seq, reason):
    for op in (m.Settle(seqs), m.Expire(seqs), m.DeadLettered(seqs), m.Recover(seqs), m.Return(seqs, seq),
               m.Return(seqs, seq, False), m.DeadLetter(seqs, reason), m.Checkout(seq), m.Purge(seq),
               m.Return(seqs, seq, True, ANNOTATIONS), m.DeadLetter(seqs, reason, ANNOTATIONS),
               m.Return(seqs, seq, front=True), m.Return(seqs, seq, False, ANNOTATIONS, True)):
        data = ops.encode(op)
        assert ops.decode(memoryview(data), 0) == (op, len(data))


def test_the_codec_refuses_what_it_does_not_know():
    with pytest.raises(TypeError):
        ops.encode(m.Restore(State()))  # type: ignore[arg-type]  # (a snapshot goes as rows, not as an op)
    for kind in (0, *range(20, 256)):  # (19 ops; a frame's rows and markers take 20 on)
        with pytest.raises(ValueError):
            ops.decode(memoryview(bytes((kind,)) + bytes(40)), 0)


def test_a_modified_outcomes_annotations_go_to_the_messages_before_they_move_or_are_dead_lettered():
    """RabbitMQ 4.x's quorum queues keep a modified outcome's annotations with the message: the op names them and
    its first effect sets them on the checked-out entries' messages (storage's, so that any copy that leads
    later delivers them), before the Move to the back, or the dead-lettering (past the delivery limit too);
    entries not checked out, and ops with none, have no such effect."""
    state = State(delivery_limit=1)
    for seq in range(4):
        state, _ = m.apply(META, m.Enqueue(seq, 0, b"x", size=1), state)
    for seq in range(3):
        state, _ = m.apply(META, m.Checkout(seq), state)
    state, effects = m.apply(META, m.Return([0, 3], 4, True, ANNOTATIONS), state)
    assert effects == (m.Annotate([0], ANNOTATIONS), m.Move(0, 4, 1))
    state, effects = m.apply(META, m.Checkout(4), state)
    state, effects = m.apply(META, m.Return([4], 5, True, ANNOTATIONS), state)  # (past the limit: it goes)
    assert effects == (m.Annotate([4], ANNOTATIONS), m.DeadLetterEntries([4], "delivery_limit"), m.Remove([4]))
    state, effects = m.apply(META, m.DeadLetter([1, 3], "rejected", ANNOTATIONS), state)
    assert effects == (m.DeadLetterEntries([3], "rejected"), m.Remove([3]), m.Annotate([1], ANNOTATIONS),
                       m.DeadLetterEntries([1], "rejected"), m.Remove([1]))
    state, effects = m.apply(META, m.Return([2], 5), state)
    assert effects == (m.Move(2, 5, 1),)


def test_check_names_each_broken_rule():
    """``check`` (run after every op under WARREN_CHECK_INVARIANTS) says which of the state's rules broke."""
    m.check(State(next_seq=3, ready=SeqSet([(0, 1)]), checked_out={1: 1}, dead={2: "expired"}, counts={1: 1}))
    broken = [
        (State(next_seq=3, ready=SeqSet([(0, 2)]), checked_out={1: 1}), "two places"),
        (State(next_seq=2, ready=SeqSet([(0, 1)]), dead={0: "maxlen"}), "two places"),
        (State(next_seq=1, checked_out={5: 1}), "at or above next_seq"),
        (State(next_seq=2, ready=SeqSet([(0, 1)]), counts={1: 2}), "counts for seqs the queue does not hold"),
    ]
    for state, problem in broken:
        with pytest.raises(m.Broken, match=problem):
            m.check(state, m.Settle([]))


def test_a_copy_that_never_expires_keeps_its_deadlines_bounded():
    """A follower applies the leader's ops and never asks ``expired`` itself: the deadlines of entries that left
    are dropped once they outnumber the live ones, rather than kept for ever."""
    state = State()
    for seq in range(20_000):
        state = m.apply(META, m.Enqueue(seq, 1_800_000_000_000 + seq, b"x", size=3), state)[0]
        state = m.apply(META, m.Checkout(seq, True), state)[0]
    assert not state.ready and state.bytes == 0 and not state.sizes and not state.expiries
    assert len(state.deadlines) <= 1024 + 1


def test_a_state_made_from_rows_reads_its_entries_facts_before_it_decides():
    """A snapshot (or a copy's rows after a restart) carries no sizes nor deadlines: the copy reads them from
    its storage (``add_facts``); then the byte limit and the deadlines are the entries'."""
    state = State.from_rows([(0, False, 0, False, None), (1, True, 1, False, None), (2, False, 0, False, None)])
    assert not state.has_facts
    state.add_facts([(0, 10, 1_700_000_000_005), (1, 20, 0), (2, 30, 1_700_000_000_001), (9, 99, 0)])
    assert state.has_facts and state.bytes == 40 and state.sizes == {0: 10, 1: 20, 2: 30}
    assert m.overflow(state, None, 30) == [0] and m.overflow(state, 1, None) == [0]
    assert m.expired(state, 1_700_000_000_004) == [2]
    assert m.next_deadline(state) == 1_700_000_000_005
