"""Dynamic shovels between Warren nodes, driven as users drive RabbitMQ's: runtime parameters over HTTP, pika
clients on both sides, nodes killed with SIGKILL mid-transfer under ack-mode on-confirm (nothing lost)."""
from __future__ import annotations

import asyncio
import struct
import time
from functools import partial
from typing import Any

import pika
import pytest
from aiohttp import web
from pamqp import commands

from amqp_server.access_control import AccessControl
from amqp_server.definition_store import DefinitionStore
from amqp_server.framing import header_table
from amqp_server.framing.header_table import Field
from conftest import connect, free_port
from mgmt_http.forward import Forwarder
from test_tls import PKI, start_tls_node
from support import Raw, assert_error, call, drain_consumed, publish_pipelined, raw_frame

drain = partial(drain_consumed, keep=lambda got: (got.body, got.properties))

SHOVEL = "/api/parameters/shovel/%2F/"
N = 3000


def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def publish(node, queue: str, count: int, start: int = 0) -> None:
    """``count`` persistent messages, numbered from ``start``, to a durable ``queue``."""
    publish_pipelined(node, queue, [str(i) for i in range(start, start + count)], declare=True, delivery_mode=2,
                      headers={"kept": True}, content_type="text/plain")


def depth(node, queue: str) -> int:
    try:
        connection = connect(node)
    except pika.exceptions.AMQPError:
        return -1
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return -1
    finally:
        if connection.is_open:
            connection.close()


def shovel_status(node, name: str) -> dict[str, Any] | None:
    found = [s for s in call(node, "GET", "/api/shovels").json or [] if s["name"] == name]
    return found[0] if found else None


def publish_typed(node, queue: str, headers: dict[str, Field], exchange: str = "") -> None:
    """One message to a durable ``queue`` (declared), or to ``exchange`` with routing key ``queue``, with
    ``headers`` written in their AMQP types (pika picks its own), confirmed."""
    raw = Raw(node, timeout=10)
    try:
        raw.handshake()
        raw.open_channel()
        if not exchange:
            raw.send_method(1, commands.Queue.Declare(queue=queue, durable=True))
            raw.expect(commands.Queue.DeclareOk)
        raw.send_method(1, commands.Confirm.Select())
        raw.expect(commands.Confirm.SelectOk)
        raw.send_method(1, commands.Basic.Publish(exchange=exchange, routing_key=queue))
        table = header_table.encode(headers)
        header = struct.pack(">HHQHI", 60, 0, 1, 0x2000, len(table)) + table
        raw.send(raw_frame(2, 1, header) + raw_frame(3, 1, b"x"))
        raw.expect(commands.Basic.Ack)
    finally:
        raw.close()


def typed_headers(node, queue: str) -> dict[str, Field]:
    """The headers of ``queue``'s next message (taken) in the AMQP types the node sent them in."""
    raw = Raw(node, timeout=10)
    try:
        raw.handshake()
        raw.open_channel()
        raw.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
        raw.expect(commands.Basic.GetOk)
        while len(raw.buf) < 7 or len(raw.buf) < 8 + struct.unpack_from(">BHI", raw.buf)[2]:
            raw.buf += raw.recv()
        header = raw.buf[7:7 + struct.unpack_from(">BHI", raw.buf)[2]]
        return header_table.headers(header, header[12] << 8 | header[13])
    finally:
        raw.close()


def test_a_shovel_moves_a_queue_keeping_each_message_whole(start_broker):
    node = start_broker()
    publish(node, "src", 200)
    response = call(node, "PUT", SHOVEL + "move", {"value": {"src-uri": "amqp://", "src-queue": "src",
                                                             "dest-uri": ["amqp://"], "dest-queue": "dest"}})
    assert response.status == 201, response.raw
    wait_for(lambda: depth(node, "dest") == 200, what="200 messages in dest")
    assert depth(node, "src") == 0
    status = wait_for(lambda: shovel_status(node, "move"), what="status")
    assert status["state"] == "running" and status["type"] == "dynamic" and status["vhost"] == "/"
    assert status["src_uri"] == status["dest_uri"] == "amqp://"
    assert status["src_queue"] == "src" and status["dest_queue"] == "dest" and status["node"]
    got = drain(node, "dest")
    assert [body for body, _ in got] == [str(i).encode() for i in range(200)]  # in order
    _, properties = got[7]
    assert properties.headers == {"kept": True} and properties.content_type == "text/plain"
    assert properties.delivery_mode == 2 and properties.message_id is None  # nothing added
    assert call(node, "GET", SHOVEL + "move").json["value"]["dest-queue"] == "dest"
    assert call(node, "DELETE", SHOVEL + "move").status == 204
    wait_for(lambda: shovel_status(node, "move") is None, what="the shovel to stop")
    publish(node, "src", 5)
    time.sleep(1)
    assert depth(node, "src") == 5 and depth(node, "dest") == 0


def test_forward_headers_timestamp_and_publish_properties(start_broker):
    node = start_broker()
    connection = connect(node)
    channel = connection.channel()
    channel.exchange_declare("fwd-x", "topic")
    channel.queue_declare("fwd-dest", durable=True)
    channel.queue_bind("fwd-dest", "amq.topic", "moved.#")
    response = call(node, "PUT", SHOVEL + "fwd", {"value": {
        "src-uri": "amqp://", "src-exchange": "fwd-x", "src-exchange-key": "a.*",
        "dest-uri": "amqp://", "dest-exchange": "amq.topic", "dest-exchange-key": "moved.here",
        "add-forward-headers": True, "dest-add-timestamp-header": True,
        "dest-publish-properties": {"app_id": "shovelled", "delivery_mode": 2}}})
    assert response.status == 201, response.raw
    wait_for(lambda: (shovel_status(node, "fwd") or {}).get("state") == "running", what="running")
    channel.basic_publish("fwd-x", "a.b", b"hello", pika.BasicProperties(headers={"k": "v"}))
    channel.basic_publish("fwd-x", "z.b", b"not bound", pika.BasicProperties())
    wait_for(lambda: depth(node, "fwd-dest") == 1, what="one message moved")
    (body, properties), = drain(node, "fwd-dest")
    assert body == b"hello" and properties.app_id == "shovelled" and properties.delivery_mode == 2
    headers = properties.headers
    assert headers["k"] == "v" and isinstance(headers["x-shovelled-timestamp"], int)
    shovelled, = headers["x-shovelled"]
    assert shovelled["shovel-name"] == "fwd" and shovelled["shovel-vhost"] == "/"
    assert shovelled["shovel-type"] == "dynamic" and shovelled["src-exchange"] == "fwd-x"
    assert shovelled["src-exchange-key"] == "a.*" and shovelled["dest-exchange"] == "amq.topic"
    connection.close()


@pytest.mark.parametrize("change", [{"dest-add-forward-headers": True}, {"add-timestamp-header": True},
                                    {"dest-publish-properties": {"app_id": "shovelled"}}])
def test_a_message_whose_properties_the_shovel_changes_keeps_its_own_headers_types_and_values(start_broker,
                                                                                             change):
    """RabbitMQ's shovel edits the message's typed header table (rabbit_shovel_util:update_headers,
    add_timestamp_header; set_properties leaves it be): a double stays a double, a long a long."""
    node = start_broker()
    value = {"src-uri": "amqp://", "src-queue": "ht-src", "dest-uri": "amqp://", "dest-queue": "ht-dest", **change}
    assert call(node, "PUT", SHOVEL + "ht", {"value": value}).status == 201
    wait_for(lambda: (shovel_status(node, "ht") or {}).get("state") == "running", what="running")
    own = {"ratio": Field("d", 0.1), "small": Field("l", 5), "flag": Field("t", 1), "u": Field("u", 7)}
    publish_typed(node, "ht-src", own)
    wait_for(lambda: depth(node, "ht-dest") == 1, what="moved")
    headers = typed_headers(node, "ht-dest")
    assert {name: headers[name] for name in own} == own, headers


def test_the_timestamp_header_is_a_long_and_the_hop_a_table_of_longstrs(start_broker):
    """rabbit_shovel_util: x-shovelled-timestamp is set as a ``long`` ('l'), x-shovelled's entry is longstrs."""
    node = start_broker()
    value = {"src-uri": "amqp://", "src-queue": "ts-src", "dest-uri": "amqp://", "dest-queue": "ts-dest",
             "dest-add-timestamp-header": True, "dest-add-forward-headers": True}
    assert call(node, "PUT", SHOVEL + "ts", {"value": value}).status == 201
    wait_for(lambda: (shovel_status(node, "ts") or {}).get("state") == "running", what="running")
    publish_pipelined(node, "ts-src", ["x"], declare=True)
    wait_for(lambda: depth(node, "ts-dest") == 1, what="moved")
    headers = typed_headers(node, "ts-dest")
    assert headers["x-shovelled-timestamp"].kind == "l", headers
    (entry,) = headers["x-shovelled"].value
    assert entry.kind == "F" and {field.kind for field in entry.value.values()} == {"S"}, entry


def test_an_x_shovelled_that_is_not_an_array_is_kept_in_x_invalid_headers(start_broker):
    """rabbit_basic:prepend_table_header: a header of the hop list's name that is not an array is replaced by a
    new array, and kept under x-invalid-headers (set_invalid_header)."""
    node = start_broker()
    value = {"src-uri": "amqp://", "src-queue": "inv-src", "dest-uri": "amqp://", "dest-queue": "inv-dest",
             "dest-add-forward-headers": True}
    assert call(node, "PUT", SHOVEL + "inv", {"value": value}).status == 201
    wait_for(lambda: (shovel_status(node, "inv") or {}).get("state") == "running", what="running")
    publish_pipelined(node, "inv-src", ["x"], declare=True, headers={"x-shovelled": "bogus"})
    wait_for(lambda: depth(node, "inv-dest") == 1, what="moved")
    headers = typed_headers(node, "inv-dest")
    assert headers["x-shovelled"].kind == "A" and len(headers["x-shovelled"].value) == 1, headers
    assert headers.get("x-invalid-headers") == Field("F", {"x-shovelled": Field("A", [Field("S", "bogus")])})


@pytest.mark.parametrize("mode", ["on-publish", "no-ack"])
def test_other_ack_modes_move_everything_too(start_broker, mode):
    node = start_broker()
    publish(node, "m-src", 300)
    assert call(node, "PUT", SHOVEL + "m", {"value": {"src-uri": "amqp://", "src-queue": "m-src", "ack-mode": mode,
                                                      "dest-uri": "amqp://", "dest-queue": "m-dest"}}).status == 201
    wait_for(lambda: depth(node, "m-dest") == 300, what="300 moved")
    assert depth(node, "m-src") == 0
    assert [body for body, _ in drain(node, "m-dest")] == [str(i).encode() for i in range(300)]


def test_src_delete_after_queue_length_and_a_number(start_broker):
    node = start_broker()
    publish(node, "da-src", 100)
    assert call(node, "PUT", SHOVEL + "once", {"value": {"src-uri": "amqp://", "src-queue": "da-src",
                                                         "src-delete-after": "queue-length", "dest-uri": "amqp://",
                                                         "dest-queue": "da-dest"}}).status == 201
    wait_for(lambda: call(node, "GET", SHOVEL + "once").status == 404, what="the parameter to be cleared")
    assert depth(node, "da-dest") == 100 and depth(node, "da-src") == 0
    assert shovel_status(node, "once") is None
    publish(node, "da-src", 50)
    value = {"src-uri": "amqp://", "src-queue": "da-src", "src-delete-after": 30, "src-prefetch-count": 7,
             "dest-uri": "amqp://", "dest-queue": "da-dest"}
    assert call(node, "PUT", SHOVEL + "thirty", {"value": value}).status == 201
    wait_for(lambda: call(node, "GET", SHOVEL + "thirty").status == 404, what="the parameter to be cleared")
    wait_for(lambda: depth(node, "da-src") == 20, what="20 left (the unacked ones requeued)")
    assert depth(node, "da-dest") == 130


def test_queue_length_with_a_source_exchange_deletes_the_shovel_at_once(start_broker):
    """RabbitMQ's remaining/2 reads queue-length from the source queue, for src-exchange the server-named queue it
    just declared: 0, so the shovel ends at once ({shutdown, autodelete}) and its parameter is cleared."""
    node = start_broker()
    value = {"src-uri": "amqp://", "src-exchange": "amq.direct", "src-exchange-key": "k",
             "src-delete-after": "queue-length", "dest-uri": "amqp://", "dest-queue": "qlx-dest"}
    assert call(node, "PUT", SHOVEL + "qlx", {"value": value}).status == 201
    wait_for(lambda: call(node, "GET", SHOVEL + "qlx").status == 404, timeout=10, what="the parameter cleared")


def test_a_fractional_reconnect_delay_leaves_a_failed_shovel_terminated(start_broker):
    """rabbit_shovel_dyn_worker_sup:init restarts the worker only for ``N when is_integer(N) andalso N > 0``;
    anything else, 0.5 as 0, makes it ``temporary``: a shovel that fails stays terminated."""
    node = start_broker()
    publish_pipelined(node, "rd-src", ["x"], declare=True)
    value = {"src-uri": "amqp://", "src-queue": "rd-src", "dest-uri": "amqp://", "dest-queue": "rd-dest",
             "reconnect-delay": 0.5}
    assert call(node, "PUT", SHOVEL + "rd", {"value": value}).status == 201
    wait_for(lambda: depth(node, "rd-dest") == 1, what="moved")
    assert call(node, "DELETE", "/api/queues/%2F/rd-src").status == 204  # basic.cancel: the shovel fails
    wait_for(lambda: (shovel_status(node, "rd") or {}).get("state") == "terminated", what="terminated")
    time.sleep(2)
    status = shovel_status(node, "rd")
    assert status is not None and status["state"] == "terminated", status


def test_validation_in_rabbitmqs_words(start_broker):
    node = start_broker()
    body = assert_error(call(node, "PUT", SHOVEL + "bad", {"value": {
        "src-uri": "amqp://", "src-queue": "a", "src-exchange": "x", "dest-uri": "http://x",
        "ack-mode": "sometimes", "src-delete-after": 5, "extra": 1}}), 400)
    reason = body["reason"]
    assert reason.startswith("Validation failed\n\n") and reason.endswith("\n")
    assert "Cannot specify 'src-exchange' and 'src-queue'" in reason
    assert 'Unrecognised terms [{<<"extra">>,1}] in bad' in reason
    assert 'ack-mode should be one of [no-ack,on-publish,on-confirm], actually was <<"sometimes">>' in reason
    assert '"http://x" not a valid URI' in reason
    body = assert_error(call(node, "PUT", SHOVEL + "bad", {"value": {"src-uri": "amqp://", "src-queue": "a"}}), 400)
    assert 'Key "dest-uri" not found in bad' in body["reason"]
    body = assert_error(call(node, "PUT", SHOVEL + "bad", {"value": {
        "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "no-ack",
        "src-delete-after": 3}}), 400)
    assert "Cannot specify 'no-ack' and numerical 'delete-after'" in body["reason"]
    assert_error(call(node, "PUT", SHOVEL + "bad", {"value": {"src-uri": "amqp://", "src-queue": "a",
                                                             "dest-uri": "amqp://", "src-protocol": "amqp10"}}), 400)
    body = assert_error(call(node, "PUT", SHOVEL + "bad", {"value": {
        "src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "src-prefetch-count": 70000,
        "dest-publish-properties": {"priority": 300}}}), 400)
    assert "src-prefetch-count should be from 0 to 65535" in body["reason"]
    assert "priority should be an integer from 0 to 255" in body["reason"]
    assert call(node, "GET", SHOVEL + "bad").status == 404  # nothing kept
    # a vhost's shovels go with it
    assert call(node, "PUT", "/api/vhosts/gone", {}).status == 201
    value = {"src-uri": "amqp:///gone", "src-queue": "a", "dest-uri": "amqp:///gone"}
    assert call(node, "PUT", "/api/parameters/shovel/gone/s", {"value": value}).status == 201
    assert call(node, "DELETE", "/api/vhosts/gone").status == 204
    assert call(node, "PUT", "/api/vhosts/gone", {}).status == 201
    assert call(node, "GET", "/api/parameters/shovel/gone/s").status == 404


def test_components_and_policy_keys_warren_does_not_serve_are_refused(start_broker):
    node = start_broker()
    for component in ("mqtt-port-to-vhost-mapping", "made-up-component"):
        body = assert_error(call(node, "PUT", f"/api/parameters/{component}/%2F/x",
                                 {"value": {"uri": "amqp://remote"}}), 400)
        assert body["reason"] == f"Validation failed\n\ncomponent {component} not found\n"
    assert call(node, "GET", "/api/parameters").json == []
    policy = {"pattern": ".*", "definition": {"made-up-plugin-key": "all"}}
    body = assert_error(call(node, "PUT", "/api/policies/%2F/fed", policy), 400)
    assert "are not recognised policy settings" in body["reason"]
    # a definitions file exported from RabbitMQ with shovels, and parameters and policy keys of other plugins
    definitions = {
        "parameters": [
            {"vhost": "/", "component": "made-up-component", "name": "up", "value": {"uri": "amqp://a"}},
            {"vhost": "/", "component": "shovel", "name": "sh", "value": {
                "src-uri": "amqp://", "src-queue": "imp-src", "dest-uri": "amqp://", "dest-queue": "imp-dest"}}],
        "policies": [
            {"vhost": "/", "name": "fed", "pattern": "^fed", "apply-to": "exchanges", "priority": 0,
             "definition": {"made-up-plugin-key": "all"}},
            {"vhost": "/", "name": "mixed", "pattern": "^m", "apply-to": "queues", "priority": 0,
             "definition": {"made-up-plugin-key": "up", "message-ttl": 1000}}]}
    response = call(node, "POST", "/api/definitions", definitions)
    assert response.status == 200, response.raw
    skipped = response.json["skipped"]
    assert {"parameter": "up", "component": "made-up-component", "vhost": "/",
            "reason": "component made-up-component not found"} in skipped
    assert any(s.get("policy") == "fed" for s in skipped) and any(s.get("policy") == "mixed" for s in skipped)
    assert "skipped" in node.log()
    assert call(node, "GET", "/api/policies/%2F/fed").status == 404
    assert call(node, "GET", "/api/policies/%2F/mixed").json["definition"] == {"message-ttl": 1000}
    assert call(node, "GET", SHOVEL + "sh").status == 200
    exported = call(node, "GET", "/api/definitions").json
    assert [p["name"] for p in exported["parameters"] if p["component"] == "shovel"] == ["sh"]
    publish(node, "imp-src", 10)
    wait_for(lambda: depth(node, "imp-dest") == 10, what="the imported shovel to run")


def test_permissions(start_broker):
    node = start_broker()
    for user, tags, read in (("plain", "management", ".*"), ("maker", "policymaker", ".*"), ("reader", "", "^$")):
        assert call(node, "PUT", f"/api/users/{user}", {"password": "pw", "tags": tags}).status == 201
        assert call(node, "PUT", f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*",
                                                                  "read": read}).status == 201
    value = {"src-uri": f"amqp://reader:pw@127.0.0.1:{node.port}/%2F", "src-queue": "perm-src",
             "dest-uri": "amqp://", "dest-queue": "perm-dest"}
    assert_error(call(node, "PUT", SHOVEL + "p", {"value": value}, auth=("plain", "pw")), 401)
    assert call(node, "PUT", SHOVEL + "p", {"value": value}, auth=("maker", "pw")).status == 201
    shown = call(node, "GET", SHOVEL + "p", auth=("maker", "pw")).json["value"]
    assert shown["src-uri"] == f"amqp://127.0.0.1:{node.port}/%2F"  # no credentials for a non-administrator
    assert "reader:pw" in call(node, "GET", SHOVEL + "p").json["value"]["src-uri"]  # guest: administrator
    assert "pw" not in call(node, "GET", "/api/parameters", auth=("maker", "pw")).raw.decode()
    # the shovel acts as its URI's user, who may not read the queue
    publish(node, "perm-src", 3)
    status = wait_for(lambda: (shovel_status(node, "p") or {}).get("state") == "terminated"
                      and shovel_status(node, "p"), what="terminated")
    assert "403" in status["reason"] and "ACCESS_REFUSED" in status["reason"]
    assert "pw" not in str(status)
    assert depth(node, "perm-src") == 3
    # amqp:// naming another user: only an administrator may
    body = assert_error(call(node, "PUT", SHOVEL + "q", {"value": {
        "src-uri": "amqp://guest@/%2F", "src-queue": "a", "dest-uri": "amqp://"}}, auth=("maker", "pw")), 400)
    assert 'user "maker" may not act as user "guest"' in body["reason"]
    assert_error(call(node, "GET", "/api/shovels", auth=("maker", "pw")), 401)  # monitoring, as RabbitMQ
    # an amqp:// URI's vhost needs permissions there, an administrator's too (check_vhost_access)
    assert call(node, "PUT", "/api/vhosts/secret", {}).status == 201
    assert call(node, "PUT", "/api/users/boss", {"password": "pw", "tags": "administrator"}).status == 201
    assert call(node, "PUT", "/api/permissions/%2F/boss", {"configure": ".*", "write": ".*", "read": ".*"}).status \
        == 201
    body = assert_error(call(node, "PUT", SHOVEL + "peek", {"value": {
        "src-uri": "amqp:///secret", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}},
        auth=("boss", "pw")), 400)
    assert 'user "boss" may not connect to vhost "secret"' in body["reason"]
    assert_error(call(node, "DELETE", SHOVEL + "p", auth=("plain", "pw")), 401)
    assert call(node, "DELETE", SHOVEL + "p", auth=("maker", "pw")).status == 204


@pytest.mark.integration
def test_amqps_uris_are_verified(tmp_path):
    pki = PKI.create(tmp_path)
    tls = start_tls_node(tmp_path / "data", pki)
    node = tls.broker
    try:
        publish(node, "tls-src", 20)
        base = f"amqps://guest:guest@localhost:{tls.tls_port}"
        unverified = {"src-uri": base, "src-queue": "tls-src", "dest-uri": "amqp://", "dest-queue": "tls-dest",
                      "reconnect-delay": 1}
        assert call(node, "PUT", SHOVEL + "tls", {"value": unverified}).status == 201
        status = wait_for(lambda: (shovel_status(node, "tls") or {}).get("state") == "terminated"
                          and shovel_status(node, "tls"), what="refused")
        assert "CERTIFICATE_VERIFY_FAILED" in status["reason"], status
        assert depth(node, "tls-dest") in (0, -1)
        verified = dict(unverified, **{"src-uri": f"{base}?cacertfile={pki.cafile}"})
        assert call(node, "PUT", SHOVEL + "tls", {"value": verified}).status == 204
        wait_for(lambda: depth(node, "tls-dest") == 20, what="20 moved over TLS")
        status = shovel_status(node, "tls")
        assert status is not None and status["src_uri"] == f"amqps://localhost:{tls.tls_port}"
    finally:
        node.stop()


def test_uris_tried_in_turn_and_the_restart_endpoint(start_broker):
    node = start_broker()
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}"  # nothing listens there: the next URI is tried
    assert call(node, "PUT", SHOVEL + "r", {"value": {"src-uri": [dead, "amqp://"], "src-queue": "r-src",
                                                      "dest-uri": "amqp://", "dest-queue": "r-dest"}}).status == 201
    first = wait_for(lambda: (shovel_status(node, "r") or {}).get("state") == "running" and shovel_status(node, "r"),
                     what="running")
    assert first["src_uri"] == "amqp://"
    assert call(node, "DELETE", "/api/shovels/vhost/%2F/r/restart").status == 204
    assert call(node, "DELETE", "/api/shovels/vhost/%2F/nosuch/restart").status == 404
    wait_for(lambda: (shovel_status(node, "r") or {}).get("state") == "running", what="running again")
    assert first["name"] == "r"


def _three_nodes(start_broker, reconnect_delay: int = 1):
    source, destination, host = start_broker(), start_broker(), start_broker()
    publish(source, "k-src", N)
    value = {"src-uri": [f"amqp://guest:guest@127.0.0.1:{source.port}"], "src-queue": "k-src",
             "src-prefetch-count": 20, "dest-uri": f"amqp://guest:guest@127.0.0.1:{destination.port}",
             "dest-queue": "k-dest", "ack-mode": "on-confirm", "reconnect-delay": reconnect_delay}
    assert call(host, "PUT", SHOVEL + "k", {"value": value}).status == 201
    return source, destination, host


def _all_there(destination, source) -> None:
    """Every message reached the destination at least once, and none is left at the source."""
    wait_for(lambda: depth(source, "k-src") == 0, timeout=90, what="the source drained")
    time.sleep(1)
    bodies = {int(body) for body, _ in drain(destination, "k-dest")}
    assert bodies == set(range(N)), f"lost: {sorted(set(range(N)) - bodies)[:20]}"


@pytest.mark.parametrize("victim", ["shovel", "source", "destination"])
def test_kill_9_mid_transfer_loses_nothing_under_on_confirm(start_broker, victim):
    source, destination, host = _three_nodes(start_broker)
    node = {"shovel": host, "source": source, "destination": destination}[victim]
    wait_for(lambda: depth(destination, "k-dest") > N // 10, what="the transfer under way")
    moved = depth(destination, "k-dest")
    assert moved < N, "the transfer ended before the kill"
    node.kill()
    restarted = start_broker(data_dir=node.data_dir, port=node.port)
    if victim == "shovel":
        host = restarted
    elif victim == "source":
        source = restarted
    else:
        destination = restarted
    _all_there(destination, source)
    status = wait_for(lambda: shovel_status(host, "k"), what="status")
    assert status["state"] == "running", status


def test_the_direct_secret_logs_in_on_amqp_from_loopback_only(tmp_path):
    """A node's links log in to itself with its direct secret over AMQP 0-9-1 from loopback; the stream protocol
    and HTTP (which pass no peer) and any other address do not take it as a password."""
    access = AccessControl(DefinitionStore(str(tmp_path)))
    access.bootstrap()
    secret = access.direct_secret
    user = access.authenticate("guest", secret, direct_from="127.0.0.1")
    assert user is not None and user.name == "guest"
    assert access.authenticate("guest", secret, direct_from="::1") is not None
    assert access.authenticate("guest", secret) is None
    assert access.authenticate("guest", secret, direct_from="10.1.2.3") is None
    access.store.close()


def test_requests_to_other_nodes_follow_no_redirect():
    """The management API asks other nodes with the caller's credentials: a redirect must not carry them on."""
    seen: list[str | None] = []

    async def main() -> int:
        async def elsewhere(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Authorization"))
            return web.Response(text="here")

        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPFound(f"http://127.0.0.1:{ports[1]}/steal")

        ports = [free_port(), free_port()]
        runners = []
        for port, handler in zip(ports, (redirect, elsewhere)):
            app = web.Application()
            app.router.add_get("/{tail:.*}", handler)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        forwarder = Forwarder()
        try:
            async with forwarder.request("GET", f"http://127.0.0.1:{ports[0]}/api/x",
                                         headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}) as answer:
                return answer.status
        finally:
            await forwarder.close(web.Application())
            for runner in runners:
                await runner.cleanup()

    assert asyncio.run(main()) == 302
    assert seen == []
