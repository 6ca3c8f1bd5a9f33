"""Publishes whose writes the disk refuses (full: ENOSPC, or past the file size limit: EFBIG) are never confirmed
while it refuses them, and are confirmed, and kept, once it takes them: a stream's turn of AMQP publishes was
dropped when its chunk's write failed, and the next group commit confirmed them all the same; a queue's message
written in part (the write cut short at the limit) was confirmed, and cut off as torn after a crash."""
from __future__ import annotations

import errno
import os
import resource
import threading
from pathlib import Path

import pika
import pytest

from conftest import connect
from amqp_server.queues import persistence as persistence_module
from stream_log import log as log_module
from support import drain, start

pytestmark = pytest.mark.timeout(60)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Publish(threading.Thread):
    """A confirmed publish, waited for in a thread of its own: the test sees whether (and how) it was confirmed."""

    def __init__(self, channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, body: bytes) -> None:
        super().__init__(daemon=True)
        self.channel, self.queue, self.body = channel, queue, body
        self.outcome: str | None = None

    def run(self) -> None:
        try:
            self.channel.basic_publish("", self.queue, self.body, PERSISTENT)
            self.outcome = "confirmed"
        except Exception as exc:  # the outcome the test checks: a nack, a closed connection
            self.outcome = repr(exc)


def stream_bodies(node, queue: str) -> list[bytes]:
    connection = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        got: list[bytes] = []
        channel.basic_consume(queue, lambda _ch, method, _p, body: got.append(body),
                              arguments={"x-stream-offset": "first"})
        connection.process_data_events(1)
        return got
    finally:
        connection.close()


def test_a_stream_publish_the_disk_refuses_is_confirmed_only_once_written(tmp_path, monkeypatch):
    node = start(tmp_path)
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
        channel.basic_publish("", "s", b"before", PERSISTENT)

        def full(fd: int, buffers: list, offset: int) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(log_module.os, "pwritev", full)
        publish = Publish(channel, "s", b"refused")
        publish.start()
        publish.join(2)
        assert publish.outcome is None  # neither confirmed nor refused while the disk is full
        monkeypatch.undo()  # space again
        publish.join(10)
        assert publish.outcome == "confirmed"
        connection.close()
        assert stream_bodies(node, "s") == [b"before", b"refused"]
    finally:
        node.stop()
    node = start(tmp_path)
    try:
        assert stream_bodies(node, "s") == [b"before", b"refused"]
    finally:
        node.stop()


def newest_segment(data_dir: Path) -> Path:
    return max((data_dir / "msg_store_persistent").glob("*.seg"))


def test_a_message_written_in_part_at_the_file_size_limit_is_confirmed_only_once_whole(start_broker):
    """A node whose files may grow no more (RLIMIT_FSIZE, as a full disk: the write that crosses the limit is
    cut short, the next fails) confirms nothing it could not write; raised, the limit lets the commit through,
    and what it confirmed survives a kill -9."""
    node = start_broker()
    body = b"x" * 30000  # joins the store's tail: written with the group commit
    with connect(node) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)
        for _ in range(3):
            channel.basic_publish("", "q", body, PERSISTENT)
        assert node.proc is not None
        at = newest_segment(node.data_dir).stat().st_size
        resource.prlimit(node.proc.pid, resource.RLIMIT_FSIZE, (at + 10000, resource.RLIM_INFINITY))
        publish = Publish(channel, "q", b"y" * 30000)
        publish.start()
        publish.join(2)
        assert publish.outcome is None  # neither confirmed nor refused while the file may not grow
        resource.prlimit(node.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        publish.join(10)
        assert publish.outcome == "confirmed"
    node.kill()
    node = start_broker(data_dir=node.data_dir)
    with connect(node) as connection:
        assert drain(connection.channel(), "q") == [body] * 3 + [b"y" * 30000]


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_after_a_failed_fsync_publishes_are_nacked_not_left_waiting(tmp_path, monkeypatch, kind):
    """A group commit whose fsync fails confirms nothing again until a restart (its writes may be lost for good);
    the publishes waiting for it, and the persistent ones after it, waited forever.  As RabbitMQ's channel
    rejects what a crashed queue had not confirmed, they are nacked; a transient publish is confirmed still (by a
    classic queue).  A quorum queue on one node is nacked the same way."""
    node = start(tmp_path)
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters(node.host, node.port))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True, arguments={"x-queue-type": kind})
        channel.basic_publish("", "q", b"before", PERSISTENT)

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(persistence_module.os, "fsync", failing)
        refused = Publish(channel, "q", b"refused")
        refused.start()
        refused.join(5)
        assert refused.outcome is not None and "NackError" in refused.outcome
        monkeypatch.undo()
        later = Publish(channel, "q", b"later")
        later.start()
        later.join(5)
        assert later.outcome is not None and "NackError" in later.outcome
        if kind == "classic":
            channel.basic_publish("", "q", b"transient")
        else:  # (a quorum queue writes every message it takes to its log, as rabbit_fifo's: nacked too)
            with pytest.raises(pika.exceptions.NackError):
                channel.basic_publish("", "q", b"transient")
        assert channel.is_open
        connection.close()
    finally:
        node.stop()
