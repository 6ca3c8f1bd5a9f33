"""The broker core in-process, through a fake delivery target (amqp_server/ports.py): no sockets, no frames.

These pin the queue and broker rules that every front end relies on (round-robin, priorities, prefetch,
requeue order, single active consumer, exclusivity, cancellation) in milliseconds; the same behaviour
is driven through real clients in test_amqp_consuming.py, test_consumers.py and test_priorities.py.
"""
from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands

from amqp_server import errors
from amqp_server.access_control import Principal
from amqp_server.errors import ChannelError
from amqp_server.message import make_message
from exchanges import Exchange
from support import Target, consume, publish_local


async def test_round_robin_within_prefetch(core, vhost):
    core.declare_queue(vhost, "q")
    target = Target()
    consume(core, vhost, "q", target, "a", prefetch=2)
    consume(core, vhost, "q", target, "b", prefetch=2)
    publish_local(core, vhost, "q", b"1", b"2", b"3", b"4", b"5")
    assert target.delivered == [("a", b"1", False), ("b", b"2", False), ("a", b"3", False), ("b", b"4", False)]
    core.settle_taken([target.held[0]], requeue=False)  # a acks 1: credit for one more
    assert target.bodies("a") == [b"1", b"3", b"5"]
    assert vhost.queues["q"].message_count == 0


async def test_higher_priority_consumers_first_while_they_have_credit(core, vhost):
    core.declare_queue(vhost, "q")
    target = Target()
    consume(core, vhost, "q", target, "low")
    consume(core, vhost, "q", target, "high", prefetch=2, priority=5)
    publish_local(core, vhost, "q", b"1", b"2", b"3")
    assert target.bodies("high") == [b"1", b"2"] and target.bodies("low") == [b"3"]


async def test_requeue_returns_to_the_original_place_redelivered(core, vhost):
    core.declare_queue(vhost, "q")
    target = Target()
    consumer = consume(core, vhost, "q", target, "a", prefetch=2)
    publish_local(core, vhost, "q", b"1", b"2", b"3")
    core.settle_taken(target.held[:2], requeue=True)
    assert consumer.unacked == 2  # the requeued two were delivered again at once
    assert target.delivered[2:] == [("a", b"1", True), ("a", b"2", True)]
    assert [e.message.body for e in vhost.queues["q"].peek(0, 10)] == [b"3"]


async def test_requeueing_many_in_front_of_a_deep_queue_takes_linear_time(core, vhost):
    """50,000 held messages requeued (a channel closing, basic.recover, an HTTP get) in front of 150,000
    ready ones: oldest first, each after the first went into the middle of the deque (3-9 s); newest first,
    each goes in front of the head."""
    import gc
    import time

    core.declare_queue(vhost, "q")
    queue = vhost.queues["q"]
    for n in range(200_000):
        core.publish(vhost, vhost.exchange(""), make_message("", "q", commands.Basic.Properties(), b"%d" % n))
    taken = [queue.get(no_ack=False) for _ in range(50_000)]
    gc.disable()  # the algorithm's time, not the collector's
    try:
        started = time.thread_time()  # CPU time: a loaded machine's pauses are not the algorithm's
        core.settle(queue, taken, requeue=True)
        took = time.thread_time() - started
    finally:
        gc.enable()
    assert took < 1.0
    assert [entry.message.body for entry in queue.peek(0, 3)] == [b"0", b"1", b"2"]
    assert [entry.message.body for entry in queue.peek(49_999, 2)] == [b"49999", b"50000"]


async def test_a_full_delivery_target_gets_nothing_until_it_has_room(core, vhost):
    core.declare_queue(vhost, "q")
    target = Target()
    target.room = False
    consume(core, vhost, "q", target, "a", no_ack=True)
    publish_local(core, vhost, "q", b"1", b"2")
    assert target.delivered == []
    target.room = True
    vhost.queues["q"].deliver_ready()
    assert target.bodies() == [b"1", b"2"]


async def test_single_active_consumer_hands_over_when_it_leaves(core, vhost):
    core.declare_queue(vhost, "q", arguments={"x-single-active-consumer": True})
    target = Target()
    first = consume(core, vhost, "q", target, "first", no_ack=True)
    consume(core, vhost, "q", target, "second", no_ack=True)
    publish_local(core, vhost, "q", b"1")
    core.remove_consumer(first)
    vhost.queues["q"].deliver_ready()
    publish_local(core, vhost, "q", b"2")
    assert target.delivered == [("first", b"1", False), ("second", b"2", False)]


async def test_exclusive_consumer_rules(core, vhost):
    core.declare_queue(vhost, "q")
    target = Target()
    consume(core, vhost, "q", target, "a")
    with pytest.raises(ChannelError) as refused:
        consume(core, vhost, "q", target, "b", exclusive=True)
    assert refused.value.code == errors.ACCESS_REFUSED
    core.declare_queue(vhost, "solo")
    consume(core, vhost, "solo", target, "alone", exclusive=True)
    with pytest.raises(ChannelError) as refused:
        consume(core, vhost, "solo", target, "joiner")
    assert refused.value.code == errors.ACCESS_REFUSED
    assert len(vhost.queues["solo"].consumers) == 1


async def test_deleting_a_queue_cancels_its_consumers_and_drops_what_they_held(core, vhost):
    core.declare_queue(vhost, "q")
    target = Target()
    consume(core, vhost, "q", target, "a", prefetch=1)
    publish_local(core, vhost, "q", b"1", b"2")
    core.delete_queue(vhost, "q")
    assert target.cancelled == ["a"] and "q" not in vhost.queues
    core.settle_taken(target.held, requeue=True)  # the client's late nack of a deleted queue's message
    assert target.bodies() == [b"1"]


async def test_consume_checks_the_callers_permission_first(core, vhost):
    core.declare_queue(vhost, "q")
    nobody = Principal("nobody", None)
    with pytest.raises(ChannelError) as refused:
        core.consumable(vhost, "q", who=nobody)
    assert refused.value.code == errors.ACCESS_REFUSED
    assert vhost.queues["q"].consumers == []


async def test_deleting_a_queue_visits_only_the_exchanges_bound_to_it(core, vhost, monkeypatch):
    for i in range(200):
        core.declare_exchange(vhost, f"x{i}", "direct")
    core.declare_queue(vhost, "q")
    core.add_binding(vhost, "x7", vhost.queues["q"], "a")
    core.add_binding(vhost, "x7", vhost.queues["q"], "b")
    core.add_binding(vhost, "x9", vhost.queues["q"], "a")
    visited: list[str] = []
    remove = Exchange.remove_destination

    def counted(self: Exchange, destination: Any) -> list:
        visited.append(self.name)
        return remove(self, destination)

    monkeypatch.setattr(Exchange, "remove_destination", counted)
    core.delete_queue(vhost, "q")
    assert sorted(visited) == ["x7", "x9"]
    assert not vhost.exchanges["x7"].has_bindings and not vhost.exchanges["x9"].has_bindings
    assert vhost.sources == {}


async def test_exchange_to_exchange_bindings_and_auto_delete_follow_deletions(core, vhost):
    core.declare_exchange(vhost, "upstream", "fanout")
    core.declare_exchange(vhost, "downstream", "fanout", auto_delete=True)
    core.declare_queue(vhost, "q")
    core.add_binding(vhost, "upstream", vhost.exchanges["downstream"], "")
    core.add_binding(vhost, "downstream", vhost.queues["q"], "")
    assert vhost.e2e_bindings == 1
    publish_to = vhost.exchange("upstream")
    assert core.publish(vhost, publish_to, make_message("upstream", "", commands.Basic.Properties(), b"m"))[0]
    core.delete_queue(vhost, "q")  # downstream's last binding went: it is auto-deleted, and its source binding
    assert "downstream" not in vhost.exchanges
    assert vhost.e2e_bindings == 0 and not vhost.exchanges["upstream"].has_bindings and vhost.sources == {}


@pytest.mark.parametrize("name, host, loopback_only, refused", [
    ("guest", "127.0.0.1", True, False), ("guest", "127.8.9.10", True, False), ("guest", "::1", True, False),
    ("guest", "::1%lo", True, False),
    ("guest", "192.0.2.7", True, True), ("guest", "2001:db8::7%eth0", True, True),
    ("guest", "not an address", True, True), ("guest", None, True, True), ("guest", "192.0.2.7", False, False),
    ("alice", "192.0.2.7", True, False),
])
def test_guest_logs_in_from_loopback_only(name, host, loopback_only, refused):
    """One rule for every front end (AMQP, the stream protocol, HTTP): RabbitMQ's loopback_users."""
    from amqp_server.access_control import User, loopback_refused
    assert loopback_refused(User(name, ""), host, loopback_only) is refused
    assert loopback_refused(None, host, loopback_only) is False  # not logged in: refused for that reason instead


@pytest.mark.parametrize("second", ["classic", "priority", "quorum"])
@pytest.mark.parametrize("first", ["auto-ack consumer", "TTL 0", "max-length 0"])
async def test_a_persistent_message_for_several_durable_queues_stays_in_those_that_keep_it(core, vhost, first,
                                                                                          second):
    """A queue the publish reaches first lets its copy go at once, its store record with it (the only
    reference): the next durable queue stores the message anew, rather than failing on the record gone (the
    publisher's connection closed, 541)."""
    arguments = {"x-message-ttl": 0} if first == "TTL 0" else {"x-max-length": 0} if first == "max-length 0" else {}
    core.declare_queue(vhost, "first", durable=True, arguments=arguments)
    core.declare_queue(vhost, "second", durable=True, arguments={
        "classic": {}, "priority": {"x-max-priority": 5}, "quorum": {"x-queue-type": "quorum"}}[second])
    target = Target()
    if first == "auto-ack consumer":
        consume(core, vhost, "first", target, "c", no_ack=True)
    exchange = vhost.exchange("amq.fanout")
    for name in ("first", "second"):  # (bound in this order: routed in it)
        core.bind(vhost, "amq.fanout", "queue", name, "")
    message = make_message("amq.fanout", "", commands.Basic.Properties(delivery_mode=2), b"hello")
    core.publish(vhost, exchange, message)
    assert vhost.queue("first").message_count == 0
    assert target.delivered == ([("c", b"hello", False)] if first == "auto-ack consumer" else [])
    got = core.get_local(vhost, "second", no_ack=False)[1]
    assert got is not None and got.message.body == b"hello"
    assert core.persistence.store.refs(got.message.msg_id) == 1


@pytest.mark.parametrize("types, awaits", [
    (["classic"], False), (["quorum"], True), (["classic", "quorum"], True), (["stream"], True)])
async def test_a_transient_message_is_confirmed_after_the_group_commit_if_a_queue_stores_it(core, vhost, types,
                                                                                             awaits):
    """What the front ends ask before they confirm a publish (``Message.awaits_commit``): a durable classic queue
    keeps a transient message in memory, confirmed at once; a quorum queue stores a copy of its own, and a
    stream its log, so its confirm waits for their fsync, as RabbitMQ's does for its log's."""
    for i, kind in enumerate(types):
        core.declare_queue(vhost, f"q{i}", durable=True,
                           arguments={} if kind == "classic" else {"x-queue-type": kind})
        core.bind(vhost, "amq.fanout", "queue", f"q{i}", "")
    message = make_message("amq.fanout", "", commands.Basic.Properties(delivery_mode=1), b"hello")
    core.publish(vhost, vhost.exchange("amq.fanout"), message)
    assert message.awaits_commit is awaits
    assert message.msg_id == 0  # (the classic queue's entry is the message itself, kept in memory)
