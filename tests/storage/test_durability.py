"""Durable definitions and persistent messages across clean restarts, crashes, a torn segment tail, and disk reuse."""
from __future__ import annotations

import os
import random
import stat
import struct
import threading
import time
from functools import partial
from pathlib import Path

import pika
import pytest
from pika.exceptions import AMQPError, ChannelClosedByBroker

from conftest import connect
import support

drain = partial(support.drain, settle="ack", keep=lambda got: (got.body, got.redelivered))

pytestmark = pytest.mark.timeout(120)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def restart(start_broker, node, *extra: str):
    node.stop()
    return start_broker(*extra, data_dir=node.data_dir)


def exists(conn, kind: str, name: str) -> bool:
    ch = conn.channel()
    try:
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    ch.close()
    return True


def dir_size(path: Path) -> int:
    """The size of the files in ``path``, while the node may delete some of them (a reclaimed segment)."""
    total = 0
    for file in path.iterdir():
        try:
            found = file.stat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(found.st_mode):
            total += found.st_size
    return total


def test_persistent_messages_survive_clean_restart_in_order(start_broker):
    node = start_broker()
    with connect(node) as conn:
        ch = conn.channel()
        ch.queue_declare("dq", durable=True)
        ch.queue_declare("tq", durable=False)
        ch.confirm_delivery()
        for i in range(200):
            persistent = i % 3 != 0
            ch.basic_publish("", "dq", b"m%d" % i, PERSISTENT if persistent else pika.BasicProperties())
        ch.basic_publish("", "tq", b"x", PERSISTENT)
    node = restart(start_broker, node)
    with connect(node) as conn:
        ch = conn.channel()
        got = drain(ch, "dq")
        assert [b for b, _ in got] == [b"m%d" % i for i in range(200) if i % 3 != 0]
        assert not any(r for _, r in got)
        assert not exists(conn, "queue", "tq")
        ch = conn.channel()
        assert ch.queue_declare("dq", passive=True).method.message_count == 0
    # the acks were durable too
    node = restart(start_broker, node)
    with connect(node) as conn:
        assert conn.channel().queue_declare("dq", passive=True).method.message_count == 0


def test_definitions_survive_restart(start_broker):
    node = start_broker()
    assert node.admin("add-vhost", "v1").returncode == 0
    assert node.admin("add-user", "alice", "s3cret").returncode == 0
    assert node.admin("set-permissions", "v1", "alice", ".*", ".*", ".*").returncode == 0
    with connect(node) as conn:
        ch = conn.channel()
        ch.exchange_declare("dx", "topic", durable=True)
        ch.exchange_declare("dx2", "fanout", durable=True)
        ch.exchange_declare("tx", "direct", durable=False)
        ch.queue_declare("dq", durable=True, arguments={"x-max-length": 100})
        ch.queue_bind("dq", "dx", "a.*")
        ch.exchange_bind("dx2", "dx", "b.#")  # e -> e: dx2 receives from dx
        ch.queue_declare("dq2", durable=True)
        ch.queue_bind("dq2", "dx2")
    with connect(node, "alice", "s3cret", "v1") as conn:
        ch = conn.channel()
        ch.queue_declare("vq", durable=True)
        ch.basic_publish("", "vq", b"in-v1", PERSISTENT)
    node = restart(start_broker, node)
    with connect(node) as conn:
        assert exists(conn, "exchange", "dx") and exists(conn, "exchange", "dx2")
        assert not exists(conn, "exchange", "tx")
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("dx", "a.1", b"to-dq", PERSISTENT)
        ch.basic_publish("dx", "b.x.y", b"to-dq2", PERSISTENT)
        ch.basic_publish("dx", "c", b"nowhere", PERSISTENT)
        assert drain(ch, "dq") == [(b"to-dq", False)]
        assert drain(ch, "dq2") == [(b"to-dq2", False)]
        # queue arguments survived: declaring with different ones is refused
        with pytest.raises(ChannelClosedByBroker) as closed:
            conn.channel().queue_declare("dq", durable=True)
        assert closed.value.reply_code == 406
    with connect(node, "alice", "s3cret", "v1") as conn:
        ch = conn.channel()
        assert drain(ch, "vq") == [(b"in-v1", False)]


def test_unacked_messages_come_back_redelivered(start_broker):
    node = start_broker()
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("dq", durable=True)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", "dq", b"m%d" % i, PERSISTENT)
    for _ in range(2):
        method, _, _ = ch.basic_get("dq", auto_ack=False)  # taken, never acked
    assert method is not None and method.delivery_tag == 2
    conn.channel().queue_declare("dq", passive=True)  # round trip: the gets are processed
    node.stop()
    try:
        conn.close()
    except AMQPError:
        pass
    node = start_broker(data_dir=node.data_dir)
    with connect(node) as conn:
        got = drain(conn.channel(), "dq")
    assert got == [(b"m0", True), (b"m1", True), (b"m2", False), (b"m3", False), (b"m4", False)]


class Publisher(threading.Thread):
    """Publishes persistent messages one at a time with confirms until the connection dies."""

    def __init__(self, node, queue: str) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.queue = queue
        self.confirmed: list[int] = []
        self.attempted = 0
        self.error: BaseException | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            conn = connect(self.node)
            ch = conn.channel()
            ch.queue_declare(self.queue, durable=True)
            ch.confirm_delivery()
            self.ready.set()
            i = 0
            while True:
                self.attempted = i + 1
                ch.basic_publish("", self.queue, b"%08d" % i + b"x" * random.randrange(0, 2000), PERSISTENT)
                self.confirmed.append(i)
                i += 1
        except BaseException as exc:  # the node was killed under us
            self.error = exc
            self.ready.set()


def test_confirmed_messages_survive_sigkill(start_broker):
    node = start_broker()
    rng = random.Random(os.getpid())
    started = time.monotonic()
    for round_ in range(5):
        queue = f"crash{round_}"
        pub = Publisher(node, queue)
        pub.start()
        assert pub.ready.wait(10)
        time.sleep(rng.uniform(0.2, 0.8))
        node.kill()
        pub.join(10)
        assert not pub.is_alive()
        assert pub.confirmed, f"round {round_}: nothing confirmed ({pub.error!r})"
        print(f"round {round_}: {len(pub.confirmed)} confirmed before SIGKILL")
        node = start_broker(data_dir=node.data_dir)
        with connect(node) as conn:
            ch = conn.channel()
            got = [int(body[:8]) for body, _ in drain(ch, queue)]
        # every confirmed message, in order, no duplicates; at most the in-flight one beyond
        assert got[:len(pub.confirmed)] == pub.confirmed, f"round {round_}"
        assert got in (pub.confirmed, pub.confirmed + [len(pub.confirmed)]), f"round {round_}: tail {got[-3:]}"
    assert time.monotonic() - started < 30


def test_committed_transaction_survives_sigkill(start_broker):
    """tx.commit-ok, like a confirm, is sent only once the transaction's persistent messages are fsynced."""
    node = start_broker()
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("txq", durable=True)
    ch.tx_select()
    for batch in range(5):
        for i in range(100):
            ch.basic_publish("", "txq", b"%d.%d" % (batch, i), PERSISTENT)
        ch.tx_commit()
    node.kill()
    node = start_broker(data_dir=node.data_dir)
    with connect(node) as conn:
        got = drain(conn.channel(), "txq")
    assert [b for b, _ in got] == [b"%d.%d" % (batch, i) for batch in range(5) for i in range(100)]


def test_corrupt_segment_tail_is_cut_off(start_broker):
    node = start_broker()
    with connect(node) as conn:
        ch = conn.channel()
        ch.queue_declare("dq", durable=True)
        ch.confirm_delivery()
        for i in range(50):
            ch.basic_publish("", "dq", b"m%d" % i + b"." * 100, PERSISTENT)
    node.stop()
    store = node.data_dir / "msg_store_persistent"
    segments = sorted(store.glob("*.seg"))
    assert segments
    newest = segments[-1]
    assert newest.stat().st_size > 50 * 100, [(p.name, p.stat().st_size) for p in segments]
    with open(newest, "ab") as f:  # a torn record: a plausible head promising more than is there, bad CRC
        f.write(struct.pack(">IIQ", 4096, 0xDEADBEEF, 12345) + b"garbage" * 20)
    node = start_broker(data_dir=node.data_dir)
    with connect(node) as conn:
        ch = conn.channel()
        got = drain(ch, "dq")
        assert [b for b, _ in got] == [b"m%d" % i + b"." * 100 for i in range(50)]
        ch.confirm_delivery()
        ch.basic_publish("", "dq", b"after", PERSISTENT)  # the store still takes writes
    log = node.said()
    assert "cut off" in log and "WARNING" in log.upper()
    node = restart(start_broker, node)
    with connect(node) as conn:
        assert drain(conn.channel(), "dq") == [(b"after", False)]


def test_disk_space_reclaimed_after_consuming(start_broker):
    segment = 1024 * 1024
    node = start_broker("--segment-size", str(segment))
    n, body = 20_000, os.urandom(1024)
    store = node.data_dir / "msg_store_persistent"
    with connect(node) as conn:
        ch = conn.channel()
        ch.queue_declare("big", durable=True)
        for _ in range(n):
            ch.basic_publish("", "big", body, PERSISTENT)
        assert ch.queue_declare("big", passive=True).method.message_count == n
        assert dir_size(store) > 10 * segment
        ch.basic_qos(prefetch_count=1000)
        received = 0

        def on_message(c, method, props, b):
            nonlocal received
            received += 1
            if received % 500 == 0 or received == n:
                c.basic_ack(method.delivery_tag, multiple=True)

        ch.basic_consume("big", on_message)
        deadline = time.monotonic() + 30
        while received < n and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert received == n
        ch.close()
        deadline = time.monotonic() + 10
        while dir_size(store) >= 2 * segment and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dir_size(store) < 2 * segment, sorted((p.name, p.stat().st_size) for p in store.iterdir())
        assert conn.channel().queue_declare("big", passive=True).method.message_count == 0


def test_deep_queue_paged_to_disk_survives_sigkill_and_clean_restarts(start_broker):
    """A queue far deeper than its in-memory window: kill -9 while it pages, consume some, crash again,
    then a clean restart (which reads the totals and the store's snapshot instead of scanning)."""
    window = ("--queue-window", "32")
    node = start_broker(*window)
    pub = Publisher(node, "deep")
    pub.start()
    assert pub.ready.wait(10)
    deadline = time.monotonic() + 20
    while len(pub.confirmed) < 600 and time.monotonic() < deadline:
        time.sleep(0.05)
    node.kill()
    pub.join(10)
    confirmed = pub.confirmed
    assert len(confirmed) >= 600, pub.error

    node = start_broker(*window, data_dir=node.data_dir)
    with connect(node) as conn:
        ch = conn.channel()
        assert ch.queue_declare("deep", durable=True, passive=True).method.message_count in (
            len(confirmed), len(confirmed) + 1)
        ch.confirm_delivery()
        taken = 0
        while taken < 250:  # acked from the head while the tail stays on disk
            method, _, body = ch.basic_get("deep", auto_ack=False)
            assert method is not None and method.delivery_tag is not None and body is not None  # (not empty yet)
            assert int(body[:8]) == confirmed[taken]
            ch.basic_ack(method.delivery_tag)
            taken += 1
        ch.basic_publish("", "deep", b"marker", PERSISTENT)  # confirmed: the acks before it are durable too
    node.kill()

    node = start_broker(*window, data_dir=node.data_dir)
    with connect(node) as conn:
        got = [body for body, _ in drain(conn.channel(), "deep", settle="hold")]
    numbers = [int(body[:8]) for body in got[:-1]]
    assert got[-1] == b"marker"
    assert numbers[:len(confirmed) - taken] == confirmed[taken:]  # in order, none lost, none twice
    assert len(numbers) - (len(confirmed) - taken) in (0, 1)  # at most the one in flight at the first kill

    node = restart(start_broker, node, *window)
    assert "clean shutdown" in node.said()  # no segment was scanned
    with connect(node) as conn:
        ch = conn.channel()
        assert ch.queue_declare("deep", durable=True, passive=True).method.message_count == len(got)
        assert [body for body, _ in drain(ch, "deep")] == got


def test_a_fanout_to_durable_queues_with_auto_ack_consumers_keeps_the_copy_of_the_queue_without_one(start_broker):
    """A persistent message through a fanout to two durable queues: the queue with an auto-ack consumer lets its
    copy go at once, whichever the publish reaches first; both consumers get it and the other queue keeps it,
    confirmed, across a kill -9 (the second queue's reference to a store record gone closed the connection)."""
    node = start_broker()
    with connect(node) as conn:
        ch = conn.channel()
        ch.exchange_declare("fx", "fanout", durable=True)
        got: list[bytes] = []
        for name in ("q1", "q2", "q3"):
            ch.queue_declare(name, durable=True)
            ch.queue_bind(name, "fx")
        for name in ("q1", "q2"):
            ch.basic_consume(name, lambda c, m, p, b: got.append(b), auto_ack=True)
        publisher = conn.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("fx", "", b"hello", PERSISTENT)  # (confirmed, or it raises)
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        assert got == [b"hello", b"hello"]
    node.kill()
    node = start_broker(data_dir=node.data_dir)
    with connect(node) as conn:
        ch = conn.channel()
        assert [ch.queue_declare(name, passive=True).method.message_count for name in ("q1", "q2", "q3")] == [0, 0, 1]
        method, _, body = ch.basic_get("q3", auto_ack=True)
        assert body == b"hello"
