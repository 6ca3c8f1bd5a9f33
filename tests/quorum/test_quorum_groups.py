"""Quorum queues' elections, replication and catch-up (forwarder.quorum.groups, forwarder.quorum.oplog) in-process:
three real brokers in one event loop, linked by a fake transport and agreeing through a fake etcd
(tests/fake_cluster.py), so that each rule is tested in a second or two, with no etcd and no processes.
test_quorum_cluster.py drives the same rules with real processes, a real etcd and kill -9.

After every scenario the followers' copies must be the leader's: the same state (quorum_machine.State) and
the same rows (seq, held, delivery count, expiry, message) in their queue indexes, which say the same of what is
served first (the returns to the front).
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import random
import shutil
import threading
import time
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from amqp_server.broker import Broker, vhost as vhost_module
from amqp_server.errors import ChannelError
from amqp_server.frontend.stored_bodies import SEND_FROM_FILE
from amqp_server.message import Message, make_message
from amqp_server.queues import quorum_machine as machine, quorum_queue
from amqp_server.queues.queue import Queue
from amqp_server.queues.quorum_queue import QuorumQueue
from amqp_server.queues.ready import Entry
from amqp_server.records import QueueRecord
from fake_cluster import Client, FakeLink, Network, Node
from msg_store import MessageStore, store as store_module
from forwarder.peers import node_link as link, owner_side, remote_queue
from forwarder.quorum import groups as quorum, oplog as quorum_log
from forwarder.quorum.groups import queue_key
from forwarder.quorum.oplog import OpLogShipper
from queue_index import QueueIndex
from stream_log import amqp10

NAMES = ["n1", "n2", "n3"]
KEY = queue_key("/", "q")

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fast_leases(monkeypatch) -> None:
    """Polls and retries a few times faster than in production (leases as long: a loop held a while by
    three brokers must not lose one)."""
    monkeypatch.setattr(quorum, "ELECTION_GRACE", 1.0)
    monkeypatch.setattr(quorum, "ELECTION_POLL", 0.02)
    monkeypatch.setattr(quorum, "RETRY_INTERVAL", 0.1)
    monkeypatch.setattr(quorum_queue, "HANDOVER_GRACE", 0.3)


@pytest.fixture
async def network(tmp_path) -> AsyncIterator[Network]:
    network = await Network(tmp_path, NAMES).start()
    yield network
    await network.close()


class Confirms:
    """The confirm-mode channel a publish came through (amqp_server.ports.ConfirmSink)."""

    def __init__(self) -> None:
        self.sent = 0
        self.outcomes: dict[int, str] = {}

    def forwarded(self) -> int:
        self.sent += 1
        return self.sent

    def remote_confirmed(self, seq: int, rejected: bool) -> None:
        self.outcomes[seq] = "nack" if rejected else "ack"

    def waiting(self, change: int) -> None:
        pass

    def acked(self) -> list[int]:
        return sorted(seq for seq, outcome in self.outcomes.items() if outcome == "ack")


class HeldConfirms(Confirms):
    """A channel that holds its connection back while its publishes wait for a leader (``Channel.waiting``)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting_now = self.waiting_most = 0

    def waiting(self, change: int) -> None:
        self.waiting_now += change
        self.waiting_most = max(self.waiting_most, self.waiting_now)


async def wait_for(check, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def leader(network: Network) -> Node | None:
    """The node that leads the latest term (a deposed one may not know yet, for a loop turn or while cut off:
    fencing makes it harmless); never two of the same term."""
    leaders = [(node, replicator) for name, node in network.nodes.items()
               if name not in network.down and (replicator := node.quorum.groups[KEY].replicator) is not None]
    terms = [replicator.term for _, replicator in leaders]
    assert len(set(terms)) == len(terms), "two leaders of one term"
    return max(leaders, key=lambda pair: pair[1].term)[0] if leaders else None


def the_leader(network: Network) -> Node:
    """The leader, where the test knows there is one."""
    node = leader(network)
    assert node is not None, "no leader"
    return node


def replicator_of(node: Node) -> OpLogShipper:
    """The replicator of the group on ``node``, which leads it."""
    replicator = node.quorum.groups[KEY].replicator
    assert replicator is not None, f"{node.name} does not lead"
    return replicator


def election_over(node: Node) -> bool:
    electing = node.quorum.groups[KEY].electing
    assert electing is not None  # (one has started)
    return electing.done()


def take(queue: QuorumQueue) -> Entry:
    """basic.get, unsettled, of a message the test knows is ready."""
    entry = queue.get(no_ack=False)
    assert entry is not None
    return entry


def queue_of(node: Node) -> QuorumQueue:
    queue = node.broker.vhosts["/"].queues["q"]
    assert isinstance(queue, QuorumQueue)
    return queue


def publish(node: Node, bodies: list[bytes], confirms: Confirms | None = None) -> None:
    vhost = node.broker.vhosts["/"]
    properties = commands.Basic.Properties(delivery_mode=2)
    for body in bodies:
        node.broker.publish(vhost, vhost.exchange(""), make_message("", "q", properties, body), confirm=confirms)


def in_step(network: Network) -> bool:
    """The leader's live followers have all it shipped."""
    node = leader(network)
    return node is not None and all(lag == 0 for name, lag in node.quorum.lag()[KEY].items()
                                    if name not in network.down)


def copy_of(node: Node) -> tuple:
    """A node's copy: its state, and its rows as (seq, held, returns, expiry, message)."""
    group = node.quorum.groups[KEY]
    persistence = node.broker.persistence
    persistence.index.commit()
    rows = [(row.seq, row.delivered, row.returns, row.expiry, persistence.store.read(row.msg_id))
            for row in persistence.index.entries(group.index_id)]
    return group.state, rows


async def copies_agree(network: Network, restarted: str = "") -> list[bytes]:
    """Once the followers are in step, every copy is the leader's (and its rows say what is served first); the
    bodies of the ready messages, in the order they are served.  The copy of ``restarted``, read back from its
    rows, knows not the terms its checked-out entries were checked out in (``ReplicaStore.copy_state``)."""
    await wait_for(lambda: in_step(network), "the followers in step")
    node = the_leader(network)
    state, rows = copy_of(node)
    assert state == queue_of(node).state
    for name, other in network.nodes.items():
        if name not in network.down:
            other_state, other_rows = copy_of(other)
            expected = state
            if restarted in (name, node.name):  # (a term one side knows not is no difference)
                unknown = {seq for seq, term in (*state.checked_out.items(), *other_state.checked_out.items())
                           if not term}
                expected = state.copy()
                for either in (expected, other_state):
                    either.checked_out = {seq: 0 if seq in unknown else term
                                          for seq, term in either.checked_out.items()}
            assert other_state == expected, name
            assert set(other_rows) ^ set(rows) == set(), name  # (the rows that differ)
            assert other_rows == rows, name
            group = other.quorum.groups[KEY]
            assert other.broker.replicas.copy_state(group.index_id).returns == state.returns, name
    records = {row[0]: row[4] for row in rows}
    return [body_of(records[seq]) for seq in machine.ready_order(state)]


def body_of(record: bytes) -> bytes:
    message = Message.stored(0, 0)
    message.fill_from(record)
    return message.body


async def declared(network: Network, **arguments) -> Node:
    await network.declare("q", "n1", **arguments)
    await wait_for(lambda: all(node.quorum.groups[KEY].leader == "n1" for node in network.nodes.values()),
                   "n1 leading everywhere")
    return network.nodes["n1"]


AT_LEAST_ONCE = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead",  # (no queue "dead": they wait)
                 "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def bodies(count: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i:05d}".encode() for i in range(count)]


# -- replication --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
async def test_followers_apply_the_leaders_ops_and_their_copies_are_the_leaders(network, seed):
    """Whatever clients do at the leader — publish, get, ack, nack, reject, purge, commit, a policy's delivery
    limit — each follower's state and rows end where the leader's are."""
    node = await declared(network, **{"x-delivery-limit": 2})
    await client_work(node, random.Random(seed), 200)
    await copies_agree(network)


async def client_work(node: Node, rng: random.Random, steps: int, prefix: bytes = b"s",
                      purge: float = 0.2) -> list[Entry]:
    """Random client work at the leader ``node``: publish, get, ack, nack, reject, purge (``purge``: its odds when
    drawn), commit.  Returns the entries it left held."""
    queue = queue_of(node)
    held: list = []
    sent = 0
    for _ in range(steps):
        action = rng.choice(["publish"] * 4 + ["get", "get", "ack", "nack", "reject", "purge", "commit"])
        if action == "publish":
            count = rng.randint(1, 20)
            publish(node, [b"%s%d" % (prefix, i) for i in range(sent, sent + count)])
            sent += count
        elif action == "get":
            entry = queue.get(no_ack=rng.random() < 0.3)
            if entry is not None and entry.seq in queue.held:
                held.append(entry)
        elif action in ("ack", "nack", "reject") and held:
            chosen = rng.sample(held, rng.randint(1, len(held)))
            held = [entry for entry in held if entry not in chosen]
            node.broker.settle(queue, chosen, action == "nack", action == "reject")
        elif action == "purge" and rng.random() < purge:
            queue.purge()
        elif action == "commit":
            queue.remove_upto((queue.state.ready.first() or 0) + rng.randint(0, 5))
        if rng.random() < 0.2:
            await asyncio.sleep(0)  # a loop turn: what was staged is shipped
    return held


async def drain(queue: QuorumQueue) -> list[bytes]:
    """basic.get with no ack until the queue is empty: the bodies, as they come."""
    got = []
    while (entry := queue.get(no_ack=True)) is not None:
        got.append(entry.message.body)
    return got


async def restarted_in_order(network: Network, name: str) -> None:
    """``name`` restarts, its state read back from its rows, and catches up: its ready entries, those served first
    and their counts are the leader's.  (Not all its state: rows keep neither the terms of checkouts nor the
    queue's arguments, which the leader's ops and its own start bring.)"""
    await network.kill(name)
    await network.start_node(name)
    await wait_for(lambda: in_step(network), "the followers in step")
    ours, theirs = network.nodes[name].quorum.groups[KEY].state, queue_of(the_leader(network)).state
    assert (ours.ready, ours.returns, ours.counts) == (theirs.ready, theirs.returns, theirs.counts)
    assert theirs.returns


async def test_returns_to_the_front_are_served_first_by_every_copy_a_restarted_one_and_the_next_leader(network):
    """Under a delivery limit a nack returns a message to the front (``rabbit_fifo``'s ``returns``, served first
    in the order they came back): every follower applies it so, one restarted reads it back from its rows, and the
    next leader serves them first."""
    node = await declared(network, **{"x-delivery-limit": 5})
    publish(node, [b"a", b"b", b"c"])
    queue = queue_of(node)
    a, b = take(queue), take(queue)
    node.broker.settle(queue, [b], True)
    node.broker.settle(queue, [a], True)
    publish(node, [b"d"])
    assert await copies_agree(network) == [b"b", b"a", b"c", b"d"]
    await restarted_in_order(network, "n3")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert await drain(queue_of(the_leader(network))) == [b"b", b"a", b"c", b"d"]


async def test_a_publish_is_confirmed_once_a_majority_has_it(network):
    node = await declared(network)
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await asyncio.sleep(0.3)
    assert confirms.outcomes == {}  # the leader alone is no majority
    network.release("n1", "n3")
    await wait_for(lambda: confirms.acked() == list(range(1, 11)), "the confirms")
    network.release("n1", "n2")
    await copies_agree(network)


async def test_publishes_through_a_follower_are_answered_a_turn_at_a_time_in_one_frame(network):
    """n2's publishes a majority took together are answered in one CONFIRMS frame (a frame each cost both nodes
    a frame's work per publish), in order."""
    await declared(network)
    frames: list[tuple[int, bytes]] = []
    deliver = network.deliver

    def watched(source: str, destination: str, ftype: int, payload: bytes) -> None:
        if (source, destination) == ("n1", "n2") and ftype in (link.CONFIRM, link.CONFIRMS):
            frames.append((ftype, payload))
        deliver(source, destination, ftype, payload)

    network.deliver = watched  # (the frames n1 answers n2 with, seen)
    confirms = Confirms()
    publish(network.nodes["n2"], bodies(10), confirms)
    await wait_for(lambda: confirms.acked() == list(range(1, 11)), "the confirms")
    assert {ftype for ftype, _ in frames} == {link.CONFIRMS} and len(frames) < 10
    answers = [answer for _, payload in frames for answer in link.CONFIRM_BODY.iter_unpack(payload)]
    assert [status for _, status in answers] == [link.CONFIRM_OK] * 10
    assert [seq for seq, _ in answers] == sorted(seq for seq, _ in answers)
    await copies_agree(network)


async def test_a_leader_counts_its_own_copy_toward_a_majority_only_once_it_is_on_disk(network, monkeypatch):
    """The leader and one follower are a majority only with the leader's group commit done: a confirm counted
    on the leader's page cache would be lost by a power loss of the leader and of the other follower."""
    node = await declared(network)
    await copies_agree(network)
    persistence = node.broker.persistence
    disk = threading.Event()
    fsync = persistence._fsync

    def slow_fsync(*args):
        disk.wait(10)
        fsync(*args)

    monkeypatch.setattr(persistence, "_fsync", slow_fsync)
    network.hold("n1", "n2")
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: replicator_of(node).followers["n3"].match == replicator_of(node).index, "n3's copy")
    await asyncio.sleep(0.2)
    assert confirms.outcomes == {}  # n3 and an unwritten copy are no majority
    disk.set()
    await wait_for(lambda: confirms.acked() == list(range(1, 11)), "the confirms")
    network.release("n1", "n2")
    await copies_agree(network)


async def test_a_follower_whose_disk_refuses_a_row_acknowledges_no_op_it_lacks_and_takes_a_snapshot(
        network, monkeypatch):
    """n2's disk refuses the fifth row of a frame: its state had taken the frame's ops, its rows not all of
    them.  Caught up from the log afterwards, it skipped the ops its state had seen and acknowledged them: n1
    and n2 confirmed a message n2 had no row of.  Its copy holds less than its state says: it takes a
    snapshot, as a copy that lost messages at its restart does, and acknowledges nothing until then."""
    node = await declared(network)
    await copies_agree(network)
    n2 = network.nodes["n2"]
    replicas = n2.broker.replicas
    store_row = replicas.store_row
    calls = 0

    def refusing(*args, **kwargs) -> None:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        store_row(*args, **kwargs)

    monkeypatch.setattr(replicas, "store_row", refusing)
    monkeypatch.setattr(quorum, "CHECKS", False)  # (as in production: the copy's check would stop n2 first)
    network.hold("n1", "n3")  # (n1 and n2 are the majority)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await asyncio.sleep(0.1)
    publish(node, bodies(10, "n"), confirms)  # (a gap n2 sees: it asks to catch up)
    await wait_for(lambda: confirms.acked() == list(range(1, 21)), "the confirms")
    assert sorted(body_of(row[4]) for row in copy_of(n2)[1]) == bodies(10) + bodies(10, "n")
    network.release("n1", "n3")
    assert await copies_agree(network) == bodies(10) + bodies(10, "n")


def failing_disk(node: Node, monkeypatch) -> None:
    """``node``'s next group commits fail at their fsync (an I/O error): nothing is durable there again."""
    def failing(*args) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(node.broker.persistence, "_fsync", failing)


async def test_a_leader_whose_disk_fails_steps_down_and_its_publishes_are_confirmed_by_the_next(network, monkeypatch):
    """n1's fsync fails while n2 does not hear it: n1's copy never counts again, and n3's alone is no majority.
    n1 led on, confirming and refusing nothing, for as long as n2 stayed away.  As a Ra server whose log write
    fails restarts a follower, n1 steps down and stands in no election; n2 and n3 elect one of them, and n1's
    window sends its publishes there, which confirms each once a majority has it."""
    node = await declared(network)
    await copies_agree(network)
    network.hold("n1", "n2")
    failing_disk(node, monkeypatch)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: confirms.acked() == list(range(1, 11)), "the confirms")
    assert the_leader(network).name == "n3"
    assert sorted(body_of(row[4]) for row in copy_of(network.nodes["n3"])[1]) == bodies(10)  # (each once)
    network.release("n1", "n2")
    await asyncio.sleep(0.5)
    assert the_leader(network).name == "n3"  # (n1 never leads again: it would confirm nothing)


# -- catch-up -----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["leader", "frame", "clear"]), st.integers(1, 3), st.integers(-1, 1),
                          st.lists(st.binary(min_size=1, max_size=9), max_size=6)), max_size=25))
def test_the_log_a_copy_keeps_gives_back_its_latest_ops_whichever_way_they_came(steps):
    """``History`` keeps a leader's turns and a follower's frames as they came (no object per op), trimmed an op
    at a time to ``LOG_BYTES``: it gives back the ops after an index, and says which positions they pass
    through, as a plain list of ``(term, index, op)`` does."""
    limit = 40
    history = quorum_log.History()
    model: list[tuple[int, int, bytes]] = []  # (term, index, op), oldest first
    original = quorum_log.LOG_BYTES
    quorum_log.LOG_BYTES = limit
    try:
        index = 0
        for kind, term, gap, ops in steps:
            if kind == "clear":
                history.clear()
                model.clear()
                continue
            first = max(index + 1 + gap, 1)
            if kind == "leader":
                history.add(term, first, ops)
            else:  # a follower's frame: a head, then the ops one after another
                frame, bounds = b"head", list[int]()
                for op in ops:
                    bounds += (len(frame), len(frame) + len(op))
                    frame += op
                history.extend(term, first, frame, bounds)
            if ops:
                if model and model[-1][1] + 1 != first:
                    model.clear()
                model += [(term, first + i, op) for i, op in enumerate(ops)]
                while sum(len(op) for _, _, op in model) > limit:
                    model.pop(0)
                index = first + len(ops) - 1
            for at in range(index - 8, index + 2):
                expected = None
                if model and model[-1][1] >= at and model[0][1] <= at + 1:
                    expected = [(t, i, op) for t, i, op in model if i > at]
                assert history.after(at) == expected
                for t in (0, 1, 2, 3):
                    terms = {i: t_ for t_, i, _ in model}
                    assert history.passes(t, at) == (t > 0 and (terms.get(at) == t or terms.get(at + 1) == t))
    finally:
        quorum_log.LOG_BYTES = original



@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.binary(min_size=1, max_size=9), max_size=6)),
                max_size=40))
def test_the_node_s_op_logs_keep_together_at_most_their_budget_each_giving_up_its_oldest(steps):
    """``LogBudget``: the logs of a node's copies hold together at most its limit.  Past it, the longest give up
    their oldest ops down to a common cap: each keeps the latest of what it took, and a log trimmed is no shorter
    than one left whole, but for an op."""
    budget = quorum_log.LogBudget(60)
    logs = [quorum_log.History(budget) for _ in range(4)]
    taken: list[list[bytes]] = [[] for _ in logs]
    nexts = [1] * len(logs)
    for which, ops in steps:
        before = [log.size for log in logs]
        logs[which].add(1, nexts[which], ops)
        nexts[which] += len(ops)
        taken[which] += ops
        assert budget.size == sum(log.size for log in logs) <= budget.limit
        for log, ops_taken in zip(logs, taken):
            kept = [op for _, _, op in log.after(log._first() - 1) or ()]
            assert kept == ops_taken[len(ops_taken) - len(kept):] and len(b"".join(kept)) == log.size
        grew = [size + (len(b"".join(ops)) if i == which else 0) for i, size in enumerate(before)]
        trimmed = [log.size for log, size in zip(logs, grew) if log.size < size]
        whole = [log.size for log, size in zip(logs, grew) if log.size == size]
        if trimmed and whole:
            assert min(trimmed) + 9 > max(whole)


async def test_the_copies_of_a_node_share_one_budget_for_their_logs(network):
    """Two queues' copies on each node keep, together, no more of their latest ops than the node's budget, and
    agree all the same."""
    node = await declared(network)
    await network.declare("q2", "n1")
    await wait_for(lambda: all(n.quorum.groups[queue_key("/", "q2")].leader == "n1" for n in network.nodes.values()),
                   "n1 leading q2 everywhere")
    for each in network.nodes.values():
        each.quorum.logs.limit = 30_000
    vhost = node.broker.vhosts["/"]
    properties = commands.Basic.Properties(delivery_mode=2)
    for body in bodies(2000):
        for name in ("q", "q2"):
            node.broker.publish(vhost, vhost.exchange(""), make_message("", name, properties, body))
    await copies_agree(network)
    for name, each in network.nodes.items():
        groups = each.quorum.groups.values()
        assert all(group.history.budget is each.quorum.logs for group in groups), name
        assert each.quorum.logs.size == sum(group.history.size for group in groups) <= 30_000, name


async def test_a_follower_that_was_down_catches_up_from_the_log(network, caplog):
    node = await declared(network)
    publish(node, [b"first"])
    await copies_agree(network)
    await network.kill("n3")
    publish(node, bodies(500))
    queue = queue_of(node)
    entries = [take(queue) for _ in range(50)]
    node.broker.settle(queue, entries[:20], False)
    node.broker.settle(queue, entries[20:30], True)  # back, counted
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    await network.start_node("n3")  # from its rows: its state is read back from them
    assert await copies_agree(network) == [*bodies(500)[49:], *[e.message.body for e in entries[20:30]]]
    assert any("n3 catches up on" in record.message and "from the log" in record.message
               for record in caplog.records)
    assert not any("takes a snapshot" in record.message for record in caplog.records)


async def test_a_follower_back_whose_links_come_up_before_it_knows_the_leader_catches_up(network):
    """n3 comes back behind on an idle queue, its copy of the leader's term; its links come up before etcd tells it
    who leads, so the leader's probe finds it following nobody and is ignored.  Once it follows the leader it asks
    to catch up all the same, rather than wait for ops that an idle queue never ships (a real cluster's follower
    stayed 5,000 ops behind for a minute so)."""
    node = await declared(network)
    publish(node, [b"first"])
    await copies_agree(network)
    await network.kill("n3")
    confirms = Confirms()
    publish(node, bodies(50), confirms)
    await wait_for(lambda: len(confirms.acked()) == 50, "the publishes confirmed")
    n3 = Node(network, "n3", network.root / "n3")
    network.nodes["n3"] = n3
    network.down.discard("n3")
    await n3.quorum.start()
    n3.client.unreachable = True  # (etcd answers it only once its links are up)
    for record in network.records:
        n3.quorum.put_queue(n3.broker.vhosts["/"], record)
    for other in ("n1", "n2"):
        network._link("n3", other, True)
    await asyncio.sleep(0.3)
    assert n3.quorum.groups[KEY].leader == ""
    n3.client.unreachable = False
    await wait_for(lambda: n3.quorum.groups[KEY].leader == "n1", "n3 following n1")
    assert await copies_agree(network) == [b"first", *bodies(50)]


async def test_a_request_to_catch_up_in_the_turn_of_ops_not_yet_shipped_gets_them_too(network, caplog):
    """The leader's log takes a turn's ops as it ships them: a catch-up asked in that turn ships them first, so
    that they are in the log the follower is sent (else it would miss them, and wait for the next op to ask
    again)."""
    node = await declared(network)
    publish(node, [b"first"])
    await copies_agree(network)
    replicator = replicator_of(node)
    applied = network.nodes["n3"].quorum.groups[KEY].applied
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    publish(node, bodies(5))
    assert replicator.ops  # (staged: shipped at the end of the turn)
    replicator.catch_up("n3", replicator.term, applied)
    assert await copies_agree(network) == [b"first", *bodies(5)]
    assert sum("n3 catches up on" in record.message for record in caplog.records) == 1


async def test_a_follower_that_missed_more_than_the_log_gets_a_snapshot_while_the_queue_changes(
        network, monkeypatch, caplog):
    """The snapshot is the state at an index, then the rows a chunk per loop turn while consumers take, ack
    and return messages and publishers publish, then the ops since that index: the copy ends as the
    leader's."""
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 20_000)
    monkeypatch.setattr(quorum_log, "SNAPSHOT_CHUNK", 64)
    node = await declared(network, **{"x-delivery-limit": 3})
    publish(node, [b"first"])
    await copies_agree(network)
    await network.kill("n3")
    publish(node, bodies(2000))
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    await network.start_node("n3")
    queue = queue_of(node)
    follower = replicator_of(node).followers["n3"]
    copy = network.nodes["n3"].quorum.groups[KEY]
    rng = random.Random(7)
    held: list = []
    sent = 0
    started = False
    deadline = asyncio.get_running_loop().time() + 30
    while not (started and follower.snapshot is None and follower.joined and copy.incoming is None):
        assert asyncio.get_running_loop().time() < deadline
        started = started or follower.snapshot is not None
        for _ in range(5):
            entry = queue.get(no_ack=False)
            if entry is not None:
                held.append(entry)
        if held:
            chosen = rng.sample(held, rng.randint(1, len(held)))
            held = [entry for entry in held if entry not in chosen]
            node.broker.settle(queue, chosen, rng.random() < 0.5)
        publish(node, bodies(5, f"later{sent}-"))
        sent += 1
        await asyncio.sleep(0)
    assert sent > 10  # the queue changed all along the snapshot
    assert any("n3 takes a snapshot" in record.message for record in caplog.records)
    await copies_agree(network)


async def test_a_snapshot_keeps_the_dead_letters_waiting_in_the_copy_it_makes_through_its_restart(network, monkeypatch):
    """n3 gets a snapshot of a queue with dead letters waiting (at least once): its rows of them are flagged
    held as the leader's, and its copy, read back from them at a restart, keeps them waiting rather than
    returning them as checked out — the copy would differ, and lead with them back among the ready messages."""
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 2_000)
    n1 = await declared(network, **AT_LEAST_ONCE)
    queue = queue_of(n1)
    await network.kill("n3")
    publish(n1, bodies(200))
    dead = [take(queue) for _ in range(3)]
    n1.broker.settle(queue, dead, requeue=False, reject=True)
    assert sorted(queue.state.dead) == [entry.seq for entry in dead]
    n3 = await network.start_node("n3")
    assert await copies_agree(network) == bodies(200)[3:]
    await network.kill("n3")
    n3 = await network.start_node("n3")
    assert sorted(n3.quorum.groups[KEY].state.dead) == [entry.seq for entry in dead]
    assert await copies_agree(network) == bodies(200)[3:]


async def test_a_snapshot_brings_the_returns_to_the_front_in_their_order_and_its_rows_say_so(
        network, monkeypatch, caplog):
    """A follower that missed more than the log takes a snapshot while messages are returned to the front (nacks
    under a delivery limit): its state serves them first in the same order, its rows say so (it reads them back
    so once restarted), and the next leader among the others serves them first too."""
    node = await n3_far_behind(network, monkeypatch, None, 5)
    queue = queue_of(node)
    taken = [take(queue) for _ in range(3)]
    node.broker.settle(queue, [taken[2]], True)  # (in the snapshot's state and rows)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    network.hold("n1", "n3")
    await network.start_node("n3")
    await snapshot_under_way(network)
    node.broker.settle(queue, [taken[0]], True)  # (in the ops that follow the snapshot's rows)
    network.release("n1", "n3")
    order = [bodies(1000)[1], b"first", *bodies(1000)[2:]]
    assert await copies_agree(network) == order
    assert any("n3 takes a snapshot" in record.message for record in caplog.records)
    await restarted_in_order(network, "n3")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    node = the_leader(network)
    assert await drain(queue_of(node)) == order


async def test_a_declaration_whose_claim_meets_a_lapsed_lease_is_declared_and_its_leader_elected(network):
    """Finding (a full suite under load): the declaring node's etcd lease had just lapsed, etcd refused its claim
    ("requested lease not found"), and the declaration failed with 541 INTERNAL_ERROR, the client's connection
    closed.  The queue exists by then; its members elect a leader as for any queue without one."""
    record = QueueRecord("/", "q", True, False, {"x-queue-type": "quorum"}, node="n1", members=list(NAMES))
    for node in network.nodes.values():
        node.quorum.put_queue(node.broker.vhosts["/"], record)
    n1 = network.nodes["n1"].quorum
    assert n1.lease is not None
    network.etcd.revoke(n1.lease.id)
    assert await n1.claim_first("/", "q") is None
    await wait_for(lambda: leader(network) is not None, "a leader elected")


def small_link_frames(monkeypatch) -> None:
    """Links that take frames of at most 300 KB (the fake cluster refuses a larger one as a real link's reader
    does: the link closes, and is dialled again), and ops or rows of at most 100 KB a frame."""
    monkeypatch.setattr(link, "MAX_FRAME", 300_000)
    monkeypatch.setattr(quorum_log, "FRAME_BYTES", 100_000)


async def test_a_snapshots_rows_come_into_its_spare_once_each_whatever_comes_twice(network):
    """A follower writes a snapshot's rows above the highest it wrote with no lookup, a frame's at once: a seq that
    comes again (read ready, then among the held rows at the end, the highest among them) keeps the row it has,
    and its message is in the store once, as when every row was looked up."""
    n3 = network.nodes["n3"].broker
    record = b"".join(make_message("", "q", commands.Basic.Properties(delivery_mode=2), b"body").payload())
    state = quorum_log.machine.encode_state(quorum_log.machine.State())

    def rows(*seqs: int, held: bool = False) -> list[bytes]:
        return [quorum_log.ENTRY.pack(quorum_log.ENTRY_OP, seq, 0, held, 0, 4, len(record)) + record for seq in seqs]

    frames = [b"".join([quorum_log.MARK.pack(quorum_log.RESET_OP, len(state)), state, *rows(1, 2, 3)]),
              b"".join([quorum_log.MARK.pack(quorum_log.MORE_OP, 0), *rows(4), *rows(2, 4, 5, held=True)])]
    copies = []
    for spare in (quorum_log.SpareRows(), None):  # (None: each row looked up, as a frame of ops' rows are)
        index_id = n3.next_index_id()
        records = len(n3.persistence.store.index)
        for frame in frames:
            quorum_log.apply(quorum_log.machine.State(), n3.replicas, index_id, frame, 0, 7, spare=spare)
        n3.persistence.index.commit()
        copies.append([(row.seq, row.delivered, n3.persistence.store.read(row.msg_id))
                       for row in n3.persistence.index.entries(index_id)])
        assert len(n3.persistence.store.index) - records == 5
    assert copies[0] == copies[1] == [(1, False, record), (2, False, record), (3, False, record), (4, False, record),
                                      (5, True, record)]


async def test_a_snapshot_row_keeps_a_delivery_count_past_255(network, monkeypatch):
    """A snapshot's row carried its entry's delivery count in a byte: a follower that took the queue by snapshot
    kept 255 for a message returned 300 times, and counted from there once it led, or after its restart."""
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 1_000)
    node = await declared(network)
    await network.kill("n3")
    publish(node, [b"poison"])
    queue = queue_of(node)
    for _ in range(300):
        node.broker.settle(queue, [take(queue)], True)
        await asyncio.sleep(0)
    await network.start_node("n3")
    await copies_agree(network)
    await network.kill("n3")
    n3 = await network.start_node("n3")
    assert list(n3.quorum.groups[KEY].state.counts.values()) == [300]


async def test_a_snapshot_of_large_messages_goes_in_frames_a_link_takes(network, monkeypatch):
    """Finding: a snapshot's rows went 4,096 to a frame whatever their size, so a follower of a queue holding
    4,096 messages of 64 KiB was sent a frame its link refuses (above 256 MiB): the link closed, the follower
    asked again, got the same frame, and never came back into step.  Rows now go ``FRAME_BYTES`` to a frame."""
    small_link_frames(monkeypatch)
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 20_000)
    node = await declared(network)
    await network.kill("n3")
    sent = [bytes([i]) * 20_000 for i in range(60)]  # 1.2 MB: no frame of them all fits
    for i in range(0, 60, 4):  # (a turn's ops fit in one frame)
        publish(node, sent[i:i + 4])
        await asyncio.sleep(0)
    await network.start_node("n3")
    assert await copies_agree(network) == sent


async def test_a_turn_of_large_publishes_goes_to_followers_in_frames_a_link_takes(network, monkeypatch):
    """Finding: a turn's ops went in one frame, so publishes of large messages arriving together (twenty of
    16 MiB) made a frame a follower's link refuses, and the catch-up sent it again: no confirm, ever."""
    small_link_frames(monkeypatch)
    node = await declared(network)
    confirms = Confirms()
    publish(node, [bytes([i]) * 20_000 for i in range(30)], confirms)  # one turn's
    await wait_for(lambda: len(confirms.acked()) == 30, "every publish confirmed")
    await copies_agree(network)


async def n3_far_behind(network: Network, monkeypatch, confirms: Confirms | None = None,
                        delivery_limit: int | None = None) -> Node:
    """n3 went down, then the leader (n1) took 1,000 messages, more than its log keeps: n3 will need a snapshot
    (of 32 rows a frame, so that it takes many loop turns)."""
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 10_000)
    monkeypatch.setattr(quorum_log, "SNAPSHOT_CHUNK", 32)
    node = await declared(network, **({} if delivery_limit is None else {"x-delivery-limit": delivery_limit}))
    publish(node, [b"first"])
    await copies_agree(network)
    await network.kill("n3")
    publish(node, bodies(1000), confirms)
    return node


async def snapshot_under_way(network: Network, name: str = "n3") -> None:
    """n1's frames to ``name`` (held since before it started) go on one at a time until a snapshot is coming
    in there, and the rest of it waits.  (Polled instead, a snapshot of a thousand rows can be
    whole a few milliseconds after it began, between two looks.)"""
    copy = network.nodes[name].quorum.groups[KEY]
    deadline = asyncio.get_running_loop().time() + 10
    while copy.incoming is None:
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {name}'s snapshot under way"
        if network.release_one("n1", name):
            await asyncio.sleep(0)  # (delivered: it was scheduled before this task's next step)
        else:
            await asyncio.sleep(0.01)  # n1 has not sent it yet


async def test_a_snapshot_whose_rows_the_disk_refuses_is_asked_for_again_not_installed_short(network, monkeypatch):
    """n3's disk refuses a frame of a snapshot's rows: the rest of the snapshot came into its spare and
    became its copy without them, which it then acknowledged.  The snapshot's rows go, its copy stays as it
    was, and it asks again."""
    await n3_far_behind(network, monkeypatch)
    monkeypatch.setattr(quorum, "CHECKS", False)  # (as in production: the copy's check would stop n3 first)
    network.hold("n1", "n3")
    n3 = await network.start_node("n3")
    replicas = n3.broker.replicas
    store_rows = replicas.store_rows
    calls = 0

    def refusing(*args, **kwargs) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(errno.EIO, "Input/output error")
        store_rows(*args, **kwargs)

    monkeypatch.setattr(replicas, "store_rows", refusing)
    network.release("n1", "n3")
    await wait_for(lambda: calls > 3, "more of the snapshot's rows")
    assert await copies_agree(network) == [b"first", *bodies(1000)]


async def test_a_copy_a_snapshot_is_coming_into_counts_toward_no_majority(network, monkeypatch):
    """n2 hears nothing for a while and n3 comes back to a snapshot: a publish meanwhile is on n1 alone until
    n3's snapshot is whole, however far the snapshot's first frame says n3's copy reaches (it may not have that
    message's row yet: confirmed then, it would be lost with n1 should n2 lead next)."""
    node = await n3_far_behind(network, monkeypatch)
    await wait_for(lambda: node.quorum.lag()[KEY]["n2"] == 0, "n2 in step")
    network.hold("n1", "n2")
    confirms = Confirms()
    publish(node, [b"x"], confirms)
    network.hold("n1", "n3")
    await network.start_node("n3")
    n3 = network.nodes["n3"].quorum.groups[KEY]
    await snapshot_under_way(network)
    await asyncio.sleep(0.3)
    assert confirms.outcomes == {}
    network.release("n1", "n3")
    await wait_for(lambda: confirms.acked() == [1], "x confirmed once n3's copy is whole")
    assert n3.incoming is None
    network.release("n1", "n2")
    assert (await copies_agree(network))[-1] == b"x"


# -- elections ----------------------------------------------------------------------------------


async def n3_behind(network: Network, count: int) -> None:
    """n1 leads ``count`` messages all have, then 50 "late" ones confirmed by n1 and n2 only (n3's link is slow:
    what n1 sends it waits)."""
    node = await declared(network)
    publish(node, bodies(count))
    await copies_agree(network)
    network.hold("n1", "n3")
    confirms = Confirms()
    publish(node, bodies(50, "late"), confirms)
    await wait_for(lambda: confirms.acked() == list(range(1, 51)), "the late ones confirmed by n1 and n2")


async def test_the_highest_position_of_a_majority_leads_with_every_confirmed_message(network):
    """n3 missed the last publishes (its link was slow): n2's copy is ahead, so n2 leads although the tie-break
    favours n3; whatever was confirmed is there."""
    await n3_behind(network, 100)
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert the_leader(network).name == "n2"
    assert await copies_agree(network) == [*bodies(100), *bodies(50, "late")]


async def test_a_leader_killed_while_etcd_restarts_is_replaced_as_soon_as_etcd_is_back(network):
    """Etcd gives every lease its whole TTL anew when it starts: the key of a leader killed while etcd was away
    stood a lease past etcd's return.  The followers whose links the dead node closed revoke its lease once etcd
    answers, and the members elect at once; every confirmed message is there."""
    node = await declared(network)
    publish(node, bodies(100))
    await copies_agree(network)
    network.etcd.stop()
    await network.kill("n1")
    await asyncio.sleep(0.5)
    network.etcd.start()
    back = asyncio.get_running_loop().time()
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert asyncio.get_running_loop().time() - back < quorum.LEASE_TTL / 2
    assert await copies_agree(network) == bodies(100)


async def test_a_tie_goes_to_the_name_that_sorts_last_and_the_other_copy_is_adopted(network, caplog):
    node = await declared(network)
    publish(node, bodies(300))
    queue = queue_of(node)
    taken = take(queue)  # held when the leader goes: back in its place after the grace, counted
    await copies_agree(network)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    new = the_leader(network)
    assert new.name == "n3"
    assert taken.seq in queue_of(new).state.checked_out  # kept for a consumer that would take it back
    await wait_for(lambda: not queue_of(new).state.checked_out, "the grace period over")
    assert await copies_agree(network) == bodies(300)
    assert queue_of(new).state.count(taken.seq) == 1
    assert any("n2 catches up on" in record.message and "adopted" in record.message for record in caplog.records)
    assert not any("takes a snapshot" in record.message for record in caplog.records)


def lose_messages(node: Node, index_id: int, seqs: range) -> None:
    """``node`` (stopped) lost the messages of these entries of its copy, as a kill at the wrong moment left them:
    its rows name records its store does not have, and it was not shut down cleanly."""
    (node.data_dir / "msg_store_persistent" / "clean_shutdown").unlink()
    index = QueueIndex(str(node.data_dir / "queue_index"))
    try:
        for seq in seqs:
            row = index.remove(index_id, seq)
            assert row is not None
            index.publish(index_id, seq, 1 << 40 | seq, row.expiry, row.size, row.delivered, returns=row.returns)
        index.commit()
        index.sync()
    finally:
        index.close()


async def test_a_copy_that_lost_messages_at_its_restart_never_leads_and_takes_a_snapshot(network, caplog):
    """n3 comes back from a kill with entries whose message its store lost, its position as it was: its copy
    holds less than that position says.  Taken for whole (adopted, or elected by a tie-break) it went on without
    them, and so did every copy later snapshotted from it: confirmed messages no leader ever delivered."""
    node = await declared(network)
    publish(node, bodies(100))
    await copies_agree(network)
    n3 = network.nodes["n3"]
    index_id = n3.quorum.groups[KEY].index_id
    await network.kill("n3")
    lose_messages(n3, index_id, range(90, 100))
    caplog.set_level(logging.INFO, "warren.forwarder")
    n3 = await network.start_node("n3")
    group = n3.quorum.groups[KEY]
    assert not group.whole and group.ballot[2] == 0
    await wait_for(lambda: group.whole, "n3's copy whole again")
    assert await copies_agree(network) == bodies(100)
    assert any("n3 takes a snapshot" in record.message for record in caplog.records)
    await network.kill("n1")  # n3 is whole again: the tie goes to it
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert the_leader(network).name == "n3"
    assert await copies_agree(network) == bodies(100)


async def test_a_leader_killed_after_a_group_commit_took_rows_of_ops_it_had_not_shipped_is_adopted_whole(
        network, monkeypatch, tmp_path):
    """n1's rows of its last publishes went into a group commit before its shipper staged the position that
    covers them (the commit was due first in the loop turn), and n1 died before the next: its copy came back
    with entries past its position, of ops no one else had.  Adopted at that position by the next leader, it
    skipped that leader's own enqueues of the same seqs (a replay, its state said) and kept its own, unconfirmed
    ones: once it led again, the queue had lost what the others had confirmed there (nemesis seed 333)."""
    n1 = await declared(network)
    publish(n1, bodies(100))
    await copies_agree(network)
    persistence = n1.broker.persistence
    await wait_for(lambda: not persistence._syncing and not persistence.staged, "n1's disk idle")
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    commit = persistence._commit
    disk = tmp_path / "n1-killed"

    def commit_then_die() -> None:  # the disk as a kill -9 right after this commit leaves it
        commit()
        if not disk.exists():
            shutil.copytree(n1.data_dir, disk)

    monkeypatch.setattr(persistence, "_commit", commit_then_die)
    persistence.stage()  # a commit due before the shipper's turn, as under load
    publish(n1, bodies(10, "unshipped"))
    await wait_for(disk.exists, "the commit")
    await network.kill("n1")  # (what it held for n2 and n3 is lost with it)
    network.release("n1", "n2")
    network.release("n1", "n3")
    shutil.rmtree(n1.data_dir)
    shutil.copytree(disk, n1.data_dir)
    await wait_for(lambda: leader(network) is not None, "a new leader")
    publish(the_leader(network), bodies(5, "after"))
    assert await copies_agree(network) == [*bodies(100), *bodies(5, "after")]
    await network.start_node("n1")
    await wait_for(lambda: network.nodes["n1"].quorum.groups[KEY].leader == the_leader(network).name,
                   "n1 follows")
    assert await copies_agree(network) == [*bodies(100), *bodies(5, "after")]


@pytest.mark.parametrize("seed", range(8))
async def test_a_node_killed_right_after_any_group_commit_comes_back_with_a_copy_that_is_the_leaders_again(
        network, monkeypatch, tmp_path, seed):
    """Under random client work, a node (the leader, or a follower) is killed right after one of its group
    commits, drawn at random: nothing it sends after that commit leaves, and it restarts from its disk as that
    commit left it.  Whatever it held then, its copy is the leader's again once caught up — a copy whose rows and
    position disagree is adopted or continued wrongly, and the copies differ.  (Odd seeds dead-letter at least
    once, to nowhere: rejected messages wait.)"""
    rng = random.Random(seed)
    n1 = await declared(network, **{"x-delivery-limit": 3}, **(AT_LEAST_ONCE if seed % 2 else {}))
    await client_work(n1, rng, 40, b"before")
    await copies_agree(network)
    victim = network.nodes["n1" if seed % 4 else rng.choice(["n2", "n3"])]
    persistence = victim.broker.persistence
    commit = persistence._commit
    disk = tmp_path / "killed"
    due = rng.randint(1, 12)

    def commit_then_maybe_die() -> None:
        nonlocal due
        commit()
        due -= 1
        if due == 0:  # the disk as a kill -9 now leaves it; what the node sends from now on is lost with it
            shutil.copytree(victim.data_dir, disk)
            for other in NAMES:
                if other != victim.name:
                    network.hold(victim.name, other)

    monkeypatch.setattr(persistence, "_commit", commit_then_maybe_die)
    await client_work(n1, rng, 150)
    while not disk.exists():  # (a loaded machine batches more into each commit)
        await client_work(n1, rng, 5)
        await asyncio.sleep(0.01)
    await network.kill(victim.name)
    for other in NAMES:
        network.release(victim.name, other)
    shutil.rmtree(victim.data_dir)
    shutil.copytree(disk, victim.data_dir)
    await wait_for(lambda: leader(network) is not None, "a leader")
    await client_work(the_leader(network), rng, 40, b"between")
    await network.start_node(victim.name)
    await wait_for(lambda: network.nodes[victim.name].quorum.groups[KEY].leader == the_leader(network).name,
                   f"{victim.name} follows")
    await client_work(the_leader(network), rng, 40, b"after")
    await copies_agree(network, restarted=victim.name)


async def test_a_follower_restarted_from_its_rows_keeps_the_delivery_limit_its_copy_applies_ops_by(network):
    """n2 restarts, its copy read back from its rows, then n1 returns a message past the queue's delivery limit
    (dead-lettered: no new seq) and takes more publishes.  Had n2 come back without the limit its state holds
    (a Configure op's, long past), it moved that message to the back under the seq the leader's next enqueue
    took, skipped that enqueue as one it had, and acknowledged a copy without a confirmed message."""
    n1 = await declared(network, **{"x-delivery-limit": 1})
    queue = queue_of(n1)
    publish(n1, bodies(1))
    await copies_agree(network)
    await network.kill("n2")
    n2 = await network.start_node("n2")
    await wait_for(lambda: n2.quorum.groups[KEY].leader == "n1", "n2 follows n1")
    assert n2.quorum.groups[KEY].state.delivery_limit == 1
    for _ in range(2):  # the second return is past the limit
        entry = take(queue)
        n1.broker.settle(queue, [entry], requeue=True)
    publish(n1, bodies(2, "late"))
    assert await copies_agree(network) == bodies(2, "late")


async def test_a_copy_restarted_with_its_last_entries_gone_leads_on_from_the_seq_the_others_are_at(network):
    """Every message was taken and acked: n3's copy has no rows, its state's next seq 10 nowhere in them.  It
    restarts, then leads (the tie goes to it): its next enqueues must take seqs from 10 on — under seqs the
    others' states had passed, their copies took them for replays and skipped them (confirmed messages a
    majority acknowledged without having them)."""
    n1 = await declared(network)
    queue = queue_of(n1)
    publish(n1, bodies(10))
    n1.broker.settle(queue, [take(queue) for _ in range(10)], requeue=False)
    assert await copies_agree(network) == []
    await network.kill("n3")
    n3 = await network.start_node("n3")
    await wait_for(lambda: n3.quorum.groups[KEY].leader == "n1", "n3 follows n1")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is n3, "n3 leads")
    publish(n3, bodies(5, "after"))
    assert await copies_agree(network) == bodies(5, "after")


async def test_a_copy_of_the_previous_term_catches_up_from_the_new_leaders_log(network, caplog):
    """n3 missed the last ops of n1's term when n1 died: n2, elected with them, brings n3's copy to its own with
    the ops it took from n1 (and its own since), not with a snapshot of the whole queue — at every change of
    leader, a snapshot of a deep queue stalled the nodes past their leases, and the next term's leader sent
    another."""
    await n3_behind(network, 300)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    caplog.clear()
    await network.kill("n1")  # (what it held for n3 is lost with it)
    network.release("n1", "n3")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    new = the_leader(network)
    assert new.name == "n2"
    publish(new, bodies(20, "new"))
    assert await copies_agree(network) == [*bodies(300), *bodies(50, "late"), *bodies(20, "new")]
    assert any("n3 catches up on" in record.message and "continued" in record.message for record in caplog.records)
    assert not any("takes a snapshot" in record.message for record in caplog.records)
    await network.kill("n2")  # n3's copy is whole and of n2's term: with n1 back, the two elect one of them
    await network.start_node("n1")
    await wait_for(lambda: leader(network) is not None, "a leader of n1 and n3")
    assert await copies_agree(network) == [*bodies(300), *bodies(50, "late"), *bodies(20, "new")]


async def test_an_election_that_goes_on_says_what_it_waits_for(network, caplog, monkeypatch):
    """n2 alone of three stands in an election that cannot end: it logs, every ``ELECTION_TOLD``, what it waits
    for (so that a node log shows why a queue had no leader for seconds)."""
    monkeypatch.setattr(quorum, "ELECTION_TOLD", 0.2)
    await declared(network)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum")
    await network.kill("n3")
    await network.kill("n1")
    await wait_for(lambda: any("n2's election for" in record.message and "no majority of the members" in
                               record.message for record in caplog.records), "the election's progress logged")


async def test_a_node_naming_a_leader_whose_term_is_over_does_not_stop_an_election(network):
    """n3, alone, stands in an election once n1's key went; a node whose etcd watch missed that (it started while
    etcd was frozen) names n1, of that term, as the leader: n3 stands on rather than follow a dead leader (and
    begin its election anew at each such word, twice a second)."""
    node = await declared(network)
    term = node.quorum.groups[KEY].term
    await network.kill("n2")
    await network.kill("n1")
    group = network.nodes["n3"].quorum.groups[KEY]
    await wait_for(lambda: group.leader == "" and group.electing is not None, "n3 standing")
    group.window.hinted("n1", term)
    assert group.leader == "" and not group.electing.done()


async def test_a_deposed_leaders_copy_with_ops_the_next_never_had_gets_a_snapshot(network, caplog):
    """n1, cut off from n2 and n3, took publishes no majority has; n2 leads the next term, and its log passes
    where n1's copy stood before them, not where it stands: n1's copy of those ops is replaced."""
    node = await declared(network)
    publish(node, bodies(100))
    await copies_agree(network)
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    publish(node, bodies(30, "lone"))  # (no confirm: on n1 alone)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    network.cut("n1", "n2")
    network.cut("n1", "n3")
    network.release("n1", "n2")  # (nothing: the cuts dropped what was held)
    network.release("n1", "n3")
    assert node.quorum.lease is not None
    network.etcd.revoke(node.quorum.lease.id)
    await wait_for(lambda: (found := leader(network)) is not None and found.name != "n1", "a new leader")
    new = the_leader(network)
    publish(new, bodies(40, "new"))  # past the index n1's copy reached
    await wait_for(lambda: new.quorum.lag()[KEY][({"n2", "n3"} - {new.name}).pop()] == 0, "n2 and n3 in step")
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    assert await copies_agree(network) == [*bodies(100), *bodies(40, "new")]
    assert any("n1 takes a snapshot" in record.message for record in caplog.records)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=60), st.integers(0, 70))
def test_a_diff_sends_the_entries_below_its_seq_the_copy_lacks_and_no_other(places, below):
    """``oplog.missing``: of the leader's entries below ``below``, those the copy holds nowhere (ready or held),
    as the leader holds them (ready runs, held seqs)."""
    from amqp_server.queues.quorum_machine import State

    ours, theirs = State(), State()
    for seq, (mine, copy) in enumerate(places):  # 0: absent, 1: ready, 2: checked out, 3: a waiting dead letter
        for state, place in ((ours, mine), (theirs, copy)):
            if place == 1:
                state.ready.add(seq)
            elif place == 2:
                state.checked_out[seq] = 1
            elif place == 3:
                state.dead[seq] = "rejected"
    ready, held = quorum_log.missing(ours, theirs, below)
    has = set(theirs.ready) | theirs.checked_out.keys() | set(theirs.dead)
    assert list(ready) == [seq for seq in ours.ready if seq < below and seq not in has]
    assert held == {seq for seq in ours.checked_out.keys() | set(ours.dead) if seq < below and seq not in has}


async def depose_cut_off(network: Network, node: Node, alone) -> Node:
    """``node`` leads, cut off from the others: ``alone()`` is done there (no majority has it), then another
    member leads, which is returned once the others are in step."""
    network.hold(node.name, "n2")
    network.hold(node.name, "n3")
    await alone()
    for other in ("n2", "n3"):
        network.cut(node.name, other)
        network.release(node.name, other)
    assert node.quorum.lease is not None
    network.etcd.revoke(node.quorum.lease.id)
    await wait_for(lambda: (found := leader(network)) is not None and found is not node, "a new leader")
    new = the_leader(network)
    await wait_for(lambda: all(lag == 0 for name, lag in new.quorum.lag()[KEY].items() if name != node.name),
                   "the others in step")
    return new


@pytest.mark.parametrize("seed", range(8))
async def test_a_diverged_copy_after_random_work_on_both_sides_is_the_leaders_again(network, caplog, seed):
    """Random client work at a leader cut off (no majority has it), then at the next one: the deposed leader's copy,
    caught up by a DIFF, holds the new leader's state and rows, records alike."""
    node = await declared(network, **{"x-delivery-limit": 2})
    rng = random.Random(seed)
    await client_work(node, rng, 150, purge=0.05)  # (what it leaves held, the next leader keeps for a while)
    await copies_agree(network)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    new = await depose_cut_off(network, node, lambda: client_work(node, rng, 60, b"lone", purge=0.05))
    await client_work(new, rng, 60, b"new", purge=0.05)
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    await copies_agree(network)
    assert any("n1 takes a snapshot" in record.message and "diverged" in record.message for record in caplog.records)


async def test_a_diverged_copy_that_annotated_a_row_alone_takes_the_whole_queue(network, caplog):
    """An op of the deposed leader's own tail annotated a message (a modified outcome): its rows of the entries
    both had may differ from the new leader's, so it takes a snapshot of the whole queue."""
    node = await declared(network)
    publish(node, bodies(20))
    queue = queue_of(node)
    await copies_agree(network)
    annotations = amqp10.encode(amqp10.Value("map", [(amqp10.Value("symbol", "x-opt-string"),
                                                      amqp10.Value("string", "x-test1"))]))

    async def alone() -> None:
        node.broker.settle(queue, [take(queue)], True, annotations=annotations)

    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    new = await depose_cut_off(network, node, alone)
    publish(new, bodies(5, "new"))
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    await copies_agree(network)
    taken = [record.message for record in caplog.records if "n1 takes a snapshot" in record.message]
    assert taken and not any("diverged" in message for message in taken)


async def test_a_deposed_leaders_diverged_copy_keeps_its_rows_of_what_both_had_and_takes_only_the_rest(
        network, caplog, monkeypatch):
    """n1, cut off, settles, returns and takes publishes no majority has; n2 or n3 leads the next term, settles,
    returns and takes publishes of its own.  n1's log agrees with the new leader's up to where its term began:
    n1 keeps its rows of the entries made before that the new leader holds, gets the others (those it settled
    alone among them), drops its own tail, and every copy is the leader's, rows and records alike.  The new
    leader keeps the 10 n1 held for their consumer throughout (a grace of 0.3 s ran out under load before the
    new leader's 15 were taken, which were then the 10 returned and 5 more: 60 rows sent, not 57)."""
    monkeypatch.setattr(quorum_queue, "HANDOVER_GRACE", 30.0)
    node = await declared(network)
    publish(node, bodies(300))
    queue = queue_of(node)
    held = [take(queue) for _ in range(10)]
    await copies_agree(network)
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    node.broker.settle(queue, held[:5], False)  # (n1 alone: the new leader still holds them)
    node.broker.settle(queue, held[5:7], True)  # back, under new seqs on n1 alone
    node.broker.settle(queue, [take(queue) for _ in range(20)], False)
    publish(node, bodies(30, "lone"))  # (no confirm: on n1 alone)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    network.cut("n1", "n2")
    network.cut("n1", "n3")
    network.release("n1", "n2")
    network.release("n1", "n3")
    assert node.quorum.lease is not None
    network.etcd.revoke(node.quorum.lease.id)
    await wait_for(lambda: (found := leader(network)) is not None and found.name != "n1", "a new leader")
    new = the_leader(network)
    other = ({"n2", "n3"} - {new.name}).pop()
    await wait_for(lambda: new.quorum.lag()[KEY][other] == 0, "the other member in step")
    ours = queue_of(new)
    taken = [take(ours) for _ in range(15)]
    new.broker.settle(ours, taken[:10], False)
    new.broker.settle(ours, taken[10:], True)
    publish(new, bodies(40, "new"))
    await wait_for(lambda: new.quorum.lag()[KEY][other] == 0, "the other member in step")
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    await copies_agree(network)
    _, rows = copy_of(new)
    settled = {entry.message.body for entry in taken[:10]}
    assert sorted(body_of(row[4]) for row in rows) == sorted({*bodies(300), *bodies(40, "new")} - settled)
    sent = replicator_of(new).followers["n1"].rows
    assert any("n1 takes a snapshot" in record.message and "diverged" in record.message for record in caplog.records)
    # the 7 held there that n1 settled or returned alone, the 5 of the 20 n1 settled alone that the new leader has
    # not, the 5 it returned and the 40 published there; none of the 273 others n1 has (a full snapshot: 330)
    assert sent == 7 + 5 + 5 + 40, sent


async def test_a_new_leader_keeps_the_at_least_once_dead_letters_waiting_and_tries_them_again(network, monkeypatch):
    """A dead letter no queue took waits, at least once, outside the queue's messages; the next leader keeps it
    so (as ``rabbit_fifo``'s dlx state, whose worker the new leader starts again) and tries it again — it put
    it back among the ready messages, delivered again to the queue's consumers."""
    monkeypatch.setattr(quorum_queue, "DLX_RETRY", 0.1)
    n1 = await declared(network, **AT_LEAST_ONCE)
    queue = queue_of(n1)
    publish(n1, bodies(3))
    entry = take(queue)
    n1.broker.settle(queue, [entry], requeue=False, reject=True)  # no queue "dead": it waits
    assert await copies_agree(network) == bodies(3)[1:]
    assert list(queue.state.dead) == [entry.seq]
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    new = the_leader(network)
    await asyncio.sleep(0.3)  # (tries: still no queue for it)
    assert await copies_agree(network) == bodies(3)[1:]
    assert list(queue_of(new).state.dead) == [entry.seq] and queue_of(new).message_count == 2
    vhost = new.broker.vhosts["/"]
    dead = new.broker.declare_queue(vhost, "dead", durable=True)
    assert isinstance(dead, Queue)
    await wait_for(lambda: not queue_of(new).state.dead, "the dead letter taken")
    assert [e.message.body for e in iter(lambda: dead.get(no_ack=True), None)] == [b"m00000"]
    assert await copies_agree(network) == bodies(3)[1:]


async def test_a_new_leader_keeps_what_consumers_held_for_them_to_take_back(network):
    """A consumer that outlived the change of leader takes back what it held, named by seq and the term it was
    checked out in: it stays checked out, as the consumer's; what no consumer took back within the grace
    period is returned, counted, and one back later still takes it while it is ready, its seq the same
    message here (agreed: made by an op a majority had; or made in the ops both copies share); an unknown seq,
    a known one of another term, or a ready one of neither, is refused."""
    node = await declared(network)
    publish(node, bodies(20))
    queue = queue_of(node)
    kept, left = take(queue), take(queue)
    await copies_agree(network)
    kept_checked, left_checked = queue.checked(kept), queue.checked(left)
    term = queue.term
    assert kept_checked == (kept.seq, term, True) and left_checked == (left.seq, term, True)
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    new = queue_of(the_leader(network))
    assert new.state.checked_out == {kept.seq: term, left.seq: term} and new.message_count == 18
    taken, unknown, other_term = new.adopt([kept_checked, (new.next_seq + 7, term, True), (left.seq, term + 1, False)])
    assert taken is not None and taken.message.body == kept.message.body and unknown is other_term is None
    await wait_for(lambda: new.state.checked_out == {kept.seq: term}, "the grace period over")
    assert new.state.count(left.seq) == 1 and new.message_count == 19
    assert new.adopt([(left.seq, term + 1, False)]) == [None]  # (another copy's term: its seq may be another's)
    late, = new.adopt([left_checked])  # (in its place again: the same message)
    assert late is not None and late.message.body == left.message.body and new.message_count == 18
    new.settle([taken, late])  # their acks, after the change, count
    assert await copies_agree(network) == bodies(20)[2:]
    assert new.state.messages == 18 and new.unacked == 0


@pytest.fixture
def delivering_unagreed(monkeypatch) -> None:
    """The leader gives consumers entries no majority has yet, as it answers basic.get (``OpLogShipper.when_agreed``
    holds back deliveries to consumers): what a consumer then holds across a change of leader is taken back by
    seq and term, never by seq alone."""
    monkeypatch.setattr(OpLogShipper, "when_agreed", lambda self, done: False)


@pytest.mark.usefixtures("delivering_unagreed")
async def test_a_consumer_back_after_two_changes_of_leader_takes_back_no_other_message_under_its_seq(network):
    """n1 gives its consumer a message (seq 10) that no other copy ever gets, and is cut off from everything;
    n2 or n3 leads, gives seq 10 to another message, confirms it, checks one out, and dies; the third copy
    leads with that one ready.  n1 comes back, and its consumer, which outlived both changes, asks to take
    back what it holds.  A seq alone would name the other message there, which its ack would then remove
    undelivered; a seq and the term of its checkout, which no copy but n1's has, names nothing there.  Every
    confirmed message reaches a consumer."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "the first confirmed")
    for other in ("n2", "n3"):
        network.hold("n1", other)
    publish(node, [b"n1's only"])
    client = Client(node).consume()
    await wait_for(lambda: len(client.received) == 11, "n1's consumer holding all eleven")
    node.client.unreachable = True
    for other in ("n2", "n3"):
        network.cut("n1", other)
        network.release("n1", other)  # (nothing: what it held back went with the cut)
    await wait_for(lambda: leader(network) not in (None, node), "n2 or n3 leading")
    second = the_leader(network)
    later = Confirms()
    publish(second, [b"confirmed"], later)
    await wait_for(lambda: later.acked() == [1], "its confirm")
    assert queue_of(second).state.ready.first() == 0 and queue_of(second).state.next_seq == 11
    take(queue_of(second))  # (a checkout the third copy has too: it keeps it for a consumer to take back)
    shipper = replicator_of(second)
    await wait_for(lambda: shipper.committed >= shipper.index, "the checkout committed")
    await network.kill(second.name)
    node.client.unreachable = False
    for other in ("n2", "n3"):
        network.heal("n1", other)
    third = next(name for name in NAMES if name not in ("n1", second.name))
    await wait_for(lambda: leader(network) is network.nodes[third], f"{third} leading")
    await network.start_node(second.name)
    await drained(network, client, [*bodies(10), b"confirmed"])


@pytest.mark.usefixtures("delivering_unagreed")
async def test_a_consumer_takes_back_what_the_next_leaders_copy_has_as_the_same_message(network, monkeypatch):
    """n1's followers have its 10 publishes, but n1 never hears so, and its consumer's checkouts of them never
    leave it: deposed, it names them as not agreed.  The next leader's copy ran through n1's term up to those
    publishes (its ``base``), so their seqs name the same messages there: the consumer takes them back from
    the ready list and its acks count; nothing is delivered twice.  n1 delivers however long the followers took
    to apply the publishes: a leader stops once its ops waited ``PROGRESS`` for a majority, and on a loaded
    machine the followers' applying alone took longer, so n1 never delivered (it never hears them here)."""
    monkeypatch.setattr(quorum_log, "PROGRESS", 60.0)
    node = await declared(network)
    for follower in ("n2", "n3"):
        network.hold(follower, "n1")  # (their answers)
    publish(node, bodies(10))
    await wait_for(lambda: all(network.nodes[name].quorum.groups[KEY].applied >= 10 for name in ("n2", "n3")),
                   "the followers have them")
    for follower in ("n2", "n3"):
        network.hold("n1", follower)  # (the checkouts stay on n1)
    client = Client(node).consume()
    await wait_for(lambda: len(client.received) == 10, "n1's consumer holding all ten")
    assert [queue_of(node).checked(entry)[2] for entry, _, _ in client.unacked.values()] == [False] * 10
    network.etcd.revoke(node.quorum.groups[KEY].leader_lease)
    await wait_for(lambda: leader(network) not in (None, node), "another leader")
    for follower in ("n2", "n3"):
        network.cut("n1", follower)
        network.release("n1", follower)
        network.release(follower, "n1")
        network.heal("n1", follower)
    await drained(network, client, bodies(10))
    assert sorted(client.received) == bodies(10)  # (each once)


async def test_a_modified_outcomes_annotations_are_in_every_copy_and_the_next_leader_delivers_them(network):
    """AMQP 1.0's modified outcome with message annotations (RabbitMQ 4.x's quorum queues keep them with the
    message): its log op carries them, every copy's row holds the annotated message (the leader's bytes), and
    the next leader delivers it with them, to an AMQP 1.0 reader as message annotations (beside those an AMQP
    1.0 publish had) and to an AMQP 0-9-1 one as headers."""
    node = await declared(network)
    vhost = node.broker.vhosts["/"]
    sent = make_message("", "q", commands.Basic.Properties(delivery_mode=2), b"amqp10")
    sent.amqp10 = amqp10.described(amqp10.MESSAGE_ANNOTATIONS, amqp10.encode_map([
        (amqp10.symbol("x-opt-mine"), amqp10.utf8("kept"))]))
    node.broker.publish(vhost, vhost.exchange(""), sent)
    publish(node, [b"amqp091"])
    queue = queue_of(node)
    held = [take(queue), take(queue)]
    annotations = amqp10.encode(amqp10.Value("map", [(amqp10.Value("symbol", "x-opt-string"),
                                                      amqp10.Value("string", "x-test1"))]))
    node.broker.settle(queue, held, True, annotations=annotations)
    assert await copies_agree(network) == [b"amqp10", b"amqp091"]
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    new = queue_of(the_leader(network))
    for body in (b"amqp10", b"amqp091"):
        entry = take(new)
        message = entry.message
        assert message.body == body and new.state.count(entry.seq) == 1
        found = {key.value: value.value for descriptor, content, _ in amqp10.sections(amqp10.record_parts(
            message, True)[0]) if descriptor == amqp10.MESSAGE_ANNOTATIONS for key, value in content.value}
        assert found["x-opt-string"] == "x-test1" and message.header_value("x-opt-string") == "x-test1"
        assert ("x-opt-mine" in found) == (body == b"amqp10")
        new.settle([entry])
    assert await copies_agree(network) == []


async def test_a_modified_outcome_copies_a_large_body_left_in_the_store_from_file_to_file(network, monkeypatch):
    """A modified outcome's annotations on a large body its leader left in the store (taken to be sent from the
    file, held for its ack without it): every copy writes the annotated record with the body copied from the old
    record's file a slice at a time (``MessageStore.write_from``), where the leader read the body whole into memory
    and each follower read the whole record; every copy's record is the leader's, and the next leader delivers
    the body byte-exact with the annotations."""
    monkeypatch.setattr(store_module, "COPY_SLICE", 100_000, raising=False)  # (several slices, the last short)
    node = await declared(network)
    body = bytes(range(256)) * 1500  # (384,000 octets: a body a queue leaves to its store)
    half = len(body) // 2
    publish(node, [body])
    await copies_agree(network)
    queue = queue_of(node)
    entry = queue.get(no_ack=False, sends_from=SEND_FROM_FILE)
    assert entry is not None and entry.message.body is None
    read: list[int] = []

    def spying(original):
        def spy(self, *args):
            found = original(self, *args)
            read.append(len(found))
            return found
        return spy

    for name in ("read", "read_tail", "read_head"):
        monkeypatch.setattr(MessageStore, name, spying(getattr(MessageStore, name)))
    annotations = amqp10.encode(amqp10.Value("map", [(amqp10.Value("symbol", "x-opt-string"),
                                                      amqp10.Value("string", "x-test1"))]))
    node.broker.settle(queue, [entry], True, annotations=annotations)
    await wait_for(lambda: in_step(network), "the followers in step")
    assert read and max(read) < half, "a body read into memory"
    assert await copies_agree(network) == [body]
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    message = take(queue_of(the_leader(network))).message
    assert message.body == body and message.header_value("x-opt-string") == "x-test1"


async def test_no_leader_without_a_majority_of_positions(network):
    node = await declared(network)
    publish(node, bodies(10))
    await copies_agree(network)
    await network.kill("n3")
    await network.kill("n1")
    await asyncio.sleep(1.0)  # two leases' time
    assert leader(network) is None  # n2 alone is no majority
    await network.start_node("n3")
    await wait_for(lambda: leader(network) is not None, "a leader once n3 is back")
    assert await copies_agree(network) == bodies(10)


async def test_a_copy_ahead_that_does_not_claim_leaves_the_lead_to_a_majority_s_best(network, monkeypatch):
    """n1's copy is ahead of the others' (ops they never got) as its term ends, but n1 never claims the lead
    again (a node that comes back too slow, or is killed again, before it claims): once ``PASSED_OVER`` has
    passed, n2 or n3 — each at or past a majority's positions — leads, with every confirmed message."""
    monkeypatch.setattr(quorum, "PASSED_OVER", 0.5)
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: confirms.acked() == list(range(1, 11)), "the confirms")
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    publish(node, bodies(5, "unconfirmed"))  # (n1's alone)

    async def too_slow(group: quorum.Group) -> None:
        pass

    for other in network.nodes.values():  # (until every member's position is written)
        other.quorum._claim_or_follow = too_slow
    network.etcd.revoke(node.quorum.groups[KEY].leader_lease)
    positions = quorum.POSITIONS + KEY.encode() + b"/"
    await wait_for(lambda: sum(key.startswith(positions) for key in network.etcd.kvs) == 3, "three positions")
    del network.nodes["n2"].quorum._claim_or_follow, network.nodes["n3"].quorum._claim_or_follow
    await wait_for(lambda: leader(network) is not None and leader(network) is not node, "another leader")
    del node.quorum._claim_or_follow
    network.release("n1", "n2")
    network.release("n1", "n3")
    assert await copies_agree(network) == bodies(10)


async def test_a_copy_a_snapshot_is_coming_into_stands_where_it_stood(network, monkeypatch):
    """n3 is mid-snapshot when the leader dies: the snapshot's index is ahead of n2's copy, but n3's copy is
    still the one it had before (the snapshot comes in beside it), far behind, so n2 leads, with every confirmed
    message."""
    confirms = Confirms()
    await n3_far_behind(network, monkeypatch, confirms)
    await wait_for(lambda: len(confirms.acked()) == 1000, "confirmed by n1 and n2")
    network.hold("n1", "n3")
    await network.start_node("n3")
    await snapshot_under_way(network)  # the rest of it never comes
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert the_leader(network).name == "n2"
    network.release("n1", "n3")
    assert await copies_agree(network) == [b"first", *bodies(1000)]


async def test_a_copy_a_snapshot_is_coming_into_leads_with_what_it_had(network, monkeypatch):
    """n2's copy has every confirmed message when a snapshot begins to come into it, and n1, the only other copy
    that has them, dies: the snapshot comes in beside n2's copy, which stays whole, so n2 and a stale n3 elect
    n2 at once, with all of them (what n1 took alone, never confirmed, goes: n1 comes back to n2's snapshot)."""
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 10_000)
    monkeypatch.setattr(quorum_log, "SNAPSHOT_CHUNK", 32)
    node = await declared(network)
    publish(node, [b"first"])
    await copies_agree(network)
    await network.kill("n3")  # stale from here
    confirms = Confirms()
    publish(node, bodies(100), confirms)
    await wait_for(lambda: len(confirms.acked()) == 100, "confirmed by n1 and n2")
    await network.kill("n2")
    publish(node, bodies(1000, "more"))  # more than n1's log keeps: n2 will need a snapshot
    network.hold("n1", "n2")
    await network.start_node("n2")
    await snapshot_under_way(network, "n2")
    n2 = network.nodes["n2"].quorum.groups[KEY]
    assert n2.whole and n2.position[1] == 101
    await network.kill("n1")
    await network.start_node("n3")
    await wait_for(lambda: leader(network) is not None, "a leader without n1")
    assert the_leader(network).name == "n2"
    assert n2.incoming is None  # (the snapshot of n1's term is given up: its rows went)
    network.release("n1", "n2")  # (what was held of the snapshot is of n1's term: ignored)
    await network.start_node("n1")
    assert await copies_agree(network) == [b"first", *bodies(100)]


async def test_two_copies_snapshots_are_coming_into_elect_one_of_them_with_every_confirmed_message(
        network, monkeypatch):
    """Finding (nemesis seed 98, a 20.9 s confirm gap): n1, the leader, was sending both followers snapshots when
    it went, and a copy a snapshot was coming into stood for nothing, so no leader could be elected until one
    of them was whole again.  Each follower's copy now stays as it was until its snapshot ends: n2 and n3
    elect one of them once n1's lease lapses, with every confirmed message (what n1 took alone, which no
    majority had, goes)."""
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 10_000)
    monkeypatch.setattr(quorum_log, "SNAPSHOT_CHUNK", 32)
    node = await declared(network)
    confirms = Confirms()
    publish(node, [b"first"], confirms)
    await wait_for(lambda: confirms.acked() == [1], "first confirmed")
    await network.kill("n2")
    await network.kill("n3")
    publish(node, bodies(1000))
    for name in ("n2", "n3"):
        network.hold("n1", name)
        await network.start_node(name)
        await snapshot_under_way(network, name)
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a leader without n1", 10)
    assert the_leader(network).name == "n3"  # (a tie: the name that sorts last)
    network.release("n1", "n2")
    network.release("n1", "n3")
    await network.start_node("n1")
    assert await copies_agree(network) == [b"first"]


async def test_a_snapshot_coming_in_is_not_asked_for_again_nor_sent_twice(network, monkeypatch, caplog):
    """Finding (nemesis seed 98 again, 11 s without confirms): a follower's copy stands where it stood while a
    snapshot comes in beside it, so its retry timer, seeing it unmoved, asked to catch up again; the leader,
    done sending, took that for a new request and began a second snapshot of 122,000 messages as the first
    arrived.  The follower does not ask while a snapshot comes in further, and a leader answers a request
    from before a snapshot it has just sent whole with nothing (a while later, with another)."""
    monkeypatch.setattr(quorum, "CATCH_UP_RETRY", 0.05)
    node = await n3_far_behind(network, monkeypatch)
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    network.hold("n1", "n3")
    await network.start_node("n3")
    n3 = network.nodes["n3"].quorum
    copy = n3.groups[KEY]
    stale = copy.position
    await snapshot_under_way(network)
    follower = replicator_of(node).followers["n3"]
    await wait_for(lambda: follower.snapshot is None and follower.joined, "the snapshot sent whole")
    asked: list[tuple] = []
    monkeypatch.setattr(n3, "_ask_to_catch_up", lambda *args: asked.append(args))
    await asyncio.sleep(0.3)  # six retry periods
    assert not asked
    replicator_of(node).catch_up("n3", *stale)  # (as a request sent before the snapshot reached it)
    assert follower.snapshot is None and follower.joined
    network.release("n1", "n3")
    assert await copies_agree(network) == [b"first", *bodies(1000)]
    assert sum("n3 takes a snapshot" in record.message for record in caplog.records) == 1
    monkeypatch.setattr(quorum_log, "ANSWERED", 0.0)
    replicator_of(node).catch_up("n3", *stale)  # (a request from that far back, later: one lost its copy)
    assert follower.snapshot is not None


async def test_a_request_to_catch_up_made_before_the_answer_arrived_is_not_answered_twice(network, caplog):
    """Finding (nemesis seed 98): a follower back on its link asked to catch up, and asked again at once on the
    gap the next ops showed; the leader sent it the same 35,000 ops twice.  A request from before where the
    last answer brings the follower, made before that answer could arrive, gets none."""
    node = await declared(network)
    publish(node, [b"first"])
    await copies_agree(network)
    await network.kill("n3")
    publish(node, bodies(300))
    caplog.set_level(logging.INFO, "warren.forwarder.quorum_log")
    network.hold("n1", "n3")
    await network.start_node("n3")
    stale = network.nodes["n3"].quorum.groups[KEY].position
    replicator_of(node).catch_up("n3", *stale)  # (its request on the link's return)
    replicator_of(node).catch_up("n3", *stale)  # (its second, made before the answer to the first arrived)
    network.release("n1", "n3")
    assert await copies_agree(network) == [b"first", *bodies(300)]
    assert sum("n3 catches up on" in record.message for record in caplog.records) == 1


async def test_a_node_restarted_while_a_snapshot_comes_in_keeps_its_copy_and_drops_the_snapshots_rows(
        network, monkeypatch):
    """n3 stops halfway through a snapshot: it comes back with the copy it had, standing where it stood, and
    the rows the snapshot had written are gone; the next snapshot makes it the leader's."""
    await n3_far_behind(network, monkeypatch)
    network.hold("n1", "n3")
    await network.start_node("n3")
    n3 = network.nodes["n3"]
    before = n3.quorum.groups[KEY]
    await snapshot_under_way(network)
    for _ in range(10):  # (some of its rows)
        network.release_one("n1", "n3")
        await asyncio.sleep(0)
    spare = before.spare
    assert spare and n3.broker.persistence.index.totals(spare) is not None
    await network.kill("n3")
    network.release("n1", "n3")
    await network.start_node("n3")
    copy = network.nodes["n3"].quorum.groups[KEY]
    assert (copy.index_id, copy.spare, copy.position) == (before.index_id, spare, before.position)
    assert network.nodes["n3"].broker.persistence.index.totals(spare) is None
    assert await copies_agree(network) == [b"first", *bodies(1000)]


# -- no leader ----------------------------------------------------------------------------------


async def test_a_publish_waits_for_a_leader_however_long_and_is_never_nacked(network, monkeypatch):
    """n1, the leader, and n3 die: n2 alone is no majority, and no leader is known for longer than a publish
    once waited before it was nacked (5 s).  What n2's publisher sent meanwhile waits, counted against its
    channel (which holds its connection back past a few), and the leader elected once n3 is back confirms it
    all, as RabbitMQ's quorum queue client keeps its pending commands for the next leader.  A basic.get
    meanwhile waits for a leader only a while."""
    node = await declared(network)
    confirms = HeldConfirms()
    publish(node, bodies(5), confirms)
    await wait_for(lambda: len(confirms.acked()) == 5, "the first confirms")
    await network.kill("n1")
    await network.kill("n3")
    n2 = network.nodes["n2"]
    await wait_for(lambda: n2.quorum.groups[KEY].leader == "", "n2 knows no leader")
    publish(n2, bodies(40, "wait"), confirms)
    await asyncio.sleep(6)
    assert len(confirms.outcomes) == 5, "a publish was answered without a leader"
    assert confirms.waiting_now == 40
    monkeypatch.setattr(vhost_module, "LEADER_WAIT", 0.2)
    with pytest.raises(ChannelError, match="home node"):  # (a basic.get waits for a leader a while, not for good)
        await asyncio.wait_for(n2.broker.get_anywhere(n2.broker.vhosts["/"], "q", True), 10)
    await network.start_node("n3")
    await wait_for(lambda: len(confirms.outcomes) == 45, "an answer to each publish", 30)
    assert confirms.acked() == list(range(1, 46))
    assert confirms.waiting_now == 0 and confirms.waiting_most == 40
    assert await copies_agree(network) == bodies(5) + bodies(40, "wait")


async def test_a_quorum_queue_is_reached_through_a_deposed_member_once_a_leader_is_elected(network, monkeypatch):
    """n1, which declared the queue, is dead and n3 leads; then n3's lease is revoked while n2 cannot reach etcd:
    n3 steps down, its proxy of the queue naming n1 again, and no leader is elected for a while.  A basic.get
    through n3 waits (a while: ``LEADER_WAIT``) for the next leader and is answered by it, rather than fail at
    once with 404 "home node 'n1' of durable queue ... is down" (RabbitMQ answers through any member while a
    majority has a leader)."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "the publishes confirmed")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    n3 = the_leader(network)
    assert n3.name == "n3"  # (a tie goes to the name that sorts last)
    n2 = network.nodes["n2"]
    n2.client.unreachable = True
    network.etcd.revoke(n3.quorum.groups[KEY].leader_lease)
    await wait_for(lambda: n3.quorum.groups[KEY].replicator is None, "n3 deposed")
    vhost = n3.broker.vhosts["/"]
    assert vhost.queues["q"].node == "n1" and vhost.queues["q"].leaderless
    monkeypatch.setattr(vhost_module, "LEADER_WAIT", 30.0)
    got = asyncio.ensure_future(n3.broker.get_anywhere(vhost, "q", True))
    await asyncio.sleep(0)
    n2.client.unreachable = False
    _, entry = await asyncio.wait_for(got, 30)
    assert entry is not None and entry.message.body == bodies(10)[0]


async def test_a_get_through_a_node_that_missed_a_change_of_leader_is_answered_by_the_new_leader(network):
    """n2's watch of etcd stalls, and it misses that n1's lease was revoked and n3 leads: its basic.get goes to
    n1, which answers that it does not lead; n2 asks etcd who leads and gets the message there, rather than
    answer 404 "home node ... is down"."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "the publishes confirmed")
    n2 = network.nodes["n2"]
    n2.client.deaf = True
    network.etcd.revoke(node.quorum.groups[KEY].leader_lease)
    await wait_for(lambda: leader(network) is not None and leader(network) is not node, "another leader")
    await wait_for(lambda: node.quorum.groups[KEY].replicator is None, "n1 deposed")
    assert n2.quorum.groups[KEY].leader == "n1"  # (n2 heard nothing)
    vhost = n2.broker.vhosts["/"]
    _, entry = await asyncio.wait_for(n2.broker.get_anywhere(vhost, "q", True), 30)
    assert entry is not None and entry.message.body == bodies(10)[0]


async def test_a_get_under_way_through_the_node_that_comes_to_lead_is_answered_there(network, monkeypatch):
    """A basic.get through n3 is on its way to n1 when n1 dies, and n3 comes to lead: the get is answered by n3's
    own queue, rather than wait on the proxy it started on (which names n1, down for good) for ``LEADER_WAIT`` and
    fail with 404 "home node 'n1' ... is down"."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "the publishes confirmed")
    await copies_agree(network)
    monkeypatch.setattr(vhost_module, "LEADER_WAIT", 30.0)
    monkeypatch.setattr(remote_queue, "LEADER_WAIT", 30.0)
    n3 = network.nodes["n3"]
    vhost = n3.broker.vhosts["/"]
    network.hold("n3", "n1")  # (the get's request waits on its way)
    got = asyncio.ensure_future(n3.broker.get_anywhere(vhost, "q", True))
    await wait_for(lambda: network.held[("n3", "n1")], "the get on its way to n1")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is n3, "n3 leads")  # (a tie goes to the name that sorts last)
    queue, entry = await asyncio.wait_for(got, 10)
    assert queue is vhost.queues["q"] and entry is not None and entry.message.body == bodies(10)[0]


# -- fencing ------------------------------------------------------------------------------------


async def test_a_leader_that_lost_etcd_confirms_nothing_more(network):
    """n1 cannot reach etcd (the others can, and still hear from it): its lease lapses, n2 or n3 leads, and
    what n1 took meanwhile is not confirmed by it, nor nacked (for longer than a publish once waited for a
    leader): once n1 reaches the new leader it passes them on, and that leader confirms them.  n1's later ops
    are not the followers' any more."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(20), confirms)
    await wait_for(lambda: len(confirms.acked()) == 20, "the first confirms")
    network.nodes["n1"].client.unreachable = True
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    publish(node, bodies(5, "cut"), confirms)
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "another leader")
    await wait_for(lambda: node.quorum.groups[KEY].replicator is None, "n1 deposed")
    await asyncio.sleep(6)  # (longer than a publish waited for a leader before it was nacked)
    assert len(confirms.outcomes) == 20
    network.release("n1", "n2")
    network.release("n1", "n3")
    network.nodes["n1"].client.unreachable = False
    await wait_for(lambda: network.nodes["n1"].quorum.groups[KEY].leader == the_leader(network).name, "n1 follows")
    await wait_for(lambda: len(confirms.outcomes) == 25, "an answer to each publish")
    assert confirms.acked() == list(range(1, 26))
    assert await copies_agree(network) == bodies(20) + bodies(5, "cut")


async def test_etcd_out_of_reach_for_less_than_the_lease_stops_no_confirm_and_keeps_the_leader(network):
    """etcd stops answering for less than the lease (frozen; restarted, which keeps leases, is alike): past half
    the lease the leader's lease may have lapsed, yet it confirms what its group has, as Raft commits (a member
    elected meanwhile would have it); once etcd finds its lease alive it leads on — the same leader, in the
    same term, no election."""
    node = await declared(network)
    term = node.quorum.groups[KEY].term
    confirms = Confirms()
    network.etcd.freeze()
    await asyncio.sleep(quorum.LEASE_TTL * 0.55)  # past half the lease since the last refresh
    assert not node.quorum.lease_sure
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "confirmed by the followers", quorum.LEASE_TTL * 0.4)
    network.etcd.thaw()
    await asyncio.sleep(quorum.LEASE_TTL / 2)
    assert leader(network) is node
    assert all(other.quorum.groups[KEY].term == term for other in network.nodes.values())
    assert await copies_agree(network) == bodies(10)




async def test_etcd_out_of_reach_stops_no_delivery_while_a_majority_answers(network):
    """etcd stops answering (frozen past half the lease: the leader's lease may have lapsed): the leader delivers
    on, and takes acks, as long as its followers answer, as a Raft leader serves while a majority hears it.  A
    member that etcd let claim the queue meanwhile would take the followers, and the leader's deliveries would
    stall within ``PROGRESS`` with no more than its consumers' window uncommitted (delivered again by the next
    leader), as when it is cut from its followers.  Before, it delivered nothing until etcd answered: 12 s
    without a delivery while etcd restarted (nemesis seed 153), its publishes confirmed throughout."""
    node = await declared(network)
    client = Client(node, prefetch=20).consume()
    confirms = Confirms()
    network.etcd.freeze()
    await asyncio.sleep(quorum.LEASE_TTL * 0.55)  # past half the lease since the last refresh
    assert not node.quorum.lease_sure
    publish(node, bodies(100), confirms)

    def taken() -> bool:
        client.ack()
        return len(client.received) == 100

    await wait_for(taken, "every message delivered and acked", quorum.LEASE_TTL * 0.4)
    assert len(confirms.acked()) == 100
    network.etcd.thaw()
    shipper = replicator_of(node)
    await wait_for(lambda: shipper.committed >= shipper.index, "the acks committed")
    assert await copies_agree(network) == []


async def test_a_leader_whose_lease_may_have_lapsed_and_that_heard_no_majority_lately_delivers_one_first(network):
    """A leader whose lease may have lapsed (etcd frozen past half of it) and whose followers answered nothing for
    ``PROGRESS`` (an idle queue; a node that woke from a pause, the others having elected another meanwhile)
    checks out one message, written to its consumer, with more, once a majority took its checkout: before, a
    paused leader that woke up delivered its consumers' whole window at once, which the next leader gave again."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(100), confirms)
    await wait_for(lambda: len(confirms.acked()) == 100, "the publishes confirmed")
    network.etcd.freeze()
    await asyncio.sleep(quorum.LEASE_TTL * 0.55)  # past half the lease since the last refresh
    assert not node.quorum.lease_sure
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    client = Client(node, prefetch=50).consume()
    await asyncio.sleep(0.3)
    assert queue_of(node).unacked == 1 and client.received == []
    network.release("n1", "n2")
    network.release("n1", "n3")
    await wait_for(lambda: len(client.received) == 50, "the window once a majority answered")
    network.etcd.thaw()
    await drained(network, client, bodies(100))


async def test_a_consumer_is_given_a_message_only_once_a_majority_has_its_enqueue(network):
    """The leader, its lease sure and its followers answering, gives its consumer nothing that no follower has
    yet: a publish a deposed leader delivered before a majority had it went, waiting for its confirm, to the
    next leader, which enqueued it anew and delivered it again with no redelivered flag (the issue's fixed
    schedule: 43 and 50 messages twice, 0.6 s apart).  basic.get still answers at once."""
    node = await declared(network)
    client = Client(node, prefetch=50).consume()
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await asyncio.sleep(0.3)
    assert node.quorum.lease_sure
    assert client.received == [] and confirms.acked() == []
    network.release("n1", "n2")
    await wait_for(lambda: len(client.received) == 10, "every message once a majority has it")
    assert len(confirms.acked()) == 10
    client.ack()
    client.close()
    network.hold("n1", "n2")
    publish(node, [b"got"])
    assert take(queue_of(node)).message.body == b"got"
    network.release("n1", "n2")
    network.release("n1", "n3")
    await wait_for(lambda: in_step(network), "the copies in step")


async def test_a_consumer_is_given_a_message_only_once_a_majority_has_its_checkout(network):
    """Messages every copy has go to a consumer of the leader only once a follower has their checkouts too,
    as a ``rabbit_fifo`` leader delivers only what committed commands check out.  Given at once, they were
    given again by the next leader as first deliveries, unflagged, once the leader's node died with the
    consumer's connection (a random schedule: 50, the consumer's prefetch); held back, the consumer that dies
    with the leader never had them, and the next consumer gets each once."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "every publish on a majority")
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    client = Client(node, prefetch=50).consume()
    await asyncio.sleep(0.3)
    assert node.quorum.lease_sure and queue_of(node).unacked == 10  # (checked out: waiting for a majority)
    assert client.received == []
    await network.kill("n1")
    await wait_for(lambda: leader(network) not in (None, node), "another leader")
    after = Client(the_leader(network), prefetch=50).consume()
    await wait_for(lambda: len(after.received) == 10, "the next consumer given every message")
    assert sorted(after.received) == bodies(10)


async def test_refreshes_that_reach_etcd_late_keep_the_lease_and_the_leader(network):
    """Every refresh reaches etcd a second after it was made, as from a loop slowed by long turns (a deep
    queue's snapshots to two followers, on a loaded machine).  The leader leads on in the same term.  Refreshes
    given up after a quarter of the lease never arrived: the lease lapsed, the new term's snapshots slowed the
    next leader alike, and the leader changed every 4 s for a minute (a nemesis seed, 60,000 messages behind)."""
    node = await declared(network)
    term = node.quorum.groups[KEY].term
    for each in network.nodes.values():
        each.client.refresh_delay = 1.0
    await asyncio.sleep(quorum.LEASE_TTL * 3)
    assert leader(network) is node
    assert all(other.quorum.groups[KEY].term == term for other in network.nodes.values())


async def test_ops_a_follower_has_already_are_skipped_and_it_asks_for_nothing(network, caplog):
    """A catch-up's log overlaps what the leader ships meanwhile: a frame whose first ops n3 has is applied from
    the first it lacks, one it has whole is dropped, and neither makes it ask to catch up again (under load
    each answer overlapped the next frames again: n3 stayed out of step, and a majority was lost as soon as
    one more member went)."""
    node = await declared(network)
    publish(node, [b"first"])  # (n3's copy has an op of this term: it follows on from it)
    await copies_agree(network)
    network.hold("n1", "n3")
    publish(node, bodies(5, "a"))
    await asyncio.sleep(0.05)
    publish(node, bodies(5, "b"))
    await asyncio.sleep(0.05)
    frames = [frame for frame in network.held[("n1", "n3")] if frame[2] == link.REPLICATE]
    network.held[("n1", "n3")] = []
    head = frames[0][3][:quorum_log.HEAD.size + len(KEY.encode())]
    ops = [frame[3][len(head):] for frame in frames]  # consecutive: a's publishes, then b's
    assert len(ops) >= 2
    first, whole = head + ops[0], head + b"".join(ops)  # the latter as a catch-up's log may be
    caplog.set_level(logging.INFO)
    for payload in (first, whole, whole, first):
        network.deliver("n1", "n3", link.REPLICATE, payload)
    network.release("n1", "n3")
    assert await copies_agree(network) == [b"first", *bodies(5, "a"), *bodies(5, "b")]
    assert "asking to catch up" not in caplog.text


async def test_a_follower_walks_its_deep_copy_whole_once_in_a_share_of_its_entries_not_after_every_frame(
        network, monkeypatch):
    """Under the tests' invariant checks (``CHECKS``) a follower checks its copy's rows against its state
    (``check_copy``): once the ops since the last check are an eighth of its entries, not after every frame.  A
    copy of 9,650 entries walked after each of the frames of a basic.get loop at the leader held the follower's
    loop for seconds in a turn of frames; the leader heard nothing from it for 5 s, stepped down, and the queue had
    no leader (``test_a_member_added_while_the_queue_changes_gets_all_of_it``, under load)."""
    assert quorum_log.CHECKS  # (the tests' environment: tests/conftest.py)
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(800), confirms)
    await wait_for(lambda: len(confirms.acked()) == 800, "the publishes confirmed")
    await copies_agree(network)
    n2 = network.nodes["n2"]
    replicas, walks = n2.broker.replicas, []
    walk = replicas.copy_state

    def walked(index_id: int) -> quorum_log.machine.State:
        walks.append(index_id)
        return walk(index_id)

    monkeypatch.setattr(replicas, "copy_state", walked)
    frames: list[bytes] = []
    deliver = network.deliver

    def counted(sender: str, to: str, ftype: int, payload: bytes) -> None:
        if (sender, to, ftype) == ("n1", "n2", link.REPLICATE):
            frames.append(payload)
        deliver(sender, to, ftype, payload)

    monkeypatch.setattr(network, "deliver", counted)
    queue = queue_of(node)
    for _ in range(100):  # a frame each
        take(queue)
        await asyncio.sleep(0)
    assert await copies_agree(network) == bodies(800)[100:]  # (held, not acked: each copy has them checked out)
    assert len(frames) >= 50
    assert len(walks) <= 2, f"{len(walks)} walks of the copy for {len(frames)} frames"


# -- consumers across nodes ---------------------------------------------------------------------


async def drained(network: Network, client: Client, expected: list[bytes], timeout: float = 20.0) -> None:
    """``client`` acks what it holds as it comes until it has had every one of ``expected``; then the leader
    holds nothing (ready or unacked) and its state agrees."""
    deadline = asyncio.get_running_loop().time() + timeout
    missing = set(expected)
    while missing - set(client.received):
        now = asyncio.get_running_loop().time()
        if now > deadline:
            node = leader(network)
            state = queue_of(node).state if node is not None else None
            raise AssertionError(f"{len(missing - set(client.received))} never delivered, leader "
                                 f"{node and node.name}, state {state}")
        client.ack()
        await asyncio.sleep(0.02)
    await wait_for(lambda: client.ack() < 0 or (leader(network) is not None
                                                 and queue_of(the_leader(network)).state.messages == 0),
                   "the queue empty", 10)


async def consumer_holding(network: Network, on: str, count: int = 200) -> tuple[Node, Client, list[bytes]]:
    node = await declared(network)
    client = Client(network.nodes[on], prefetch=50).consume()
    sent = bodies(count)
    confirms = Confirms()
    publish(node, sent, confirms)
    await wait_for(lambda: len(confirms.acked()) == count, "the publishes confirmed")
    await wait_for(lambda: len(client.unacked) == 50, "a prefetch window held")
    return node, client, sent


@pytest.mark.parametrize("on", ["n2", "n3"])
async def test_a_consumer_through_a_follower_gets_every_message_across_a_change_of_leader(network, on):
    _, client, sent = await consumer_holding(network, on)
    await network.kill("n1")
    await drained(network, client, sent)


def annotated(node: Node, body: bytes) -> object:
    """The ``x-opt-string`` header of the message ``body`` in ``node``'s copy (a modified outcome's annotation)."""
    for row in copy_of(node)[1]:
        message = Message.stored(0, 0)
        message.fill_from(row[4])
        if message.body == body:
            return message.header_value("x-opt-string")
    raise AssertionError(f"{body!r} is not in {node.name}'s copy")


async def test_a_modified_outcome_through_a_follower_reaches_the_leader_with_its_annotations(network):
    """A consumer on n2 of n1's queue: its modified outcome's annotations go to the leader with the settle (a
    MODIFY frame), into every copy; one made while no leader is known is parked with them, and the next leader
    carries it out with them."""
    _, client, _ = await consumer_holding(network, "n2")
    first, second = sorted(client.unacked)[:2]
    for tag, value in ((first, "x-test1"), (second, "x-test2")):
        if tag == second:
            await network.kill("n1")
        entry, queue, consumer = client.unacked.pop(tag)
        client.broker.settle_taken([(entry, queue, consumer)], True, annotations=amqp10.encode(amqp10.Value(
            "map", [(amqp10.Value("symbol", "x-opt-string"), amqp10.Value("string", value))])))
        await wait_for(lambda: leader(network) is not None and in_step(network), "the settle applied")
        body = entry.message.body
        await wait_for(lambda body=body, value=value: annotated(the_leader(network), body) == value, value)
    await copies_agree(network)
    assert annotated(the_leader(network), bodies(200)[0]) == "x-test1"


async def test_a_consume_whose_answer_is_lost_with_the_leaders_link_is_made_again_not_refused(network):
    """n2's basic.consume reaches n1, the leader, but n2's link to n1 drops before n1's answer comes back: rather
    than fail as for a queue whose node is down (a quorum queue stays reachable while a majority leads it), the
    consumer consumes again at the leader once it is reached, and gets every message."""
    node = await declared(network)
    sent = bodies(100)
    confirms = Confirms()
    publish(node, sent, confirms)
    await wait_for(lambda: len(confirms.acked()) == 100, "the publishes confirmed")
    network.hold("n1", "n2")  # (n1's answer waits)
    client = Client(network.nodes["n2"], prefetch=50).consume()
    await wait_for(lambda: network.held[("n1", "n2")], "the consume answered")
    network.cut("n1", "n2")
    await asyncio.sleep(0.2)
    network.release("n1", "n2")
    network.heal("n1", "n2")
    await drained(network, client, sent)
    assert not client.cancelled


@pytest.mark.parametrize("going", ["its channel closed", "cancelled by the leader"])
async def test_a_consumer_gone_with_deliveries_buffered_returns_them_and_its_node_holds_nothing_of_them(network,
                                                                                                     going):
    """A consumer on n2 whose client does not read goes (its channel closes, or the leader cancels it) while
    deliveries wait in n2's buffer for its client: they go back to the queue, and n2 keeps nothing of them (its
    proxy held each entry, body included, in ``taken`` for good)."""
    node = await declared(network)
    n2 = network.nodes["n2"]
    client = Client(n2, prefetch=10)
    client.reading = False
    client.consume()
    await wait_for(lambda: client.replies, "consume-ok")
    publish(node, bodies(5))
    proxy = n2.broker.vhosts["/"].queues["q"]
    assert isinstance(proxy, remote_queue.RemoteQueue)
    await wait_for(lambda: len(proxy.by_consumer[client.consumer].buffer) == 5, "5 deliveries buffered on n2")
    if going == "its channel closed":
        client.close()
    else:
        (consumer,) = network.sessions[("n1", "n2")].consumers.values()
        consumer.channel.failed(consumer, "a message it was to get cannot be read")
    await wait_for(lambda: queue_of(node).message_count == 5, "the 5 back in the queue at n1")
    assert not proxy.by_consumer
    assert not proxy.taken


async def test_a_consume_waiting_for_the_leader_is_answered_when_its_own_node_comes_to_lead(network):
    """n2's basic.consume waits for n1, the leader, to answer, when n1 dies and n2 leads: the consume is the new
    leader's, so it is answered (the channel's connection reads again only then) before anything is delivered to
    it, and the consumer gets every message."""
    node = await declared(network)
    sent = bodies(100)
    confirms = Confirms()
    publish(node, sent, confirms)
    await wait_for(lambda: len(confirms.acked()) == 100, "the publishes confirmed")
    network.hold("n1", "n3")  # n2's copy goes further than n3's: n2 wins the election
    more = bodies(10, "late")
    publish(node, more)
    await wait_for(lambda: node.quorum.lag()[KEY]["n2"] == 0, "n2 in step")
    network.hold("n2", "n1")  # (n2's consume waits)
    client = Client(network.nodes["n2"], prefetch=200)
    deliver = client.deliver
    client.deliver = lambda consumer, entry: (  # type: ignore[method-assign]
        deliver(consumer, entry) if client.replies else pytest.fail("a delivery before consume-ok"))
    client.consume()
    accepted = network.nodes["n2"].broker.vhosts["/"].queues["q"].accepted(client.consumer)
    assert accepted is not None and not accepted.done() and not client.replies
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert the_leader(network).name == "n2"
    await wait_for(accepted.done, "the consume answered")
    assert accepted.exception() is None and not client.cancelled
    assert [(type(reply), reply.consumer_tag) for reply in client.replies] == [(commands.Basic.ConsumeOk, "ctag")]
    await drained(network, client, sent + more)


async def test_a_consumer_that_goes_during_a_change_of_leader_leaves_nothing_stranded(network):
    _, client, sent = await consumer_holding(network, "n2")
    await network.kill("n1")
    client.close()
    await wait_for(lambda: leader(network) is not None, "a new leader")
    other = Client(network.nodes["n3"]).consume()
    await drained(network, other, sent)


async def test_a_consumer_held_across_two_changes_of_leader_gets_every_message(network):
    _, client, sent = await consumer_holding(network, "n2")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    first = the_leader(network).name
    assert first == "n3"  # (a tie: the name that sorts last)
    await network.start_node("n1")
    await wait_for(lambda: in_step(network), "n1 in step")
    await network.kill(first)
    await wait_for(lambda: leader(network) is not None, "another leader")
    await drained(network, client, sent)


async def test_a_consumer_whose_node_lost_etcd_while_the_leader_changed_term_gets_every_message(network):
    """n3 hears nothing from etcd while n1 loses its lease and leads again in a new term: n1 dropped n3's
    consumer when it stepped down; n3 must consume again at n1 (n1 still leads in n3's view)."""
    node, client, sent = await consumer_holding(network, "n3")
    term = node.quorum.groups[KEY].term
    network.nodes["n3"].client.unreachable = True
    node.client.unreachable = True
    await wait_for(lambda: quorum.LEADERS + KEY.encode() not in network.etcd.kvs, "n1's lease lapsed")
    node.client.unreachable = False
    await wait_for(lambda: leader(network) is not None and node.quorum.groups[KEY].term > term, "a new term")
    client.ack()
    await asyncio.sleep(0.5)
    network.nodes["n3"].client.unreachable = False
    await drained(network, client, sent)


async def test_a_ballot_left_in_etcd_never_elects_a_copy_behind_what_its_member_confirmed_since(network):
    """n1's ballot of an election n2 won stays in etcd (its delete failed: etcd went away just then), at the
    position n1 had then.  n1 then confirms 50 messages with n2; n2 dies, n3 (which missed them) comes back:
    n1's stale ballot and n3's are a majority in which n3 is the highest, but n3 must not lead without them."""
    node = await declared(network)
    publish(node, bodies(10))
    await copies_agree(network)
    await network.kill("n3")
    node.client.unreachable = True
    await wait_for(lambda: quorum.LEADERS + KEY.encode() not in network.etcd.kvs, "n1's lease lapsed")
    node.client.failing_deletes = 1  # its ballot's, once the election is over
    node.client.unreachable = False
    await wait_for(lambda: leader(network) is not None and the_leader(network).name == "n2", "n2 leads")
    await wait_for(lambda: election_over(node), "n1's election over")
    confirms = Confirms()
    publish(network.nodes["n2"], bodies(50, "later"), confirms)
    await wait_for(lambda: len(confirms.acked()) == 50, "confirmed by n2 and n1")
    network.hold("n2", "n3")
    await network.start_node("n3")
    node.client.unreachable = True  # (n1's ballot is the stale one while n3 counts)
    await network.kill("n2")
    await asyncio.sleep(1.5)
    node.client.unreachable = False
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert the_leader(network).name == "n1"
    assert await copies_agree(network) == [*bodies(10), *bodies(50, "later")]


async def test_a_followers_link_to_the_leader_falling_silent_deposes_no_healthy_leader(network):
    """An asymmetric cut: n2's link to n1 falls silent (heartbeats), n1's link to n2 goes on.  n1 keeps its lease
    and leads on in the same term, confirming with n2's copy; a link the other end closes (its node died) still
    revokes the lease at once."""
    node = await declared(network)
    term = node.quorum.groups[KEY].term
    network.fall_silent("n2", "n1")
    network.fall_silent("n3", "n1")
    await asyncio.sleep(2 * quorum.LEASE_TTL)
    assert leader(network) is node and node.quorum.groups[KEY].term == term
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "confirmed by the followers")
    network.heal("n2", "n1")
    network.heal("n3", "n1")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader at once", quorum.LEASE_TTL / 2)


async def test_settles_sent_to_a_dying_leader_are_sent_again_to_the_next(network):
    """n2's consumer acks its 50 just as n1 dies (the acks never reach it): n2 sends them again to the new
    leader, which applies them rather than delivering the 50 again (RabbitMQ's channel resends its settles)."""
    _, client, sent = await consumer_holding(network, "n2")
    network.hold("n2", "n1")
    first = list(client.received)
    assert client.ack() == 50
    await asyncio.sleep(0.05)
    await network.kill("n1")
    await drained(network, client, sent)
    again = [body for body in client.received[len(first):] if body in first]
    assert again == []


async def test_a_consumer_whose_node_missed_the_change_of_leader_is_moved_by_the_deposed_leader(network):
    """n3's watch stalls (no event, no error) while n1 is deposed and n2 leads: n3 still sees n1 as the leader.
    n1, deposed, tells n3 that its consumer is no longer there; n3 asks etcd who leads and consumes there.  (What
    n1 and n2 send n3 waits until n3 is seen not to know: on a loaded machine n1's word could otherwise reach n3
    before the check.)"""
    node, client, sent = await consumer_holding(network, "n3")
    network.nodes["n3"].client.deaf = True
    node.client.unreachable = True
    network.hold("n1", "n3")
    network.hold("n2", "n3")
    await wait_for(lambda: quorum.LEADERS + KEY.encode() not in network.etcd.kvs, "n1's lease lapsed")
    node.client.unreachable = False
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "another leader")
    assert network.nodes["n3"].quorum.groups[KEY].leader == "n1"  # (n3 heard nothing)
    network.release("n1", "n3")
    network.release("n2", "n3")
    await drained(network, client, sent)


async def test_a_deposed_leader_passes_its_unconfirmed_publishes_on_to_the_next(network):
    """n1 took 10 publishes its followers have, but their answers have not reached it when its lease is revoked:
    rather than nack them, it passes them on to the leader elected next, which confirms them (RabbitMQ's
    publishers see no nack at a change of leader either) and takes none of them twice: each was n1's window's."""
    node = await declared(network)
    network.hold("n2", "n1")
    network.hold("n3", "n1")
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: all(network.nodes[name].quorum.groups[KEY].applied >= 10 for name in ("n2", "n3")),
                   "the followers have them")
    network.etcd.revoke(node.quorum.groups[KEY].leader_lease)
    await wait_for(lambda: leader(network) is not None and leader(network) is not node, "another leader")
    await wait_for(lambda: node.quorum.groups[KEY].leader == the_leader(network).name, "n1 follows it")
    network.release("n2", "n1")
    network.release("n3", "n1")
    await wait_for(lambda: len(confirms.outcomes) == 10, "an answer to each")
    assert confirms.acked() == list(range(1, 11))
    assert await copies_agree(network) == bodies(10)


async def test_publishes_through_a_follower_whose_leader_paused_are_confirmed_by_the_next_leader_once(network):
    """n2 publishes through n1, which has them replicated to n2 and n3 but has not heard their acks when it
    pauses (it hears and says nothing, and loses etcd).  n2's window sends its unconfirmed publishes again to
    the leader elected next, which confirms them — at the election, not once n1's link is found silent — and
    takes none of them twice: its state knows n2's window's seqs (as ``rabbit_fifo`` knows its enqueuers')."""
    node = await declared(network)
    network.hold("n2", "n1")  # (n2's publishes go on below, one by one; the followers' acks wait)
    network.hold("n3", "n1")
    confirms = Confirms()
    publish(network.nodes["n2"], bodies(10), confirms)
    await asyncio.sleep(0.05)
    held = network.held[("n2", "n1")]
    publishes = [frame for frame in held if frame[2] == link.ENQUEUE]
    held[:] = [frame for frame in held if frame[2] != link.ENQUEUE]
    assert len(publishes) == 10
    for frame in publishes:
        network.deliver(*frame)
    await wait_for(lambda: all(network.nodes[name].quorum.groups[KEY].state.next_seq == 10 for name in NAMES),
                   "the followers have them")
    node.client.unreachable = True  # n1 pauses: it says nothing more, and its lease lapses
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    await wait_for(lambda: leader(network) is not None and leader(network) is not node, "another leader")
    await wait_for(lambda: len(confirms.outcomes) == 10, "an answer to each", 1.0)
    assert confirms.acked() == list(range(1, 11))
    node.client.unreachable = False
    for pair in (("n2", "n1"), ("n3", "n1"), ("n1", "n2"), ("n1", "n3")):
        network.release(*pair)
    await wait_for(lambda: node.quorum.groups[KEY].leader == the_leader(network).name, "n1 follows")
    assert await copies_agree(network) == bodies(10)


async def test_a_consumer_made_while_its_node_cannot_reach_the_leader_consumes_once_it_can(network):
    """A consumer through n2 while n2's link to the leader is down: its consume is sent once the link is back
    (as a consume again, with nothing to take back), and the answer to it attaches the consumer, so that its
    acks reach the leader (they were parked for good: the 50 it held stayed out at the leader)."""
    node = await declared(network)
    sent = bodies(200)
    confirms = Confirms()
    publish(node, sent, confirms)
    await wait_for(lambda: len(confirms.acked()) == 200, "the publishes confirmed")
    network.cut("n2", "n1")
    client = Client(network.nodes["n2"], prefetch=50).consume()
    await asyncio.sleep(0.1)
    network.heal("n2", "n1")
    await drained(network, client, sent)


async def test_a_consumer_consuming_again_at_the_same_leader_takes_back_what_it_held_there(network):
    """n3 tells its consumer to consume again at n1, twice in a row (two changes of term heard late, or a
    refusal's retry crossing a change of leader): n1 takes what the consumer held under its earlier ids back
    for it, rather than keep it for consumers that are gone."""
    _, client, sent = await consumer_holding(network, "n3")
    proxy = network.nodes["n3"].broker.vhosts["/"].queues["q"]
    proxy.follow(network.nodes["n3"].peers["n1"])
    proxy.follow(network.nodes["n3"].peers["n1"])
    await drained(network, client, sent)


async def test_a_leader_that_may_have_been_deposed_delivers_nothing(network):
    """n1 is cut off from etcd and its followers while its consumer takes 50 a turn: once its lease may have
    lapsed it delivers no more (all it delivered would come again from the next leader); afterwards the
    consumer gets every message, from whichever node leads."""
    node = await declared(network)
    publish(node, bodies(3000))
    await copies_agree(network)
    client = Client(node).consume()
    node.client.unreachable = True
    for other in ("n2", "n3"):
        network.hold("n1", other)
    await asyncio.sleep(quorum.LEASE_TTL / 2)
    start = len(client.received)
    for _ in range(40):
        client.ack()
        await asyncio.sleep(0.05)
    assert len(client.received) - start <= 50
    node.client.unreachable = False
    for other in ("n2", "n3"):
        network.release("n1", other)
    await drained(network, client, bodies(3000))


async def test_a_copy_restarted_from_its_rows_takes_no_window_publish_twice_when_it_leads(network):
    """n2 publishes through n1; n3 has them, but n1's confirms never reach n2 (its link to n2 is slow), nor do
    its ops.  n3 restarts, reading its copy back from its rows, then leads once n1 dies: n2's window sends its
    unconfirmed publishes again, and n3 takes none of them twice — its state's enqueuers were kept with its
    rows (as the rest of ``rabbit_fifo``'s state is in Ra's snapshots)."""
    await declared(network)
    network.hold("n1", "n2")
    confirms = Confirms()
    publish(network.nodes["n2"], bodies(10), confirms)
    await wait_for(lambda: network.nodes["n3"].quorum.groups[KEY].state.next_seq == 10, "n3 has them")
    await network.kill("n3")
    n3 = await network.start_node("n3")
    assert n3.quorum.groups[KEY].state.next_seq == 10
    await wait_for(lambda: n3.quorum.groups[KEY].leader == "n1", "n3 follows n1")
    assert confirms.outcomes == {}
    await network.kill("n1")
    await wait_for(lambda: leader(network) is n3, "n3 leads")
    await wait_for(lambda: len(confirms.outcomes) == 10, "an answer to each")
    assert confirms.acked() == list(range(1, 11))
    assert await copies_agree(network) == bodies(10)


async def test_a_restarted_leader_never_leads_again_under_its_earlier_runs_key(network):
    """n1 leads and is killed while the others cannot reach etcd (they cannot revoke its lease), and etcd keeps
    that lease alive (as it gives every lease its TTL anew when it restarts): n1 runs again and finds its key.
    Its earlier run's term is over (its copy may lack ops its followers took from it, not yet on its disk:
    leading on would put two ops at one index): it revokes that lease, and the members elect a leader of a
    later term, which has every confirmed message."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "the first confirms")
    group = node.quorum.groups[KEY]
    term, lease = group.term, group.leader_lease
    for name in ("n2", "n3"):
        network.nodes[name].client.unreachable = True
    await network.kill("n1")
    network.etcd.leases[lease].expires = asyncio.get_running_loop().time() + 60
    for name in ("n2", "n3"):
        network.nodes[name].client.unreachable = False
    n1 = await network.start_node("n1")
    await wait_for(lambda: leader(network) is not None, "a leader")
    assert replicator_of(the_leader(network)).term > term
    assert n1.quorum.groups[KEY].replicator is None or n1.quorum.groups[KEY].replicator.term > term
    publish(n1, bodies(5, "after"), confirms)
    await wait_for(lambda: len(confirms.outcomes) == 15, "an answer to each")
    assert confirms.acked() == list(range(1, 16))
    assert await copies_agree(network) == bodies(10) + bodies(5, "after")


async def test_a_leader_another_node_names_is_checked_with_etcd_whose_word_stands(network):
    """A node that named a leader may have been cut off since, and that leader gone with its key: n2 follows the
    leader it is told of only until etcd answers, which names n1 again (a later term another node named but etcd
    holds no key of), and with no key at all, n2 and n3 elect rather than follow a leader none can reach (nemesis
    seed 29: both live members followed a dead one, named by a member back from a cut, for 30 s)."""
    node = await declared(network)
    n2 = network.nodes["n2"]
    group = n2.quorum.groups[KEY]
    term = group.term
    n2.quorum._hinted(group, "n3", term + 1000)
    assert group.leader == "n3"
    await wait_for(lambda: (group.leader, group.term) == ("n1", term), "n2 follows etcd's leader again")
    for name in ("n2", "n3"):
        network.nodes[name].client.deaf = True  # (their watches hear nothing: as after a stalled stream)
    network.cut("n1", "n2")
    network.cut("n1", "n3")
    assert node.quorum.lease is not None
    network.etcd.revoke(node.quorum.lease.id)  # n1 goes from etcd, and the deaf do not hear it
    for name in ("n2", "n3"):  # a node back from a cut names the leader it knew, to each
        other = network.nodes[name].quorum
        other._hinted(other.groups[KEY], "n1", term + 1000)
    await wait_for(lambda: leader(network) is not None and the_leader(network).name in ("n2", "n3"),
                   "n2 or n3 leads")


async def test_a_leader_cut_from_its_followers_but_not_etcd_steps_down_and_they_elect_one(network):
    """n1 leads and is cut from n2 and n3 (its links fall silent), though not from etcd, whose lease it keeps:
    before, it kept its key and the queue confirmed nothing until the cut healed.  Now a leader whose links
    reach no majority gives up its key, the members that reach one another elect one of them, and the cut-off
    node stands in no election meanwhile (it would win with the ops only it has); healed, it follows."""
    node = await declared(network)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "the first confirms")
    term = node.quorum.groups[KEY].term
    network.cut("n1", "n2", silent=True)
    network.cut("n1", "n3", silent=True)
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "n2 or n3 leads")
    assert replicator_of(the_leader(network)).term > term
    assert node.quorum.groups[KEY].replicator is None
    publish(network.nodes["n2"], bodies(5, "cut"), confirms)
    await wait_for(lambda: len(confirms.outcomes) == 15, "an answer to each")
    assert confirms.acked() == list(range(1, 16))
    await asyncio.sleep(0.5)
    assert node.quorum.groups[KEY].replicator is None  # (cut off, it claims nothing)
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    await wait_for(lambda: node.quorum.groups[KEY].leader == the_leader(network).name, "n1 follows")
    assert await copies_agree(network) == bodies(10) + bodies(5, "cut")


async def cut_off_while_etcd_is_away(network: Network) -> Node:
    """n1 leads; etcd goes away (restarting: no lease lapses meanwhile) and, past half the lease (n1 is no longer
    sure of its own), n1's links to n2 and n3 fall silent: cut off from everything, as its links find it."""
    node = await declared(network)
    network.etcd.stop()
    await asyncio.sleep(quorum.LEASE_TTL * 0.55)
    assert not node.quorum.lease_sure
    network.cut("n1", "n2", silent=True)
    network.cut("n1", "n3", silent=True)
    await asyncio.sleep(0.3)
    assert node.quorum.groups[KEY].replicator is not None  # (leads on)
    return node


async def test_a_leader_cut_off_while_etcd_is_away_leads_on_once_the_cut_heals(network):
    """Nobody can be elected while etcd is away, so a leader cut off then gains nothing by stepping down: before,
    n1 did all the same, and the queue had no leader once the cut healed, until etcd was back (nemesis seed 266:
    a 13 s confirm gap for a 5.7 s cut, etcd restarting).  Now it leads on, and healed, it confirms again in the
    same term with etcd still away."""
    confirms = Confirms()
    node = await cut_off_while_etcd_is_away(network)
    term = node.quorum.groups[KEY].term
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    publish(node, bodies(5), confirms)
    await wait_for(lambda: len(confirms.acked()) == 5, "confirms with etcd still away", quorum.LEASE_TTL)
    assert all(other.quorum.groups[KEY].leader == "n1" and other.quorum.groups[KEY].term == term
               for other in network.nodes.values())
    network.etcd.start()
    assert await copies_agree(network) == bodies(5)


async def test_a_leader_cut_off_while_etcd_was_away_steps_down_once_its_lease_is_sure_again(network):
    """etcd comes back while n1 is still cut from n2 and n3, and n1 reaches it: etcd kept n1's lease through its
    restart, and n1's refreshes keep it, with its key.  Once its lease is sure again n1 steps down, and n2 and n3
    elect one of them, rather than confirm nothing until the cut heals."""
    confirms = Confirms()
    node = await cut_off_while_etcd_is_away(network)
    network.etcd.start()
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "n2 or n3 leads")
    assert node.quorum.groups[KEY].replicator is None
    publish(network.nodes["n2"], bodies(5), confirms)
    await wait_for(lambda: len(confirms.acked()) == 5, "confirms through n2")
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    await wait_for(lambda: node.quorum.groups[KEY].leader == the_leader(network).name, "n1 follows")
    assert await copies_agree(network) == bodies(5)


async def test_a_follower_whose_request_to_catch_up_was_lost_asks_again(network, monkeypatch):
    """n3 misses ops, and its request to catch up is lost (the leader was not leading yet when it came, say):
    as ops it cannot take go on coming it asks again a while later, rather than wait for a change of term."""
    node = await declared(network)
    publish(node, bodies(5))
    await copies_agree(network)
    network.hold("n1", "n3")
    publish(node, bodies(10, "missed"))
    await asyncio.sleep(0.05)
    network.held[("n1", "n3")].clear()  # (lost)
    network.release("n1", "n3")
    network.hold("n3", "n1")
    publish(node, bodies(5, "later"))
    held = network.held[("n3", "n1")]
    await wait_for(lambda: any(frame[2] == link.REPLICATED for frame in held), "n3 asks to catch up")
    held[:] = [frame for frame in held if frame[2] != link.REPLICATED]  # (its request lost)
    network.release("n3", "n1")
    for i in range(5):
        await asyncio.sleep(0.1)
        publish(node, [b"more%d" % i])
    assert await copies_agree(network) == [*bodies(5), *bodies(10, "missed"), *bodies(5, "later"),
                                           *[b"more%d" % i for i in range(5)]]


# -- a node gone silent -------------------------------------------------------------------------


def pause(network: Network, name: str) -> None:
    """``name`` hears and says nothing until ``resume``: the others close their links to it once the heartbeats
    went unheard (as a node paused longer than they wait)."""
    for other in NAMES:
        if other != name:
            network.cut(name, other, silent=True)


def resume(network: Network, name: str) -> None:
    for other in NAMES:
        if other != name:
            network.heal(name, other)


async def test_a_consumer_whose_node_paused_past_the_heartbeats_gets_nothing_twice(network):
    """n2 pauses while its consumer holds 50 of n1's queue: n1 keeps them for it rather than return them; n2
    resumes, its consumer takes them back and acks them, and no message reaches it twice (RabbitMQ does not
    notice a pause shorter than its net_ticktime either)."""
    node, client, sent = await consumer_holding(network, "n2")
    pause(network, "n2")
    await asyncio.sleep(0.2)
    assert queue_of(node).state.messages == 200 and len(queue_of(node).state.checked_out) == 50
    resume(network, "n2")
    await drained(network, client, sent)
    assert len(client.received) == len(set(client.received)) == 200


async def test_what_a_silent_nodes_consumer_held_comes_back_once_its_link_is_back_without_it(network,
                                                                                            monkeypatch):
    """n2's consumer is gone by the time n2's link is back (its channel closed meanwhile): what it held comes
    back ``RECONCILE`` seconds after the link, and a consumer on n3 gets every message."""
    monkeypatch.setattr(owner_side, "RECONCILE", 0.3)
    _, client, sent = await consumer_holding(network, "n2")
    pause(network, "n2")
    client.close()
    resume(network, "n2")
    other = Client(network.nodes["n3"], prefetch=50).consume()
    await drained(network, other, sent)


async def test_what_a_node_that_never_comes_back_held_comes_back_after_the_grace(network, monkeypatch):
    """n2 stays silent: what its consumer held is kept ``SILENT_GRACE`` seconds, then a consumer on n3 gets it."""
    monkeypatch.setattr(owner_side, "SILENT_GRACE", 3.0)
    node, client, sent = await consumer_holding(network, "n2")
    held = set(queue_of(node).state.checked_out)
    pause(network, "n2")
    other = Client(network.nodes["n3"], prefetch=50).consume()
    await wait_for(lambda: other.ack() >= 0 and len(other.received) == 150, "the others")
    assert held <= queue_of(node).state.checked_out.keys() and not set(client.received) & set(other.received)
    await drained(network, other, sent)


async def test_what_a_silent_nodes_consumer_held_goes_to_the_next_leader_once_the_leader_dies(network):
    """n2 pauses, n1 (which kept what n2's consumer held) dies: no majority is left until n2 runs again (n3
    alone elects nobody), then the next leader returns it after its handover grace, and n2's consumer gets
    every message."""
    _, client, sent = await consumer_holding(network, "n2")
    pause(network, "n2")
    await network.kill("n1")
    await asyncio.sleep(1.0)
    assert leader(network) is None
    resume(network, "n2")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    await drained(network, client, sent)


async def test_a_killed_nodes_keeping_of_a_silent_nodes_messages_ends_with_it(network, monkeypatch):
    """n1 keeps what paused n2's consumer held, then dies: its grace does not run out later on its closed
    broker."""
    monkeypatch.setattr(owner_side, "SILENT_GRACE", 0.5)
    released: list[Broker] = []
    release = owner_side.Orphans.release

    def watched(orphans: owner_side.Orphans, node: str) -> None:
        released.append(orphans.broker)
        release(orphans, node)

    monkeypatch.setattr(owner_side.Orphans, "release", watched)
    await consumer_holding(network, "n2")
    pause(network, "n2")
    await asyncio.sleep(0.1)
    dead = network.nodes["n1"].broker
    await network.kill("n1")
    await asyncio.sleep(1.0)
    assert dead not in released


async def test_a_machine_stalled_for_more_than_two_seconds_keeps_its_leaders(network):
    """The whole machine stalls (a loaded host: every node's loop and etcd's clock): no lease lapses, the leader
    leads on in the same term and confirms at once."""
    node = await declared(network)
    term = node.quorum.groups[KEY].term
    await asyncio.sleep(0.3)
    time.sleep(2.2)  # (blocks the loop: every node, and the fake etcd's clock runs on)
    confirms = Confirms()
    publish(node, bodies(10), confirms)
    await wait_for(lambda: len(confirms.acked()) == 10, "confirmed", 2.0)
    await asyncio.sleep(0.5)
    assert leader(network) is node and node.quorum.groups[KEY].term == term


async def test_what_never_reached_a_paused_nodes_consumer_comes_back_as_soon_as_it_consumes_again(network,
                                                                                                   monkeypatch):
    """n1's deliveries of 10 more are lost with n2's link as n2 pauses: once n2's consumer consumes again (what it
    holds taken back), n1 returns those 10 at once, not after ``RECONCILE``, and the consumer gets each once."""
    monkeypatch.setattr(owner_side, "RECONCILE", 30.0)
    _, client, sent = await consumer_holding(network, "n2")
    network.hold("n1", "n2")
    client.ack(10)
    await wait_for(lambda: sum(frame[2] == link.DELIVER for frame in network.held[("n1", "n2")]) == 10,
                   "10 deliveries on their way")
    pause(network, "n2")
    network.release("n1", "n2")  # (nothing: they went with the link)
    resume(network, "n2")
    await drained(network, client, sent, timeout=10)
    assert len(client.received) == len(set(client.received)) == 200


async def consuming_unheard(network: Network, count: int, every: float, prefetch: int = 50) -> tuple[Node, Client]:
    """n1 leads ``count`` messages all have; then its followers hear nothing from it (etcd still does) while its
    own consumer (of ``prefetch``) acks what it holds every ``every`` seconds, for a little longer than
    ``PROGRESS``."""
    node = await declared(network)
    publish(node, bodies(count))
    await copies_agree(network)
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    client = Client(node, prefetch).consume()
    loop = asyncio.get_running_loop()
    until = loop.time() + quorum_log.PROGRESS + 0.3
    while loop.time() < until:
        client.ack()
        await asyncio.sleep(every)
    return node, client


async def deposed_and_drained(network: Network, node: Node, client: Client, count: int,
                              timeout: float = 20.0) -> int:
    """n1 is deposed, then heard again; ``client`` gets every message (within ``timeout``): how many twice."""
    network.etcd.revoke(node.quorum.groups[KEY].leader_lease)
    await wait_for(lambda: leader(network) is not None and leader(network) is not node, "another leader")
    network.release("n1", "n2")
    network.release("n1", "n3")
    await drained(network, client, bodies(count), timeout)
    return len(client.received) - len(set(client.received))


async def test_a_leader_no_majority_answers_stops_delivering_what_the_next_would_deliver_again(network):
    """n1 delivers no more once no majority has answered for ``PROGRESS`` seconds (nothing it delivers could be
    committed); deposed then, the next leader delivers again only what n1 delivered until then, not all that
    n1's consumer would have gone through for as long as n1 kept its lease."""
    node, client = await consuming_unheard(network, 3000, 0.05)
    stalled = len(client.received)
    for _ in range(30):
        client.ack()
        await asyncio.sleep(0.05)
    assert len(client.received) - stalled <= 50  # (at most a prefetch window taken as it stopped)
    assert await deposed_and_drained(network, node, client, 3000) <= stalled


@pytest.mark.parametrize("prefetch", [10, 50])
async def test_a_leader_no_majority_answers_delivers_no_more_than_a_few_its_consumer_acks_at_once(network,
                                                                                              prefetch):
    """As above, but n1's consumer acks everything it holds at every loop turn: in ``PROGRESS`` seconds it would
    go through thousands, all delivered again by the next leader.  n1 stops once ``UNCOMMITTED_DELIVERIES``
    of its deliveries, or its consumers' prefetch if more, wait for a majority (as a ``rabbit_fifo`` leader
    gives a consumer more only for settles that committed)."""
    node, client = await consuming_unheard(network, 5000, 0, prefetch)
    bound = max(prefetch, quorum_log.UNCOMMITTED_DELIVERIES)
    assert len(client.received) <= bound
    assert await deposed_and_drained(network, node, client, 5000, timeout=60) <= bound  # (n1 may deliver on
    # until it finds its lease gone: what it delivers, at most the bound, none of it committed, comes again)


async def test_what_a_node_held_on_a_link_found_silent_after_its_next_link_came_up_waits_no_grace(network,
                                                                                               monkeypatch):
    """n2 dials n1 again before n1 finds n2's old link silent (it was half-open): n2's consumer has consumed again
    over the new link by then, with nothing to take back there.  What n1 keeps from the old link comes back
    ``RECONCILE`` seconds later, not after ``SILENT_GRACE``."""
    monkeypatch.setattr(owner_side, "RECONCILE", 0.5)
    _, client, sent = await consumer_holding(network, "n2")
    old = network.sessions[("n1", "n2")]
    peer = network.nodes["n2"].peers["n1"]
    peer.link.silent = True  # (n2 found it silent: it revokes no lease)
    peer._went_down()
    n1 = network.nodes["n1"]
    network.sessions[("n1", "n2")] = owner_side.PeerSession(n1.broker, FakeLink(network, "n1", "n2"),  # type: ignore[arg-type]  # (a fake link)
                                                            n1.orphans)
    peer.link = FakeLink(network, "n2", "n1")
    peer._went_up()
    await asyncio.sleep(0.1)
    old.link.silent = True
    old.closed()
    await drained(network, client, sent, timeout=5)


@pytest.mark.parametrize("on", ["n1", "n2"])
async def test_a_consumer_outlives_its_leaders_step_down(network, on):
    node, client, sent = await consumer_holding(network, on)
    network.cut("n1", "n2", silent=True)
    network.cut("n1", "n3", silent=True)
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "n2 or n3 leads")
    await asyncio.sleep(0.5)
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    await drained(network, client, sent)


async def deposed_with_consumer(network: Network, client: Client, sent: list[bytes], lost: bool = False) -> None:
    """n1 is cut from both followers (``lost``: with what its links held) until n2 or n3 leads, then heals; the
    client drains the queue."""
    network.cut("n1", "n2", silent=True)
    network.cut("n1", "n3", silent=True)
    if lost:
        for follower in ("n2", "n3"):
            network.held.pop(("n1", follower))
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "n2 or n3 leads")
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    await drained(network, client, sent)


async def test_a_leader_cut_from_its_followers_delivers_nothing_twice_to_its_own_consumer(network):
    """n1 leads with a consumer of its own, and is cut from both followers: what its consumer acks meanwhile
    cannot reach a majority.  Once n2 or n3 leads and the cut heals, nothing the consumer had is delivered to it
    again (RabbitMQ's consumer settles with the next leader what the deposed one could not commit)."""
    _, client, sent = await consumer_holding(network, "n1")

    async def acking() -> None:  # (the consumer goes on acking what it gets, as a client would)
        for _ in range(20):
            client.ack()
            await asyncio.sleep(0.02)
    task = asyncio.get_running_loop().create_task(acking())
    await deposed_with_consumer(network, client, sent)
    await task
    assert len(client.received) == len(set(client.received)), "delivered twice"


@pytest.mark.parametrize("more", [False, True])
async def test_what_a_deposed_leaders_consumer_acked_there_is_not_delivered_again(network, more, request):
    """n1's consumer acks its 50 while n1 still leads, but n1's ops no longer reach its followers: deposed, n1
    hands the consumer on with those settles, which the next leader carries out rather than deliver the 50 again.
    ``more``: n1 delivers 50 more, acked too, which the next leader has ready, never checked out (as a
    ``basic.get`` takes one: a consumer's wait for a majority, ``delivering_unagreed``): the settles check them
    out and settle them."""
    if more:
        request.getfixturevalue("delivering_unagreed")
    _, client, sent = await consumer_holding(network, "n1")
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    assert client.ack() == 50
    if more:
        await wait_for(lambda: len(client.unacked) == 50, "50 more delivered")
        assert client.ack() == 50
    first = list(client.received)
    await deposed_with_consumer(network, client, sent, lost=True)
    again = [body for body in client.received[len(first):] if body in first]
    assert again == []


async def test_what_a_cut_off_nodes_consumer_held_waits_for_it_past_the_grace(network, monkeypatch):
    """n1 leads with a consumer of its own and is cut from both followers for longer than the next leader's
    grace, while another consumer on n2 takes all it can: the 50 n1's consumer holds are kept for it until the
    cut heals, not given to the other (RabbitMQ keeps a consumer's messages through a cut shorter than its net
    tick time)."""
    monkeypatch.setattr(quorum_queue, "HANDOVER_GRACE", 0.3)
    _, client, sent = await consumer_holding(network, "n1")
    other = Client(network.nodes["n2"], prefetch=50).consume()
    network.cut("n1", "n2", silent=True)
    network.cut("n1", "n3", silent=True)
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "n2 or n3 leads")
    for _ in range(50):  # (past the grace, the cut still on)
        other.ack()
        await asyncio.sleep(0.02)
    network.heal("n1", "n2")
    network.heal("n1", "n3")
    deadline = asyncio.get_running_loop().time() + 20
    while set(sent) - set(client.received) - set(other.received):
        assert asyncio.get_running_loop().time() < deadline, "never delivered"
        client.ack()
        other.ack()
        await asyncio.sleep(0.02)
    assert not set(client.received) & set(other.received), "delivered to both"


@pytest.mark.integration
async def test_a_consumer_s_acks_that_its_leader_never_committed_reach_the_next_leader_however_long_after(network):
    """A consumer on n3 acks the 50 it holds just as n1, the leader, is cut off (the acks never reach it) while
    n2 is down: no majority anywhere, for over 10 s.  Once n2 is back and a leader elected, n3's consumer sends
    it those acks all the same, and it delivers none of those messages again (when only the settles of the
    last 10 s before the consume again were sent, nemesis seed 178 delivered such a window twice, 10.5 s
    apart)."""
    _, client, sent = await consumer_holding(network, "n3")
    await network.kill("n2")
    network.hold("n3", "n1")
    assert client.ack() == 50
    network.held[("n3", "n1")].clear()  # (lost with the cut)
    network.cut("n1", "n3", silent=True)
    network.release("n3", "n1")
    await asyncio.sleep(10.5)
    await network.start_node("n2")
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "n2 or n3 leads")
    network.heal("n1", "n3")
    await drained(network, client, sent)
    assert len(client.received) == len(set(client.received)), "delivered twice"


def answers_held(network: Network, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int, bytes]]:
    """The followers' answers to n1 wait (returned, to be delivered later): n1 leads on, but commits nothing."""
    held: list[tuple[str, str, int, bytes]] = []
    deliver = network.deliver

    def holding(source: str, destination: str, ftype: int, payload: bytes) -> None:
        if destination == "n1" and ftype == link.REPLICATED:
            held.append((source, destination, ftype, payload))
        else:
            deliver(source, destination, ftype, payload)

    monkeypatch.setattr(network, "deliver", holding)
    return held


async def test_a_deposed_leader_s_consumer_takes_along_the_settles_no_majority_had_however_long_ago(
        network, monkeypatch):
    """A leader deposed long after its consumer's last acks (no majority answering it meanwhile) still hands those
    acks to the next leader with what the consumer holds, and not those a majority had: a leader learns it was
    deposed only once its cut heals, and a settle is sent again until one is known to be agreed."""
    node = await declared(network)
    publish(node, bodies(3))
    client = Client(node, prefetch=3).consume()
    await wait_for(lambda: len(client.unacked) == 3, "three held")
    client.ack(1)
    await copies_agree(network)
    queue = queue_of(node)
    answers_held(network, monkeypatch)
    client.ack(1)
    await asyncio.sleep(0.5)
    client.ack(1)
    _, settles = queue.release(queue.consumers[0], [])
    assert [checked[0] for _, _, checked, _ in settles] == [1, 2]


async def test_a_consumer_s_settles_through_a_follower_are_kept_until_its_leader_has_them_on_a_majority(
        network, monkeypatch):
    """A consumer on n3 acks what it holds while n1, the leader, hears no follower's answer: its node keeps every
    one of those settles for a next leader, however long that lasts, and forgets them once n1 says a majority
    has them (they were pruned by age and count, and lost across two changes of leader: nemesis seeds 208 and
    228 delivered acked messages again 22 to 31 s later)."""
    _, client, _ = await consumer_holding(network, "n3")
    queue = client.consumer.queue
    remote = queue.by_consumer[client.consumer]
    deliver = network.deliver
    held = answers_held(network, monkeypatch)
    assert client.ack() == 50
    await asyncio.sleep(0.5)
    assert len(remote.settled) == 50
    monkeypatch.setattr(network, "deliver", deliver)
    for frame in held:
        deliver(*frame)
    await wait_for(lambda: not remote.settled, "the settles forgotten once agreed")
    assert queue.by_consumer[client.consumer] is remote


async def test_a_leader_that_knew_not_a_settle_s_delivery_tag_says_the_settles_are_not_agreed(network):
    """A settle naming a delivery tag the leader no longer knows (its consumer was handed over as the leader
    stood down, or the link went) did nothing there: the next answer on settles says they are not agreed, so
    that the consumer's node keeps them for the leader it consumes at next; the answer after that, to settles
    that all did what they said, is that they are."""
    await declared(network)
    session = network.sessions[("n1", "n3")]
    sent: list[tuple[int, bytes]] = []
    session.link.send = lambda ftype, *parts: sent.append((ftype, b"".join(parts)))
    session.frame(link.SETTLE, bytes((link.SETTLE_ACK,)) + link.TAG.pack(12345))
    session.frame(link.REQUEST, link.encode_json({"rid": 7, "op": "settled"}))
    session.frame(link.REQUEST, link.encode_json({"rid": 8, "op": "settled"}))
    session.frame(link.REQUEST, link.encode_json({"rid": "x", "op": "settled"}))
    assert [json.loads(payload[link.REPLY_HEAD.size:]) for ftype, payload in sent if ftype == link.REPLY] == [
        {"rid": 7, "agreed": False}, {"rid": 8, "agreed": True}]


async def test_a_consume_again_whose_checkouts_are_not_numbers_takes_back_nothing(network):
    """A peer's consume-again names what its consumer holds and settled lately; what is not a checkout
    (``[seq, term, agreed]``: two numbers and a boolean) is taken back or settled as nothing, and the queue
    goes on as it was."""
    node = await declared(network)
    publish(node, bodies(5))
    queue = queue_of(node)
    held = take(queue)
    await copies_agree(network)
    term = queue.term
    bad = ["x", None, [1], [held.seq, term], [held.seq, "t", True], [-1, term, True], [held.seq, term, 1],
           [held.seq, term, True, 0], {"a": 1}]
    requests = [(bad, [[0, *checked] for checked in bad if isinstance(checked, list)]), ("x", {"a": 1}),
                ([], [[0, held.seq, term], [9, held.seq, term, True]])]
    for number, (adopt, settled) in enumerate(requests):
        request = {"id": 99 + number, "vhost": "/", "queue": "q", "tag": "ctag", "exclusive": False,
                   "arguments": {}, "timestamps": {}, "prefetch": 10, "adopt": adopt, "buffered": "y",
                   "settled": settled}
        network.deliver("n2", "n1", link.CONSUME, link.encode_json(request))
    await asyncio.sleep(0.05)
    assert queue.state.messages == 5 and queue.state.checked_out[held.seq] == term  # (its consumer's still)


async def test_a_peer_s_requests_to_wait_for_definitions_are_bounded_and_its_malformed_requests_ignored(network):
    """A node's ``sync`` requests (wait until this node's definitions reach a revision) are each answered, and no
    more than ``SYNCS_MAX`` wait at once: past them the answer is "not yet" at once, so a flood keeps nothing here.
    A request that is no JSON object, or whose ids are not integers, is dropped without an answer or an error."""
    node = network.nodes["n1"]
    session = network.sessions[("n1", "n2")]
    sent: list[bytes] = []
    session.link.send = lambda ftype, *parts: sent.append(b"".join(parts))
    never = asyncio.Event()

    async def reached(revision: int) -> bool:
        await never.wait()
        return True

    node.reached = reached  # (the fake cluster stands in for Cluster)
    for malformed in (b"[1]", b'"sync"', b'{"op": "sync", "rid": "1", "revision": 5}'):
        session.frame(link.REQUEST, malformed)
    for rid in range(owner_side.SYNCS_MAX + 3):
        session.frame(link.REQUEST, json.dumps({"op": "sync", "rid": rid, "revision": 10 ** 9}).encode())
    await asyncio.sleep(0)
    replies = [json.loads(raw[link.REPLY_HEAD.size:]) for raw in sent]
    assert replies == [{"rid": rid, "reached": False} for rid in range(owner_side.SYNCS_MAX, owner_side.SYNCS_MAX + 3)]
    never.set()
    await wait_for(lambda: len(sent) == owner_side.SYNCS_MAX + 3, "every waiting request answered")


async def test_settles_a_leader_took_back_into_its_own_unagreed_ops_go_on_to_the_leader_after_it(network):
    """n1's own consumer acks its 50 as n1 is cut off (their ops reach nobody), and n1 steps down, its consumer
    keeping the settles for the next leader.  n1 leads again, its copy the furthest: the settles are in its own
    ops already, which it is deposed again before any follower has.  The leader after it, which never had them,
    must get them from the consumer, as ``rabbit_fifo_client`` keeps a settle until a leader applied it: they
    were dropped once a leader had them at all, and n3 delivered the 50 again."""
    node, client, _ = await consumer_holding(network, "n1")
    first = list(client.received)

    def cut_off() -> None:
        for other in ("n2", "n3"):
            network.hold("n1", other)
        for other in ("n2", "n3"):
            network.cut("n1", other, silent=True)

    for other in ("n2", "n3"):
        network.nodes[other].client.unreachable = True  # (no election without n1 yet)
    for other in ("n2", "n3"):
        network.hold("n1", other)
    assert client.ack() == 50
    await asyncio.sleep(0.05)
    cut_off()
    await wait_for(lambda: node.quorum.groups[KEY].replicator is None, "n1 stepped down")
    for other in ("n2", "n3"):
        network.heal("n1", other)
        network.hold("n1", other)  # (n1's ops still reach nobody)
        network.nodes[other].client.unreachable = False
    await wait_for(lambda: node.quorum.groups[KEY].replicator is not None, "n1 leading again")
    await asyncio.sleep(0.1)
    cut_off()
    await wait_for(lambda: node.quorum.groups[KEY].replicator is None, "n1 stepped down again")
    await wait_for(lambda: leader(network) is not None and the_leader(network) is not node, "another leader")
    for other in ("n2", "n3"):
        network.release("n1", other)
        network.heal("n1", other)
    await drained(network, client, bodies(200))
    assert [body for body in client.received[len(first):] if body in first] == []


# -- membership ---------------------------------------------------------------------------------


@pytest.fixture
async def network4(tmp_path) -> AsyncIterator[Network]:
    """Four nodes, for a group of three that takes a fourth member."""
    network = await Network(tmp_path, [*NAMES, "n4"]).start()
    yield network
    await network.close()


def members_everywhere(network: Network, members: list[str]) -> bool:
    return all(node.quorum.groups[KEY].members == members for name, node in network.nodes.items()
               if name not in network.down)


async def test_a_change_of_members_waits_for_the_one_before_to_be_on_a_majority(network4):
    """n1 and n2 confirmed the last publishes (n3's link is slow).  n4 joins, and n2 is removed before n4 has
    the log: a group of n1, n3 and n4 whose only copy of those messages is n1's, which n3 and n4 elect without.
    As Ra refuses a membership change until the one before is committed (``cluster_change_not_permitted``), the
    removal is refused until a majority of the four has every op; then made, every confirmed message outlives
    n1."""
    network = network4
    node = await declared(network, **{"x-quorum-initial-group-size": 3})
    publish(node, bodies(100))
    await wait_for(lambda: in_step(network), "n2 and n3 in step")
    network.hold("n1", "n3")
    confirms = Confirms()
    publish(node, bodies(20, "late"), confirms)
    await wait_for(lambda: confirms.acked() == list(range(1, 21)), "the late ones confirmed by n1 and n2")
    network.hold("n1", "n4")
    await node.quorum.change_members("/", "q", add="n4")
    await wait_for(lambda: members_everywhere(network, ["n1", "n2", "n3", "n4"]), "n4 a member everywhere")
    with pytest.raises(ValueError, match="the change before is not on a majority of its members yet"):
        await network.nodes["n2"].quorum.change_members("/", "q", remove="n2")  # (through the leader)
    network.release("n1", "n4")
    await wait_for(lambda: node.quorum.lag()[KEY]["n4"] == 0, "n4 in step")  # (n3's link still slow)
    await node.quorum.change_members("/", "q", remove="n2")
    await wait_for(lambda: members_everywhere(network, ["n1", "n3", "n4"]), "n2 gone everywhere")
    await network.kill("n1")
    await wait_for(lambda: leader(network) is not None, "a new leader")
    assert queue_of(the_leader(network)).message_count == 120


async def test_a_node_that_is_not_running_joins_no_group_and_a_change_made_already_is_none(network4):
    """As ``rabbit_quorum_queue:add_member`` (``node_not_running``) and ``grow`` (running nodes only): a group of
    three that took a stopped fourth member would need three of four, and lose its majority with one more node.
    A node that is a member already joins, and one that is not leaves, as no-ops (RabbitMQ answers ``ok``)."""
    network = network4
    node = await declared(network, **{"x-quorum-initial-group-size": 3})
    await network.kill("n4")
    with pytest.raises(ValueError, match="node 'n4' is not running"):
        await node.quorum.change_members("/", "q", add="n4")
    assert await node.quorum.grow("n4", "all") == 0
    await network.nodes["n2"].quorum.change_members("/", "q", add="n3")
    await network.nodes["n2"].quorum.change_members("/", "q", remove="n4")
    with pytest.raises(ValueError, match="no node named"):  # (an HTTP body's empty name)
        await network.nodes["n2"].quorum.change_members("/", "q", add="")
    await asyncio.sleep(0.1)
    assert members_everywhere(network, ["n1", "n2", "n3"])
    await network.start_node("n4")
    await wait_for(lambda: node.peers["n4"].up, "n4 back")
    assert await network.nodes["n3"].quorum.grow("n4", "all") == 1  # (through the leader)
    await wait_for(lambda: members_everywhere(network, ["n1", "n2", "n3", "n4"]), "n4 a member everywhere")
    await wait_for(lambda: in_step(network), "n4 in step")






async def test_the_leader_removed_from_its_group_hands_it_over_with_every_confirmed_message(network4):
    """n1 leads and is removed from the group (through another node) while publishes through it wait for their
    confirms: n2 or n3 leads next, with every message n1 confirmed and those it had not (its window sends them
    again); n1 keeps no copy and reaches the queue through the new leader."""
    network = network4
    node = await declared(network, **{"x-quorum-initial-group-size": 3})
    confirms = Confirms()
    publish(node, bodies(100), confirms)
    await wait_for(lambda: confirms.acked() == list(range(1, 101)), "the first confirmed")
    network.hold("n1", "n2")
    network.hold("n1", "n3")
    publish(node, bodies(20, "late"), confirms)  # (on n1 alone when it leaves)
    network.release("n1", "n2")
    network.release("n1", "n3")
    await network.nodes["n2"].quorum.change_members("/", "q", remove="n1")
    await wait_for(lambda: members_everywhere(network, ["n2", "n3"]), "n1 gone everywhere")
    await wait_for(lambda: leader(network) is not None and the_leader(network).name != "n1", "a new leader")
    await wait_for(lambda: confirms.acked() == list(range(1, 121)), "every publish confirmed")
    assert node.quorum.groups[KEY].index_id == 0 and node.quorum.groups[KEY].leader == the_leader(network).name
    queue = queue_of(the_leader(network))
    assert queue.message_count == 120
    got = [take(queue).message.body for _ in range(120)]
    assert sorted(got) == sorted([*bodies(100), *bodies(20, "late")])


async def test_a_member_removed_while_down_drops_its_copy_when_it_starts(network):
    """n3 is removed from the group while its node is down: started again, it is no member, and its copy (rows,
    messages, position) goes, as it would have had n3 been up (they stayed on disk for good); added again
    later, it takes the queue as it is then."""
    node = await declared(network)
    publish(node, bodies(50))
    await copies_agree(network)
    n3 = network.nodes["n3"]
    index_id = n3.quorum.groups[KEY].index_id
    await network.kill("n3")
    await node.quorum.change_members("/", "q", remove="n3")
    await wait_for(lambda: members_everywhere(network, ["n1", "n2"]), "n3 gone")
    n3 = await network.start_node("n3")
    n3.broker.persistence.index.commit()
    assert n3.broker.store.get(quorum.REPLICA, KEY) is None
    assert list(n3.broker.persistence.index.entries(index_id)) == []
    assert n3.broker.persistence.index.position(index_id) == (0, 0)
    publish(node, bodies(10, "late"))
    await node.quorum.change_members("/", "q", add="n3")
    await wait_for(lambda: members_everywhere(network, NAMES), "n3 back in the group")
    assert await copies_agree(network) == [*bodies(50), *bodies(10, "late")]


async def test_every_member_restarted_after_a_snapshot_of_held_entries_counts_them_returned(network, monkeypatch):
    """n3 takes a snapshot while consumers hold four entries, two returned once before; then every node
    restarts from its disk.  What was held comes back in its place counted once more: the two held first time
    are ready with a delivery count of 1, the two past ``x-delivery-limit`` 1 are gone, in every copy."""
    monkeypatch.setattr(quorum_log, "LOG_BYTES", 10_000)
    monkeypatch.setattr(quorum_log, "SNAPSHOT_CHUNK", 32)
    node = await declared(network, **{"x-delivery-limit": 1})
    publish(node, [b"first"])
    await copies_agree(network)
    await network.kill("n3")
    publish(node, bodies(300))
    queue = queue_of(node)
    taken = [take(queue) for _ in range(301)]
    node.broker.settle(queue, taken[2:], True)  # back, counted once; the first two still held
    held = [*taken[:2], take(queue), take(queue)]
    names = [entry.message.body for entry in held]
    await network.start_node("n3")
    await copies_agree(network)
    for name in NAMES:
        await network.kill(name)
    for name in NAMES:
        await network.start_node(name)
    await wait_for(lambda: leader(network) is not None, "a leader")
    await wait_for(lambda: not queue_of(the_leader(network)).state.checked_out, "the held ones back, no consumer "
                   "having taken them (``HANDOVER_GRACE``)")
    ready = await copies_agree(network)
    assert len(ready) == 299 and names[2] not in ready and names[3] not in ready
    state = queue_of(the_leader(network)).state
    assert [state.counts.get(seq) for seq, body in zip(sorted(state.ready), ready) if body in names[:2]] == [1, 1]


def ops_held_from(network: Network, name: str) -> list:
    """What ``name`` ships its followers (REPLICATE frames) waits, all else between the nodes goes on: a leader
    whose ops reach no follower, while its links carry its consumers' frames."""
    held: list = []
    deliver = network.deliver

    def holding(source: str, destination: str, ftype: int, payload: bytes) -> None:
        if source == name and ftype == link.REPLICATE:
            held.append((source, destination, ftype, payload))
        else:
            deliver(source, destination, ftype, payload)

    network.deliver = holding  # type: ignore[method-assign]
    return held


async def test_settles_sent_again_that_the_leader_has_already_are_agreed_only_once_a_majority_has_them(network):
    """n2's consumer acks its 50 at n1, whose ops reach no follower: n2 keeps the settles.  n1 is cut off and
    steps down; it leads again, its copy the furthest, and n2's consumer consumes there again with them, which
    n1's copy has carried out already.  n1 must answer n2's question (are they on a majority?) only once its
    ops are: it answered at once, n2 forgot the settles, and n1 killed then left the next leader to deliver the
    50 again (``rabbit_fifo_client`` keeps a settle pending until a leader applied it)."""
    node, client, sent = await consumer_holding(network, "n2")
    first = list(client.received)
    ops_held_from(network, "n1")
    for other in ("n2", "n3"):
        network.nodes[other].client.unreachable = True  # (no election without n1 yet)
    assert client.ack() == 50
    await asyncio.sleep(0.1)
    for other in ("n2", "n3"):
        network.cut("n1", other, silent=True)
    await wait_for(lambda: node.quorum.groups[KEY].replicator is None, "n1 stepped down")
    for other in ("n2", "n3"):
        network.heal("n1", other)
        network.nodes[other].client.unreachable = False
    await wait_for(lambda: node.quorum.groups[KEY].replicator is not None, "n1 leading again")
    remote = network.nodes["n2"].broker.vhosts["/"].queues["q"]
    assert isinstance(remote, remote_queue.RemoteQueue)
    await wait_for(lambda: all(r.attached and r.owner is network.nodes["n2"].peers["n1"]
                               for r in remote.by_consumer.values()), "n2's consumer back at n1")
    await asyncio.sleep(0.3)  # (n2 asked n1 whether a majority has its settles)
    await network.kill("n1")
    await drained(network, client, sent)
    assert [body for body in client.received[len(first):] if body in first] == []


async def test_settles_sent_again_to_a_leader_whose_copy_was_read_back_from_its_rows_are_carried_out(network):
    """n3 restarts while n2's consumer holds 50 of n1's: its copy, read back from its rows, knows them checked out
    but not in which term.  n2's acks of them never reach n1, which dies; n3 leads, and n2 sends them again
    there.  They name messages every copy has under those seqs (agreed): n3 carries them out, as ``rabbit_fifo``
    applies a settle whatever became of its leader; it took none (their checkout's term was not its copy's) and
    delivered the 50 again once the handover's grace was over (in-process nemesis seed 28)."""
    _, client, sent = await consumer_holding(network, "n2")
    first = list(client.received)
    await network.kill("n3")
    n3 = await network.start_node("n3")
    await wait_for(lambda: n3.quorum.groups[KEY].leader == "n1" and in_step(network), "n3 back with n1")
    network.hold("n2", "n1")
    assert client.ack() == 50
    await asyncio.sleep(0.05)
    await network.kill("n1")
    await wait_for(lambda: leader(network) is n3, "n3 leads")
    await drained(network, client, sent)
    assert [body for body in client.received[len(first):] if body in first] == []


async def test_settles_a_consumer_held_back_that_the_next_leader_took_nothing_back_for_go_on_to_the_one_after(
        tmp_path):
    """Five copies.  n1's own consumer acks its 50 and only n2 gets n1's ops; n1 is cut off and steps down, its
    consumer holding the settles back for the next leader, n2.  n2's copy has them carried out already: it
    takes nothing back for them, and n1 dropped them.  n2 dies before any other copy has its ops, and n1 is cut
    off meanwhile: the leader after, n3, n4 or n5, never had them and must get them from n1, as
    ``rabbit_fifo_client`` keeps a settle pending until a leader applied it; it delivered the 50 again."""
    network = await Network(tmp_path, ["n1", "n2", "n3", "n4", "n5"]).start()
    others = ["n2", "n3", "n4", "n5"]
    try:
        node, client, sent = await consumer_holding(network, "n1")
        first = list(client.received)
        for other in others[1:]:
            network.hold("n1", other)
        assert client.ack() == 50
        n2 = network.nodes["n2"].quorum.groups[KEY]
        await wait_for(lambda: not n2.state.checked_out.keys() & set(range(50)), "n2 has the acks")
        ops_held_from(network, "n2")
        for other in others:
            network.cut("n1", other, silent=True)
        await wait_for(lambda: node.quorum.groups[KEY].replicator is None, "n1 stepped down")
        await wait_for(lambda: leader(network) is network.nodes["n2"], "n2 leads")
        for other in others:
            network.release("n1", other)  # (what it held was dropped with the links)
            network.heal("n1", other)
        proxy = node.broker.vhosts["/"].queues["q"]
        assert isinstance(proxy, remote_queue.RemoteQueue)
        await wait_for(lambda: all(r.attached and r.owner is node.peers["n2"] for r in proxy.by_consumer.values()),
                       "n1's consumer consuming at n2")
        await asyncio.sleep(0.3)  # (n1 asked n2 whether a majority has its settles)
        for other in others:
            network.cut("n1", other, silent=True)
        await network.kill("n2")
        await wait_for(lambda: leader(network) is not None, "a leader of n3, n4 and n5")
        for other in others[1:]:
            network.heal("n1", other)
        await drained(network, client, sent)
        assert [body for body in client.received[len(first):] if body in first] == []
    finally:
        await network.close()
