"""Quorum queues on one node, as RabbitMQ 3.10 has them (issue: replicated queues).

Each test passes against RabbitMQ 3.10 too (parity mode, see conftest), except those marked warren_only.
The replicated group across nodes is tested in test_quorum_cluster.py.
"""
from __future__ import annotations

import time
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from conftest import ExternalBroker, connect
from support import call, headers_of, q

pytestmark = pytest.mark.timeout(60)

QUORUM = {"x-queue-type": "quorum"}


def declare(channel, name: str, durable: bool = True, /, **arguments):
    """Declare a quorum queue with ``arguments`` (x- names: the first three are positional, apart from them)."""
    return channel.queue_declare(name, durable=durable, arguments={**QUORUM, **arguments})


def refused(broker, name: str, **kwargs) -> tuple[int, str]:
    """The channel error a quorum declaration gets."""
    with connect(broker) as connection:
        channel = connection.channel()
        arguments = {**QUORUM, **kwargs.pop("arguments", {})}
        with pytest.raises(ChannelClosedByBroker) as caught:
            channel.queue_declare(name, arguments=arguments, **kwargs)
        return caught.value.reply_code, caught.value.reply_text


@pytest.mark.parametrize("kwargs, text", [
    (dict(durable=True, exclusive=True), "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    (dict(durable=False), "invalid property 'non-durable' for queue '{q}' in vhost '/'"),
    (dict(durable=True, auto_delete=True), "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    (dict(durable=False, exclusive=True, auto_delete=True),
     "invalid property 'auto-delete' for queue '{q}' in vhost '/'"),
    (dict(durable=False, exclusive=True), "invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"),
    (dict(durable=True, exclusive=True, arguments={"x-max-priority": 5}),
     "invalid arg 'x-max-priority' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
    (dict(durable=True, arguments={"x-queue-mode": "lazy"}),
     "invalid arg 'x-queue-mode' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
    (dict(durable=True, arguments={"x-max-age": "1D"}),
     "invalid arg 'x-max-age' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
    (dict(durable=True, arguments={"x-dead-letter-strategy": "sometimes"}),
     "invalid arg 'x-dead-letter-strategy' for queue '{q}' in vhost '/': invalid_dlx_strategy"),
    (dict(durable=True, arguments={"x-quorum-initial-group-size": 0}),
     "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/': {{value_zero,0}}"),
    (dict(durable=True, arguments={"x-quorum-initial-group-size": "3"}),
     "invalid arg 'x-quorum-initial-group-size' for queue '{q}' in vhost '/': \"expected integer, got longstr\""),
])
def test_what_a_quorum_queue_refuses(broker, uid, kwargs, text):
    assert refused(broker, uid, **kwargs) == (406, "PRECONDITION_FAILED - " + text.format(q=uid))


@pytest.mark.parametrize("argument", ["x-delivery-limit", "x-dead-letter-strategy"])
def test_quorum_arguments_are_refused_on_a_classic_queue(broker, uid, argument):
    value = 3 if argument == "x-delivery-limit" else "at-least-once"
    with connect(broker) as connection:
        with pytest.raises(ChannelClosedByBroker) as caught:
            connection.channel().queue_declare(uid, durable=True, arguments={argument: value})
    assert caught.value.reply_text == (f"PRECONDITION_FAILED - invalid arg '{argument}' for queue '{uid}' in vhost '/' "
                                       "of queue type rabbit_classic_queue")


def test_what_a_quorum_queue_takes(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        taken: list[dict[str, Any]] = [
            {"x-message-ttl": 1000}, {"x-expires": 100000}, {"x-overflow": "reject-publish"},
            {"x-delivery-limit": "any"}, {"x-dead-letter-strategy": "at-least-once"},
            {"x-quorum-initial-group-size": 5}, {"x-max-in-memory-length": 5}, {"x-queue-leader-locator": "balanced"}]
        for i, arguments in enumerate(taken):
            declare(channel, f"{uid}-{i}", **arguments)
            channel.queue_delete(f"{uid}-{i}")


def test_a_classic_redeclaration_of_a_quorum_queue_is_inequivalent(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid)
        channel.queue_declare(uid, passive=True)
        with pytest.raises(ChannelClosedByBroker) as caught:
            channel.queue_declare(uid, durable=True)
        assert caught.value.reply_text == (
            f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{uid}' in vhost '/': "
            "received none but current is the value 'quorum' of type 'longstr'")
        connection.channel().queue_delete(uid)


def shown(broker, queue: str, key: str):
    """A field of the queue in the HTTP API once it is set (RabbitMQ fills some at its next statistics
    emission, every 5 s)."""
    deadline = time.monotonic() + 15
    while True:
        value = call(broker, "GET", f"/api/queues/%2F/{q(queue)}").json.get(key)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _get(channel, queue: str):
    for _ in range(50):  # RabbitMQ returns a message to its queue asynchronously
        method, properties, body = channel.basic_get(queue)
        if method is not None:
            return method, properties, body
        time.sleep(0.05)
    return None, None, None


def described(got: list) -> list[tuple[bytes | None, bool | None, Any]]:
    """(body, redelivered, headers) of each message basic.get returned."""
    out = []
    for method, properties, body in got:
        assert method is not None and properties is not None
        out.append((body, method.redelivered, properties.headers))
    return out


def test_each_delivery_says_how_often_the_message_came_back(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid)
        channel.basic_publish("", uid, b"m", pika.BasicProperties(headers={"a": 1}))
        for count in range(3):
            method, properties, _ = _get(channel, uid)
            assert (method.redelivered, properties.headers) == (count > 0, {"a": 1, "x-delivery-count": count})
            channel.basic_nack(method.delivery_tag, requeue=True)
        other = connect(broker)  # a channel that closes with the message unacked returns it too
        method, properties, _ = _get(other.channel(), uid)
        assert properties.headers["x-delivery-count"] == 3
        other.close()
        method, properties, _ = _get(channel, uid)
        assert properties.headers["x-delivery-count"] == 4
        channel.basic_ack(method.delivery_tag)
        channel.queue_delete(uid)


def test_consumers_get_the_delivery_count_from_the_first_return_on(broker, uid):
    """RabbitMQ 3.10 leaves the header out of a first basic.deliver (basic.get-ok always has it)."""
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid)
        channel.basic_publish("", uid, b"m")
        seen = []

        def on_message(ch, method, properties, body):
            seen.append((properties.headers or {}).get("x-delivery-count"))
            ch.basic_reject(method.delivery_tag, requeue=len(seen) < 3)

        channel.basic_consume(uid, on_message)
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            connection.process_data_events(0.1)
        assert seen == [None, 1, 2]
        channel.queue_delete(uid)


def test_a_message_returned_past_the_delivery_limit_is_dead_lettered(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_declare(f"{uid}-dead", durable=True)
        declare(channel, uid, **{"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": f"{uid}-dead"})
        channel.basic_publish("", uid, b"m", pika.BasicProperties(headers={"a": 1}))
        for _ in range(2):
            method, _, _ = _get(channel, uid)
            channel.basic_reject(method.delivery_tag, requeue=True)
        method, properties, body = _get(channel, f"{uid}-dead")
        assert body == b"m" and method is not None
        assert properties.headers["a"] == 1 and "x-delivery-count" not in properties.headers
        assert properties.headers["x-first-death-reason"] == "delivery_limit"
        death = properties.headers["x-death"][0]
        assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", uid, 1)
        assert channel.queue_declare(uid, passive=True).method.message_count == 0
        channel.queue_delete(uid)
        channel.queue_delete(f"{uid}-dead")


@pytest.mark.parametrize("limit", [0, -1])
def test_a_delivery_limit_of_zero_or_less_drops_at_the_first_return(broker, uid, limit):
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid, **{"x-delivery-limit": limit})
        channel.basic_publish("", uid, b"m")
        method, _, _ = _get(channel, uid)
        channel.basic_nack(method.delivery_tag, requeue=True)
        time.sleep(0.3)
        assert channel.basic_get(uid)[0] is None
        channel.queue_delete(uid)


def test_global_qos_is_refused_at_consume(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid)
        channel.basic_qos(prefetch_count=10, global_qos=True)
        with pytest.raises(ConnectionClosedByBroker) as caught:
            channel.basic_consume(uid, lambda *a: None)
    assert (caught.value.reply_code, caught.value.reply_text) == (
        540, f"NOT_IMPLEMENTED - queue '{uid}' in vhost '/' does not support global qos")
    with connect(broker) as connection:
        connection.channel().queue_delete(uid)


def test_the_api_shows_type_leader_and_members(broker, uid):
    if not broker.mgmt_port:
        pytest.skip("needs the HTTP API")
    with connect(broker) as connection:
        declare(connection.channel(), uid)
    shown(broker, uid, "leader")
    info = call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json
    assert info["type"] == "quorum"
    assert info["leader"] in info["members"] and sorted(info["online"]) == sorted(info["members"])
    if not isinstance(broker, ExternalBroker):
        assert info["members"] == [info["leader"]]  # one node: a group of one
    assert info["arguments"] == QUORUM
    with connect(broker) as connection:
        connection.channel().queue_delete(uid)


def test_a_policy_for_quorum_queues_sets_the_delivery_limit(broker, uid):
    if not broker.mgmt_port:
        pytest.skip("needs the HTTP API")
    policy = f"/api/policies/%2F/{q(uid)}"
    assert call(broker, "PUT", policy, {"pattern": f"^{uid}", "apply-to": "queues",
                                        "definition": {"delivery-limit": 0}}).status in (201, 204)
    try:
        with connect(broker) as connection:
            channel = connection.channel()
            declare(channel, uid)
            channel.queue_declare(f"{uid}-classic", durable=True)  # a classic queue has no delivery limit
            for name in (uid, f"{uid}-classic"):
                channel.basic_publish("", name, b"m")
                method, _, _ = _get(channel, name)
                channel.basic_nack(method.delivery_tag, requeue=True)
            time.sleep(0.3)
            assert channel.basic_get(uid)[0] is None
            assert channel.basic_get(f"{uid}-classic", auto_ack=True)[0] is not None
            assert shown(broker, uid, "policy") == uid
            channel.queue_delete(uid)
            channel.queue_delete(f"{uid}-classic")
    finally:
        call(broker, "DELETE", policy)


@pytest.mark.warren_only("restarts the node")
def test_a_quorum_queue_and_its_messages_survive_a_restart(start_broker, uid):
    node = start_broker()
    with connect(node) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        declare(channel, uid, **{"x-delivery-limit": 5})
        for i in range(10):
            channel.basic_publish("", uid, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    node.stop()
    node.start()
    with connect(node) as connection:
        channel = connection.channel()
        bodies = []
        for _ in range(10):
            method, properties, body = channel.basic_get(uid, auto_ack=True)
            bodies.append(body)
            assert properties is not None and properties.headers == {"x-delivery-count": 0}
        assert bodies == [str(i).encode() for i in range(10)]
    assert call(node, "GET", f"/api/queues/%2F/{q(uid)}").json["type"] == "quorum"


@pytest.mark.warren_only("restarts the node")
def test_transient_messages_in_a_quorum_queue_survive_a_restart_and_nowhere_else(start_broker, uid):
    """RabbitMQ's quorum queues keep every message on disk; the classic durable queue the same publish went
    to keeps it in memory only, and a move from the quorum queue back to a classic one keeps it transient."""
    node = start_broker()
    with connect(node) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        declare(channel, uid)
        channel.queue_declare(f"{uid}-classic", durable=True)
        channel.exchange_declare(f"{uid}-fanout", "fanout")
        channel.queue_bind(uid, f"{uid}-fanout")
        channel.queue_bind(f"{uid}-classic", f"{uid}-fanout")
        for i in range(5):
            channel.basic_publish(f"{uid}-fanout", "", b"t%d" % i)  # delivery_mode 1
    node.stop()
    node.start()
    with connect(node) as connection:
        channel = connection.channel()
        assert channel.queue_declare(uid, passive=True).method.message_count == 5
        assert channel.queue_declare(f"{uid}-classic", passive=True).method.message_count == 0
    moved = call(node, "POST", f"/api/queues/%2F/{q(uid)}/move", {"destination": f"{uid}-classic", "count": 2})
    assert moved.status == 200, moved.raw
    with connect(node) as connection:
        channel = connection.channel()
        assert [channel.basic_get(f"{uid}-classic", auto_ack=True)[2] for _ in range(2)] == [b"t0", b"t1"]
        assert [channel.basic_get(uid, auto_ack=True)[2] for _ in range(3)] == [b"t2", b"t3", b"t4"]
    node.stop()
    node.start()  # what was acked stays gone; nothing came back to the classic queue
    with connect(node) as connection:
        channel = connection.channel()
        assert channel.queue_declare(uid, passive=True).method.message_count == 0
        assert channel.queue_declare(f"{uid}-classic", passive=True).method.message_count == 0


def dead_letter_once_routed(channel, uid: str) -> tuple[pika.BasicProperties, bytes]:
    """The dead-letter exchange ``uid``-dlx is made and bound to a queue: the next try of the waiting dead
    letter reaches it.  Its properties and body."""
    channel.exchange_declare(f"{uid}-dlx", "fanout")
    channel.queue_declare(f"{uid}-dead", durable=True)
    channel.queue_bind(f"{uid}-dead", f"{uid}-dlx")
    for _ in range(50):
        method, properties, body = channel.basic_get(f"{uid}-dead", auto_ack=True)
        if method is not None:
            return properties, body
        time.sleep(0.1)
    raise AssertionError("no dead letter came")


def test_at_least_once_dead_letters_wait_until_a_queue_takes_them(broker, uid):
    """RabbitMQ 3.10 keeps them in the queue (``messages_dlx``), outside its message count."""
    arguments = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
                 "x-dead-letter-exchange": f"{uid}-dlx"}
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid, **arguments)
        channel.basic_publish("", uid, b"m", pika.BasicProperties(headers={"a": 1}))
        method, _, _ = _get(channel, uid)
        channel.basic_reject(method.delivery_tag, requeue=False)  # no such exchange yet: it waits
        time.sleep(0.5)
        assert channel.queue_declare(uid, passive=True).method.message_count == 0
        if broker.mgmt_port:
            assert shown(broker, uid, "messages_dlx") == 1
            assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json["message_bytes_dlx"] == 1
    if isinstance(broker, ExternalBroker):
        return  # RabbitMQ 3.10 retries after minutes: the rest is checked on Warren only
    with connect(broker) as connection:
        channel = connection.channel()
        properties, body = dead_letter_once_routed(channel, uid)
        assert body == b"m" and headers_of(properties)["x-death"][0]["reason"] == "rejected"
        assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json["messages_dlx"] == 0
        for name in (uid, f"{uid}-dead"):
            channel.queue_delete(name)
        channel.exchange_delete(f"{uid}-dlx")


@pytest.mark.warren_only("restarts the node")
@pytest.mark.parametrize("stop", ["stop", "kill"])
def test_at_least_once_dead_letters_still_wait_after_a_restart(start_broker, uid, stop):
    """RabbitMQ keeps them in rabbit_fifo's state (its dlx part), which Ra's snapshots and log restore: after
    a restart they still wait, outside the message count, and are neither delivered from the queue again nor
    lost.  Read back from rows, where they were entries held, they came back to the queue as returned ones."""
    arguments = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
                 "x-dead-letter-exchange": f"{uid}-dlx"}
    node = start_broker()
    with connect(node) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        declare(channel, uid, **arguments)
        for sent in (b"dead", b"live"):
            channel.basic_publish("", uid, sent, pika.BasicProperties(delivery_mode=2))
        method, _, _ = _get(channel, uid)
        channel.basic_reject(method.delivery_tag, requeue=False)  # no such exchange yet: it waits
        time.sleep(0.5)
        assert shown(node, uid, "messages_dlx") == 1
    if stop == "kill":
        node.kill()
    else:
        node.stop()
    node.start()
    with connect(node) as connection:
        channel = connection.channel()
        assert channel.queue_declare(uid, passive=True).method.message_count == 1
        assert shown(node, uid, "messages_dlx") == 1
        assert dead_letter_once_routed(channel, uid)[1] == b"dead"
        assert [channel.basic_get(uid, auto_ack=True)[2] for _ in range(2)] == [b"live", None]


def test_at_least_once_needs_reject_publish(broker, uid):
    """Without x-overflow reject-publish RabbitMQ falls back to at-most-once: an unroutable dead letter goes."""
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid, **{"x-dead-letter-strategy": "at-least-once", "x-dead-letter-exchange": f"{uid}-dlx"})
        channel.basic_publish("", uid, b"m")
        method, _, _ = _get(channel, uid)
        channel.basic_reject(method.delivery_tag, requeue=False)
        channel.exchange_declare(f"{uid}-dlx", "fanout")
        channel.queue_declare(f"{uid}-dead", durable=True)
        channel.queue_bind(f"{uid}-dead", f"{uid}-dlx")
        time.sleep(2.5)
        assert channel.queue_declare(f"{uid}-dead", passive=True).method.message_count == 0
        for name in (uid, f"{uid}-dead"):
            channel.queue_delete(name)
        channel.exchange_delete(f"{uid}-dlx")


def test_a_vhosts_default_queue_type_makes_durable_queues_quorum(broker, uid):
    if not broker.mgmt_port:
        pytest.skip("needs the HTTP API")
    vhost = f"dqt-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}", {"defaultqueuetype": "quorum",
                                                           "description": "d"}).status == 201
    try:
        assert call(broker, "PUT", f"/api/permissions/{q(vhost)}/guest",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
        info = call(broker, "GET", f"/api/vhosts/{q(vhost)}").json
        assert (info["default_queue_type"], info["description"]) == ("quorum", "d")
        assert info["metadata"] == {"default_queue_type": "quorum", "description": "d", "tags": []}
        with connect(broker, vhost=vhost) as connection:
            channel = connection.channel()
            for name, kwargs in (("durable", dict(durable=True)), ("transient", dict(durable=False)),
                                 ("exclusive", dict(exclusive=True)),
                                 ("auto-delete", dict(durable=True, auto_delete=True)),
                                 ("classic", dict(durable=True, arguments={"x-queue-type": "classic"}))):
                channel.queue_declare(name, **kwargs)
            channel.queue_declare("durable", durable=True)  # the same declaration again: equivalent
            with pytest.raises(ChannelClosedByBroker) as caught:
                channel.queue_declare("priority", durable=True, arguments={"x-max-priority": 3})
        assert caught.value.reply_text == ("PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue 'priority' "
                                           f"in vhost '{vhost}' of queue type rabbit_quorum_queue")
        for name, kind, arguments in (("durable", "quorum", {"x-queue-type": "quorum"}), ("transient", "classic", {}),
                                      ("auto-delete", "classic", {}),
                                      ("classic", "classic", {"x-queue-type": "classic"})):
            info = call(broker, "GET", f"/api/queues/{q(vhost)}/{name}").json
            assert (info["type"], info["arguments"]) == (kind, arguments), name
        if not isinstance(broker, ExternalBroker):  # RabbitMQ 3.10 exports a vhost's name only; 3.11 on, this
            exported = call(broker, "GET", "/api/definitions").json
            mine = [v for v in exported["vhosts"] if v["name"] == vhost]
            assert mine[0]["metadata"]["default_queue_type"] == "quorum"
    finally:
        call(broker, "DELETE", f"/api/vhosts/{q(vhost)}")


@pytest.mark.parametrize("limit", [{"x-max-length": 2}, {"x-max-length-bytes": 25}], ids=["count", "bytes"])
@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_max_length_on_a_quorum_queue(broker, uid, overflow, limit):
    """Ten-byte messages: two of them are as many as either limit allows (bytes: the ready ones' bodies)."""
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid, **limit, **{"x-overflow": overflow})
        channel.confirm_delivery()
        outcomes = []
        for body in (b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10):
            try:
                channel.basic_publish("", uid, body)
                outcomes.append("ack")
            except pika.exceptions.NackError:
                outcomes.append("nack")
        time.sleep(0.2)
        count = channel.queue_declare(uid, passive=True).method.message_count
        kept = [channel.basic_get(uid, auto_ack=True)[2] for _ in range(count)]
        if overflow == "drop-head":
            assert (outcomes, kept) == (["ack"] * 4, [b"c" * 10, b"d" * 10])
        else:  # RabbitMQ 3.10's quorum queues take the publish that goes over the limit, refuse the next
            assert (outcomes, kept) == (["ack", "ack", "ack", "nack"], [b"a" * 10, b"b" * 10, b"c" * 10])
        channel.queue_delete(uid)


def test_a_returned_message_keeps_its_deadline_at_the_back_of_a_quorum_queue(broker, uid):
    """A message nacked back to the queue goes to the back with a new offset, and still expires when its TTL
    from its publish runs out; the one behind it, published later, outlives it."""
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid)
        channel.basic_publish("", uid, b"short", pika.BasicProperties(expiration="400"))
        channel.basic_publish("", uid, b"long")
        method, _, body = _get(channel, uid)
        assert body == b"short"
        channel.basic_nack(method.delivery_tag, requeue=True)
        time.sleep(0.1)
        assert channel.queue_declare(uid, passive=True).method.message_count == 2
        time.sleep(0.6)
        assert channel.queue_declare(uid, passive=True).method.message_count == 1
        assert _get(channel, uid)[2] == b"long"
        channel.queue_delete(uid)


def test_message_ttl_and_single_active_consumer_on_a_quorum_queue(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid, **{"x-message-ttl": 200, "x-single-active-consumer": True})
        channel.basic_publish("", uid, b"old")
        time.sleep(0.6)
        channel.basic_publish("", uid, b"new")
        got = []
        first = channel.basic_consume(uid, lambda ch, m, p, b: got.append((m.consumer_tag, b)), auto_ack=True)
        channel.basic_consume(uid, lambda ch, m, p, b: got.append((m.consumer_tag, b)), auto_ack=True)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            connection.process_data_events(0.1)
        assert got == [(first, b"new")]  # the expired one is gone; the first consumer is the active one
        channel.queue_delete(uid)


@pytest.mark.warren_only("restarts the node")
@pytest.mark.parametrize("returns", [2, 70], ids=["a-few", "past-63"])
def test_the_delivery_count_survives_a_restart(start_broker, uid, returns):
    """Counted after a restart, and past the limit after it; the rows once kept the count in six bits (a message
    returned 70 times came back from a restart counting 63), where rabbit_fifo's delivery_count has no bound."""
    node = start_broker()
    with connect(node) as connection:
        channel = connection.channel()
        declare(channel, uid, **{"x-delivery-limit": returns + 1})
        channel.basic_publish("", uid, b"m", pika.BasicProperties(delivery_mode=2))
        for _ in range(returns):
            method, _, _ = _get(channel, uid)
            channel.basic_nack(method.delivery_tag, requeue=True)
    node.stop()
    node.start()
    with connect(node) as connection:
        channel = connection.channel()
        method, properties, _ = _get(channel, uid)
        assert (method.redelivered, properties.headers) == (True, {"x-delivery-count": returns})
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, properties, _ = _get(channel, uid)
        assert properties.headers == {"x-delivery-count": returns + 1}
        channel.basic_nack(method.delivery_tag, requeue=True)  # one return more: over the limit
        time.sleep(0.3)
        assert channel.basic_get(uid)[0] is None


@pytest.mark.warren_only("restarts the node")
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_message_a_consumer_held_when_the_node_went_comes_back_in_its_place_counted(start_broker, uid, how):
    """Its consumer went with the node: as when a consumer goes (RabbitMQ's quorum queues return what a consumer
    that went down held, counting it), it is redelivered with one more in x-delivery-count.  A node that stops
    closes its connections first, which returns it to the front (``rabbit_fifo``'s ``return_all`` of a consumer
    that went down), and its restart finds it there; one killed finds it on disk as it was, held, and puts it
    back in its place, the head."""
    node = start_broker()
    connection = connect(node)
    channel = connection.channel()
    channel.confirm_delivery()
    declare(channel, uid)
    for body in (b"a", b"b"):
        channel.basic_publish("", uid, body, pika.BasicProperties(delivery_mode=2))
    method, _, body = _get(channel, uid)
    assert body == b"a"
    channel.basic_publish("", uid, b"c", pika.BasicProperties(delivery_mode=2))  # (its fsync covers the delivery)
    node.stop() if how == "stop" else node.kill()
    node.start()
    with connect(node) as other:
        channel = other.channel()
        got = [channel.basic_get(uid, auto_ack=True) for _ in range(3)]
        held = (b"a", True, {"x-delivery-count": 1})
        others = [(body, False, {"x-delivery-count": 0}) for body in (b"b", b"c")]
        assert described(got) == [held, *others]


@pytest.mark.warren_only("kills the node")
def test_a_message_held_when_the_node_was_killed_is_dead_lettered_past_the_delivery_limit(start_broker, uid):
    """The restart's return of what a consumer held counts, as a consumer's going does, and past
    ``x-delivery-limit`` dead-letters the message rather than putting it back (rabbit_fifo's return_one)."""
    node = start_broker()
    connection = connect(node)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(f"{uid}-dead", durable=True)
    declare(channel, uid, **{"x-delivery-limit": 0, "x-dead-letter-exchange": "",
                             "x-dead-letter-routing-key": f"{uid}-dead"})
    for body in (b"a", b"b"):
        channel.basic_publish("", uid, body, pika.BasicProperties(delivery_mode=2))
    method, _, body = _get(channel, uid)
    assert body == b"a"
    channel.basic_publish("", uid, b"c", pika.BasicProperties(delivery_mode=2))  # (its fsync covers the delivery)
    node.kill()
    node.start()
    with connect(node) as other:
        channel = other.channel()
        method, properties, body = _get(channel, f"{uid}-dead")
        assert (body, properties.headers["x-first-death-reason"]) == (b"a", "delivery_limit")
        got = [channel.basic_get(uid, auto_ack=True)[2] for _ in range(3)]
        assert got == [b"b", b"c", None]


def test_a_no_ack_delivery_carries_the_count_too(broker, uid):
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid)
        for sent in (b"a", b"b"):
            channel.basic_publish("", uid, sent)
        for _ in range(2):  # each comes back once
            method, _, _ = _get(channel, uid)
            channel.basic_nack(method.delivery_tag, requeue=True)
        for _ in range(50):
            method, properties, body = channel.basic_get(uid, auto_ack=True)
            if method is not None:
                break
            time.sleep(0.05)
        assert properties is not None and (body, properties.headers) == (b"a", {"x-delivery-count": 1})
        got = []
        channel.basic_consume(uid, lambda ch, m, p, b: got.append((b, p.headers)), auto_ack=True)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            connection.process_data_events(0.1)
        assert got == [(b"b", {"x-delivery-count": 1})]
        channel.queue_delete(uid)


def _nack_first(connection, channel, uid):
    method, _, body = _get(channel, uid)
    assert body == b"a"
    channel.basic_nack(method.delivery_tag, requeue=True)


def _nack_second_then_first(connection, channel, uid):
    taken = [_get(channel, uid) for _ in range(2)]
    assert [body for _, _, body in taken] == [b"a", b"b"]
    for method, _, _ in reversed(taken):
        channel.basic_nack(method.delivery_tag, requeue=True)
    time.sleep(0.3)
    channel.basic_publish("", uid, b"d")


def _other_channel_closes(connection, channel, uid):
    other = connection.channel()
    assert [_get(other, uid)[2] for _ in range(2)] == [b"a", b"b"]
    other.close()


def _consumer_cancelled_then_closed(connection, channel, uid):
    other = connection.channel()
    other.basic_qos(prefetch_count=1)
    got: list[bytes] = []
    tag = other.basic_consume(uid, lambda ch, m, p, b: got.append(b))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        connection.process_data_events(0.1)
    assert got == [b"a"]
    other.basic_cancel(tag)
    other.close()


@pytest.mark.parametrize("limit", [None, 10])
@pytest.mark.parametrize("scenario, served", [
    (_nack_first, {None: b"bca", 10: b"abc"}),
    (_nack_second_then_first, {None: b"cbad", 10: b"bacd"}),
    (_other_channel_closes, {None: b"abc", 10: b"abc"}),
    (_consumer_cancelled_then_closed, {None: b"abc", 10: b"abc"}),
])
def test_where_a_returned_message_goes(broker, uid, scenario, served, limit):
    """RabbitMQ 3.10's quorum queues serve a returned message first (``rabbit_fifo``'s ``returns``, in the order
    they came back), except a nack's or reject's without a delivery limit, which ``rabbit_fifo``'s leader turns
    into a requeue to the back (its ``handle_aux``); what a consumer or a channel that went away held is always
    served first (``maybe_return_all``).  A classic queue puts it back in its place."""
    with connect(broker) as connection:
        channel = connection.channel()
        declare(channel, uid, **({} if limit is None else {"x-delivery-limit": limit}))
        for body in (b"a", b"b", b"c"):
            channel.basic_publish("", uid, body)
        scenario(connection, channel, uid)
        got = [_get(channel, uid)]  # (RabbitMQ returns a message asynchronously)
        time.sleep(0.3)
        got += [channel.basic_get(uid, auto_ack=True) for _ in range(len(served[limit]))]
        assert b"".join(body for _, _, body in got if body is not None) == served[limit]
        assert got[-1][0] is None
        channel.queue_delete(uid)
