"""Consumers, prefetch, acknowledgements, basic.get and channel.flow through pika, checked against what
RabbitMQ 3.10 does.  Reply codes and reply texts follow rabbit_channel."""
from __future__ import annotations

import time
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from conftest import connect
from support import AsyncClose, bodies, channel_closed, consume_n, drain

pytestmark = pytest.mark.timeout(20)

V = "vhost '/'"


# -- consumers, prefetch, acks --------------------------------------------------------------------

def test_round_robin_two_consumers(conn, ch, uid):
    ch.queue_declare(uid)
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    ch.basic_consume(uid, lambda c, m, p, b: got["a"].append(b), auto_ack=True, consumer_tag="a")
    ch.basic_consume(uid, lambda c, m, p, b: got["b"].append(b), auto_ack=True, consumer_tag="b")
    for i in range(10):
        ch.basic_publish("", uid, b"%d" % i)
    deadline = time.monotonic() + 3
    while len(got["a"]) + len(got["b"]) < 10 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert len(got["a"]) == 5 and len(got["b"]) == 5
    assert sorted(got["a"] + got["b"], key=int) == [b"%d" % i for i in range(10)]
    ch.queue_delete(uid)


def test_prefetch_per_consumer(conn, ch, uid):
    ch.queue_declare(uid)
    for i in range(20):
        ch.basic_publish("", uid, b"%d" % i)
    ch.basic_qos(prefetch_count=1)
    pending: dict[str, list[int]] = {"a": [], "b": []}
    max_seen = {"a": 0, "b": 0}
    done: list[int] = []

    def on(tag):
        def cb(c, m, p, b):
            pending[tag].append(m.delivery_tag)
            max_seen[tag] = max(max_seen[tag], len(pending[tag]))
        return cb

    ch.basic_consume(uid, on("a"), consumer_tag="a")
    ch.basic_consume(uid, on("b"), consumer_tag="b")
    deadline = time.monotonic() + 5
    while len(done) < 20 and time.monotonic() < deadline:
        conn.process_data_events(0.02)
        for tag in ("a", "b"):
            while pending[tag]:
                dt = pending[tag].pop()
                ch.basic_ack(dt)
                done.append(dt)
    assert len(done) == 20
    assert max_seen == {"a": 1, "b": 1}
    ch.queue_delete(uid)


def test_prefetch_limits_unacked(conn, ch, uid):
    ch.queue_declare(uid)
    for i in range(10):
        ch.basic_publish("", uid, b"%d" % i)
    ch.basic_qos(prefetch_count=3)
    got = []
    ch.basic_consume(uid, lambda c, m, p, b: got.append(m))
    conn.process_data_events(0.3)
    assert len(got) == 3
    assert ch.queue_declare(uid, passive=True).method.message_count == 7
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    conn.process_data_events(0.3)
    assert len(got) == 6
    ch.queue_delete(uid)


def test_global_qos_shared_across_consumers(conn, ch, uid):
    q1, q2 = uid + "-1", uid + "-2"
    ch.queue_declare(q1)
    ch.queue_declare(q2)
    for _ in range(5):
        ch.basic_publish("", q1, b"a")
        ch.basic_publish("", q2, b"b")
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got = []
    ch.basic_consume(q1, lambda c, m, p, b: got.append(m))
    ch.basic_consume(q2, lambda c, m, p, b: got.append(m))
    conn.process_data_events(0.3)
    assert len(got) == 3
    ch.basic_ack(got[0].delivery_tag)
    conn.process_data_events(0.3)
    assert len(got) == 4
    ch.queue_delete(q1)
    ch.queue_delete(q2)


def test_nack_requeue_restores_original_order(conn, ch, uid):
    ch.queue_declare(uid)
    for i in range(5):
        ch.basic_publish("", uid, b"%d" % i)
    got = consume_n(conn, ch, uid, 5, auto_ack=False)
    assert bodies(got) == [b"0", b"1", b"2", b"3", b"4"]
    assert not any(m.redelivered for m, _, _ in got)
    ch.basic_nack(got[3][0].delivery_tag, requeue=True)
    ch.basic_reject(got[1][0].delivery_tag, requeue=True)
    ch.basic_nack(got[4][0].delivery_tag, requeue=True)
    ch.basic_ack(got[0][0].delivery_tag)
    ch.basic_ack(got[2][0].delivery_tag)
    again = []
    while True:
        method, _, body = ch.basic_get(uid, auto_ack=True)
        if method is None:
            break
        again.append((method.redelivered, body))
    assert again == [(True, b"1"), (True, b"3"), (True, b"4")]
    ch.queue_delete(uid)


def test_nack_multiple_requeue_keeps_order_before_new(ch, uid):
    ch.queue_declare(uid)
    for i in range(3):
        ch.basic_publish("", uid, b"%d" % i)
    tags = [ch.basic_get(uid)[0].delivery_tag for _ in range(3)]
    ch.basic_publish("", uid, b"new")
    ch.basic_nack(tags[-1], multiple=True, requeue=True)
    assert drain(ch, uid) == [b"0", b"1", b"2", b"new"]
    ch.queue_delete(uid)


def test_reject_without_requeue_drops(ch, uid):
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"x")
    method, _, _ = ch.basic_get(uid)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_delete(uid)


def test_multiple_ack(ch, uid):
    ch.queue_declare(uid)
    for i in range(5):
        ch.basic_publish("", uid, b"%d" % i)
    tags = [ch.basic_get(uid)[0].delivery_tag for _ in range(5)]
    assert tags == sorted(tags)
    ch.basic_ack(tags[2], multiple=True)
    ch.basic_recover(requeue=True)
    assert drain(ch, uid) == [b"3", b"4"]
    ch.queue_delete(uid)


def test_ack_all_with_tag_zero_multiple(ch, uid):
    ch.queue_declare(uid)
    for i in range(3):
        ch.basic_publish("", uid, b"%d" % i)
    for _ in range(3):
        ch.basic_get(uid)
    ch.basic_ack(0, multiple=True)
    ch.basic_recover(requeue=True)
    assert drain(ch, uid) == []
    ch.queue_delete(uid)


def test_unknown_delivery_tag(conn, ch):
    closed = AsyncClose(ch)
    ch.basic_ack(99)
    closed.wait(406, "PRECONDITION_FAILED - unknown delivery tag 99")
    assert conn.is_open


def test_double_ack(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"x")
    method, _, _ = ch.basic_get(uid)
    ch.basic_ack(method.delivery_tag)
    closed = AsyncClose(ch)
    ch.basic_ack(method.delivery_tag)
    closed.wait(406, f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}")
    conn.channel().queue_delete(uid)


def _outstanding(ch, uid: str, n: int, settle: tuple[int, ...] = ()) -> list[int]:
    """Get n messages unacked, then ack those at the positions in ``settle``: the tags still outstanding."""
    ch.queue_declare(uid)
    for i in range(n):
        ch.basic_publish("", uid, b"%d" % i)
    tags = [ch.basic_get(uid)[0].delivery_tag for _ in range(n)]
    for i in settle:
        ch.basic_ack(tags[i])
    return [tag for i, tag in enumerate(tags) if i not in settle]


@pytest.mark.parametrize("method", ["basic_ack", "basic_nack"])
@pytest.mark.parametrize("case", ["above", "acked", "gap", "zero-single"])
def test_multiple_settle_needs_the_exact_tag_outstanding(conn, uid, method, case):
    """rabbit_channel's collect_acks: with multiple=true as without, the tag itself must be outstanding, else the
    channel closes with 406 and nothing is settled (the outstanding messages are requeued by the close)."""
    ch = conn.channel()
    first, *_ = _outstanding(ch, uid, 3, settle=(1,))
    tag, multiple = {"above": (first + 81, True), "acked": (first, True), "gap": (first + 1, True),
                     "zero-single": (0, False)}[case]
    if case == "acked":  # now below every outstanding tag
        ch.basic_ack(first)
    closed = AsyncClose(ch)
    getattr(ch, method)(tag, multiple=multiple)
    closed.wait(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")
    assert conn.is_open
    left = conn.channel()
    assert left.queue_declare(uid, passive=True).method.message_count == (1 if case == "acked" else 2)
    left.queue_delete(uid)


def test_multiple_settle_of_an_outstanding_tag_takes_those_before_it(conn, uid):
    ch = conn.channel()
    first, third = _outstanding(ch, uid, 3, settle=(1,))
    ch.basic_ack(third, multiple=True)  # over the gap the single ack left
    ch.basic_ack(0, multiple=True)  # nothing left: no error
    ch.basic_recover(requeue=True)
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_delete(uid)


def test_ack_inside_a_transaction_is_checked_when_it_arrives(conn, uid):
    """As in RabbitMQ, a transaction's ack takes its tags at once: acking one twice before the commit is an
    unknown tag, and a rollback makes them outstanding again."""
    ch = conn.channel()
    first, second, third = _outstanding(ch, uid, 3)
    ch.tx_select()
    ch.basic_ack(second, multiple=True)
    ch.tx_rollback()
    ch.basic_ack(first)
    ch.basic_nack(second, requeue=False)
    ch.tx_commit()
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.basic_ack(third)
    closed = AsyncClose(ch)
    ch.basic_ack(third, multiple=True)
    closed.wait(406, f"PRECONDITION_FAILED - unknown delivery tag {third}")
    left = conn.channel()
    assert left.basic_get(uid, auto_ack=True)[0].redelivered  # the uncommitted ack went with the channel
    left.queue_delete(uid)


def test_unacked_requeued_on_channel_close(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    for i in range(3):
        ch.basic_publish("", uid, b"%d" % i)
    got = consume_n(conn, ch, uid, 3, auto_ack=False)
    assert len(got) == 3
    ch.close()
    ch = conn.channel()
    out = []
    for _ in range(3):
        method, _, body = ch.basic_get(uid, auto_ack=True)
        out.append((method.redelivered, body))
    assert out == [(True, b"0"), (True, b"1"), (True, b"2")]
    ch.queue_delete(uid)


def test_unacked_requeued_on_connection_close(broker, ch, uid):
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"x")
    with connect(broker) as other:
        assert other.channel().basic_get(uid)[2] == b"x"
    time.sleep(0.05)
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"x" and method.redelivered
    ch.queue_delete(uid)


def test_basic_recover_requeues(ch, uid):
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"a")
    ch.basic_publish("", uid, b"b")
    ch.basic_get(uid)
    ch.basic_get(uid)
    ch.basic_recover(requeue=True)
    m1, _, b1 = ch.basic_get(uid, auto_ack=True)
    m2, _, b2 = ch.basic_get(uid, auto_ack=True)
    assert (b1, b2) == (b"a", b"b") and m1.redelivered and m2.redelivered
    ch.queue_delete(uid)


def test_basic_get_and_get_empty(ch, uid):
    ch.queue_declare(uid)
    assert ch.basic_get(uid) == (None, None, None)
    ch.basic_publish("", uid, b"1")
    ch.basic_publish("", uid, b"2")
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"1" and method.message_count == 1 and not method.redelivered
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"2" and method.message_count == 0
    assert ch.basic_get(uid)[0] is None
    ch.queue_delete(uid)


def test_basic_get_missing_queue(ch, uid):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_get(uid)
    channel_closed(exc, 404, f"NOT_FOUND - no queue '{uid}' in {V}")


def test_no_ack_consumer(conn, ch, uid):
    ch.queue_declare(uid)
    for i in range(3):
        ch.basic_publish("", uid, b"%d" % i)
    got = consume_n(conn, ch, uid, 3, auto_ack=True)
    assert bodies(got) == [b"0", b"1", b"2"]
    ch.basic_recover(requeue=True)
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_delete(uid)


def test_exclusive_consumer(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_consume(uid, lambda *a: None, exclusive=True)
    c2 = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        c2.basic_consume(uid, lambda *a: None)
    channel_closed(exc, 403, f"ACCESS_REFUSED - queue '{uid}' in {V} in exclusive use")
    ch.queue_delete(uid)


def test_exclusive_consume_when_queue_has_consumer(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_consume(uid, lambda *a: None)
    c2 = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        c2.basic_consume(uid, lambda *a: None, exclusive=True)
    channel_closed(exc, 403, f"ACCESS_REFUSED - queue '{uid}' in {V} in exclusive use")
    ch.queue_delete(uid)


def test_consumer_tag_reuse_closes_connection(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_consume(uid, lambda *a: None, consumer_tag="dup")
    # pika refuses a duplicate tag itself, so send the method under it
    ch._impl._send_method(pika.spec.Basic.Consume(queue=uid, consumer_tag="dup"))
    with pytest.raises(ConnectionClosedByBroker) as exc:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            conn.process_data_events(0.05)
    channel_closed(exc, 530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'")


def test_server_generated_consumer_tag(broker, ch, uid):
    ch.queue_declare(uid)
    tag = ch.basic_consume(uid, lambda *a: None)
    assert tag.startswith("ctag")  # pika always makes its own tags
    # an empty tag makes the broker generate one; pika can't send that, py-amqp can
    import amqp
    with amqp.Connection(f"{broker.host}:{broker.port}", userid="guest", password="guest") as other:
        other.connect()
        c = other.channel()
        tags = {c.basic_consume(uid, consumer_tag="", callback=lambda m: None) for _ in range(2)}
        assert all(t.startswith("amq.ctag-") and len(t) > 20 for t in tags) and len(tags) == 2
    ch.queue_delete(uid)


def test_queue_deleted_while_consumed_cancels_consumer(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    cancelled = []
    tag = ch.basic_consume(uid, lambda *a: None)
    ch._impl.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    conn.channel().queue_delete(uid)
    deadline = time.monotonic() + 2
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    conn.process_data_events(0.05)
    assert cancelled == [tag]
    assert tag not in ch.consumer_tags
    assert ch.is_open


def test_basic_consume_missing_queue(ch, uid):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume(uid, lambda *a: None)
    channel_closed(exc, 404, f"NOT_FOUND - no queue '{uid}' in {V}")


def test_cancel_unknown_consumer_is_ok(ch):
    ch._impl._rpc(pika.spec.Basic.Cancel(consumer_tag="nope"), None, [pika.spec.Basic.CancelOk])
    ch.connection.process_data_events(0.2)
    assert ch.is_open


# -- channel.flow ---------------------------------------------------------------------------------

@pytest.mark.warren_only("Warren's --channel-flow option; RabbitMQ (and Warren by default) answer 540")
def test_channel_flow_pauses_and_resumes_deliveries(start_broker, uid):
    """With --channel-flow true, channel.flow(active=false) stops deliveries to the channel; active=true
    resumes them (test_compatibility: the default 540)."""
    conn = connect(start_broker("--channel-flow", "true"))
    ch = conn.channel()
    ch.queue_declare(uid, exclusive=True)
    got = []
    ch.basic_consume(uid, lambda c, m, p, body: got.append(body), auto_ack=True)
    replies: list[bool] = []
    impl: Any = ch._impl  # type: ignore[attr-defined]  # (pika's channel: channel.flow from the client)

    def wait(predicate, seconds=2.0):
        deadline = time.monotonic() + seconds
        while not predicate() and time.monotonic() < deadline:
            conn.process_data_events(0.05)

    impl.flow(False, replies.append)
    wait(lambda: replies)
    assert replies == [False]
    ch.basic_publish("", uid, b"held")
    wait(lambda: got, 0.5)
    assert got == []
    impl.flow(True, replies.append)
    wait(lambda: got)
    assert replies == [False, True]
    assert got == [b"held"]
