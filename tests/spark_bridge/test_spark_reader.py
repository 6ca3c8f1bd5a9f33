"""The Spark bridge's side in the broker: the record reader processes that build /records' Arrow batches from a
queue's part on disk (amqp_server.spark_bridge.record_reader), how they write to the client, and how they follow the
queue index while the queue moves.  The SparkSession's side is tests/spark_bridge/test_spark.py."""
from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import struct
import time

import numpy as np
import pika
import pyarrow as pa
import pytest

from amqp_server.broker import Broker
from amqp_server.broker.vhost import VHost
from amqp_server.clock import now_ms
from amqp_server.spark_bridge import arrow_records
from amqp_server.spark_bridge.record_reader import RecordReaders, _gather
from amqp_server.spark_bridge.queue_reads import RecordSource
from amqp_server.spark_bridge.record_stream import _locator
from amqp_server.queues.stream_queue import StreamQueue
from queue_index import QueueIndex

from conftest import connect
from support import call, local, publish_pipelined
from test_paging import WINDOW, bodies, send, settle


def _reader_pids(node) -> list[int]:
    """The node's record reader processes (children running amqp_server.spark_bridge.record_reader)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                    if parent == node.proc.pid and b"spark_bridge.record_reader" in cmdline.read():
                        found.append(int(pid))
            except (OSError, ValueError, IndexError):
                continue
    return found


@pytest.mark.timeout(90)
def test_records_of_the_part_on_disk_come_from_a_reader_process(start_broker):
    """/records builds the batches of a deep queue's part on disk in reader processes: persistent and
    transient messages alike, expired ones left out, properties as published, a batch's records in many
    segments of both stores; a reader killed mid-way is replaced and the read answered all the same."""
    node = start_broker("--queue-window", "16", "--segment-size", "65536")  # a batch spans segments
    expiring = {i for i in range(9000) if i % 100 == 7}
    publish_pipelined(node, "deep", [(b"m%d" % i, pika.BasicProperties(
        delivery_mode=2 if i % 3 else 1, expiration="1" if i in expiring else None, message_id=f"id{i}"))
        for i in range(9000)], declare=True)
    expected = [i for i in range(9000) if i not in expiring]
    time.sleep(0.05)

    def read(**query) -> pa.Table:
        params = "&".join(f"{k}={v}" for k, v in query.items())
        return pa.ipc.open_stream(call(node, "GET", f"/api/queues/%2F/deep/records?{params}").raw).read_all()

    readers: list[int] = []
    for query in ({"batch": 500}, {}):  # then one batch, of both stores' records
        table = read(**query)
        assert table.column("offset").to_pylist() == expected
        assert table.column("body").to_pylist() == [b"m%d" % i for i in expected]
        assert table.column("message_id").to_pylist() == [f"id{i}" for i in expected]
        assert table.column("delivery_mode").to_pylist() == [2 if i % 3 else 1 for i in expected]
        assert readers in ([], _reader_pids(node))  # built by the readers: none failed (the loop would step in)
        readers = _reader_pids(node)
    assert len(readers) == 2
    for pid in readers:
        os.kill(pid, signal.SIGKILL)
    table = read(start=100, end=2900, limit=2000, body="text")
    assert table.column("offset").to_pylist() == [i for i in expected if 100 <= i < 2900][:2000]
    assert table.column("body").to_pylist() == [f"m{i}" for i in expected if 100 <= i < 2900][:2000]
    assert _reader_pids(node)  # replaced


def test_a_readers_gather_copies_every_range_as_sliced():
    """record_reader._gather, the readers' copy of bodies, routes and headers out of the records read: the
    same bytes as slicing row by row, for ranges alike and evenly spaced (split where a run ends), of every
    length, or none."""
    rng = np.random.default_rng(7)
    buffer = rng.integers(0, 256, 100_000, dtype=np.uint8)
    for case in range(300):
        count = int(rng.integers(0, 60))
        if case % 3 == 0:  # one size, a gap where the records' run ends
            starts = np.concatenate((np.arange(count // 2) * 50, 5000 + np.arange(count - count // 2) * 50))
            lengths = np.full(count, 20)
        elif case % 3 == 1:  # every size, uneven gaps
            lengths, gaps = rng.integers(0, 30, count), rng.integers(0, 10, count)
            starts = np.cumsum(np.concatenate(([0], (lengths + gaps)[:-1])))[:count]
        else:
            starts, lengths = np.arange(count) * 64, np.full(count, 64)
        starts = starts.astype(np.int64)
        stops = starts + lengths
        assert _gather(buffer, starts, stops).to_pylist() == [bytes(buffer[a:b]) for a, b in zip(starts, stops)]


def _raw_records(node, path: str, version: str = "1.1", rcvbuf: int | None = None,
                 pause: float = 0.0) -> tuple[bytes, bytes]:
    """GET ``path`` over a raw socket (``rcvbuf``: a small receive buffer; ``pause``: seconds before reading):
    the response's head and its body as sent (chunked or not), read to the end."""
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", node.mgmt_port))
    token = base64.b64encode(b"guest:guest").decode()
    sock.sendall(f"GET {path} HTTP/{version}\r\nHost: x\r\nAuthorization: Basic {token}\r\n"
                 f"Connection: close\r\n\r\n".encode())
    time.sleep(pause)
    data = bytearray()
    while chunk := sock.recv(1 << 16):
        data += chunk
    sock.close()
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    return head, body


def _unchunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body's bytes, checking its framing to the last chunk."""
    out, at = bytearray(), 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end], 16)
        at = line_end + 2
        if size == 0:
            assert body[at:] == b"\r\n", body[at:at + 20]
            return bytes(out)
        out += body[at:at + size]
        assert body[at + size:at + size + 2] == b"\r\n"
        at += size + 2


@pytest.mark.timeout(90)
def test_readers_write_to_the_client_in_any_framing_at_any_speed(start_broker):
    """A reader writes a batch to the client's socket itself: framed as an HTTP/1.1 chunk, or as is for an
    HTTP/1.0 client; a client too slow to take it gets the rest from the loop, the same bytes; a client
    that goes away mid-read changes nothing for the next."""
    node = start_broker("--queue-window", "16")
    bodies = [bytes([i % 251]) * 2048 + b"%d" % i for i in range(2000)]
    publish_pipelined(node, "deep", bodies, declare=True, delivery_mode=2)
    path = "/api/queues/%2F/deep/records?batch=700"

    def rows(stream: bytes) -> list[bytes]:
        return pa.ipc.open_stream(stream).read_all().column("body").to_pylist()

    head, body = _raw_records(node, path)
    assert b"transfer-encoding: chunked" in head.lower()
    assert rows(_unchunk(body)) == bodies
    head, body = _raw_records(node, path, version="1.0")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    assert rows(body) == bodies
    _head, body = _raw_records(node, path, rcvbuf=4096, pause=0.5)  # the socket takes a little of each batch
    assert rows(_unchunk(body)) == bodies

    gone = socket.create_connection(("127.0.0.1", node.mgmt_port))
    gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # close with a reset
    gone.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\r\n")
    assert gone.recv(1024).startswith(b"HTTP/1.1 200")
    gone.close()
    for _ in range(3):
        assert rows(_unchunk(_raw_records(node, path)[1])) == bodies
    assert len(_reader_pids(node)) == 2


async def test_a_reader_whose_request_is_cancelled_is_replaced(tmp_path):
    """A request cancelled while its reader works (its client went away) leaves a reply on the reader's
    socket: that reader is replaced, so the next request gets its own answer, not the stale one."""
    index = QueueIndex(str(tmp_path / "index"), map_size=1 << 24)
    for seq in range(100):
        index.publish(1, seq, 1000 + seq, 0, 10)
    index.commit()
    readers = RecordReaders(1)
    try:
        first = asyncio.ensure_future(readers.walk(index.path, 1, 0, 50, 1 << 20, 1 << 62, 0))
        await asyncio.sleep(0.05)  # sent: the reader is walking or has answered unread
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        walked = await asyncio.wait_for(readers.walk(index.path, 1, 60, 3, 1 << 20, 1 << 62, 0), 30)
        assert walked.seqs.tolist() == [60, 61, 62] and walked.msg_ids.tolist() == [1060, 1061, 1062]
        assert walked.following == 63
    finally:
        readers.close()
        index.close()


def disk_head(queue: RecordSource) -> int:
    """The first seq on disk of a queue the test has paged out."""
    part = queue.disk_part()
    assert part is not None
    return part.first


def stream_of(vhost: VHost, name: str) -> StreamQueue:
    queue = vhost.queue(name)
    assert isinstance(queue, StreamQueue)
    return queue


async def test_a_range_read_goes_on_past_entries_paged_in_during_its_walk(tmp_path):
    """A consumer that takes the head of the disk into memory while a reader walks it: the walked entries now
    in memory are left out of the batch, and the read goes on from where the walk stopped (it used to stop at
    the end of the range, skipping the rest)."""
    broker = Broker(str(tmp_path / "data"), queue_window=WINDOW)
    vhost = broker.vhost("/")
    broker.declare_queue(vhost, "q", durable=True)
    send(broker, vhost, "q", bodies(3000))  # more than a page-in batch (PAGE_IN_BATCH)
    await settle()
    queue = RecordSource(local(vhost.queue("q")))
    head_on_disk = disk_head(queue)
    where = queue.disk_index(head_on_disk)
    assert where is not None
    locate = _locator(queue, head_on_disk)
    readers = RecordReaders(1)

    paged_from: list[int] = []

    def consumer_meanwhile(walked):
        for _ in range(20):  # a consumer takes 20: the window refills from the disk's head
            broker.get_local(vhost, "q", no_ack=True)
        paged_from.append(disk_head(queue))
        return locate(walked)

    try:
        read = await asyncio.wait_for(readers.read(where, 2000, 1 << 20, 3000, now_ms(), consumer_meanwhile, "q",
                                                   arrow_records.Layout()), 30)
        assert head_on_disk < paged_from[0] < head_on_disk + 2000
        batch = pa.ipc.read_record_batch(pa.py_buffer(read.rest), arrow_records.arrow_schema())
        assert batch.column("offset").to_pylist() == list(range(paged_from[0], head_on_disk + 2000))
        assert read.rows == batch.num_rows and read.following == head_on_disk + 2000
    finally:
        readers.close()
        broker.close()


@pytest.mark.timeout(90)
def test_record_batches_of_big_messages_stay_near_eight_mebibytes(start_broker):
    """A batch is 16,384 rows or about 8 MiB of bodies, whichever is less, from memory and from disk alike:
    a queue of big messages must not make a reader (or the loop) build a batch of gigabytes."""
    node = start_broker("--queue-window", "4")
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.queue_declare("big", durable=True)
    channel.confirm_delivery()
    bodies = [bytes([i]) * (1 << 20) for i in range(80)]
    for body in bodies:
        channel.basic_publish("", "big", body, pika.BasicProperties(delivery_mode=2))
    assert call(node, "GET", "/api/queues/%2F/big").json["messages_paged_out"] > 60  # read by reader processes
    for start in (0, 3, 70):
        _head, body = _raw_records(node, f"/api/queues/%2F/big/records?start={start}")
        batches = list(pa.ipc.open_stream(_unchunk(body)))
        assert [row for batch in batches for row in batch.column("body").to_pylist()] == bodies[start:]
        assert all(1 <= batch.num_rows <= 8 for batch in batches), [batch.num_rows for batch in batches]
    connection.close()


async def test_a_reader_follows_the_index_when_it_outgrows_its_map(tmp_path):
    """The broker's queue index grows past the map size a reader process opened it with: the reader adopts
    the new size and answers (it used to fail with MDB_MAP_RESIZED, and be replaced, mid-read)."""
    path = str(tmp_path / "index")
    index = QueueIndex(path, map_size=1 << 20)
    for seq in range(100):
        index.publish(1, seq, 1000 + seq, 0, 10)
    index.commit()
    readers = RecordReaders(1)
    try:
        walked = await asyncio.wait_for(readers.walk(path, 1, 0, 10, 1 << 20, 1 << 62, 0), 30)
        assert walked.seqs.tolist() == list(range(10))
        pid = readers._all[0].proc.pid
        index.close()
        index = QueueIndex(path, map_size=1 << 27)
        for seq in range(100, 300_000):  # over 10 MiB: past the map the reader opened with (py-lmdb's least)
            index.publish(1, seq, 1000 + seq, 0, 10)
        index.commit()
        walked = await asyncio.wait_for(readers.walk(path, 1, 299_990, 20, 1 << 20, 1 << 62, 0), 30)
        assert walked.seqs.tolist() == list(range(299_990, 300_000)) and walked.msg_ids[0] == 300_990
        assert walked.following is None  # the walk reached the last entry
        assert readers._all[0].proc.pid == pid  # the same reader: not failed and replaced
    finally:
        readers.close()
        index.close()


async def test_a_reader_process_reads_a_streams_chunks_from_its_segment_files(tmp_path):
    """A stream's records come to the Spark bridge from its chunks, read and converted in a reader process (what
    an AMQP 0-9-1 consumer of the stream gets): from an offset inside a chunk, below an end, up to a limit; the
    segment files' descriptors are the loop's to close, the records there whatever retention does meanwhile."""
    broker = Broker(str(tmp_path / "data"), queue_window=WINDOW)
    vhost = broker.vhost("/")
    broker.declare_queue(vhost, "s", durable=True, arguments={"x-queue-type": "stream"})
    stream_of(vhost, "s").log.segment_bytes = 30  # (below what a declaration may ask: segments of two chunks)
    for turn in range(10):  # ten chunks of five AMQP publishes (20 bytes of bodies), in segments of two
        send(broker, vhost, "s", [b"a%d-%d" % (turn, i) for i in range(5)], message_id=f"t{turn}", headers={"h": 1})
        await settle()
    stream = stream_of(vhost, "s")
    record = bytes.fromhex("005373c00501a1026964") + bytes.fromhex("005375a003726177")  # over the stream protocol
    stream.append_chunks([(struct.pack(">I", len(record)) + record, 1, 1, len(record), b"")])
    readers = RecordReaders(1)
    layout = arrow_records.Layout.parse("offset,body,routing_key,message_id,headers", False)
    try:
        span = stream.chunk_span(7, 53, 40, 1 << 20)
        assert span.ids.tolist()[0] == 5 and len(span.fds) == 5  # from the chunk holding 7, in five segments
        read = await asyncio.wait_for(readers.read_chunks(span, 40, "s", layout), 30)
        span.close()
        table = pa.ipc.open_stream(layout.schema.serialize().to_pybytes() + bytes(read.rest)).read_all()
        assert (read.rows, read.following) == (40, 47)
        assert table.column("offset").to_pylist() == list(range(7, 47))
        assert table.column("body").to_pylist()[:3] == [b"a1-2", b"a1-3", b"a1-4"]
        assert set(table.column("routing_key").to_pylist()) == {"s"}
        assert table.column("message_id").to_pylist()[:4] == ["t1", "t1", "t1", "t2"]
        assert table.column("headers").to_pylist()[0] == [("h", "1")]
        span = stream.chunk_span(47, 100, 100, 1 << 20)
        read = await asyncio.wait_for(readers.read_chunks(span, 100, "s", layout), 30)
        span.close()
        table = pa.ipc.open_stream(layout.schema.serialize().to_pybytes() + bytes(read.rest)).read_all()
        assert (read.rows, read.following) == (4, 51)
        assert table.column("body").to_pylist()[-1] == b"raw"
        assert table.column("message_id").to_pylist()[-1] == "id"
    finally:
        readers.close()
        broker.close()


@pytest.mark.timeout(90)
def test_records_of_a_stream_come_from_a_reader_process(start_broker):
    """/records of a stream: its chunks read by the reader processes, the rows as its AMQP consumers get them."""
    node = start_broker()
    with connect(node) as connection:
        connection.channel().queue_declare("st", durable=True, arguments={"x-queue-type": "stream"})
    publish_pipelined(node, "st", [(b"m%d" % i, pika.BasicProperties(message_id=f"id{i}", delivery_mode=1))
                                   for i in range(3000)])

    def read(**query) -> pa.Table:
        params = "&".join(f"{k}={v}" for k, v in query.items())
        return pa.ipc.open_stream(call(node, "GET", f"/api/queues/%2F/st/records?{params}").raw).read_all()

    table = read(batch=500)
    assert table.column("offset").to_pylist() == list(range(3000))
    assert table.column("body").to_pylist() == [b"m%d" % i for i in range(3000)]
    assert table.column("message_id").to_pylist() == [f"id{i}" for i in range(3000)]
    assert table.column("delivery_mode").to_pylist() == [1] * 3000
    readers = _reader_pids(node)
    assert len(readers) == 2
    table = read(start=1234, end=2000, limit=500, body="text")
    assert table.column("offset").to_pylist() == list(range(1234, 1734))
    assert table.column("body").to_pylist()[0] == "m1234"
    assert _reader_pids(node) == readers  # none failed (the loop would have stepped in)
