"""Queues deeper than their in-memory window, in-process (issue: deep backlogs in bounded memory).

A durable queue keeps ``queue_window`` ready entries in memory and the rest in the queue index; any
queue pages its tail when memory runs short.  The window is made tiny here so every reader of the
queue meets the disk: delivery order, requeue, TTL, max-length, dead-lettering, peek, offsets and
range reads, purge and delete, and a restart that reads totals instead of entries.
"""
from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from pathlib import Path

import pytest
from pamqp import commands

from amqp_server.broker import Broker
from amqp_server.clock import now_ms
from amqp_server.message import make_message
from amqp_server.queues import expiry, queue as queue_module
from amqp_server.queues.queue import Entry
from amqp_server.queues.persistence import Persistence
from amqp_server.spark_bridge.commit import Commit
from amqp_server.broker.vhost import VHost

from support import Target, consume, delivery_tag, drain_local as drain, classic, local

WINDOW = 16
pytestmark = pytest.mark.core(queue_window=WINDOW)


def send(core: Broker, vhost: VHost, queue: str, bodies, persistent: bool = True, **props) -> None:
    for body in bodies:
        message = make_message("", queue, commands.Basic.Properties(delivery_mode=2 if persistent else 1, **props),
                               body)
        routed, _rejected = core.publish(vhost, vhost.exchange(""), message)
        assert routed


def taken(core: Broker, vhost: VHost, queue: str) -> Entry:
    """basic.get of the head of a queue the test filled, left unsettled."""
    entry = core.get_local(vhost, queue, no_ack=False)[1]
    assert entry is not None
    return entry


def stop_before_the_drop_is_done(core: Broker) -> None:
    """The node's stop only cancels the pager's drop in progress, as if it came before the drop was done."""
    dropping = core.pager._dropping
    assert dropping is not None

    def cancel() -> None:
        dropping.cancel()

    core.pager.finish_drops = cancel  # type: ignore[method-assign]  # (a stand-in for the one call of the stop)


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


async def settle() -> None:
    """Let the group commit run (a publish's index entry is committed on the next loop turn)."""
    for _ in range(5):
        await asyncio.sleep(0.01)


def as_after_a_crash(data: Path) -> None:
    """The node's data as after kill -9 of a node that had stopped cleanly: no snapshot of the store's index,
    which the next start rebuilds from the segments (and its references from the queue index)."""
    (data / "msg_store_persistent" / "clean_shutdown").unlink()


@pytest.mark.parametrize("persistent", [True, False])
async def test_durable_queue_keeps_a_window_in_memory_and_delivers_in_order(core, vhost, persistent):
    core.declare_queue(vhost, "q", durable=True)
    queue = vhost.queue("q")
    send(core, vhost, "q", bodies(500), persistent)
    assert len(queue.ready) <= WINDOW and queue.paged == 500 - len(queue.ready)
    assert queue.message_count == 500
    assert queue.ready_bytes == sum(map(len, bodies(500)))
    await settle()
    target = Target()
    consume(core, vhost, "q", target, "c", no_ack=True)
    assert target.bodies() == bodies(500)
    assert queue.message_count == 0 and queue.ready_bytes == 0 and queue.paged == 0


async def test_consumer_acks_leave_no_entry_or_record_behind(core, vhost):
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(300))
    send(core, vhost, "q", bodies(300, "t"), persistent=False)
    await settle()
    assert drain(core, vhost, "q") == bodies(300) + bodies(300, "t")
    core.persistence.commit_now()
    core.pager.index.commit()
    assert core.persistence.index.queue_ids() == set()
    assert core.persistence.store.stats().messages == 0
    assert core.pager.store.stats().messages == 0


async def test_requeue_below_the_tail_on_disk_is_not_delivered_twice(core, vhost):
    core.declare_queue(vhost, "q", durable=True)
    queue = vhost.queue("q")
    send(core, vhost, "q", bodies(40))
    target = Target()
    consumer = consume(core, vhost, "q", target, "c", prefetch=5)
    core.remove_consumer(consumer)
    core.settle_taken(target.held, requeue=True)  # five come back at the head
    send(core, vhost, "q", bodies(40, "late"))
    queue.page_out(1)  # as memory pressure would: all but the head to disk
    assert queue.paged > 0
    got = drain(core, vhost, "q")
    assert got == bodies(40) + bodies(40, "late")


async def test_transient_queue_pages_under_memory_pressure_and_back(core, vhost):
    core.declare_queue(vhost, "t")
    queue = vhost.queue("t")
    shared = bodies(200)
    core.declare_queue(vhost, "t2")
    for body in shared:  # one message in two queues: written to the transient store once
        message = make_message("amq.fanout", "", commands.Basic.Properties(), body)
        for name in ("t", "t2"):
            vhost.queue(name).enqueue(message)
    assert queue.paged == 0 and len(queue.ready) == 200  # no window for a transient queue
    freed = core.pager.page_out(core.all_queues(), keep=10)
    assert freed == 2 * sum(map(len, shared)) - 2 * sum(map(len, shared[:10]))
    assert len(queue.ready) == 10 and queue.paged == 190 and queue.message_count == 200
    assert core.pager.store.stats().messages == 190  # one record per message, two references each
    send(core, vhost, "t", [b"after"], persistent=False)  # joins the tail on disk, in order
    assert queue.paged == 191
    assert drain(core, vhost, "t") == shared + [b"after"]
    assert drain(core, vhost, "t2") == shared
    assert core.pager.store.stats().messages == 0


async def test_ttl_expires_entries_on_disk_and_dead_letters_them(core, vhost):
    core.declare_queue(vhost, "dlq", durable=True)
    core.declare_queue(vhost, "q", durable=True, arguments={"x-dead-letter-exchange": ""
                                                              , "x-dead-letter-routing-key": "dlq"})
    queue = vhost.queue("q")
    send(core, vhost, "q", bodies(20, "keep"))
    send(core, vhost, "q", bodies(30, "short"), expiration="50")  # deep in the queue: on disk
    send(core, vhost, "q", bodies(20, "tail"))
    assert queue.paged > 30
    await asyncio.sleep(0.3)
    assert queue.message_count == 40  # expired where they sat, without reaching the head
    assert vhost.queue("dlq").message_count == 30
    assert drain(core, vhost, "q") == bodies(20, "keep") + bodies(20, "tail")
    assert drain(core, vhost, "dlq") == bodies(30, "short")


async def test_no_queue_timer_fires_once_the_node_closed(tmp_path):
    """A message TTL and an x-expires that fall after the node's close find no closed store under them: the close
    stops every queue's timers."""
    core = Broker(str(tmp_path / "data"), queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True, arguments={"x-message-ttl": 300})
    core.declare_queue(vhost, "unused", durable=True, arguments={"x-expires": 300})
    send(core, vhost, "q", bodies(40))
    await settle()
    failures: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: failures.append(context))
    core.close()
    await asyncio.sleep(0.6)
    assert failures == []


async def test_max_length_drop_head_reaches_into_the_disk(core, vhost):
    core.declare_queue(vhost, "q", durable=True, arguments={"x-max-length": 50})
    send(core, vhost, "q", bodies(200))
    queue = vhost.queue("q")
    assert queue.message_count == 50
    assert drain(core, vhost, "q") == bodies(200)[150:]


@pytest.mark.parametrize("arguments", [{}, {"x-max-priority": 3}], ids=["classic", "priority"])
async def test_held_bytes_stays_what_a_walk_of_the_entries_in_memory_finds(core, vhost, arguments):
    """``Queue.held_bytes`` (the HTTP API's ``message_bytes_ram``) is counted as entries come and go, never by a
    walk, yet stays what a walk of the ready entries in memory finds: the bodies they hold, as large stored
    bodies are left in the store, paged out and in (read, or left unread), taken, requeued after their delivery let
    go of them, dropped by a length limit, expired, browsed and purged."""
    from amqp_server.frontend.stored_bodies import release_body
    from amqp_server.message import RELEASE_FROM

    core.declare_queue(vhost, "q", durable=True, arguments={"x-max-length": 60, **arguments})
    queue = classic(vhost.queue("q"))

    def check() -> None:
        walked = sum(entry.message.body_size for entry in queue.ready
                     if not entry.gone and entry.message.body is not None)
        assert queue.held_bytes == walked

    for number in range(30):
        send(core, vhost, "q", [bytes(RELEASE_FROM + number), b"small%d" % number], priority=number % 4)
        check()
    assert queue.held_bytes < 30 * 8  # the large ones left in the store
    send(core, vhost, "q", [bytes(RELEASE_FROM)] * 6, expiration="50")  # drops six from the head
    send(core, vhost, "q", [bytes(RELEASE_FROM)] * 2, persistent=False)  # held: in memory only
    check()
    target = Target()
    consumer = consume(core, vhost, "q", target, "c", prefetch=8)
    check()
    for entry, held_by, _ in target.held:
        release_body(entry, held_by)  # as a channel does once a large body is sent
    core.remove_consumer(consumer)
    core.settle_taken(target.held, requeue=True)
    check()
    await asyncio.sleep(0.2)  # the six expire where they are
    check()
    # browsed: no body stays in memory for it, nor is a large one the store holds read for it
    assert all(entry.message.body is not None or entry.message.body_size >= RELEASE_FROM
               for entry in queue.peek(0, 60))
    check()
    queue.page_out(1)
    check()
    for _ in range(20):
        assert core.get_local(vhost, "q", no_ack=True)[1] is not None
        check()
    core.purge_local(vhost, "q")
    check()
    send(core, vhost, "q", [bytes(RELEASE_FROM)], expiration="1")
    send(core, vhost, "q", [b"after"])
    time.sleep(0.01)  # (the loop does not turn: the head expires as a get meets it, before its timer)
    assert core.get_local(vhost, "q", no_ack=True)[1].message.body == b"after"
    check()
    assert queue.held_bytes == 0


async def test_peek_offsets_range_reads_and_commit_across_memory_and_disk(core, vhost):
    core.declare_queue(vhost, "q", durable=True)
    queue = vhost.queue("q")
    send(core, vhost, "q", bodies(100))
    assert [e.message.body for e in core.peek(queue, 90, 20)] == bodies(100)[90:]
    assert queue.offsets() == (0, 100)
    assert [e.message.body for e in queue.browse(5, 95)] == bodies(100)[5:95]
    batches = list(queue.read_range(0, 100, 7, limit=60))
    assert all(len(b) <= 7 for b in batches) and [e.seq for b in batches for e in b] == list(range(60))
    assert await Commit(core).commit_offset(queue, 80) == 80
    assert queue.message_count == 20 and queue.offsets() == (80, 100)
    assert drain(core, vhost, "q") == bodies(100)[80:]
    send(core, vhost, "q", bodies(3, "late"))
    assert await Commit(core).commit_offset(queue, 2 ** 64 - 1) == 3 and queue.committed == 103  # past the tail
    send(core, vhost, "q", bodies(2, "later"))
    assert await Commit(core).commit_offset(queue, 104) == 1 and drain(core, vhost, "q") == [b"later1"]


@pytest.mark.parametrize("arguments", [{}, {"x-max-priority": 9}])
async def test_read_parts_are_read_range_with_the_entries_on_disk_as_their_index_rows(core, vhost, arguments):
    """A quorum queue's snapshot reads the entries on disk as their index rows (no entry made for each): the same
    entries in the same batches as ``read_range``, those in memory as they are."""
    core.declare_queue(vhost, "q", durable=True, arguments=arguments)
    queue = vhost.queue("q")
    send(core, vhost, "q", bodies(100))
    assert queue.ready.paged and queue.ready.entries  # (some on disk, some in memory)
    slices = [[(e.seq, e.message.msg_id, e.message.body_size) for e in batch] for batch in queue.read_range(3, 97, 7)]
    parts = list(queue.read_parts(3, 97, 7))
    assert [sorted([*((e.seq, e.message.msg_id, e.message.body_size) for e in entries),
                    *((row.seq, row.msg_id, row.size) for row in rows)]) for entries, rows in parts] == slices
    assert any(rows for _, rows in parts) and any(entries for entries, _ in parts)
    assert all(entry.message.body is not None for entries, _ in parts for entry in entries)


@pytest.mark.parametrize("arguments", [{}, {"x-max-priority": 9}])
async def test_a_peek_in_steps_reads_as_one_peek_across_memory_and_disk(core, vhost, arguments):
    """The HTTP peek reads a slice per loop turn, each going on after the last entry of the one before (no walk
    from the head again): the same entries, in delivery order, as one peek."""
    core.declare_queue(vhost, "q", durable=True, arguments=arguments)
    queue = vhost.queue("q")
    for n in range(300):
        send(core, vhost, "q", [f"m{n}".encode()], priority=n % 3 * 4)
    assert queue.paged
    whole = core.peek(queue, 5, 1000)
    stepped = core.peek(queue, 5, 7)
    while True:
        more = core.peek(queue, 0, 7, after=stepped[-1])
        if not more:
            break
        stepped.extend(more)
    assert [e.message.body for e in stepped] == [e.message.body for e in whole] and len(whole) == 295


async def test_a_commit_of_part_of_the_disk_counts_its_entries_a_batch_per_loop_turn(core, vhost, monkeypatch):
    """Committing part of a deep queue's part on disk answers once its entries there are counted, ``COUNT_BATCH``
    per loop turn (a million of them held every client for seconds); meanwhile reads, offsets and expiry see
    none of them, and a consumer that needs the disk finishes the count first.  Their index rows and records
    go afterwards, in the background."""
    COUNT_BATCH = 1024
    monkeypatch.setattr("amqp_server.queues.ready_list.COUNT_BATCH", COUNT_BATCH)
    core.declare_queue(vhost, "q", durable=True)
    queue = vhost.queue("q")
    count = 4 * COUNT_BATCH
    send(core, vhost, "q", bodies(count - 10))
    send(core, vhost, "q", bodies(10, "x"), expiration="1000")
    await settle()
    on_disk_from = queue.ready.paged_from
    commit = asyncio.ensure_future(Commit(core).commit_offset(queue, 2 * COUNT_BATCH))
    await asyncio.sleep(0)
    assert not commit.done() and queue.committed_drops == 0  # under way: a batch counted
    assert queue.offsets() == (2 * COUNT_BATCH, count)
    assert [e.message.body for e in queue.browse(0, count)] == bodies(count - 10)[2 * COUNT_BATCH:] + bodies(10, "x")
    assert await commit == 2 * COUNT_BATCH
    assert queue.message_count == 2 * COUNT_BATCH and queue.committed_drops == 2 * COUNT_BATCH - on_disk_from
    assert queue.ready_bytes == sum(map(len, bodies(count - 10)[2 * COUNT_BATCH:] + bodies(10, "x")))

    commit = asyncio.ensure_future(Commit(core).commit_offset(queue, count - 10))  # again, and a consumer meanwhile
    await asyncio.sleep(0)
    assert not commit.done()
    assert core.get_local(vhost, "q", no_ack=True)[1].message.body == b"x0"
    assert await commit == 2 * COUNT_BATCH - 10
    assert queue.message_count == 9
    for _ in range(300):  # the rest expire, none of the committed ones dead-lettered or counted again
        if not queue.message_count:
            break
        await asyncio.sleep(0.01)
    assert queue.message_count == 0 and drain(core, vhost, "q") == []
    while core.pager.dropping:
        await asyncio.sleep(0.01)
    core.persistence.commit_now()
    assert core.persistence.index.queue_ids() == set() and core.persistence.store.stats().messages == 0


async def test_a_commit_of_the_whole_disk_answers_at_once(core, vhost, monkeypatch):
    """A commit at or past the last entry on disk (a drain of the whole queue) knows their count without a walk:
    it answers in the loop turn it came in, and their rows and records go in the background."""
    from amqp_server.queues.paging import DROP_BATCH

    monkeypatch.setattr("amqp_server.queues.ready_list.COUNT_BATCH", DROP_BATCH)  # a count would take three turns
    core.declare_queue(vhost, "q", durable=True)
    queue = vhost.queue("q")
    send(core, vhost, "q", bodies(3 * DROP_BATCH))
    await settle()
    commit = asyncio.ensure_future(Commit(core).commit_offset(queue, 3 * DROP_BATCH))
    await asyncio.sleep(0)
    assert commit.done() and commit.result() == 3 * DROP_BATCH
    assert queue.message_count == 0 and queue.ready_bytes == 0 and queue.offsets() == (3 * DROP_BATCH,) * 2
    assert core.pager.dropping and core.persistence.index.queue_ids()  # the rows, still going
    send(core, vhost, "q", bodies(5, "new"))
    assert drain(core, vhost, "q") == bodies(5, "new")
    while core.pager.dropping:
        await asyncio.sleep(0.01)
    core.persistence.commit_now()
    assert core.persistence.index.queue_ids() == set() and core.persistence.store.stats().messages == 0


async def test_purge_and_delete_release_everything_on_disk(core, vhost):
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(100))
    send(core, vhost, "q", bodies(100, "t"), persistent=False)
    await settle()
    assert core.purge_local(vhost, "q") == 200
    assert vhost.queue("q").message_count == 0
    send(core, vhost, "q", bodies(100))
    core.delete_queue(vhost, "q")
    await dropped(core)
    core.persistence.commit_now()
    assert core.persistence.store.stats().messages == 0 and core.pager.store.stats().messages == 0
    assert core.persistence.index.queue_ids() == set()


async def dropped(core: Broker) -> int:
    """Wait for deleted queues' entries on disk to be dropped; the loop turns it took."""
    turns = 0
    while core.pager.dropping:
        await asyncio.sleep(0)
        turns += 1
    return turns


@pytest.mark.parametrize("durable", [True, False])
async def test_a_deleted_deep_queue_is_dropped_in_the_background(core, vhost, durable):
    """Deleting a deep queue drops its entries on disk a batch per loop turn, not all at once (a million held
    every client for seconds): the messages it shared with another queue stay there, those a consumer holds
    are the consumer's to settle, and at the end the stores hold nothing of it."""
    from amqp_server.queues.paging import DROP_BATCH

    for name in ("q", "other"):
        core.declare_queue(vhost, name, durable=durable)
        core.bind(vhost, "amq.fanout", "queue", name, "")
    count = 3 * DROP_BATCH
    for i in range(count):
        message = make_message("amq.fanout", "", commands.Basic.Properties(delivery_mode=2), b"m%d" % i)
        core.publish(vhost, vhost.exchange("amq.fanout"), message)
        if i % 4096 == 0:
            await asyncio.sleep(0)
    await settle()
    queue = vhost.queue("q")
    if not durable:  # a transient queue pages when memory runs short
        queue.page_out(WINDOW)
    assert queue.paged > 2 * DROP_BATCH
    held = core.get_local(vhost, "q", no_ack=False)[1]  # a consumer's, unacked
    assert core.delete_queue(vhost, "q") == count - 1
    assert core.pager.dropping  # not done at once
    assert await dropped(core) >= 3
    if durable:  # the held message: its reference from "q" is the consumer's to release, "other" has its own
        assert core.persistence.store.index[held.message.msg_id].refs == 2
    queue.settle([held])
    assert drain(core, vhost, "other") == [b"m%d" % i for i in range(count)]
    core.persistence.commit_now()
    assert core.persistence.store.stats().messages == 0 and core.pager.store.stats().messages == 0
    assert core.persistence.index.queue_ids() == set()


async def test_a_drop_left_at_shutdown_is_finished_before_the_store_is_closed(tmp_path):
    """A clean shutdown finishes deleted queues' drops first: its store snapshot counts references no index
    row holds any more, so nothing of the deleted queue is left on disk after a restart."""
    data = str(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(40_000))
    await settle()
    core.delete_queue(vhost, "q")
    assert core.pager.dropping
    core.close()
    core = Broker(data, queue_window=WINDOW)
    try:
        assert core.persistence.store.stats().messages == 0
        assert core.persistence.index.queue_ids() == set()
    finally:
        core.close()


@pytest.mark.parametrize("max_priority", [None, 5])
async def test_a_purged_deep_queue_is_dropped_in_the_background(core, vhost, max_priority):
    """A purge answers with the count at once and every reader sees an empty queue at once; its entries on disk
    leave the index a batch per loop turn (a million held every client for seconds), marked dropped until
    they have.  What is published meanwhile, and pages out, is all a consumer gets."""
    from amqp_server.queues.paging import DROP_BATCH

    arguments = {"x-max-priority": max_priority} if max_priority else None
    core.declare_queue(vhost, "q", durable=True, arguments=arguments)
    queue = vhost.queue("q")
    count = 3 * DROP_BATCH
    send(core, vhost, "q", bodies(count))
    await settle()
    assert queue.paged > 2 * DROP_BATCH
    held = core.get_local(vhost, "q", no_ack=False)[1]
    index = core.persistence.index
    assert core.purge_local(vhost, "q") == count - 1
    assert queue.message_count == 0 and queue.peek(0, 5) == [] and core.get_local(vhost, "q", no_ack=True)[1] is None
    assert core.pager.dropping and len(index.dropped(queue.index_id)) == 1
    send(core, vhost, "q", bodies(100, "new"))
    queue.page_out(WINDOW)
    assert await dropped(core) >= 3
    assert index.dropped(queue.index_id) == []
    queue.settle([held])
    assert drain(core, vhost, "q") == bodies(100, "new")
    core.persistence.commit_now()
    assert core.persistence.store.stats().messages == 0 and index.queue_ids() == set()


@pytest.mark.parametrize("crashed", [False, True])
async def test_a_purge_cut_short_by_a_stop_is_finished_at_the_next_start(tmp_path, crashed):
    """A node stopping before a purge's entries on disk are gone drops them at its next start, before it counts
    anything (the drop marks name them): no purged message comes back.  Whether it stopped cleanly (its store
    snapshot counted their references, released then) or crashed (the store counts references from the
    index).  The messages a consumer held unacked when the queue was purged come back, as after any restart."""
    from amqp_server.queues.paging import DROP_BATCH

    data = str(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(4 * DROP_BATCH))
    await settle()
    held = [taken(core, vhost, "q") for _ in range(3)]
    assert core.purge_local(vhost, "q") == 4 * DROP_BATCH - 3
    send(core, vhost, "q", bodies(10, "new"))
    await asyncio.sleep(0)
    assert core.pager.dropping
    stop_before_the_drop_is_done(core)
    core.close()
    if crashed:
        as_after_a_crash(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    try:
        vhost = core.vhost("/")
        assert vhost.queue("q").message_count == 13
        assert drain(core, vhost, "q") == [entry.message.body for entry in held] + bodies(10, "new")
        core.persistence.commit_now()
        assert core.persistence.store.stats().messages == 0
        assert core.persistence.index.queue_ids() == set()
    finally:
        core.close()


@pytest.mark.parametrize("crashed", [False, True])
@pytest.mark.parametrize("stage", ["counting", "dropping"])
async def test_a_commit_cut_short_by_a_stop_is_finished_at_the_next_start(tmp_path, monkeypatch, stage, crashed):
    """A drop mark names the entries on disk a commit removed until they are gone: a node stopped while it counted
    them (the answer not yet sent) or while their rows went in the background drops the rest when it starts
    again, so what was committed is never delivered, read or counted, and a retried commit (a no-op: the cursor
    is there already) finds it done.  Messages a consumer held unacked below the cursor were in memory, not in
    the mark's range: they come back."""
    from amqp_server.queues.paging import DROP_BATCH

    monkeypatch.setattr("amqp_server.queues.ready_list.COUNT_BATCH", DROP_BATCH)
    data = str(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(4 * DROP_BATCH))
    await settle()
    held = [taken(core, vhost, "q").message.body for _ in range(3)]
    commit = asyncio.ensure_future(Commit(core).commit_offset(local(vhost.queue("q")), 3 * DROP_BATCH))
    await asyncio.sleep(0)
    assert not commit.done() and local(vhost.queue("q")).committed_drops == 0
    if stage == "dropping":
        assert await commit == 3 * DROP_BATCH - 3
        assert core.pager.dropping
        stop_before_the_drop_is_done(core)
    commit.cancel()
    core.close()
    if crashed:  # the store counts references from the index
        as_after_a_crash(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    try:
        vhost = core.vhost("/")
        queue = classic(vhost.queue("q"))
        assert queue.message_count == DROP_BATCH + 3
        assert await Commit(core).commit_offset(queue, 3 * DROP_BATCH) == 0
        assert drain(core, vhost, "q") == held + bodies(4 * DROP_BATCH)[3 * DROP_BATCH:]
        core.persistence.commit_now()
        assert core.persistence.store.stats().messages == 0
    finally:
        core.close()


async def test_messages_unacked_below_a_finished_commit_come_back_after_a_restart(tmp_path):
    """A restart drops what a commit left on disk only if one was under way: messages a consumer held unacked
    below the cursor come back, as a requeue would bring them (left for the next commit covering them)."""
    data = str(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(3000))
    await settle()
    held = [taken(core, vhost, "q") for _ in range(5)]
    assert [entry.seq for entry in held] == list(range(5))
    assert await Commit(core).commit_offset(local(vhost.queue("q")), 2000) == 1995
    core.close()
    core = Broker(data, queue_window=WINDOW)
    try:
        vhost = core.vhost("/")
        assert vhost.queue("q").message_count == 1005
        assert drain(core, vhost, "q") == bodies(5) + bodies(3000)[2000:]
    finally:
        core.close()


async def test_a_cursor_saved_past_the_tail_comes_back_at_the_tail(tmp_path):
    """A commit cursor an older node saved past the tail (it took any offset) is read back at the tail, so later
    messages can be committed."""
    data = str(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(3))
    await settle()
    local(vhost.queue("q")).committed = 2 ** 64 - 1  # as an older node left it: saved at the stop
    core.close()
    core = Broker(data, queue_window=WINDOW)
    try:
        vhost = core.vhost("/")
        queue = classic(vhost.queue("q"))
        assert queue.committed == 3 and queue.offsets() == (0, 3)
        send(core, vhost, "q", bodies(2, "late"))
        assert await Commit(core).commit_offset(queue, 4) == 4 and drain(core, vhost, "q") == [b"late1"]
    finally:
        core.close()


@pytest.mark.parametrize("fsyncing", [False, True])
async def test_a_stop_leaves_no_group_commit_behind(tmp_path, caplog, fsyncing):
    """The node stops with a group commit due (its changes are made durable by the stop itself) or with one's
    fsync under way in its thread (the files stay open until it is done): neither runs on closed files,
    which failed and logged the disk untrustworthy at every stop."""
    core = Broker(str(tmp_path / "data"), queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    with caplog.at_level(logging.CRITICAL):
        send(core, vhost, "q", bodies(20_000))
        if fsyncing:
            await asyncio.sleep(0)  # the group commit starts its fsync
            assert core.persistence.synced < core.persistence.batch - 1  # under way
        core.close()
        await asyncio.sleep(0.1)  # what was due, or the fsync's answer, comes after the stop
    assert "group commit" not in caplog.text
    core = Broker(str(tmp_path / "data"), queue_window=WINDOW)
    assert core.vhost("/").queue("q").message_count == 20_000
    core.close()


async def test_restart_reads_totals_and_pages_in_lazily(tmp_path):
    data = str(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    core.declare_queue(vhost, "p", durable=True, arguments={"x-max-priority": 5})
    send(core, vhost, "q", bodies(300))
    send(core, vhost, "q", bodies(10, "gone"), persistent=False)  # a durable queue's transient entries
    send(core, vhost, "p", [b"low"], priority=1)
    send(core, vhost, "p", [b"high"], priority=4)
    await settle()
    core.close()

    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    queue = classic(vhost.queue("q"))
    assert queue.message_count == 300 and len(queue.ready) == 0  # counted from the index's totals
    assert queue.next_seq == 310
    assert drain(core, vhost, "q") == bodies(300)
    assert drain(core, vhost, "p") == [b"high", b"low"]  # in priority order, paged in level by level
    core.close()


async def test_move_from_a_deep_transient_tail_into_a_queue_that_pages_it_again(core, vhost):
    """A message paged in from the transient store and moved to another queue is that queue's own: when the
    first queue releases its record, the second still has the message, and pages it out with a record of
    its own."""
    core.declare_queue(vhost, "src")
    core.declare_queue(vhost, "dst", durable=True)
    send(core, vhost, "src", bodies(100), persistent=False)
    core.pager.page_out([vhost.queue("src")], keep=5)
    assert core.move_messages(vhost.queue("src"), vhost.queue("dst")) == 100
    dst = vhost.queue("dst")
    assert dst.paged > 0 and dst.message_count == 100
    assert drain(core, vhost, "dst") == bodies(100)
    core.pager.index.commit()
    assert core.pager.store.stats().messages == 0


@pytest.mark.timeout(60)
def test_a_deep_queue_through_amqp_and_http(start_broker):
    """A node whose durable queues keep 16 messages in memory: the HTTP API's counts, peek, get, the Spark
    bridge's offsets, records and commit, and AMQP consumers all see the part on disk."""
    import pyarrow as pa
    import pika

    from test_mgmt_api import call

    node = start_broker("--queue-window", "16")
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.queue_declare("deep", durable=True)
    channel.confirm_delivery()
    for i in range(300):
        channel.basic_publish("", "deep", b"m%d" % i, pika.BasicProperties(delivery_mode=2 if i % 3 else 1))
    shown = call(node, "GET", "/api/queues/%2F/deep").json
    assert shown["messages"] == 300 and shown["messages_paged_out"] >= 284 and shown["messages_ram"] <= 16
    peeked = call(node, "GET", "/api/queues/%2F/deep/peek?offset=250&count=3").json
    assert [m["payload"] for m in peeked] == ["m250", "m251", "m252"]
    offsets = call(node, "GET", "/api/queues/%2F/deep/offsets").json
    assert (offsets["head"], offsets["tail"], offsets["messages"]) == (0, 300, 300)
    raw = call(node, "GET", "/api/queues/%2F/deep/records?start=10&end=290&batch=50").raw
    table = pa.ipc.open_stream(raw).read_all()
    assert table.column("offset").to_pylist() == list(range(10, 290))
    assert table.column("body").to_pylist()[:2] == [b"m10", b"m11"]
    assert call(node, "POST", "/api/queues/%2F/deep/commit", {"offset": 200}).json["removed"] == 200
    got = call(node, "POST", "/api/queues/%2F/deep/get", {"count": 2, "ackmode": "ack_requeue_true",
                                                          "encoding": "auto"}).json
    assert [m["payload"] for m in got] == ["m200", "m201"]
    bodies = []
    channel.basic_qos(prefetch_count=10)
    for method, _props, body in channel.consume("deep", inactivity_timeout=2):
        if method is None:
            break
        bodies.append(body)
        channel.basic_ack(delivery_tag(method))
    assert bodies == [b"m%d" % i for i in range(200, 300)]
    assert call(node, "GET", "/api/queues/%2F/deep").json["messages"] == 0
    connection.close()


async def test_restart_after_a_crash_drops_entries_whose_message_the_store_lost(tmp_path, caplog):
    data = tmp_path / "data"
    core = Broker(str(data), persistence=Persistence(str(data), segment_size=4096), queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "q", durable=True)
    send(core, vhost, "q", bodies(200))
    await settle()
    core.close()
    as_after_a_crash(data)
    store = data / "msg_store_persistent"
    (store / "00000002.seg").unlink()  # and one segment is gone (a damaged disk)
    (store / "00000002.idx").unlink()

    with caplog.at_level(logging.INFO):
        core = Broker(str(data), persistence=Persistence(str(data), segment_size=4096), queue_window=WINDOW)
    vhost = core.vhost("/")
    found = re.search(r"(\d+) missing", caplog.text)
    assert found is not None
    lost = int(found.group(1))
    assert vhost.queue("q").message_count == 200 - lost and lost > 0  # dropped at the walk, counted out
    got = drain(core, vhost, "q")
    assert "is missing from the store" not in caplog.text  # none was left for paging in to meet
    assert 0 < len(got) < 200 and got == [b for b in bodies(200) if b in set(got)]  # in order, gaps only
    assert vhost.queue("q").message_count == 0
    core.close()


async def test_deep_queues_share_a_memory_budget(tmp_path, monkeypatch):
    """One deep queue keeps its whole window; many share MEMORY_BUDGET entries."""
    import amqp_server.queues.paging as paging

    monkeypatch.setattr(paging, "MEMORY_BUDGET", 1024)
    core = Broker(str(tmp_path / "data"), queue_window=512)
    core.pager.share = paging.MEMORY_BUDGET
    vhost = core.vhost("/")
    names = [f"q{i}" for i in range(8)]
    for name in names:
        core.declare_queue(vhost, name, durable=True)
        send(core, vhost, name, bodies(1000, name))
    assert len(classic(vhost.queue("q0")).ready) > 128  # paged while it was the only deep queue
    for name in names:
        send(core, vhost, name, [b"last"])  # each enqueue trims to the share
    assert core.pager.share == 128
    assert all(len(classic(vhost.queue(name)).ready) <= 128 for name in names)
    for name in names:
        assert drain(core, vhost, name) == bodies(1000, name) + [b"last"]
    core.pager.housekeeping()
    assert core.pager.share == 1024  # none is deep now
    core.close()


async def test_a_consumed_queue_keeps_more_in_memory_until_its_consumers_leave(core, vhost):
    core.declare_queue(vhost, "q", durable=True)
    queue = vhost.queue("q")
    target = Target()
    consumer = consume(core, vhost, "q", target, "c", prefetch=1)  # takes one, the rest stays ready
    send(core, vhost, "q", bodies(500))
    assert queue.paged == 0 and len(queue.ready) == 499  # consumers must not wait on the disk
    core.remove_consumer(consumer)
    core.settle_taken(target.held, requeue=True)
    send(core, vhost, "q", [b"last"])  # no consumer: back to the window
    assert len(queue.ready) <= WINDOW and queue.paged > 0
    assert drain(core, vhost, "q") == bodies(500) + [b"last"]


def test_queue_window_option_is_checked(capsys):
    from amqp_server import config

    assert config.load([], {}).queue_window == 2048
    assert config.load(["--queue-window", "100"], {}).queue_window == 100
    for bad in ("0", "-5", "many"):
        with pytest.raises(SystemExit):
            config.load(["--queue-window", bad], {})
        assert "queue_window" in capsys.readouterr().err


# -- priority queues: each level pages as a plain queue does ----------------------------------------

def send_levels(core: Broker, vhost: VHost, queue: str, levels: list[int], persistent: bool = True,
                prefix: str = "m", **props) -> list[tuple[int, bytes]]:
    """One message per level in ``levels``, bodies ``{prefix}{i}``; returns (level, body) in publish order."""
    sent = []
    for i, level in enumerate(levels):
        body = f"{prefix}{i}".encode()
        send(core, vhost, queue, [body], persistent, priority=level, **props)
        sent.append((level, body))
    return sent


def by_priority(sent: list[tuple[int, bytes]], maximum: int) -> list[bytes]:
    """Delivery order: highest level first (levels above the maximum count as the maximum), FIFO within."""
    order = sorted(range(len(sent)), key=lambda i: (-min(sent[i][0], maximum), i))
    return [sent[i][1] for i in order]


PRIORITIES = {"x-max-priority": 9}
MIXED_LEVELS = [(i * 7) % 12 for i in range(600)]  # 0..11: 10 and 11 count as 9


@pytest.mark.parametrize("persistent", [True, False])
async def test_a_deep_priority_queue_keeps_a_window_and_delivers_in_priority_order(core, vhost, persistent):
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    queue = vhost.queue("p")
    sent = send_levels(core, vhost, "p", MIXED_LEVELS, persistent)
    assert len(queue.ready) <= WINDOW and queue.paged == 600 - len(queue.ready)
    assert queue.message_count == 600
    await settle()
    got = []
    while (entry := core.get_local(vhost, "p", no_ack=True)[1]) is not None:
        got.append(entry.message.body)
        assert len(queue.ready) <= 2048  # a level pages in a batch at a time, never the whole queue
    assert got == by_priority(sent, 9)
    assert queue.message_count == 0 and queue.ready_bytes == 0 and queue.paged == 0
    core.persistence.commit_now()
    core.pager.index.commit()
    assert core.persistence.index.queue_ids() == set()
    assert core.persistence.store.stats().messages == 0 and core.pager.store.stats().messages == 0


async def test_a_high_priority_message_deep_in_the_tail_comes_first_without_the_rest(core, vhost):
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    queue = vhost.queue("p")
    send(core, vhost, "p", bodies(3000), priority=1)
    send(core, vhost, "p", [b"urgent"], priority=8)
    send(core, vhost, "p", bodies(10, "after"), priority=1)
    assert queue.paged > 2900
    assert core.get_local(vhost, "p", no_ack=True)[1].message.body == b"urgent"
    assert len(queue.ready) <= 2 * WINDOW  # the level below stayed on disk
    assert drain(core, vhost, "p") == bodies(3000) + bodies(10, "after")


async def test_priority_requeues_consumers_and_pages_interleave(core, vhost):
    """Consumers take some, give some back, the queue pages out and in meanwhile: every message once, each
    level in order, redelivered ones back in their place."""
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    queue = vhost.queue("p")
    sent = send_levels(core, vhost, "p", MIXED_LEVELS[:300])
    target = Target()
    consumer = consume(core, vhost, "p", target, "c", prefetch=40)
    taken = list(target.held)
    core.remove_consumer(consumer)
    sent += send_levels(core, vhost, "p", MIXED_LEVELS[300:], prefix="n")
    queue.page_out(3)
    core.settle_taken(taken, requeue=True)  # back in place, in memory, ahead of their levels' disk part
    queue.page_out(3)
    got = drain(core, vhost, "p")
    assert got == by_priority(sent, 9)


async def test_priority_ttl_on_disk_expires_and_dead_letters(core, vhost):
    core.declare_queue(vhost, "dlq", durable=True)
    core.declare_queue(vhost, "p", durable=True, arguments={
        **PRIORITIES, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    queue = vhost.queue("p")
    send(core, vhost, "p", bodies(40, "keep"), priority=2)
    send(core, vhost, "p", bodies(30, "short"), priority=5, expiration="50")
    send(core, vhost, "p", bodies(40, "tail"), priority=0)
    assert queue.paged > 60
    await asyncio.sleep(0.3)
    assert queue.message_count == 80
    assert vhost.queue("dlq").message_count == 30
    assert drain(core, vhost, "p") == bodies(40, "keep") + bodies(40, "tail")
    assert sorted(drain(core, vhost, "dlq")) == sorted(bodies(30, "short"))


async def test_priority_ttl_of_entries_paged_in_and_out_again(core, vhost, monkeypatch):
    clock = [now_ms()]  # the queue's clock, moved by the test: a slow publish on a loaded machine expires nothing
    for module in (expiry, queue_module):
        monkeypatch.setattr(module, "now_ms", lambda: clock[0])
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    queue = vhost.queue("p")
    send(core, vhost, "p", bodies(100, "x"), priority=3, expiration="100")
    send(core, vhost, "p", bodies(100, "k"), priority=1)
    assert core.get_local(vhost, "p", no_ack=True)[1].message.body == b"x0"  # level 3 pages in
    queue.page_out(2)
    clock[0] += 200
    await asyncio.sleep(0.3)  # the expiry timer (due in 0.1 s) runs first
    assert queue.message_count == 100
    assert drain(core, vhost, "p") == bodies(100, "k")


@pytest.mark.parametrize("how", ["committed", "expired"])
async def test_a_priority_level_that_left_the_disk_otherwise_than_paged_in_takes_new_entries_once(
        core, vhost, monkeypatch, how):
    """A level's whole part on disk goes without a page-in (a commit, TTL): nothing is on disk any more, so no
    level is; its next message goes to memory, and no page-in of the level reads that message's row back as
    ready (it was delivered twice)."""
    clock = [now_ms()]
    for module in (expiry, queue_module):
        monkeypatch.setattr(module, "now_ms", lambda: clock[0])
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    queue = vhost.queue("p")
    send(core, vhost, "p", bodies(100), priority=1, expiration="100" if how == "expired" else None)
    assert queue.paged > 0
    if how == "committed":
        queue.remove_upto(100)
    else:
        clock[0] += 200
        queue.expire_due()
    assert queue.message_count == 0 and queue.paged == 0
    send(core, vhost, "p", [b"x"], priority=1)
    send(core, vhost, "p", [b"y"], priority=1, expiration="100000")
    assert drain(core, vhost, "p") == [b"x", b"y"]
    assert queue.message_count == 0 and queue.paged == 0


async def test_a_consumer_of_a_priority_queue_gets_the_levels_below_one_whose_part_on_disk_expired(
        core, vhost, monkeypatch):
    """Level 5's part on disk all expired there while level 1's is on disk too: a page-in finds level 5 empty
    and goes on to level 1, rather than leaving a consumer waiting with 20 messages ready."""
    clock = [now_ms()]
    for module in (expiry, queue_module):
        monkeypatch.setattr(module, "now_ms", lambda: clock[0])
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    queue = vhost.queue("p")
    send(core, vhost, "p", bodies(20), priority=1)
    send(core, vhost, "p", bodies(20, "t"), priority=5, expiration="100")
    queue.page_out(0)
    clock[0] += 200
    queue.expire_due()
    assert queue.message_count == 20 and len(queue.ready) == 0
    target = Target()
    consume(core, vhost, "p", target, "c", no_ack=True)
    assert [body for _, body, _ in target.delivered] == bodies(20)


async def test_priority_peek_offsets_range_reads_and_commit_across_memory_and_disk(core, vhost):
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    queue = vhost.queue("p")
    sent = send_levels(core, vhost, "p", MIXED_LEVELS[:200])
    order = by_priority(sent, 9)
    assert [e.message.body for e in core.peek(queue, 0, 200)] == order
    assert [e.message.body for e in core.peek(queue, 150, 30)] == order[150:180]
    assert queue.offsets() == (0, 200)
    assert [e.message.body for e in queue.browse(5, 195)] == [body for _, body in sent[5:195]]
    batches = list(queue.read_range(0, 200, 7, limit=60))
    assert all(len(b) <= 7 for b in batches) and [e.seq for b in batches for e in b] == list(range(60))
    assert queue.remove_upto(120) == 120
    assert queue.message_count == 80 and queue.offsets() == (120, 200)
    assert drain(core, vhost, "p") == by_priority(sent[120:], 9)


async def test_priority_purge_and_delete_release_everything_on_disk(core, vhost):
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    send_levels(core, vhost, "p", MIXED_LEVELS[:100])
    send_levels(core, vhost, "p", MIXED_LEVELS[:100], persistent=False, prefix="t")
    await settle()
    assert core.purge_local(vhost, "p") == 200
    assert vhost.queue("p").message_count == 0 and vhost.queue("p").paged == 0
    sent = send_levels(core, vhost, "p", MIXED_LEVELS[:100])
    assert drain(core, vhost, "p")[:3] == by_priority(sent, 9)[:3]
    send_levels(core, vhost, "p", MIXED_LEVELS[:100])
    core.delete_queue(vhost, "p")
    await dropped(core)
    core.persistence.commit_now()
    assert core.persistence.store.stats().messages == 0 and core.pager.store.stats().messages == 0
    assert core.persistence.index.queue_ids() == set()


async def test_a_transient_priority_queue_pages_under_memory_pressure(core, vhost):
    core.declare_queue(vhost, "t", arguments=PRIORITIES)
    queue = vhost.queue("t")
    sent = send_levels(core, vhost, "t", MIXED_LEVELS, persistent=False)
    assert queue.paged == 0
    core.pager.page_out(core.all_queues(), keep=10)
    assert len(queue.ready) == 10 and queue.paged == 590
    sent += send_levels(core, vhost, "t", [9, 0], persistent=False, prefix="late")
    assert drain(core, vhost, "t") == by_priority(sent, 9)
    core.pager.index.commit()
    assert core.pager.store.stats().messages == 0


async def test_priority_queue_restart_reads_totals_and_pages_levels_in(tmp_path):
    data = str(tmp_path / "data")
    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    sent = send_levels(core, vhost, "p", MIXED_LEVELS)
    send(core, vhost, "p", [b"gone"], persistent=False, priority=9)
    await settle()
    core.close()

    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    queue = classic(vhost.queue("p"))
    assert queue.message_count == 600 and len(queue.ready) == 0
    assert queue.next_seq == 601
    sent += send_levels(core, vhost, "p", [9, 0], prefix="new")
    assert drain(core, vhost, "p") == by_priority(sent, 9)
    core.close()


async def test_priority_entries_indexed_before_levels_were_keyed_are_rekeyed(tmp_path, monkeypatch):
    """A node upgraded from when a priority queue's index entries were keyed by seq alone (and the queue
    kept them all in memory) finds them, in priority order, and keys them by level once."""
    from amqp_server.queues.queue_type import QueueType
    from amqp_server.queues.types.priority import Priority

    data = str(tmp_path / "data")
    monkeypatch.setattr(Priority, "stored", QueueType.stored)  # writes as before: seq-keyed
    core = Broker(data, queue_window=10_000)
    vhost = core.vhost("/")
    core.declare_queue(vhost, "p", durable=True, arguments=PRIORITIES)
    sent = send_levels(core, vhost, "p", MIXED_LEVELS[:300], expiration="600000")
    await settle()
    core.close()
    monkeypatch.undo()

    core = Broker(data, queue_window=WINDOW)
    vhost = core.vhost("/")
    queue = vhost.queue("p")
    assert queue.message_count == 300
    assert drain(core, vhost, "p") == by_priority(sent, 9)
    core.persistence.commit_now()
    assert core.persistence.index.queue_ids() == set()
    core.close()


@pytest.mark.timeout(90)
def test_a_deep_priority_queue_survives_kill_9(start_broker):
    """Confirmed persistent messages of a priority queue deeper than its window: all back after kill -9, in
    priority order, none twice."""
    import pika

    node = start_broker("--queue-window", "16")
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("pq", durable=True, arguments={"x-max-priority": 5})
    for i, level in enumerate(MIXED_LEVELS):
        channel.basic_publish("", "pq", b"m%d" % i, pika.BasicProperties(delivery_mode=2, priority=level))
    channel.basic_qos(prefetch_count=50)
    held = 0
    for method, _props, _body in channel.consume("pq", inactivity_timeout=2):
        held += 1
        if method is None or held == 50:
            break
    assert held == 50  # taken, never acked: back after the crash
    node.kill()
    node.start()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    assert channel.queue_declare("pq", durable=True, arguments={"x-max-priority": 5}).method.message_count == 600
    got = []
    while (reply := channel.basic_get("pq", auto_ack=True))[0] is not None:
        got.append(reply[2])
    assert got == by_priority([(level, b"m%d" % i) for i, level in enumerate(MIXED_LEVELS)], 5)
    connection.close()


@pytest.mark.timeout(120)
def test_a_purged_deep_queue_stays_purged_after_kill_9(start_broker):
    """kill -9 while a purge's entries on disk are still being dropped (100,000 take about a second in the
    background): after the restart none of them is back, and the messages confirmed after the purge are."""
    import pika

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from amqp_load import Connection, publish_confirmed  # a raw-socket publisher: 100,000 in a second or two

    node = start_broker("--queue-window", "16")
    conn = Connection("127.0.0.1", node.port, "guest", "guest", "/")
    conn.channel_open(1)
    conn.queue_declare(1, "deep", durable=True)
    conn.confirm_select(1)
    publish_confirmed(conn, "deep", b"m" * 16, 100_000, persistent=True, timeout=60)
    conn.close()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    channel.confirm_delivery()
    assert channel.queue_purge("deep").method.message_count == 100_000
    for i in range(5):
        channel.basic_publish("", "deep", b"after%d" % i, pika.BasicProperties(delivery_mode=2))
    node.kill()
    node.start()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    channel = connection.channel()
    assert channel.queue_declare("deep", durable=True).method.message_count == 5
    got = []
    while (reply := channel.basic_get("deep", auto_ack=True))[0] is not None:
        got.append(reply[2])
    assert got == [b"after%d" % i for i in range(5)]
    connection.close()
