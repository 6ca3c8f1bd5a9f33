"""Three Warren nodes and an etcd they agree through, all real processes on loopback ports."""
from __future__ import annotations

import asyncio
import datetime
import json
import queue as queue_module
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import aetcd
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker
from pamqp import commands
from pika.spec import Basic

from conftest import CLUSTER, ROOT, BrokerProcess, free_port, starts, unavailable
from conftest import connect as conftest_connect
from forwarder.metadata.membership import ALIVE_PREFIX, NODE_TTL
from support import Raw, call, delivery_tag, headers_of, publish_frames, stalled_consumer

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
if ETCD is None:
    unavailable("etcd is not installed (Debian package etcd-server; test.sh installs it)")
SECRET = "test-cluster-secret"


class Etcd:
    def __init__(self, data_dir: Path, port: int = 0, host: str = "127.0.0.1", netns: str = "",
                 tls: tuple[list[str], ssl.SSLContext] | None = None) -> None:
        """etcd on ``host`` (in the network namespace ``netns``, if given), data in ``data_dir``; with ``tls``
        (etcd's TLS options, and a context its health check connects with), on https."""
        self.port, self.peer = port or free_port(), free_port()
        self.host = host
        self.data_dir = data_dir
        self.netns = netns
        self.tls = tls
        self.log = open(data_dir.parent / "etcd.log", "ab")
        self.start()

    def start(self) -> None:
        """Start (again: the same ports and data, as a restarted etcd) and wait until healthy."""
        scheme = "https" if self.tls else "http"
        url, peer = f"{scheme}://{self.host}:{self.port}", f"http://{self.host}:{self.peer}"
        command = [ETCD, "--name", "warren-test", "--data-dir", str(self.data_dir),
                   "--listen-client-urls", url, "--advertise-client-urls", url,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", f"warren-test={peer}", *(self.tls[0] if self.tls else ())]
        if self.netns:
            command = ["ip", "netns", "exec", self.netns, *command]
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy(url)
        except BaseException:  # (an etcd that never became healthy is not left running)
            self.stop()
            raise

    def _wait_healthy(self, url: str) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1,
                                            context=self.tls[1] if self.tls else None) as reply:
                    if json.load(reply).get("health") == "true":
                        return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("etcd did not become healthy")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        self.kill()
        self.log.close()


class EtcdAddress(Protocol):
    """Where a node finds etcd: ``Etcd`` itself, or a proxy in front of it."""

    port: int


def start_node(tmp: Path, etcd: EtcdAddress, index: int, port: int = 0, link_port: int = 0,
               extra: tuple[str, ...] = ()) -> BrokerProcess:
    """A cluster node (``extra``: more options); a link port chosen free here is chosen again should another
    process take it first (as ``BrokerProcess.start`` does its own ports)."""
    tries = 3
    while True:
        tries -= 1
        node = BrokerProcess(tmp / f"node{index}", port=port, extra=[
            *extra, "--node-name", f"warren{index}@localhost", "--cluster-etcd", f"127.0.0.1:{etcd.port}",
            "--cluster-secret", SECRET, "--cluster-port", str(link_port or free_port())])
        node.link_port = int(node.extra[-1])
        try:
            return node.start()
        except RuntimeError as exc:
            if not (tries and not link_port and "address already in use" in str(exc).lower()):
                raise


@contextmanager
def three_nodes(tmp: Path) -> Iterator[tuple[Etcd, list[BrokerProcess]]]:
    """etcd and three nodes that see each other; every process started is stopped on the way out, a start that
    failed part way too."""
    etcd = Etcd(tmp / "etcd")
    nodes: list[BrokerProcess] = []
    try:
        nodes.extend(start_node(tmp, etcd, i) for i in (1, 2, 3))
        wait_for(lambda: all(len(running_nodes(n)) == 3 for n in nodes), "nodes see each other", timeout=30,
                 why=lambda: "; ".join(f"node {i} sees {views(n)}" for i, n in enumerate(nodes, 1)))
        yield etcd, nodes
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()


def views(node: BrokerProcess) -> object:
    """(name, running) of the nodes ``node`` knows, or why it does not answer."""
    try:
        return [(n["name"], n["running"]) for n in api(node, "/nodes")]
    except Exception as exc:
        return exc


@pytest.fixture(scope="module")
@starts(CLUSTER)
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Etcd, list[BrokerProcess]]]:
    with three_nodes(tmp_path_factory.mktemp("cluster")) as started:
        yield started


def wait_for(check: Callable[..., object], what: str, timeout: float = 15.0,
             why: Callable[[], str] | None = None) -> None:
    """Until ``check()`` holds (``...``: a lambda that binds a loop variable as its default takes it); ``why``
    says what stood in the way, in the error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting until {what}" + (f": {why()}" if why is not None else ""))


def api(node: BrokerProcess, path: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}/api{path}")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.load(reply)


def running_nodes(node: BrokerProcess) -> list[str]:
    return [n["name"] for n in api(node, "/nodes") if n["running"]]


def connect(node: BrokerProcess) -> pika.BlockingConnection:
    """No heartbeats (a stopped node must be found by the cluster, not by the client); blocking may last."""
    return conftest_connect(node, heartbeat=0, blocked_timeout=None)


def pump(connection: pika.BlockingConnection, done: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)


def passive(node: BrokerProcess, queue: str) -> int:
    with connect(node) as connection:
        return connection.channel().queue_declare(queue, passive=True).method.message_count


def gone(node: BrokerProcess, queue: str) -> bool:
    """The queue does not exist at all (not merely down)."""
    try:
        passive(node, queue)
    except ChannelClosedByBroker as exc:
        return exc.reply_code == 404 and "no queue" in exc.reply_text
    return False


def test_declared_queue_is_visible_on_every_node(cluster, uid):
    _, (n1, n2, n3) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True)
    for node in (n2, n3):
        assert passive(node, uid) == 0  # at once: a passive declare asks etcd for a queue unknown here
        info = api(node, f"/queues/%2F/{uid}")
        assert info["node"] == "warren1@localhost" and info["state"] == "running"


def amqp10_client() -> Any:
    return pytest.importorskip("rabbitmq_amqp_python_client")


@contextmanager
def amqp10_management(node: BrokerProcess) -> Iterator[Any]:
    """RabbitMQ's AMQP 1.0 client's management of ``node`` (its /management requests)."""
    environment = amqp10_client().Environment(uri=f"amqp://guest:guest@127.0.0.1:{node.port}/")
    connection = environment.connection()
    connection.dial()
    try:
        yield connection.management()
    finally:
        connection.close()
        environment.close()


def test_amqp10_management_declares_purges_and_deletes_as_the_cluster_agrees(cluster, uid):
    """RabbitMQ's AMQP 1.0 client's /management requests, each to another node: what one node declares another
    finds at once, a purge through a node that does not hold the queue empties it, a delete is the cluster's."""
    client = amqp10_client()
    _, (n1, n2, n3) = cluster
    with amqp10_management(n1) as m1, amqp10_management(n2) as m2, amqp10_management(n3) as m3:
        m1.declare_exchange(client.ExchangeSpecification(name=f"x-{uid}"))
        m1.declare_queue(client.ClassicQueueSpecification(name=uid))
        assert m2.queue_info(uid).name == uid  # at once, through another node
        m3.bind(client.ExchangeToQueueBindingSpecification(source_exchange=f"x-{uid}", destination_queue=uid,
                                                           binding_key="k"))
        with connect(n2) as connection:  # the binding is the cluster's as soon as it was answered
            channel = connection.channel()
            channel.confirm_delivery()
            for _ in range(3):
                channel.basic_publish(f"x-{uid}", "k", b"m", mandatory=True)
        assert m1.queue_info(uid).message_count == 3
        assert m2.purge_queue(uid) == 3  # the queue is n1's
        assert passive(n1, uid) == 0
        m3.delete_queue(uid)
        assert gone(n1, uid) and gone(n2, uid)
        m2.delete_exchange(f"x-{uid}")


def test_arguments_of_every_field_type_are_the_clusters(cluster, uid):
    """etcd keeps a definition's arguments with every field type: another node, and that node after a kill -9
    (reading its LMDB mirror and etcd again), holds exactly what was declared."""
    from test_argument_types import EVERY_TYPE, declare_with, decoded, exported, same
    _, (n1, n2, n3) = cluster
    declare_with(n1, uid, EVERY_TYPE)
    held = decoded(EVERY_TYPE)
    wait_for(lambda: len(exported(n2, uid)) == 3, "the queue, exchange and binding on node 2")
    found = exported(n2, uid)
    assert same(found["queues"], held) and same(found["exchanges"], held)
    assert same(found["bindings"], {**held, "x-match": "any-with-x"})
    n3.kill()
    n3.start()
    wait_for(lambda: len(exported(n3, uid)) == 3, "the queue, exchange and binding on node 3 again", timeout=20)
    found = exported(n3, uid)
    assert same(found["queues"], held) and same(found["exchanges"], held)


def test_publish_on_one_node_reaches_consumer_on_another_of_queue_owned_by_a_third(cluster, uid):
    _, (n1, n2, n3) = cluster
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid)
        ch.queue_bind(uid, "amq.direct", routing_key=uid)
    wait_for(lambda: passive(n2, uid) == 0 and passive(n3, uid) == 0, "queue everywhere")
    consumer = connect(n3)
    cch = consumer.channel()
    cch.basic_qos(prefetch_count=10)
    publisher = connect(n2)
    pch = publisher.channel()
    pch.confirm_delivery()
    for i in range(50):
        pch.basic_publish("amq.direct", uid, f"m{i}".encode(), mandatory=True)  # confirmed, else raises
    received: list[str] = []
    for method, _, body in cch.consume(uid, inactivity_timeout=10):
        assert method is not None and body is not None, f"only {len(received)} messages arrived"
        received.append(body.decode())
        cch.basic_ack(delivery_tag(method))
        if len(received) == 50:
            break
    assert received == [f"m{i}" for i in range(50)]  # order kept across three nodes
    cch.cancel()
    assert passive(n1, uid) == 0  # acked end to end: nothing left at the owner
    consumer.close()
    publisher.close()


def test_bodies_of_every_size_cross_nodes_byte_exact(cluster, uid):
    """Bodies at the edges of framing and of 16 MiB, published on one node to a queue of another and consumed
    on a third, arrive byte-exact."""
    from test_large_bodies import SIZES, body

    _, (n1, n2, n3) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True)
    wait_for(lambda: passive(n2, uid) == 0 and passive(n3, uid) == 0, "queue everywhere")
    with connect(n2) as publisher:
        pch = publisher.channel()
        pch.confirm_delivery()
        for size in SIZES:
            pch.basic_publish("", uid, body(size), pika.BasicProperties(delivery_mode=2))
    with connect(n3) as consumer:
        cch = consumer.channel()
        received: list[bytes] = []
        for method, _, data in cch.consume(uid, inactivity_timeout=30):
            assert method is not None and data is not None, f"only {len(received)} messages arrived"
            received.append(data)
            cch.basic_ack(delivery_tag(method))
            if len(received) == len(SIZES):
                break
        cch.cancel()
    assert [len(data) for data in received] == SIZES
    assert all(data == body(size) for data, size in zip(received, SIZES))


def test_balanced_locator_places_on_the_node_owning_fewest_queues(cluster, uid):
    _, (n1, _, _) = cluster
    owners = []
    for i in range(4):
        counts: dict[str, int] = {name: 0 for name in running_nodes(n1)}
        for queue in api(n1, "/queues"):
            if queue["node"] in counts:
                counts[queue["node"]] += 1
        expected = min(counts, key=lambda name: (counts[name], name))
        with connect(n1) as connection:
            connection.channel().queue_declare(f"{uid}-{i}", arguments={"x-queue-leader-locator": "balanced"})
        owners.append(api(n1, f"/queues/%2F/{uid}-{i}")["node"])
        assert owners[-1] == expected, (counts, owners)
    with connect(n1) as connection:
        connection.channel().queue_declare(uid + "-local")
    assert api(n1, f"/queues/%2F/{uid}-local")["node"] == "warren1@localhost"  # client-local by default


def test_confirm_is_a_nack_when_the_owner_refuses(cluster, uid):
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    assert passive(n2, uid) == 0  # known on node 2 (asked etcd if the watch had not brought it yet)
    with connect(n2) as connection:
        ch = connection.channel()
        ch.confirm_delivery()
        ch.basic_publish("", uid, b"fits")  # acked by the owner
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", uid, b"over the limit")
    assert passive(n1, uid) == 1


def test_fanout_to_several_queues_of_one_owner(cluster, uid):
    """One copy per queue arrives, persistent ones stored at the owner; a refusing queue nacks the publish."""
    _, (n1, n2, n3) = cluster
    queues = [f"{uid}-{i}" for i in range(4)]
    with connect(n1) as connection:
        ch = connection.channel()
        ch.exchange_declare(uid, "fanout")
        for queue in queues[:3]:
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, uid)
        ch.queue_declare(queues[3], arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
        ch.queue_bind(queues[3], uid)
    with connect(n3) as connection:  # and one queue of another owner
        ch = connection.channel()
        ch.queue_declare(uid + "-n3")
        ch.queue_bind(uid + "-n3", uid)
    wait_for(lambda: passive(n2, queues[3]) == 0 and passive(n2, uid + "-n3") == 0, "queues seen on node 2")
    with connect(n2) as connection:
        ch = connection.channel()
        ch.confirm_delivery()
        for i in range(2):
            ch.basic_publish(uid, "", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish(uid, "", b"m2", pika.BasicProperties(delivery_mode=2))
    assert [passive(n1, queue) for queue in queues] == [3, 3, 3, 2]
    assert passive(n3, uid + "-n3") == 3
    with connect(n3) as connection:
        ch = connection.channel()
        for queue in queues[:3]:
            bodies = [ch.basic_get(queue, auto_ack=True)[2] for _ in range(3)]
            assert bodies == [b"m0", b"m1", b"m2"]
        assert ch.basic_get(queues[0])[0] is None


def test_a_consumer_on_another_node_is_listed_by_the_queues_node(cluster, uid):
    """The owner's HTTP API lists a consumer whose client is on another node, with that client's channel as
    the other node describes it (RabbitMQ's channel_details name the channel's own node)."""
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid)
    wait_for(lambda: passive(n2, uid) == 0, "queue on node 2")
    with connect(n2) as connection:
        connection.channel().basic_consume(uid, lambda *_: None, consumer_tag="far")
        wait_for(lambda: api(n1, f"/queues/%2F/{uid}")["consumers"] == 1, "consumer at the owner")
        listed = api(n1, f"/queues/%2F/{uid}")["consumer_details"]
        channel = next(c for c in api(n2, "/channels") if c["consumer_count"] == 1)
        assert [(c["consumer_tag"], c["channel_details"]) for c in listed] == [("far", {
            "name": channel["name"], "number": channel["number"],
            "connection_name": channel["connection_details"]["name"],
            "peer_host": channel["connection_details"]["peer_host"],
            "peer_port": channel["connection_details"]["peer_port"], "node": "warren2@localhost", "user": "guest"})]
        assert [c["consumer_tag"] for c in api(n1, "/consumers") if c["queue"]["name"] == uid] == ["far"]


def test_prefetch_reject_and_requeue_end_to_end(cluster, uid):
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": uid + "-dl"})
        ch.queue_declare(uid + "-dl")
        ch.confirm_delivery()
        for i in range(10):
            ch.basic_publish("", uid, f"m{i}".encode())
    wait_for(lambda: passive(n2, uid) >= 0, "queue on node 2")
    connection = connect(n2)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=3)
    deliveries = []
    ch.basic_consume(uid, lambda c, m, p, b: deliveries.append((m, b)))
    pump(connection, lambda: len(deliveries) >= 3)
    connection.process_data_events(time_limit=0.5)
    assert len(deliveries) == 3  # prefetch honoured across the link
    first, second, third = deliveries
    ch.basic_reject(delivery_tag(first[0]), requeue=False)  # dead-lettered at the owner
    ch.basic_nack(delivery_tag(second[0]), requeue=True)  # back to its place, redelivered
    pump(connection, lambda: len(deliveries) >= 5)
    connection.process_data_events(time_limit=0.5)
    assert len(deliveries) == 5
    redelivered = [m for m, b in deliveries[3:] if b == second[1]]
    assert redelivered and redelivered[0].redelivered
    wait_for(lambda: passive(n1, uid + "-dl") == 1, "rejected message dead-lettered at the owner")
    connection.close()  # unacked go back
    wait_for(lambda: passive(n1, uid) == 9, "unacked requeued at the owner")


def test_consumer_priority_holds_for_a_consumer_on_another_node(cluster, uid):
    """x-priority travels with a consumer on another node: the owner prefers it while it has credit."""
    _, (n1, n2, _) = cluster
    local = connect(n1)
    lch = local.channel()
    lch.queue_declare(uid)
    lch.basic_qos(prefetch_count=100)
    low: list[bytes] = []
    lch.basic_consume(uid, lambda c, m, p, b: low.append(b))
    wait_for(lambda: passive(n2, uid) == 0, "queue on node 2")
    remote = connect(n2)
    rch = remote.channel()
    rch.basic_qos(prefetch_count=100)
    high: list[bytes] = []
    rch.basic_consume(uid, lambda c, m, p, b: high.append(b), arguments={"x-priority": 10})
    remote.process_data_events(time_limit=0.5)  # the owner has the remote consumer before anything is published
    lch.confirm_delivery()
    for i in range(20):
        lch.basic_publish("", uid, f"m{i}".encode())
    deadline = time.monotonic() + 5
    while len(low) + len(high) < 20 and time.monotonic() < deadline:
        remote.process_data_events(time_limit=0.05)
        local.process_data_events(time_limit=0.05)
    assert (len(high), len(low)) == (20, 0)
    remote.close()
    local.close()


def test_basic_get_and_purge_through_another_node(cluster, uid):
    _, (n1, n2, n3) = cluster
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid)
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", uid, f"m{i}".encode())
    wait_for(lambda: passive(n2, uid) == 3, "owner's count reported on node 2")
    with connect(n2) as connection:
        ch = connection.channel()
        method, _, body = ch.basic_get(uid)
        assert body == b"m0" and method is not None and method.message_count == 2 and not method.redelivered
        _, _, body = ch.basic_get(uid, auto_ack=True)
        assert body == b"m1"
        ch.basic_nack(delivery_tag(method), requeue=True)
        again, _, body = ch.basic_get(uid, auto_ack=True)
        assert body == b"m0" and again is not None and again.redelivered
        assert ch.queue_purge(uid).method.message_count == 1
        assert ch.basic_get(uid) == (None, None, None)
    assert passive(n1, uid) == 0
    with connect(n1) as connection:
        connection.channel().basic_publish("", uid, b"over http")
    request = urllib.request.Request(f"http://127.0.0.1:{n3.mgmt_port}/api/queues/%2F/{uid}/get", method="POST",
                                     data=json.dumps({"count": 5, "ackmode": "ack_requeue_false",
                                                      "encoding": "auto"}).encode(),
                                     headers={"Content-Type": "application/json"})
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert [m["payload"] for m in json.load(reply)] == ["over http"]
    assert passive(n1, uid) == 0


def large_body(size: int) -> bytes:
    """``size`` octets, no two places alike (a counter)."""
    return b"".join(number.to_bytes(8, "big") for number in range(size // 8 + 1))[:size]


def rss(node: BrokerProcess, field: str = "VmRSS", reset: bool = False) -> int:
    """The node's resident memory (``VmHWM``: its peak since it was last ``reset``, which starts it again)."""
    assert node.proc is not None  # (started)
    if reset:
        with open(f"/proc/{node.proc.pid}/clear_refs", "w") as refs:
            refs.write("5")
    with open(f"/proc/{node.proc.pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(f"{field}:"))


def large_bodies_published(n1: BrokerProcess, n2: BrokerProcess, queue: str, arguments: dict[str, Any],
                           count: int) -> list[bytes]:
    """``count`` persistent messages of 16 MiB, 16 MiB + 1... octets published with confirms to a durable queue of
    node 1 (declared with ``arguments``), once node 2 reports them all: their bodies."""
    expected = [large_body((16 << 20) + number) for number in range(count)]
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(queue, durable=True, arguments=arguments)
        ch.confirm_delivery()
        for data in expected:
            ch.basic_publish("", queue, data, pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: passive(n2, queue) == count, "the queue's count reported on node 2")
    return expected


def taken_through(n1: BrokerProcess, n2: BrokerProcess, connection: pika.BlockingConnection, queue: str, count: int,
                  arguments: dict[str, Any] | None = None) -> tuple[BlockingChannel, list[bytes], int, int]:
    """A consumer on node 2 (``connection``; ``arguments``: its consume's) with prefetch 100 takes ``count``
    messages of node 1's ``queue``, acking none: its channel, their bodies, how much more node 1 held at its peak
    meanwhile and how much more node 2 holds then."""
    before = rss(n1, "VmHWM", reset=True)
    at_rest = rss(n2)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[bytes] = []
    ch.basic_consume(queue, lambda _ch, _method, _properties, data: got.append(data), arguments=arguments)
    pump(connection, lambda: len(got) == count, timeout=60)
    return ch, got, rss(n1, "VmHWM") - before, rss(n2) - at_rest


@pytest.mark.parametrize("arguments", [{}, {"x-queue-type": "quorum"}], ids=["classic", "quorum"])
def test_large_stored_bodies_taken_through_another_node_are_not_held_by_their_queue_s_node(cluster, uid, arguments):
    """12 persistent 16 MiB messages (192 MiB) of a durable queue of node 1 (a quorum queue's leader), all held
    unacked by a consumer on node 2, then a basic.get there: node 1 sends each body over the link from its store's
    file and holds none for its ack, nor does node 2 once sent (the ack goes to node 1 by its tag); each arrives
    byte-exact, redelivered too.  Nor does node 1 hold them while they wait (a quorum queue's op log keeps what it
    shipped, up to 64 MiB)."""
    _, (n1, n2, _) = cluster
    count = 12
    idle = rss(n1)
    expected = large_bodies_published(n1, n2, uid, arguments, count)
    waiting = rss(n1) - idle
    with connect(n2) as connection:
        ch, got, held, passed_on = taken_through(n1, n2, connection, uid, count)
        ch.close()  # (all requeued)
        ch = connection.channel()
        again: list[bytes | None] = []
        for _ in range(2):
            method, _, got_again = ch.basic_get(uid)
            assert method is not None and method.redelivered
            again.append(got_again)
            ch.basic_ack(delivery_tag(method))
        ch.queue_delete(uid)
    assert [data == want for data, want in zip(got, expected)] == [True] * count
    assert again == expected[:2]
    log = 64 * 1024 * 1024 if arguments else 0  # (a quorum leader's op log: what it shipped, ``oplog.LOG_BYTES``)
    assert waiting < 128 * 1024 * 1024 + log, f"node 1 holds {waiting >> 20} MiB more for them to be taken"
    assert held < 128 * 1024 * 1024, f"node 1 held {held >> 20} MiB more"
    assert passed_on < 128 * 1024 * 1024, f"node 2 holds {passed_on >> 20} MiB more"


def test_a_stream_s_large_bodies_read_through_another_node_are_held_by_neither_node(cluster, uid):
    """12 16 MiB messages (192 MiB) of a stream of node 1, read from its first offset by a consumer on node 2 that
    acks none until it holds them all: node 1 sends each body over the link from the stream's segment file
    (``StreamQueue.logged_body``, as a stored body from the store's), and node 2 holds none once passed on; each
    arrives byte-exact."""
    _, (n1, n2, _) = cluster
    count = 12
    expected = large_bodies_published(n1, n2, uid, {"x-queue-type": "stream"}, count)
    with connect(n2) as connection:
        ch, got, held, passed_on = taken_through(n1, n2, connection, uid, count, {"x-stream-offset": "first"})
        ch.queue_delete(uid)
    assert [data == want for data, want in zip(got, expected)] == [True] * count
    assert held < 96 * 1024 * 1024, f"node 1 held {held >> 20} MiB more"
    assert passed_on < 96 * 1024 * 1024, f"node 2 holds {passed_on >> 20} MiB more"


def test_a_consumer_on_another_node_that_does_not_read_makes_its_node_hold_a_few_large_bodies(cluster, uid):
    """20 persistent 16 MiB messages (320 MiB) of node 1's queue, consumed on node 2 with no prefetch limit by a
    client that reads nothing: node 1 sends that consumer's node no more bodies than ``BYTE_WINDOW`` (and one)
    beyond what it passed on, so node 2 holds what its client's socket buffers and a body or two, and the rest
    stays ready on node 1; they are all there again once the client goes."""
    _, (n1, n2, _) = cluster
    count, size = 20, 16 * 1024 * 1024
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid, durable=True)
        ch.confirm_delivery()
        for number in range(count):
            ch.basic_publish("", uid, large_body(size + number), pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: passive(n2, uid) == count, "owner's count reported on node 2")
    before = rss(n2, "VmHWM", reset=True)
    raw = stalled_consumer(n2, uid)
    try:
        time.sleep(3)  # (before: every body reached node 2 within this)
        held = rss(n2, "VmHWM") - before
        ready = passive(n1, uid)
    finally:
        raw.close()
    wait_for(lambda: passive(n1, uid) == count, "every message ready again")
    assert ready >= count - 4, f"{count - ready} of {count} bodies sent to a node whose client reads none"
    assert held < 96 * 1024 * 1024, f"node 2 held {held >> 20} MiB more"


def test_declare_ok_through_another_node_has_the_queue_s_figures_now(cluster, uid):
    """queue.declare-ok (passive or not) through node 2 for node 1's queue carries node 1's figures at that moment,
    as RabbitMQ's channel asks the queue's process: its consumers wherever they are (node 1's included) and the
    messages published a moment before, not node 2's own consumers and node 1's report of up to a second ago."""
    _, (n1, n2, _) = cluster
    with connect(n1) as c1, connect(n2) as c2:
        declaring = c1.channel()
        declaring.queue_declare(uid, durable=True)
        wait_for(lambda: passive(n2, uid) == 0, "the queue known on node 2")
        holding = c1.channel()
        holding.basic_qos(prefetch_count=1)
        holding.basic_consume(uid, lambda *_: None)  # takes one, acks none
        declaring.confirm_delivery()
        asking = c2.channel()
        figures = []
        for count in (3, 4, 5):
            for _ in range(count):
                declaring.basic_publish("", uid, b"m")
            figures.append((asking.queue_declare(uid, passive=True).method.message_count,
                            asking.queue_declare(uid, durable=True).method.consumer_count))
            declaring.queue_purge(uid)
        declaring.queue_delete(uid)
    assert figures == [(2, 1), (4, 1), (5, 1)]  # (node 1's consumer holds the first, unacked, through the purges)


def test_an_auto_delete_queue_goes_with_its_last_consumer_whichever_node_that_is_on(cluster, uid):
    """rabbit_amqqueue_process (should_auto_delete, is_unused): an auto-delete queue goes once its last consumer is
    cancelled, counting every consumer.  Node 2's consumer leaving while node 1's (the owner's) stays leaves the
    queue (node 2 deleted it for every node, counting its own consumers alone); node 1's leaving while node 2's
    stays leaves it too; node 2's, the last, leaving deletes it everywhere."""
    _, (n1, n2, _) = cluster
    owner_side, remote = connect(n1), None
    try:
        near = owner_side.channel()
        near.queue_declare(uid, auto_delete=True)
        near_tag = near.basic_consume(uid, lambda *_: None)
        wait_for(lambda: passive(n2, uid) == 0, "the queue known on node 2")
        remote = connect(n2)
        far = remote.channel()
        far.basic_cancel(far.basic_consume(uid, lambda *_: None))
        remote.process_data_events(time_limit=0.5)
        assert passive(n1, uid) == 0 and passive(n2, uid) == 0  # node 1's consumer stays
        far_tag = far.basic_consume(uid, lambda *_: None)
        near.basic_cancel(near_tag)
        owner_side.process_data_events(time_limit=0.5)
        assert passive(n1, uid) == 0 and passive(n2, uid) == 0  # node 2's consumer stays
        far.basic_cancel(far_tag)
        wait_for(lambda: gone(n1, uid) and gone(n2, uid), "the queue gone with its last consumer, node 2's")
    finally:
        for connection in (remote, owner_side):
            if connection is not None and connection.is_open:
                connection.close()


def test_delete_if_unused_through_another_node_is_refused_while_the_queue_has_a_consumer_on_its_node(cluster, uid):
    """rabbit_channel: queue.delete if-unused of a queue with a consumer is 406 "in use", as the queue's process
    decides ({delete, IfUnused, IfEmpty, _}), counting every node's consumers, whichever node the client is on;
    the HTTP API's ?if-unused=true too.  Without the consumer it is deleted everywhere."""
    _, (n1, n2, n3) = cluster
    owner_side = connect(n1)
    try:
        channel = owner_side.channel()
        channel.queue_declare(uid)
        tag = channel.basic_consume(uid, lambda *_: None)
        wait_for(lambda: passive(n2, uid) == 0 and passive(n3, uid) == 0, "the queue known on nodes 2 and 3")
        with connect(n2) as connection:
            with pytest.raises(ChannelClosedByBroker) as info:
                connection.channel().queue_delete(uid, if_unused=True)
        assert (info.value.reply_code, info.value.reply_text) == (
            406, f"PRECONDITION_FAILED - queue '{uid}' in vhost '/' in use")
        with pytest.raises(urllib.error.HTTPError) as refused:
            api_put(n3, f"/queues/%2F/{uid}?if-unused=true", None, method="DELETE")
        assert refused.value.code == 400
        assert passive(n1, uid) == 0 and passive(n2, uid) == 0
        channel.basic_cancel(tag)
        with connect(n2) as connection:
            assert connection.channel().queue_delete(uid, if_unused=True).method.message_count == 0
        assert gone(n1, uid) and gone(n2, uid) and gone(n3, uid)  # as soon as it was answered
    finally:
        owner_side.close()


def test_delete_if_empty_through_another_node_is_refused_for_a_queue_just_published_to(cluster, uid):
    """rabbit_channel: queue.delete if-empty of a queue holding messages is 406 "not empty", as the queue's
    process counts them then, not as another node last heard (every second)."""
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid)
    wait_for(lambda: passive(n2, uid) == 0, "the queue known on node 2")  # (node 2's count of it: 0)
    with connect(n1) as publisher, connect(n2) as deleter:
        channel = publisher.channel()
        channel.confirm_delivery()
        for i in range(3):
            channel.basic_publish("", uid, f"m{i}".encode())  # confirmed: in the queue
        with pytest.raises(ChannelClosedByBroker) as info:
            deleter.channel().queue_delete(uid, if_empty=True)
        assert (info.value.reply_code, info.value.reply_text) == (
            406, f"PRECONDITION_FAILED - queue '{uid}' in vhost '/' not empty")
    assert passive(n1, uid) == 3


def test_delete_ok_through_another_node_counts_the_messages_the_queue_had(cluster, uid):
    """queue.delete-ok's message-count is what the queue held when it was deleted (rabbit_amqqueue_process: the
    backing queue's length as it stops), not another node's last report of it."""
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid)
    wait_for(lambda: passive(n2, uid) == 0, "the queue known on node 2")
    with connect(n1) as publisher, connect(n2) as deleter:
        channel = publisher.channel()
        channel.confirm_delivery()
        for i in range(3):
            channel.basic_publish("", uid, f"m{i}".encode())
        assert deleter.channel().queue_delete(uid).method.message_count == 3
    assert gone(n1, uid)


def test_a_stream_through_another_node(cluster, uid):
    """A stream lives on its owner; another node's clients publish and read it at the offsets they name."""
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
    wait_for(lambda: passive(n2, uid) == 0, "the stream known on node 2")
    publish_confirmed(n2, uid, 3)

    def read(offset) -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []
        with connect(n2) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=10)

            def on_message(ch: BlockingChannel, method: Basic.Deliver, properties: pika.BasicProperties,
                           body: bytes) -> None:
                got.append((headers_of(properties)["x-stream-offset"], body))
                ch.basic_ack(delivery_tag(method))

            channel.basic_consume(uid, on_message, arguments={"x-stream-offset": offset})
            pump(connection, lambda: len(got) >= 3 - min(offset if isinstance(offset, int) else 0, 3))
        return got

    everything = [(0, b"0"), (1, b"1"), (2, b"2")]
    assert read("first") == everything
    assert read(1) == everything[1:]
    assert read(datetime.datetime.now() - datetime.timedelta(minutes=1)) == everything
    with connect(n2) as connection:  # a table that looks like the link's own encoding is only a table
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(uid, lambda *_: None, arguments={"x-stream-offset": "first",
                                                              "x-any": {"$timestamp": "not a time"}})
        connection.process_data_events(0.2)
    assert read("first") == everything  # and the link to the owner carries on
    with connect(n2) as connection:
        with pytest.raises(ChannelClosedByBroker) as caught:
            connection.channel().basic_consume(uid, lambda *_: None)
    assert caught.value.reply_text == \
        f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{uid}' in vhost '/''"


def test_http_purge_through_another_node(cluster, uid):
    """DELETE /api/queues/.../contents on a node that does not own the queue purges the owner's messages."""
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid)
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", uid, f"m{i}".encode())
    wait_for(lambda: passive(n2, uid) == 100, "owner's count reported on node 2")
    api_put(n2, f"/queues/%2F/{uid}/contents", None, method="DELETE")
    assert passive(n1, uid) == 0


def test_offsets_records_and_commit_through_another_node(cluster, uid):
    """The Spark bridge's endpoints and peek answer on any node: a queue of another node's is read there."""
    import pyarrow as pa

    _, (n1, n2, n3) = cluster
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid, durable=True)
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", uid, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: passive(n2, uid) == 100, "owner's count reported on node 2")
    offsets = api(n2, f"/queues/%2F/{uid}/offsets")
    assert (offsets["messages"], offsets["tail"] - offsets["head"]) == (100, 100)
    request = urllib.request.Request(f"http://127.0.0.1:{n3.mgmt_port}/api/queues/%2F/{uid}/records?limit=60")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.headers["Content-Type"] == "application/vnd.apache.arrow.stream"
        table = pa.ipc.open_stream(reply.read()).read_all()
    assert [bytes(b) for b in table.column("body").to_pylist()] == [f"m{i}".encode() for i in range(60)]
    commit = urllib.request.Request(f"http://127.0.0.1:{n2.mgmt_port}/api/queues/%2F/{uid}/commit", method="POST",
                                    data=json.dumps({"offset": table.column("offset")[-1].as_py() + 1}).encode(),
                                    headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=",
                                             "Content-Type": "application/json"})
    with urllib.request.urlopen(commit, timeout=10) as reply:
        assert json.load(reply)["removed"] == 60
    assert passive(n1, uid) == 40
    peeked = api(n3, f"/queues/%2F/{uid}/peek?count=2")
    assert [(m["payload"], m["position"]) for m in peeked] == [("m60", 0), ("m61", 1)]
    with pytest.raises(urllib.error.HTTPError) as refused:  # the caller's credentials go along
        request = urllib.request.Request(f"http://127.0.0.1:{n3.mgmt_port}/api/queues/%2F/{uid}/offsets")
        request.add_header("Authorization", "Basic Z3Vlc3Q6d3Jvbmc=")
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401


def api_put(node: BrokerProcess, path: str, body: dict | None, method: str = "PUT") -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{node.mgmt_port}/api{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    urllib.request.urlopen(request, timeout=5).close()


def test_users_vhosts_and_permissions_are_the_clusters(cluster, uid):
    _, (n1, n2, n3) = cluster
    user, vhost = f"u-{uid}", f"v-{uid}"
    api_put(n1, f"/vhosts/{vhost}", {})
    api_put(n1, f"/users/{user}", {"password": "secret", "tags": ""})
    api_put(n1, f"/permissions/{vhost}/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
    api_put(n1, f"/topic-permissions/{vhost}/{user}", {"exchange": "amq.topic", "write": "^ok", "read": ".*"})
    params = pika.ConnectionParameters("127.0.0.1", n2.port, vhost, pika.PlainCredentials(user, "secret"))

    def declare_on_node2() -> bool:
        with pika.BlockingConnection(params) as connection:
            connection.channel().queue_declare("in-" + vhost)
            connection.channel().exchange_declare("x-" + vhost, "fanout", durable=True)
            channel = connection.channel()
            channel.confirm_delivery()
            try:
                channel.basic_publish("amq.topic", "refused", b"")
            except pika.exceptions.ChannelClosedByBroker as exc:
                return exc.reply_code == 403
        return False

    wait_for(declare_on_node2, "user, vhost, permissions and topic permissions usable on node 2")
    api_put(n1, f"/global-parameters/{user}", {"value": {"a": 1}})
    api_put(n1, f"/vhost-limits/{vhost}/max-queues", {"value": 5})
    api_put(n1, f"/user-limits/{user}/max-channels", {"value": 4})
    wait_for(lambda: api(n3, f"/vhost-limits/{vhost}") == [{"vhost": vhost, "value": {"max-queues": 5}}]
             and api(n3, f"/users/{user}")["limits"] == {"max-channels": 4}
             and api(n3, f"/global-parameters/{user}")["value"] == {"a": 1}, "limits and parameters on node 3")
    wait_for(lambda: api(n3, f"/queues/{vhost}/in-{vhost}")["node"] == "warren2@localhost", "queue seen on node 3")
    api_put(n3, f"/users/{user}", None, method="DELETE")
    wait_for(lambda: not any(u["name"] == user for u in api(n1, "/users")), "user deleted everywhere")
    wait_for(lambda: not any(p["user"] == user for p in api(n2, "/topic-permissions")), "with its topic permissions")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n1.port, vhost,
                                                          pika.PlainCredentials(user, "secret")))
    wait_for(lambda: any(x["name"] == "x-" + vhost for x in api(n1, f"/exchanges/{vhost}")), "exchange on node 1")
    api_put(n1, f"/vhosts/{vhost}", None, method="DELETE")
    for node in (n2, n3):
        wait_for(lambda node=node: all(v["name"] != vhost for v in api(node, "/vhosts")), "vhost deleted everywhere")


def publish_confirmed(node: BrokerProcess, queue: str, count: int) -> None:
    with connect(node) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for i in range(count):
            channel.basic_publish("", queue, str(i).encode())


def test_policies_are_the_clusters(cluster, uid):
    """Set on node 1, shown on every node and enforced by the queue's owner (node 2); cleared on node 3."""
    _, (n1, n2, n3) = cluster
    api_put(n1, f"/policies/%2F/{uid}", {"pattern": f"^{uid}", "definition": {"max-length": 2}, "apply-to": "queues"})
    api_put(n1, f"/operator-policies/%2F/{uid}-op", {"pattern": f"^{uid}", "definition": {"message-ttl": 60000}})
    with connect(n2) as connection:
        connection.channel().queue_declare(uid, durable=True)
    effective = {"max-length": 2, "message-ttl": 60000}
    for node in (n1, n2, n3):
        wait_for(lambda node=node: api(node, f"/queues/%2F/{uid}")["effective_policy_definition"] == effective,
                 f"policies applied on {node.port}")
    assert api(n3, f"/queues/%2F/{uid}")["policy"] == uid
    publish_confirmed(n3, uid, 5)
    assert passive(n2, uid) == 2  # the owner kept max-length 2
    api_put(n3, f"/policies/%2F/{uid}", None, method="DELETE")
    for node in (n1, n2):
        wait_for(lambda node=node: api(node, f"/queues/%2F/{uid}")["effective_policy_definition"]
                 == {"message-ttl": 60000}, f"policy cleared on {node.port}")
        assert all(p["name"] != uid for p in api(node, "/policies"))
    publish_confirmed(n1, uid, 3)
    assert passive(n2, uid) == 5  # no max-length once cleared
    api_put(n2, f"/operator-policies/%2F/{uid}-op", None, method="DELETE")
    wait_for(lambda: api(n1, f"/queues/%2F/{uid}")["effective_policy_definition"] == {}, "operator policy cleared")


def test_exclusive_consumer_is_refused_across_nodes(cluster, uid):
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid)
    wait_for(lambda: passive(n2, uid) == 0, "queue on node 2")
    owner_side = connect(n1)
    owner_side.channel().basic_consume(uid, lambda *a: None, exclusive=True)
    with connect(n2) as connection:
        with pytest.raises(ChannelClosedByBroker) as info:
            connection.channel().basic_consume(uid, lambda *a: None)
            connection.process_data_events(time_limit=1)
        assert info.value.reply_code == 403
        assert info.value.reply_text == f"ACCESS_REFUSED - queue '{uid}' in vhost '/' in exclusive use"
    owner_side.close()


def test_publish_through_another_node_reaches_an_exclusive_queue(cluster, uid):
    """An exclusive queue is in RabbitMQ's cluster-wide metadata (only its *use* is locked to its connection):
    any connection on any node may publish to it, and its messages are routed there, not confirmed and dropped
    (the RPC pattern: a client's exclusive reply queue on node 1, its server on node 2)."""
    _, (n1, n2, _) = cluster
    owner = connect(n1)
    och = owner.channel()
    och.queue_declare(uid, exclusive=True)
    try:
        with connect(n2) as connection:
            ch = connection.channel()
            ch.confirm_delivery()
            ch.basic_publish("", uid, b"to an exclusive queue", mandatory=True)  # unroutable: UnroutableError
        _, _, body = och.basic_get(uid, auto_ack=True)
        assert body == b"to an exclusive queue"
    finally:
        owner.close()


def test_a_server_named_exclusive_queue_is_bound_and_reached_through_another_node(cluster, uid):
    """amq.gen-… declared exclusive on node 1 and bound to an exchange: a publish to that exchange through node 2
    reaches it at once (the binding is the cluster's, as the queue is), as with a subscriber's queue in RabbitMQ."""
    _, (n1, n2, _) = cluster
    owner = connect(n1)
    och = owner.channel()
    name = och.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")
    och.exchange_declare(uid, "topic")
    och.queue_bind(name, uid, "k.#")
    try:
        with connect(n2) as connection:
            ch = connection.channel()
            ch.confirm_delivery()
            ch.basic_publish("", name, b"direct", mandatory=True)
            ch.basic_publish(uid, "k.1", b"bound", mandatory=True)
        assert [och.basic_get(name, auto_ack=True)[2] for _ in range(2)] == [b"direct", b"bound"]
    finally:
        owner.close()


def test_another_node_s_connection_is_locked_out_of_an_exclusive_queue(cluster, uid):
    """rabbit_amqqueue:check_exclusive_access: declaring (passive or not), consuming, getting, purging, deleting
    or binding another connection's exclusive queue from any node is 405 RESOURCE_LOCKED, not a second queue of
    the same name; publishing to it is not locked."""
    _, (n1, n2, _) = cluster
    uid = f"locked-{uid[-6:]}"  # (the whole text fits a reply's 255 characters)
    owner = connect(n1)
    owner.channel().queue_declare(uid, exclusive=True)
    locked = (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{uid}' in vhost '/'. It could be "
              "originally declared on another connection or the exclusive property value does not match that of "
              "the original declaration.")
    try:
        with connect(n2) as connection:
            for use in (lambda ch: ch.queue_declare(uid, passive=True),
                        lambda ch: ch.queue_declare(uid, exclusive=True), lambda ch: ch.queue_declare(uid),
                        lambda ch: ch.basic_consume(uid, lambda *a: None), lambda ch: ch.basic_get(uid),
                        lambda ch: ch.queue_purge(uid), lambda ch: ch.queue_delete(uid),
                        lambda ch: ch.queue_bind(uid, "amq.fanout")):
                with pytest.raises(ChannelClosedByBroker) as info:
                    use(connection.channel())
                assert (info.value.reply_code, info.value.reply_text) == (405, locked)
        assert api(n2, f"/queues/%2F/{uid}")["exclusive"] is True
    finally:
        owner.close()


def test_an_exclusive_queue_goes_from_every_node_with_its_connection(cluster, uid):
    """The owner's connection closes: the queue is deleted cluster-wide, with its bindings (rabbit_amqqueue's
    delete_exclusive), and the name is free for another node's connection."""
    _, (n1, n2, n3) = cluster
    owner = connect(n1)
    och = owner.channel()
    och.queue_declare(uid, exclusive=True)
    och.queue_bind(uid, "amq.fanout", uid)
    bound = lambda node: [b for b in api(node, "/exchanges/%2F/amq.fanout/bindings/source") if b["destination"] == uid]  # noqa: E731
    assert bound(n3)
    owner.close()
    for node in (n2, n3):
        wait_for(lambda node=node: gone(node, uid), f"the queue gone from node {node.port}")
        assert bound(node) == []
    with connect(n2) as connection:
        connection.channel().queue_declare(uid, exclusive=True)  # (node 2's now, while this connection lasts)


def test_concurrent_conflicting_declares_resolve_to_one_definition(cluster, uid):
    _, (n1, n2, n3) = cluster
    winner = race([(n1, lambda ch: ch.queue_declare(uid, durable=True, arguments={"x-message-ttl": 1000}), 1000),
                   (n2, lambda ch: ch.queue_declare(uid, durable=True, arguments={"x-message-ttl": 2000}), 2000)])
    for node in (n1, n2, n3):
        wait_for(lambda node=node: api(node, f"/queues/%2F/{uid}")["arguments"] == {"x-message-ttl": winner},
                 f"one definition on {node.port}")
    kind = race([(n2, lambda ch: ch.exchange_declare(uid, "topic", durable=True), "topic"),
                 (n3, lambda ch: ch.exchange_declare(uid, "fanout", durable=True), "fanout")])
    for node in (n1, n2, n3):
        wait_for(lambda node=node: api(node, f"/exchanges/%2F/{uid}")["type"] == kind, f"one exchange on {node.port}")


def race(declarations: list[tuple[BrokerProcess, Callable, object]]) -> object:
    """Run the declarations at once on their nodes: exactly one succeeds, the other gets 406; the winner's label."""
    results: dict[object, object] = {}

    def declare(node: BrokerProcess, declaration: Callable, label: object) -> None:
        try:
            with connect(node) as connection:
                declaration(connection.channel())
            results[label] = "ok"
        except ChannelClosedByBroker as exc:
            results[label] = exc.reply_code

    threads = [threading.Thread(target=declare, args=item) for item in declarations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results.values(), key=str) == [406, "ok"], results
    return next(label for label, result in results.items() if result == "ok")


def test_node_down_then_back(cluster, tmp_path_factory, uid):
    etcd, nodes = cluster
    n1, n2, n3 = nodes
    with connect(n3) as connection:
        connection.channel().queue_declare(uid, durable=True)
        connection.channel().queue_declare(uid + "-transient")
    wait_for(lambda: passive(n1, uid) == 0, "queue of node 3 visible on node 1")
    with connect(n1) as connection:  # confirmed only once node 3 has them on disk
        ch = connection.channel()
        ch.confirm_delivery()
        for i in range(20):
            ch.basic_publish("", uid, f"p{i}".encode(), pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: passive(n1, uid) == 20, "count reported")
    connection = connect(n1)
    ch = connection.channel()
    ch.basic_qos(prefetch_count=1)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume(uid, lambda c, m, p, b: None)
    connection.process_data_events(time_limit=0.5)
    n3.kill()  # kill -9: one message unacked on node 1's consumer, all 20 on node 3's disk
    pump(connection, lambda: bool(cancelled), 10)
    assert cancelled, "consumer on node 1 got no basic.cancel when the owner died"
    with pytest.raises(ChannelClosedByBroker) as info:
        connection.channel().queue_declare(uid, passive=True)
    assert info.value.reply_code == 404
    assert "home node 'warren3@localhost' of durable queue" in info.value.reply_text
    assert "is down or inaccessible" in info.value.reply_text
    assert api(n2, f"/queues/%2F/{uid}")["state"] == "down"
    pch = connection.channel()
    pch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        pch.basic_publish("", uid, b"nowhere", mandatory=True)
    connection.close()
    nodes[2] = start_node(n3.data_dir.parent, etcd, 3, port=n3.port, link_port=n3.link_port)
    wait_for(lambda: passive(n1, uid) == 20, "durable messages back after restart", timeout=20)
    wait_for(lambda: gone(n1, uid + "-transient"), "the restarted node's transient queue deleted everywhere")
    with connect(n2) as connection:
        ch = connection.channel()
        bodies = []
        for method, _, body in ch.consume(uid, inactivity_timeout=10):
            assert method is not None and body is not None
            bodies.append(body.decode())
            ch.basic_ack(delivery_tag(method))
            if len(bodies) == 20:
                break
        assert bodies == [f"p{i}" for i in range(20)]


def test_a_killed_node_s_transient_queues_are_deleted_everywhere_once_it_is_down(cluster, uid):
    """Node 3 is killed with its connection's exclusive queue, a transient queue bound to an exchange and a durable
    queue: once etcd no longer hears it (``NODE_TTL``), the transient and exclusive ones are deleted on every node,
    with their bindings and an auto-delete exchange left without any, and another client may declare the exclusive
    one's name; the durable one stays, down, as
    RabbitMQ's rabbit_amqqueue:on_node_down deletes a down node's queues that are not replicated from
    ``rabbit_queue`` (a durable one's record stays in ``rabbit_durable_queue``).  The node's restart deletes
    nothing of the new owner's."""
    etcd, nodes = cluster
    n1, n2, n3 = nodes
    exclusive, transient, durable, exchange = uid + "-x", uid + "-t", uid + "-d", uid + "-ad"
    owner = connect(n3)
    och = owner.channel()
    och.queue_declare(exclusive, exclusive=True)
    och.queue_declare(transient)
    och.queue_bind(transient, "amq.fanout")
    och.exchange_declare(exchange, "fanout", auto_delete=True)  # (bound to the transient queue alone)
    och.queue_bind(transient, exchange)
    och.queue_declare(durable, durable=True)
    assert api(n1, f"/queues/%2F/{exclusive}")["node"] == "warren3@localhost"
    n3.kill()
    wait_for(lambda: api(n1, f"/queues/%2F/{exclusive}")["state"] == "down", "the queue down on node 1")
    for node in (n1, n2):
        for name in (exclusive, transient):
            wait_for(lambda node=node, name=name: gone(node, name), f"{name} gone from node {node.port}", timeout=40)
        assert not any(b["destination"] == transient for b in api(node, "/bindings"))
        assert exchange not in [x["name"] for x in api(node, "/exchanges")]
        assert api(node, f"/queues/%2F/{durable}")["state"] == "down"
        with pytest.raises(ChannelClosedByBroker) as info:
            passive(node, durable)
        assert info.value.reply_code == 404 and "is down or inaccessible" in info.value.reply_text
    taker = connect(n1)
    taker.channel().queue_declare(exclusive, exclusive=True)
    nodes[2] = start_node(n3.data_dir.parent, etcd, 3, port=n3.port, link_port=n3.link_port)
    wait_for(lambda: passive(nodes[2], durable) == 0, "the durable queue back with node 3", timeout=20)
    assert api(nodes[2], f"/queues/%2F/{exclusive}")["node"] == "warren1@localhost"
    assert gone(nodes[2], transient)  # (etcd has none of them: node 3's own view, which had them, follows)
    assert not any(b["destination"] == transient for b in api(nodes[2], "/bindings"))
    assert exchange not in [x["name"] for x in api(nodes[2], "/exchanges")]
    taker.close()


def test_an_exclusive_queue_of_a_killed_node_is_deleted_everywhere_when_it_restarts(cluster, uid):
    """Node 3 is killed with its connection's exclusive queue and started again at once, before etcd takes it for
    down: the queue is down meanwhile, and deleted cluster-wide as node 3 starts (its record names node 3's
    earlier run); its connection cannot come back to it."""
    etcd, nodes = cluster
    n1, _, n3 = nodes
    owner = connect(n3)
    owner.channel().queue_declare(uid, exclusive=True)
    assert api(n1, f"/queues/%2F/{uid}")["node"] == "warren3@localhost"
    n3.kill()
    wait_for(lambda: api(n1, f"/queues/%2F/{uid}")["state"] == "down", "the queue down on node 1")
    nodes[2] = start_node(n3.data_dir.parent, etcd, 3, port=n3.port, link_port=n3.link_port)
    for node in (n1, nodes[2]):
        wait_for(lambda node=node: gone(node, uid), f"the exclusive queue gone from node {node.port}", timeout=20)


def test_restarted_node_catches_up_on_missed_definitions(cluster, uid):
    etcd, nodes = cluster
    n1, n2, n3 = nodes
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid + "-gone", durable=True)
    wait_for(lambda: passive(n2, uid + "-gone") == 0, "queue on node 2")
    n2.stop()
    with connect(n1) as connection:
        ch = connection.channel()
        ch.queue_declare(uid + "-new", durable=True)
        ch.queue_bind(uid + "-new", "amq.fanout")
        ch.queue_delete(uid + "-gone")
    api_put(n1, f"/policies/%2F/{uid}", {"pattern": f"^{uid}-new$", "definition": {"max-length": 7}})
    nodes[1] = start_node(n2.data_dir.parent, etcd, 2, port=n2.port, link_port=n2.link_port)
    wait_for(lambda: passive(nodes[1], uid + "-new") == 0, "missed declaration applied")
    with pytest.raises(ChannelClosedByBroker) as info:
        passive(nodes[1], uid + "-gone")
    assert info.value.reply_code == 404
    bindings = api(nodes[1], f"/queues/%2F/{uid}-new/bindings")
    assert any(b["source"] == "amq.fanout" for b in bindings)
    assert api(nodes[1], f"/queues/%2F/{uid}-new")["effective_policy_definition"] == {"max-length": 7}


def test_node_that_stops_answering_is_down_within_seconds(cluster, uid):
    """SIGSTOP: the socket stays open but silent, as with a dead host; heartbeats find it."""
    _, (n1, n2, _) = cluster
    with connect(n2) as connection:
        connection.channel().queue_declare(uid)
    wait_for(lambda: passive(n1, uid) == 0, "queue of node 2 on node 1")
    connection = connect(n1)
    ch = connection.channel()
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume(uid, lambda c, m, p, b: None)
    n2.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        pump(connection, lambda: bool(cancelled), 15)
        assert cancelled, "no basic.cancel after the owner went silent"
        assert time.monotonic() - started < 12
        assert api(n1, f"/queues/%2F/{uid}")["state"] == "down"
    finally:
        n2.proc.send_signal(signal.SIGCONT)
    connection.close()
    wait_for(lambda: passive(n1, uid) == 0, "node 2 back after it answers again", timeout=20)


def test_forget_node_removes_a_stopped_node_and_its_queues(cluster, uid):
    etcd, (n1, n2, n3) = cluster
    n4 = start_node(n1.data_dir.parent, etcd, 4)
    try:
        wait_for(lambda: "warren4@localhost" in running_nodes(n1), "node 4 joined")
        with connect(n4) as connection:
            connection.channel().queue_declare(uid, durable=True)
        wait_for(lambda: passive(n2, uid) == 0, "node 4's queue on node 2")
    finally:
        n4.stop()
    ctl = [sys.executable, "-m", "mgmt_http.warrenctl", "--port", str(n1.mgmt_port)]
    refused = subprocess.run([*ctl, "forget-node", "warren2@localhost"], capture_output=True, text=True,
                             timeout=30, cwd=ROOT)
    assert refused.returncode == 1 and "running" in refused.stderr
    wait_for(lambda: "warren4@localhost" not in running_nodes(n1), "node 4 seen stopped")
    done = subprocess.run([*ctl, "forget-node", "warren4@localhost"], capture_output=True, text=True, timeout=30,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for node in (n2, n3):
        wait_for(lambda node=node: all(n["name"] != "warren4@localhost" for n in api(node, "/nodes")),
                 "node 4 forgotten")
        wait_for(lambda node=node: gone(node, uid), "node 4's queue deleted")


@pytest.mark.cluster
def test_node_starts_without_etcd_and_joins_when_it_comes(tmp_path):
    """etcd down at start: the node serves from its mirror, then registers and links once etcd answers."""
    etcd_port = free_port()
    late = type("LateEtcd", (), {"port": etcd_port})
    n1 = start_node(tmp_path, late, 1)  # type: ignore[arg-type]  # an etcd stand-in that only names a port
    n2 = etcd = None
    try:
        with connect(n1) as connection:
            connection.channel().queue_declare(uid := "local-only", exclusive=True)
        etcd = Etcd(tmp_path / "etcd", port=etcd_port)
        n2 = start_node(tmp_path, etcd, 2)
        wait_for(lambda: len(running_nodes(n1)) == 2 and len(running_nodes(n2)) == 2, "node 1 joined late", 30)
        with connect(n2) as connection:
            connection.channel().queue_declare(uid + "-shared", durable=True)
        assert passive(n1, uid + "-shared") == 0
    finally:
        for node in (n1, n2):
            if node is not None:
                node.stop()
        if etcd is not None:
            etcd.stop()


class Cuttable:
    """A TCP proxy on loopback that can cut every connection through it, and let new ones through again; what the
    target answers reaches the client ``lag`` seconds late (changeable while it runs: a node whose etcd watch lags,
    its connection healthy)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = free_port()
        self.open = True
        self.lag = 0.0
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._sockets += [client, upstream]
            late: queue_module.Queue[tuple[float, bytes]] = queue_module.Queue()
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, late), daemon=True).start()
            threading.Thread(target=self._late, args=(late, client), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket,
              late: queue_module.Queue[tuple[float, bytes]] | None) -> None:
        try:
            while data := source.recv(65536):
                if late is None:
                    sink.sendall(data)
                else:
                    late.put((time.monotonic() + self.lag, data))
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.close()
            except OSError:
                pass

    @staticmethod
    def _late(late: queue_module.Queue[tuple[float, bytes]], sink: socket.socket) -> None:
        while True:
            due, data = late.get()
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                sink.sendall(data)
            except OSError:
                return

    def cut(self) -> None:
        self.open = False
        for s in self._sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._sockets = []

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self._listener.close()


@pytest.mark.cluster
@pytest.mark.parametrize("via", ["bind-ok", "declare-ok", "HTTP API", "AMQP 1.0 management", "exchange.declare-ok"])
def test_a_change_answered_through_one_node_routes_publishes_through_another_whose_watch_lags(tmp_path, via):
    """Node 2 hears etcd a second late.  A queue declared (and bound) through node 1 is answered (declare-ok,
    bind-ok, the HTTP API's 201, AMQP 1.0's management 201) once node 2 has it too, as RabbitMQ answers once every
    node's Mnesia has it: a publish through node 2 right after the answer reaches it (through the binding, or the
    default exchange), where node 2's older view routed it to no queue (confirmed, and dropped).  An exchange's
    declare-ok too: a publish to it through node 2 right after closed the channel with 404 NOT_FOUND."""
    etcd = Etcd(tmp_path / "etcd")
    lagging = Cuttable(etcd.port)
    nodes: list[BrokerProcess] = []
    try:
        nodes.append(start_node(tmp_path, etcd, 1))
        nodes.append(start_node(tmp_path, lagging, 2))
        n1, n2 = nodes
        wait_for(lambda: len(running_nodes(n1)) == 2 and len(running_nodes(n2)) == 2, "nodes see each other", 30)
        lagging.lag = 1.0
        names = [f"lagging-view-{number}" for number in range(3)]
        amqp10 = amqp10_management(n1) if via == "AMQP 1.0 management" else nullcontext()
        with connect(n2) as publisher, connect(n1) as declarer, amqp10 as management:
            publishing = publisher.channel()
            publishing.confirm_delivery()
            declaring = declarer.channel()
            for name in names:
                if via == "HTTP API":
                    api_put(n1, f"/queues/%2F/{name}", {"durable": True})
                elif via == "AMQP 1.0 management":
                    assert management is not None
                    management.declare_queue(amqp10_client().ClassicQueueSpecification(name=name))
                elif via == "exchange.declare-ok":
                    declaring.exchange_declare(name, "fanout", durable=True)
                    publishing.basic_publish(name, "", b"right after the answer")  # 404 NOT_FOUND if not there
                    continue
                else:
                    declaring.queue_declare(name, durable=True)
                if via == "bind-ok":
                    declaring.queue_bind(name, "amq.direct", routing_key=name)
                publishing.basic_publish("amq.direct" if via == "bind-ok" else "", name, b"right after the answer")
        lagging.lag = 0.0
        if via != "exchange.declare-ok":
            assert [passive(n1, name) for name in names] == [1, 1, 1]
    finally:
        for node in nodes:
            node.stop()
        lagging.close()
        etcd.stop()


class Flooder(threading.Thread):
    """A raw publisher sending 256 KiB messages to a queue as fast as the node reads them."""

    def __init__(self, node: BrokerProcess, queue: str) -> None:
        super().__init__(daemon=True)
        from pamqp import body, commands, frame, header
        from test_protocol_errors import Raw
        self.raw = Raw(node)
        self.raw.handshake()
        self.raw.open_channel(1)
        self.port = self.raw.sock.getsockname()[1]
        self.message = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
                        + frame.marshal(header.ContentHeader(0, 1 << 18, commands.Basic.Properties()), 1)
                        + b"".join(frame.marshal(body.ContentBody(b"x" * 65536), 1) for _ in range(4)))
        self.raw.sock.settimeout(None)
        self.start()

    def run(self) -> None:
        try:
            while True:
                self.raw.send(self.message)
        except OSError:  # closed by the test
            pass

    def stop(self) -> None:
        self.raw.sock.shutdown(socket.SHUT_RDWR)
        self.raw.close()
        self.join(5)


def connection_state(node: BrokerProcess, port: int) -> str:
    """The API's state of the connection from ``port``: RabbitMQ's running / flow / blocked / blocking."""
    return next((c["state"] for c in api(node, "/connections") if c["peer_port"] == port), "gone")


def test_link_down_and_back_releases_held_publishers_and_holds_new_ones(cluster, uid):
    """A full link to the owner holds publishers (state flow, as RabbitMQ's credit flow); the link going down
    releases them, and once it is back a full link holds new publishers again."""
    _, (n1, n2, _) = cluster
    with connect(n2) as connection:
        connection.channel().queue_declare(uid)
    wait_for(lambda: passive(n1, uid) == 0, "queue of node 2 on node 1")
    for round_ in ("first", "after the link came back"):
        n2.proc.send_signal(signal.SIGSTOP)
        flooder = Flooder(n1, uid)
        try:
            wait_for(lambda port=flooder.port: connection_state(n1, port) == "flow",
                     f"publisher held by the full link ({round_})")
            wait_for(lambda port=flooder.port: connection_state(n1, port) == "running",
                     "publisher released when the link went down")
        finally:
            n2.proc.send_signal(signal.SIGCONT)
            flooder.stop()
        wait_for(lambda: api(n1, f"/queues/%2F/{uid}")["state"] == "running", "node 2 back", timeout=20)
    with connect(n1) as connection:
        connection.channel().queue_delete(uid)


@pytest.mark.cluster
def test_a_change_is_answered_once_etcd_has_it_and_a_crash_right_after_keeps_it(tmp_path):
    """queue.delete, queue.bind and the HTTP API's DELETE of a queue are answered once etcd has the change, as
    RabbitMQ answers once Mnesia has it: while etcd is frozen nothing is answered (a node killed then would come
    back with the queue etcd still held); once it thaws every answer comes, and a node killed -9 right after
    starts again as it was answered."""
    etcd = Etcd(tmp_path / "etcd")
    node = start_node(tmp_path, etcd, 1)
    try:
        with connect(node) as connection:
            channel = connection.channel()
            for name in ("doomed", "kept", "doomed-over-http"):
                channel.queue_declare(name, durable=True)
        answered: list[str] = []

        def change() -> None:
            with connect(node) as connection:
                channel = connection.channel()
                channel.queue_delete("doomed")
                answered.append("delete")
                channel.queue_bind("kept", "amq.direct", "kept")
                answered.append("bind")

        def delete_over_http() -> None:
            api_put(node, "/queues/%2F/doomed-over-http", None, method="DELETE")
            answered.append("http delete")

        workers = [threading.Thread(target=change), threading.Thread(target=delete_over_http)]
        etcd.proc.send_signal(signal.SIGSTOP)
        try:
            for worker in workers:
                worker.start()
            time.sleep(2)
            assert answered == [], "answered while etcd could not have the change"
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        for worker in workers:
            worker.join(15)
        assert sorted(answered) == ["bind", "delete", "http delete"]
        node.kill()
        node = start_node(tmp_path, etcd, 1, port=node.port, link_port=node.link_port)
        wait_for(lambda: gone(node, "doomed") and gone(node, "doomed-over-http"), "the deleted queues stay gone")
        bound = [b["destination"] for b in api(node, "/exchanges/%2F/amq.direct/bindings/source")]
        assert bound == ["kept"]
    finally:
        node.stop()
        etcd.stop()


def test_amqp10_v1_addresses_declare_as_the_cluster_agrees(cluster, uid):
    """RabbitMQ 3.x's v1 addresses through AMQP 1.0: a ``/queue/:q`` link declares the queue as the cluster agrees,
    so another node has it once the link is attached; an ``/exchange/:x/:key`` source's new queue is bound in
    the cluster, so a message published through a third node reaches the link."""
    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection
    _, (n1, n2, n3) = cluster
    first = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{n1.port}", timeout=10, allowed_mechs="PLAIN")
    second = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{n2.port}", timeout=10, allowed_mechs="PLAIN")
    try:
        first.create_sender(f"/queue/{uid}").send(proton.Message(body="declared through n1"))
        passive(n2, uid)  # there at once: the link was answered once etcd had the queue
        assert passive(n1, uid) == 1
        receiver = second.create_receiver(f"/exchange/amq.direct/{uid}-key")
        with connect(n3) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("amq.direct", f"{uid}-key", b"through n3", mandatory=True)
        assert receiver.receive(timeout=10).body == b"through n3"
        receiver.accept()
    finally:
        first.close()
        second.close()


def test_amqp10_filters_on_a_stream_of_another_node_are_applied_by_its_owner(cluster, uid):
    """An AMQP 1.0 receiver on node 2 of a stream node 1 owns gets exactly the messages its filters take
    (stream filter values, property filters, SQL), as one on node 1 would: node 2 tells the owner the filters."""
    proton = pytest.importorskip("proton")
    from proton.reactor import Filter
    from proton.utils import BlockingConnection
    _, (n1, n2, _) = cluster
    with connect(n1) as connection:
        connection.channel().queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
    wait_for(lambda: passive(n2, uid) == 0, "the stream known on node 2")
    first = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{n1.port}", timeout=10, allowed_mechs="PLAIN")
    second = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{n2.port}", timeout=10, allowed_mechs="PLAIN")

    def described(descriptor: str, value: Any) -> Any:
        return proton.Described(proton.symbol(descriptor), value)

    def read(count: int, **wanted: Any) -> list[Any]:
        options = Filter({proton.symbol("offset"): described("rabbitmq:stream-offset-spec", "first"),
                          **{proton.symbol(name): filter_ for name, filter_ in wanted.items()}})
        receiver = second.create_receiver(f"/queues/{uid}", options=options)
        got: list[Any] = []
        for _ in range(count):
            got.append(receiver.receive(timeout=10).body)
            receiver.accept()
        receiver.close()
        return got

    try:
        sender = first.create_sender(f"/queues/{uid}")
        for i in range(12):
            sender.send(proton.Message(body=f"m{i}", subject=f"s{i % 3}",
                                       properties={"region": "emea" if i % 2 else "us", "x-n": i},
                                       annotations={"x-stream-filter-value": "even" if i % 4 == 0 else "other"}))
        sender.send(proton.Message(body="last", subject="s0", annotations={
            "x-stream-filter-value": "even"}, properties={"region": "emea", "x-n": 0}))
        # (each read ends with the last message published: one the filters should have left out would come before)
        assert read(4, bloom=described("rabbitmq:stream-filter", "even")) == ["m0", "m4", "m8", "last"]
        assert read(5, props=described("amqp:properties-filter", {proton.symbol("subject"): "s0"})) == \
            ["m0", "m3", "m6", "m9", "last"]
        assert read(2, apps=described("amqp:application-properties-filter", {"x-n": 0})) == ["m0", "last"]
        sql = described("amqp:sql-filter", "region = 'emea' AND ([x-n] > 5 OR p.subject = 's0')")
        assert read(5, **{"sql-filter": sql}) == ["m3", "m7", "m9", "m11", "last"]
    finally:
        first.close()
        second.close()


@pytest.mark.cluster
def test_another_node_s_alarm_blocks_this_node_s_publishers(tmp_path):
    """rabbit_alarm: a resource alarm of one node holds the publishers of every node of the cluster (rabbit_reader's
    conserve_resources is told whether any node has the alarm); the cluster's alarm health check names the node,
    the local one passes."""
    etcd = Etcd(tmp_path / "etcd")
    nodes: list[BrokerProcess] = []
    try:
        nodes.append(start_node(tmp_path, etcd, 1))
        nodes.append(start_node(tmp_path, etcd, 2, extra=("--disk-free-limit", str(1 << 62))))
        wait_for(lambda: all(len(running_nodes(n)) == 2 for n in nodes), "nodes see each other", timeout=30)
        n1 = nodes[0]
        wait_for(lambda: call(n1, "GET", "/api/health/checks/alarms").status == 503, "node 2's alarm on node 1")
        assert call(n1, "GET", "/api/health/checks/alarms").json["alarms"] == [
            {"node": "warren2@localhost", "resource": "disk"}]
        assert call(n1, "GET", "/api/health/checks/local-alarms").status == 200
        raw = Raw(n1)
        try:
            raw.handshake(capabilities={"connection.blocked": True})
            raw.open_channel(1)
            raw.send(publish_frames(1, "", "nowhere", b"m"))
            assert raw.expect(commands.Connection.Blocked).reason == "low on disk"
        finally:
            raw.close()
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()


@pytest.mark.cluster
def test_a_change_etcd_never_took_is_undone_when_its_node_starts_again(tmp_path):
    """A bind made while etcd was cut off is applied on its node and waits there to be written (bind-ok waits
    with it); the node is killed before etcd answers again, the write lost with it.  Started again, the node
    undoes what etcd never took, as a Raft member drops entries no majority committed: the binding stayed on that
    node alone for good (a publish through it was routed where no other node's was), and the nodes disagreed."""
    etcd = Etcd(tmp_path / "etcd")
    cut = Cuttable(etcd.port)
    nodes: list[BrokerProcess] = []
    try:
        nodes.append(start_node(tmp_path, etcd, 1))
        nodes.append(start_node(tmp_path, cut, 2))
        n1, n2 = nodes
        wait_for(lambda: len(running_nodes(n1)) == 2 and len(running_nodes(n2)) == 2, "nodes see each other", 30)
        with connect(n2) as connection:
            connection.channel().queue_declare("kept", durable=True)
        cut.cut()
        cut.open = False
        raw = Raw(n2)
        raw.handshake()
        raw.open_channel(1)
        raw.send_method(1, commands.Queue.Bind(queue="kept", exchange="amq.direct", routing_key="never-agreed"))
        wait_for(lambda: any(b["routing_key"] == "never-agreed" for b in api(n2, "/queues/%2F/kept/bindings")),
                 "the binding applied on node 2", 10)
        n2.kill()
        raw.close()
        cut.restore()
        n2.start()
        wait_for(lambda: len(running_nodes(n2)) == 2, "node 2 back", 30)
        time.sleep(2)  # (its full read of etcd done)
        for node in (n1, n2):
            assert [b["routing_key"] for b in api(node, "/queues/%2F/kept/bindings")] == ["kept"], (node is n2)
    finally:
        for node in nodes:
            node.stop()
        cut.close()
        etcd.stop()


def held(etcd: Etcd, key: bytes) -> bool:
    """Whether etcd holds ``key`` now."""
    async def get() -> bool:
        client = aetcd.Client(port=etcd.port, timeout=5)
        try:
            return await client.get(key) is not None
        finally:
            await client.close()
    return asyncio.run(get())


@pytest.mark.cluster
def test_a_node_cut_off_from_etcd_alone_keeps_its_transient_queues(tmp_path):
    """Node 2 reaches etcd through a proxy, cut for longer than its alive key's lease (``NODE_TTL``) while its link
    to node 1 stays up: etcd takes it for down, but node 1 still reaches it, so its exclusive and transient queues
    are deleted nowhere and its connection goes on using them (what a down node's would lose)."""
    etcd = Etcd(tmp_path / "etcd")
    cut = Cuttable(etcd.port)
    nodes: list[BrokerProcess] = []
    try:
        nodes.append(start_node(tmp_path, etcd, 1))
        nodes.append(start_node(tmp_path, cut, 2))
        n1, n2 = nodes
        wait_for(lambda: len(running_nodes(n1)) == 2 and len(running_nodes(n2)) == 2, "nodes see each other", 30)
        owner = connect(n2)
        och = owner.channel()
        och.queue_declare("cut-exclusive", exclusive=True)
        och.queue_declare("cut-transient")
        wait_for(lambda: passive(n1, "cut-transient") == 0, "node 2's queues on node 1")
        cut.cut()
        cut.open = False
        wait_for(lambda: not held(etcd, ALIVE_PREFIX + b"warren2@localhost"), "node 2's alive key gone", NODE_TTL + 10)
        time.sleep(3)  # (node 1 looks at it every second)
        cut.restore()
        for node in (n1, n2):
            assert api(node, "/queues/%2F/cut-exclusive")["node"] == "warren2@localhost"
            assert passive(node, "cut-transient") == 0
        och.basic_publish("", "cut-exclusive", b"still its own")
        assert och.basic_get("cut-exclusive", auto_ack=True)[2] == b"still its own"
        owner.close()
    finally:
        for node in nodes:
            node.stop()
        cut.close()
        etcd.stop()
