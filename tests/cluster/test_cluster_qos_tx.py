"""What a channel promises across nodes as RabbitMQ's does on one: a shared prefetch (``basic.qos global=true``)
bounds what another node's queue sends its consumers (rabbit_limiter:can_send before each delivery), and a
transaction's commit waits for every queue's answer to its publishes (rabbit_channel: maybe_complete_tx), failing
with ``partial tx completion`` if one refused."""
from __future__ import annotations

import time
from typing import Callable, Iterator

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker
from pika.spec import Basic

from conftest import CLUSTER, BrokerProcess, starts
from support import delivery_tag, numbered, publish_to
from test_cluster import Etcd, connect, passive, three_nodes, wait_for

pytestmark = pytest.mark.timeout(120)


def pump(done: Callable[[], bool], *connections: pika.BlockingConnection, seconds: float = 10) -> None:
    """Let the connections take their deliveries until ``done()`` or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        for connection in connections:
            connection.process_data_events(time_limit=0.05)


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


def test_a_shared_prefetch_bounds_what_another_node_s_queues_send_its_consumers(nodes, uid):
    """Two queues of node 1, consumed on one channel of node 2 with ``basic.qos(5, global=True)`` and by a
    competing consumer each on node 1: node 2's client gets 5, and the rest go to node 1's consumers rather than
    wait in node 2 for the channel's room.  Once node 1's consumers are gone, node 2's take everything, 5 unacked
    at most at any moment, as the channel acks."""
    n1, n2, _ = nodes
    queues = [uid + "-a", uid + "-b"]
    local = connect(n1)
    lch = local.channel()
    competing: list[int] = []
    for queue in queues:
        lch.queue_declare(queue)
        lch.basic_consume(queue, lambda c, m, p, b: competing.append(delivery_tag(m)))  # (no prefetch limit)
    for queue in queues:
        wait_for(lambda queue=queue: passive(n2, queue) == 0, "the queue on node 2")
    remote = connect(n2)
    rch = remote.channel()
    rch.basic_qos(prefetch_count=5, global_qos=True)
    held: list[int] = []
    total = [0]

    def take(channel: object, method: Basic.Deliver, properties: object, body: bytes) -> None:
        held.append(delivery_tag(method))
        total[0] += 1

    for queue in queues:
        rch.basic_consume(queue, take)
    remote.process_data_events(time_limit=0.5)  # node 1 has node 2's consumers before anything is published
    with connect(n1) as publisher:
        pch = publisher.channel()
        pch.confirm_delivery()
        for i in range(100):
            for queue in queues:
                pch.basic_publish("", queue, f"m{i}".encode())
    pump(lambda: len(competing) + len(held) >= 200, local, remote, seconds=10)
    remote.process_data_events(time_limit=0.3)
    assert (len(held), len(competing)) == (5, 195)
    local.close()  # node 1's consumers go: what they held is ready again, for node 2's only
    deadline = time.monotonic() + 20
    while total[0] < 200 and time.monotonic() < deadline:
        remote.process_data_events(time_limit=0.05)
        assert len(held) <= 5  # never more unacked than the channel's shared limit
        if held:
            rch.basic_ack(held[-1], multiple=True)
            held.clear()
    assert total[0] == 200
    remote.close()


def test_a_queue_of_another_node_with_nothing_for_the_channel_holds_none_of_its_shared_prefetch(nodes, uid):
    """Of a channel's ``basic.qos(4, global=True)``, a busy queue of node 1 gets all 4 while the channel's other
    queue there stays empty (the room the idle one was granted is asked back); lifting the limit lets the rest
    come."""
    n1, n2, _ = nodes
    idle, busy = uid + "-idle", uid + "-busy"
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(idle)
        ch.queue_declare(busy)
    for queue in (idle, busy):
        wait_for(lambda queue=queue: passive(n2, queue) == 0, "the queue on node 2")
    remote = connect(n2)
    rch = remote.channel()
    rch.basic_qos(prefetch_count=4, global_qos=True)
    got: list[bytes] = []
    rch.basic_consume(idle, lambda c, m, p, b: got.append(b))
    rch.basic_consume(busy, lambda c, m, p, b: got.append(b))
    remote.process_data_events(time_limit=0.5)
    publish_to(n1, busy, numbered(20))
    pump(lambda: len(got) >= 4, remote, seconds=5)
    remote.process_data_events(time_limit=0.3)
    assert len(got) == 4
    rch.basic_qos(prefetch_count=0, global_qos=True)
    pump(lambda: len(got) >= 20, remote, seconds=5)
    assert len(got) == 20
    remote.close()


def test_room_granted_to_another_node_s_idle_queue_goes_to_this_node_s_queue_that_has_messages(nodes, uid):
    """A channel of node 2 with ``basic.qos(3, global=True)`` consumes an empty queue of node 1 (which is granted
    the channel's room as it consumes) and a queue of node 2: the latter's messages still come, 3 at a time."""
    n1, n2, _ = nodes
    idle, own = uid + "-idle", uid + "-own"
    with connect(n1) as connection:
        connection.channel().queue_declare(idle)
    wait_for(lambda: passive(n2, idle) == 0, "the queue on node 2")
    remote = connect(n2)
    rch = remote.channel()
    rch.queue_declare(own)
    rch.basic_qos(prefetch_count=3, global_qos=True)
    got: list[int] = []
    rch.basic_consume(idle, lambda c, m, p, b: got.append(delivery_tag(m)))
    rch.basic_consume(own, lambda c, m, p, b: got.append(delivery_tag(m)))
    remote.process_data_events(time_limit=0.3)
    for i in range(10):
        rch.basic_publish("", own, f"m{i}".encode())
    seen = 0
    deadline = time.monotonic() + 5
    while seen < 10 and time.monotonic() < deadline:
        remote.process_data_events(time_limit=0.05)
        assert len(got) <= 3
        if got:
            seen += len(got)
            rch.basic_ack(got[-1], multiple=True)
            got.clear()
    assert seen == 10
    remote.close()


def test_a_shared_prefetch_set_after_consuming_bounds_another_node_s_queue_too(nodes, uid):
    """``basic.qos(5, global=True)`` on a channel of node 2 that consumes a queue of node 1 already holds that
    queue to it from then on (rabbit_channel: ``activate_limit_all`` of the queues it consumes from): node 2's
    client gets 5, and the rest go to node 1's competing consumer, not into node 2's buffer."""
    n1, n2, _ = nodes
    local = connect(n1)
    lch = local.channel()
    lch.queue_declare(uid)
    competing: list[int] = []
    lch.basic_consume(uid, lambda c, m, p, b: competing.append(delivery_tag(m)))
    wait_for(lambda: passive(n2, uid) == 0, "the queue on node 2")
    remote = connect(n2)
    rch = remote.channel()
    held: list[int] = []
    rch.basic_consume(uid, lambda c, m, p, b: held.append(delivery_tag(m)))
    rch.basic_qos(prefetch_count=5, global_qos=True)
    remote.process_data_events(time_limit=0.5)
    publish_to(n1, uid, numbered(100))
    pump(lambda: len(competing) + len(held) >= 100, local, remote, seconds=10)
    remote.process_data_events(time_limit=0.3)
    assert (len(held), len(competing)) == (5, 95)
    local.close()
    remote.close()


@pytest.mark.parametrize("owner", [0, 1], ids=["another-node-s-queue", "own-node-s-queue"])
def test_a_no_ack_consumer_waits_while_its_channel_is_at_its_shared_prefetch(nodes, uid, owner):
    """A no-ack consumer of a channel whose ``basic.qos(2, global=True)`` is taken by two unacked deliveries gets
    nothing until the channel has room (rabbit_limiter:can_send is asked for it too, and refuses while the limit is
    reached; its own deliveries take no room): a queue's messages go to its other consumer meanwhile, whichever
    node the queue is on; after an ack the no-ack consumer takes what comes."""
    n1, n2, _ = nodes
    queue, own = uid + "-q", uid + "-own"
    local = connect(nodes[owner])
    lch = local.channel()
    lch.queue_declare(queue)
    competing: list[bytes] = []
    lch.basic_consume(queue, lambda c, m, p, b: competing.append(b), auto_ack=True)
    wait_for(lambda: passive(n2, queue) == 0, "the queue on node 2")
    remote = connect(n2)
    rch = remote.channel()
    rch.queue_declare(own)
    rch.basic_qos(prefetch_count=2, global_qos=True)
    held: list[int] = []
    rch.basic_consume(own, lambda c, m, p, b: held.append(delivery_tag(m)))
    for i in range(2):
        rch.basic_publish("", own, f"own{i}".encode())
    pump(lambda: len(held) >= 2, remote, seconds=5)
    assert len(held) == 2
    no_ack: list[bytes] = []
    rch.basic_consume(queue, lambda c, m, p, b: no_ack.append(b), auto_ack=True)
    remote.process_data_events(time_limit=0.5)
    publish_to(n1, queue, numbered(20))
    pump(lambda: len(competing) + len(no_ack) >= 20, local, remote, seconds=10)
    remote.process_data_events(time_limit=0.3)
    assert (len(no_ack), len(competing)) == (0, 20)
    local.close()
    rch.basic_ack(held[-1], multiple=True)
    publish_to(n1, queue, numbered(30, "after"))
    pump(lambda: len(no_ack) >= 30, remote, seconds=10)
    assert no_ack == [f"after{i}".encode() for i in range(30)]
    remote.close()
