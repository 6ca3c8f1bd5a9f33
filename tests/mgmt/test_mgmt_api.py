"""The management HTTP API against a real node: RabbitMQ 3.10's paths, codes and shapes, plus Warren's
peek, move and /metrics.  HTTP through urllib (stdlib), AMQP state through pika."""
from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import connect, free_port, wait_for_port
from support import GUEST, assert_error, call, delivery_tag, headers_of, q


def amqp(broker, vhost: str = "/", user: tuple[str, str] = GUEST) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, vhost, pika.PlainCredentials(*user),
        client_properties={"connection_name": "mgmt-test"}))


def make_user(broker, name: str, tags: str, vhost: str | None = "/", password: str = "pw") -> tuple[str, str]:
    assert call(broker, "PUT", f"/api/users/{q(name)}", {"password": password, "tags": tags}).status == 201
    if vhost is not None:
        assert call(broker, "PUT", f"/api/permissions/{q(vhost)}/{q(name)}",
                    {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    return name, password


def publish(broker, queue: str, payload: str, vhost: str = "/", **properties: Any) -> dict:
    response = call(broker, "POST", f"/api/exchanges/{q(vhost)}/amq.default/publish",
                    {"properties": properties, "routing_key": queue, "payload": payload,
                     "payload_encoding": "string"})
    assert response.status == 200, response.raw
    return response.json


def get(broker, queue: str, count: int = 1, ackmode: str = "ack_requeue_false", vhost: str = "/",
        **extra: Any) -> list[dict]:
    response = call(broker, "POST", f"/api/queues/{q(vhost)}/{q(queue)}/get",
                    {"count": count, "ackmode": ackmode, "encoding": "auto", **extra})
    assert response.status == 200, response.raw
    return response.json


# -- auth --------------------------------------------------------------------------------------


def test_unauthenticated_and_bad_credentials_get_401(broker):
    response = call(broker, "GET", "/api/overview", auth=None)
    assert (response.status, response.raw) == (401, b"")  # as RabbitMQ: a bare 401 that asks for credentials
    assert response.headers["WWW-Authenticate"].startswith("Basic")
    failed = call(broker, "GET", "/api/overview", auth=("guest", "wrong"))
    assert assert_error(failed, 401) == {"error": "not_authorized", "reason": "Login failed"}  # RabbitMQ's spelling
    assert failed.headers["WWW-Authenticate"].startswith("Basic")
    assert_error(call(broker, "GET", "/api/overview", auth=("nobody-at-all", "x")), 401)
    for header, status in (("Basic !!!", 400), ("Basic " + base64.b64encode(b"nocolon").decode(), 400),
                           ("Basic", 400), ("Digest abc", 400), ("Bearer token", 401)):
        request = urllib.request.Request(f"http://127.0.0.1:{broker.mgmt_port}/api/overview")
        request.add_header("Authorization", header)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == status, header
        body = refused.value.read()
        assert body == b"" if status == 400 else json.loads(body)["reason"] == "Login failed", header


def test_tags_decide_what_a_user_may_do(broker, uid):
    plain = make_user(broker, f"plain-{uid}", "")
    refused = call(broker, "GET", "/api/overview", auth=plain)
    # RabbitMQ answers "you may not" with 401 too, but does not ask for credentials again
    assert assert_error(refused, 401) == {"error": "not_authorised", "reason": "Not management user"}
    assert "WWW-Authenticate" not in refused.headers
    mgmt = make_user(broker, f"mgmt-{uid}", "management")
    assert call(broker, "GET", "/api/overview", auth=mgmt).status == 200
    assert call(broker, "GET", "/api/whoami", auth=mgmt).json == {"name": mgmt[0], "tags": ["management"]}
    for path in ("/api/users", "/api/permissions", "/api/definitions", f"/api/users/{q(mgmt[0])}"):
        assert assert_error(call(broker, "GET", path, auth=mgmt), 401)["error"] == "not_authorised"
    assert_error(call(broker, "PUT", f"/api/vhosts/{q('v-' + uid)}", auth=mgmt), 401)
    assert_error(call(broker, "GET", "/api/nodes", auth=mgmt), 401)
    monitor = make_user(broker, f"mon-{uid}", "monitoring", vhost=None)
    assert call(broker, "GET", "/api/nodes", auth=monitor).status == 200
    assert_error(call(broker, "GET", "/api/users", auth=monitor), 401)
    # tags as a list, as 3.10 exports them
    assert call(broker, "PUT", f"/api/users/{q(mgmt[0])}", {"tags": ["management", "policymaker"]}).status == 204
    assert call(broker, "GET", f"/api/users/{q(mgmt[0])}").json["tags"] == ["management", "policymaker"]
    # as RabbitMQ: an update without a password clears it (only other mechanisms could log the user in)
    assert call(broker, "GET", "/api/whoami", auth=mgmt).status == 401
    assert call(broker, "GET", f"/api/users/{q(mgmt[0])}").json["password_hash"] == ""
    assert call(broker, "PUT", f"/api/users/{q(mgmt[0])}", {"password": mgmt[1], "password_hash": "x",
                                                            "tags": ""}).json["reason"] == \
        "both_password_and_password_hash_are_provided"


def test_users_see_only_vhosts_they_have_permissions_on(broker, uid):
    vhost = f"vis-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}").status == 201
    user = make_user(broker, f"vis-{uid}", "management", vhost=vhost)
    names = [v["name"] for v in call(broker, "GET", "/api/vhosts", auth=user).json]
    assert names == [vhost]
    assert call(broker, "GET", "/api/queues/%2F", auth=user).status == 401
    assert call(broker, "PUT", f"/api/queues/{q(vhost)}/mine", {"durable": False}, auth=user).status == 201
    assert call(broker, "PUT", "/api/queues/%2F/theirs", {}, auth=user).status == 401
    visible = {item["vhost"] for item in call(broker, "GET", "/api/queues", auth=user).json}
    assert visible == {vhost}
    # the admin sees every vhost
    assert {"/", vhost} <= {v["name"] for v in call(broker, "GET", "/api/vhosts").json}
    # permissions narrower than .* are AMQP's: configure on the queue name
    assert call(broker, "PUT", f"/api/permissions/{q(vhost)}/{q(user[0])}",
                {"configure": "^only-", "write": ".*", "read": ".*"}).status == 204
    refused = assert_error(call(broker, "PUT", f"/api/queues/{q(vhost)}/other", {}, auth=user), 401)
    assert refused["reason"] == "Access refused."  # RabbitMQ's words for a refused declare
    assert call(broker, "PUT", f"/api/queues/{q(vhost)}/only-this", {}, auth=user).status == 201
    assert call(broker, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204


@pytest.fixture
def other_vhost(broker, uid):
    """A vhost of the test's own, with a queue ``q`` and a policy ``p`` in it."""
    vhost = f"other-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}").status == 201
    assert call(broker, "PUT", f"/api/queues/{q(vhost)}/q", {}).status == 201
    assert call(broker, "PUT", f"/api/policies/{q(vhost)}/p", {"pattern": "^zz", "definition": {"max-length": 1}}
                ).status == 201
    yield vhost
    call(broker, "DELETE", f"/api/vhosts/{q(vhost)}")


def test_monitoring_is_no_access_to_a_vhosts_queues_exchanges_and_bindings(broker, uid, other_vhost):
    """rabbit_mgmt_wm_queue(s), _exchange(s), _binding(s): is_authorized_vhost (is_admin orelse user_matches_vhost,
    the vhosts check_vhost_access lets the user log in to): a monitoring user without permissions in the vhost is
    refused, and filter_vhost leaves its objects out of the listings; it still sees the vhost listed
    (list_visible_vhosts) and its limits (is_authorized_vhost_visible)."""
    monitor = make_user(broker, f"mon-{uid}", "monitoring", vhost=None)
    for path in (f"/api/queues/{q(other_vhost)}/q", f"/api/queues/{q(other_vhost)}",
                 f"/api/exchanges/{q(other_vhost)}", f"/api/exchanges/{q(other_vhost)}/amq.direct",
                 f"/api/bindings/{q(other_vhost)}", f"/api/vhosts/{q(other_vhost)}/connections",
                 f"/api/aliveness-test/{q(other_vhost)}"):
        refused = assert_error(call(broker, "GET", path, auth=monitor), 401)
        assert refused == {"error": "not_authorised", "reason": "User not authorised to access virtual host"}, path
    for path in ("/api/queues", "/api/exchanges", "/api/bindings"):
        assert [i for i in call(broker, "GET", path, auth=monitor).json if i["vhost"] == other_vhost] == [], path
    assert other_vhost in {v["name"] for v in call(broker, "GET", "/api/vhosts", auth=monitor).json}
    assert call(broker, "GET", f"/api/vhost-limits/{q(other_vhost)}", auth=monitor).status == 200
    assert call(broker, "DELETE", f"/api/users/{q(monitor[0])}").status == 204


def test_one_vhost_is_an_administrators_and_consumers_are_a_non_monitoring_users_own(broker, uid, other_vhost):
    """rabbit_mgmt_wm_vhost: is_authorized_admin, whatever the user's permissions or tags; rabbit_mgmt_wm_consumers
    asks no vhost access and shows a user without monitoring only the consumers on its own channels (filter_user)."""
    user = make_user(broker, f"own-{uid}", "monitoring", vhost=other_vhost)
    assert assert_error(call(broker, "GET", f"/api/vhosts/{q(other_vhost)}", auth=user), 401)["reason"] == \
        "Not administrator user"
    plain = make_user(broker, f"plain-{uid}", "management", vhost=other_vhost)
    with connect(broker, *plain, vhost=other_vhost) as mine, connect(broker) as guests:
        mine.channel().basic_consume("q", lambda *a: None, consumer_tag="mine")
        guests.channel().queue_declare(uid, exclusive=True)
        guests.channel().basic_consume(uid, lambda *a: None, consumer_tag="guests")
        for path in ("/api/consumers", f"/api/consumers/{q(other_vhost)}", "/api/consumers/%2F"):
            tags = {c["consumer_tag"] for c in call(broker, "GET", path, auth=plain).json}
            assert tags == ({"mine"} if "%2F" not in path else set()), path
        assert "guests" in {c["consumer_tag"] for c in call(broker, "GET", "/api/consumers", auth=user).json}
    assert_error(call(broker, "GET", "/api/consumers/nowhere", auth=plain), 404)
    for name, _ in (user, plain):
        assert call(broker, "DELETE", f"/api/users/{q(name)}").status == 204


def test_any_user_lists_the_policies_of_its_vhosts_and_one_policy_takes_policymaker(broker, uid, other_vhost):
    """rabbit_mgmt_wm_policies and _operator_policies: is_authorized_vhost and filter_vhost, no tag; one policy
    (rabbit_mgmt_wm_policy) takes is_authorized_policies, refused as "User not authorised to access object"."""
    user = make_user(broker, f"mg-{uid}", "management", vhost=other_vhost)
    for kind in ("policies", "operator-policies"):
        listed = call(broker, "GET", f"/api/{kind}/{q(other_vhost)}", auth=user)
        assert listed.status == 200, (kind, listed.raw)
        assert [p["name"] for p in listed.json] == (["p"] if kind == "policies" else [])
        assert call(broker, "GET", f"/api/{kind}", auth=user).status == 200
    assert {p["vhost"] for p in call(broker, "GET", "/api/policies", auth=user).json} == {other_vhost}
    body = {"pattern": ".*", "definition": {"max-length": 1}}
    for method, path in (("GET", f"/api/policies/{q(other_vhost)}/p"), ("PUT", f"/api/policies/{q(other_vhost)}/p2"),
                         ("DELETE", f"/api/policies/{q(other_vhost)}/p")):
        refused = call(broker, method, path, body if method == "PUT" else None, auth=user)
        assert assert_error(refused, 401) == {"error": "not_authorised",
                                              "reason": "User not authorised to access object"}, path
    assert call(broker, "DELETE", f"/api/users/{q(user[0])}").status == 204


def test_a_policymaker_sees_policies_and_parameters_of_its_vhosts_only(broker, uid, other_vhost):
    """is_authorized_policies: is_admin orelse (is_policymaker andalso user_matches_vhost), monitoring or not;
    filter_vhost lists a non-administrator's login vhosts only; rabbit_mgmt_wm_parameters takes
    is_authorized_policies for /api/parameters too."""
    maker = make_user(broker, f"mp-{uid}", "monitoring,policymaker", vhost=None)
    for path in (f"/api/policies/{q(other_vhost)}/p", f"/api/parameters/shovel/{q(other_vhost)}",
                 f"/api/parameters/shovel/{q(other_vhost)}/s"):
        assert assert_error(call(broker, "GET", path, auth=maker), 401)["reason"] == \
            "User not authorised to access object", path
    assert [p for p in call(broker, "GET", "/api/policies", auth=maker).json if p["vhost"] == other_vhost] == []
    assert call(broker, "GET", "/api/parameters", auth=maker).status == 200
    plain = make_user(broker, f"mg3-{uid}", "management")
    for path in ("/api/parameters", "/api/parameters/shovel", "/api/parameters/shovel/%2F"):
        assert assert_error(call(broker, "GET", path, auth=plain), 401) == {
            "error": "not_authorised", "reason": "User not authorised to access object"}, path
    for name in (maker[0], plain[0]):
        assert call(broker, "DELETE", f"/api/users/{q(name)}").status == 204


def test_a_policymaker_manages_global_parameters(broker, uid):
    """rabbit_mgmt_wm_global_parameter(s):is_authorized -> is_authorized_global_parameters: is_policymaker(Tags),
    in RabbitMQ 3.10 as later; a management user is refused as "User not authorised to access object"."""
    maker = make_user(broker, f"pm-{uid}", "policymaker")
    path = f"/api/global-parameters/{q(uid)}"
    assert call(broker, "GET", "/api/global-parameters", auth=maker).status == 200
    assert call(broker, "PUT", path, {"value": "v"}, auth=maker).status == 201
    assert call(broker, "GET", path, auth=maker).json["value"] == "v"
    assert call(broker, "DELETE", path, auth=maker).status == 204
    plain = make_user(broker, f"mg5-{uid}", "management")
    assert assert_error(call(broker, "GET", "/api/global-parameters", auth=plain), 401)["reason"] == \
        "User not authorised to access object"
    for name in (maker[0], plain[0]):
        assert call(broker, "DELETE", f"/api/users/{q(name)}").status == 204


def test_any_user_reads_another_users_limits(broker, uid):
    """rabbit_mgmt_wm_user_limits (RabbitMQ 3.10 has it): is_authorized_vhost_visible, which no vhost in the path
    lets any management user through; setting one (rabbit_mgmt_wm_user_limit) takes administrator."""
    other = make_user(broker, f"lim-{uid}", "", vhost=None)
    assert call(broker, "PUT", f"/api/user-limits/{q(other[0])}/max-channels", {"value": 7}).status == 204
    user = make_user(broker, f"mg4-{uid}", "management")
    seen = call(broker, "GET", f"/api/user-limits/{q(other[0])}", auth=user)
    assert seen.status == 200, seen.raw
    assert seen.json == [{"user": other[0], "value": {"max-channels": 7}}]
    assert_error(call(broker, "PUT", f"/api/user-limits/{q(other[0])}/max-channels", {"value": 8}, auth=user), 401)
    for name in (other[0], user[0]):
        assert call(broker, "DELETE", f"/api/users/{q(name)}").status == 204


# -- overview, nodes, health -------------------------------------------------------------------


def test_overview_nodes_and_health(broker):
    overview = call(broker, "GET", "/api/overview").json
    for key in ("management_version", "rabbitmq_version", "node", "listeners", "exchange_types", "message_stats",
                "queue_totals", "object_totals"):
        assert key in overview, key
    assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(overview["queue_totals"])
    assert {"connections", "channels", "exchanges", "queues", "consumers"} <= set(overview["object_totals"])
    assert overview["listeners"][0]["port"] == broker.port
    nodes = call(broker, "GET", "/api/nodes").json
    assert len(nodes) == 1 and nodes[0]["name"] == overview["node"] and nodes[0]["running"] is True
    for key in ("mem_used", "mem_limit", "disk_free", "fd_used", "uptime", "type"):
        assert key in nodes[0]
    assert call(broker, "GET", f"/api/nodes/{q(overview['node'])}").json["name"] == overview["node"]
    assert_error(call(broker, "GET", "/api/nodes/rabbit@elsewhere"), 404)
    assert call(broker, "GET", "/api/aliveness-test/%2F").json == {"status": "ok"}
    assert_error(call(broker, "GET", "/api/aliveness-test/no-such-vhost"), 404)
    assert call(broker, "GET", "/api/healthchecks/node").json == {"status": "ok"}


# -- vhosts, users, permissions ----------------------------------------------------------------


def test_vhost_user_permission_lifecycle(broker, uid):
    vhost, user = f"life-{uid}", f"life-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}").status == 201
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}", {"description": "x"}).status == 204
    info = call(broker, "GET", f"/api/vhosts/{q(vhost)}").json
    assert info["name"] == vhost and info["messages"] == 0 and "message_stats" in info
    assert call(broker, "PUT", f"/api/users/{q(user)}", {"password": "s3cret", "tags": "management"}).status == 201
    shown = call(broker, "GET", f"/api/users/{q(user)}").json
    assert set(shown) >= {"name", "password_hash", "hashing_algorithm", "tags"}
    assert shown["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    perms = {"configure": "^a", "write": "^b", "read": "^c"}
    path = f"/api/permissions/{q(vhost)}/{q(user)}"
    assert_error(call(broker, "GET", path), 404)
    assert call(broker, "PUT", path, perms).status == 201
    assert call(broker, "PUT", path, perms).status == 204
    assert call(broker, "GET", path).json == {"user": user, "vhost": vhost, **perms}
    in_vhost = call(broker, "GET", f"/api/vhosts/{q(vhost)}/permissions").json
    assert {p["user"] for p in in_vhost} == {user, "guest"}  # the vhost's creator got full permissions
    assert [p for p in in_vhost if p["user"] == user] == [{"user": user, "vhost": vhost, **perms}]
    assert call(broker, "GET", f"/api/users/{q(user)}/permissions").json == [{"user": user, "vhost": vhost, **perms}]
    assert any(p["user"] == user for p in call(broker, "GET", "/api/permissions").json)
    assert_error(call(broker, "PUT", path, {"configure": "(", "write": "", "read": ""}), 400)
    # login over AMQP with the new user works on the new vhost
    connection = amqp(broker, vhost, (user, "s3cret"))
    connection.close()
    # password_hash from an export is accepted as is
    hashed = shown["password_hash"]
    assert call(broker, "PUT", f"/api/users/{q(user)}-2", {"password_hash": hashed, "tags": ""}).status == 201
    assert call(broker, "GET", f"/api/users/{q(user)}-2").json["password_hash"] == hashed
    # as RabbitMQ, a user may be created without a password; no password logs it in
    assert call(broker, "PUT", f"/api/users/{q(user)}-3", {"tags": "management"}).status == 201
    assert call(broker, "GET", f"/api/users/{q(user)}-3").json["password_hash"] == ""
    assert_error(call(broker, "GET", "/api/whoami", auth=(f"{user}-3", "")), 401)
    # permissions for a user or vhost that does not exist: RabbitMQ's 400
    assert assert_error(call(broker, "PUT", f"/api/permissions/{q(vhost)}/{q(user)}-none", perms), 400)[
        "reason"] == "vhost_or_user_not_found"
    assert_error(call(broker, "GET", f"/api/permissions/{q(vhost)}/{q(user)}-none"), 404)
    assert call(broker, "DELETE", path).status == 204
    assert_error(call(broker, "DELETE", path), 404)
    assert call(broker, "DELETE", f"/api/users/{q(user)}").status == 204
    assert_error(call(broker, "GET", f"/api/users/{q(user)}"), 404)
    assert call(broker, "DELETE", f"/api/vhosts/{q(vhost)}").status == 204
    assert_error(call(broker, "GET", f"/api/vhosts/{q(vhost)}"), 404)
    assert_error(call(broker, "DELETE", f"/api/vhosts/{q(vhost)}"), 404)


# -- exchanges ---------------------------------------------------------------------------------


def test_exchange_declare_show_delete(broker, uid):
    path = f"/api/exchanges/%2F/{q(uid)}"
    assert call(broker, "PUT", path, {"type": "topic", "durable": False}).status == 201
    assert call(broker, "PUT", path, {"type": "topic", "durable": False}).status == 204
    mismatch = assert_error(call(broker, "PUT", path, {"type": "fanout", "durable": False}), 400)
    assert "inequivalent arg 'type'" in mismatch["reason"]
    shown = call(broker, "GET", path).json
    assert {k: shown[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")} == {
        "name": uid, "vhost": "/", "type": "topic", "durable": False, "auto_delete": False, "internal": False,
        "arguments": {}}
    assert uid in [e["name"] for e in call(broker, "GET", "/api/exchanges/%2F").json]
    assert "" in [e["name"] for e in call(broker, "GET", "/api/exchanges").json]
    assert call(broker, "GET", "/api/exchanges/%2F/amq.default").json["name"] == ""
    assert call(broker, "PUT", f"/api/queues/%2F/{q(uid)}", {}).status == 201
    assert call(broker, "POST", f"/api/bindings/%2F/e/{q(uid)}/q/{q(uid)}", {"routing_key": "a.#"}).status == 201
    assert_error(call(broker, "DELETE", path + "?if-unused=true"), 400)
    assert call(broker, "DELETE", path).status == 204
    assert_error(call(broker, "GET", path), 404)
    assert_error(call(broker, "DELETE", path), 404)
    assert_error(call(broker, "DELETE", "/api/exchanges/%2F/amq.direct"), 401)
    assert_error(call(broker, "PUT", "/api/exchanges/%2F/amq.custom", {"type": "direct"}), 401)
    # no type: exchange.declare's defaults, as RabbitMQ (direct, not durable)
    assert call(broker, "PUT", path, {}).status == 201
    assert {k: v for k, v in call(broker, "GET", path).json.items() if k in ("type", "durable")} == {
        "type": "direct", "durable": False}
    assert call(broker, "DELETE", path).status == 204
    assert_error(call(broker, "PUT", path, {"type": "nonsense"}), 400)
    assert_error(call(broker, "PUT", path, raw=b"{not json"), 400)
    assert_error(call(broker, "PUT", path, raw=b"[1, 2]"), 400)
    assert_error(call(broker, "PUT", path, {"type": "direct", "durable": "maybe"}), 400)
    assert_error(call(broker, "GET", "/api/exchanges/no-such-vhost"), 404)
    call(broker, "DELETE", f"/api/queues/%2F/{q(uid)}")


def test_exchange_declare_and_publish_check_in_rabbitmqs_order(broker, uid, other_vhost):
    """exchange.declare (rabbit_channel): rabbit_exchange:check_type (command_invalid, a 400 through direct_request)
    before check_configure_permitted; rabbit_mgmt_wm_exchange_publish: with_decode's keys before the channel's
    basic.publish, which checks write on the exchange before it looks the exchange up."""
    user = make_user(broker, f"narrow-{uid}", "management", vhost=None)
    assert call(broker, "PUT", f"/api/permissions/{q(other_vhost)}/{q(user[0])}",
                {"configure": "^only-", "write": "^only-", "read": ".*"}).status == 201
    path = f"/api/exchanges/{q(other_vhost)}"
    refused = assert_error(call(broker, "PUT", f"{path}/other", {"type": "no-such-type"}, auth=user), 400)
    assert "unknown exchange type 'no-such-type'" in refused["reason"]
    assert assert_error(call(broker, "PUT", f"{path}/other", {"type": "direct"}, auth=user), 401)["reason"] == \
        "Access refused."
    assert "key_missing" in assert_error(call(broker, "POST", f"{path}/amq.direct/publish", {}, auth=user),
                                         400)["reason"]
    body = {"properties": {}, "routing_key": "k", "payload": "x", "payload_encoding": "string"}
    for exchange, reason in (("missing", "403 ACCESS_REFUSED"), ("only-missing", "404 NOT_FOUND")):
        answer = assert_error(call(broker, "POST", f"{path}/{exchange}/publish", body, auth=user), 400)
        assert answer["reason"].startswith(reason), (exchange, answer)
    assert call(broker, "DELETE", f"/api/users/{q(user[0])}").status == 204


def test_an_http_publish_over_the_max_message_size_is_refused_before_the_exchange_is_looked_at(start_broker):
    """rabbit_channel's basic.publish checks the size first (check_msg_size), in its words, before the write
    permission and the exchange; the HTTP publish gets the channel's 406 as its 400's reason."""
    node = start_broker("--max-message-size", "10")
    body = {"routing_key": "k", "payload": "x" * 11, "payload_encoding": "string", "properties": {}}
    for exchange in ("amq.default", "no-such-exchange"):
        assert assert_error(call(node, "POST", f"/api/exchanges/%2F/{exchange}/publish", body), 400)["reason"] == (
            "406 PRECONDITION_FAILED - message size 11 is larger than configured max size 10")
    assert call(node, "POST", "/api/exchanges/%2F/amq.default/publish", {**body, "payload": "x" * 10}).json == {
        "routed": False}


def test_publish_routes_like_amqp(broker, uid):
    assert call(broker, "PUT", f"/api/queues/%2F/{q(uid)}", {"durable": True}).status == 201
    assert publish(broker, uid, "hello", delivery_mode=2, headers={"k": "v"}, content_type="text/plain") == {
        "routed": True}
    assert publish(broker, f"{uid}-nowhere", "lost") == {"routed": False}
    payload = base64.b64encode(b"\x00\xffbin").decode()
    assert call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                {"routing_key": uid, "payload": payload, "payload_encoding": "base64", "properties": {}}
                ).json == {"routed": True}
    # RabbitMQ's reasons: Erlang tuples as JSON lists; a property it does not know is ignored
    assert assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                             {"routing_key": uid, "payload": "x", "payload_encoding": "rot13", "properties": {}}),
                        400)["reason"] == ["unsupported_encoding", "rot13"]
    assert assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                             {"routing_key": uid, "payload": "!!", "payload_encoding": "base64", "properties": {}}),
                        400)["reason"] == ["not_base64", "!!"]
    assert assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                             {"routing_key": uid, "payload": "x", "payload_encoding": "string",
                              "properties": {"delivery_mode": "x"}}), 400)["reason"] == ["not_int", "delivery_mode"]
    assert call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                {"routing_key": f"{uid}-nowhere", "payload": "x", "payload_encoding": "string",
                 "properties": {"bogus": 1}}).json == {"routed": False}
    for missing in ("payload_encoding", "properties"):  # RabbitMQ requires both
        body = {"routing_key": uid, "payload": "x", "payload_encoding": "string", "properties": {}}
        del body[missing]
        assert missing in assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.default/publish", body),
                                       400)["reason"]
    assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.default/publish", {"payload": "x"}), 400)
    # basic.publish's refusals: 400 with the reply code and text, as RabbitMQ answers them
    assert assert_error(call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                             {"routing_key": uid, "payload": "x", "payload_encoding": "string",
                              "properties": {"user_id": "mallory"}}), 400)["reason"] == (
        "406 PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'")
    no_exchange = call(broker, "POST", f"/api/exchanges/%2F/{q(uid)}-missing/publish",
                       {"routing_key": uid, "payload": "x", "payload_encoding": "string", "properties": {}})
    assert assert_error(no_exchange, 400)["reason"] == f"404 NOT_FOUND - no exchange '{uid}-missing' in vhost '/'"
    # and AMQP consumers see what HTTP published
    connection = amqp(broker)
    channel = connection.channel()
    method, props, got = channel.basic_get(uid, auto_ack=True)
    assert got == b"hello" and props is not None and props.headers == {"k": "v"} and props.delivery_mode == 2
    assert channel.basic_get(uid, auto_ack=True)[2] == b"\x00\xffbin"
    connection.close()
    call(broker, "DELETE", f"/api/queues/%2F/{q(uid)}")


# -- queues ------------------------------------------------------------------------------------


def test_queue_declare_show_purge_delete(broker, uid):
    path = f"/api/queues/%2F/{q(uid)}"
    assert call(broker, "PUT", path, {"durable": True, "arguments": {"x-max-length": 100}}).status == 201
    assert call(broker, "PUT", path, {"durable": True, "arguments": {"x-max-length": 100}}).status == 204
    assert_error(call(broker, "PUT", path, {"durable": False}), 400)
    assert_error(call(broker, "PUT", path, {"arguments": "nope"}), 400)
    # an empty body takes queue.declare's defaults, as RabbitMQ: not durable
    assert call(broker, "PUT", f"{path}-defaults", {}).status == 201
    assert call(broker, "GET", f"{path}-defaults").json["durable"] is False
    assert call(broker, "DELETE", f"{path}-defaults").status == 204
    assert_error(call(broker, "PUT", f"/api/queues/%2F/{q(uid)}-bad", {"arguments": {"x-max-length": "ten"}}), 400)
    for i in range(3):
        publish(broker, uid, f"m{i}")
    shown = call(broker, "GET", path).json
    for key in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "node", "state", "consumers",
                "messages", "messages_ready", "messages_unacknowledged", "message_stats", "messages_details"):
        assert key in shown, key
    assert (shown["messages"], shown["messages_ready"], shown["messages_unacknowledged"]) == (3, 3, 0)
    assert shown["arguments"] == {"x-max-length": 100} and shown["durable"] is True
    assert shown["message_stats"]["publish"] == 3 and "rate" in shown["message_stats"]["publish_details"]
    assert_error(call(broker, "DELETE", path + "?if-empty=true"), 400)
    assert call(broker, "DELETE", path + "/contents").status == 204
    assert call(broker, "GET", path).json["messages"] == 0
    connection = amqp(broker)
    channel = connection.channel()
    channel.basic_consume(uid, lambda *a: None)
    connection.process_data_events(0.2)
    assert call(broker, "GET", path).json["consumers"] == 1
    assert_error(call(broker, "DELETE", path + "?if-unused=true"), 400)
    connection.close()
    assert call(broker, "DELETE", path + "?if-unused=true&if-empty=true").status == 204
    assert_error(call(broker, "GET", path), 404)
    assert_error(call(broker, "DELETE", path), 404)
    assert_error(call(broker, "DELETE", path + "/contents"), 404)


def test_delete_conditions_are_the_word_true_only(broker, uid):
    """rabbit_mgmt_wm_queue and _exchange delete_resource: IfEmpty = <<"true">> =:= qs_val(<<"if-empty">>, ReqData),
    the same for if-unused: ``if-empty=1`` or ``if-unused=True`` asks nothing, and what they name is deleted."""
    path = f"/api/queues/%2F/{q(uid)}"
    assert call(broker, "PUT", path, {}).status == 201
    publish(broker, uid, "x")
    assert call(broker, "DELETE", path + "?if-empty=1&if-unused=yes").status == 204
    assert_error(call(broker, "GET", path), 404)
    exchange = f"/api/exchanges/%2F/{q(uid)}"
    assert call(broker, "PUT", exchange, {"type": "fanout"}).status == 201
    assert call(broker, "POST", f"/api/bindings/%2F/e/{q(uid)}/e/amq.direct", {}).status == 201
    assert call(broker, "DELETE", exchange + "?if-unused=True").status == 204
    assert_error(call(broker, "GET", exchange), 404)


def test_get_ack_modes_encoding_truncate(broker, uid):
    dlx = f"{uid}-dlq"
    call(broker, "PUT", f"/api/queues/%2F/{q(dlx)}", {})
    call(broker, "PUT", f"/api/queues/%2F/{q(uid)}", {"arguments": {"x-dead-letter-exchange": "",
                                                                    "x-dead-letter-routing-key": dlx}})
    for i in range(4):
        publish(broker, uid, f"message-{i}", headers={"n": i})
    got = get(broker, uid, 2, "ack_requeue_true")
    assert [m["payload"] for m in got] == ["message-0", "message-1"]
    assert set(got[0]) >= {"payload_bytes", "redelivered", "exchange", "routing_key", "message_count", "properties",
                           "payload", "payload_encoding"}
    assert got[0]["message_count"] == 3 and got[1]["message_count"] == 2
    assert got[0]["properties"]["headers"] == {"n": 0} and got[0]["payload_encoding"] == "string"
    again = get(broker, uid, 1, "reject_requeue_true")
    assert again[0]["payload"] == "message-0" and again[0]["redelivered"] is True
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json["messages"] == 4
    removed = get(broker, uid, 1, "ack_requeue_false", truncate=3)
    assert removed[0]["payload"] == "mes" and removed[0]["payload_bytes"] == 9
    rejected = get(broker, uid, 1, "reject_requeue_false")
    assert rejected[0]["payload"] == "message-1"
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json["messages"] == 2
    assert get(broker, dlx, 5, "ack_requeue_false")[0]["payload"] == "message-1"  # dead-lettered
    b64 = call(broker, "POST", f"/api/queues/%2F/{q(uid)}/get",
               {"count": 1, "ackmode": "ack_requeue_true", "encoding": "base64"}).json
    assert base64.b64decode(b64[0]["payload"]) == b"message-2" and b64[0]["payload_encoding"] == "base64"
    for bad in ({"count": 1, "ackmode": "nope", "encoding": "auto"}, {"count": 1, "encoding": "auto"},
                {"count": "x", "ackmode": "ack_requeue_true", "encoding": "auto"},
                {"count": 1, "ackmode": "ack_requeue_true", "encoding": "utf-7"}):
        assert_error(call(broker, "POST", f"/api/queues/%2F/{q(uid)}/get", bad), 400)
    assert_error(call(broker, "POST", f"/api/queues/%2F/{q(uid)}/get", raw=b""), 400)
    assert get(broker, f"{uid}-dlq", 3) == []
    for name in (uid, dlx):
        call(broker, "DELETE", f"/api/queues/%2F/{q(name)}")


def test_peek_changes_nothing(broker, uid):
    connection = amqp(broker)
    channel = connection.channel()
    channel.queue_declare(uid)
    for i in range(5):
        channel.basic_publish("", uid, f"p{i}".encode())
    before = call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json
    peeked = call(broker, "GET", f"/api/queues/%2F/{q(uid)}/peek?offset=1&count=2").json
    assert [(m["payload"], m["position"], m["redelivered"]) for m in peeked] == [("p1", 1, False), ("p2", 2, False)]
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}/peek?offset=10").json == []
    assert len(call(broker, "GET", f"/api/queues/%2F/{q(uid)}/peek").json) == 5
    after = call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json
    assert after["messages"] == before["messages"] == 5
    assert after["message_stats"] == before["message_stats"]
    for i in range(5):
        method, _, body = channel.basic_get(uid, auto_ack=True)
        assert body == f"p{i}".encode() and method is not None and not method.redelivered
    assert_error(call(broker, "GET", f"/api/queues/%2F/{q(uid)}/peek?offset=-1"), 400)
    assert_error(call(broker, "GET", f"/api/queues/%2F/{q(uid)}/peek?count=x"), 400)
    assert_error(call(broker, "GET", f"/api/queues/%2F/{q(uid)}-none/peek"), 404)
    channel.queue_delete(uid)
    connection.close()


def test_move_replays_a_dead_letter_queue(broker, uid):
    work, dlq = f"{uid}-work", f"{uid}-dlq"
    connection = amqp(broker)
    channel = connection.channel()
    channel.queue_declare(dlq, durable=True)
    channel.queue_declare(work, durable=True, arguments={"x-dead-letter-exchange": "",
                                                         "x-dead-letter-routing-key": dlq})
    for i in range(4):
        channel.basic_publish("", work, f"job{i}".encode(), pika.BasicProperties(delivery_mode=2, headers={"i": i}))
    for _ in range(4):
        method, _, _ = channel.basic_get(work)
        channel.basic_reject(delivery_tag(method), requeue=False)
    assert call(broker, "GET", f"/api/queues/%2F/{q(dlq)}").json["messages"] == 4
    moved = call(broker, "POST", f"/api/queues/%2F/{q(dlq)}/move", {"destination": work, "count": 3})
    assert moved.status == 200 and moved.json["moved"] == 3
    assert call(broker, "GET", f"/api/queues/%2F/{q(dlq)}").json["messages"] == 1
    method, props, body = channel.basic_get(work, auto_ack=True)
    assert body == b"job0" and headers_of(props)["i"] == 0 and headers_of(props)["x-death"][0]["reason"] == "rejected"
    assert call(broker, "POST", f"/api/queues/%2F/{q(dlq)}/move", {"destination": work}).json["moved"] == 1
    assert [channel.basic_get(work, auto_ack=True)[2] for _ in range(3)] == [b"job1", b"job2", b"job3"]
    assert_error(call(broker, "POST", f"/api/queues/%2F/{q(dlq)}/move", {"destination": f"{uid}-none"}), 404)
    assert_error(call(broker, "POST", f"/api/queues/%2F/{q(dlq)}/move", {}), 400)
    assert_error(call(broker, "POST", f"/api/queues/%2F/{q(dlq)}/move", {"destination": dlq}), 400)
    channel.queue_delete(work)
    channel.queue_delete(dlq)
    connection.close()


# -- bindings ----------------------------------------------------------------------------------


def test_bindings(broker, uid):
    ex, ex2, queue = f"{uid}-x", f"{uid}-x2", f"{uid}-q"
    call(broker, "PUT", f"/api/exchanges/%2F/{q(ex)}", {"type": "direct"})
    call(broker, "PUT", f"/api/exchanges/%2F/{q(ex2)}", {"type": "fanout"})
    call(broker, "PUT", f"/api/queues/%2F/{q(queue)}", {})
    base = f"/api/bindings/%2F/e/{q(ex)}/q/{q(queue)}"
    created = call(broker, "POST", base, {"routing_key": "rk", "arguments": {}})
    assert created.status == 201 and created.headers["Location"] == f"{q(queue)}/rk"
    with_args = call(broker, "POST", base, {"routing_key": "rk", "arguments": {"x-a": 1}})
    listed = call(broker, "GET", base).json
    assert len(listed) == 2
    keys = {b["properties_key"] for b in listed}
    assert "rk" in keys and with_args.headers["Location"].split("/")[-1] in keys
    one = call(broker, "GET", f"{base}/rk").json
    assert one == {"source": ex, "vhost": "/", "destination": queue, "destination_type": "queue",
                   "routing_key": "rk", "arguments": {}, "properties_key": "rk"}
    assert call(broker, "POST", f"/api/bindings/%2F/e/{q(ex)}/q/{q(queue)}", {}).status == 201
    assert "~" in {b["properties_key"] for b in call(broker, "GET", base).json}
    e2e = call(broker, "POST", f"/api/bindings/%2F/e/{q(ex)}/e/{q(ex2)}", {"routing_key": "to-x2"})
    assert e2e.status == 201
    assert call(broker, "GET", f"/api/exchanges/%2F/{q(ex2)}/bindings/destination").json[0]["source"] == ex
    assert len(call(broker, "GET", f"/api/exchanges/%2F/{q(ex)}/bindings/source").json) == 4
    queue_bindings = call(broker, "GET", f"/api/queues/%2F/{q(queue)}/bindings").json
    assert {b["source"] for b in queue_bindings} == {"", ex}
    assert any(b["source"] == ex for b in call(broker, "GET", "/api/bindings/%2F").json)
    assert any(b["destination"] == ex2 for b in call(broker, "GET", "/api/bindings").json)
    # routing through an HTTP-made binding
    call(broker, "POST", "/api/exchanges/%2F/" + q(ex) + "/publish",
         {"routing_key": "rk", "payload": "via-binding", "payload_encoding": "string", "properties": {}})
    assert get(broker, queue)[0]["payload"] == "via-binding"
    assert call(broker, "DELETE", f"{base}/rk").status == 204
    assert_error(call(broker, "GET", f"{base}/rk"), 404)
    assert_error(call(broker, "DELETE", f"{base}/rk"), 404)
    assert_error(call(broker, "POST", f"/api/bindings/%2F/e/amq.default/q/{q(queue)}", {"routing_key": "x"}), 401)
    assert_error(call(broker, "POST", f"/api/bindings/%2F/e/{q(ex)}/q/{q(uid)}-none", {}), 404)
    # listings of a missing exchange's or queue's bindings are no error in RabbitMQ (a queue keeps its default one)
    assert call(broker, "GET", f"/api/exchanges/%2F/{q(uid)}-none/bindings/source").json == []
    assert call(broker, "GET", f"/api/exchanges/%2F/{q(uid)}-none/bindings/destination").json == []
    assert call(broker, "GET", f"/api/bindings/%2F/e/{q(uid)}-none/q/{q(queue)}").json == []
    assert call(broker, "GET", f"/api/bindings/%2F/e/{q(ex)}/e/{q(uid)}-none").json == []
    assert call(broker, "GET", f"/api/queues/%2F/{q(uid)}-none/bindings").json == [
        {"source": "", "vhost": "/", "destination": f"{uid}-none", "destination_type": "queue",
         "routing_key": f"{uid}-none", "arguments": {}, "properties_key": q(f"{uid}-none")}]
    for path in (f"/api/exchanges/%2F/{q(ex)}", f"/api/exchanges/%2F/{q(ex2)}", f"/api/queues/%2F/{q(queue)}"):
        call(broker, "DELETE", path)


# -- connections, channels, consumers ----------------------------------------------------------


def test_connections_channels_consumers_and_forced_close(broker, uid):
    connection = amqp(broker)
    channel = connection.channel()
    channel.queue_declare(uid)
    channel.basic_qos(prefetch_count=7)
    channel.basic_consume(uid, lambda *a: None, consumer_tag=f"ctag-{uid}")
    connection.process_data_events(0.2)
    connections = [c for c in call(broker, "GET", "/api/connections").json
                   if c["client_properties"].get("connection_name") == "mgmt-test" and c["channels"] == 1]
    assert connections
    mine = connections[-1]
    for key in ("name", "user", "vhost", "peer_host", "peer_port", "protocol", "channels", "state", "node",
                "connected_at", "client_properties", "frame_max", "timeout"):
        assert key in mine, key
    assert mine["user"] == "guest" and mine["vhost"] == "/" and mine["protocol"] == "AMQP 0-9-1"
    name = mine["name"]
    assert call(broker, "GET", f"/api/connections/{q(name)}").json["name"] == name
    channels = [c for c in call(broker, "GET", "/api/channels").json if c["connection_details"]["name"] == name]
    assert len(channels) == 1 and channels[0]["number"] == 1 and channels[0]["consumer_count"] == 1
    assert channels[0]["prefetch_count"] == 7 and "message_stats" in channels[0]
    assert call(broker, "GET", f"/api/connections/{q(name)}/channels").json[0]["name"] == channels[0]["name"]
    detail = call(broker, "GET", f"/api/channels/{q(channels[0]['name'])}").json  # with its consumers, as RabbitMQ's
    assert [(c["consumer_tag"], c["queue"]) for c in detail["consumer_details"]] == [(f"ctag-{uid}", {"name": uid,
                                                                                                      "vhost": "/"})]
    consumers = [c for c in call(broker, "GET", "/api/consumers/%2F").json if c["queue"]["name"] == uid]
    assert consumers[0]["consumer_tag"] == f"ctag-{uid}" and consumers[0]["ack_required"] is True
    assert consumers[0]["channel_details"]["connection_name"] == name
    assert any(c["queue"]["name"] == uid for c in call(broker, "GET", "/api/consumers").json)
    # another management user sees only their own connections
    other = make_user(broker, f"conn-{uid}", "management")
    assert all(c["user"] == other[0] for c in call(broker, "GET", "/api/connections", auth=other).json)
    assert_error(call(broker, "DELETE", f"/api/connections/{q(name)}", auth=other), 404)
    assert call(broker, "DELETE", f"/api/connections/{q(name)}").status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.process_data_events(2)
        connection.channel()
    assert closed.value.reply_code == 320
    assert_error(call(broker, "DELETE", f"/api/connections/{q(name)}"), 404)
    cleanup = amqp(broker)
    cleanup.channel().queue_delete(uid)
    cleanup.close()


# -- listing parameters ------------------------------------------------------------------------


def test_columns_sort_paging_and_name_filter(broker, uid):
    names = [f"{uid}-list-{i}" for i in range(7)]
    for i, name in enumerate(names):
        call(broker, "PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})
        for _ in range(i % 3):
            publish(broker, name, "x")
    paged = call(broker, "GET", f"/api/queues/%2F?page=2&page_size=3&name={q(uid + '-list-')}&sort=name").json
    assert set(paged) == {"filtered_count", "item_count", "items", "page", "page_count", "page_size", "total_count"}
    assert paged["filtered_count"] == 7 and paged["page_count"] == 3 and paged["item_count"] == 3
    assert [i["name"] for i in paged["items"]] == names[3:6]
    assert [i["messages"] for i in paged["items"]] == [0, 1, 2]  # a page renders its items in full
    assert paged["total_count"] >= 7
    regex = call(broker, "GET", f"/api/queues/%2F?page=1&use_regex=true&name={q('list-[0-2]$')}").json
    assert sorted(i["name"] for i in regex["items"] if i["name"].startswith(uid)) == names[:3]
    trimmed = call(broker, "GET", f"/api/queues/%2F?columns=name,messages,message_stats.publish&page=1"
                                  f"&name={q(uid + '-list-')}&sort=messages&sort_reverse=true").json["items"]
    assert set(trimmed[0]) <= {"name", "messages", "message_stats"} and trimmed[0]["messages"] == 2
    assert [t["messages"] for t in trimmed] == sorted((t["messages"] for t in trimmed), reverse=True)
    assert set(trimmed[0]["message_stats"]) == {"publish"}
    one = call(broker, "GET", f"/api/queues/%2F/{q(names[0])}?columns=name,vhost").json
    assert one == {"name": names[0], "vhost": "/"}
    # RabbitMQ's errors for each kind of bad paging
    assert assert_error(call(broker, "GET", "/api/queues?page=1000&page_size=500"), 400)["error"] == \
        "page_out_of_range"
    assert assert_error(call(broker, "GET", "/api/queues?page=1&page_size=501"), 400) == {
        "error": "invalid_pagination_parameters",
        "reason": "Invalid pagination parameters: page number 1, page size 501"}
    assert assert_error(call(broker, "GET", "/api/queues?page=0"), 400) == {
        "error": "invalid_pagination_parameters",
        "reason": "Invalid pagination parameters: page number 0, page size undefined"}
    assert assert_error(call(broker, "GET", "/api/queues?page=x"), 400) == {
        "error": "bad_request", "reason": "Pagination parameters are invalid"}
    # re:run's badarg, caught by with_valid_pagination; with nothing to match, nothing is refused
    assert assert_error(call(broker, "GET", f"/api/queues?page=1&name={q('[')}&use_regex=true"), 400) == {
        "error": "bad_request", "reason": "Pagination parameters are invalid"}
    empty = f"{uid}-empty"
    assert call(broker, "PUT", f"/api/vhosts/{q(empty)}").status == 201
    assert call(broker, "GET", f"/api/queues/{q(empty)}?page=1&name={q('[')}&use_regex=true").json["items"] == []
    assert call(broker, "DELETE", f"/api/vhosts/{q(empty)}").status == 204
    exchanges = call(broker, "GET", "/api/exchanges?page=1&page_size=2&sort=name").json
    assert exchanges["item_count"] == 2 and exchanges["page_size"] == 2
    for name in names:
        call(broker, "DELETE", f"/api/queues/%2F/{q(name)}")


@pytest.fixture
def listed_vhost(broker, uid):
    """A vhost holding non-durable queues declared in the order b, Alpha, c."""
    vhost = f"listed-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}").status == 201
    for name in ("b", "Alpha", "c"):
        assert call(broker, "PUT", f"/api/queues/{q(vhost)}/{name}", {}).status == 201
    yield vhost
    call(broker, "DELETE", f"/api/vhosts/{q(vhost)}")


def test_name_filters_a_page_only_and_ignores_case(broker, listed_vhost):
    """rabbit_mgmt_util:maybe_filter_context(List, _) -> List without pagination ("backward with the other API(s),
    that don't filter the data"); match_value without use_regex compares string:to_lower of both."""
    path = f"/api/queues/{q(listed_vhost)}"
    assert [i["name"] for i in call(broker, "GET", f"{path}?page=1&name=ALPHA").json["items"]] == ["Alpha"]
    assert [i["name"] for i in call(broker, "GET", f"{path}?page=1&name=alp&use_regex=1").json["items"]] == \
        ["Alpha"]  # (use_regex is "true" or nothing: a substring, lowered)
    assert sorted(i["name"] for i in call(broker, "GET", f"{path}?name=Alpha").json) == ["Alpha", "b", "c"]


def test_sort_ties_fall_back_to_the_default_sort_and_an_empty_sort_sorts_nothing(broker, listed_vhost):
    """merge_sorts(DefaultSorts, Extra) -> [Extra | DefaultSorts]: by ``durable`` (all equal) the queues come by
    vhost and name; sort_list(Facts, _, [], _) -> Facts: ``sort=`` leaves them unsorted; sort_reverse is
    list_to_atom'd, which anything but true or false crashes (refused here)."""
    path = f"/api/queues/{q(listed_vhost)}"
    assert [i["name"] for i in call(broker, "GET", f"{path}?sort=durable").json] == ["Alpha", "b", "c"]
    assert [i["name"] for i in call(broker, "GET", f"{path}?sort=durable&sort_reverse=true").json] == \
        ["c", "b", "Alpha"]
    assert [i["name"] for i in call(broker, "GET", f"{path}?sort=&sort_reverse=true").json] == ["b", "Alpha", "c"]
    assert_error(call(broker, "GET", f"{path}?sort_reverse=1"), 400)


def test_pagination_numbers_are_erlang_integers(broker, listed_vhost):
    """check_request_param: list_to_integer(binary_to_list(Str)), for page and page_size whether or not a page is
    asked for: "1_0", " 2" or "" is badarg, 400 "Pagination parameters are invalid" (Python's int() takes the
    first two); a sign is an integer's."""
    path = f"/api/queues/{q(listed_vhost)}"
    for query in ("page=1&page_size=1_0", "page=1&page_size=%202", "page=", "page_size=x"):
        assert assert_error(call(broker, "GET", f"{path}?{query}"), 400) == {
            "error": "bad_request", "reason": "Pagination parameters are invalid"}, query
    assert call(broker, "GET", f"{path}?page=%2B1&page_size=02").json["page_size"] == 2


# -- definitions -------------------------------------------------------------------------------


def test_definitions_export_import_round_trip(broker, start_broker, uid):
    vhost, user = f"defs-{uid}", f"defs-{uid}"
    call(broker, "PUT", f"/api/vhosts/{q(vhost)}")
    make_user(broker, user, "monitoring", vhost=vhost, password="round-trip")
    v = q(vhost)
    call(broker, "PUT", f"/api/exchanges/{v}/ex", {"type": "topic", "durable": True, "arguments": {"x-y": "z"}})
    call(broker, "PUT", f"/api/exchanges/{v}/ex2", {"type": "headers", "durable": True})
    call(broker, "PUT", f"/api/queues/{v}/qq", {"durable": True, "arguments": {"x-max-length": 5}})
    call(broker, "POST", f"/api/bindings/{v}/e/ex/q/qq", {"routing_key": "a.*"})
    call(broker, "POST", f"/api/bindings/{v}/e/ex/e/ex2", {"routing_key": "b", "arguments": {"k": "v"}})
    exported = call(broker, "GET", "/api/definitions").json
    for key in ("rabbit_version", "users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies",
                "parameters"):
        assert key in exported, key
    assert any(u["name"] == user and u["tags"] == ["monitoring"] for u in exported["users"])
    assert not any(e["name"].startswith("amq.") or e["name"] == "" for e in exported["exchanges"])
    per_vhost = call(broker, "GET", f"/api/definitions/{v}").json
    assert {e["name"] for e in per_vhost["exchanges"]} == {"ex", "ex2"} and "vhost" not in per_vhost["queues"][0]
    assert "users" not in per_vhost

    fresh = start_broker()
    assert call(fresh, "POST", "/api/definitions", exported).status == 204
    again = call(fresh, "GET", "/api/definitions").json

    def mine(defs: dict, key: str) -> list:
        return sorted((json.dumps(item, sort_keys=True) for item in defs[key] if item.get("vhost") == vhost))

    for key in ("queues", "exchanges", "bindings", "permissions"):
        assert mine(again, key) == mine(exported, key), key
    assert {u["name"]: u["password_hash"] for u in again["users"]}[user] == \
        {u["name"]: u["password_hash"] for u in exported["users"]}[user]
    assert call(fresh, "GET", "/api/whoami", auth=(user, "round-trip")).json["tags"] == ["monitoring"]
    # importing one vhost's definitions into another vhost
    assert call(fresh, "PUT", "/api/vhosts/copy").status == 201
    assert call(fresh, "POST", "/api/definitions/copy", per_vhost).status == 204
    assert {q_["name"] for q_ in call(fresh, "GET", "/api/queues/copy").json} == {"qq"}
    # a queue there already is kept as it is (rabbit_definitions declares only what is not there); a malformed
    # import is a 400
    conflicting = {"queues": [{"name": "qq", "vhost": vhost, "durable": False, "auto_delete": False,
                               "arguments": {}}]}
    assert call(fresh, "POST", "/api/definitions", conflicting).status == 204
    assert call(fresh, "GET", f"/api/queues/{q(vhost)}/qq").json["durable"] is True
    assert_error(call(fresh, "POST", "/api/definitions", raw=b"nope"), 400)
    assert_error(call(fresh, "POST", "/api/definitions", {"queues": "x"}), 400)
    assert_error(call(fresh, "POST", "/api/definitions", {"queues": [{"name": "q", "vhost": "none"}]}), 400)
    call(broker, "DELETE", f"/api/vhosts/{v}")


# -- rates and metrics -------------------------------------------------------------------------


def test_rates_become_non_zero_after_traffic(broker, uid):
    connection = amqp(broker)
    channel = connection.channel()
    channel.queue_declare(uid)
    deadline = time.monotonic() + 7
    rate = 0.0
    while time.monotonic() < deadline:
        for _ in range(50):
            channel.basic_publish("", uid, b"r")
        connection.process_data_events(0)
        info = call(broker, "GET", f"/api/queues/%2F/{q(uid)}").json
        rate = info["message_stats"]["publish_details"]["rate"]
        if rate > 0:
            break
        time.sleep(0.5)
    assert rate > 0
    overview = call(broker, "GET", "/api/overview").json
    assert overview["message_stats"]["publish"] > 0
    assert "rate" in overview["message_stats"]["publish_details"]
    assert "rate" in overview["queue_totals"]["messages_details"]
    vhost = call(broker, "GET", "/api/vhosts/%2F").json
    assert vhost["message_stats"]["publish"] > 0
    channel.queue_delete(uid)
    connection.close()


QUEUE_STATS = {"publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "ack", "redeliver",
               "deliver_get"}


def test_message_stats_counters_per_object(broker, uid):
    """Queues, channels, vhosts and the overview count as RabbitMQ's do: vhost and node totals include what
    their queues delivered and had acked (also after a queue is deleted), basic.get on an empty queue counts."""
    vhost = f"stats-{uid}"
    assert call(broker, "PUT", f"/api/vhosts/{q(vhost)}").status == 201
    churn_before = call(broker, "GET", "/api/overview").json["churn_rates"]
    connection = amqp(broker, vhost)
    channel = connection.channel()
    channel.queue_declare(uid)
    for _ in range(5):
        channel.basic_publish("", uid, b"s")
    channel.basic_qos(prefetch_count=10)
    seen: list[int] = []
    channel.basic_consume(uid, lambda ch, method, props, body: seen.append(delivery_tag(method)))
    while len(seen) < 5:
        connection.process_data_events(0.1)
    channel.basic_ack(seen[-1], multiple=True)
    channel.basic_cancel(channel.consumer_tags[0])
    assert channel.basic_get(uid)[0] is None  # get_empty
    connection.process_data_events(0.2)
    stats = call(broker, "GET", f"/api/queues/{q(vhost)}/{q(uid)}").json["message_stats"]
    assert {k for k in stats if not k.endswith("_details")} == QUEUE_STATS
    assert (stats["publish"], stats["deliver"], stats["ack"], stats["get_empty"], stats["deliver_get"]) == \
        (5, 5, 5, 1, 5)
    ch_stats = next(c for c in call(broker, "GET", f"/api/vhosts/{q(vhost)}/channels").json)["message_stats"]
    assert (ch_stats["publish"], ch_stats["deliver"], ch_stats["ack"], ch_stats["get_empty"]) == (5, 5, 5, 1)
    expected = {"publish": 5, "deliver": 5, "ack": 5, "get_empty": 1, "deliver_get": 5}
    totals = call(broker, "GET", f"/api/vhosts/{q(vhost)}").json["message_stats"]
    assert {k: totals[k] for k in expected} == expected
    overview = call(broker, "GET", "/api/overview").json["message_stats"]
    assert all(overview[k] >= v for k, v in expected.items())
    churn = call(broker, "GET", "/api/overview").json["churn_rates"]
    assert {k: churn[k] - churn_before[k] for k in ("connection_created", "channel_created", "queue_declared",
                                                     "queue_created", "queue_deleted")} == {
        "connection_created": 1, "channel_created": 1, "queue_declared": 1, "queue_created": 1, "queue_deleted": 0}
    assert "rate" in churn["queue_deleted_details"]
    assert call(broker, "GET", "/api/nodes").json[0]["queue_created"] == churn["queue_created"]
    # the door side: confirms, unroutable messages dropped or returned, an exchange's messages in and out
    confirming = connection.channel()
    confirming.confirm_delivery()
    confirming.exchange_declare(uid, "direct")
    confirming.queue_bind(uid, uid, "routed")
    confirming.basic_publish(uid, "routed", b"in-and-out")
    confirming.basic_publish(uid, "nowhere", b"dropped")
    with pytest.raises(pika.exceptions.UnroutableError):
        confirming.basic_publish(uid, "nowhere", b"returned", mandatory=True)
    door = {"confirm": 3, "drop_unroutable": 1, "return_unroutable": 1}
    ch_stats = [c["message_stats"] for c in call(broker, "GET", f"/api/vhosts/{q(vhost)}/channels").json
                if c["confirm"]][0]
    assert {k: ch_stats[k] for k in door} == door
    totals = call(broker, "GET", f"/api/vhosts/{q(vhost)}").json["message_stats"]
    assert {k: totals[k] for k in door} == door
    exchange = call(broker, "GET", f"/api/exchanges/{q(vhost)}/{q(uid)}").json
    assert {k: exchange["message_stats"][k] for k in ("publish_in", "publish_out")} == {
        "publish_in": 3, "publish_out": 1}
    assert exchange["incoming"] == [] and exchange["outgoing"] == []
    name = call(broker, "GET", f"/api/vhosts/{q(vhost)}/connections").json[0]["name"]
    listed = call(broker, "GET", f"/api/connections/{q(name)}").json
    assert listed["recv_oct"] > 0 and listed["send_oct"] > 0 and listed["recv_cnt"] > 0
    assert "rate" in listed["recv_oct_details"]
    expected.update(door, publish=8)
    time.sleep(5.5)  # a sample of the queue's counters is taken (every 5 s) ...
    channel.queue_delete(uid)
    time.sleep(5.5)  # ... and the next one finds it gone: its counters stay in the vhost's totals
    totals = call(broker, "GET", f"/api/vhosts/{q(vhost)}").json["message_stats"]
    assert {k: totals[k] for k in expected} == expected
    rates = call(broker, "GET", f"/api/exchanges/{q(vhost)}/{q(uid)}").json["message_stats"]
    assert set(rates) == {"publish_in", "publish_in_details", "publish_out", "publish_out_details"}
    connection.close()
    call(broker, "DELETE", f"/api/vhosts/{q(vhost)}")


def test_metrics_are_prometheus_text(broker, uid):
    connection = amqp(broker)
    channel = connection.channel()
    channel.queue_declare(uid, durable=True)
    channel.basic_publish("", uid, b"m", pika.BasicProperties(delivery_mode=2))
    connection.process_data_events(0.2)
    response = call(broker, "GET", "/metrics", auth=None)
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.raw.decode())}
    for name in ("rabbitmq_queue_messages", "rabbitmq_connections", "rabbitmq_channels",
                 "rabbitmq_process_resident_memory_bytes", "warren_message_store_disk_bytes",
                 "warren_message_store_dead_fraction", "warren_message_store_compactions", "warren_queue_publish_rate"):
        assert name in families, name
    depth = {s.labels["queue"]: s.value for s in families["rabbitmq_queue_messages"].samples
             if s.labels["vhost"] == "/"}
    assert depth[uid] == 1
    assert families["rabbitmq_connections"].samples[0].value >= 1
    assert families["warren_message_store_disk_bytes"].samples[0].value > 0
    channel.queue_delete(uid)
    connection.close()


def test_metrics_follow_the_message_store(start_broker):
    """Disk use, dead fraction and compaction runs come from the store's own counters."""
    node = start_broker("--segment-size", str(64 * 1024), "--compaction-threshold", "0.3")

    def store_metrics() -> dict[str, float]:
        text = call(node, "GET", "/metrics", auth=None).raw.decode()
        return {f.name: f.samples[0].value for f in text_string_to_metric_families(text)
                if f.name.startswith("warren_message_store")}

    assert store_metrics()["warren_message_store_compactions"] == 0
    connection = amqp(node)
    channel = connection.channel()
    channel.confirm_delivery()
    for name in ("keep", "drop"):
        channel.queue_declare(name, durable=True)
    body = b"x" * 1024
    for _ in range(300):  # interleaved: every segment ends up half dead once "drop" is purged
        for name in ("keep", "drop"):
            channel.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
    before = store_metrics()
    assert before["warren_message_store_messages"] == 600 and before["warren_message_store_segments"] > 5
    assert before["warren_message_store_writes"] == 600
    assert call(node, "GET", "/api/overview").json["message_stats"]["disk_writes"] >= 600
    assert call(node, "GET", "/api/nodes").json[0]["msg_store_write_count"] >= 600
    assert before["warren_message_store_disk_bytes"] > 600 * 1024
    channel.queue_purge("drop")
    deadline = time.monotonic() + 20
    while store_metrics()["warren_message_store_compactions"] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    after = store_metrics()
    assert after["warren_message_store_compactions"] > 0
    assert after["warren_message_store_messages"] == 300
    assert after["warren_message_store_reads"] > 0  # compaction read the live records to copy them
    assert 0 <= after["warren_message_store_dead_fraction"] <= 1
    assert after["warren_message_store_disk_bytes"] < before["warren_message_store_disk_bytes"]
    connection.close()


def test_global_counters_by_protocol_never_go_down(start_broker):
    """rabbitmq_global_messages_*_total{protocol}: each front end's messages, kept when its connections close."""
    import asyncio

    import rstream
    from proton import Message
    from proton.utils import BlockingConnection

    stream_port = free_port()
    node = start_broker("--stream-enabled", "true", "--stream-port", str(stream_port))
    assert node.proc is not None
    wait_for_port(stream_port, node.proc)

    def counters() -> dict[tuple[str, str], float]:
        text = call(node, "GET", "/metrics", auth=None).raw.decode()
        return {(s.name, s.labels["protocol"]): s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name.startswith("rabbitmq_global_messages_")}

    assert {protocol for _, protocol in counters()} == {"amqp091", "amqp10", "stream"}
    connection = amqp(node)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("q091")
    for _ in range(3):
        channel.basic_publish("", "q091", b"m")
    channel.basic_publish("", "nowhere", b"m")  # dropped: not mandatory
    got = channel.basic_get("q091")
    assert got[0] is not None
    channel.basic_ack(delivery_tag(got[0]))
    assert channel.basic_get("q091", auto_ack=True)[0] is not None
    channel.queue_declare("q10")
    proton = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=10, allowed_mechs="PLAIN")
    sender = proton.create_sender("/queues/q10")
    for _ in range(2):
        sender.send(Message(body="m"))
    receiver = proton.create_receiver("/queues/q10", credit=2)
    for _ in range(2):
        receiver.receive(timeout=10)
        receiver.accept()

    async def stream() -> None:
        async with rstream.Producer("127.0.0.1", port=stream_port, username="guest", password="guest") as producer:
            await producer.create_stream("s")
            for body in (b"a", b"b", b"c", b"d"):
                await producer.send_wait("s", body)

    asyncio.run(asyncio.wait_for(stream(), 30))
    expected = {
        ("rabbitmq_global_messages_received_total", "amqp091"): 4,
        ("rabbitmq_global_messages_routed_total", "amqp091"): 3,
        ("rabbitmq_global_messages_unroutable_dropped_total", "amqp091"): 1,
        ("rabbitmq_global_messages_confirmed_total", "amqp091"): 4,
        ("rabbitmq_global_messages_delivered_get_manual_ack_total", "amqp091"): 1,
        ("rabbitmq_global_messages_delivered_get_auto_ack_total", "amqp091"): 1,
        ("rabbitmq_global_messages_acknowledged_total", "amqp091"): 1,
        ("rabbitmq_global_messages_received_total", "amqp10"): 2,
        ("rabbitmq_global_messages_confirmed_total", "amqp10"): 2,
        ("rabbitmq_global_messages_delivered_consume_manual_ack_total", "amqp10"): 2,
        ("rabbitmq_global_messages_received_total", "stream"): 4,
        ("rabbitmq_global_messages_confirmed_total", "stream"): 4,
    }
    deadline = time.monotonic() + 10
    while {key: counters().get(key) for key in expected} != expected and time.monotonic() < deadline:
        time.sleep(0.1)  # the last acknowledgement may still be on its way
    live = counters()
    assert {key: live[key] for key in expected} == expected
    proton.close()  # (its accepts go out as it closes)
    connection.close()
    deadline = time.monotonic() + 10
    while counters()[("rabbitmq_global_messages_acknowledged_total", "amqp10")] != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    after = counters()
    assert after[("rabbitmq_global_messages_acknowledged_total", "amqp10")] == 2
    assert all(after[key] >= value for key, value in live.items())  # what closed connections counted stays


def test_an_amqp10_connection_lists_its_sessions_and_links(start_broker):
    """GET /api/connections/{name}/sessions as RabbitMQ 4.x answers it; 400 for an AMQP 0-9-1 connection."""
    from proton import Message
    from proton.utils import BlockingConnection

    node = start_broker()
    setup = amqp(node)
    setup.channel().queue_declare("orders")
    proton = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=10, allowed_mechs="PLAIN")
    sender = proton.create_sender("/queues/orders", name="my sender")
    sender.send(Message(body="m"))
    proton.create_receiver("/queues/orders", name="my receiver", credit=5)
    deadline = time.monotonic() + 10
    while len(call(node, "GET", "/api/connections").json) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    listed = {c["protocol"]: c["name"] for c in call(node, "GET", "/api/connections").json}
    path = f"/api/connections/{q(listed['AMQP 1.0'])}/sessions"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        [session] = call(node, "GET", path).json
        if session["outgoing_links"] and session["outgoing_links"][0]["delivery_count"] == 1:
            break  # the receiver got the message
        time.sleep(0.1)
    assert session["channel_number"] == 0 and session["handle_max"] == 255
    for key in ("next_incoming_id", "incoming_window", "next_outgoing_id", "remote_incoming_window",
                "remote_outgoing_window"):
        assert isinstance(session[key], int), key
    assert session["outgoing_unsettled_deliveries"] == 1  # the receiver has not settled it
    [incoming] = session["incoming_links"]
    assert {k: incoming[k] for k in ("handle", "link_name", "target_address", "snd_settle_mode",
                                     "unconfirmed_messages", "delivery_count")} == {
        "handle": 0, "link_name": "my sender", "target_address": "/queues/orders", "snd_settle_mode": "mixed",
        "unconfirmed_messages": 0, "delivery_count": 1}
    assert isinstance(incoming["max_message_size"], int) and isinstance(incoming["credit"], int)
    [outgoing] = session["outgoing_links"]
    assert outgoing == {"handle": 1, "link_name": "my receiver", "source_address": "/queues/orders",
                        "queue_name": "orders", "delivery_count": 1, "credit": 4, "max_message_size": "unlimited",
                        "send_settled": False}
    response = call(node, "GET", f"/api/connections/{q(listed['AMQP 0-9-1'])}/sessions")
    assert response.status == 400 and response.json["reason"] == "connection does not use AMQP 1.0"
    proton.close()
    setup.close()


# Top-level fields RabbitMQ 3.10.8 answers with, recorded from a running node (Erlang-process fields and counts
# Warren does not keep are left out: see docs/http-api.md).
RABBITMQ_FIELDS = {
    "/api/overview": "churn_rates cluster_name contexts disable_stats enable_queue_totals erlang_full_version "
                     "erlang_version exchange_types listeners management_version message_stats node object_totals "
                     "product_name product_version queue_totals rabbitmq_version rates_mode "
                     "release_series_support_status sample_retention_policies statistics_db_event_queue",
    "/api/connections": "auth_mechanism channel_max channels client_properties connected_at frame_max host name node "
                        "peer_cert_issuer peer_cert_subject peer_cert_validity peer_host peer_port port protocol "
                        "recv_cnt recv_oct recv_oct_details send_cnt send_oct send_oct_details send_pend ssl "
                        "ssl_cipher ssl_hash ssl_key_exchange ssl_protocol state timeout type user "
                        "user_who_performed_action vhost",  # and user_provided_name if the client named it
    "/api/channels": "acks_uncommitted confirm connection_details consumer_count global_prefetch_count message_stats "
                     "messages_unacknowledged messages_uncommitted messages_unconfirmed name node number "
                     "pending_raft_commands prefetch_count state transactional user user_who_performed_action vhost",
    "/api/consumers": "ack_required active activity_status arguments channel_details consumer_tag exclusive "
                      "prefetch_count queue",
    "/api/exchanges/%2F/{x}": "arguments auto_delete durable incoming internal message_stats name outgoing type "
                              "user_who_performed_action vhost",
    "/api/queues/%2F/{q}": "arguments auto_delete consumer_capacity consumer_details consumer_utilisation consumers "
                           "deliveries durable effective_policy_definition exclusive exclusive_consumer_tag "
                           "head_message_timestamp incoming message_bytes message_bytes_persistent message_bytes_ready "
                           "message_bytes_unacknowledged message_stats messages messages_details messages_persistent "
                           "messages_ready "
                           "messages_ready_details messages_unacknowledged messages_unacknowledged_details name node "
                           "operator_policy policy recoverable_slaves single_active_consumer_tag state type vhost",
    "/api/vhosts/%2F": "cluster_state default_queue_type description message_stats messages messages_details "
                       "messages_ready messages_ready_details messages_unacknowledged "
                       "messages_unacknowledged_details metadata name recv_oct recv_oct_details send_oct "
                       "send_oct_details tags tracing",
    "/api/nodes": "applications auth_mechanisms channel_closed channel_closed_details channel_created "
                  "channel_created_details cluster_links config_files connection_closed connection_closed_details "
                  "connection_created connection_created_details contexts db_dir disk_free disk_free_details "
                  "disk_free_alarm disk_free_limit enabled_plugins exchange_types fd_total fd_used fd_used_details "
                  "log_files mem_alarm mem_limit mem_used mem_used_details msg_store_read_count "
                  "msg_store_read_count_details msg_store_write_count msg_store_write_count_details name "
                  "net_ticktime os_pid partitions proc_total proc_used processors sockets_used_details queue_created "
                  "queue_created_details queue_declared queue_declared_details queue_deleted queue_deleted_details "
                  "rates_mode run_queue running sockets_total sockets_used type uptime",
    "/api/bindings/%2F": "arguments destination destination_type properties_key routing_key source vhost",
    "/api/users": "hashing_algorithm limits name password_hash tags",
    "/api/permissions": "configure read user vhost write",
    "/api/whoami": "name tags",
}


def test_json_fields_match_rabbitmq(broker, uid):
    connection = amqp(broker)
    channel = connection.channel()
    channel.exchange_declare(uid, "topic")
    channel.queue_declare(uid)
    channel.queue_bind(uid, uid, "#")
    channel.basic_publish(uid, "k", b"m")
    channel.basic_consume(uid, lambda *args: None)
    connection.process_data_events(0.2)
    for path, fields in RABBITMQ_FIELDS.items():
        body = call(broker, "GET", path.format(q=q(uid), x=q(uid))).json
        items = body if isinstance(body, list) else [body]
        assert items, path
        for item in items:
            assert set(fields.split()) <= set(item), (path, sorted(set(fields.split()) - set(item)))
    channel.queue_delete(uid)
    channel.exchange_delete(uid)
    connection.close()


def test_malformed_bodies_are_400_never_500(broker, uid):
    """Every body-taking endpoint answers garbage with a 4xx and a reason; nothing escapes as a 500."""
    v, name = "%2F", q(uid)
    call(broker, "PUT", f"/api/queues/{v}/{name}", {"durable": False})
    call(broker, "PUT", f"/api/exchanges/{v}/{name}", {"type": "direct"})
    call(broker, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})
    endpoints = [("PUT", f"/api/queues/{v}/{name}-new"), ("PUT", f"/api/exchanges/{v}/{name}-new"),
                 ("POST", f"/api/exchanges/{v}/{name}/publish"), ("POST", f"/api/queues/{v}/{name}/get"),
                 ("POST", f"/api/bindings/{v}/e/{name}/q/{name}"), ("POST", f"/api/bindings/{v}/e/{name}/e/amq.direct"),
                 ("PUT", f"/api/users/{name}"), ("PUT", f"/api/permissions/{v}/{name}"),
                 ("POST", "/api/definitions"), ("POST", f"/api/definitions/{v}"),
                 ("POST", f"/api/queues/{v}/{name}/move"), ("PUT", f"/api/policies/{v}/{name}")]
    garbage = [b"{not json", b"[]", b'"text"', b"42", b"\xff\xfe",
               json.dumps({"durable": [], "arguments": "x", "type": 7, "count": "many", "ackmode": None,
                           "encoding": 1, "routing_key": {}, "payload": 5, "properties": [], "password": 1,
                           "tags": {}, "configure": 1, "queues": "all", "destination": [], "pattern": 3,
                           "definition": "x"}).encode()]
    for method, path in endpoints:
        for raw in garbage:
            response = call(broker, method, path, raw=raw)
            assert 400 <= response.status < 500, (method, path, raw, response.status, response.raw)
            assert response.json["reason"], (method, path, raw)
    call(broker, "DELETE", f"/api/queues/{v}/{name}")
    call(broker, "DELETE", f"/api/exchanges/{v}/{name}")
    call(broker, "DELETE", f"/api/users/{name}")


def test_a_null_body_is_an_empty_object_and_a_string_body_is_doubly_encoded(broker, uid):
    """rabbit_mgmt_util:decode/1: <<"null">> and <<"undefined">> are #{} ("some HTTP API clients include null for
    payload"), so is any JSON atom; a body that decodes to a string is refused with rabbitmq-management#839's
    reason."""
    for raw in (b"null", b"undefined", b"true", b" null "):
        path = f"/api/queues/%2F/{q(uid)}"
        made = call(broker, "PUT", path, raw=raw)
        assert made.status == 201, (raw, made.raw)
        assert call(broker, "GET", path).json["durable"] is False  # the defaults
        assert call(broker, "DELETE", path).status == 204
    refused = call(broker, "PUT", f"/api/queues/%2F/{q(uid)}", raw=b'"{\\"durable\\": true}"')
    assert assert_error(refused, 400) == {"error": "bad_request", "reason": "invalid payload: the request body "
                                          "JSON-decoded to a string. Is the input doubly-JSON-encoded?"}
    assert_error(call(broker, "GET", f"/api/queues/%2F/{q(uid)}"), 404)


def test_unknown_paths_and_methods(broker):
    assert_error(call(broker, "GET", "/api/no-such-thing"), 404)
    assert_error(call(broker, "GET", "/api/queues/%2F/no-such-queue"), 404)
    response = call(broker, "PATCH", "/api/overview")
    assert response.status == 405
    assert_error(call(broker, "GET", "/api/queues/no-such-vhost"), 404)
