"""The stream protocol in cluster mode: two nodes and an etcd, real processes on loopback ports.  A stream lives on
the node that owns it; any node's metadata names that node's stream address as the leader, so rstream publishes
and reads through whichever node it first reached."""
from __future__ import annotations

import asyncio
import struct
import time
from typing import Iterator

import pytest

from conftest import CLUSTER, BrokerProcess, free_port, starts
from test_cluster import Etcd, passive, start_node, wait_for
from test_stream_protocol import Raw, string, wait_for_stream_port

rstream = pytest.importorskip("rstream")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
@starts(CLUSTER)
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    tmp = tmp_path_factory.mktemp("stream-cluster")
    etcd = Etcd(tmp / "etcd")
    started = []
    for index in (1, 2):
        port = free_port()
        node = start_node(tmp, etcd, index, extra=("--stream-enabled", "true", "--stream-port", str(port)))
        node.stream_port = port
        wait_for_stream_port(port)
        started.append(node)
    wait_for(lambda: all(leader(node, "nothing") == (0x02, None) for node in started), "the nodes up")
    yield started
    for node in started:
        node.stop()
    etcd.stop()


def leader(node: BrokerProcess, stream: str) -> tuple[int, int | None]:
    """The metadata's response code for ``stream`` and its leader's stream port (None when it has none)."""
    raw = Raw(node)
    assert raw.login() == 1
    raw.send(struct.pack(">IHH", 4 + 4 + 4 + 2 + len(stream), 0x0F, 1) + struct.pack(">Ii", 3, 1) + string(stream))
    key, rest = raw.receive()
    assert key == 0x800F
    pos = 8  # after the correlation id and the brokers' count
    brokers = {}
    for _ in range(struct.unpack_from(">I", rest, 4)[0]):
        reference, length = struct.unpack_from(">Hh", rest, pos)
        brokers[reference] = struct.unpack_from(">I", rest, pos + 4 + length)[0]
        pos += 8 + length
    (length,) = struct.unpack_from(">h", rest, pos + 4)  # (after the streams' count: the first stream's name)
    code, reference = struct.unpack_from(">HH", rest, pos + 6 + length)
    return code, brokers.get(reference)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_metadata_names_the_node_a_stream_lives_on_and_rstream_goes_there(nodes):
    first, second = nodes
    stream = f"s-{time.monotonic_ns()}"

    async def create() -> None:
        async with rstream.Producer("127.0.0.1", port=first.stream_port, username="guest", password="guest") as p:
            await p.create_stream(stream)
    run(create())
    wait_for(lambda: passive(second, stream) == 0, "the stream known on node 2")
    assert leader(first, stream) == (1, first.stream_port)
    assert leader(second, stream) == (1, first.stream_port)
    raw = Raw(second)
    assert raw.login() == 1
    assert raw.request(0x01, b"\x01" + string("") + string(stream)) == 0x06  # not here: STREAM_NOT_AVAILABLE
    assert raw.request(0x07, b"\x01" + string(stream) + struct.pack(">HHi", 1, 10, 0)) == 0x06

    async def through_the_second() -> list[bytes]:
        async with rstream.Producer("127.0.0.1", port=second.stream_port, username="guest",
                                    password="guest") as producer:
            await producer.send_wait(stream, b"via node 2")
        got: list[bytes] = []
        done = asyncio.Event()
        consumer = rstream.Consumer("127.0.0.1", port=second.stream_port, username="guest", password="guest")
        await consumer.start()

        def on_message(message, context):
            got.append(bytes(message))
            done.set()

        await consumer.subscribe(stream, callback=on_message,
                                 offset_specification=rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST))
        try:
            await asyncio.wait_for(done.wait(), 20)
        finally:
            await consumer.close()
        return got
    assert run(through_the_second()) == [b"via node 2"]


def test_a_stream_created_or_deleted_through_any_node_is_agreed_by_the_cluster(nodes):
    first, second = nodes
    stream = f"s-{time.monotonic_ns()}"
    raw = Raw(second)
    assert raw.login() == 1
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1  # lives on the node it was created on
    assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 0x05  # STREAM_ALREADY_EXISTS
    wait_for(lambda: leader(first, stream) == (1, second.stream_port), "node 1 knows where it lives")
    other = Raw(first)
    assert other.login() == 1
    assert other.request(0x0E, string(stream)) == 1  # deleted through the node that does not own it
    wait_for(lambda: leader(second, stream) == (0x02, None), "gone on node 2 too")


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_stream_created_through_one_node_is_known_to_another_whose_watch_lags_when_create_is_answered(tmp_path):
    """Node 2 hears etcd a second late.  A create answered through node 1 is answered once node 2 has the stream
    too, as the other front ends' declarations are (and as RabbitMQ answers once every node's Mnesia has it): a
    client that goes to node 2 right after finds the stream's leader in its metadata, where node 2's older view
    said the stream did not exist."""
    from test_cluster import Cuttable
    etcd = Etcd(tmp_path / "etcd")
    lagging = Cuttable(etcd.port)
    nodes: list[BrokerProcess] = []
    try:
        for index, view in ((1, etcd), (2, lagging)):
            port = free_port()
            nodes.append(start_node(tmp_path, view, index, extra=("--stream-enabled", "true", "--stream-port",
                                                                 str(port))))
            nodes[-1].stream_port = port
            wait_for_stream_port(port)
        first, second = nodes
        wait_for(lambda: all(leader(node, "nothing") == (0x02, None) for node in nodes), "the nodes up")
        lagging.lag = 1.0
        raw = Raw(first)
        assert raw.login() == 1
        found = []
        for number in range(3):
            stream = f"lagging-{number}"
            assert raw.request(0x0D, string(stream) + struct.pack(">i", 0)) == 1
            found.append(leader(second, stream))
        lagging.lag = 0.0
        assert found == [(1, first.stream_port)] * 3
    finally:
        for node in nodes:
            node.stop()
        lagging.close()
        etcd.stop()
