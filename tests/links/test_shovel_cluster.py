"""A dynamic shovel in a three-node cluster: it runs on exactly one node, and moves to another when that node is
killed, losing nothing under on-confirm."""
from __future__ import annotations

import hashlib
import time
from typing import Iterator

import pytest

from conftest import CLUSTER, BrokerProcess, connect, starts
from test_cluster import three_nodes, wait_for
from support import call
from test_shovel import depth, drain, publish

N = 2000


@pytest.fixture
@starts(CLUSTER)
def three(tmp_path) -> Iterator[list[BrokerProcess]]:
    with three_nodes(tmp_path) as (_, nodes):
        yield nodes


def rank(name: str, node: str) -> bytes:
    """The placement's stable hash (amqp_server.shovel.manager), to pick a shovel name that does not land on the
    node owning the queues."""
    return hashlib.sha256(f"/\0{name}\0{node}".encode()).digest()


def listed(node: BrokerProcess) -> list[dict]:
    return call(node, "GET", "/api/shovels").json or []


def test_a_shovel_runs_on_one_node_and_moves_when_it_dies(three):
    nodes = three
    names = [f"warren{i}@localhost" for i in (1, 2, 3)]
    name = next(f"moving{i}" for i in range(100) if max(names, key=lambda n: rank(f"moving{i}", n)) != names[0])
    home = max(names, key=lambda n: rank(name, n))
    publish(nodes[0], "cs-src", N)  # the queues are node 1's: it stays up
    connection = connect(nodes[0])
    connection.channel().queue_declare("cs-dest", durable=True)
    connection.close()
    value = {"src-uri": "amqp://", "src-queue": "cs-src", "src-prefetch-count": 20, "dest-uri": "amqp://",
             "dest-queue": "cs-dest", "reconnect-delay": 1}
    assert call(nodes[0], "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": value}).status == 201
    for node in nodes:  # every node's answer lists it once, on its node
        wait_for(lambda node=node: [s["node"] for s in listed(node)] == [home], f"{name} listed on {home}")
    victim = nodes[names.index(home)]
    other = next(n for n in nodes if n is not victim)  # restarted through a node that does not run it
    assert call(other, "DELETE", f"/api/shovels/vhost/%2F/{name}/restart").status == 204
    assert call(other, "DELETE", "/api/shovels/vhost/%2F/nosuch/restart").status == 404
    wait_for(lambda: depth(nodes[0], "cs-dest") > N // 10, "the transfer under way")
    assert depth(nodes[0], "cs-dest") < N, "the transfer ended before the kill"
    victim.kill()
    survivors = [n for n in nodes if n is not victim]
    wait_for(lambda: [s["node"] for s in listed(survivors[0]) if s["state"] == "running"]
             not in ([], [home]), "the shovel running on another node", timeout=60)
    wait_for(lambda: depth(nodes[0], "cs-src") == 0, "the source drained", timeout=60)
    time.sleep(1)
    moved = {int(body) for body, _ in drain(nodes[0], "cs-dest")}
    assert moved == set(range(N))
    assert len(listed(survivors[1])) == 1
