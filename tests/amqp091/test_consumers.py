"""Consumer priorities (``x-priority``), single active consumer and exclusive consumers, through pika and
the HTTP API, as RabbitMQ's classic queues behave."""
from __future__ import annotations

import base64
import json
import time
import urllib.request
from decimal import Decimal
from urllib.parse import quote

import pytest

from conftest import connect
from support import wait_for_events
from pika.exceptions import ChannelClosedByBroker
from support import numbered, publish

# RabbitMQ's HTTP API shows consumers only after its next stats emission (collect_statistics_interval, 5 s);
# Warren's at once. The fields themselves match RabbitMQ's (checked by hand).
HTTP_AT_ONCE = pytest.mark.warren_only("reads consumer state from the HTTP API at once")

pytestmark = pytest.mark.timeout(60)

V = "vhost '/'"
SAC = {"x-single-active-consumer": True}




def api(node, path: str, method: str = "GET"):
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}{path}", method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
        return json.loads(raw) if raw else None


def force_close(node, connection_name: str) -> None:
    """Close a connection from the broker side (as a failure would): no basic.cancel first."""
    for connection in api(node, "/api/connections"):
        if connection.get("user_provided_name") == connection_name:
            api(node, f"/api/connections/{quote(connection['name'], safe='')}", "DELETE")
            return
    raise AssertionError(f"no connection {connection_name}")


class Consumer:
    """A manual-ack consumer on its own channel that records (body, redelivered, delivery tag)."""

    def __init__(self, conn, queue: str, prefetch: int = 0, priority: int | None = None, tag: str = "") -> None:
        self.conn = conn
        self.ch = conn.channel()
        if prefetch:
            self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[str, bool, int]] = []
        arguments = {"x-priority": priority} if priority is not None else None
        self.tag = self.ch.basic_consume(queue, self._on, arguments=arguments, consumer_tag=tag or None)

    def _on(self, _ch, method, _props, body) -> None:
        self.got.append((body.decode(), method.redelivered, method.delivery_tag))

    @property
    def bodies(self) -> list[str]:
        return [body for body, _, _ in self.got]

    def ack_all(self) -> None:
        if self.got:
            self.ch.basic_ack(self.got[-1][2], multiple=True)


def pump(*conns, seconds: float = 0.3) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for conn in conns:
            conn.process_data_events(0.02)


# -- consumer priorities --------------------------------------------------------------------------

def test_higher_priority_consumer_served_while_it_has_credit(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    low = Consumer(conn, uid, prefetch=10, priority=-5)
    high = Consumer(conn, uid, prefetch=2, priority=10)
    default = Consumer(conn, uid, prefetch=3)  # x-priority 0: between the two
    publish(ch, uid, numbered(8))
    pump(conn)
    assert high.bodies == ["m0", "m1"]
    assert default.bodies == ["m2", "m3", "m4"]
    assert low.bodies == ["m5", "m6", "m7"]
    high.ack_all()  # credit again: the next messages are the high-priority consumer's
    publish(ch, uid, ["n0", "n1", "n2"])
    pump(conn)
    assert high.bodies[2:] == ["n0", "n1"] and low.bodies[3:] == ["n2"]
    ch.queue_delete(uid)


def test_round_robin_among_equal_priorities(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    a = Consumer(conn, uid, priority=3)
    b = Consumer(conn, uid, priority=3)
    low = Consumer(conn, uid)
    publish(ch, uid, numbered(6))
    pump(conn)
    assert a.bodies == ["m0", "m2", "m4"] and b.bodies == ["m1", "m3", "m5"] and low.bodies == []
    ch.queue_delete(uid)


def test_lower_priority_gets_messages_when_higher_cancels(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    high = Consumer(conn, uid, prefetch=1, priority=1)
    low = Consumer(conn, uid, prefetch=1)
    publish(ch, uid, ["a", "b", "c"])
    pump(conn)
    assert (high.bodies, low.bodies) == (["a"], ["b"])
    high.ch.basic_cancel(high.tag)
    low.ack_all()
    pump(conn)
    assert low.bodies == ["b", "c"]
    ch.queue_delete(uid)


@pytest.mark.parametrize("value, kind", [("high", "longstr"), (Decimal("1.5"), "decimal"), (True, "bool"),
                                         ({"a": 1}, "table")])
def test_invalid_consumer_priority_406(conn, uid, value, kind):
    ch = conn.channel()
    ch.queue_declare(uid)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume(uid, lambda *a: None, arguments={"x-priority": value})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{uid}' in {V}: "
                                    f'"expected integer, got {kind}"')
    conn.channel().queue_delete(uid)


@HTTP_AT_ONCE
def test_consumer_priority_in_http_arguments(broker, conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    Consumer(conn, uid, priority=7, tag="prio-7")
    consumers = [c for c in api(broker, "/api/consumers/%2F") if c["queue"]["name"] == uid]
    assert [(c["consumer_tag"], c["arguments"], c["active"], c["activity_status"]) for c in consumers] == [
        ("prio-7", {"x-priority": 7}, True, "up")]
    ch.queue_delete(uid)


# -- single active consumer -----------------------------------------------------------------------

def _statuses(broker, queue: str) -> dict[str, tuple[bool, str]]:
    details = api(broker, f"/api/queues/%2F/{queue}")["consumer_details"]
    return {c["consumer_tag"]: (c["active"], c["activity_status"]) for c in details}


@HTTP_AT_ONCE
def test_single_active_consumer_fails_over_with_unacked_redelivered(broker, uid):
    setup = connect(broker)
    ch = setup.channel()
    ch.queue_declare(uid, arguments=SAC)
    conns = [connect(broker, name=f"{uid}-{i}") for i in range(3)]
    first, second, third = (Consumer(c, uid, prefetch=3, tag=f"c{i}") for i, c in enumerate(conns))
    publish(ch, uid, numbered(5))
    pump(*conns)
    assert first.bodies == ["m0", "m1", "m2"] and second.got == [] and third.got == []
    queue = api(broker, f"/api/queues/%2F/{uid}")
    assert queue["single_active_consumer_tag"] == "c0" and queue["consumers"] == 3
    assert _statuses(broker, uid) == {"c0": (True, "single_active"), "c1": (False, "waiting"),
                                      "c2": (False, "waiting")}
    listed = {c["consumer_tag"]: c["activity_status"] for c in api(broker, "/api/consumers")
              if c["queue"]["name"] == uid}
    assert listed == {"c0": "single_active", "c1": "waiting", "c2": "waiting"}

    first.ch.basic_ack(first.got[0][2])  # m0 done: m3 follows; m1, m2, m3 are unacked when the connection dies
    pump(conns[0])
    assert first.bodies == ["m0", "m1", "m2", "m3"]
    force_close(broker, f"{uid}-0")
    pump(*conns[1:])
    assert [(body, redelivered) for body, redelivered, _ in second.got] == [
        ("m1", True), ("m2", True), ("m3", True)]
    assert third.got == []
    assert api(broker, f"/api/queues/%2F/{uid}")["single_active_consumer_tag"] == "c1"
    assert _statuses(broker, uid) == {"c1": (True, "single_active"), "c2": (False, "waiting")}

    second.ch.basic_cancel(second.tag)  # a cancel hands over too; its unacked stay with its channel
    pump(*conns[1:])
    assert third.bodies == ["m4"]
    conns[1].close()  # m1..m3 come back to the active consumer, after m4
    pump(conns[2])
    assert [(body, redelivered) for body, redelivered, _ in third.got] == [
        ("m4", False), ("m1", True), ("m2", True)]
    assert api(broker, f"/api/queues/%2F/{uid}")["single_active_consumer_tag"] == "c2"
    third.ack_all()
    third.ch.basic_cancel(third.tag)
    assert api(broker, f"/api/queues/%2F/{uid}")["single_active_consumer_tag"] is None
    ch.queue_delete(uid)
    for c in (setup, conns[2]):
        c.close()


@HTTP_AT_ONCE
def test_single_active_consumer_successor_by_priority_then_registration(broker, conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments=SAC)
    first = Consumer(conn, uid, tag="first")
    Consumer(conn, uid, priority=1, tag="low")
    Consumer(conn, uid, priority=5, tag="high-a")
    Consumer(conn, uid, priority=5, tag="high-b")
    assert api(broker, f"/api/queues/%2F/{uid}")["single_active_consumer_tag"] == "first"  # no pre-emption
    first.ch.basic_cancel(first.tag)
    assert api(broker, f"/api/queues/%2F/{uid}")["single_active_consumer_tag"] == "high-a"
    ch.queue_delete(uid)


def test_single_active_consumer_refuses_exclusive_consume(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments=SAC)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume(uid, lambda *a: None, exclusive=True)
    assert exc.value.reply_code == 403
    assert exc.value.reply_text == f"ACCESS_REFUSED - queue '{uid}' in {V} in exclusive use"
    conn.channel().queue_delete(uid)


@pytest.mark.parametrize("queue_type", ["quorum", "stream"])
def test_an_exclusive_consumer_of_a_quorum_queue_or_stream_shares_it(conn, uid, queue_type):
    """Only classic queues keep a queue for an exclusive consumer: rabbit_fifo and rabbit_stream_queue record the
    flag and refuse no consumer, before it or after it."""
    ch = conn.channel()
    ch.queue_declare(uid, durable=True, arguments={"x-queue-type": queue_type})
    channels = [conn.channel() for _ in range(3)]
    for channel, exclusive in zip(channels, (False, True, False)):
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(uid, lambda *a: None, exclusive=exclusive)
    for channel in channels:
        channel.close()
    ch.queue_delete(uid)


@pytest.mark.parametrize("value, kind", [("true", "longstr"), (1, "signedint")])
def test_invalid_single_active_consumer_arg_406(conn, uid, value, kind):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, arguments={"x-single-active-consumer": value})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue '{uid}' in {V}: "
        f"{{unacceptable_type,{kind}}}")


@HTTP_AT_ONCE
def test_queue_without_sac_reports_no_active_consumer(broker, conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    Consumer(conn, uid, tag="only")
    queue = api(broker, f"/api/queues/%2F/{uid}")
    assert queue["single_active_consumer_tag"] is None
    assert _statuses(broker, uid) == {"only": (True, "up")}
    ch.queue_delete(uid)


# -- exclusive consumers --------------------------------------------------------------------------

@HTTP_AT_ONCE
def test_exclusive_consumer_blocks_others_until_cancelled(broker, conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    owner = Consumer(conn, uid, tag="owner")
    owner.ch.basic_cancel(owner.tag)
    exclusive = conn.channel()
    tag = exclusive.basic_consume(uid, lambda *a: None, exclusive=True, consumer_tag="solo")
    assert api(broker, f"/api/queues/%2F/{uid}")["exclusive_consumer_tag"] == "solo"
    other = connect(broker)
    with pytest.raises(ChannelClosedByBroker) as exc:
        other.channel().basic_consume(uid, lambda *a: None)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        403, f"ACCESS_REFUSED - queue '{uid}' in {V} in exclusive use")
    exclusive.basic_cancel(tag)
    later = Consumer(other, uid, tag="later")  # free again once the exclusive consumer is gone
    publish(ch, uid, ["x"])
    pump(other)
    assert later.bodies == ["x"]
    assert api(broker, f"/api/queues/%2F/{uid}")["exclusive_consumer_tag"] is None
    other.close()
    ch.queue_delete(uid)


@HTTP_AT_ONCE
def test_exclusive_consumer_released_when_its_connection_closes(broker, conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    holder = connect(broker)
    holder.channel().basic_consume(uid, lambda *a: None, exclusive=True)
    with pytest.raises(ChannelClosedByBroker):
        conn.channel().basic_consume(uid, lambda *a: None, exclusive=True)
    holder.close()
    conn.channel().basic_consume(uid, lambda *a: None, exclusive=True)
    assert api(broker, f"/api/queues/%2F/{uid}")["consumers"] == 1
    conn.channel().queue_delete(uid)


def test_qos_global_false_after_global_true_clears_channel_limit(conn, uid):
    """rabbit_channel (3.8+): basic.qos global=false calls rabbit_limiter:unlimit_prefetch, so a channel
    (global) prefetch set before is dropped (seen on RabbitMQ 3.10.2: amqp-node/amqplib#743)."""
    ch = conn.channel()
    ch.queue_declare(uid, auto_delete=True)
    for _ in range(10):
        ch.basic_publish("", uid, b"x")
    ch.basic_qos(prefetch_count=2, global_qos=True)
    ch.basic_qos(prefetch_count=5, global_qos=False)
    got = []
    ch.basic_consume(uid, lambda c, m, p, b: got.append(m))
    wait_for_events(conn, lambda: len(got) >= 5)
    conn.process_data_events(0.3)
    assert len(got) == 5


def test_global_qos_ack_from_one_queue_resumes_the_other(conn, uid):
    """A channel-wide (global) prefetch shared by consumers of two queues: acking the message of queue A (now
    empty) frees the channel's credit, and queue B's waiting message must follow (rabbit_limiter notifies every
    queue it blocked)."""
    ch = conn.channel()
    qa, qb = uid + "-a", uid + "-b"
    ch.queue_declare(qa, auto_delete=True)
    ch.queue_declare(qb, auto_delete=True)
    ch.basic_publish("", qa, b"a0")
    for i in range(3):
        ch.basic_publish("", qb, b"b%d" % i)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got = []
    ch.basic_consume(qa, lambda c, m, p, b: got.append((m, b)))
    conn.process_data_events(0.3)
    assert [b for _, b in got] == [b"a0"]
    ch.basic_consume(qb, lambda c, m, p, b: got.append((m, b)))
    conn.process_data_events(0.3)
    assert len(got) == 1  # the channel's one credit is held
    ch.basic_ack(got[0][0].delivery_tag)
    wait_for_events(conn, lambda: len(got) >= 2)
    assert [b for _, b in got] == [b"a0", b"b0"]


def test_basic_get_on_quorum_queue_with_single_active_consumer_is_refused(conn, uid):
    """rabbit_fifo answers a dequeue with {error, {unsupported, single_active_consumer}}; rabbit_channel closes
    the channel 405 RESOURCE_LOCKED "cannot obtain access to locked queue '...' in vhost '/'. basic.get
    operations are not supported by quorum queues with single active consumer"."""
    ch = conn.channel()
    ch.queue_declare(uid, durable=True, arguments={"x-queue-type": "quorum", "x-single-active-consumer": True})
    ch.basic_publish("", uid, b"x")
    try:
        with pytest.raises(ChannelClosedByBroker) as closed:
            ch.basic_get(uid, auto_ack=True)
        assert closed.value.reply_code == 405
        assert closed.value.reply_text == (
            f"RESOURCE_LOCKED - cannot obtain access to locked queue '{uid}' in vhost '/'. basic.get operations "
            "are not supported by quorum queues with single active consumer")
    finally:
        conn.channel().queue_delete(uid)


def test_global_qos_set_after_consuming_from_a_quorum_queue_does_not_limit_it(conn, uid):
    """RabbitMQ: quorum queue consumers are credited by rabbit_fifo (their own prefetch), never by the channel's
    limiter: basic.qos global=true activates the limit on classic queues only (classic_consumer_queue_pids)."""
    ch = conn.channel()
    ch.queue_declare(uid, durable=True, arguments={"x-queue-type": "quorum"})
    try:
        ch.basic_qos(prefetch_count=10)
        got = []
        ch.basic_consume(uid, lambda c, m, p, b: got.append(m))
        ch.basic_qos(prefetch_count=1, global_qos=True)
        for _ in range(5):
            ch.basic_publish("", uid, b"x")
        wait_for_events(conn, lambda: len(got) == 5)
    finally:
        ch.close()
        conn.channel().queue_delete(uid)


def test_ack_after_quorum_queue_deleted(conn, uid):
    """A settle for a quorum queue that is gone is ignored, as RabbitMQ's; the connection carries on (the state
    machine's invariant checks, which the tests turn on, failed on the deleted queue's state: 541)."""
    ch = conn.channel()
    ch.queue_declare(uid, durable=True, arguments={"x-queue-type": "quorum"})
    for _ in range(3):
        ch.basic_publish("", uid, b"x")
    ch.basic_qos(prefetch_count=1)
    got = []
    ch.basic_consume(uid, lambda c, m, p, b: got.append(m))
    while not got:
        conn.process_data_events(0.1)
    conn.channel().queue_delete(uid)  # 2 ready messages go with it, 1 delivery held
    ch.basic_ack(got[0].delivery_tag)
    conn.channel().queue_declare(uid + "-other", auto_delete=True)  # a round trip: the connection is still open
