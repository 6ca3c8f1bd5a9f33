"""The broker through Node.js amqplib, the most used Node client, unmodified.

Each scenario is a script in tests/node/ (amqplib pinned by its package-lock.json; test.sh runs
``npm ci --prefix tests/node``) that connects to the node and prints what it saw as one JSON line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, BrokerProcess, unavailable

NODE_DIR = ROOT / "tests" / "node"
NODE = shutil.which("node") or ""  # "" if missing, and then the module is skipped
if not NODE:
    unavailable("node is not installed (apt-get install nodejs npm); test.sh installs it")
if not (NODE_DIR / "node_modules" / "amqplib").is_dir():
    unavailable("amqplib is not installed: run `npm ci --prefix tests/node` (test.sh does)")

pytestmark = [pytest.mark.timeout(60), pytest.mark.client]


def node_script(script: str, broker: BrokerProcess, name: str) -> dict:
    """Run tests/node/<script>.js against ``broker``; its JSON result."""
    done = subprocess.run([NODE, str(NODE_DIR / f"{script}.js")], cwd=NODE_DIR, capture_output=True, text=True,
                          timeout=45, env=dict(os.environ, AMQP_URL=broker.url, NAME=name))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_amqplib_work_queue_prefetch_and_acks(broker, uid):
    result = node_script("work_queue", broker, uid)
    assert [m["body"] for m in result["messages"]] == [f"job {i}" for i in range(40)]
    assert [m["id"] for m in result["messages"]] == [f"m{i}" for i in range(40)]
    assert all(m["persistent"] for m in result["messages"])
    assert 1 <= result["maxUnacked"] <= 3
    assert result["left"] == 0


def test_amqplib_confirm_channel_and_mandatory_return(broker, uid):
    result = node_script("confirms", broker, uid)
    assert result["acked"] == list(range(200))
    assert result["messageCount"] == 200
    assert result["returned"] == {"replyCode": 312, "replyText": "NO_ROUTE", "routingKey": f"{uid}.nowhere",
                                  "body": "lost"}
    assert result["unroutableConfirmed"] is True


def test_amqplib_topic_routing_with_cc_and_bcc(broker, uid):
    result = node_script("topic", broker, uid)
    assert result == {
        "all": sorted(["kern.error", "kern.info", "app.error", "app.web.db", "app.db", "user.info.more", "nothing"]),
        "errors": ["app.error", "kern.error"],
        "kern": ["kern.error", "kern.info", "nothing"],
        "deep": ["app.db", "app.web.db", "nothing"],  # one copy for two matching keys (a CC and a BCC one)
        "ccHeaders": {"CC": ["kern.critical", "app.web.db"], "n": 1},
    }


def test_amqplib_rpc_reply_queue_and_direct_reply_to(broker, uid):
    result = node_script("rpc", broker, uid)
    assert result["named"] == [1, 4, 9]
    assert result["viaDirect"] == [16, 25]
    assert result["replyQueue"].startswith("amq.gen-")


def test_amqplib_channel_error_404_keeps_connection(broker, uid):
    result = node_script("channel_error", broker, uid)
    check = result["checkError"]
    assert check["code"] == 404
    assert (check["classId"], check["methodId"]) == (50, 10)  # queue.declare
    assert f"NOT_FOUND - no queue '{uid}.missing' in vhost '/'" in check["message"]
    assert result["channelError"]["code"] == 404  # the channel's 'error' event
    assert result["connectionError"] is None
    assert result["otherChannelGot"] == "still here"
    assert result["freshChannelSees"] == uid


def test_amqplib_connection_blocked(start_broker, uid):
    # 2 bytes is always over the watermark (see test_clients.py)
    node = start_broker("--memory-high-watermark", "2")
    result = node_script("blocked", node, uid)
    assert result["blocked"] is True


def test_amqplib_close_while_frames_are_still_buffered(broker, uid):
    """The client closes with ~1 MB of publishes still on the way: close-ok arrives, no ECONNRESET (RabbitMQ:
    the broker reads and drops what follows connection.close and lets the client close the socket)."""
    result = node_script("close_while_writing", broker, uid)
    assert result["closed"] is True
    assert result["sent"] > 100
