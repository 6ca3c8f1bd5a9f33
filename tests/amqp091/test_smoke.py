"""The node starts, serves pika, refuses a second start on its data directory, stops on SIGTERM."""
from __future__ import annotations

import os
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from conftest import ROOT


def test_publish_consume_roundtrip(broker, uid):
    with pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port)) as conn:
        ch = conn.channel()
        ch.queue_declare(uid)
        ch.basic_publish("", uid, b"hello", pika.BasicProperties(content_type="text/plain", headers={"k": "v"}))
        method, props, body = ch.basic_get(uid, auto_ack=True)
        assert body == b"hello" and method is not None and props is not None
        assert props.content_type == "text/plain" and props.headers == {"k": "v"}
        assert method.routing_key == uid and method.exchange == ""
        ch.queue_delete(uid)


def test_second_start_on_same_data_dir_refuses(broker):
    result = subprocess.run([sys.executable, "-m", "amqp_server", "--bind", "127.0.0.1", "--amqp-port", "0",
                             "--data-dir", str(broker.data_dir)], cwd=ROOT, capture_output=True, text=True,
                            timeout=30, env=dict(os.environ, COLUMNS="250"))
    assert result.returncode == 1
    assert "in use by another Warren node" in result.stdout + result.stderr


def test_sigterm_stops_cleanly(start_broker):
    node = start_broker()
    conn = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port))
    assert node.stop() == 0
    assert "shutting down" in node.said()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.process_data_events(1)
    assert closed.value.reply_code == 320
