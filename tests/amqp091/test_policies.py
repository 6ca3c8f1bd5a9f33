"""Policies and operator policies as RabbitMQ applies them: set over HTTP, seen through AMQP (pika).

Each test works in a vhost of its own on the shared node, so a ``.*`` policy touches nothing else.
"""
from __future__ import annotations

import time

import pika
import pytest

from support import assert_error, call, headers_of, numbered, publish, q
from test_mgmt_api import amqp


@pytest.fixture
def vhost(broker, uid: str):
    name = f"pol-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(name)}").status == 201
    yield name
    call(broker, "DELETE", f"/api/vhosts/{q(name)}")


def set_policy(broker, vhost: str, name: str, pattern: str, definition: dict, priority: int = 0,
               apply_to: str = "all", kind: str = "policies") -> int:
    response = call(broker, "PUT", f"/api/{kind}/{q(vhost)}/{q(name)}",
                    {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to})
    assert response.status in (201, 204), response.raw
    return response.status


def queue_json(broker, vhost: str, name: str) -> dict:
    response = call(broker, "GET", f"/api/queues/{q(vhost)}/{q(name)}")
    assert response.status == 200, response.raw
    return response.json


def depth(channel, name: str) -> int:
    return channel.queue_declare(name, passive=True).method.message_count


def fanout_to(channel, exchange: str, queue: str) -> None:
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange)


def test_crud_and_listing(broker, vhost: str) -> None:
    base = f"/api/policies/{q(vhost)}"
    assert set_policy(broker, vhost, "limit", "^orders\\.", {"max-length": 2}, 1, "queues") == 201
    assert set_policy(broker, vhost, "limit", "^orders\\.", {"max-length": 3}, 1, "queues") == 204
    shown = call(broker, "GET", f"{base}/limit").json
    assert shown == {"vhost": vhost, "name": "limit", "pattern": "^orders\\.", "apply-to": "queues",
                     "definition": {"max-length": 3}, "priority": 1}
    defaults = call(broker, "PUT", f"{base}/plain", {"pattern": "zzz", "definition": {"expires": 1000}})
    assert defaults.status == 201
    assert call(broker, "GET", f"{base}/plain").json["apply-to"] == "all"
    assert call(broker, "GET", f"{base}/plain").json["priority"] == 0
    assert [p["name"] for p in call(broker, "GET", base).json] == ["plain", "limit"]  # by priority
    assert {"limit", "plain"} <= {p["name"] for p in call(broker, "GET", "/api/policies").json}
    assert call(broker, "DELETE", f"{base}/plain").status == 204
    assert_error(call(broker, "DELETE", f"{base}/plain"), 404)
    assert_error(call(broker, "GET", f"{base}/plain"), 404)
    assert_error(call(broker, "GET", "/api/policies/no-such-vhost"), 404)
    assert call(broker, "GET", f"/api/operator-policies/{q(vhost)}").json == []


@pytest.mark.parametrize(("kind", "body", "reason"), [
    ("policies", {"pattern": ".*", "definition": {"max-priority": 5}},
     'Validation failed\n\n[{&lt;&lt;"max-priority"&gt;&gt;,5}] are not recognised policy settings\n'),
    ("policies", {"pattern": ".*", "definition": {"max-length": -1}},
     "Validation failed\n\n-1 is not a valid maximum length\n"),
    ("policies", {"pattern": ".*", "definition": {"expires": 0}},
     "Validation failed\n\n0 is not a valid queue expiry\n"),
    ("policies", {"pattern": ".*", "definition": {"overflow": "drop-tail"}},
     'Validation failed\n\n&lt;&lt;"drop-tail"&gt;&gt; is not a valid overflow value\n'),
    ("policies", {"pattern": ".*", "definition": {}}, "Validation failed\n\nno policy provided\n"),
    ("policies", {"definition": {"max-length": 1}}, "[{key_missing,pattern}]"),
    ("policies", {"pattern": ".*", "definition": {"max-length": 1}, "priority": "abc"},
     'Validation failed\n\npriority should be a number, actually was &lt;&lt;"abc"&gt;&gt;\n'),
    ("operator-policies", {"pattern": ".*", "definition": {"dead-letter-exchange": "x"}},
     'Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings\n'),
    # keys without effect in Warren, checked as RabbitMQ 3.10 checks them (rabbit_policies,
    # rabbit_queue_location_validator, rabbit_mirror_queue_misc:validate_policy/1 and the ha modes')
    ("policies", {"pattern": ".*", "definition": {"queue-master-locator": "bogus"}},
     'Validation failed\n\n&lt;&lt;"bogus"&gt;&gt; invalid queue-master-locator value\n'),
    ("policies", {"pattern": ".*", "definition": {"max-segment-size-bytes": 5}},
     'Validation failed\n\n[{&lt;&lt;"max-segment-size-bytes"&gt;&gt;,5}] are not recognised policy settings\n'),
    ("policies", {"pattern": ".*", "definition": {"queue-version": True}},
     "Validation failed\n\ntrue is not a valid queue-version value\n"),
    ("policies", {"pattern": ".*", "definition": {"initial-cluster-size": -1}},
     "Validation failed\n\n-1 is not a valid cluster size\n"),
    ("policies", {"pattern": ".*", "definition": {"ha-params": 2}},
     "Validation failed\n\nha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown\n"),
    ("policies", {"pattern": ".*", "definition": {"ha-mode": "bogus"}},
     'Validation failed\n\n&lt;&lt;"bogus"&gt;&gt; is not a valid ha-mode value\n'),
    ("policies", {"pattern": ".*", "definition": {"ha-mode": "exactly"}},
     'Validation failed\n\nha-mode="exactly" takes an integer, none given\n'),
    ("policies", {"pattern": ".*", "definition": {"ha-mode": "nodes", "ha-params": ["a", 1]}},
     'Validation failed\n\nha-mode="nodes" takes a list of strings, [1] was not a string\n'),
    ("policies", {"pattern": ".*", "definition": {"ha-mode": "exactly", "ha-params": 2, "ha-sync-batch-size": True}},
     "Validation failed\n\nha-sync-batch-size takes an integer greater than 0, true given\n"),
], ids=["max-priority", "negative", "expires-zero", "overflow", "empty", "no-pattern", "priority", "operator-key",
        "master-locator", "segment-size", "queue-version", "cluster-size", "ha-params-alone", "ha-mode",
        "ha-exactly-none", "ha-nodes", "ha-batch"])
# (RabbitMQ escapes a user policy's reason for HTML: <<"x">> is &lt;&lt;"x"&gt;&gt; there, not for an operator policy)
def test_validation_errors_as_rabbitmq(broker, vhost: str, kind: str, body: dict, reason: str) -> None:
    error = assert_error(call(broker, "PUT", f"/api/{kind}/{q(vhost)}/bad", body), 400)
    assert error["reason"] == reason
    assert_error(call(broker, "GET", f"/api/{kind}/{q(vhost)}/bad"), 404)


def test_keys_of_rabbitmq_3_10_without_effect_in_warren_are_taken(broker, vhost: str) -> None:
    """A 3.10 export's queue-master-locator and ha-* policies import unchanged (rabbit_queue_location_validator
    registers queue-master-locator: min-masters, client-local, random)."""
    for locator in ("min-masters", "client-local", "random"):
        set_policy(broker, vhost, f"locate-{locator}", "zzz", {"queue-master-locator": locator})
    set_policy(broker, vhost, "mirrored", "zzz", {"ha-mode": "nodes", "ha-params": ["rabbit@a"], "ha-sync-mode":
                                                  "automatic", "ha-promote-on-failure": "when-synced"})


def test_bad_pattern_and_apply_to(broker, vhost: str) -> None:
    error = assert_error(call(broker, "PUT", f"/api/policies/{q(vhost)}/bad",
                              {"pattern": "(", "definition": {"max-length": 1}}), 400)
    assert error["reason"].startswith("Validation failed\n\npattern should be regular expression but is invalid")
    error = assert_error(call(broker, "PUT", f"/api/policies/{q(vhost)}/bad",
                              {"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "foo"}), 400)
    assert "apply-to 'foo' unrecognised" in error["reason"]
    for apply_to in ("classic_queues", "quorum_queues", "streams"):
        set_policy(broker, vhost, apply_to, "zzz", {"max-length": 1}, apply_to=apply_to)


def test_applies_to_existing_and_new_queues_and_is_cleared(broker, vhost: str) -> None:
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        channel.queue_declare("orders.old")
        channel.queue_declare("other")
        publish(channel, "orders.old", numbered(5))
        set_policy(broker, vhost, "limit", "^orders\\.", {"max-length": 2}, apply_to="queues")
        assert depth(channel, "orders.old") == 2  # drop-head applies at once
        assert channel.basic_get("orders.old", auto_ack=True)[2] == b"m3"
        channel.queue_declare("orders.new")
        publish(channel, "orders.new", numbered(4))
        publish(channel, "other", numbered(4))
        assert (depth(channel, "orders.new"), depth(channel, "other")) == (2, 4)
        info = queue_json(broker, vhost, "orders.new")
        assert (info["policy"], info["operator_policy"]) == ("limit", None)
        assert info["effective_policy_definition"] == {"max-length": 2}
        assert info["arguments"] == {}
        assert queue_json(broker, vhost, "other")["policy"] is None
        assert call(broker, "DELETE", f"/api/policies/{q(vhost)}/limit").status == 204
        publish(channel, "orders.new", numbered(4))
        assert depth(channel, "orders.new") == 6
        info = queue_json(broker, vhost, "orders.new")
        assert (info["policy"], info["effective_policy_definition"]) == (None, {})


def test_highest_priority_wins_alone(broker, vhost: str) -> None:
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        channel.queue_declare("jobs")
        set_policy(broker, vhost, "low", ".*", {"max-length": 1, "message-ttl": 60000}, priority=1)
        set_policy(broker, vhost, "high", "^jobs$", {"max-length": 3}, priority=5)
        publish(channel, "jobs", numbered(5))
        assert depth(channel, "jobs") == 3
        info = queue_json(broker, vhost, "jobs")
        assert (info["policy"], info["effective_policy_definition"]) == ("high", {"max-length": 3})
        set_policy(broker, vhost, "low", ".*", {"max-length": 1}, priority=9)
        assert depth(channel, "jobs") == 1
        assert queue_json(broker, vhost, "jobs")["policy"] == "low"
        set_policy(broker, vhost, "apply-exchanges", ".*", {"max-length": 0}, priority=99, apply_to="exchanges")
        assert queue_json(broker, vhost, "jobs")["policy"] == "low"


def test_operator_policy_lower_limit_wins(broker, vhost: str) -> None:
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        set_policy(broker, vhost, "user", ".*", {"max-length": 4, "overflow": "reject-publish"})
        set_policy(broker, vhost, "cap", ".*", {"max-length": 2, "message-ttl": 60000}, kind="operator-policies")
        channel.queue_declare("capped")
        info = queue_json(broker, vhost, "capped")
        assert (info["policy"], info["operator_policy"]) == ("user", "cap")
        assert info["effective_policy_definition"] == {"max-length": 2, "message-ttl": 60000,
                                                       "overflow": "reject-publish"}
        channel.confirm_delivery()
        publish(channel, "capped", numbered(2))
        with pytest.raises(pika.exceptions.NackError):  # reject-publish from the user policy, limit 2 from the cap
            publish(channel, "capped", numbered(1))
        assert depth(channel, "capped") == 2
        set_policy(broker, vhost, "cap", ".*", {"max-length": 10}, kind="operator-policies")
        publish(channel, "capped", numbered(2))
        assert depth(channel, "capped") == 4


def test_queue_arguments_against_policy(broker, vhost: str) -> None:
    """Lower of argument and policy for limits; the argument wins for dead-lettering and overflow."""
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        for name in ("dlx-arg", "dlx-policy"):
            fanout_to(channel, name, f"{name}-q")
        set_policy(broker, vhost, "p", "^work", {"max-length": 3, "dead-letter-exchange": "dlx-policy",
                                                  "overflow": "reject-publish"})
        channel.queue_declare("work-a", arguments={"x-max-length": 10, "x-dead-letter-exchange": "dlx-arg",
                                                   "x-overflow": "drop-head"})
        channel.queue_declare("work-b", arguments={"x-max-length": 1})
        publish(channel, "work-a", numbered(5))  # limit 3 (policy lower), drop-head (argument) to dlx-arg (argument)
        publish(channel, "work-b", numbered(5))  # limit 1 (argument lower), reject-publish (policy)
        assert (depth(channel, "work-a"), depth(channel, "work-b")) == (3, 1)
        assert (depth(channel, "dlx-arg-q"), depth(channel, "dlx-policy-q")) == (2, 0)
        assert channel.basic_get("work-b", auto_ack=True)[2] == b"m0"


def test_message_ttl_and_dead_letter_by_policy(broker, vhost: str) -> None:
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        fanout_to(channel, "dlx", "dead")
        channel.queue_declare("short")
        set_policy(broker, vhost, "ttl", "^short$", {"message-ttl": 50, "dead-letter-exchange": "dlx"})
        publish(channel, "short", numbered(3))
        deadline = time.time() + 5
        while depth(channel, "dead") < 3 and time.time() < deadline:
            connection.sleep(0.05)
        assert (depth(channel, "short"), depth(channel, "dead")) == (0, 3)
        _, properties, _ = channel.basic_get("dead", auto_ack=True)
        assert headers_of(properties)["x-death"][0]["reason"] == "expired"


def test_expires_by_policy(broker, vhost: str) -> None:
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        channel.queue_declare("idle")
        set_policy(broker, vhost, "exp", "^idle$", {"expires": 100})
        connection.sleep(0.6)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare("idle", passive=True)
        assert info.value.reply_code == 404


def test_alternate_exchange_by_policy(broker, vhost: str) -> None:
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        fanout_to(channel, "unrouted", "lost")
        fanout_to(channel, "own-ae", "own-lost")
        channel.exchange_declare("orders", "direct")
        channel.exchange_declare("orders-own", "direct", arguments={"alternate-exchange": "own-ae"})
        channel.exchange_declare("other", "direct")
        set_policy(broker, vhost, "ae", "^orders", {"alternate-exchange": "unrouted"}, apply_to="exchanges")
        shown = call(broker, "GET", f"/api/exchanges/{q(vhost)}/orders").json
        assert (shown["policy"], shown["operator_policy"], shown["effective_policy_definition"]) == (
            "ae", None, {"alternate-exchange": "unrouted"})
        channel.basic_publish("orders", "nowhere", b"a")
        channel.basic_publish("other", "nowhere", b"b")
        channel.basic_publish("orders-own", "nowhere", b"c")  # the exchange's own argument wins
        assert (depth(channel, "lost"), depth(channel, "own-lost")) == (1, 1)
        call(broker, "DELETE", f"/api/policies/{q(vhost)}/ae")
        channel.basic_publish("orders", "nowhere", b"d")
        assert depth(channel, "lost") == 1


def test_policies_survive_restart(start_broker) -> None:
    node = start_broker()
    set_policy(node, "/", "limit", "^kept$", {"max-length": 1})
    set_policy(node, "/", "cap", ".*", {"message-ttl": 60000}, kind="operator-policies")
    with amqp(node) as connection:
        connection.channel().queue_declare("kept", durable=True)
    node.stop()
    node.start()
    assert [p["name"] for p in call(node, "GET", "/api/policies/%2F").json] == ["limit"]
    with amqp(node) as connection:
        channel = connection.channel()
        publish(channel, "kept", numbered(3))
        assert depth(channel, "kept") == 1
    info = queue_json(node, "/", "kept")
    assert (info["policy"], info["operator_policy"]) == ("limit", "cap")


def test_permissions(broker, vhost: str, uid: str) -> None:
    for name, tags in ((f"pm-{uid}", "policymaker"), (f"mg-{uid}", "management")):
        assert call(broker, "PUT", f"/api/users/{q(name)}", {"password": "pw", "tags": tags}).status == 201
        call(broker, "PUT", f"/api/permissions/{q(vhost)}/{q(name)}", {"configure": ".*", "write": ".*", "read": ".*"})
    body = {"pattern": "x", "definition": {"max-length": 1}}
    assert call(broker, "PUT", f"/api/policies/{q(vhost)}/p", body, auth=(f"pm-{uid}", "pw")).status == 201
    assert_error(call(broker, "PUT", f"/api/operator-policies/{q(vhost)}/p", body, auth=(f"pm-{uid}", "pw")), 401)
    assert_error(call(broker, "PUT", f"/api/policies/{q(vhost)}/p", body, auth=(f"mg-{uid}", "pw")), 401)
    for name in (f"pm-{uid}", f"mg-{uid}"):
        call(broker, "DELETE", f"/api/users/{q(name)}")


def test_definitions_export_and_import(broker, vhost: str, uid: str) -> None:
    set_policy(broker, vhost, "limit", "^a", {"max-length": 2}, 3, "queues")
    set_policy(broker, vhost, "cap", ".*", {"max-length-bytes": 100}, kind="operator-policies")
    exported = call(broker, "GET", "/api/definitions").json
    assert {"vhost": vhost, "name": "limit", "pattern": "^a", "apply-to": "queues",
            "definition": {"max-length": 2}, "priority": 3} in exported["policies"]
    assert {"vhost": vhost, "component": "operator_policy", "name": "cap",
            "value": {"pattern": ".*", "definition": {"max-length-bytes": 100}, "priority": 0,
                      "apply-to": "all"}} in exported["parameters"]
    per_vhost = call(broker, "GET", f"/api/definitions/{q(vhost)}").json
    assert per_vhost["policies"] == [{"vhost": vhost, "name": "limit", "pattern": "^a", "apply-to": "queues",
                                      "definition": {"max-length": 2}, "priority": 3}]
    other = f"imp-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(other)}").status == 201
    try:
        per_vhost["queues"] = [{"name": "abc", "durable": True, "auto_delete": False, "arguments": {}}]
        assert call(broker, "POST", f"/api/definitions/{q(other)}", per_vhost).status == 204
        info = queue_json(broker, other, "abc")
        assert (info["policy"], info["operator_policy"]) == ("limit", "cap")
        assert info["effective_policy_definition"] == {"max-length": 2, "max-length-bytes": 100}
    finally:
        call(broker, "DELETE", f"/api/vhosts/{q(other)}")
    assert call(broker, "GET", f"/api/policies/{q(other)}/limit").status == 404  # went with the vhost
