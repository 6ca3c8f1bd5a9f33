"""Federation between Warren nodes, driven as users drive RabbitMQ's: upstreams and policies over HTTP, pika
clients on both sides; an exchange federated across a loop of two nodes, an upstream killed with SIGKILL
mid-transfer under ack-mode on-confirm (nothing lost), a queue that pulls from its upstream only while it has a
consumer."""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pika
import pytest

from conftest import connect
from support import assert_error, call, publish_pipelined
from amqp_server.framing.header_table import Field
from test_shovel import depth, drain, publish_typed, typed_headers, wait_for

UPSTREAM = "/api/parameters/federation-upstream/%2F/"
N = 1000


def node_named(start_broker, name: str, **kwargs: Any):
    return start_broker("--node-name", f"{name}@localhost", **kwargs)


def uri(node) -> str:
    return f"amqp://guest:guest@127.0.0.1:{node.port}"


def federate(down, up, pattern: str, apply_to: str = "exchanges", name: str = "up",
             keys: dict[str, Any] | None = None) -> None:
    """``down`` federates what ``pattern`` matches from ``up``, with the upstream's other ``keys``."""
    response = call(down, "PUT", UPSTREAM + name, {"value": {"uri": uri(up), **(keys or {})}})
    assert response.status in (201, 204), response.raw
    response = call(down, "PUT", "/api/policies/%2F/fed", {"pattern": pattern, "apply-to": apply_to,
                                                           "definition": {"federation-upstream": name}})
    assert response.status in (201, 204), response.raw


def links(node) -> list[dict[str, Any]]:
    return call(node, "GET", "/api/federation-links").json or []


def running(node, count: int = 1) -> list[dict[str, Any]]:
    return wait_for(lambda: (lambda found: found if len(found) == count and all(
        link["status"] == "running" for link in found) else None)(links(node)), what=f"{count} running link(s)")


def declare(node, exchange: str, queue: str, key: str, kind: str = "topic") -> None:
    connection = connect(node)
    channel = connection.channel()
    channel.exchange_declare(exchange, kind, durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, key)
    connection.close()


def publish(node, exchange: str, keys: list[str]) -> None:
    """Message i to ``exchange`` with routing key keys[i], confirmed."""
    start = 0
    for key, run in itertools.groupby(keys):
        count = len(list(run))
        publish_pipelined(node, key, [str(i) for i in range(start, start + count)], exchange, user_id="guest")
        start += count


def settled(node, queue: str, count: int, what: str) -> None:
    """``queue`` reaches ``count`` messages and stays there (no late copies)."""
    wait_for(lambda: depth(node, queue) >= count, what=what)
    time.sleep(1.5)
    assert depth(node, queue) == count, (what, depth(node, queue))


def test_an_exchange_federated_from_another_node_gets_every_message_bound_here(start_broker):
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    declare(down, "fed.x", "here", "a.#")
    federate(down, up, r"^fed\.", keys={"expires": 60000, "message-ttl": 30000})
    link, = running(down)
    assert link["exchange"] == link["upstream_exchange"] == "fed.x" and link["type"] == "exchange"
    assert link["vhost"] == "/" and link["upstream"] == "up" and link["node"] == "down@localhost"
    assert link["uri"] == f"amqp://127.0.0.1:{up.port}" and "guest" not in link["uri"]
    assert link["local_connection"] == "Federation link (upstream: up, policy: fed)" and link["id"]
    # what the link made upstream, named and declared as RabbitMQ's link does
    queue = call(up, "GET", "/api/queues/%2F/" + "federation%3A%20fed.x%20-%3E%20down%40localhost").json
    assert queue["durable"] and queue["arguments"] == {"x-expires": 60000, "x-message-ttl": 30000,
                                                       "x-internal-purpose": "federation"}
    exchange = call(up, "GET", "/api/exchanges/%2F/" + "federation%3A%20fed.x%20-%3E%20down%40localhost%20B").json
    assert exchange["type"] == "x-federation-upstream" and exchange["internal"] and exchange["auto_delete"]
    assert exchange["arguments"]["x-max-hops"] == 1 and exchange["arguments"]["x-downstream-name"] == "down@localhost"
    wait_for(lambda: [b["routing_key"] for b in call(up, "GET", "/api/exchanges/%2F/fed.x/bindings/source").json]
             == ["a.#"], what="the binding made upstream")
    publish(up, "fed.x", ["a.b"] * N + ["z.z"] * 10)
    settled(down, "here", N, "every message bound here")
    got = drain(down, "here")
    assert sorted(int(body) for body, _ in got) == list(range(N))
    _, properties = got[0]
    hop, = properties.headers["x-received-from"]
    assert hop == {"uri": f"amqp://127.0.0.1:{up.port}", "exchange": "fed.x", "redelivered": False,
                   "cluster-name": "up@localhost", "vhost": "/"}
    assert properties.user_id is None  # trust-user-id false: cleared, as RabbitMQ's link does


def test_an_x_received_from_that_is_not_an_array_is_kept_in_x_invalid_headers(start_broker):
    """rabbit_federation_exchange_link:update_routing_headers -> rabbit_basic:prepend_table_header: the message's
    x-received-from that is no array is kept under x-invalid-headers, and its other headers keep their types."""
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    declare(down, "fed.i", "here", "#")
    federate(down, up, r"^fed\.")
    running(down)
    wait_for(lambda: call(up, "GET", "/api/exchanges/%2F/fed.i/bindings/source").json, what="the binding upstream")
    publish_typed(up, "k", {"x-received-from": Field("S", "bogus"), "small": Field("l", 5)}, exchange="fed.i")
    wait_for(lambda: depth(down, "here") == 1, what="moved")
    headers = typed_headers(down, "here")
    assert headers["small"] == Field("l", 5)
    assert headers["x-received-from"].kind == "A" and len(headers["x-received-from"].value) == 1, headers
    assert headers["x-invalid-headers"] == Field("F", {"x-received-from": Field("A", [Field("S", "bogus")])})


def test_binding_changes_here_are_followed_upstream(start_broker):
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    declare(down, "fed.b", "here", "a.#")
    federate(down, up, r"^fed\.")
    running(down)

    def upstream_keys() -> list[str]:
        return sorted(b["routing_key"] for b in call(up, "GET", "/api/exchanges/%2F/fed.b/bindings/source").json)

    connection = connect(down)
    channel = connection.channel()
    channel.queue_bind("here", "fed.b", "b.*")
    channel.queue_declare("there", durable=True)
    channel.queue_bind("there", "fed.b", "b.*")  # the same key again: one binding upstream
    wait_for(lambda: upstream_keys() == ["a.#", "b.*"], what="the new binding upstream")
    channel.queue_unbind("here", "fed.b", "a.#")
    wait_for(lambda: upstream_keys() == ["b.*"], what="the binding gone upstream")
    channel.queue_unbind("there", "fed.b", "b.*")
    time.sleep(0.5)
    assert upstream_keys() == ["b.*"]  # "here" still binds it
    connection.close()
    publish(up, "fed.b", ["a.x"] * 5 + ["b.y"] * 7)
    settled(down, "here", 7, "the messages of the keys bound here")
    assert depth(down, "there") == 0


@pytest.mark.parametrize("max_hops", [1, 3])
def test_a_loop_of_two_nodes_delivers_each_message_once_per_node(start_broker, max_hops):
    a, b = node_named(start_broker, "a"), node_named(start_broker, "b")
    for node in (a, b):
        declare(node, "loop.x", "all", "#")
    federate(a, b, r"^loop\.", keys={"max-hops": max_hops})
    federate(b, a, r"^loop\.", keys={"max-hops": max_hops})
    running(a)
    running(b)
    wait_for(lambda: all(len(call(n, "GET", "/api/exchanges/%2F/loop.x/bindings/source").json) == 2
                         for n in (a, b)), what="both links bound")
    publish(a, "loop.x", ["k"] * 300)
    publish(b, "loop.x", ["k"] * 200)
    for node in (a, b):
        settled(node, "all", 500, "each message once")
        hops = [len((properties.headers or {}).get("x-received-from", [])) for _, properties in drain(node, "all")]
        assert sorted(hops) == [0] * (300 if node is a else 200) + [1] * (200 if node is a else 300)


def test_an_upstream_killed_mid_transfer_loses_nothing_under_on_confirm(start_broker):
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    declare(down, "fed.k", "here", "#")
    # a backlog in the upstream queue (as if published while the link was away), durable on the upstream's disk
    queue, count = "federation: fed.k -> down@localhost", 20000
    connection = connect(up)
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-internal-purpose": "federation"})
    for i in range(count - 1):
        channel.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    channel.confirm_delivery()  # the last one confirmed: stored, after all before it
    channel.basic_publish("", queue, str(count - 1).encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    wait_for(lambda: depth(up, queue) == count, what="the backlog upstream")
    federate(down, up, r"^fed\.", keys={"reconnect-delay": 1, "prefetch-count": 50})
    wait_for(lambda: depth(down, "here") > 0, what="the transfer under way")
    assert depth(down, "here") < count, "the transfer ended before the kill"
    up.kill()
    up = node_named(start_broker, "up", data_dir=up.data_dir, port=up.port)
    wait_for(lambda: depth(up, queue) == 0 and depth(down, "here") >= count, timeout=120,
             what="every message moved")
    bodies = {int(body) for body, _ in drain(down, "here")}
    assert bodies == set(range(count)), f"lost: {sorted(set(range(count)) - bodies)[:20]}"
    running(down)


def test_a_link_whose_upstream_exchange_was_deleted_makes_it_anew(start_broker):
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    declare(down, "fed.d", "here", "#")
    federate(down, up, r"^fed\.")
    running(down)
    exchange = "federation%3A%20fed.d%20-%3E%20down%40localhost%20"
    wait_for(lambda: call(up, "GET", f"/api/exchanges/%2F/{exchange}B").status == 200, what="the upstream exchange")
    assert call(up, "DELETE", f"/api/exchanges/%2F/{exchange}B").status == 204
    wait_for(lambda: call(up, "GET", f"/api/exchanges/%2F/{exchange}A").status == 200, timeout=30,
             what="the link to find it gone and start again")
    running(down)
    publish(up, "fed.d", ["k"] * 10)
    settled(down, "here", 10, "messages through the new upstream exchange")


def test_an_exchange_link_restarted_with_its_node_leaves_no_gap_upstream(start_broker):
    """The link's active suffix outlives its node (RabbitMQ keeps it with the federated exchange,
    rabbit_federation_db): started again, the link binds the other upstream exchange before it deletes the one it
    used, so the upstream exchange routes to the link's queue throughout and nothing published upstream is
    unroutable."""
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    declare(down, "fed.r", "here", "#")
    federate(down, up, r"^fed\.", keys={"reconnect-delay": 1})
    running(down)
    exchange = "federation%3A%20fed.r%20-%3E%20down%40localhost%20"
    wait_for(lambda: call(up, "GET", f"/api/exchanges/%2F/{exchange}B").status == 200, what="the upstream exchange")
    returned: list[bytes] = []
    published = [0]
    stop = threading.Event()

    def publisher() -> None:
        connection = connect(up)
        channel = connection.channel()
        channel.add_on_return_callback(lambda _ch, _method, _props, body: returned.append(body))
        while not stop.is_set():
            channel.basic_publish("fed.r", "k", str(published[0]).encode(), mandatory=True)
            published[0] += 1
            connection.process_data_events(time_limit=0.001)
        connection.process_data_events(time_limit=0.5)
        connection.close()

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        time.sleep(0.5)
        down.stop()
        time.sleep(0.5)
        down = node_named(start_broker, "down", data_dir=down.data_dir, port=down.port)
        running(down)
        wait_for(lambda: call(up, "GET", f"/api/exchanges/%2F/{exchange}A").status == 200, what="the other one")
        time.sleep(1)
    finally:
        stop.set()
        thread.join()
    assert published[0] > 100
    assert call(up, "GET", f"/api/exchanges/%2F/{exchange}B").status == 404  # (the one used before, deleted)
    assert returned == [], f"{len(returned)} of {published[0]} published upstream during the restart were unroutable"


def test_removing_the_policy_stops_the_link_and_cleans_up_upstream(start_broker):
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    declare(down, "fed.c", "here", "#")
    federate(down, up, r"^fed\.")
    running(down)
    name = "federation%3A%20fed.c%20-%3E%20down%40localhost"
    wait_for(lambda: call(up, "GET", f"/api/queues/%2F/{name}").status == 200, what="the upstream queue")
    assert call(down, "DELETE", "/api/policies/%2F/fed").status == 204
    wait_for(lambda: not links(down), what="the link gone")
    wait_for(lambda: call(up, "GET", f"/api/queues/%2F/{name}").status == 404, what="the upstream queue gone")
    assert not [x for x in call(up, "GET", "/api/exchanges/%2F").json if x["name"].startswith("federation:")]
    assert call(up, "GET", "/api/exchanges/%2F/fed.c/bindings/source").json == []
    # and an upstream that goes takes its links with it
    federate(down, up, r"^fed\.")
    running(down)
    assert call(down, "DELETE", UPSTREAM + "up").status == 204
    wait_for(lambda: not links(down), what="the link gone with its upstream")
    wait_for(lambda: call(up, "GET", f"/api/queues/%2F/{name}").status == 404, what="the upstream queue gone")


def test_a_federated_queue_pulls_from_its_upstream_only_while_it_has_a_consumer(start_broker):
    up, down = node_named(start_broker, "up"), node_named(start_broker, "down")
    for node in (up, down):
        connect(node).channel().queue_declare("work", durable=True)
    connection = connect(up)
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(100):
        channel.basic_publish("", "work", str(i).encode())
    connection.close()
    federate(down, up, "^work$", apply_to="queues")
    link, = running(down)
    assert link["type"] == "queue" and link["queue"] == link["upstream_queue"] == "work"
    assert link["consumer_tag"] == "federation-link-up"
    time.sleep(1.5)
    assert depth(up, "work") == 100 and depth(down, "work") == 0  # no consumer here: nothing moves
    connection = connect(down)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    got: list[bytes] = []

    def on_message(ch, method, properties, body):
        got.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(got) == 1:
            assert properties.headers["x-received-from"][0]["queue"] == "work"
            assert properties.headers["x-original-routing-key"] == "work"
    tag = channel.basic_consume("work", on_message)
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)
    assert sorted(int(body) for body in got) == list(range(100))
    channel.basic_cancel(tag)
    time.sleep(1)  # the link sees no consumer here and stops pulling
    publish_up = connect(up)
    ch = publish_up.channel()
    ch.confirm_delivery()
    for _ in range(20):
        ch.basic_publish("", "work", b"later")
    publish_up.close()
    time.sleep(1.5)
    assert depth(up, "work") == 20 and depth(down, "work") == 0
    connection.close()


def test_upstreams_are_validated_as_rabbitmq_validates_them(start_broker):
    node = start_broker()
    cases = [
        ({"exchange": "x"}, 'Key "uri" not found in bad'),
        ({"uri": "http://x"}, '"http://x" not a valid URI: {unexpected_uri_scheme,"http"}'),
        ({"uri": "amqp://x", "ack-mode": "sometimes"},
         "ack-mode should be one of [no-ack,on-publish,on-confirm], actually was <<\"sometimes\">>"),
        ({"uri": "amqp://x", "max-hops": "2"}, 'max-hops should be a number, actually was <<"2">>'),
        ({"uri": "amqp://x", "prefetch-count": 70000}, "prefetch-count should be from 0 to 65535"),
        ({"uri": "amqp://x", "colour": "red"}, 'Unrecognised terms [{<<"colour">>,<<"red">>}] in bad'),
    ]
    for value, reason in cases:
        body = assert_error(call(node, "PUT", UPSTREAM + "bad", {"value": value}), 400)
        assert reason in body["reason"], (value, body["reason"])
    body = assert_error(call(node, "PUT", "/api/parameters/federation-upstream-set/%2F/s",
                             {"value": [{"exchange": "x"}]}), 400)
    assert 'Key "upstream" not found in s' in body["reason"]
    assert call(node, "PUT", "/api/parameters/federation-upstream-set/%2F/s",
                {"value": [{"upstream": "a"}, {"upstream": "b", "max-hops": 2}]}).status == 201
    both = {"pattern": ".*", "definition": {"federation-upstream": "a", "federation-upstream-set": "all"}}
    body = assert_error(call(node, "PUT", "/api/policies/%2F/both", both), 400)
    assert "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern" in \
        body["reason"]
    body = assert_error(call(node, "PUT", "/api/policies/%2F/n", {"pattern": ".*",
                                                                  "definition": {"federation-upstream": 5}}), 400)
    assert "5 is not a valid federation upstream name" in body["reason"]


def test_setting_upstreams_takes_policymaker_and_passwords_are_shown_to_administrators_only(start_broker):
    node = start_broker()
    for user, tags in (("watcher", "monitoring"), ("maker", "policymaker")):
        assert call(node, "PUT", f"/api/users/{user}", {"password": "pw", "tags": tags}).status == 201
        assert call(node, "PUT", f"/api/permissions/%2F/{user}",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    value = {"value": {"uri": ["amqp://user:secret@remote:5673/v", "amqp://other"]}}
    assert_error(call(node, "PUT", UPSTREAM + "u", value, auth=("watcher", "pw")), 401)
    assert call(node, "PUT", UPSTREAM + "u", value, auth=("maker", "pw")).status == 201
    shown = call(node, "GET", UPSTREAM + "u", auth=("maker", "pw")).json
    assert shown["value"]["uri"] == ["amqp://remote:5673/v", "amqp://other"]
    assert call(node, "GET", UPSTREAM + "u").json["value"]["uri"][0] == "amqp://user:secret@remote:5673/v"
    exported = call(node, "GET", "/api/definitions").json
    assert {"vhost": "/", "component": "federation-upstream", "name": "u", "value": value["value"]} \
        in exported["parameters"]
    assert call(node, "DELETE", UPSTREAM + "u").status == 204
    policy = {"vhost": "/", "name": "p", "pattern": "^f", "apply-to": "all", "priority": 0,
              "definition": {"federation-upstream-set": "all"}}
    response = call(node, "POST", "/api/definitions", {"parameters": exported["parameters"], "policies": [policy]})
    assert response.status == 204, response.raw  # nothing skipped
    assert call(node, "GET", UPSTREAM + "u").json["value"] == value["value"]
    assert call(node, "GET", "/api/policies/%2F/p").json["definition"] == {"federation-upstream-set": "all"}
    assert call(node, "GET", "/api/federation-links", auth=("watcher", "pw")).status == 200


def test_warren_is_an_upstream_rabbitmq_federation_can_use(broker):
    """RabbitMQ's link declares an x-federation-upstream exchange upstream: it drops what went round a loop."""
    connection = connect(broker)
    channel = connection.channel()
    channel.exchange_declare("xfu-src", "fanout")
    arguments = {"x-max-hops": 1, "x-downstream-name": "elsewhere", "x-downstream-vhost": "/",
                 "x-internal-purpose": "federation"}
    channel.exchange_declare("xfu-int", "x-federation-upstream", durable=True, internal=True, auto_delete=True,
                             arguments=arguments)
    result = channel.queue_declare("", exclusive=True)
    channel.queue_bind(result.method.queue, "xfu-int")
    channel.exchange_bind("xfu-int", "xfu-src")
    seen = {"uri": "amqp://elsewhere", "exchange": "xfu-src", "cluster-name": "elsewhere", "vhost": "/"}
    other = {"uri": "amqp://third", "exchange": "xfu-src", "cluster-name": "third", "vhost": "/"}
    sent: list[tuple[bytes, dict[str, Any] | None]] = [
        (b"new", None), (b"looped", {"x-received-from": [seen]}), (b"one hop", {"x-received-from": [other]})]
    for body, headers in sent:
        channel.basic_publish("xfu-src", "", body, pika.BasicProperties(headers=headers))
    time.sleep(0.3)
    method, _, got = channel.basic_get(result.method.queue, auto_ack=True)
    assert got == b"new"
    assert channel.basic_get(result.method.queue, auto_ack=True)[0] is None  # max-hops 1 and a loop: dropped
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.exchange_declare("xfu-bad", "x-federation-upstream")
    assert refused.value.reply_code == 406 and "x-max-hops missing" in refused.value.reply_text
    connection.close()
