"""Sender-selected distribution through pika: the CC and BCC headers add routing keys (RabbitMQ's
extension, docs "Sender-selected Distribution"); BCC never reaches a consumer."""
from __future__ import annotations

import time
from functools import partial

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from support import assert_error, call, q
import support

drain = partial(support.drain, keep=lambda got: (got.body, got.properties.headers))

pytestmark = pytest.mark.timeout(30)


def bound_queues(ch, exchange: str, kind: str, bindings: dict[str, str]) -> dict[str, str]:
    """Declare ``exchange`` and one exclusive queue per label, bound with its key; label -> queue name."""
    ch.exchange_declare(exchange, kind, auto_delete=True)
    names = {}
    for label, key in bindings.items():
        names[label] = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(names[label], exchange, key)
    return names


def publish(ch, exchange: str, key: str, headers: dict, body: bytes = b"m", **kwargs) -> None:
    """One message with these headers (the CC and BCC lists)."""
    support.publish(ch, key, [body], exchange, headers=headers, **kwargs)


def test_direct_cc_and_bcc_route_and_bcc_is_stripped(ch, uid):
    q = bound_queues(ch, uid, "direct", {"to": "k.to", "cc": "k.cc", "bcc": "k.bcc", "other": "k.other"})
    publish(ch, uid, "k.to", {"CC": ["k.cc"], "BCC": ["k.bcc"], "app": "x", "n": 7}, content_type="text/plain")
    expected = [(b"m", {"CC": ["k.cc"], "app": "x", "n": 7})]
    assert drain(ch, q["to"]) == expected
    assert drain(ch, q["cc"]) == expected
    assert drain(ch, q["bcc"]) == expected
    assert drain(ch, q["other"]) == []


def test_each_queue_gets_one_copy(ch, uid):
    q = bound_queues(ch, uid, "direct", {"a": "a", "a2": "a", "b": "b"})
    publish(ch, uid, "a", {"CC": ["a", "b", "b"], "BCC": ["a", "b"]})
    assert [len(drain(ch, q[label])) for label in ("a", "a2", "b")] == [1, 1, 1]


def test_topic_exchange_matches_every_key(ch, uid):
    q = bound_queues(ch, uid, "topic", {"eu": "orders.eu.*", "us": "orders.us.#", "audit": "audit.#", "no": "x.*"})
    publish(ch, uid, "orders.eu.new", {"BCC": ["audit.orders"], "CC": ["orders.us.west.new"]})
    assert [len(drain(ch, q[label])) for label in ("eu", "us", "audit", "no")] == [1, 1, 1, 0]


def test_default_exchange_cc_names_queues(ch):
    first = ch.queue_declare("", exclusive=True).method.queue
    second = ch.queue_declare("", exclusive=True).method.queue
    publish(ch, "", first, {"BCC": [second]})
    assert drain(ch, first) == [(b"m", {})] and drain(ch, second) == [(b"m", {})]


def test_only_string_elements_are_keys(ch, uid):
    q = bound_queues(ch, uid, "direct", {"cc": "k.cc", "seven": "7"})
    publish(ch, uid, "nowhere", {"CC": [7, {"k": "k.cc"}, "k.cc", True]})
    assert len(drain(ch, q["cc"])) == 1
    assert drain(ch, q["seven"]) == []


def test_case_sensitive_and_absent_headers_change_nothing(ch, uid):
    q = bound_queues(ch, uid, "direct", {"to": "to", "cc": "cc"})
    publish(ch, uid, "to", {"cc": ["cc"], "Bcc": ["cc"]})
    assert drain(ch, q["to"]) == [(b"m", {"cc": ["cc"], "Bcc": ["cc"]})]
    assert drain(ch, q["cc"]) == []


def test_more_distinct_keys_than_the_cap_are_refused(ch, uid):
    """1,024 distinct keys route (named again and again, each once); one more is a 406, whose message went nowhere."""
    q = bound_queues(ch, uid, "topic", {"first": "k.0", "last": "k.1023", "all": "k.#"})
    keys = [f"k.{i}" for i in range(1024)]
    publish(ch, uid, "k.0", {"CC": keys[:600] * 2, "BCC": keys[500:]})
    assert [body for body, _ in drain(ch, q["all"])] == [b"m"]
    assert len(drain(ch, q["first"])) == len(drain(ch, q["last"])) == 1
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        publish(ch, uid, "k.0", {"CC": keys[:600], "BCC": [*keys[500:], "k.1024"]}, body=b"too many")
        ch.queue_declare(q["all"], passive=True)  # a round trip to see the close
    assert excinfo.value.reply_code == 406
    assert excinfo.value.reply_text == \
        "PRECONDITION_FAILED - invalid message: more than 1024 distinct routing keys in its CC and BCC headers"
    assert drain(ch.connection.channel(), q["all"]) == []


def test_cc_that_is_not_an_array_is_refused(ch, uid):
    q = bound_queues(ch, uid, "direct", {"to": "to"})
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        publish(ch, uid, "to", {"CC": "to"})
        ch.queue_declare(q["to"], passive=True)  # a round trip to see the close
    assert excinfo.value.reply_code == 406
    assert excinfo.value.reply_text == \
        'PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"CC",longstr}'


def test_mandatory_routed_by_cc_alone_is_not_returned(ch, uid):
    q = bound_queues(ch, uid, "direct", {"cc": "k.cc"})
    ch.confirm_delivery()
    ch.basic_publish(uid, "unbound", b"via cc", pika.BasicProperties(headers={"CC": ["k.cc"]}), mandatory=True)
    with pytest.raises(UnroutableError) as excinfo:  # no key routes it: returned
        ch.basic_publish(uid, "unbound", b"lost", pika.BasicProperties(headers={"BCC": ["k.none"], "CC": ["k.x"]}),
                         mandatory=True)
    returned = excinfo.value.messages[0]
    assert (returned.method.reply_code, returned.method.reply_text, returned.body) == (312, "NO_ROUTE", b"lost")
    assert returned.properties.headers == {"CC": ["k.x"]}  # the BCC is gone from a returned message too
    assert drain(ch, q["cc"]) == [(b"via cc", {"CC": ["k.cc"]})]


def test_alternate_exchange_only_when_no_key_routes(ch, uid):
    ch.exchange_declare(f"{uid}.ae", "fanout", auto_delete=True)
    spill = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(spill, f"{uid}.ae")
    ch.exchange_declare(uid, "direct", auto_delete=True, arguments={"alternate-exchange": f"{uid}.ae"})
    cc = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(cc, uid, "k.cc")
    publish(ch, uid, "unbound", {"CC": ["k.cc"]}, body=b"routed")
    publish(ch, uid, "unbound", {"CC": ["k.none"]}, body=b"spilled")
    assert [body for body, _ in drain(ch, cc)] == [b"routed"]
    assert [body for body, _ in drain(ch, spill)] == [b"spilled"]


def test_persistent_message_is_stored_without_bcc(start_broker, uid):
    node = start_broker()
    params = pika.ConnectionParameters(node.host, node.port, socket_timeout=5, connection_attempts=1)
    with pika.BlockingConnection(params) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(uid, durable=True)
        publish(channel, "", "nowhere", {"BCC": [uid], "CC": ["x"]}, body=b"durable", delivery_mode=2)
    node.stop()
    node.start()
    with pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port, socket_timeout=5)) as connection:
        assert drain(connection.channel(), uid) == [(b"durable", {"CC": ["x"]})]


@pytest.mark.parametrize("dl_key", [None, "k.dl"])
def test_dead_letter_keeps_cc_keys(ch, uid, dl_key):
    dlx = f"{uid}.dlx"
    targets = bound_queues(ch, dlx, "direct", {"src": "k.src", "cc": "k.cc", "bcc": "k.bcc", "dl": "k.dl"})
    arguments = {"x-dead-letter-exchange": dlx, **({"x-dead-letter-routing-key": dl_key} if dl_key else {})}
    ch.exchange_declare(uid, "direct", auto_delete=True)
    source = ch.queue_declare("", exclusive=True, arguments=arguments).method.queue
    ch.queue_bind(source, uid, "k.src")
    publish(ch, uid, "k.src", {"CC": ["k.cc"], "BCC": ["k.bcc"]})
    method, _, _ = ch.basic_get(source)
    ch.basic_reject(method.delivery_tag, requeue=False)
    got = {label: drain(ch, queue) for label, queue in targets.items()}
    expected = ["dl"] if dl_key else ["src", "cc", "bcc"]  # by all its keys again, unless a routing key replaces them
    assert [label for label, messages in got.items() if messages] == expected
    for label in expected:
        [(_, headers)] = got[label]
        assert headers["x-death"][0]["routing-keys"] == ["k.src", "k.cc"]  # CC keys, never BCC ones
        assert "BCC" not in headers
        assert ("CC" in headers) is (dl_key is None)


def test_http_publish_uses_cc_and_bcc(broker, ch, uid):
    targets = bound_queues(ch, uid, "topic", {"to": "k.to", "cc": "k.cc", "bcc": "k.*.bcc"})
    body = {"routing_key": "k.to", "payload": "via http", "payload_encoding": "string",
            "properties": {"headers": {"CC": ["k.cc"], "BCC": ["k.x.bcc"]}}}
    assert call(broker, "POST", f"/api/exchanges/%2F/{q(uid)}/publish", body).json == {"routed": True}
    assert [drain(ch, targets[label]) for label in ("to", "cc", "bcc")] == [[(b"via http", {"CC": ["k.cc"]})]] * 3
    body = dict(body, routing_key="unbound", properties={"headers": {"BCC": ["k.cc"]}})
    assert call(broker, "POST", f"/api/exchanges/%2F/{q(uid)}/publish", body).json == {"routed": True}
    body["properties"] = {"headers": {"BCC": "k.cc"}}
    assert "unacceptable_type_in_header" in assert_error(
        call(broker, "POST", f"/api/exchanges/%2F/{q(uid)}/publish", body), 400)["reason"]


@pytest.mark.parametrize("header", ["CC", "BCC"])
def test_a_key_longer_than_a_routing_key_is_refused(ch, uid, header):
    """Each CC/BCC key is bounded as the routing key is (255 bytes): a topic binding of 100 '#' words against one
    40 KB key held the node for seconds per message."""
    q = bound_queues(ch, uid, "topic", {"hashes": ".".join(["#"] * 100), "to": "to"})
    started = time.monotonic()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        publish(ch, uid, "to", {header: ["ok", "a." * 20_000]})
        ch.queue_declare(q["to"], passive=True)
    assert time.monotonic() - started < 1
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, f'PRECONDITION_FAILED - invalid message: {{value_too_long,"{header}",40000}}')
    ch = ch.connection.channel()
    assert [ch.queue_declare(name, passive=True).method.message_count for name in q.values()] == [0, 0]
    publish(ch, uid, "to", {header: ["é" * 127]})  # 254 bytes: a routing key's size
    assert [len(drain(ch, q[label])) for label in ("hashes", "to")] == [1, 1]


def test_http_publish_refuses_a_long_key(broker, uid):
    body = {"routing_key": "k", "payload": "x", "payload_encoding": "string",
            "properties": {"headers": {"BCC": ["k" * 256]}}}
    assert assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.topic/publish", body), 400)["reason"] == \
        '406 PRECONDITION_FAILED - invalid message: {value_too_long,"BCC",256}'


@pytest.mark.parametrize("header", ["CC", "BCC"])
def test_keys_are_checked_against_the_topic_permission(broker, uid, header):
    """A CC or BCC key goes through the publisher's topic permission as the routing key does: a key the write
    pattern refuses closes the channel (403) and nothing is delivered, to any queue.  (RabbitMQ 3.10 let such keys
    past; later versions check every key, as here.)"""
    user = f"{uid}.user"
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": "management"}).status == 201
    try:
        assert call(broker, "PUT", f"/api/permissions/%2F/{q(user)}",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
        assert call(broker, "PUT", f"/api/topic-permissions/%2F/{q(user)}",
                    {"exchange": "amq.topic", "write": "^a\\.", "read": ".*"}).status == 201
        admin = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
        observer = admin.channel()
        queues = {}
        for key in ("a.1", "a.2", "x.2"):
            queues[key] = f"{uid}.{key}"
            observer.queue_declare(queues[key], auto_delete=False)
            observer.queue_bind(queues[key], "amq.topic", key)
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            broker.host, broker.port, credentials=pika.PlainCredentials(user, "pw")))
        channel = connection.channel()
        channel.confirm_delivery()
        publish(channel, "amq.topic", "a.1", {header: ["a.2"]})  # allowed: both delivered
        with pytest.raises(ChannelClosedByBroker) as refused:
            publish(channel, "amq.topic", "a.1", {header: ["a.2", "x.2"]})
        assert (refused.value.reply_code, refused.value.reply_text) == (
            403, f"ACCESS_REFUSED - access to topic 'x.2' in exchange 'amq.topic' in vhost '/' refused for user "
                 f"'{user}'")
        body = {"routing_key": "a.1", "payload": "x", "payload_encoding": "string",
                "properties": {"headers": {header: ["x.2"]}}}
        assert assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.topic/publish", body, auth=(user, "pw")),
                            400)["reason"].startswith("403 ACCESS_REFUSED - access to topic 'x.2'")
        connection.close()
        assert [observer.queue_delete(queues[key]).method.message_count for key in ("a.1", "a.2", "x.2")] == \
            [1, 1, 0]
        admin.close()
    finally:
        call(broker, "DELETE", f"/api/users/{q(user)}")
