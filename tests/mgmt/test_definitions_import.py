"""Importing a RabbitMQ definitions export: users log in with their RabbitMQ password hashes, policies apply.

EXPORT is what RabbitMQ 3.10.8 (Debian's rabbitmq-server, the management plugin) answered to
``GET /api/definitions`` after objects were made through its HTTP API: users alice (password ``s3cret``,
tag management) and bob (``hunter2``), vhost ``imported``, permissions, a topic permission, a user policy
with ``ha-mode`` (no effect in Warren), an operator policy (stored by RabbitMQ as a runtime parameter),
exchanges with an exchange-to-exchange binding, queues with arguments.  Only the indentation was changed.
"""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pika
import pytest

from support import call, q

pytestmark = pytest.mark.timeout(90)

EXPORT = json.loads(r"""
{
  "rabbit_version": "3.10.8",
  "rabbitmq_version": "3.10.8",
  "product_name": "RabbitMQ",
  "product_version": "3.10.8",
  "users": [
    {
      "name": "bob",
      "password_hash": "gVzj9VY0pGfYGNEoag5Uxo/CZqPE8qNwmcZnnoB3gPiYfCcs",
      "hashing_algorithm": "rabbit_password_hashing_sha256",
      "tags": [],
      "limits": {}
    },
    {
      "name": "alice",
      "password_hash": "2iYSpl/q4rBqZ3Xz9pQ+mnA/YGtNqPMAKVU/bqCWCv+79fnp",
      "hashing_algorithm": "rabbit_password_hashing_sha256",
      "tags": [
        "management"
      ],
      "limits": {}
    },
    {
      "name": "guest",
      "password_hash": "bnNNSY2WKZqiQ302VZlvaOJyGdmdxfMgJtzkr2ANVW+JDzMX",
      "hashing_algorithm": "rabbit_password_hashing_sha256",
      "tags": [
        "administrator"
      ],
      "limits": {}
    }
  ],
  "vhosts": [
    {
      "name": "imported"
    },
    {
      "name": "/"
    }
  ],
  "permissions": [
    {
      "user": "guest",
      "vhost": "imported",
      "configure": ".*",
      "write": ".*",
      "read": ".*"
    },
    {
      "user": "bob",
      "vhost": "/",
      "configure": "^bob",
      "write": ".*",
      "read": ".*"
    },
    {
      "user": "guest",
      "vhost": "/",
      "configure": ".*",
      "write": ".*",
      "read": ".*"
    },
    {
      "user": "alice",
      "vhost": "imported",
      "configure": ".*",
      "write": ".*",
      "read": ".*"
    }
  ],
  "topic_permissions": [
    {
      "user": "alice",
      "vhost": "imported",
      "exchange": "amq.topic",
      "write": "^a",
      "read": ".*"
    }
  ],
  "parameters": [
    {
      "value": {
        "pattern": ".*",
        "definition": {
          "max-length": 5,
          "message-ttl": 30000
        },
        "priority": 0,
        "apply-to": "queues"
      },
      "vhost": "imported",
      "component": "operator_policy",
      "name": "op-ttl"
    }
  ],
  "global_parameters": [
    {
      "name": "internal_cluster_id",
      "value": "rabbitmq-cluster-id-QYgPGfEEMruOzFocARz1GQ"
    }
  ],
  "policies": [
    {
      "vhost": "imported",
      "name": "limit-orders",
      "pattern": "^orders\\.",
      "apply-to": "queues",
      "definition": {
        "max-length": 2,
        "overflow": "reject-publish"
      },
      "priority": 1
    },
    {
      "vhost": "imported",
      "name": "mirror",
      "pattern": "^payments$",
      "apply-to": "queues",
      "definition": {
        "ha-mode": "all",
        "message-ttl": 5000
      },
      "priority": 2
    },
    {
      "vhost": "imported",
      "name": "ae",
      "pattern": "^orders$",
      "apply-to": "exchanges",
      "definition": {
        "alternate-exchange": "unrouted"
      },
      "priority": 0
    }
  ],
  "queues": [
    {
      "name": "orders.created",
      "vhost": "imported",
      "durable": true,
      "auto_delete": false,
      "arguments": {
        "x-message-ttl": 60000
      }
    },
    {
      "name": "payments",
      "vhost": "imported",
      "durable": true,
      "auto_delete": false,
      "arguments": {
        "x-dead-letter-exchange": "dlx",
        "x-max-length": 100,
        "x-queue-type": "classic"
      }
    },
    {
      "name": "orders.dlq",
      "vhost": "imported",
      "durable": true,
      "auto_delete": false,
      "arguments": {}
    }
  ],
  "exchanges": [
    {
      "name": "unrouted",
      "vhost": "imported",
      "type": "fanout",
      "durable": true,
      "auto_delete": false,
      "internal": false,
      "arguments": {}
    },
    {
      "name": "dlx",
      "vhost": "imported",
      "type": "fanout",
      "durable": true,
      "auto_delete": false,
      "internal": false,
      "arguments": {}
    },
    {
      "name": "orders",
      "vhost": "imported",
      "type": "topic",
      "durable": true,
      "auto_delete": false,
      "internal": false,
      "arguments": {}
    },
    {
      "name": "orders.audit",
      "vhost": "imported",
      "type": "headers",
      "durable": true,
      "auto_delete": false,
      "internal": true,
      "arguments": {}
    }
  ],
  "bindings": [
    {
      "source": "dlx",
      "vhost": "imported",
      "destination": "orders.dlq",
      "destination_type": "queue",
      "routing_key": "",
      "arguments": {}
    },
    {
      "source": "orders",
      "vhost": "imported",
      "destination": "orders.audit",
      "destination_type": "exchange",
      "routing_key": "order.#",
      "arguments": {}
    },
    {
      "source": "orders",
      "vhost": "imported",
      "destination": "orders.created",
      "destination_type": "queue",
      "routing_key": "order.created.#",
      "arguments": {}
    }
  ]
}
""")


def login(node, user: str, password: str, vhost: str = "imported") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, vhost, pika.PlainCredentials(user, password), connection_attempts=1))


def queue(node, name: str, vhost: str = "imported") -> dict:
    response = call(node, "GET", f"/api/queues/{q(vhost)}/{q(name)}")
    assert response.status == 200, response.raw
    return response.json


def check_imported(node) -> None:
    users = {u["name"]: u for u in call(node, "GET", "/api/users").json}
    exported = {u["name"]: u for u in EXPORT["users"]}
    for name in ("alice", "bob", "guest"):
        assert users[name]["password_hash"] == exported[name]["password_hash"]
        assert users[name]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
        assert users[name]["tags"] == exported[name]["tags"]
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(node, "alice", "wrong")
    with login(node, "alice", "s3cret") as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", "order.created.1", b"1")
        channel.basic_publish("orders", "order.created.2", b"2")
        with pytest.raises(pika.exceptions.NackError):  # max-length 2 + reject-publish from policy limit-orders
            channel.basic_publish("orders", "order.created.3", b"3")
        for i in range(7):  # max-length 5 (operator policy, lower than x-max-length 100), drop-head to dlx
            channel.basic_publish("", "payments", f"p{i}".encode())
        assert channel.queue_declare("payments", passive=True).method.message_count == 5
        assert channel.queue_declare("orders.dlq", passive=True).method.message_count == 2
        channel.queue_purge("orders.created")
        channel.queue_purge("payments")
        channel.queue_purge("orders.dlq")
    with login(node, "bob", "hunter2", "/") as connection:
        channel = connection.channel()
        channel.queue_declare("bob.jobs", auto_delete=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare("jobs")
        assert info.value.reply_code == 403
    created = queue(node, "orders.created")
    assert created["arguments"] == {"x-message-ttl": 60000}
    assert (created["policy"], created["operator_policy"]) == ("limit-orders", "op-ttl")
    assert created["effective_policy_definition"] == {"max-length": 2, "message-ttl": 30000,
                                                      "overflow": "reject-publish"}
    payments = queue(node, "payments")
    assert (payments["policy"], payments["operator_policy"]) == ("mirror", "op-ttl")
    assert payments["effective_policy_definition"] == {"ha-mode": "all", "max-length": 5, "message-ttl": 5000}
    assert call(node, "GET", "/api/exchanges/imported/orders").json["policy"] == "ae"
    bindings = call(node, "GET", "/api/bindings/imported").json
    assert {"orders.audit", "orders.created"} <= {b["destination"] for b in bindings if b["source"] == "orders"}
    assert call(node, "GET", "/api/permissions/%2F/bob").json["configure"] == "^bob"
    with login(node, "alice", "s3cret") as connection:  # her topic permission: keys starting with "a" on amq.topic
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", "a.allowed", b"1")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.basic_publish("amq.topic", "b.refused", b"2")
        assert info.value.reply_code == 403
    assert call(node, "GET", "/api/definitions").json["topic_permissions"] == EXPORT["topic_permissions"]


def test_import_rabbitmq_export(start_broker) -> None:
    node = start_broker()
    assert call(node, "POST", "/api/definitions", EXPORT).status == 204
    check_imported(node)
    exported = call(node, "GET", "/api/definitions").json
    assert sorted(p["name"] for p in exported["policies"]) == ["ae", "limit-orders", "mirror"]
    assert [p["name"] for p in exported["parameters"] if p["component"] == "operator_policy"] == ["op-ttl"]
    assert exported["global_parameters"] == EXPORT["global_parameters"]
    node.stop()
    node.start()
    check_imported(node)


def test_import_is_idempotent(start_broker) -> None:
    node = start_broker()
    for _ in range(2):
        assert call(node, "POST", "/api/definitions", EXPORT).status == 204
    assert len(call(node, "GET", "/api/policies/imported").json) == 3


@pytest.mark.parametrize("algorithm", ["rabbit_password_hashing_sha256", "rabbit_password_hashing_sha512",
                                       "rabbit_password_hashing_md5"])
def test_hashing_algorithms(start_broker, algorithm: str) -> None:
    """RabbitMQ's hash: base64(salt ++ H(salt ++ password)), 4 random salt bytes; H named by the user record."""
    node = start_broker()
    digest = {"rabbit_password_hashing_sha256": hashlib.sha256, "rabbit_password_hashing_sha512": hashlib.sha512,
              "rabbit_password_hashing_md5": hashlib.md5}[algorithm]
    salt = b"\x01\x02\x03\x04"
    password_hash = base64.b64encode(salt + digest(salt + b"pw").digest()).decode()
    body = {"users": [{"name": "carol", "password_hash": password_hash, "hashing_algorithm": algorithm,
                       "tags": []}],
            "permissions": [{"user": "carol", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}
    assert call(node, "POST", "/api/definitions", body).status == 204
    assert call(node, "GET", "/api/users/carol").json["hashing_algorithm"] == algorithm
    with login(node, "carol", "pw", "/"):
        pass
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(node, "carol", "other", "/")


def test_unknown_hashing_algorithm_is_refused(start_broker) -> None:
    node = start_broker()
    body = {"users": [{"name": "dave", "password_hash": "AAAA", "hashing_algorithm": "rabbit_password_hashing_x",
                       "tags": []}]}
    response = call(node, "POST", "/api/definitions", body)
    assert response.status == 400
    assert "rabbit_password_hashing_x" in response.json["reason"]


def test_limits_are_imported_and_exported(start_broker) -> None:
    """User limits in ``users``, vhost limits as RabbitMQ keeps them: runtime parameters of component
    ``vhost-limits``; both survive a restart and are refused as the limits API refuses them."""
    node = start_broker()
    body: dict[str, Any] = {
            "users": [{"name": "erin", "password_hash": "", "tags": [], "limits": {"max-channels": 3}}],
            "vhosts": [{"name": "limited"}],
            "parameters": [{"value": {"max-queues": 7}, "vhost": "limited", "component": "vhost-limits",
                            "name": "limits"}]}
    assert call(node, "POST", "/api/definitions", body).status == 204
    node.stop()
    node.start()
    exported = call(node, "GET", "/api/definitions").json
    assert [u["limits"] for u in exported["users"] if u["name"] == "erin"] == [{"max-channels": 3}]
    assert body["parameters"][0] in exported["parameters"]
    assert call(node, "GET", "/api/vhost-limits/limited").json == [{"vhost": "limited", "value": {"max-queues": 7}}]
    body["parameters"][0]["value"] = {"max-queues": "7"}
    assert call(node, "POST", "/api/definitions", body).status == 400


def vhost_export(vhost: str) -> dict:
    """RabbitMQ's GET /api/definitions/{vhost} for EXPORT's vhost: its policies and operator policies (vhost kept),
    its queues, exchanges and bindings without "vhost" (checked equal to RabbitMQ 3.10.8's answer)."""
    body = {"rabbit_version": EXPORT["rabbit_version"],
            "parameters": [p for p in EXPORT["parameters"] if p["vhost"] == vhost],
            "policies": [p for p in EXPORT["policies"] if p["vhost"] == vhost]}
    for key in ("queues", "exchanges", "bindings"):
        body[key] = [{k: v for k, v in item.items() if k != "vhost"} for item in EXPORT[key] if item["vhost"] == vhost]
    return body


def test_vhost_export_matches_rabbitmq_and_imports_elsewhere(start_broker) -> None:
    node = start_broker()
    assert call(node, "POST", "/api/definitions", EXPORT).status == 204
    ours = call(node, "GET", "/api/definitions/imported").json
    theirs = vhost_export("imported")
    for key in ("parameters", "policies", "queues", "exchanges", "bindings"):
        assert sorted(map(json.dumps, ours[key])) == sorted(map(json.dumps, theirs[key])), key
    assert call(node, "PUT", "/api/vhosts/copy").status == 201
    assert call(node, "POST", "/api/definitions/copy", theirs).status == 204
    created = queue(node, "orders.created", "copy")
    assert (created["policy"], created["operator_policy"]) == ("limit-orders", "op-ttl")
    assert [p["vhost"] for p in call(node, "GET", "/api/policies/copy").json] == ["copy"] * 3


def test_exchanges_and_queues_of_reserved_names_are_skipped_as_rabbitmq_skips_them(start_broker) -> None:
    """An export holds the server-named queues (``amq.gen-...``) of the node it came from; RabbitMQ's import
    skips any exchange or queue named ``amq.*`` (and the default exchange), with a warning in its log, and
    imports the rest.  Refused as a declare of such a name is, the whole import was refused (401)."""
    node = start_broker()
    definitions = {"vhosts": [{"name": "/"}],
                   "exchanges": [{"vhost": "/", "name": "amq.custom", "type": "fanout", "durable": True},
                                 {"vhost": "/", "name": "", "type": "direct", "durable": True},
                                 {"vhost": "/", "name": "kept-x", "type": "fanout", "durable": True}],
                   "queues": [{"vhost": "/", "name": "amq.gen-Jq9aZ", "durable": True, "auto_delete": False},
                              {"vhost": "/", "name": "kept-q", "durable": True, "auto_delete": False}],
                   "bindings": [{"vhost": "/", "source": "kept-x", "destination": "amq.gen-Jq9aZ",
                                 "destination_type": "queue", "routing_key": ""},
                                {"vhost": "/", "source": "kept-x", "destination": "kept-q",
                                 "destination_type": "queue", "routing_key": ""}]}
    assert call(node, "POST", "/api/definitions", definitions).status == 204
    assert call(node, "GET", f"/api/queues/%2F/{q('amq.gen-Jq9aZ')}").status == 404
    assert call(node, "GET", "/api/exchanges/%2F/amq.custom").status == 404
    assert call(node, "GET", "/api/queues/%2F/kept-q").status == 200
    assert [b["destination"] for b in call(node, "GET", "/api/exchanges/%2F/kept-x/bindings/source").json] == ["kept-q"]


def test_an_import_keeps_an_existing_exchange_or_queue_and_checks_no_equivalence(start_broker) -> None:
    """rabbit_definitions:add_exchange_int and add_queue_int declare only what does not exist
    (rabbit_exchange:exists, rabbit_amqqueue:exists): an exchange or queue already there is kept as it is, with no
    equivalence check (that is rabbit_channel's).  An older export imported over changed definitions succeeds
    (204), and the rest of the file is imported."""
    node = start_broker()
    assert call(node, "PUT", "/api/exchanges/%2F/x", {"type": "fanout", "durable": True}).status == 201
    assert call(node, "PUT", "/api/queues/%2F/q", {"durable": True}).status == 201
    body = {"exchanges": [{"name": "x", "vhost": "/", "type": "direct", "durable": True, "auto_delete": False,
                           "internal": False, "arguments": {}}],
            "queues": [{"name": "q", "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}},
                       {"name": "new", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]}
    response = call(node, "POST", "/api/definitions", body)
    names = sorted(queue["name"] for queue in call(node, "GET", "/api/queues/%2F").json)
    assert (response.status, names) == (204, ["new", "q"]), response.raw
    assert call(node, "GET", "/api/exchanges/%2F/x").json["type"] == "fanout"
    assert call(node, "GET", "/api/queues/%2F/q").json["durable"] is True


def test_an_import_past_the_vhosts_max_queues_is_refused_whole(start_broker) -> None:
    """rabbit_definitions:apply_defs checks validate_limits/1 right after users and vhosts (a vhost import: first):
    the queues not there yet, counted by vhost, must fit max-queues (rabbit_vhost_limit:would_exceed_queue_limit),
    else no queue is made and the answer is 400 with RabbitMQ 3.10.8's text: the message for a vhost import, and
    for a whole-node import the term {vhost_limit_exceeded, Message} as its JSON encoder writes it (the message a
    list of character codes), both as RabbitMQ 3.10.8 answered them.  A queue already there is not counted."""
    node = start_broker()
    assert call(node, "PUT", "/api/vhost-limits/%2F/max-queues", {"value": 2}).status == 204
    assert call(node, "PUT", "/api/queues/%2F/there", {"durable": True}).status == 201
    queues: list[dict[str, Any]] = [
        {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
        for name in ("there", "a", "b")]
    message = ('Adding 2 queue(s) to virtual host "/" would exceed the limit of 2 queue(s).\n\nThis virtual host '
               "currently has 1 queue(s) defined.\n\nImport aborted!")
    whole = call(node, "POST", "/api/definitions", {"queues": queues})
    one = call(node, "POST", "/api/definitions/%2F", {"queues": queues})
    names = [queue["name"] for queue in call(node, "GET", "/api/queues/%2F").json]
    assert (whole.status, one.status, names) == (400, 400, ["there"])
    assert whole.json["reason"] == ["vhost_limit_exceeded", list(message.encode())]
    assert one.json["reason"] == message
    assert call(node, "POST", "/api/definitions", {"queues": queues[:2]}).status == 204
