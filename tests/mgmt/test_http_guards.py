"""The management API against requests that abuse it: cross-site posts, bulk reads and moves, publishing
through an alarm.  (A real browser's cross-site attempt is in test_ui.py.)"""
from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pika
import pytest
from pamqp import commands
from pamqp import frame as pframe

from conftest import INTEGRATION, BrokerProcess, connect, starts
from test_back_pressure import Watch, abort, anonymous, content, send_until_refused
from support import Raw, call, q

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


def send(node, method: str, path: str, data: bytes | None = None, **headers: str) -> tuple[int, dict, bytes]:
    """A request with exactly these headers (and the guest's credentials): status, headers, body."""
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}{path}", data=data, method=method,
                                     headers={"Authorization": GUEST, **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def user_exists(node, name: str) -> bool:
    return call(node, "GET", f"/api/users/{q(name)}").status == 200


@pytest.mark.parametrize("method, path", [
    ("PUT", "/api/global-parameters/{uid}"), ("PUT", "/api/cluster-name"), ("PUT", "/api/vhost-limits/%2F/{uid}"),
    ("PUT", "/api/user-limits/guest/{uid}"), ("PUT", "/api/parameters/shovel/%2F/{uid}"),
    ("PUT", "/api/permissions/%2F/guest"), ("PUT", "/api/topic-permissions/%2F/guest"),
    ("PUT", "/api/policies/%2F/{uid}"), ("PUT", "/api/operator-policies/%2F/{uid}"),
    ("POST", "/api/exchanges/%2F/amq.direct/publish"), ("POST", "/api/queues/%2F/{uid}/get"),
    ("POST", "/api/queues/%2F/{uid}/commit")])
def test_an_empty_body_is_an_empty_object_as_rabbitmq_decodes_it(broker, method, path):
    """rabbit_mgmt_util:decode(<<"">>) is ``{ok, #{}}``: an empty body is answered as ``{}`` is (the keys a
    request needs are then missing), not refused for being empty."""
    path = path.format(uid="empty-body")
    assert call(broker, "PUT", "/api/queues/%2F/empty-body", {}).status in (201, 204)
    empty, braces = call(broker, method, path, raw=b""), call(broker, method, path, {})
    call(broker, "DELETE", "/api/queues/%2F/empty-body")
    assert (empty.status, empty.json) == (braces.status, braces.json)
    assert empty.status == 400


# -- cross-site requests -------------------------------------------------------------------------------

def definitions_adding(user: str) -> bytes:
    return json.dumps({"users": [{"name": user, "password": "pw", "tags": "administrator"}]}).encode()


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_post_that_is_not_json_is_refused_as_rabbitmq_refuses_it(broker, uid, content_type):
    """What a form on another site can send: RabbitMQ 3.10 answers 415 with no body and creates nothing."""
    headers = {"Content-Type": content_type} if content_type else {}
    request = urllib.request.Request(f"http://127.0.0.1:{broker.mgmt_port}/api/definitions",
                                     data=definitions_adding(uid), method="POST",
                                     headers={"Authorization": GUEST, **headers})
    if content_type is None:
        request.remove_header("Content-type")  # (urllib adds x-www-form-urlencoded to a body otherwise)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    assert (status, body) == (415, b"")
    assert not user_exists(broker, uid)


@pytest.mark.warren_only("RabbitMQ 3.10 takes these: publish and get as text/plain, a form upload without a header")
def test_every_post_must_be_json_and_a_form_upload_must_carry_a_header_no_form_can(broker, uid):
    publish = json.dumps({"properties": {}, "routing_key": uid, "payload": "x", "payload_encoding": "string"})
    assert send(broker, "POST", "/api/exchanges/%2F/amq.default/publish", publish.encode(),
                **{"Content-Type": "text/plain"})[0] == 415
    get = json.dumps({"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}).encode()
    assert send(broker, "POST", f"/api/queues/%2F/{q(uid)}/get", get, **{"Content-Type": "text/plain"})[0] == 415
    boundary = "warren-test-boundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n".encode()
            + definitions_adding(uid) + f"\r\n--{boundary}--\r\n".encode())
    multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    assert send(broker, "POST", "/api/definitions", form, **multipart)[0] == 415  # what a form can send
    assert not user_exists(broker, uid)
    assert send(broker, "POST", "/api/definitions", form, **multipart, **{"X-Vhost": "/"})[0] == 204  # RabbitMQ's UI
    assert user_exists(broker, uid)
    assert call(broker, "DELETE", f"/api/users/{q(uid)}").status == 204
    assert send(broker, "POST", "/api/definitions", form, **multipart, **{"X-Requested-With": "x"})[0] == 204
    assert call(broker, "DELETE", f"/api/users/{q(uid)}").status == 204


@pytest.mark.warren_only("RabbitMQ 3.10 does not look at Origin")
def test_a_request_from_another_origin_is_refused(broker, uid):
    own = f"http://127.0.0.1:{broker.mgmt_port}"
    body = json.dumps({"password": "pw", "tags": ""}).encode()
    for origin in ("http://evil.example", f"http://localhost:{broker.mgmt_port}", "null",
                   f"http://127.0.0.1:{broker.mgmt_port + 1}"):
        status, _, answer = send(broker, "PUT", f"/api/users/{q(uid)}", body, Origin=origin,
                                 **{"Content-Type": "application/json"})
        assert (status, json.loads(answer)) == (403, {"error": "forbidden", "reason": "cross-site request refused"})
        assert send(broker, "POST", "/api/definitions", definitions_adding(uid), Origin=origin,
                    **{"Content-Type": "application/json"})[0] == 403
        assert send(broker, "DELETE", "/api/users/guest", Origin=origin)[0] == 403
    assert not user_exists(broker, uid)
    assert send(broker, "GET", "/api/overview", Origin="http://evil.example")[0] == 200  # reading changes nothing
    json_type = {"Content-Type": "application/json"}
    assert send(broker, "PUT", f"/api/users/{q(uid)}", body, Origin=own, **json_type)[0] == 201
    assert send(broker, "PUT", f"/api/vhosts/{q(uid)}")[0] == 201  # curl -X PUT: no type, no Origin, as RabbitMQ
    assert send(broker, "DELETE", f"/api/vhosts/{q(uid)}", Origin=own)[0] == 204
    assert call(broker, "DELETE", f"/api/users/{q(uid)}").status == 204


# -- bulk reads and moves: a slice per loop turn --------------------------------------------------------

DEPTH = 200_000


@pytest.fixture(scope="module")
@starts(INTEGRATION)
def deep(tmp_path_factory):
    """A node of its own with a queue of 200,000 small messages, published raw (pika would take a minute)."""
    node = BrokerProcess(tmp_path_factory.mktemp("bulk") / "data").start()
    with connect(node) as connection:
        ch = connection.channel()
        ch.queue_declare("deep")
        ch.queue_declare("deep-moved")
    raw = Raw(node, timeout=60)
    raw.handshake()
    raw.open_channel(1)
    publish = pframe.marshal(commands.Basic.Publish(exchange="", routing_key="deep"), 1)
    raw.sock.sendall(b"".join(publish + content(1, b"m%d" % n) for n in range(DEPTH)))
    deadline = time.monotonic() + 120
    while call(node, "GET", "/api/queues/%2F/deep").json.get("messages") != DEPTH:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    raw.close()
    yield node
    node.stop()


def while_running(node, method: str, path: str, body: dict | None = None) -> tuple[Any, Watch, float]:
    """The request's JSON answer, what another request's latency and the node's RSS were meanwhile, and how
    long the request took."""
    watch = Watch(node)
    started = time.monotonic()
    try:
        reply = call(node, method, path, body)
    finally:
        took = time.monotonic() - started
        watch.stop()
    assert reply.status == 200, reply.raw[:300]
    return reply.json, watch, took


@pytest.mark.warren_only("peek and move are Warren's; the latency bound is Warren's")
@pytest.mark.parametrize("operation", ["get", "peek", "move"])
def test_bulk_requests_leave_the_api_answering(deep, operation):
    """200,000 messages got, peeked or moved in one request held every other request until it was done
    (0.5-6 s); now a slice per loop turn: another request waits a small part of that, and never a second."""
    node = deep
    if operation == "get":
        answer, watch, took = while_running(node, "POST", "/api/queues/%2F/deep/get",
                                      {"count": DEPTH, "ackmode": "ack_requeue_true", "encoding": "auto"})
        assert len(answer) == DEPTH and answer[0]["payload"] == "m0" and answer[-1]["payload"] == f"m{DEPTH - 1}"
    elif operation == "peek":
        answer, watch, took = while_running(node, "GET", f"/api/queues/%2F/deep/peek?count={DEPTH}")
        assert [item["position"] for item in answer] == list(range(DEPTH))
        assert answer[12345]["payload"] == "m12345"
    else:
        answer, watch, took = while_running(node, "POST", "/api/queues/%2F/deep/move", {"destination": "deep-moved"})
        assert answer["moved"] == DEPTH
        assert call(node, "POST", "/api/queues/%2F/deep-moved/move", {"destination": "deep"}).json["moved"] == DEPTH
    assert watch.slowest < min(1.0, took / 4), f"another request waited {watch.slowest:.2f} s of {took:.2f} s"
    assert watch.growth < 64 * MiB, f"RSS grew {watch.growth / MiB:.0f} MiB"
    with connect(node) as connection:  # all still there, in order (the requeue put them back in place)
        ch = connection.channel()
        assert ch.queue_declare("deep", passive=True).method.message_count == DEPTH
    assert call(node, "GET", "/api/queues/%2F/deep/peek?count=2").json[0]["payload"] == "m0"


@pytest.mark.warren_only("peek is Warren's")
@pytest.mark.parametrize("arguments", [{}, {"x-max-priority": 9}, {"x-queue-type": "quorum"},
                                       {"x-queue-type": "stream"}], ids=["classic", "priority", "quorum", "stream"])
def test_a_peek_of_every_queue_type_reads_on_from_slice_to_slice(broker, uid, arguments):
    """A peek takes a queue's messages 64 at a time, each step going on after the last one's entry."""
    with connect(broker) as connection:
        ch = connection.channel()
        ch.queue_declare(uid, durable=True, arguments=arguments)
        for n in range(300):
            ch.basic_publish("", uid, b"m%d" % n, pika.BasicProperties(priority=n % 3 * 4))
    peeked = call(broker, "GET", f"/api/queues/%2F/{q(uid)}/peek?offset=5&count=250").json
    order = list(range(300))
    if "x-max-priority" in arguments:
        order.sort(key=lambda n: -(n % 3))
    assert [item["payload"] for item in peeked] == [f"m{n}" for n in order[5:255]]
    assert [item["position"] for item in peeked] == list(range(5, 255))
    assert call(broker, "DELETE", f"/api/queues/%2F/{q(uid)}").status == 204


# -- publish through an alarm --------------------------------------------------------------------------

@pytest.mark.warren_only("RabbitMQ 3.10's HTTP publish goes through a memory alarm")
def test_http_publish_waits_for_the_memory_alarm_with_its_body_unread(start_broker):
    """With the memory alarm on, 20 HTTP publishes of 7 MiB were all taken (+340 MB for 40).  Now each
    waits, unread, as an AMQP publisher does, and goes through once the alarm clears."""
    limit = 200 * MiB
    node = start_broker("--memory-high-watermark", str(limit))
    with connect(node) as connection:
        ch = connection.channel()
        ch.queue_declare("fill")
        ch.queue_declare("target")
    filler = Raw(node, timeout=10)  # fills memory until the alarm stops reading it
    filler.handshake()
    filler.open_channel(1)
    message = pframe.marshal(commands.Basic.Publish(exchange="", routing_key="fill"), 1) + content(1, b"f" * MiB)
    send_until_refused(filler, message * 400)
    deadline = time.monotonic() + 20
    while not call(node, "GET", "/api/nodes").json[0]["mem_alarm"]:
        assert time.monotonic() < deadline, "the memory alarm never set"
        time.sleep(0.2)
    before = anonymous(node)
    body = json.dumps({"properties": {}, "routing_key": "target", "payload": "p" * (7 * MiB),
                       "payload_encoding": "string"}).encode()
    answers: list[tuple[int, bytes]] = []

    def publish() -> None:
        status, _, answer = send(node, "POST", "/api/exchanges/%2F/amq.default/publish", body,
                                 **{"Content-Type": "application/json"})
        answers.append((status, answer))

    publishers = [threading.Thread(target=publish, daemon=True) for _ in range(20)]
    for thread in publishers:
        thread.start()
    time.sleep(3)
    assert answers == [], "HTTP publishes went through the memory alarm"
    assert anonymous(node) - before < 32 * MiB
    assert call(node, "GET", "/api/queues/%2F/target").json["messages"] == 0
    abort(filler)
    assert call(node, "DELETE", "/api/queues/%2F/fill/contents").status == 204  # memory comes back: alarm off
    for thread in publishers:
        thread.join(60)
    assert answers == [(200, b'{"routed":true}')] * 20


# -- Expect: 100-continue ----------------------------------------------------------------------------------------

def _head(sock: socket.socket, buffered: bytes = b"") -> tuple[str, dict[str, str], bytes]:
    """The next response head on ``sock``: its status line, headers, and what was read past it."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {buffered!r}"
        buffered += chunk
    head, _, rest = buffered.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    return status, {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}, rest


def _response(sock: socket.socket) -> tuple[str, bytes]:
    status, headers, rest = _head(sock)
    while len(rest) < int(headers.get("content-length", 0)):
        rest += sock.recv(65536)
    return status, rest


def _put_head(path: str, authorization: str, length: int) -> bytes:
    return (f"PUT {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {authorization}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\nExpect: 100-continue\r\n\r\n").encode()


def test_expect_100_continue_is_answered_only_to_a_request_that_may_send_its_body(broker, uid):
    """On a connection that has logged in, a request with wrong credentials, or a body over the limit, was told
    100 Continue by aiohttp before either was checked: its body was invited and buffered.  Now it is refused at
    once (401, 413); a request that logged in with a body it may send gets its 100 Continue."""
    bad = "Basic " + base64.b64encode(b"guest:wrong").decode()
    with socket.create_connection(("127.0.0.1", broker.mgmt_port), timeout=10) as sock:
        sock.sendall(b"GET /api/whoami HTTP/1.1\r\nHost: localhost\r\nAuthorization: " + GUEST.encode() + b"\r\n\r\n")
        assert _response(sock)[0] == "HTTP/1.1 200 OK"  # logged in: the connection's gate is open
        sock.sendall(_put_head(f"/api/queues/%2F/{uid}", bad, 10 * MiB))
        status, _, _ = _head(sock)
        assert status == "HTTP/1.1 401 Unauthorized"
    with socket.create_connection(("127.0.0.1", broker.mgmt_port), timeout=10) as sock:
        sock.sendall(_put_head(f"/api/queues/%2F/{uid}", GUEST, 20 * MiB))
        status, _, _ = _head(sock)
        assert status == "HTTP/1.1 413 Request Entity Too Large"
    body = json.dumps({"durable": False}).encode()
    with socket.create_connection(("127.0.0.1", broker.mgmt_port), timeout=10) as sock:
        sock.sendall(_put_head(f"/api/queues/%2F/{uid}", GUEST, len(body)))
        status, _, rest = _head(sock)
        assert status == "HTTP/1.1 100 Continue" and rest == b""
        sock.sendall(body)
        assert _response(sock)[0] == "HTTP/1.1 201 Created"
    assert call(broker, "DELETE", f"/api/queues/%2F/{q(uid)}").status == 204
