"""A queue's components, each alone, in this process: its ready list (in memory and its tail on disk, through a real
pager's transient store and index), a priority queue's ready list, its consumers with x-expires, and its expiry."""
from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
from pamqp import commands

from amqp_server.clock import now_ms
from amqp_server.queues.consumers import Consumers
from amqp_server.queues.expiry import Expiry
from amqp_server.message import Message, make_message
from amqp_server.queues.paging import Pager
from amqp_server.queues.persistence import Persistence, QueueRows
from amqp_server.queues.priority_queue import LeveledEntry, PriorityReadyList
from amqp_server.queues.queue_args import QueueArgs
from amqp_server.queues.ready import Entry
from amqp_server.queues.ready_list import ReadyList, TransientPages
from amqp_server.stats import MessageStats


def message(body: bytes, priority: int | None = None, expiration: str | None = None) -> Message:
    return make_message("", "q", commands.Basic.Properties(priority=priority, expiration=expiration), body)


@pytest.fixture
def pager(tmp_path):
    pager = Pager(str(tmp_path), 1 << 20, None)  # type: ignore[arg-type]  # transient messages only: no persistence
    yield pager
    pager.close()


class Owner:
    """What a ready list reads of its queue (``ReadyOwner``), without the queue: transient, no window."""

    def __init__(self, pager: Pager, **args) -> None:
        self.name, self.vhost, self.args, self.index_id = "q", "/", QueueArgs(**args), 0
        self.persistence: Persistence | None = None
        self.rows: QueueRows | None = None
        self.pager: TransientPages | None = pager
        self.window: int | None = None
        self.deleted = False
        self.stats = MessageStats()
        self.consumers: list[object] = []
        self.host: Any = None
        self.touched = 0

    def touch(self) -> None:
        self.touched += 1

    def row_key(self, entry: Entry) -> int:
        raise AssertionError("asked by the persistent store only, and this queue has none")

    def recover(self, count: int, size: int, last_seq: int | None, expiries: Iterable[tuple[int, int]]) -> None:
        raise AssertionError("a queue recovers from the persistent store only, and this one has none")


def owner(pager: Pager, **args) -> Owner:
    return Owner(pager, **args)


def fill(ready: ReadyList, bodies: list[bytes], start: int = 0) -> list[Entry]:
    entries = [ready.entry_type(start + i, message(body)) for i, body in enumerate(bodies)]
    for entry in entries:
        ready.push(entry)
    return entries


def loaded(pager: Pager, entries) -> list[bytes]:
    for entry in entries:
        if entry.message.body is None:
            pager.load_body(entry.message)
    return [entry.message.body for entry in entries]


def pop_all(ready: ReadyList) -> list[Entry]:
    """Entries in delivery order, as the queue takes them (paging the tail in as the head drains)."""
    taken: list[Entry] = []
    while True:
        if ready.tail.count and ready.page_due():
            ready.page_in()
        if not ready.entries:
            return taken
        entry = ready.entries.popleft()
        ready.bytes -= entry.message.body_size
        taken.append(entry)


BODIES = [b"m%03d" % i for i in range(600)]


def test_a_ready_list_pages_its_tail_out_and_back_in_order(pager):
    ready = ReadyList(owner(pager), {})
    fill(ready, BODIES[:500])
    assert ready.message_count == 500 and ready.bytes == 500 * 4 and not ready.paged
    freed = ready.page_out(100)
    assert freed == 400 * 4 and len(ready) == 100 and ready.paged == 400 and ready.paged_bytes == 400 * 4
    assert ready.message_count == 500 and ready.paged_from == 100
    fill(ready, BODIES[500:], start=500)  # the tail is on disk: new entries join it there
    assert len(ready) == 100 and ready.paged == 500
    assert ready.first_paged(0) == 100 and [row.seq for row in ready.paged_rows(550, 3)] == [550, 551, 552]
    assert loaded(pager, pop_all(ready)) == BODIES
    assert ready.message_count == 0 and ready.bytes == 0 and not ready.paged


def test_a_ready_list_reads_by_seq_across_memory_and_disk_and_peeks_in_order(pager):
    ready = ReadyList(owner(pager), {})
    fill(ready, BODIES[:300])
    ready.page_out(50)
    slices = list(ready.range_slices(40, 70, 7))
    assert [len(part) for part in slices] == [7, 3, 7, 7, 6]  # memory up to the disk's first, then the disk
    assert loaded(pager, [entry for part in slices for entry in part]) == BODIES[40:70]
    assert loaded(pager, ready.peek(45, 10)) == BODIES[45:55]
    after = ready.peek(0, 1, after=ready.entries[-1])
    assert [entry.seq for entry in after] == [50]


def test_a_commit_removes_from_memory_now_and_counts_the_disk_later(pager):
    own = owner(pager)
    ready = ReadyList(own, {})
    fill(ready, BODIES[:300])
    ready.page_out(100)
    assert ready.remove_below(150) == 100  # those in memory now
    assert ready.disk_floor == 150 and ready.message_count == 200  # those on disk still counted till counted
    while ready.count_committed():
        pass
    assert ready.committed_drops == 50 and own.stats.ack == 50 and own.touched
    assert ready.message_count == 150 and ready.paged_from == 150
    assert loaded(pager, pop_all(ready)) == BODIES[150:300]


def test_a_ready_list_that_drops_at_once_and_a_purge(pager):
    ready = ReadyList(owner(pager), {}, drops_later=False)
    fill(ready, BODIES[:300])
    ready.page_out(100)
    assert ready.remove_below(150) == 150 and ready.message_count == 150
    ready.purge(300)
    assert ready.message_count == 0 and ready.bytes == 0 and len(ready) == 0 and not ready.paged


def test_a_ready_list_that_does_not_page_keeps_everything_in_memory(pager):
    ready = ReadyList(owner(pager), {}, pages=False)
    fill(ready, BODIES[:300])
    assert ready.page_out(10) == 0 and len(ready) == 300


def test_a_requeued_entry_goes_back_in_its_place_and_gone_entries_are_compacted_away(pager):
    ready = ReadyList(owner(pager), {})
    entries = fill(ready, BODIES[:10])
    taken = [ready.entries.popleft() for _ in range(3)]
    ready.put_back(taken[1])
    assert [entry.seq for entry in ready] == [1, 3, 4, 5, 6, 7, 8, 9]
    entries[5].gone = entries[6].gone = True
    ready.gone = 2
    held = ready.entries
    ready.compact()
    assert ready.entries is held and [entry.seq for entry in ready] == [1, 3, 4, 7, 8, 9] and ready.gone == 0


def test_the_queue_keeps_apart_what_it_asks_and_marks_returned_entries_redelivered(pager):
    ready = ReadyList(owner(pager), {})
    fill(ready, BODIES[:20])
    ready.page_out(5)
    apart: list[Entry] = []

    def keep_apart(entry: Entry) -> bool:
        if entry.seq in (6, 7):
            apart.append(entry)
            return True
        return False

    ready.keep_apart = keep_apart
    ready.returned = lambda seq: seq == 9
    ready.page_in()
    assert [entry.seq for entry in apart] == [6, 7]
    assert [entry.seq for entry in ready] == [0, 1, 2, 3, 4, 5, *range(8, 20)]
    assert [entry.seq for entry in ready if entry.redelivered] == [9]


def leveled(seq: int, level: int) -> LeveledEntry:
    return LeveledEntry(seq, message(b"p%d-%d" % (level, seq), priority=level))


def test_a_priority_ready_list_delivers_the_highest_level_first_and_reads_in_seq_order(pager):
    ready = PriorityReadyList(owner(pager, max_priority=5), {}, 5)
    levels = [0, 3, 9, 3, 0, 5, 1]  # 9 is capped at 5
    for seq, level in enumerate(levels):
        ready.push(leveled(seq, level))
    assert [entry.seq for entry in ready] == [2, 5, 1, 3, 6, 0, 4]
    assert [entry.seq for entry in ready.from_seq(2)] == [2, 3, 4, 5, 6]
    assert [entry.seq for entry in ready.span(1, 5)] == [1, 2, 3, 4]
    high, low = ready.entries.levels[5][0], ready.entries.levels[0][0]
    assert isinstance(high, LeveledEntry) and isinstance(low, LeveledEntry)  # (pushed so)
    assert ready.row_key(high) < ready.row_key(low)  # level first
    assert [entry.seq for entry in pop_all(ready)] == [2, 5, 1, 3, 6, 0, 4]


def test_a_priority_ready_list_pages_its_lowest_levels_out_and_each_level_back_in_order(pager):
    ready = PriorityReadyList(owner(pager, max_priority=2), {}, 2)
    for seq in range(600):
        ready.push(leveled(seq, seq % 3))
    ready.page_out(100)  # lowest levels first: all of 0 and 1 go, 2 keeps 100
    assert ready.on_disk == [True, True, True] and len(ready) == 100 and ready.message_count == 600
    ready.push(leveled(600, 0))  # its level's tail is on disk: it joins it there
    assert len(ready) == 100
    expected = [seq for level in (2, 1, 0) for seq in range(601) if seq % 3 == level]
    taken = pop_all(ready)
    assert [entry.seq for entry in taken] == expected
    assert loaded(pager, taken[:2]) == [b"p2-2", b"p2-5"]
    assert ready.message_count == 0 and not ready.paged and ready.on_disk == [False, False, False]


def test_a_priority_ready_list_commits_and_purges_across_its_levels(pager):
    ready = PriorityReadyList(owner(pager, max_priority=2), {}, 2)
    for seq in range(300):
        ready.push(leveled(seq, seq % 3))
    ready.page_out(50)
    assert ready.remove_below(150) == 150 and ready.message_count == 150  # at once: its levels interleave
    assert sorted(entry.seq for entry in pop_all(ready)) == list(range(150, 300))
    for seq in range(300, 400):
        ready.push(leveled(seq, seq % 3))
    ready.page_out(10)
    ready.purge(400)
    assert ready.message_count == 0 and not ready.paged and not any(ready.on_disk)


class FakeConsumer:
    def __init__(self, tag: str, priority: int = 0) -> None:
        self.tag, self.priority = tag, priority


def test_consumers_are_grouped_by_priority_in_registration_order():
    consumers = Consumers(QueueArgs(), lambda: None)
    a, b, c, d = FakeConsumer("a"), FakeConsumer("b", 5), FakeConsumer("c"), FakeConsumer("d", 5)
    for consumer in (a, b, c, d):
        consumers.join(consumer)
    assert list(consumers) == [a, b, c, d] and consumers.had_consumer
    assert [(group.priority, [x.tag for x in group.consumers]) for group in consumers.groups] == [
        (5, ["b", "d"]), (0, ["a", "c"])]
    consumers.groups[0].rr = 2
    assert consumers.leave(b) and consumers.groups[0].rr == 1  # round-robin resumes where it was
    assert not consumers.leave(b)
    consumers.leave(d)
    assert [group.priority for group in consumers.groups] == [0]


def test_a_single_active_consumer_hands_over_to_the_highest_priority_then_the_earliest():
    consumers = Consumers(QueueArgs(single_active_consumer=True), lambda: None)
    a, b, c = FakeConsumer("a"), FakeConsumer("b", 3), FakeConsumer("c", 3)
    for consumer in (a, b, c):
        consumers.join(consumer)
    assert consumers.active is a and [group.consumers for group in consumers.groups] == [[a]]
    consumers.leave(a)
    assert consumers.active is b
    consumers.leave(c)
    assert consumers.active is b
    consumers.leave(b)
    assert consumers.active is None and consumers.groups == [] and not consumers
    consumers.reset()
    assert consumers.had_consumer


async def test_x_expires_runs_out_only_without_consumers():
    unused = []
    consumers = Consumers(QueueArgs(expires=30), lambda: unused.append(1))
    consumers.touch()
    consumers.join(FakeConsumer("a"))
    await asyncio.sleep(0.06)
    assert not unused  # a consumer keeps it
    consumers.leave(consumers[0])
    consumers.touch()
    await asyncio.sleep(0.06)
    assert unused == [1]
    consumers.touch()
    consumers.set_args(QueueArgs())  # x-expires cleared: the countdown stops
    await asyncio.sleep(0.06)
    assert unused == [1]


def test_an_expiry_is_the_lower_of_the_queues_ttl_and_the_messages_expiration():
    before = now_ms()
    assert Expiry.deadline(None, message(b"x")) == 0
    assert before + 1000 <= Expiry.deadline(1000, message(b"x")) <= now_ms() + 1000
    assert Expiry.deadline(1000, message(b"x", expiration="10")) <= now_ms() + 10
    assert Expiry.deadline(10, message(b"x", expiration="1000")) <= now_ms() + 10


async def test_an_expiry_calls_its_queue_when_a_deadline_passes_and_not_once_stopped():
    fired: list[list[int]] = []
    expiry: Expiry

    def due() -> None:
        fired.append(sorted(expiry.pop_due(now_ms())))
        expiry.arm()

    expiry = Expiry(due)
    entry = Entry(1, message(b"a"), expiry=now_ms() + 20)
    expiry.track(entry, 1)
    expiry.schedule(now_ms() + 10, 7)  # an entry on disk: a deadline, no entry in memory
    expiry.schedule(now_ms() + 5000, 8)
    assert expiry.expiring == {1: entry} and not expiry.is_due(now_ms())
    await asyncio.sleep(0.08)
    assert fired == [[7], [1]] or fired == [[1, 7]]
    expiry.clear()
    assert not expiry.expiring and not expiry.is_due(now_ms() + 10_000)
    expiry.stop()
    expiry.schedule(now_ms(), 9)
    await asyncio.sleep(0.03)
    assert sum(map(len, fired)) == 2  # stopped: no timer any more


def test_consumer_groups_are_kept_in_descending_priority_whatever_the_order_they_came_in():
    consumers = Consumers(QueueArgs(), lambda: None)
    joined = [FakeConsumer("one", 1), FakeConsumer("ten", 10), FakeConsumer("five", 5), FakeConsumer("neg", -3),
              FakeConsumer("ten-b", 10)]
    for consumer in joined:
        consumers.join(consumer)
    assert [(group.priority, [x.tag for x in group.consumers]) for group in consumers.groups] == [
        (10, ["ten", "ten-b"]), (5, ["five"]), (1, ["one"]), (-3, ["neg"])]
    consumers.groups[0].rr = 1
    consumers.leave(joined[4])  # after where round-robin resumes: it stays
    assert consumers.groups[0].rr == 1


async def test_a_stopped_x_expires_countdown_never_fires():
    unused: list[int] = []
    consumers = Consumers(QueueArgs(expires=20), lambda: unused.append(1))
    consumers.touch()
    consumers.stop()
    await asyncio.sleep(0.05)
    assert unused == []
    consumers.touch()  # used again: the countdown runs anew
    await asyncio.sleep(0.05)
    assert unused == [1]


async def test_an_expiry_hands_back_only_the_deadlines_passed_earliest_first():
    expiry = Expiry(lambda: None)
    try:
        for deadline, key in ((300, 3), (100, 1), (200, 2), (10_000, 4)):
            expiry.schedule(deadline, key)
        assert expiry.is_due(150) and not expiry.is_due(50)
        assert list(expiry.pop_due(250)) == [1, 2]
        assert list(expiry.pop_due(250)) == [] and expiry.is_due(300)
    finally:
        expiry.stop()


def test_a_ready_list_counts_what_it_holds_in_memory_and_on_disk_and_a_clear_forgets_all(pager):
    ready = ReadyList(owner(pager), {})
    fill(ready, [b"a", b"bb", b"ccc", b"dddd"])
    assert (ready.message_count, ready.bytes, len(ready)) == (4, 10, 4)
    assert ready.page_out(1) == 9  # the bytes that left memory
    assert (ready.message_count, len(ready), ready.paged, ready.paged_bytes) == (4, 1, 3, 9)
    ready.clear()
    assert (ready.message_count, ready.bytes, len(ready), ready.paged, ready.paged_bytes) == (0, 0, 0, 0, 0)


def test_a_priority_ready_list_puts_a_requeued_entry_back_in_front_of_its_own_level(pager):
    ready = PriorityReadyList(owner(pager, max_priority=5), {}, 5)
    for seq, level in enumerate([1, 5, 1, 5]):
        ready.push(leveled(seq, level))
    taken = pop_all(ready)
    assert [entry.seq for entry in taken] == [1, 3, 0, 2]
    for entry in reversed(taken[:3]):  # newest first, as a channel closing requeues
        ready.put_back(entry)
    assert [entry.seq for entry in ready] == [1, 3, 0]
