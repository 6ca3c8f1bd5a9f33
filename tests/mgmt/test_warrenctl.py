"""``warrenctl`` as a user runs it: a subprocess against a real node's management HTTP API."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pika
import pytest

from conftest import ROOT, BrokerProcess, free_port, wait_for_port

WARRENCTL = Path(sys.executable).with_name("warrenctl")


def command() -> list[str]:
    """The installed console script; ``python -m`` where the venv has not registered it."""
    return [str(WARRENCTL)] if WARRENCTL.exists() else [sys.executable, "-m", "mgmt_http.warrenctl"]


def run(broker: BrokerProcess | None, *args: str, input: str | None = None, port: int | None = None,
        env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_")}
    base["COLUMNS"] = "250"
    if port is not None:
        base["WARREN_MGMT_URL"] = f"http://127.0.0.1:{port}"
    elif broker is not None:
        base["WARREN_MGMT_URL"] = f"http://127.0.0.1:{broker.mgmt_port}"
    base.update(env or {})
    return subprocess.run([*command(), *args], cwd=ROOT, capture_output=True, text=True, input=input,
                          timeout=timeout, env=base)


def ok(broker: BrokerProcess, *args: str, input: str | None = None) -> str:
    result = run(broker, *args, input=input)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def as_json(broker: BrokerProcess, *args: str, input: str | None = None) -> Any:
    return json.loads(ok(broker, *args, "--json", input=input))


def fails(broker: BrokerProcess | None, *args: str, code: int = 1, **kwargs: Any) -> str:
    """The one-line reason of a failing command."""
    result = run(broker, *args, **kwargs)
    assert result.returncode == code, (args, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warrenctl: ")
    return lines[0]


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def by_name(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((row for row in rows if row.get("name") == name), None)


def named(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The row of ``name``, which the test has just made."""
    row = by_name(rows, name)
    assert row is not None, f"{name} is not listed"
    return row


@pytest.fixture(scope="module", autouse=True)
def mgmt_api(broker: BrokerProcess) -> None:
    """The fixture waits for AMQP only; wait for the HTTP listener too (skip on a node without one)."""
    assert broker.proc is not None  # (started)
    try:
        wait_for_port(broker.mgmt_port, broker.proc, timeout=10)
    except TimeoutError:
        pass
    result = run(broker, "status", "--json")
    if result.returncode == 3:
        pytest.skip(f"management API not available: {result.stderr.strip()}")


# -- connection, status, errors ---------------------------------------------------------------

def test_status(broker: BrokerProcess) -> None:
    out = ok(broker, "status")
    assert "health: ok" in out
    assert "Overview" in out and "Node " in out
    data = as_json(broker, "status")
    assert set(data) == {"overview", "nodes", "health"}
    assert data["health"]["status"] == "ok"
    assert data["overview"]["node"] == data["nodes"][0]["name"]


def test_unreachable_is_exit_3_with_one_line(broker: BrokerProcess) -> None:
    port = free_port()
    line = fails(None, "list", "queues", port=port, code=3)
    assert line == f"warrenctl: cannot reach http://127.0.0.1:{port}: Connection refused"


def test_host_and_port_options_beat_the_environment(broker: BrokerProcess) -> None:
    dead = free_port()
    result = run(None, "--host", "127.0.0.1", "--port", str(broker.mgmt_port), "list", "vhosts",
                 env={"WARREN_MGMT_URL": f"http://127.0.0.1:{dead}"})
    assert result.returncode == 0, result.stderr
    line = fails(broker, "--port", str(dead), "list", "vhosts", code=3)
    assert str(dead) in line


async def test_a_redirect_is_not_followed(broker: BrokerProcess) -> None:
    """A server that redirects to another port learns nothing: warrenctl reports the redirect and follows none,
    as rabbitmqadmin (urllib would have sent the Authorization header to wherever it pointed)."""
    from aiohttp import web

    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response([])

    elsewhere_port, redirecting_port = free_port(), free_port()

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{elsewhere_port}{request.path_qs}")

    runners = []
    for port, handler in ((elsewhere_port, record), (redirecting_port, redirect)):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command(), "--user", "guest", "--password", "guest", "list", "queues", cwd=ROOT,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("WARREN_")},
                 "WARREN_MGMT_URL": f"http://127.0.0.1:{redirecting_port}"})
        _out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        for runner in runners:
            await runner.cleanup()
    assert proc.returncode == 1
    assert err.decode().strip() == (f"warrenctl: 302 Found: redirected to "
                                    f"'http://127.0.0.1:{elsewhere_port}/api/queues', not followed")
    assert seen == []


def test_wrong_password_is_401(broker: BrokerProcess) -> None:
    line = fails(broker, "--password", "nope", "list", "queues")
    assert line.startswith("warrenctl: 401 Unauthorized")
    line = fails(broker, "list", "queues", env={"WARREN_USER": "guest", "WARREN_PASSWORD": "nope"})
    assert line.startswith("warrenctl: 401 Unauthorized")
    result = run(None, "list", "vhosts", port=broker.mgmt_port, env={"WARREN_PASSWORD": "guest"})
    assert result.returncode == 0, result.stderr


def test_credentials_in_the_url(broker: BrokerProcess) -> None:
    result = run(None, "list", "vhosts", env={"WARREN_MGMT_URL": f"http://guest:nope@127.0.0.1:{broker.mgmt_port}"})
    assert result.returncode == 1 and "401" in result.stderr


def test_options_before_or_after_the_command(broker: BrokerProcess, uid: str) -> None:
    vhost = f"v-{uid}"
    ok(broker, "declare", "vhost", vhost)
    ok(broker, "declare", "permission", "--user", "guest", "--vhost", vhost, "--configure", ".*", "--write", ".*",
       "--read", ".*")
    ok(broker, "--vhost", vhost, "declare", "queue", "a")
    ok(broker, "declare", "queue", "b", "--vhost", vhost)
    assert sorted(q["name"] for q in json.loads(ok(broker, "--json", "--vhost", vhost, "list", "queues"))) == ["a", "b"]
    assert [q["name"] for q in as_json(broker, "list", "queues", "--vhost", vhost) if q["name"] == "a"] == ["a"]
    assert not [q for q in as_json(broker, "list", "queues") if q["vhost"] == vhost and q["name"] not in "ab"]
    ok(broker, "delete", "vhost", vhost)


def test_usage_errors_are_exit_2(broker: BrokerProcess) -> None:
    assert run(broker, "list", "widgets").returncode == 2
    assert run(broker, "declare", "exchange", "x").returncode == 2  # --type is required
    assert run(broker, "publish", "--property", "novalue", "--body", "b").returncode == 2
    assert run(broker).returncode == 2


# -- queues -----------------------------------------------------------------------------------

def test_queue_declare_list_delete(broker: BrokerProcess, uid: str) -> None:
    out = ok(broker, "declare", "queue", uid, "--durable", "--arg", "x-max-length=10",
             "--arg", "x-overflow=reject-publish")
    assert uid in out
    queue = by_name(as_json(broker, "list", "queues"), uid)
    assert queue is not None
    assert queue["vhost"] == "/" and queue["durable"] is True and queue["auto_delete"] is False
    assert queue["arguments"] == {"x-max-length": 10, "x-overflow": "reject-publish"}
    assert uid in ok(broker, "list", "queues")
    assert by_name(as_json(broker, "list", "queues", "--vhost", "/"), uid)

    ok(broker, "delete", "queue", uid)
    assert by_name(as_json(broker, "list", "queues"), uid) is None
    assert fails(broker, "delete", "queue", uid) == f"warrenctl: 404 Not Found: no queue '{uid}' in vhost '/'"


def test_queue_not_durable_by_default_and_auto_delete(broker: BrokerProcess, uid: str) -> None:
    ok(broker, "declare", "queue", uid, "--auto-delete")
    queue = named(as_json(broker, "list", "queues"), uid)
    assert queue["durable"] is False and queue["auto_delete"] is True
    ok(broker, "delete", "queue", uid)


def test_redeclare_with_other_arguments_is_400(broker: BrokerProcess, uid: str) -> None:
    ok(broker, "declare", "queue", uid, "--durable")
    line = fails(broker, "declare", "queue", uid)
    assert line.startswith("warrenctl: 400 Bad Request: ")
    ok(broker, "delete", "queue", uid)


def test_declare_in_missing_vhost_is_404(broker: BrokerProcess, uid: str) -> None:
    line = fails(broker, "declare", "queue", uid, "--vhost", f"no-{uid}")
    assert line.startswith("warrenctl: 404 Not Found: ") and f"no-{uid}" in line


# -- exchanges and bindings -------------------------------------------------------------------

def test_exchange_and_bindings(broker: BrokerProcess, uid: str) -> None:
    exchange, other, queue = f"{uid}-x", f"{uid}-x2", f"{uid}-q"
    ok(broker, "declare", "exchange", exchange, "--type", "topic", "--durable")
    ok(broker, "declare", "exchange", other, "--type", "fanout", "--internal")
    ok(broker, "declare", "queue", queue)
    found = named(as_json(broker, "list", "exchanges"), exchange)
    assert found["type"] == "topic" and found["durable"] is True
    assert named(as_json(broker, "list", "exchanges"), other)["internal"] is True
    assert exchange in ok(broker, "list", "exchanges")

    ok(broker, "declare", "binding", "--source", exchange, "--destination", queue, "--routing-key", "a.*")
    ok(broker, "declare", "binding", "--source", exchange, "--destination", other, "--destination-type", "exchange",
       "--routing-key", "#")
    bindings = [b for b in as_json(broker, "list", "bindings") if b["source"] == exchange]
    assert {(b["destination"], b["destination_type"], b["routing_key"]) for b in bindings} == {
        (queue, "queue", "a.*"), (other, "exchange", "#")}
    assert exchange in ok(broker, "list", "bindings")

    ok(broker, "delete", "binding", "--source", exchange, "--destination", queue, "--routing-key", "a.*")
    ok(broker, "delete", "binding", "--source", exchange, "--destination", other, "--destination-type", "exchange",
       "--routing-key", "#")
    assert not [b for b in as_json(broker, "list", "bindings") if b["source"] == exchange]
    line = fails(broker, "delete", "binding", "--source", exchange, "--destination", queue, "--routing-key", "a.*")
    assert line.startswith("warrenctl: 404 Not Found: no binding from exchange")

    line = fails(broker, "declare", "binding", "--source", f"{uid}-missing", "--destination", queue)
    assert line.startswith("warrenctl: 404 Not Found: ")

    ok(broker, "delete", "exchange", exchange)
    ok(broker, "delete", "exchange", other)
    ok(broker, "delete", "queue", queue)
    assert fails(broker, "delete", "exchange", exchange) == (
        f"warrenctl: 404 Not Found: no exchange '{exchange}' in vhost '/'")


def test_exchange_arguments(broker: BrokerProcess, uid: str) -> None:
    ok(broker, "declare", "exchange", uid, "--type", "direct", "--arg", "alternate-exchange=amq.fanout")
    assert named(as_json(broker, "list", "exchanges"), uid)["arguments"] == {"alternate-exchange": "amq.fanout"}
    ok(broker, "delete", "exchange", uid)


# -- messages ---------------------------------------------------------------------------------

def test_publish_peek_get_move_purge(broker: BrokerProcess, uid: str) -> None:
    source, target = f"{uid}-a", f"{uid}-b"
    ok(broker, "declare", "queue", source)
    ok(broker, "declare", "queue", target)

    out = ok(broker, "publish", "--routing-key", source, "--body", "one", "--property", "content_type=text/plain",
             "--property", "delivery_mode=2", "--header", "attempt=3")
    assert "published" in out
    result = run(broker, "publish", "--exchange", "amq.direct", "--routing-key", f"{uid}-nowhere", "--body", "x")
    assert result.returncode == 0 and "NOT routed" in result.stderr
    assert as_json(broker, "publish", "--routing-key", source, input="two\n") == {"routed": True}

    peeked = as_json(broker, "peek", "--queue", source)
    assert [m["payload"] for m in peeked] == ["one", "two\n"]
    assert [m["position"] for m in peeked] == [0, 1]
    assert peeked[0]["properties"]["content_type"] == "text/plain"
    assert peeked[0]["properties"]["delivery_mode"] == 2
    assert peeked[0]["properties"]["headers"] == {"attempt": 3}
    assert [m["payload"] for m in as_json(broker, "peek", "--queue", source, "--offset", "1", "--count", "5")] == [
        "two\n"]
    assert "one" in ok(broker, "peek", "--queue", source)

    got = as_json(broker, "get", "--queue", source)  # ack_requeue_true: it stays
    assert [m["payload"] for m in got] == ["one"]
    assert got[0]["routing_key"] == source and got[0]["exchange"] == ""
    assert "one" in ok(broker, "get", "--queue", source, "--count", "5")
    assert len(as_json(broker, "peek", "--queue", source)) == 2

    moved = as_json(broker, "move", "--queue", source, "--to", target, "--count", "1")
    assert moved["moved"] == 1
    assert "moved 1 message " in ok(broker, "move", "--queue", source, "--to", target)
    assert as_json(broker, "peek", "--queue", source) == []
    assert [m["payload"] for m in as_json(broker, "peek", "--queue", target)] == ["one", "two\n"]
    assert "no messages" in ok(broker, "peek", "--queue", source)

    taken = as_json(broker, "get", "--queue", target, "--ackmode", "ack_requeue_false")
    assert [m["payload"] for m in taken] == ["one"]
    ok(broker, "purge", "--queue", target)
    assert as_json(broker, "get", "--queue", target, "--count", "10") == []
    queue = named(as_json(broker, "list", "queues"), target)
    assert queue["messages"] == 0

    line = fails(broker, "purge", "--queue", f"{uid}-missing")
    assert line == f"warrenctl: 404 Not Found: no queue '{uid}-missing' in vhost '/'"
    line = fails(broker, "move", "--queue", source, "--to", f"{uid}-missing")
    assert line == f"warrenctl: 404 Not Found: no queue '{uid}-missing' in vhost '/'"
    assert fails(broker, "get", "--queue", f"{uid}-missing").startswith("warrenctl: 404 Not Found")
    assert fails(broker, "peek", "--queue", f"{uid}-missing").startswith("warrenctl: 404 Not Found")
    line = fails(broker, "publish", "--exchange", f"{uid}-missing", "--body", "x")
    # the API answers a publish to a missing exchange as RabbitMQ's does: 400 with basic.publish's NOT_FOUND
    assert line == f"warrenctl: 400 Bad Request: 404 NOT_FOUND - no exchange '{uid}-missing' in vhost '/'"
    ok(broker, "delete", "queue", source)
    ok(broker, "delete", "queue", target)


def test_publish_binary_body_from_stdin(broker: BrokerProcess, uid: str) -> None:
    ok(broker, "declare", "queue", uid)
    body = bytes(range(256))
    result = subprocess.run([*command(), "publish", "--routing-key", uid], cwd=ROOT, input=body, capture_output=True,
                            timeout=60, env=dict(os.environ, WARREN_MGMT_URL=f"http://127.0.0.1:{broker.mgmt_port}"))
    assert result.returncode == 0, result.stderr
    [message] = as_json(broker, "get", "--queue", uid, "--encoding", "base64")
    assert message["payload_encoding"] == "base64"
    assert base64.b64decode(message["payload"]) == body
    ok(broker, "delete", "queue", uid)


def test_bad_property_is_a_one_line_error(broker: BrokerProcess) -> None:
    assert "unknown message property" in fails(broker, "publish", "--property", "colour=red", "--body", "x")
    assert "must be an integer" in fails(broker, "publish", "--property", "priority=high", "--body", "x")


# -- users, vhosts, permissions ---------------------------------------------------------------

def test_users_vhosts_permissions(broker: BrokerProcess, uid: str) -> None:
    user, vhost = f"u-{uid}", f"v-{uid}"
    ok(broker, "declare", "vhost", vhost)
    ok(broker, "declare", "user", user, "--password", "s3cret", "--tags", "management, monitoring")
    ok(broker, "declare", "permission", "--user", user, "--vhost", vhost, "--configure", ".*", "--write", "^w",
       "--read", "^r")

    assert by_name(as_json(broker, "list", "vhosts"), vhost)
    tags = named(as_json(broker, "list", "users"), user)["tags"]
    assert sorted(tags if isinstance(tags, list) else tags.split(",")) == ["management", "monitoring"]
    assert user in ok(broker, "list", "users") and vhost in ok(broker, "list", "vhosts")
    # (the creator of a vhost may also get full permissions on it, as in RabbitMQ)
    perms = [p for p in as_json(broker, "list", "permissions", "--vhost", vhost) if p["user"] == user]
    assert perms == [{"user": user, "vhost": vhost, "configure": ".*", "write": "^w", "read": "^r"}]
    assert user in ok(broker, "list", "permissions")

    # the new user can use the API (guest-only loopback rule aside) and declare in its vhost
    result = run(broker, "--user", user, "--password", "s3cret", "--vhost", vhost, "declare", "queue", "wq")
    assert result.returncode == 0, result.stderr
    assert [q["name"] for q in as_json(broker, "list", "queues", "--vhost", vhost)] == ["wq"]
    line = fails(broker, "--user", user, "--password", "s3cret", "--vhost", "/", "declare", "queue", "wq")
    assert line.startswith("warrenctl: 40")  # 401 or 403: no access to vhost '/'

    ok(broker, "delete", "permission", "--user", user, "--vhost", vhost)
    assert not [p for p in as_json(broker, "list", "permissions", "--vhost", vhost) if p["user"] == user]
    ok(broker, "delete", "user", user)
    ok(broker, "delete", "vhost", vhost)
    assert by_name(as_json(broker, "list", "users"), user) is None
    assert by_name(as_json(broker, "list", "vhosts"), vhost) is None
    assert fails(broker, "delete", "user", user) == f"warrenctl: 404 Not Found: no user '{user}'"
    assert fails(broker, "delete", "vhost", vhost) == f"warrenctl: 404 Not Found: no vhost '{vhost}'"


def test_declare_user_needs_a_password(broker: BrokerProcess, uid: str) -> None:
    assert run(broker, "declare", "user", uid).returncode == 2


# -- connections, channels, consumers ---------------------------------------------------------

def test_connections_channels_consumers(broker: BrokerProcess, uid: str) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port,
                                                                   client_properties={"connection_name": uid}))
    try:
        channel = connection.channel()
        channel.queue_declare(uid, auto_delete=True)
        channel.basic_consume(uid, lambda *a: None, consumer_tag=f"ctag-{uid}")
        connection.process_data_events(0)

        def mine(kind: str, match: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
            return [row for row in as_json(broker, "list", kind) if match(row)]

        conns = eventually(lambda: mine("connections", lambda c: (c.get("client_properties") or {}).get(
            "connection_name") == uid))
        assert conns and conns[0]["user"] == "guest" and conns[0]["vhost"] == "/"
        name = conns[0]["name"]
        assert eventually(lambda: mine("channels", lambda c: (c.get("connection_details") or {}).get("name") == name))
        consumers = eventually(lambda: mine("consumers", lambda c: c.get("consumer_tag") == f"ctag-{uid}"))
        assert consumers and consumers[0]["queue"]["name"] == uid
        for kind in ("connections", "channels", "consumers"):
            assert ok(broker, "list", kind).strip()
        assert f"ctag-{uid}" in ok(broker, "list", "consumers")
    finally:
        connection.close()


# -- export to Parquet through Spark ----------------------------------------------------------

def _publish(broker: BrokerProcess, vhost: str, queue: str, bodies: list[bytes]) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, virtual_host=vhost))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


@pytest.mark.client  # warrenctl export runs a SparkSession
@pytest.mark.timeout(400)
def test_export_queues_to_parquet_browse_then_drain(broker: BrokerProcess, uid: str, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    if not shutil.which("java"):
        pytest.skip("java is not installed: no Spark")
    import pyarrow.parquet as pq

    vhost = f"x-{uid}"
    ok(broker, "declare", "vhost", vhost)
    ok(broker, "declare", "permission", "--user", "guest", "--vhost", vhost, "--configure", ".*", "--write", ".*",
       "--read", ".*")
    _publish(broker, vhost, "a", [f"a{i}".encode() for i in range(30)])
    _publish(broker, vhost, "b/c", [b"x"] * 5)  # a name that is no file name as it stands
    result = run(broker, "export", "--vhost", vhost, "--all-queues", "--partition-size", "7", str(tmp_path / "p"),
                 timeout=300)
    assert result.returncode == 0, result.stderr
    assert "queue 'a': 30 messages written to" in result.stdout and "queue 'b/c': 5 messages" in result.stdout
    table = pq.read_table(tmp_path / "p" / "a")
    assert sorted(table.column("offset").to_pylist()) == list(range(30))
    assert sorted(table.column("body").to_pylist()) == sorted(f"a{i}".encode() for i in range(30))
    assert pq.read_table(tmp_path / "p" / "b%2Fc").num_rows == 5
    queues = {q["name"]: q for q in as_json(broker, "list", "queues", "--vhost", vhost)}
    assert queues["a"]["messages"] == 30  # a browse leaves the queue alone

    _publish(broker, vhost, "a", [b"late"])
    result = run(broker, "export", "--vhost", vhost, "--queue", "a", "--drain", "--json", str(tmp_path / "d"),
                 timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"queue": "a", "path": str(tmp_path / "d" / "a"), "rows": 31,
                                          "removed": 31}]
    assert pq.read_table(tmp_path / "d" / "a").num_rows == 31
    assert eventually(lambda: named(as_json(broker, "list", "queues", "--vhost", vhost), "a")["messages"] == 0)
    ok(broker, "delete", "vhost", vhost)


def test_export_failures_are_one_line_before_spark_starts(broker: BrokerProcess, uid: str, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    assert fails(broker, "export", "--queue", f"nope-{uid}", out) == (
        f"warrenctl: 404 Not Found: no queue 'nope-{uid}' in vhost '/'")
    assert fails(broker, "export", "--all-queues", "--vhost", f"nov-{uid}", out) == (
        f"warrenctl: 404 Not Found: no vhost 'nov-{uid}'")
    assert fails(broker, "export", "--drain", out) == "warrenctl: --drain needs --queue or --all-queues"
    ok(broker, "declare", "queue", uid)
    (tmp_path / "out" / uid).mkdir(parents=True)
    assert fails(broker, "export", "--queue", uid, out) == f"warrenctl: {tmp_path / 'out' / uid} already exists"
    fake = tmp_path / "fake" / "pyspark"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'pyspark'\")\n")
    path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", str(ROOT))])
    assert fails(broker, "export", "--queue", uid, str(tmp_path / "other"), env={"PYTHONPATH": path}) == (
        "warrenctl: export needs pyspark: pip install 'warren[spark]'")
    ok(broker, "delete", "queue", uid)


# -- definitions ------------------------------------------------------------------------------

def test_export_import(broker: BrokerProcess, uid: str, tmp_path: Path) -> None:
    ok(broker, "declare", "queue", uid, "--durable", "--arg", "x-max-length=5")
    ok(broker, "declare", "exchange", f"{uid}-x", "--type", "fanout", "--durable")
    ok(broker, "declare", "binding", "--source", f"{uid}-x", "--destination", uid)
    path = tmp_path / "defs.json"
    assert "exported" in ok(broker, "export", str(path))
    definitions = json.loads(path.read_text())
    assert any(q["name"] == uid for q in definitions["queues"])
    assert any(b["source"] == f"{uid}-x" and b["destination"] == uid for b in definitions["bindings"])
    assert json.loads(ok(broker, "export", "-"))["queues"]

    ok(broker, "delete", "exchange", f"{uid}-x")
    ok(broker, "delete", "queue", uid)
    assert "imported" in ok(broker, "import", str(path))
    queue = by_name(as_json(broker, "list", "queues"), uid)
    assert queue and queue["arguments"] == {"x-max-length": 5}
    assert [b for b in as_json(broker, "list", "bindings") if b["source"] == f"{uid}-x" and b["destination"] == uid]
    ok(broker, "delete", "exchange", f"{uid}-x")
    ok(broker, "delete", "queue", uid)


def test_import_errors(broker: BrokerProcess, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    assert fails(broker, "import", str(missing)) == f"warrenctl: cannot read {missing}: No such file or directory"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert fails(broker, "import", str(bad)).startswith(f"warrenctl: {bad} is not JSON")
    rejected = tmp_path / "rejected.json"
    rejected.write_text(json.dumps({"queues": [{"name": 5}]}))
    assert fails(broker, "import", str(rejected)).startswith("warrenctl: 400 Bad Request")


def test_policies_set_list_clear(broker: BrokerProcess, uid: str) -> None:
    out = ok(broker, "set", "policy", uid, "--pattern", f"^{uid}$", "--definition", '{"max-length": 1}',
             "--priority", "2", "--apply-to", "queues")
    assert out.strip() == (f"policy '{uid}' set in vhost '/': pattern '^{uid}$', definition {{\"max-length\": 1}}, "
                           "priority 2, apply-to queues")
    assert by_name(as_json(broker, "list", "policies"), uid) == {
        "vhost": "/", "name": uid, "pattern": f"^{uid}$", "apply-to": "queues", "definition": {"max-length": 1},
        "priority": 2}
    assert uid in ok(broker, "list", "policies")
    ok(broker, "declare", "queue", uid)
    ok(broker, "publish", "--routing-key", uid, "--body", "a")
    ok(broker, "publish", "--routing-key", uid, "--body", "b")
    assert eventually(lambda: named(as_json(broker, "list", "queues"), uid)["messages"] == 1)
    ok(broker, "declare", "operator-policy", uid, "--pattern", f"^{uid}$", "--definition", '{"expires": 60000}')
    assert named(as_json(broker, "list", "operator-policies"), uid)["definition"] == {"expires": 60000}
    line = fails(broker, "set", "policy", "bad", "--pattern", ".*", "--definition", '{"max-priority": 1}')
    assert line == ('warrenctl: 400 Bad Request: Validation failed [{<<"max-priority">>,1}] are not recognised '
                    'policy settings')
    assert ok(broker, "clear", "policy", uid).strip() == f"policy '{uid}' cleared in vhost '/'"
    ok(broker, "delete", "operator-policy", uid)
    assert fails(broker, "clear", "policy", uid) == f"warrenctl: 404 Not Found: no policy '{uid}' in vhost '/'"
    assert by_name(as_json(broker, "list", "policies"), uid) is None
