"""AMQP 0-9-1 behaviour through pika's BlockingConnection, checked against what RabbitMQ 3.10 does.

Reply codes and reply texts follow rabbit_channel / rabbit_amqqueue / rabbit_exchange.
"""
from __future__ import annotations

import datetime
import os
import time

import pika
import pytest

from conftest import connect
from pika.exceptions import (ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError,
                             ProbableAuthenticationError, UnroutableError)

pytestmark = pytest.mark.timeout(20)

V = "vhost '/'"




@pytest.fixture
def ch(conn):
    return conn.channel()


def channel_closed(excinfo, code: int, text: str | None = None) -> None:
    assert excinfo.value.reply_code == code, excinfo.value
    if text is not None:
        assert excinfo.value.reply_text == text


def drain(conn: pika.BlockingConnection, seconds: float = 0.2) -> None:
    conn.process_data_events(seconds)


class AsyncClose:
    """The broker closes a channel after an asynchronous method (publish, ack): catch the reason."""

    def __init__(self, ch) -> None:
        self.ch = ch
        self.reason = None
        ch._impl.add_on_close_callback(self._closed)

    def _closed(self, _channel, reason) -> None:
        self.reason = reason

    def wait(self, code: int, text: str | None = None, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while self.reason is None and time.monotonic() < deadline:
            self.ch.connection.process_data_events(0.05)
        assert isinstance(self.reason, ChannelClosedByBroker), self.reason
        assert self.reason.reply_code == code, self.reason
        if text is not None:
            assert self.reason.reply_text == text


def consume_n(conn, ch, queue: str, n: int, auto_ack: bool = True, timeout: float = 3.0) -> list:
    """Collect n deliveries (method, props, body) with a consumer, then cancel it."""
    got: list = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: got.append((m, p, b)), auto_ack=auto_ack)
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    ch.basic_cancel(tag)
    return got


def bodies(gets) -> list[bytes]:
    return [b for _, _, b in gets]


def get_all(ch, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


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
    drain(conn, 0.1)
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


# -- exchanges ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
def test_exchange_declare_types(ch, uid, kind):
    ch.exchange_declare(uid, kind)
    ch.exchange_declare(uid, kind)  # equivalent redeclare
    ch.exchange_declare(uid, passive=True)
    ch.exchange_delete(uid)
    ch.exchange_delete(uid)  # deleting a missing exchange is fine


def test_exchange_unknown_type_closes_connection(conn, uid):
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as exc:
        ch.exchange_declare(uid, "no-such-type")
    channel_closed(exc, 503, "COMMAND_INVALID - unknown exchange type 'no-such-type'")


def test_exchange_reserved_prefix(conn):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_declare("amq.mine", "direct")
    channel_closed(exc, 403, "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'")


def test_redeclare_builtin_amq_exchange_equivalently_is_ok(conn):
    # RabbitMQ only checks the amq. prefix when the exchange does not exist yet
    ch = conn.channel()
    ch.exchange_declare("amq.direct", "direct", durable=True)
    ch.exchange_declare("amq.topic", passive=True)


def test_delete_builtin_exchange_refused(conn):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_delete("amq.direct")
    channel_closed(exc, 403, f"ACCESS_REFUSED - deletion of system exchange 'amq.direct' in {V} not allowed")
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_delete("")
    channel_closed(exc, 403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_exchange_inequivalent_type(ch, uid):
    ch.exchange_declare(uid, "direct")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_declare(uid, "fanout")
    channel_closed(exc, 406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{uid}' in {V}: "
                             "received 'fanout' but current is 'direct'")


def test_exchange_inequivalent_durable(conn, uid):
    ch = conn.channel()
    ch.exchange_declare(uid, "direct")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_declare(uid, "direct", durable=True)
    channel_closed(exc, 406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '{uid}' in {V}: "
                             "received 'true' but current is 'false'")
    conn.channel().exchange_delete(uid)


def test_exchange_passive_missing(ch, uid):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_declare(uid, passive=True)
    channel_closed(exc, 404, f"NOT_FOUND - no exchange '{uid}' in {V}")


def test_exchange_delete_if_unused(conn, uid):
    ch = conn.channel()
    ch.exchange_declare(uid, "fanout")
    ch.queue_declare(uid)
    ch.queue_bind(uid, uid)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_delete(uid, if_unused=True)
    channel_closed(exc, 406, f"PRECONDITION_FAILED - exchange '{uid}' in {V} in use")
    ch = conn.channel()
    ch.queue_unbind(uid, uid)
    ch.exchange_delete(uid, if_unused=True)
    with pytest.raises(ChannelClosedByBroker):
        ch.exchange_declare(uid, passive=True)
    conn.channel().queue_delete(uid)


def test_publish_to_internal_exchange_refused(conn, uid):
    ch = conn.channel()
    ch.exchange_declare(uid, "fanout", internal=True)
    closed = AsyncClose(ch)
    ch.basic_publish(uid, "", b"x")
    closed.wait(403, f"ACCESS_REFUSED - cannot publish to internal exchange '{uid}' in {V}")
    conn.channel().exchange_delete(uid)


def test_exchange_to_exchange_binding_and_internal(ch, uid):
    ch.exchange_declare(uid + "-src", "topic")
    ch.exchange_declare(uid + "-mid", "fanout", internal=True)
    ch.exchange_bind(uid + "-mid", uid + "-src", "a.*")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, uid + "-mid")
    ch.basic_publish(uid + "-src", "a.b", b"hit")
    ch.basic_publish(uid + "-src", "b.b", b"miss")
    assert get_all(ch, q) == [b"hit"]
    ch.exchange_unbind(uid + "-mid", uid + "-src", "a.*")
    ch.basic_publish(uid + "-src", "a.b", b"gone")
    assert get_all(ch, q) == []
    ch.exchange_delete(uid + "-src")
    ch.exchange_delete(uid + "-mid")


def test_exchange_bind_missing(conn, uid):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_bind(uid, "amq.direct", "k")
    channel_closed(exc, 404, f"NOT_FOUND - no exchange '{uid}' in {V}")


def test_alternate_exchange_of_wrong_type_406(ch, uid):
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_declare(uid, "direct", arguments={"alternate-exchange": 5})
    channel_closed(exc, 406, f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'alternate-exchange' "
                             f"in exchange '{uid}' in {V}")


def test_empty_queue_name_means_last_declared_except_for_passive_declare(conn, uid):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_bind("", "amq.direct", routing_key="k")
    channel_closed(exc, 404, "NOT_FOUND - no previously declared queue")
    ch = conn.channel()
    ch.queue_declare(uid, auto_delete=True)
    ch.queue_bind("", "amq.direct", routing_key=uid)
    ch.basic_publish("amq.direct", uid, b"via last queue")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare("", passive=True)
    channel_closed(exc, 404, f"NOT_FOUND - no queue '' in {V}")
    ch = conn.channel()
    assert ch.basic_get(uid, auto_ack=True)[2] == b"via last queue"


def test_alternate_exchange(ch, uid):
    alt = uid + "-alt"
    ch.exchange_declare(alt, "fanout")
    ch.exchange_declare(uid, "direct", arguments={"alternate-exchange": alt})
    qa = ch.queue_declare("", exclusive=True).method.queue
    qm = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(qa, alt)
    ch.queue_bind(qm, uid, "known")
    ch.basic_publish(uid, "known", b"routed")
    ch.basic_publish(uid, "unknown", b"alternate")
    assert get_all(ch, qm) == [b"routed"]
    assert get_all(ch, qa) == [b"alternate"]
    ch.exchange_delete(uid)
    ch.exchange_delete(alt)


def test_alternate_exchange_makes_mandatory_routable(conn, uid):
    ch = conn.channel()
    alt = uid + "-alt"
    ch.exchange_declare(alt, "fanout")
    ch.exchange_declare(uid, "direct", arguments={"alternate-exchange": alt})
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, alt)
    ch.confirm_delivery()
    ch.basic_publish(uid, "nowhere", b"x", mandatory=True)  # no UnroutableError
    assert get_all(ch, q) == [b"x"]
    ch.exchange_delete(uid)
    ch.exchange_delete(alt)


def test_auto_delete_exchange_goes_with_last_binding(conn, uid):
    ch = conn.channel()
    ch.exchange_declare(uid, "direct", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, uid, "a")
    ch.queue_bind(q, uid, "b")
    ch.queue_unbind(q, uid, "a")
    ch.exchange_declare(uid, passive=True)
    ch.queue_unbind(q, uid, "b")
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_declare(uid, passive=True)
    channel_closed(exc, 404, f"NOT_FOUND - no exchange '{uid}' in {V}")


def test_auto_delete_exchange_goes_when_bound_queue_deleted(conn, uid):
    ch = conn.channel()
    ch.exchange_declare(uid, "fanout", auto_delete=True)
    ch.queue_declare(uid)
    ch.queue_bind(uid, uid)
    ch.queue_delete(uid)
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.exchange_declare(uid, passive=True)
    channel_closed(exc, 404)


# -- routing --------------------------------------------------------------------------------------


def test_direct_routing(ch):
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, "amq.direct", q1)
    ch.queue_bind(q2, "amq.direct", "shared")
    ch.queue_bind(q1, "amq.direct", "shared")
    ch.basic_publish("amq.direct", q1, b"only-q1")
    ch.basic_publish("amq.direct", "shared", b"both")
    ch.basic_publish("amq.direct", "none", b"nobody")
    assert get_all(ch, q1) == [b"only-q1", b"both"]
    assert get_all(ch, q2) == [b"both"]


def test_default_exchange_routes_by_queue_name(ch, uid):
    ch.queue_declare(uid)
    ch.basic_publish("", uid, b"x")
    method, _, body = ch.basic_get(uid, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == ("", uid, b"x")
    ch.queue_delete(uid)


def test_fanout_routing(ch):
    qs = [ch.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    for q in qs:
        ch.queue_bind(q, "amq.fanout", "ignored")
    ch.basic_publish("amq.fanout", "whatever", b"all")
    for q in qs:
        assert get_all(ch, q) == [b"all"]
        ch.queue_unbind(q, "amq.fanout", "ignored")


@pytest.mark.parametrize("pattern,key,match", [
    ("a.*.c", "a.b.c", True), ("a.*.c", "a.b.b.c", False), ("a.#", "a", True), ("a.#", "a.b.c", True),
    ("#", "", True), ("*", "", False), ("#.c", "a.b.c", True), ("a.*", "a", False), ("a.#.c", "a.c", True),
    ("*.b.#", "x.b", True), ("a.b", "a.b", True), ("a.b", "a.bb", False),
])
def test_topic_routing(ch, uid, pattern, key, match):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", pattern)
    ch.basic_publish("amq.topic", key, b"m")
    assert get_all(ch, q) == ([b"m"] if match else [])
    ch.queue_unbind(q, "amq.topic", pattern)


def test_headers_routing(ch):
    qall = ch.queue_declare("", exclusive=True).method.queue
    qany = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(qall, "amq.headers", arguments={"x-match": "all", "a": 1, "b": "two"})
    ch.queue_bind(qany, "amq.headers", arguments={"x-match": "any", "a": 1, "b": "two"})
    ch.basic_publish("amq.headers", "", b"both", pika.BasicProperties(headers={"a": 1, "b": "two", "c": 3}))
    ch.basic_publish("amq.headers", "", b"one", pika.BasicProperties(headers={"a": 1}))
    ch.basic_publish("amq.headers", "", b"none", pika.BasicProperties(headers={"a": 2}))
    ch.basic_publish("amq.headers", "", b"noheaders")
    assert get_all(ch, qall) == [b"both"]
    assert get_all(ch, qany) == [b"both", b"one"]
    ch.queue_unbind(qall, "amq.headers", arguments={"x-match": "all", "a": 1, "b": "two"})
    ch.queue_unbind(qany, "amq.headers", arguments={"x-match": "any", "a": 1, "b": "two"})


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
    drain(conn, 0.1)
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
    done = []

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
    drain(conn, 0.3)
    assert len(got) == 3
    assert ch.queue_declare(uid, passive=True).method.message_count == 7
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    drain(conn, 0.3)
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
    drain(conn, 0.3)
    assert len(got) == 3
    ch.basic_ack(got[0].delivery_tag)
    drain(conn, 0.3)
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
    assert get_all(ch, uid) == [b"0", b"1", b"2", b"new"]
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
    assert get_all(ch, uid) == [b"3", b"4"]
    ch.queue_delete(uid)


def test_ack_all_with_tag_zero_multiple(ch, uid):
    ch.queue_declare(uid)
    for i in range(3):
        ch.basic_publish("", uid, b"%d" % i)
    for _ in range(3):
        ch.basic_get(uid)
    ch.basic_ack(0, multiple=True)
    ch.basic_recover(requeue=True)
    assert get_all(ch, uid) == []
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
    confirmed = set()
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
    assert get_all(conn.channel(), uid) == [b"1", b"2"]
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
    headers = dict(got.headers)
    assert headers["bytes"] in (b"\x00\x01", "\x00\x01")
    headers.pop("bytes")
    expected = dict(props.headers)
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
    replies = []

    def wait(predicate, seconds=2.0):
        deadline = time.monotonic() + seconds
        while not predicate() and time.monotonic() < deadline:
            conn.process_data_events(0.05)

    ch._impl.flow(False, replies.append)
    wait(lambda: replies)
    assert replies == [False]
    ch.basic_publish("", uid, b"held")
    wait(lambda: got, 0.5)
    assert got == []
    ch._impl.flow(True, replies.append)
    wait(lambda: got)
    assert replies == [False, True]
    assert got == [b"held"]


# -- auth -----------------------------------------------------------------------------------------


def test_bad_password_refused(broker):
    with pytest.raises(ProbableAuthenticationError) as exc:
        connect(broker, "guest", "wrong")
    assert "403" in str(exc.value)
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(exc.value)


def test_unknown_user_refused(broker, uid):
    with pytest.raises(ProbableAuthenticationError) as exc:
        connect(broker, "nobody-" + uid, "x")
    assert "403" in str(exc.value)


def _user(broker, uid, perms=(".*", ".*", ".*"), vhost="/"):
    name = "u" + uid[-6:]
    assert broker.admin("add-user", name, "pw").returncode == 0
    if perms is not None:
        result = broker.admin("set-permissions", vhost, name, *perms)
        assert result.returncode == 0, result.stderr
    return name


def test_new_user_can_connect(broker, uid):
    name = _user(broker, uid)
    with connect(broker, name, "pw") as c:
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x")
        assert ch.basic_get(q, auto_ack=True)[2] == b"x"


def test_user_without_vhost_permissions(broker, uid):
    name = _user(broker, uid, perms=None)
    with pytest.raises(ProbableAccessDeniedError) as exc:
        connect(broker, name, "pw")
    assert "530" in str(exc.value)
    assert f"NOT_ALLOWED - access to vhost '/' refused for user '{name}'" in str(exc.value)


def test_unknown_vhost(broker, uid):
    with pytest.raises(ProbableAccessDeniedError) as exc:
        connect(broker, vhost="nope-" + uid)
    assert "530" in str(exc.value)
    assert f"NOT_ALLOWED - vhost nope-{uid} not found" in str(exc.value)


def test_other_vhost_is_isolated(broker, uid):
    vhost = "vh-" + uid
    assert broker.admin("add-vhost", vhost).returncode == 0
    assert broker.admin("set-permissions", vhost, "guest", ".*", ".*", ".*").returncode == 0
    with connect(broker, vhost=vhost) as c:
        ch = c.channel()
        ch.queue_declare(uid)
        ch.exchange_declare("amq.direct", passive=True)
    with connect(broker) as c:
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_declare(uid, passive=True)
        channel_closed(exc, 404, f"NOT_FOUND - no queue '{uid}' in {V}")


def test_permission_regexes(broker, uid):
    # configure: only ok-*, write: ok-* and the amq.direct exchange, read: ok-* and amq.direct
    name = _user(broker, uid, perms=("^ok-", "^(ok-.*|amq\\.direct)$", "^(ok-.*|amq\\.direct)$"))
    refused = "ACCESS_REFUSED - access to {kind} '{res}' in vhost '/' refused for user '%s'" % name
    with connect(broker, name, "pw") as c:
        ch = c.channel()
        ok_q = "ok-" + uid
        ch.queue_declare(ok_q, auto_delete=True, exclusive=True)
        ch.queue_bind(ok_q, "amq.direct", "k")
        ch.basic_publish("amq.direct", "k", b"x")
        ch.basic_consume(ok_q, lambda *a: None)

        # configure refused on a queue
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_declare("no-" + uid)
        channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
        # configure refused on an exchange
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().exchange_declare("no-" + uid, "direct")
        channel_closed(exc, 403, refused.format(kind="exchange", res="no-" + uid))
        # write refused on an exchange (publish)
        c2 = c.channel()
        closed = AsyncClose(c2)
        c2.basic_publish("amq.fanout", "k", b"x")
        closed.wait(403, refused.format(kind="exchange", res="amq.fanout"))
        # read refused on an exchange (bind source)
        with pytest.raises(ChannelClosedByBroker) as exc:
            c.channel().queue_bind(ok_q, "amq.topic", "k")
        channel_closed(exc, 403, refused.format(kind="exchange", res="amq.topic"))
        # write on the default exchange is refused (amq.default does not match)
        c3 = c.channel()
        closed = AsyncClose(c3)
        c3.basic_publish("", ok_q, b"x")
        closed.wait(403, refused.format(kind="exchange", res="amq.default"))

    # read refused on a queue (consume / get), write refused on a queue (bind)
    assert broker.admin("set-permissions", "/", name, ".*", "^ok-", "^ok-").returncode == 0
    with connect(broker) as admin:
        admin.channel().queue_declare("no-" + uid)
    try:
        with connect(broker, name, "pw") as c:
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().basic_get("no-" + uid)
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().basic_consume("no-" + uid, lambda *a: None)
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().queue_bind("no-" + uid, "ok-x", "k")
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
            with pytest.raises(ChannelClosedByBroker) as exc:
                c.channel().queue_purge("no-" + uid)
            channel_closed(exc, 403, refused.format(kind="queue", res="no-" + uid))
    finally:
        with connect(broker) as admin:
            admin.channel().queue_delete("no-" + uid)


# -- isolation ------------------------------------------------------------------------------------


def test_channel_error_does_not_disturb_other_connection(broker, uid):
    with connect(broker) as good, connect(broker) as bad:
        gch = good.channel()
        gch.queue_declare(uid)
        got = []
        gch.basic_consume(uid, lambda c, m, p, b: got.append(b), auto_ack=True)
        bch = bad.channel()
        with pytest.raises(ChannelClosedByBroker):
            bch.queue_declare(uid + "-missing", passive=True)
        bad.channel().basic_publish("", uid, b"after-error")
        with pytest.raises(ConnectionClosedByBroker):
            bad.channel().exchange_declare(uid + "-x", "bogus-type")
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            good.process_data_events(0.05)
        assert got == [b"after-error"]
        assert good.is_open and gch.is_open
        gch.queue_delete(uid)


def test_channel_error_does_not_disturb_other_channel(conn, uid):
    good = conn.channel()
    good.queue_declare(uid)
    with pytest.raises(ChannelClosedByBroker):
        conn.channel().queue_declare(uid + "-missing", passive=True)
    good.basic_publish("", uid, b"x")
    assert good.basic_get(uid, auto_ack=True)[2] == b"x"
    good.queue_delete(uid)
