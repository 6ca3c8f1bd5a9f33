"""queue.declare, bind, unbind, purge and delete through pika, checked against what RabbitMQ 3.10 does.

Reply codes and reply texts follow rabbit_channel and rabbit_amqqueue."""
from __future__ import annotations

import time

import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from conftest import connect
from support import channel_closed

pytestmark = pytest.mark.timeout(20)

V = "vhost '/'"


# -- queue.declare --------------------------------------------------------------------------------

def test_server_named_queue(ch):
    ok = ch.queue_declare("", exclusive=True)
    assert ok.method.queue.startswith("amq.gen-")
    assert len(ok.method.queue) > len("amq.gen-") + 10
    assert ok.method.message_count == 0 and ok.method.consumer_count == 0
    assert ch.queue_declare("", exclusive=True).method.queue != ok.method.queue


def test_passive_declare_missing_queue(ch, uid):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, passive=True)
    channel_closed(exc, 404, f"NOT_FOUND - no queue '{uid}' in {V}")


def test_passive_declare_existing_reports_counts(conn, ch, uid):
    ch.queue_declare(uid, auto_delete=False)
    for i in range(3):
        ch.basic_publish("", uid, b"m%d" % i)
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=1)
    ch2.basic_consume(uid, lambda *a: None, auto_ack=False)
    conn.process_data_events(0.1)
    ok = ch.queue_declare(uid, passive=True)
    assert ok.method.queue == uid
    assert (ok.method.message_count, ok.method.consumer_count) == (2, 1)  # ready only, unacked not counted
    ch.queue_delete(uid)


def test_declare_ok_message_count(ch, uid):
    ch.confirm_delivery()  # RabbitMQ may answer the declare before it has queued unconfirmed publishes
    ch.queue_declare(uid)
    for _ in range(5):
        ch.basic_publish("", uid, b"x")
    ok = ch.queue_declare(uid)
    assert (ok.method.message_count, ok.method.consumer_count) == (5, 0)
    ch.queue_delete(uid)


@pytest.mark.parametrize("first,second,arg,received,current", [
    ({"durable": False}, {"durable": True}, "durable", "true", "false"),
    ({"durable": True}, {"durable": False}, "durable", "false", "true"),
    ({"auto_delete": False}, {"auto_delete": True}, "auto_delete", "true", "false"),
])
def test_redeclare_inequivalent_flags(ch, uid, first, second, arg, received, current):
    ch.queue_declare(uid, **first)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, **second)
    channel_closed(exc, 406, f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{uid}' in {V}: "
                             f"received '{received}' but current is '{current}'")


def test_redeclare_inequivalent_x_args(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-message-ttl": 1000})
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, arguments={"x-message-ttl": 2000})
    channel_closed(exc, 406, f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{uid}' in {V}: "
                             f"received '2000' but current is '1000'")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text.startswith(
        f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{uid}' in {V}: received none")
    ch = conn.channel()
    ch.queue_declare(uid, arguments={"x-message-ttl": 1000})  # equivalent: fine
    ch.queue_delete(uid)


@pytest.mark.parametrize("queue_type, first, second, named", [
    ("classic", {}, {"x-queue-mode": "lazy"}, "x-queue-mode"),
    ("classic", {"x-queue-version": 1}, {"x-queue-version": 2}, "x-queue-version"),
    ("classic", {"x-message-ttl": 1, "x-expires": 60000}, {"x-message-ttl": 2, "x-expires": 70000}, "x-expires"),
    ("quorum", {"x-delivery-limit": 3}, {"x-delivery-limit": 4}, "x-delivery-limit"),
    ("quorum", {}, {"x-quorum-initial-group-size": 1}, "x-quorum-initial-group-size"),
    ("quorum", {"x-message-ttl": 1, "x-expires": 60000}, {"x-message-ttl": 2, "x-expires": 70000}, "x-expires"),
])
def test_redeclare_checks_the_queue_types_arguments_in_rabbitmqs_order(conn, uid, queue_type, first, second, named):
    """rabbit_amqqueue:assert_args_equivalence checks the existing queue type's queue_arguments, in their order
    (rabbit_classic_queue's, rabbit_quorum_queue's): the first that differs is named."""
    ch = conn.channel()
    typed = {"x-queue-type": queue_type}
    ch.queue_declare(uid, durable=True, arguments={**typed, **first})
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, durable=True, arguments={**typed, **second})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text.startswith(
        f"PRECONDITION_FAILED - inequivalent arg '{named}' for queue '{uid}' in {V}: received ")
    conn.channel().queue_delete(uid)


def test_redeclare_equivalent_is_ok(ch, uid):
    ch.queue_declare(uid, durable=True)
    assert ch.queue_declare(uid, durable=True).method.queue == uid
    ch.queue_delete(uid)


def test_reserved_queue_name(ch):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare("amq.mine")
    channel_closed(exc, 403, "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'")


def test_exclusive_queue_locked_for_other_connection(broker, ch, uid):
    ch.queue_declare(uid, exclusive=True)
    locked = (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{uid}' in {V}. It could be "
              "originally declared on another connection or the exclusive property value does not match that "
              "of the original declaration.")
    if len(locked.encode()) > 255:  # RabbitMQ cuts reply texts to 252 bytes + "..."
        locked = locked.encode()[:252].decode() + "..."
    with connect(broker) as other:
        for op in (lambda c: c.queue_declare(uid, passive=True),
                   lambda c: c.queue_declare(uid, exclusive=True),
                   lambda c: c.basic_consume(uid, lambda *a: None),
                   lambda c: c.basic_get(uid),
                   lambda c: c.queue_delete(uid),
                   lambda c: c.queue_purge(uid),
                   lambda c: c.queue_bind(uid, "amq.direct", "k")):
            c = other.channel()
            with pytest.raises(ChannelClosedByBroker) as exc:
                op(c)
            channel_closed(exc, 405, locked)
    ch.queue_declare(uid, passive=True)


def test_exclusive_queue_deleted_with_connection(broker, ch, uid):
    with connect(broker) as owner:
        owner.channel().queue_declare(uid, exclusive=True)
    time.sleep(0.1)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, passive=True)
    channel_closed(exc, 404)


def test_auto_delete_queue_goes_after_last_consumer(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid, auto_delete=True)
    t1 = ch.basic_consume(uid, lambda *a: None)
    t2 = ch.basic_consume(uid, lambda *a: None)
    ch.basic_cancel(t1)
    assert ch.queue_declare(uid, passive=True).method.consumer_count == 1
    ch.basic_cancel(t2)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(uid, passive=True)
    channel_closed(exc, 404, f"NOT_FOUND - no queue '{uid}' in {V}")


def test_auto_delete_queue_without_consumers_stays(ch, uid):
    ch.queue_declare(uid, auto_delete=True)
    ch.queue_declare(uid, passive=True, auto_delete=True)
    ch.queue_delete(uid)


# -- queue.bind / unbind / purge / delete -----------------------------------------------------------

def test_bind_unbind_purge(ch, uid):
    ch.queue_declare(uid)
    ch.queue_bind(uid, "amq.direct", "rk")
    ch.basic_publish("amq.direct", "rk", b"1")
    ch.basic_publish("amq.direct", "rk", b"2")
    assert ch.queue_purge(uid).method.message_count == 2
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_unbind(uid, "amq.direct", "rk")
    ch.basic_publish("amq.direct", "rk", b"3")
    assert ch.queue_declare(uid, passive=True).method.message_count == 0
    ch.queue_unbind(uid, "amq.direct", "never-bound")  # unbinding a missing binding is fine
    assert ch.queue_delete(uid).method.message_count == 0


def test_delete_reports_message_count(ch, uid):
    ch.queue_declare(uid)
    for _ in range(4):
        ch.basic_publish("", uid, b"x")
    assert ch.queue_delete(uid).method.message_count == 4


def test_delete_if_unused(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    ch.basic_consume(uid, lambda *a: None)
    c2 = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        c2.queue_delete(uid, if_unused=True)
    channel_closed(exc, 406, f"PRECONDITION_FAILED - queue '{uid}' in {V} in use")
    ch.queue_delete(uid)


def test_delete_if_empty(ch, uid, conn):
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"x")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_delete(uid, if_empty=True)
    channel_closed(exc, 406, f"PRECONDITION_FAILED - queue '{uid}' in {V} not empty")
    ch = conn.channel()
    ch.queue_purge(uid)
    ch.queue_delete(uid, if_empty=True, if_unused=True)


def test_a_conditional_delete_of_a_quorum_queue_is_not_implemented_as_rabbitmq_3_10_answers_it(broker, uid):
    """rabbit_quorum_queue:delete refuses if-unused (first) and if-empty with a protocol error, 540 NOT_IMPLEMENTED,
    which closes the connection; the queue stays."""
    with connect(broker) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments={"x-queue-type": "quorum"})
    with connect(broker) as connection:
        with pytest.raises(ConnectionClosedByBroker) as exc:
            connection.channel().queue_delete(uid, if_unused=True, if_empty=True)
    channel_closed(exc, 540, f"NOT_IMPLEMENTED - cannot delete queue '{uid}' in {V}. queue.delete operations with "
                             "if-unused flag set are not supported by quorum queues")
    with connect(broker) as connection:
        with pytest.raises(ConnectionClosedByBroker) as exc:
            connection.channel().queue_delete(uid, if_empty=True)
        assert not connection.is_open
    channel_closed(exc, 540, f"NOT_IMPLEMENTED - cannot delete queue '{uid}' in {V}. queue.delete operations with "
                             "if-empty flag set are not supported by quorum queues")
    with connect(broker) as connection:
        assert connection.channel().queue_delete(uid).method.message_count == 0


def test_delete_missing_queue_is_ok(ch, uid):
    assert ch.queue_delete(uid).method.message_count == 0
    assert ch.is_open


def test_bind_to_default_exchange_refused(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_bind(uid, "", "k")
    channel_closed(exc, 403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_unbind(uid, "", uid)
    channel_closed(exc, 403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    conn.channel().queue_delete(uid)


def test_bind_to_missing_exchange(conn, uid):
    ch = conn.channel()
    ch.queue_declare(uid)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_bind(uid, uid + "-nope", "k")
    channel_closed(exc, 404, f"NOT_FOUND - no exchange '{uid}-nope' in {V}")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_bind(uid + "-noq", "amq.direct", "k")
    channel_closed(exc, 404, f"NOT_FOUND - no queue '{uid}-noq' in {V}")
    conn.channel().queue_delete(uid)
