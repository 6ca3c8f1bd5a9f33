"""Exchanges through pika: declare, delete, bind, and routing by each type, checked against RabbitMQ 3.10.

Reply codes and reply texts follow rabbit_channel and rabbit_exchange."""
from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from support import AsyncClose, channel_closed, drain

pytestmark = pytest.mark.timeout(20)

V = "vhost '/'"


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
    assert drain(ch, q) == [b"hit"]
    ch.exchange_unbind(uid + "-mid", uid + "-src", "a.*")
    ch.basic_publish(uid + "-src", "a.b", b"gone")
    assert drain(ch, q) == []
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
    assert drain(ch, qm) == [b"routed"]
    assert drain(ch, qa) == [b"alternate"]
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
    assert drain(ch, q) == [b"x"]
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
    assert drain(ch, q1) == [b"only-q1", b"both"]
    assert drain(ch, q2) == [b"both"]


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
        assert drain(ch, q) == [b"all"]
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
    assert drain(ch, q) == ([b"m"] if match else [])
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
    assert drain(ch, qall) == [b"both"]
    assert drain(ch, qany) == [b"both", b"one"]
    ch.queue_unbind(qall, "amq.headers", arguments={"x-match": "all", "a": 1, "b": "two"})
    ch.queue_unbind(qany, "amq.headers", arguments={"x-match": "any", "a": 1, "b": "two"})
