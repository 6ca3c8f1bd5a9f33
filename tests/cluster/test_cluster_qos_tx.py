"""What a channel promises across nodes as RabbitMQ's does on one: a shared prefetch (``basic.qos global=true``)
bounds what another node's queue sends its consumers (rabbit_limiter:can_send before each delivery), and a
transaction's commit waits for every queue's answer to its publishes (rabbit_channel: maybe_complete_tx), failing
with ``partial tx completion`` if one refused."""
from __future__ import annotations

from typing import Iterator

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import CLUSTER, BrokerProcess, starts
from test_cluster import Etcd, connect, passive, three_nodes, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
@starts(CLUSTER)
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    started: tuple[Etcd, list[BrokerProcess]]
    with three_nodes(tmp_path_factory.mktemp("qos-tx-cluster")) as started:
        yield started[1]


def test_a_commit_fails_when_another_node_s_queue_refuses_its_publish(nodes, uid):
    n1, n2, _ = nodes
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.basic_publish("", uid, b"fills it")
    wait_for(lambda: passive(n2, uid) == 1, "the queue is full, as node 2 sees it")
    with connect(n2) as connection:
        ch = connection.channel()
        ch.tx_select()
        ch.basic_publish("", uid, b"refused by node 1")
        with pytest.raises(ChannelClosedByBroker) as closed:
            ch.tx_commit()
        error = closed.value
        assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - partial tx completion")
        ch = connection.channel()  # the connection goes on; a commit the owner takes succeeds
        ch.queue_purge(uid)
        ch.tx_select()
        ch.basic_publish("", uid, b"taken")
        ch.tx_commit()
    assert passive(n1, uid) == 1


def test_a_commit_waits_for_another_node_s_queue_to_take_its_publishes(nodes, uid):
    """Once commit-ok came, the publishes are in the queue on its node (as a basic.get there sees at once)."""
    n1, n2, _ = nodes
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True)
    wait_for(lambda: passive(n2, uid) == 0, "the queue on node 2")
    with connect(n2) as publisher, connect(n1) as reader:
        ch = publisher.channel()
        ch.tx_select()
        for i in range(50):
            ch.basic_publish("", uid, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        ch.tx_commit()
        assert reader.channel().queue_declare(uid, passive=True).method.message_count == 50
