"""RabbitMQ's own ``rabbitmqadmin`` (fetched from Debian's rabbitmq-server package, never committed)
driving a Warren node over the management HTTP API."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pika
import pytest

from conftest import CLIENT, BrokerProcess, starts, unavailable
from rabbitmq_tools import Unavailable, rabbitmqadmin


@pytest.fixture(scope="module")
@starts(CLIENT)
def script() -> Path:
    try:
        return rabbitmqadmin()
    except (Unavailable, OSError, subprocess.SubprocessError) as exc:
        unavailable(f"rabbitmqadmin unavailable: {exc}")


def runner(script: Path, node: BrokerProcess, home: Path):
    """Run rabbitmqadmin against ``node``: its output, once it exited as ``ok`` says."""

    def run(*args: str, ok: bool = True) -> str:
        result = subprocess.run([sys.executable, str(script), "-H", "127.0.0.1", "-P", str(node.mgmt_port), *args],
                                capture_output=True, text=True, timeout=60,
                                env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
        assert (result.returncode == 0) == ok, (args, result.stdout, result.stderr)
        return result.stdout + result.stderr

    return run


@pytest.fixture
def admin(script: Path, broker: BrokerProcess, tmp_path: Path):
    return runner(script, broker, tmp_path)


def listing(admin, *args: str) -> list[dict[str, Any]]:
    return json.loads(admin("-f", "raw_json", *args))


def test_list_commands(admin, broker, uid):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = connection.channel()
    channel.queue_declare(uid)
    channel.exchange_declare(uid, "topic")
    channel.queue_bind(uid, uid, "a.#")
    channel.basic_publish("", uid, b"one")
    connection.process_data_events(0.2)
    queues = {q["name"]: q for q in listing(admin, "list", "queues")}
    assert queues[uid]["messages"] == 1 and queues[uid]["vhost"] == "/"
    assert uid in admin("list", "queues", "name", "messages")  # the table format, with chosen columns
    exchanges = {e["name"]: e for e in listing(admin, "list", "exchanges")}
    assert exchanges[uid]["type"] == "topic" and "amq.direct" in exchanges
    bindings = listing(admin, "list", "bindings")
    assert {"source": uid, "destination": uid, "routing_key": "a.#"}.items() <= \
        next(b for b in bindings if b["source"] == uid).items()
    users = {u["name"]: u for u in listing(admin, "list", "users")}
    assert users["guest"]["tags"] in ("administrator", ["administrator"])
    assert "/" in {v["name"] for v in listing(admin, "list", "vhosts")}
    assert any(c["name"] for c in listing(admin, "list", "connections"))
    assert listing(admin, "list", "channels")
    assert listing(admin, "list", "nodes")[0]["name"]
    assert "rabbitmq_version" in admin("show", "overview")
    channel.queue_delete(uid)
    channel.exchange_delete(uid)
    connection.close()


def test_declare_publish_get_delete(admin, uid):
    queue, exchange = f"{uid}-q", f"{uid}-x"
    assert "queue declared" in admin("declare", "queue", f"name={queue}", "durable=false",
                                     'arguments={"x-max-length": 10}')
    assert "exchange declared" in admin("declare", "exchange", f"name={exchange}", "type=direct")
    assert "binding declared" in admin("declare", "binding", f"source={exchange}", f"destination={queue}",
                                       "routing_key=k")
    assert "Message published" in admin("publish", f"exchange={exchange}", "routing_key=k", "payload=hello",
                                        'properties={"content_type": "text/plain"}')
    assert "message_count" in admin("get", f"queue={queue}", "ackmode=ack_requeue_true")
    got = listing(admin, "get", f"queue={queue}", "count=5", "ackmode=ack_requeue_false")
    assert len(got) == 1 and got[0]["payload"] == "hello" and got[0]["redelivered"] is True
    assert got[0]["properties"]["content_type"] == "text/plain"
    assert listing(admin, "get", f"queue={queue}", "ackmode=ack_requeue_false") == []
    info = {q["name"]: q for q in listing(admin, "list", "queues")}[queue]
    assert info["arguments"] == {"x-max-length": 10} and info["durable"] is False
    assert "binding deleted" in admin("delete", "binding", f"source={exchange}", f"destination={queue}",
                                      "destination_type=queue", "properties_key=k")
    assert "queue deleted" in admin("delete", "queue", f"name={queue}")
    assert "exchange deleted" in admin("delete", "exchange", f"name={exchange}")
    assert queue not in {q["name"] for q in listing(admin, "list", "queues")}
    assert "Not found: /api/queues/%2F/" in admin("delete", "queue", f"name={queue}", ok=False)


def test_vhost_user_permission_commands(admin, uid):
    vhost, user = f"{uid}-vh", f"{uid}-user"
    admin("declare", "vhost", f"name={vhost}")
    admin("declare", "user", f"name={user}", "password=secret", "tags=management")
    admin("declare", "permission", f"vhost={vhost}", f"user={user}", "configure=.*", "write=.*", "read=.*")
    admin("-V", vhost, "declare", "queue", f"name={uid}")
    mine = listing(admin, "-V", vhost, "list", "queues")
    assert [q["name"] for q in mine] == [uid]
    # the management user sees its own vhost only, and may not list users
    assert {v["name"] for v in listing(admin, "list", "vhosts")} >= {vhost, "/"}
    as_user = ["-u", user, "-p", "secret"]
    assert {v["name"] for v in listing(admin, *as_user, "list", "vhosts")} == {vhost}
    assert "Access refused: /api/users" in admin(*as_user, "list", "users", ok=False)  # RabbitMQ's 401
    admin("delete", "vhost", f"name={vhost}")
    admin("delete", "user", f"name={user}")


def test_export_import(admin, script, start_broker, tmp_path, uid):
    exchange, queue = f"{uid}-x", f"{uid}-q"
    admin("declare", "exchange", f"name={exchange}", "type=fanout", "durable=true")
    admin("declare", "queue", f"name={queue}", "durable=true")
    admin("declare", "binding", f"source={exchange}", f"destination={queue}")
    exported = tmp_path / "defs.json"
    assert "Exported definitions" in admin("export", str(exported))
    defs = json.loads(exported.read_text())
    assert any(q["name"] == queue for q in defs["queues"])
    fresh = runner(script, start_broker(), tmp_path)
    assert "Uploaded definitions" in fresh("import", str(exported))
    assert any(b["source"] == exchange and b["destination"] == queue for b in listing(fresh, "list", "bindings"))
    assert any(q["name"] == queue and q["durable"] for q in listing(fresh, "list", "queues"))
    admin("delete", "queue", f"name={queue}")
    admin("delete", "exchange", f"name={exchange}")
