"""The definition store filled on purpose: its map grows rather than fills, deletes and administrators' writes
always go through, and what clients declare stops at ``--definitions-max-size`` with a clear refusal that
leaves nothing behind, before and after a restart."""
from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import aetcd
import pika
import pytest

from amqp_server.definition_store import DefinitionStore
from conftest import BrokerProcess, connect
from test_cluster import Etcd, start_node

pytestmark = pytest.mark.timeout(120)

MAX_SIZE = 1 << 20
FILLER = "x" * (200 * 1024)  # a queue argument of 200 KiB: five fill the store


def test_the_map_grows_for_writes_and_deletes(tmp_path: Path) -> None:
    """A map of 64 KiB takes 1 MiB of records, and a delete in a map that is full goes through."""
    store = DefinitionStore(str(tmp_path), max_size=MAX_SIZE, map_size=64 * 1024)
    try:
        for i in range(16):
            store.put("queue", f"q{i}", {"arguments": {"filler": "x" * 65536}})
        assert store.map_size > 1 << 20
        assert store.used > 1 << 20
        for i in range(16):
            assert store.delete("queue", f"q{i}")
        assert store.used < 64 * 1024
        assert store.records("queue") == []
    finally:
        store.close()


def http(node: BrokerProcess, method: str, path: str, body: Any = None,
         user: str = "guest", password: str = "guest") -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            raw = reply.read()
            return reply.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else None


def test_a_full_store_refuses_clients_and_still_deletes_and_adds_users(
        start_broker: Callable[..., BrokerProcess]) -> None:
    node = start_broker("--definitions-max-size", str(MAX_SIZE))
    made = []
    for i in range(20):
        status, answer = http(node, "PUT", f"/api/queues/%2F/filler-{i}",
                              {"durable": True, "arguments": {"x-filler": FILLER}})
        if status != 201:
            break
        made.append(f"filler-{i}")
    else:
        pytest.fail("the store took 4 MiB of arguments with --definitions-max-size 1 MiB")
    refused = f"filler-{len(made)}"
    assert 3 <= len(made) <= 5
    assert status == 400, answer
    assert answer["reason"].startswith(f"cannot declare queue '{refused}' in vhost '/': definitions store full")
    assert http(node, "GET", f"/api/queues/%2F/{refused}")[0] == 404  # nothing left behind

    # AMQP: the same refusal, a channel error (406) with the same text
    with connect(node) as connection:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refusal:
            channel.queue_declare("amqp-filler", durable=True, arguments={"x-filler": "y" * 100_000})
        assert refusal.value.reply_code == 406
        assert "definitions store full" in refusal.value.reply_text
        channel = connection.channel()
        channel.queue_declare("transient", durable=False, arguments={"x-filler": "y" * 100_000})  # (not stored)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            channel.queue_declare("amqp-filler", passive=True)

    # the administrator can still add a user and delete the fillers, which makes room again
    assert http(node, "PUT", "/api/users/after-full", {"password": "pw", "tags": "management"})[0] == 201
    assert http(node, "PUT", "/api/permissions/%2F/after-full", {"configure": ".*", "write": ".*", "read": ".*"})[0] \
        in (201, 204)
    for name in made[:-1]:
        assert http(node, "DELETE", f"/api/queues/%2F/{name}")[0] == 204
    assert http(node, "PUT", f"/api/queues/%2F/{refused}", {"durable": True, "arguments": {"x-filler": FILLER}},
                user="after-full", password="pw")[0] == 201

    node.stop()
    node.start()
    names = {queue["name"] for queue in http(node, "GET", "/api/queues/%2F")[1]}
    assert {made[-1], refused} <= names
    assert not names & set(made[:-1])
    assert "amqp-filler" not in names
    assert http(node, "GET", "/api/users/after-full")[0] == 200
    assert http(node, "DELETE", f"/api/queues/%2F/{refused}")[0] == 204


@pytest.mark.cluster
def test_in_a_cluster_a_full_store_refuses_before_etcd_has_it(tmp_path: Path) -> None:
    """A cluster node checks its store's room before the cluster agrees on a new queue: the refused queue is in
    no node's memory and not in etcd."""
    etcd = Etcd(tmp_path / "etcd")
    node = None
    try:
        node = start_node(tmp_path, etcd, 1, extra=("--definitions-max-size", str(MAX_SIZE)))
        with connect(node) as connection:
            refused = None
            for i in range(20):
                try:
                    connection.channel().queue_declare(f"c-filler-{i}", durable=True,
                                                       arguments={"x-filler": "z" * 120_000})
                except pika.exceptions.ChannelClosedByBroker as exc:
                    assert exc.reply_code == 406 and "definitions store full" in exc.reply_text
                    refused = f"c-filler-{i}"
                    break
            assert refused is not None and i >= 3
        names = {queue["name"] for queue in http(node, "GET", "/api/queues/%2F")[1]}
        assert refused not in names and f"c-filler-{i - 1}" in names
        async def in_etcd() -> list[bytes]:
            client = aetcd.Client(port=etcd.port, timeout=5)
            try:
                return [kv.key for kv in await client.get_prefix(b"/warren/def/queue/")]
            finally:
                await client.close()

        keys = asyncio.run(in_etcd())
        assert not any(refused.encode() in key for key in keys) and len(keys) == i
    finally:
        if node is not None:
            node.stop()
        etcd.stop()
