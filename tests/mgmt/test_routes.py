"""Routes of RabbitMQ 3.10.8's management API (rabbit_mgmt_dispatcher, rabbit_shovel_mgmt:dispatcher) that tools
call, with RabbitMQ's methods, codes and shapes, over HTTP against a real node."""
from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request

import pika
import pytest

from conftest import node_fixture
from support import GUEST, assert_error, call, publish_to, q


def _user(broker, name: str, tags: str) -> tuple[str, str]:
    assert call(broker, "PUT", f"/api/users/{q(name)}", {"password": "pw", "tags": tags}).status == 201
    assert call(broker, "PUT", f"/api/permissions/%2F/{q(name)}",
                {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    return name, "pw"


def _until(predicate, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout}s")


@pytest.mark.parametrize("path", ["/api/overview", "/api/whoami", "/api/queues", "/api/health/checks/alarms"])
def test_head_answers_as_get_without_a_body(broker, path):
    """cowboy_rest answers HEAD wherever GET is allowed: GET's status and headers, no body."""
    request = urllib.request.Request(f"http://127.0.0.1:{broker.mgmt_port}{path}", method="HEAD",
                                     headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert (response.status, response.headers["Content-Type"], response.read()) == (200, "application/json", b"")
    assert call(broker, "HEAD", path, auth=None).status == 401


def test_connections_of_a_user_listed_and_closed(broker, uid):
    """rabbit_mgmt_wm_connection_user_name: the user's tracked connections as name/vhost/user/node, for monitoring
    users (GET) and administrators (DELETE), the list naming no owner; DELETE closes them all (204)."""
    owner = _user(broker, f"owner-{uid}", "management")
    monitor = _user(broker, f"monitor-{uid}", "monitoring")
    path = f"/api/connections/username/{q(owner[0])}"
    connections = [pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, "/", pika.PlainCredentials(*owner))) for _ in range(2)]
    try:
        listed = _until(lambda: len(call(broker, "GET", path).json) == 2 and call(broker, "GET", path).json,
                        "two connections")
        node = call(broker, "GET", "/api/overview").json["node"]
        assert all(set(c) == {"name", "vhost", "user", "node"} for c in listed)
        assert {(c["vhost"], c["user"], c["node"]) for c in listed} == {("/", owner[0], node)}
        assert call(broker, "GET", path, auth=monitor).json == listed
        for who in (owner, monitor):  # the owner too: the list is no object of one user
            assert assert_error(call(broker, "DELETE", path, auth=who), 401)["reason"] == \
                "User not authorised to access object"
        assert assert_error(call(broker, "GET", path, auth=owner), 401)["reason"] == \
            "User not authorised to access object"
        assert call(broker, "DELETE", path).status == 204
        for connection in connections:
            with pytest.raises(pika.exceptions.ConnectionClosed) as closed:
                connection.process_data_events(time_limit=5)
                connection.channel()
            assert "Closed via management plugin" in str(closed.value)
        _until(lambda: call(broker, "GET", path).json == [], "no connections")
        assert call(broker, "DELETE", f"/api/connections/username/nobody-{uid}").status == 204
    finally:
        for connection in connections:
            if connection.is_open:
                connection.close()


def test_feature_flag_enable(broker, uid):
    """rabbit_mgmt_wm_feature_flag_enable: PUT, administrators; an enabled flag stays so (204), an unknown one is
    rabbit_ff_extra:format_error(unsupported)."""
    assert call(broker, "PUT", "/api/feature-flags/quorum_queue/enable").status == 204
    assert call(broker, "PUT", "/api/feature-flags/no_such_flag/enable").json == \
        {"error": "bad_request", "reason": "unsupported"}
    assert assert_error(call(broker, "PUT", "/api/feature-flags/quorum_queue/enable",
                             auth=_user(broker, f"ff-{uid}", "monitoring")), 401)["reason"] == \
        "Not administrator user"
    assert call(broker, "GET", "/api/feature-flags/quorum_queue/enable").status == 405


def test_all_configuration_is_definitions(broker, uid):
    """/api/all-configuration is rabbit_mgmt_wm_definitions under its older name: GET exports, POST imports."""
    queue = f"allconf-{uid}"
    assert call(broker, "POST", "/api/all-configuration", {"queues": [
        {"name": queue, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]}).status == 204
    exported = call(broker, "GET", "/api/all-configuration").json
    assert queue in {item["name"] for item in exported["queues"]}
    assert exported.keys() == call(broker, "GET", "/api/definitions").json.keys()
    assert call(broker, "DELETE", f"/api/queues/%2F/{queue}").status == 204


def test_topic_permission_of_one_exchange(broker, uid):
    """/api/topic-permissions/{vhost}/{user}/{exchange} (rabbit_mgmt_wm_topic_permission): GET and PUT as without
    the exchange, DELETE clears only that exchange's; 404 once the user has none in the vhost."""
    user = _user(broker, f"topic-{uid}", "")[0]
    base = f"/api/topic-permissions/%2F/{q(user)}"
    assert call(broker, "GET", base + "/amq.topic").status == 404
    assert call(broker, "PUT", base + "/ignored", {"exchange": "amq.topic", "write": "w", "read": "r"}).status == 201
    assert call(broker, "PUT", base, {"exchange": "amq.direct", "write": "w", "read": "r"}).status == 204
    both = call(broker, "GET", base + "/whatever").json
    assert [item["exchange"] for item in both] == ["amq.direct", "amq.topic"]
    assert both == call(broker, "GET", base).json
    assert call(broker, "DELETE", base + "/amq.topic").status == 204
    assert [item["exchange"] for item in call(broker, "GET", base).json] == ["amq.direct"]
    assert call(broker, "DELETE", base + "/never-set").status == 204
    assert call(broker, "DELETE", base + "/amq.direct").status == 204
    assert call(broker, "DELETE", base + "/amq.direct").status == 404
    assert call(broker, "DELETE", f"/api/topic-permissions/%2F/nobody-{uid}/amq.topic").status == 404


def test_one_shovel_shown_and_deleted(broker, uid):
    """/api/shovels/vhost/{vhost}/{name} (rabbit_shovel_mgmt): 404 unless the shovel exists; GET then lists every
    shovel of the vhost (its to_json filters by vhost only); DELETE clears its parameter (204), monitoring users
    may."""
    names = [f"sh-{uid}-a", f"sh-{uid}-b"]
    for name in names:
        assert call(broker, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
            "src-uri": "amqp://", "src-queue": f"{name}-src", "dest-uri": "amqp://",
            "dest-queue": f"{name}-dest"}}).status == 201
    path = f"/api/shovels/vhost/%2F/{names[0]}"
    listed = _until(lambda: {s["name"] for s in call(broker, "GET", path).json} >= set(names) and
                    call(broker, "GET", path).json, "both shovels")
    assert {s["vhost"] for s in listed} == {"/"}
    assert call(broker, "GET", path + "/restart").json == listed  # the same resource
    monitor = _user(broker, f"shmon-{uid}", "monitoring")
    assert call(broker, "DELETE", path, auth=monitor).status == 204
    assert names[0] not in {p["name"] for p in call(broker, "GET", "/api/parameters/shovel/%2F").json}
    _until(lambda: call(broker, "GET", path).status == 404, "the shovel gone")
    assert call(broker, "DELETE", path).status == 404
    assert call(broker, "GET", f"/api/shovels/vhost/nosuchvhost-{uid}/{names[1]}").status == 404
    assert_error(call(broker, "DELETE", f"/api/shovels/vhost/%2F/{names[1]}",
                      auth=_user(broker, f"shplain-{uid}", "management")), 401)
    assert call(broker, "DELETE", f"/api/shovels/vhost/%2F/{names[1]}", auth=GUEST).status == 204


stream_node = node_fixture(streams=True, name="stream_node")


def test_stream_connections(stream_node, uid):
    """rabbitmq_stream_management's /api/stream/connections[/{vhost}[/{name}]]: the connections of protocol
    ``stream`` (rabbit_stream_reader's i(protocol)) as /api/connections shows them; GET for the owner or monitoring
    users, DELETE for the owner or administrators, closing it."""
    rstream = pytest.importorskip("rstream")
    owner = _user(stream_node, f"streamer-{uid}", "management")
    other = _user(stream_node, f"other-{uid}", "management")

    async def scenario() -> None:
        producer = rstream.Producer("127.0.0.1", port=stream_node.stream_port, username=owner[0],
                                    password=owner[1], connection_name=f"probe-{uid}")
        await producer.start()
        amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", stream_node.port))
        try:
            await producer.create_stream(f"s-{uid}", exists_ok=True)
            await producer.send(f"s-{uid}", rstream.AMQPMessage(body=b"x"))  # (rstream reconnects to publish)
            for _ in range(100):
                listed = call(stream_node, "GET", "/api/stream/connections").json
                if listed:
                    break
                await asyncio.sleep(0.1)
            assert {c["user"] for c in listed} == {owner[0]}
            mine = listed[0]
            assert mine["protocol"] == "stream"
            assert mine["client_properties"]["connection_name"].endswith(f"probe-{uid}")
            everything = {c["name"]: c["protocol"] for c in call(stream_node, "GET", "/api/connections").json}
            assert everything[mine["name"]] == "stream" and "AMQP 0-9-1" in everything.values()
            names = [c["name"] for c in listed]
            assert [c["name"] for c in call(stream_node, "GET", "/api/stream/connections/%2F").json] == names
            assert [c["name"] for c in call(stream_node, "GET", "/api/stream/connections", auth=owner).json] == names
            assert call(stream_node, "GET", "/api/stream/connections", auth=other).json == []
            path = f"/api/stream/connections/%2F/{q(mine['name'])}"
            shown = call(stream_node, "GET", path, auth=owner).json
            assert (shown["name"], shown["user"], shown["protocol"]) == (mine["name"], owner[0], "stream")
            assert_error(call(stream_node, "GET", path, auth=other), 401)
            assert_error(call(stream_node, "DELETE", path, auth=other), 401)
            assert call(stream_node, "GET", f"/api/stream/connections/nosuch/{q(mine['name'])}").status == 404
            assert call(stream_node, "GET", "/api/stream/connections/nosuch").status == 404
            assert call(stream_node, "DELETE", path).status == 204
            for _ in range(100):
                if mine["name"] not in {c["name"] for c in call(stream_node, "GET", "/api/stream/connections").json}:
                    break
                await asyncio.sleep(0.1)
            assert call(stream_node, "GET", path).status == 404
        finally:
            amqp.close()
            await producer.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_auth_attempts_reset(broker, uid):
    """DELETE /api/auth/attempts/{node}[/source] (rabbit_mgmt_wm_auth_attempts): monitoring users reset the node's
    counts (rabbit_core_metrics:reset_auth_attempt_metrics), 204; another node is 404."""
    node = call(broker, "GET", "/api/overview").json["node"]
    assert call(broker, "GET", "/api/overview", auth=("guest", "wrong")).status == 401
    monitor = _user(broker, f"attempts-{uid}", "monitoring")
    assert call(broker, "DELETE", f"/api/auth/attempts/{q(node)}", auth=monitor).status == 204
    # only this GET's own login counted since
    assert call(broker, "GET", f"/api/auth/attempts/{q(node)}").json == [
        {"protocol": "http", "auth_attempts": 1, "auth_attempts_failed": 0, "auth_attempts_succeeded": 1}]
    assert call(broker, "DELETE", f"/api/auth/attempts/{q(node)}/source").status == 204
    assert call(broker, "DELETE", "/api/auth/attempts/nosuch@node").status == 404
    assert_error(call(broker, "DELETE", f"/api/auth/attempts/{q(node)}",
                      auth=_user(broker, f"attempts-plain-{uid}", "management")), 401)


def test_vhost_start(broker, uid):
    """POST /api/vhosts/{vhost}/start/{node} (rabbit_mgmt_wm_vhost_restart): administrators; a running vhost is
    ``already_started`` (204), a node that is not running is {badrpc, nodedown} (400), an unknown vhost
    ``no_such_vhost`` (400: a POST goes on past resource_exists)."""
    node = call(broker, "GET", "/api/overview").json["node"]
    assert call(broker, "POST", f"/api/vhosts/%2F/start/{q(node)}", {}).status == 204
    assert call(broker, "POST", "/api/vhosts/%2F/start/other@host", {}).json == \
        {"error": "bad_request", "reason": "Request to node other@host failed with nodedown"}
    assert call(broker, "POST", f"/api/vhosts/nosuch-{uid}/start/{q(node)}", {}).json == {
        "error": "bad_request", "reason": f'Request to node {node} failed with {{no_such_vhost,<<"nosuch-{uid}">>}}'}
    assert_error(call(broker, "POST", f"/api/vhosts/%2F/start/{q(node)}", {},
                      auth=_user(broker, f"vstart-{uid}", "monitoring")), 401)


@pytest.mark.parametrize("path, allowed", [
    ("/api/queues/%2F/x", "HEAD, GET, PUT, DELETE, OPTIONS"),
    ("/api/exchanges/%2F/x/publish", "POST, OPTIONS"),
    ("/api/definitions", "HEAD, GET, POST, OPTIONS"),
    ("/api/no-such-resource", "HEAD, GET, OPTIONS"),
])
def test_options_needs_no_login(broker, path, allowed):
    """OPTIONS: rabbit_mgmt_util:is_authorized lets it through without credentials, and cowboy_rest answers 200,
    no body, the resource's allowed_methods in ``Allow``."""
    response = call(broker, "OPTIONS", path, auth=None)
    assert (response.status, response.headers["Allow"], response.raw) == (200, allowed, b"")


def test_queue_actions(broker, uid):
    """POST /api/queues/{vhost}/{name}/actions (rabbit_mgmt_wm_queue_actions): administrators; ``sync`` and
    ``cancel_sync`` of a queue without mirrors are 204, another action is ``{unknown, Action}``, no action
    ``key_missing``."""
    queue = f"/api/queues/%2F/actions-{uid}"
    assert call(broker, "PUT", queue, {}).status == 201
    for action in ("sync", "cancel_sync"):
        assert call(broker, "POST", queue + "/actions", {"action": action}).status == 204
    assert call(broker, "POST", queue + "/actions", {"action": "bogus"}).json == \
        {"error": "bad_request", "reason": ["unknown", "bogus"]}
    assert call(broker, "POST", queue + "/actions", {"action": 5}).json["reason"] == ["unknown", 5]
    assert call(broker, "POST", queue + "/actions", {}).json["reason"] == "[{key_missing,action}]"
    assert call(broker, "POST", f"/api/queues/%2F/nosuch-{uid}/actions", {"action": "sync"}).status == 404
    assert_error(call(broker, "POST", queue + "/actions", {"action": "sync"},
                      auth=_user(broker, f"actions-{uid}", "monitoring")), 401)
    assert call(broker, "DELETE", queue).status == 204


@pytest.mark.parametrize("path", ["/api/vhost-limits", "/api/vhost-limits/%2F", "/api/user-limits",
                                  "/api/user-limits/guest"])
def test_limits_answer_get_not_head(broker, path):
    """rabbit_mgmt_wm_limits and rabbit_mgmt_wm_user_limits allow GET and OPTIONS only: HEAD is a 405."""
    assert call(broker, "GET", path).status == 200
    assert call(broker, "HEAD", path).status == 405
    assert call(broker, "OPTIONS", path, auth=None).headers["Allow"] == "GET, OPTIONS"


@pytest.mark.parametrize("path, allowed, refused", [
    ("/api/users/bulk-delete", "POST, OPTIONS", ("GET", "HEAD", "PUT", "DELETE")),
    ("/api/users/without-permissions", "HEAD, GET, OPTIONS", ("PUT", "DELETE")),
])
def test_literal_path_before_its_pattern(broker, path, allowed, refused):
    """rabbit_mgmt_dispatcher lists /users/bulk-delete and /users/without-permissions before /users/:user, so
    cowboy_router gives them their own resource (rabbit_mgmt_wm_users_bulk_delete, rabbit_mgmt_wm_users): another
    method is its 405, never the user resource's (no user of that name made, shown or deleted)."""
    name = path.rsplit("/", 1)[1]
    for method in refused:
        body = {"password": "pw", "tags": ""} if method == "PUT" else None
        for auth in (GUEST, None):
            response = call(broker, method, path, body, auth=auth)
            assert (response.status, response.headers["Allow"], response.raw) == (405, allowed, b""), \
                (method, auth, response.status, response.raw)
    assert name not in {u["name"] for u in call(broker, "GET", "/api/users").json}
    assert call(broker, "OPTIONS", path, auth=None).headers["Allow"] == allowed
    assert call(broker, "OPTIONS", "/api/users/someone", auth=None).headers["Allow"] == \
        "HEAD, GET, PUT, DELETE, OPTIONS"


def test_rebalance_queues(broker, uid):
    """POST /api/rebalance/queues (rabbit_mgmt_wm_rebalance_queues): administrators only; it spawns
    rabbit_amqqueue:rebalance and answers 204 with no body whatever it moves (on one node nothing: each node's
    share is every queue); POST is its only method."""
    response = call(broker, "POST", "/api/rebalance/queues", {"anything": "ignored"})
    assert (response.status, response.raw) == (204, b"")
    assert assert_error(call(broker, "POST", "/api/rebalance/queues", {},
                             auth=_user(broker, f"rebal-{uid}", "monitoring")), 401)["reason"] == \
        "Not administrator user"
    assert call(broker, "GET", "/api/rebalance/queues").headers["Allow"] == "POST, OPTIONS"
    assert call(broker, "OPTIONS", "/api/rebalance/queues", auth=None).headers["Allow"] == "POST, OPTIONS"


PUBLISHER_FIELDS = {"publisher_id", "reference", "published", "confirmed", "errored", "queue", "connection_details"}
CONSUMER_FIELDS = {"subscription_id", "credits", "consumed", "offset", "offset_lag", "properties", "queue",
                   "connection_details"}


def test_stream_publishers_and_consumers(stream_node, uid):
    """rabbitmq_stream_management's /api/stream/publishers[/{vhost}[/{stream}]], /api/stream/consumers[/{vhost}]
    and /api/stream/connections/{vhost}/{name}/publishers|consumers: rabbit_stream_metrics' rows (a publisher's
    id, reference and published/confirmed/errored counts; a subscription's id, credits, messages consumed, the
    first offset of the chunk last sent, its lag behind the newest chunk, its properties) with their stream and
    connection_details.  The listings are for any management user, a monitoring user's whole, another's those of
    its own connections; a vhost or stream not there is 404; a connection's are its owner's or a monitoring user's
    (rabbit_mgmt_wm_connection:conn: found by name alone)."""
    rstream = pytest.importorskip("rstream")
    owner = _user(stream_node, f"sowner-{uid}", "management")
    other = _user(stream_node, f"sother-{uid}", "management")
    monitor = _user(stream_node, f"smon-{uid}", "monitoring")
    stream = f"pc-{uid}"
    node = call(stream_node, "GET", "/api/overview").json["node"]

    def mine(path: str, who=GUEST) -> list:
        return [row for row in call(stream_node, "GET", path, auth=who).json
                if row["connection_details"]["user"] == owner[0]]

    async def scenario() -> None:
        producer = rstream.Producer("127.0.0.1", port=stream_node.stream_port, username=owner[0],
                                    password=owner[1])
        consumer = rstream.Consumer("127.0.0.1", port=stream_node.stream_port, username=owner[0],
                                    password=owner[1])
        await producer.start()
        await consumer.start()
        got: list = []
        try:
            await producer.create_stream(stream, exists_ok=True)
            for body in (b"a", b"b", b"c"):
                await producer.send_wait(stream, rstream.AMQPMessage(body=body), publisher_name=f"ref-{uid}")
            await consumer.subscribe(stream, lambda message, context: got.append(bytes(message)),
                                     properties={"purpose": "probe"},
                                     offset_specification=rstream.ConsumerOffsetSpecification(
                                         rstream.OffsetType.FIRST))
            for _ in range(100):
                if len(got) == 3:
                    break
                await asyncio.sleep(0.1)
            assert len(got) == 3

            [publisher] = mine("/api/stream/publishers")
            assert set(publisher) == PUBLISHER_FIELDS
            assert (publisher["reference"], publisher["published"], publisher["confirmed"], publisher["errored"],
                    publisher["queue"]) == (f"ref-{uid}", 3, 3, 0, {"name": stream, "vhost": "/"})
            details = publisher["connection_details"]
            assert (set(details), details["node"]) == ({"name", "user", "node", "peer_host", "peer_port"}, node)
            [consumer_row] = mine("/api/stream/consumers")
            assert set(consumer_row) == CONSUMER_FIELDS
            assert (consumer_row["consumed"], consumer_row["offset"], consumer_row["offset_lag"],
                    consumer_row["queue"]) == (3, 2, 0, {"name": stream, "vhost": "/"})
            assert consumer_row["properties"]["purpose"] == "probe"
            assert isinstance(consumer_row["credits"], int) and isinstance(consumer_row["subscription_id"], int)

            assert mine("/api/stream/publishers/%2F") == [publisher]
            assert mine(f"/api/stream/publishers/%2F/{q(stream)}") == [publisher]
            assert mine("/api/stream/consumers/%2F") == [consumer_row]
            assert mine("/api/stream/publishers", monitor) == [publisher]
            assert mine("/api/stream/publishers", owner) == [publisher]
            assert call(stream_node, "GET", "/api/stream/publishers", auth=other).json == []
            assert call(stream_node, "GET", "/api/stream/consumers", auth=other).json == []
            for path in ("/api/stream/publishers/nosuch", f"/api/stream/publishers/%2F/nosuch-{uid}",
                         f"/api/stream/publishers/nosuch/{q(stream)}", "/api/stream/consumers/nosuch"):
                assert call(stream_node, "GET", path).status == 404, path

            by_connection = f"/api/stream/connections/%2F/{q(details['name'])}"
            assert call(stream_node, "GET", by_connection + "/publishers", auth=owner).json == [publisher]
            assert call(stream_node, "GET", by_connection + "/publishers", auth=monitor).json == [publisher]
            assert_error(call(stream_node, "GET", by_connection + "/publishers", auth=other), 401)
            consumed_on = q(consumer_row["connection_details"]["name"])
            assert call(stream_node, "GET", f"/api/stream/connections/any/{consumed_on}/consumers").json == \
                [consumer_row]
            assert call(stream_node, "GET", f"/api/stream/connections/%2F/nosuch-{uid}/consumers").status == 404
        finally:
            await consumer.close()
            await producer.close()
        for _ in range(100):
            if not mine("/api/stream/publishers") and not mine("/api/stream/consumers"):
                break
            await asyncio.sleep(0.1)
        assert mine("/api/stream/publishers") == mine("/api/stream/consumers") == []

    asyncio.run(asyncio.wait_for(scenario(), 60))


MEMORY_CATEGORIES = {  # rabbit_vm:memory/0's
    "connection_readers", "connection_writers", "connection_channels", "connection_other", "queue_procs",
    "queue_slave_procs", "quorum_queue_procs", "quorum_queue_dlx_procs", "stream_queue_procs",
    "stream_queue_replica_reader_procs", "stream_queue_coordinator_procs", "plugins", "other_proc", "metrics",
    "mgmt_db", "mnesia", "quorum_ets", "other_ets", "binary", "msg_index", "code", "atom", "other_system",
    "allocated_unused", "reserved_unallocated"}


def test_node_memory(broker, uid):
    """GET /api/nodes/{node}/memory[/relative] (rabbit_mgmt_wm_node_memory): monitoring users; rabbit_vm:memory/0's
    categories, ``strategy`` and ``total``, or each in percent of the RSS (``total`` 100); another node 404.
    The bodies a classic or quorum queue holds show as queue_procs and quorum_queue_procs, and the categories
    add up to the RSS."""
    node = call(broker, "GET", "/api/overview").json["node"]
    path = f"/api/nodes/{q(node)}/memory"

    def memory() -> dict:
        found = call(broker, "GET", path).json["memory"]
        assert set(found) == MEMORY_CATEGORIES | {"strategy", "total"} and found["strategy"] == "rss"
        assert set(found["total"]) == {"erlang", "rss", "allocated"} and found["total"]["rss"] > 0
        assert all(isinstance(found[key], int) and found[key] >= 0 for key in MEMORY_CATEGORIES)
        assert sum(found[key] for key in MEMORY_CATEGORIES) == found["total"]["rss"]
        return found

    before = memory()
    classic, quorum = f"mem-classic-{uid}", f"mem-quorum-{uid}"
    assert call(broker, "PUT", f"/api/queues/%2F/{classic}", {}).status == 201
    assert call(broker, "PUT", f"/api/queues/%2F/{quorum}", {"durable": True,
                                                              "arguments": {"x-queue-type": "quorum"}}).status == 201
    try:
        publish_to(broker, classic, [b"x" * (1 << 20)] * 4)
        publish_to(broker, quorum, [b"x" * 1000] * 2000)  # (bodies that large would be left in its store)
        held = memory()
        assert held["queue_procs"] - before["queue_procs"] >= 4 << 20
        assert held["quorum_queue_procs"] - before["quorum_queue_procs"] >= 500_000  # (the head of it, at least)
        shares = call(broker, "GET", path + "/relative").json["memory"]
        assert set(shares) == MEMORY_CATEGORIES | {"total"} and shares["total"] == 100
        assert all(isinstance(shares[key], int) and 0 <= shares[key] <= 100 for key in MEMORY_CATEGORIES)
        assert shares["queue_procs"] >= 1 and shares["quorum_queue_procs"] >= 1
    finally:
        for queue in (classic, quorum):
            assert call(broker, "DELETE", f"/api/queues/%2F/{queue}").status == 204
    assert memory()["queue_procs"] <= held["queue_procs"] - (4 << 20)
    assert assert_error(call(broker, "GET", path, auth=_user(broker, f"mem-{uid}", "management")), 401)["reason"] == \
        "Not monitor user"
    assert call(broker, "GET", "/api/nodes/nosuch@nowhere/memory").status == 404
    assert call(broker, "GET", "/api/nodes/nosuch@nowhere/memory/relative").status == 404


@pytest.mark.parametrize("method, path, allowed", [
    ("PUT", "/api/overview", "HEAD, GET, OPTIONS"),
    ("GET", "/api/exchanges/%2F/amq.direct/publish", "POST, OPTIONS"),
    ("DELETE", "/api/vhost-limits", "GET, OPTIONS"),
    ("PUT", "/api/no-such-resource", "HEAD, GET, OPTIONS"),
])
def test_a_method_not_allowed_is_405_before_any_login(broker, method, path, allowed):
    """cowboy_rest asks allowed_methods before is_authorized: a method the resource does not allow is 405, its
    allowed methods in ``Allow`` as cowboy writes them, with or without credentials (a path no API resource has
    is the UI's files: cowboy_static's GET and HEAD); the connection then takes its next request, logged in."""
    for auth in (GUEST, None):
        response = call(broker, method, path, auth=auth)
        assert (response.status, response.headers["Allow"], response.raw) == (405, allowed, b""), auth
    connection = http.client.HTTPConnection("127.0.0.1", broker.mgmt_port, timeout=10)
    try:
        connection.request(method, path)
        answer = connection.getresponse()
        assert (answer.status, answer.read()) == (405, b"")
        connection.request("GET", "/api/whoami", headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        answer = connection.getresponse()
        assert (answer.status, json.loads(answer.read())["name"]) == (200, "guest")
    finally:
        connection.close()
