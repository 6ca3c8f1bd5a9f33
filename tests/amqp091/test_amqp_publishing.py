"""Publishing through pika (mandatory returns, confirms, transactions, content of every size), checked against
what RabbitMQ 3.10 does.  Reply codes and reply texts follow rabbit_channel."""
from __future__ import annotations

import datetime
import os
import time

import pika
import pytest
from pamqp import body, commands, frame, header
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from conftest import connect
from support import AsyncClose, Raw, bodies, channel_closed, consume_n, drain

pytestmark = pytest.mark.timeout(20)

V = "vhost '/'"


# -- publish --------------------------------------------------------------------------------------

def test_mandatory_unroutable_returned(conn, uid):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append((m, p, b)))
    ch.basic_publish("amq.direct", uid, b"lost", pika.BasicProperties(message_id="m1"), mandatory=True)
    ch.basic_publish("amq.direct", uid, b"dropped")  # not mandatory: silently dropped
    deadline = time.monotonic() + 2
    while not returned and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    conn.process_data_events(0.1)
    assert len(returned) == 1
    method, props, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key) == ("amq.direct", uid)
    assert body == b"lost" and props.message_id == "m1"


def test_mandatory_unroutable_with_confirms(ch, uid):
    ch.confirm_delivery()
    with pytest.raises(UnroutableError) as exc:
        ch.basic_publish("amq.direct", uid, b"lost", mandatory=True)
    assert exc.value.messages[0].method.reply_code == 312
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"ok", mandatory=True)
    ch.queue_delete(uid)


def test_publish_to_missing_exchange(conn, uid):
    ch = conn.channel()
    closed = AsyncClose(ch)
    ch.basic_publish(uid, "k", b"x")
    closed.wait(404, f"NOT_FOUND - no exchange '{uid}' in {V}")
    assert conn.is_open


# -- confirms and transactions --------------------------------------------------------------------

def test_confirms_ack_every_publish(conn, uid):
    ch = conn.channel()
    acks = []
    ch._impl.confirm_delivery(lambda frame: acks.append(frame.method))
    ch.queue_declare(uid)
    for i in range(20):
        ch.basic_publish("", uid, b"%d" % i)
    ch.basic_publish("amq.direct", "nowhere", b"unroutable")  # unroutable is still acked
    deadline = time.monotonic() + 3
    while (not acks or max(a.delivery_tag for a in acks) < 21) and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    confirmed: set[int] = set()
    for ack in acks:
        assert isinstance(ack, pika.spec.Basic.Ack)
        if ack.multiple:
            confirmed.update(range(1, ack.delivery_tag + 1))
        else:
            confirmed.add(ack.delivery_tag)
    assert confirmed == set(range(1, 22))
    ch.queue_delete(uid)


def test_blocking_confirm_delivery(ch, uid):
    ch.confirm_delivery()
    ch.queue_declare(uid)
    for i in range(5):
        ch.basic_publish("", uid, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare(uid, passive=True).method.message_count == 5
    ch.queue_delete(uid)


def test_tx_commit_and_rollback(broker, conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.tx_select()
    ch.basic_publish("", uid, b"1")
    ch.basic_publish("", uid, b"2")
    with connect(broker) as other:
        assert other.channel().queue_declare(uid, passive=True).method.message_count == 0
        ch.tx_commit()
        assert other.channel().queue_declare(uid, passive=True).method.message_count == 2
        ch.basic_publish("", uid, b"rolled-back")
        ch.tx_rollback()
        ch.tx_commit()
        assert other.channel().queue_declare(uid, passive=True).method.message_count == 2
    assert drain(conn.channel(), uid) == [b"1", b"2"]
    ch.queue_delete(uid)


def test_tx_acks_applied_on_commit(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"a")
    ch.basic_publish("", uid, b"b")
    ch.tx_select()
    t1 = ch.basic_get(uid)[0].delivery_tag
    t2 = ch.basic_get(uid)[0].delivery_tag
    ch.basic_ack(t1)
    ch.tx_rollback()  # the ack is forgotten, the message stays unacked
    ch.basic_ack(t2)
    ch.tx_commit()
    ch.close()  # t1 still unacked: requeued
    ch = conn.channel()
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert body == b"a" and method.redelivered
    assert ch.basic_get(uid)[0] is None
    ch.queue_delete(uid)


def test_tx_publish_is_routed_when_published_not_at_commit(conn, uid):
    """rabbit_channel basic.publish: QNames = rabbit_exchange:route(...) at publish, the {Delivery, QNames} pair kept
    in the transaction; tx.commit delivers to those queues.  A binding made before the commit gets nothing (a
    mandatory publish that reached no queue is returned at commit); one removed before it still gets the message."""
    ch = conn.channel()
    ch.exchange_declare(uid, "direct", auto_delete=False)
    ch.queue_declare(uid)
    returned = []
    ch.add_on_return_callback(lambda _ch, method, _props, body: returned.append((method.reply_code, body)))
    ch.tx_select()
    ch.basic_publish(uid, "k", b"early", mandatory=True)
    ch.queue_bind(uid, uid, "k")
    ch.basic_publish(uid, "k", b"bound")
    ch.queue_unbind(uid, uid, "k")
    ch.tx_commit()
    conn.process_data_events(time_limit=0.3)
    got = drain(ch, uid)
    ch.queue_delete(uid)
    ch.exchange_delete(uid)
    assert (got, returned) == ([b"bound"], [(312, b"early")])


def test_tx_commit_delivers_publishes_before_settling_acks(conn, uid):
    """rabbit_channel tx.commit: lqueue:fold(fun deliver_to_queues/2, ...) delivers every publish of the transaction
    first, then settles its acks and rejects.  A reject (requeue=false) dead-letters into a queue the transaction
    published to after the reject: the published message is ahead of the dead-lettered one."""
    ch = conn.channel()
    dlq = uid + "-dlq"
    ch.queue_declare(dlq)
    ch.queue_declare(uid, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", uid, b"dead")
    ch.tx_select()
    method, _, _ = ch.basic_get(uid)
    ch.basic_reject(method.delivery_tag, requeue=False)
    ch.basic_publish("", dlq, b"published")
    ch.tx_commit()
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        body = ch.basic_get(dlq, auto_ack=True)[2]
        if body is not None:
            got.append(body)
    ch.tx_commit()
    ch.queue_delete(uid)
    ch.queue_delete(dlq)
    assert got == [b"published", b"dead"]


def test_tx_commit_with_a_rejected_publish_fails_partial_tx(conn, uid):
    """rabbit_channel: in a transaction every delivery is confirm-tracked (DoConfirm = Tx =/= none orelse ...); a
    queue's reject goes to record_rejects, which makes the tx 'failed', and complete_tx closes the channel: 406
    "PRECONDITION_FAILED - partial tx completion" (class tx, method commit).  The rest of it was delivered."""
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.queue_declare(uid + "-other")
    ch.basic_publish("", uid, b"fills")
    ch.tx_select()
    ch.basic_publish("", uid, b"refused")
    ch.basic_publish("", uid + "-other", b"delivered")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.tx_commit()
    channel_closed(exc, 406, "PRECONDITION_FAILED - partial tx completion")
    ch = conn.channel()
    assert (drain(ch, uid), drain(ch, uid + "-other")) == ([b"fills"], [b"delivered"])
    ch.queue_delete(uid)
    ch.queue_delete(uid + "-other")


def test_tx_after_confirm(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.tx_select()
    channel_closed(exc, 406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")


def test_confirm_after_tx(conn):
    ch = conn.channel()
    ch.tx_select()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.confirm_delivery()
    channel_closed(exc, 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


@pytest.mark.parametrize("op", ["tx_commit", "tx_rollback"])
def test_tx_without_select(conn, op):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        getattr(ch, op)()
    channel_closed(exc, 406, "PRECONDITION_FAILED - channel is not transactional")


# -- content --------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 131072 - 8, 131072, 1024 * 1024 + 7])
def test_message_sizes(ch, uid, size):
    ch.queue_declare(uid)
    body = os.urandom(size)
    ch.basic_publish("", uid, body)
    method, _, got = ch.basic_get(uid, auto_ack=True)
    assert got == body
    ch.queue_delete(uid)


def test_large_message_to_consumer(conn, ch, uid):
    ch.queue_declare(uid)
    body = os.urandom(1024 * 1024)
    ch.basic_publish("", uid, body)
    ch.basic_publish("", uid, b"")
    got = consume_n(conn, ch, uid, 2)
    assert bodies(got) == [body, b""]
    ch.queue_delete(uid)


def test_properties_round_trip(ch, uid):
    ch.queue_declare(uid)
    ts = int(datetime.datetime(2021, 5, 4, 3, 2, 1, tzinfo=datetime.timezone.utc).timestamp())
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="gzip",
        headers={"str": "v", "int": 42, "neg": -7, "big": 2 ** 40, "bool": True,
                 "nested": {"a": {"b": [1, "two", {"c": False}]}}, "list": [1, 2, 3], "none": None,
                 "bytes": b"\x00\x01"},
        delivery_mode=2, priority=7, correlation_id="corr", reply_to="reply", expiration="60000",
        message_id="mid", timestamp=ts, type="kind", user_id="guest", app_id="app", cluster_id="cl")
    ch.basic_publish("", uid, b"body", props)
    _, got, _ = ch.basic_get(uid, auto_ack=True)
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id"):
        assert getattr(got, name) == getattr(props, name), name
    headers = dict(got.headers or {})
    assert headers["bytes"] in (b"\x00\x01", "\x00\x01")
    headers.pop("bytes")
    expected = dict(props.headers or {})
    expected.pop("bytes")
    assert headers == expected
    ch.queue_delete(uid)


def test_user_id_mismatch_refused(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, auto_delete=False)
    closed = AsyncClose(ch)
    ch.basic_publish("", uid, b"x", pika.BasicProperties(user_id="mallory"))
    closed.wait(406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user "
                             "was 'guest'")
    conn.channel().queue_delete(uid)


def test_pipelined_tx_commits_are_each_answered_in_order(broker, uid):
    """A client may send its next tx.commit before the last is answered: each gets its commit-ok, in order, the
    first once what it stored is fsynced (one was answered for both, and the client waited for the other)."""
    with connect(broker) as conn:
        conn.channel().queue_declare(uid, durable=True)
    raw = Raw(broker)
    try:
        raw.handshake()
        raw.open_channel(1)
        raw.send_method(1, commands.Tx.Select())
        raw.expect(commands.Tx.SelectOk)
        publish = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=uid), 1)
                   + frame.marshal(header.ContentHeader(0, 1, commands.Basic.Properties(delivery_mode=2)), 1)
                   + frame.marshal(body.ContentBody(b"x"), 1))
        commit = frame.marshal(commands.Tx.Commit(), 1)
        raw.send(publish + commit + publish + commit + commit)
        for _ in range(3):
            raw.expect(commands.Tx.CommitOk)
    finally:
        raw.close()
    with connect(broker) as conn:
        assert conn.channel().queue_delete(uid).method.message_count == 2
