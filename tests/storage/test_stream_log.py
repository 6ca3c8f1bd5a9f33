"""A stream's log on disk (``stream_log.log``), in-process: osiris's chunk layout, the index beside each
segment, retention by whole segments, times, and recovery after a crash (a torn tail cut, an index lost or behind
rebuilt, named publishers' last ids from the chunks' trailers); and a stream stored by an earlier version (an entry
per message in the queue index) moved into a log when the node starts.
"""
from __future__ import annotations

import asyncio
import datetime
import gzip
import json
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pamqp import commands

from amqp_server.broker import Broker
from amqp_server.message import Message, make_message
from amqp_server.queues.persistence import Persistence
from stream_log import amqp10, chunk, log as stream_log
from stream_log.log import INDEX_HEADER, ROW, SEGMENT_HEADER, StreamLogs
from amqp_server.queues.stream_queue import StreamQueue

from support import local

STREAM = {"x-queue-type": "stream"}


def entries(*records: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(record)) + record for record in records)


def committed(logs: StreamLogs) -> None:
    """What the group commit does: take the work on the loop, then make it durable."""
    logs.commit()
    logs.sync()


def reopened(path: Path) -> stream_log.StreamLog:
    """The log as a node starting after a crash finds it (nothing closed, nothing flushed on the way down)."""
    return StreamLogs(str(path), lambda: None).open(1)


def segment_files(path: Path) -> list[str]:
    return sorted(name for name in os.listdir(path / "1") if name.endswith(".segment"))


def test_a_chunk_is_stored_in_osiris_layout_and_read_without_its_trailer(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    data = entries(b"one", b"two", b"three")
    trailer = chunk.writer_trailer(b"app", 7)
    assert log.append(data, 3, 3, 11, trailer) == 0
    assert log.append(entries(b"four"), 1, 1, 4) == 3
    committed(logs)
    raw = (tmp_path / "1" / f"{0:020d}.segment").read_bytes()
    assert raw[:8] == SEGMENT_HEADER == b"OSIL\x00\x00\x00\x01"
    magic, kind, count, records, timestamp, epoch, chunk_id, crc, data_len, trailer_len, reserved = \
        chunk.HEADER.unpack_from(raw, 8)
    assert (magic, kind, count, records, epoch, chunk_id, data_len, trailer_len, reserved) == (
        0x50, 0, 3, 3, 1, 0, len(data), len(trailer), 0)
    assert crc == zlib.crc32(data) and abs(timestamp - datetime.datetime.now().timestamp() * 1000) < 5000
    assert raw[56:56 + len(data)] == data and raw[56 + len(data):56 + len(data) + len(trailer)] == trailer
    found = log.find(1)
    assert found is not None and log.chunk_bytes(*found) == raw[8:56 + len(data)]  # a reader is not sent the trailer
    index = (tmp_path / "1" / f"{0:020d}.index").read_bytes()
    assert INDEX_HEADER.unpack_from(index)[:2] == (b"WSIX", 1)
    rows = np.frombuffer(index[INDEX_HEADER.size:], ROW)
    assert [(int(r["id"]), int(r["records"]), int(r["body"])) for r in rows] == [(0, 3, 11), (3, 1, 4)]
    assert (log.first, log.next, log.last_chunk, log.body) == (0, 4, 3, 15)
    assert list(chunk.read_trailer(trailer)) == [("app", 7)]


def test_a_large_record_of_an_uncompressed_sub_batch_is_left_in_the_file_as_a_simple_entry_s(tmp_path):
    """``chunk.file_records`` reads a chunk's records as ``chunk.records`` does, but leaves a record of ``large``
    bytes or more in the file, its first ``head`` bytes read: a simple entry's and now one in an uncompressed
    sub-batch too, where the whole sub-batch was read into memory; a gzip sub-batch is inflated as before, and
    an uncompressed one whose records do not fit it is passed over (a None each, why told), the entries after
    it read right."""
    large, head = 300_000, 1_000
    big = [bytes([number]) * (large + number) for number in range(3)]

    def simple(record: bytes) -> bytes:
        return chunk.ENTRY.pack(len(record)) + record

    def sub_batch(records: list[bytes], compression: int = chunk.COMPRESSION_NONE, count: int | None = None) -> bytes:
        plain = b"".join(map(simple, records))
        stored = gzip.compress(plain) if compression == chunk.COMPRESSION_GZIP else plain
        return chunk.SUB_BATCH.pack(0x80 | compression << 4, len(records) if count is None else count, len(plain),
                                    len(stored)) + stored

    entries = [simple(b"s0"), sub_batch([b"u0", big[0], b"u1", big[1]]), sub_batch([b"g0", b"g1"], 1),
               sub_batch([b"x0"], count=2), simple(big[2]), sub_batch([b"t" * 200_000] * 2)]
    data = b"".join(entries)
    whole = b"?" * 1000 + chunk.HEADER.pack(chunk.MAGIC_VERSION, 0, len(entries), 0, 0, 1, 0, 0, len(data), 0, 0) + data
    reads: list[int] = []

    def read(pos: int, size: int) -> bytes:
        reads.append(size)
        return whole[pos:pos + size]

    refused: list[str] = []
    found = list(chunk.file_records(read, 1000, len(whole) - 1000, large, head, refused))
    assert max(reads) < large
    assert [whole[item.pos:item.pos + item.size] if isinstance(item, chunk.Left) else item for item in found] == [
        b"s0", b"u0", big[0], b"u1", big[1], b"g0", b"g1", None, None, big[2], b"t" * 200_000, b"t" * 200_000]
    assert [item.head == whole[item.pos:item.pos + head] for item in found if isinstance(item, chunk.Left)] == [
        True] * 3
    assert refused == ["sub-batch shorter than its records"]
    assert list(chunk.records(data, len(entries))) == [
        b"s0", b"u0", big[0], b"u1", big[1], b"g0", b"g1", None, None, big[2], b"t" * 200_000, b"t" * 200_000]


def test_a_frames_many_chunks_are_all_written_and_recovered_with_their_trailers(tmp_path):
    """More chunks than one pwritev takes buffers (three each with its trailer): all there, in order, after a
    crash too, and the named publisher's last id from the last chunk's trailer."""
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    data = memoryview(entries(*(b"m%04d" % i for i in range(700))))
    stride = 4 + 5
    assert log.append_chunks([(data[i * stride:(i + 1) * stride], 1, 1, 5, chunk.writer_trailer(b"app", i))
                              for i in range(700)]) == 0
    log.wrote("app", 699)
    assert (log.first, log.next, log.last_chunk, log.body) == (0, 700, 699, 3500)
    committed(logs)
    log.append(entries(b"after"), 1, 1, 5)
    (tmp_path / "1" / "writers").unlink()
    again = reopened(tmp_path)
    assert (again.next, again.last_chunk, again.writers) == (701, 700, {"app": 699})
    found = again.find(699)
    assert found is not None and again.chunk_bytes(*found)[chunk.HEADER.size:] == entries(b"m0699")


def test_recovery_cuts_a_torn_tail_and_carries_on_from_it(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    for i in range(5):
        log.append(entries(b"m%d" % i), 1, 1, 2)
    committed(logs)
    log.append(entries(b"torn", b"chunk"), 2, 2, 9)  # written, never synced: a crash tears it
    path = tmp_path / "1" / f"{0:020d}.segment"
    size = path.stat().st_size
    os.truncate(path, size - 3)
    again = reopened(tmp_path)
    assert (again.first, again.next, again.body) == (0, 5, 10)
    assert path.stat().st_size == size - (chunk.HEADER.size + 17)  # cut where the torn chunk began
    assert again.append(entries(b"after"), 1, 1, 5) == 5
    found = again.find(5)
    assert found is not None and again.chunk_bytes(*found).endswith(b"after")


def test_rows_past_the_durable_mark_are_checked_against_their_chunk(tmp_path):
    """The index header marks the rows whose chunks the last commit synced; a row past it whose chunk's data did
    not reach the disk (zeros where it was) goes, with what follows."""
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    for i in range(3):
        log.append(entries(b"kept%d" % i), 1, 1, 5)
    committed(logs)
    log.append(entries(b"lost"), 1, 1, 4)
    log.append(entries(b"lost too"), 1, 1, 8)
    path = tmp_path / "1" / f"{0:020d}.segment"
    raw = bytearray(path.read_bytes())
    found = log.find(3)
    assert found is not None
    pos = int(log.rows(found[0])[found[1]]["pos"])
    raw[pos + chunk.HEADER.size:pos + chunk.HEADER.size + 8] = bytes(8)  # its data never written
    path.write_bytes(bytes(raw))
    again = reopened(tmp_path)
    assert (again.next, again.last_chunk) == (3, 2)


def test_an_index_lost_or_behind_is_rebuilt_from_the_segment(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.append(entries(b"abc", b"de"), 2, 2, 5)
    amqp_record = amqp10.from_amqp091(make_message("", "s", commands.Basic.Properties(), b"body"))
    log.append(entries(amqp_record), 1, 1, 4, chunk.body_trailer(4))  # an AMQP publish: its body counts, not its record
    committed(logs)
    (tmp_path / "1" / f"{0:020d}.index").write_bytes(b"")
    again = reopened(tmp_path)
    assert (again.first, again.next, again.body, again.last_chunk) == (0, 3, 9, 2)
    rows = again.rows(again.segments[0])[:again.segments[0].count]
    assert [(int(r["id"]), int(r["records"]), int(r["body"])) for r in rows] == [(0, 2, 5), (2, 1, 4)]
    index = (tmp_path / "1" / f"{0:020d}.index").read_bytes()
    assert INDEX_HEADER.unpack_from(index)[2] == 2 and len(index) == INDEX_HEADER.size + 2 * ROW.itemsize


def test_segments_roll_by_body_bytes_and_retention_removes_whole_ones(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.segment_bytes = 100
    log.max_bytes = 250
    for _ in range(20):  # 30 body bytes a chunk: a segment fills at its 4th chunk
        log.append(entries(b"x" * 30), 1, 1, 30)
    committed(logs)
    # each new segment found 270 bytes (two full segments and its first chunk): the oldest went
    assert [name[:20] for name in segment_files(tmp_path)] == [f"{first:020d}" for first in (12, 16)]
    assert (log.first, log.next, log.body) == (12, 20, 8 * 30)
    assert log.find(3) == (log.segments[0], 0)  # below the stream: its first chunk
    again = reopened(tmp_path)
    assert (again.first, again.next, again.body, len(again.segments)) == (12, 20, 240, 2)
    for segment in again.segments:  # sealed segments' rows are read again when needed, a few kept
        again.rows(segment)
    assert sum(segment.rows is not None for segment in again.segments[:-1]) <= stream_log.LOADED_SEGMENTS


def test_max_age_removes_a_segment_once_the_next_began_long_enough_ago(tmp_path, monkeypatch):
    clock = [1_700_000_000_000]
    monkeypatch.setattr(stream_log, "now_ms", lambda: clock[0])
    log = StreamLogs(str(tmp_path), lambda: None).open(1)
    log.segment_bytes = 50
    log.max_age_ms = 1000
    for _ in range(4):  # two segments of two chunks, at 0 s and 0.1 s
        log.append(entries(b"y" * 30), 1, 1, 30)
        clock[0] += 50
    clock[0] += 5000
    log.append(entries(b"z"), 1, 1, 1)  # a third: the first is older than a second (the second began then)
    assert (log.first, len(log.segments)) == (2, 2)


def test_a_time_finds_the_first_chunk_published_then_or_later(tmp_path, monkeypatch):
    clock = [1_700_000_000_000]
    monkeypatch.setattr(stream_log, "now_ms", lambda: clock[0])
    log = StreamLogs(str(tmp_path), lambda: None).open(1)
    log.segment_bytes = 20
    for _ in range(6):
        log.append(entries(b"t" * 10, b"u" * 10), 2, 2, 20)
        clock[0] += 1000
    start = 1_700_000_000_000
    assert [log.at_time(start + t) for t in (-1, 0, 1, 1000, 2500, 5000, 5001)] == [0, 0, 2, 2, 6, 10, 12]


def test_named_publishers_last_ids_come_back_from_the_trailers(tmp_path):
    """Each chunk a named publisher wrote holds its last id in the trailer; the snapshot of all of them is written
    at most once a second, so a crash after it leaves the trailers since to read."""
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.append(entries(b"a"), 1, 1, 1, chunk.writer_trailer(b"app", 3))
    log.wrote("app", 3)
    committed(logs)  # the first snapshot: app at 3
    log.append(entries(b"b"), 1, 1, 1, chunk.writer_trailer(b"app", 9))
    log.wrote("app", 9)
    log.append(entries(b"c"), 1, 1, 1, chunk.writer_trailer(b"other", 2))
    log.wrote("other", 2)
    committed(logs)  # within the second: no new snapshot
    assert json.loads((tmp_path / "1" / "writers").read_bytes()) == {"upto": 1, "writers": {"app": 3}}
    assert reopened(tmp_path).writers == {"app": 9, "other": 2}
    (tmp_path / "1" / "writers").unlink()  # none at all: every trailer is read
    assert reopened(tmp_path).writers == {"app": 9, "other": 2}


def test_a_log_deleted_or_orphaned_leaves_no_file(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    for index_id in (1, 2, 3):
        logs.open(index_id).append(entries(b"m"), 1, 1, 1)
    committed(logs)
    logs.forget(2)
    logs.drop_orphans([1])  # 3's queue is gone too
    committed(logs)  # (a deleted stream's files go with the next commit)
    assert os.listdir(tmp_path) == ["1"]


def test_a_stream_deleted_between_a_commit_and_its_sync_fails_neither(tmp_path):
    """The commit takes a stream's stored offsets and writers' snapshot on the loop, its sync writes them off it;
    the stream deleted in between (delete answers OK, as RabbitMQ's) neither fails the sync (the whole group
    commit: nothing confirmed) nor leaves a file: its directory goes with the next commit."""
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.append(entries(b"m"), 1, 1, 1)
    log.store_offset("app", 42)
    log.wrote("writer", 7)
    logs.commit()
    logs.forget(1)
    logs.sync()
    committed(logs)
    assert os.listdir(tmp_path) == []


def test_a_stream_deleted_while_its_sync_writes_there_is_deleted(tmp_path, monkeypatch):
    """The sync (off the loop) creating the offsets file just as the stream is deleted on the loop: the delete
    does not fail (it did: the directory not empty), and the file goes with the next commit."""
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.store_offset("app", 42)
    logs.commit()
    directory = str(tmp_path / "1")
    writing = threading.Event()
    listdir = os.listdir

    def listed_then_written(path: str = ".") -> list[str]:  # the sync's write lands right after a listing
        names = listdir(path)
        if path == directory and not writing.is_set():
            writing.set()
            sync.join()
        return names

    def sync_when_listed() -> None:
        writing.wait(5)
        logs.sync()

    sync = threading.Thread(target=sync_when_listed)
    sync.start()
    monkeypatch.setattr(os, "listdir", listed_then_written)
    logs.forget(1)
    writing.set()
    sync.join(5)
    committed(logs)
    assert os.listdir(tmp_path) == []


def send(broker: Broker, name: str, bodies: list[bytes], **props) -> None:
    vhost = broker.vhost("/")
    for body in bodies:
        routed, _ = broker.publish(vhost, vhost.exchange(""), make_message("", name, commands.Basic.Properties(
            **props), body))
        assert routed


async def turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0.005)


async def test_a_stream_finds_its_times_and_offsets_across_a_restart(tmp_path, monkeypatch):
    """A turn's publishes are a chunk, stamped when it is written: a time finds the first chunk written then or
    later, before and after a restart; offsets, counts and bytes come back from the log."""
    from amqp_server.queues import stream_queue

    clock = [1_700_000_000_000]
    monkeypatch.setattr(stream_log, "now_ms", lambda: clock[0])
    monkeypatch.setattr(stream_queue, "now_ms", lambda: clock[0])
    data = str(tmp_path / "data")
    broker = Broker(data)
    broker.declare_queue(broker.vhost("/"), "s", durable=True, arguments=STREAM)
    published = []
    for i in range(100):  # a message a second
        published.append(clock[0])
        send(broker, "s", [b"m%d" % i])
        await turn()
        clock[0] += 1000
    stream = stream_of(broker)

    def starts(stream) -> list[int]:
        return [stream.attach_at(datetime.datetime.fromtimestamp(t / 1000, datetime.timezone.utc)) for t in published]

    assert starts(stream) == list(range(100))
    assert stream.attach_at(datetime.datetime.fromtimestamp(clock[0] / 1000 + 60, datetime.timezone.utc)) == 100
    broker.close()
    broker = Broker(data)
    stream = stream_of(broker)
    assert starts(stream) == list(range(100))
    assert (stream.first, stream.next_seq, stream.message_count, stream.ready_bytes) == (
        0, 100, 100, sum(len(b"m%d" % i) for i in range(100)))
    assert [entry.message.body for entry in stream.read(98, 5)] == [b"m98", b"m99"]
    broker.close()


def stream_of(broker: Broker) -> StreamQueue:
    """Stream "s" of the default vhost."""
    stream = broker.vhost("/").queue("s")
    assert isinstance(stream, StreamQueue)
    return stream


def legacy_stream(data: str, messages: list, first: int = 0, runs: Sequence[tuple[int, int]] = ()) -> int:
    """A node's data with stream "s" kept as an earlier version kept it: ``messages`` (a message, or bytes: a
    record published over the stream protocol) from offset ``first``, with ``runs`` (first offset, publish ms).
    Its queue's index id."""
    broker = Broker(data)
    broker.declare_queue(broker.vhost("/"), "s", durable=True, arguments=STREAM)
    index_id = local(broker.vhost("/").queue("s")).index_id
    broker.close()
    persistence = Persistence(data)
    persistence.recover([])
    for seq, message in enumerate(messages, first):
        if isinstance(message, bytes):  # stored with no AMQP 0-9-1 header, as the stream protocol's publishes were
            message = make_message("", "s", commands.Basic.Properties(), message)
            message.header = b""
        msg_id = persistence.store.new_id()
        persistence.store.write(msg_id, message.payload(), 1)
        persistence.index.publish(index_id, seq, msg_id, 0, len(message.body))
    for number, (run_first, ms) in enumerate(runs):
        persistence.index.put_mark(index_id, number, run_first, ms, 0, 0 if number else 1)
    persistence.commit_now()
    persistence.close()
    return index_id


async def test_a_stream_of_an_earlier_version_is_moved_into_a_log(tmp_path):
    """Entries in the queue index and bodies in the message store (how streams were kept) become chunks: offsets,
    bodies, properties (as RabbitMQ converts them) and publish times stay; the entries and bodies go."""
    data = str(tmp_path / "data")
    record = bytes.fromhex("005375a00572656f7264")  # an AMQP 1.0 record published over the stream protocol
    messages: list[Message | bytes] = [
        make_message("", "s", commands.Basic.Properties(content_type="text/plain", headers={"h": 1}), b"m%d" % i)
        for i in range(5)]
    messages[2] = record
    index_id = legacy_stream(data, messages, first=7,  # offsets 0-6 were removed by retention once
                             runs=[(7, 1_600_000_000_000), (10, 1_600_000_005_000)])
    broker = Broker(data)
    stream = stream_of(broker)
    assert (stream.first, stream.next_seq) == (7, 12)
    got = stream.read(0, 10)
    assert [(entry.seq, entry.message.body) for entry in got] == [
        (7, b"m0"), (8, b"m1"), (9, b"reord"), (10, b"m3"), (11, b"m4")]
    assert got[0].message.properties.content_type == "text/plain" and got[0].message.headers == {"h": 1}
    when = datetime.datetime.fromtimestamp(1_600_000_004, datetime.timezone.utc)
    assert stream.attach_at(when) == 10  # the second run's chunk
    assert broker.persistence.index.read(index_id, 0, 10) == [] and broker.persistence.index.marks(index_id) == []
    broker.close()
    broker = Broker(data)  # and once only
    assert [entry.seq for entry in stream_of(broker).read(0, 10)] == [7, 8, 9, 10, 11]
    broker.close()


async def test_a_move_cut_short_is_built_again_or_finished(tmp_path):
    """A crash while the log is built leaves a directory of its own: built again.  One after the rename but before
    the entries went leaves them: removed, the log as it is."""
    bodies = [b"m0", b"m1", b"m2"]
    messages = [make_message("", "s", commands.Basic.Properties(), body) for body in bodies]
    data = tmp_path / "data"
    index_id = legacy_stream(str(data), messages)
    done = tmp_path / "done"
    shutil.copytree(data, done)
    Broker(str(done)).close()  # moved there
    streams = data / "streams"
    streams.mkdir()
    (streams / f"{index_id}.migrating").mkdir()
    (streams / f"{index_id}.migrating" / f"{0:020d}.segment").write_bytes(b"half of it")
    for crashed in ("building", "renamed"):
        if crashed == "renamed":  # the log in place, the entries still there
            shutil.rmtree(data)
            legacy_stream(str(data), messages)
            shutil.copytree(done / "streams" / str(index_id), data / "streams" / str(index_id))
        broker = Broker(str(data))
        assert [entry.message.body for entry in stream_of(broker).read(0, 10)] == bodies
        assert broker.persistence.index.read(index_id, 0, 10) == []
        assert os.listdir(data / "streams") == [str(index_id)]
        broker.close()
