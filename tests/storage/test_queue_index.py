"""Unit tests of queue_index: staged publish/delivered/ack over LMDB, and the expiry heap."""
from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_index import ExpiryHeap, IndexEntry, QueueIndex, Totals
from queue_index import index as index_module


@pytest.fixture
def index(tmp_path):
    idx = QueueIndex(str(tmp_path / "index"), map_size=1 << 24)
    yield idx
    idx.close()


def seqs(index: QueueIndex, queue_id: int) -> list[int]:
    return [e.seq for e in index.entries(queue_id)]


def kept_totals(index: QueueIndex, queue_id: int) -> Totals:
    """The queue's totals, which the index keeps from a queue's first commit on."""
    totals = index.totals(queue_id)
    assert totals is not None
    return totals


def test_publish_commit_entries_in_seq_order_per_queue(index):
    rng = random.Random(3)
    expected: dict[int, list[int]] = {1: [], 2: [], 3: []}
    order = [(q, s) for q in expected for s in range(1, 60)]
    rng.shuffle(order)  # staged out of order, across queues
    for queue_id, seq in order:
        index.publish(queue_id, seq, msg_id=queue_id * 1000 + seq, expiry=seq * 7, size=seq + 1)
        expected[queue_id].append(seq)
    assert index.pending
    assert list(index.entries(1)) == []  # nothing before commit
    index.commit()
    assert not index.pending
    for queue_id, want in expected.items():
        entries = list(index.entries(queue_id))
        assert [e.seq for e in entries] == sorted(want)
        for e in entries:
            assert e == IndexEntry(e.seq, queue_id * 1000 + e.seq, e.seq * 7, e.seq + 1, False)
    assert list(index.entries(4)) == []
    assert list(index.entries(0)) == []


def test_entries_of_one_queue_never_leak_into_the_next(index):
    # big seqs in queue 1, tiny in queue 2: key ordering must keep them apart
    index.publish(1, 2**63, 1, 0, 1)
    index.publish(1, 0xFFFFFFFF, 2, 0, 1)
    index.publish(2, 0, 3, 0, 1)
    index.publish(256, 1, 4, 0, 1)  # queue ids differing only in a higher byte
    index.commit()
    assert seqs(index, 1) == [0xFFFFFFFF, 2**63]
    assert seqs(index, 2) == [0]
    assert seqs(index, 256) == [1]
    assert seqs(index, 0) == []
    index.delete_queue(1)
    assert seqs(index, 2) == [0]
    assert seqs(index, 1) == []


def test_seq_order_is_numeric_not_insertion(index):
    for seq in (300, 2, 70000, 1, 256):
        index.publish(5, seq, seq, 0, 0)
    index.commit()
    assert seqs(index, 5) == [1, 2, 256, 300, 70000]


def test_ack_removes_committed_entry(index):
    for seq in range(1, 6):
        index.publish(1, seq, seq, 0, 10)
    index.commit()
    index.ack(1, 2)
    index.ack(1, 5)
    assert seqs(index, 1) == [1, 2, 3, 4, 5]  # staged only
    index.commit()
    assert seqs(index, 1) == [1, 3, 4]


def test_publish_and_ack_in_one_batch_writes_nothing(index):
    index.publish(1, 1, 11, 0, 1)
    index.publish(1, 2, 12, 0, 1)
    index.ack(1, 1)
    index.ack(1, 2)
    assert not index.pending
    index.commit()
    assert seqs(index, 1) == []
    assert index.queue_ids() == set()


def test_publish_delivered_ack_in_one_batch_writes_nothing(index):
    index.publish(1, 1, 11, 0, 1)
    index.delivered(1, 1, 11, 0, 1)
    index.ack(1, 1)
    assert not index.pending
    index.commit()
    assert seqs(index, 1) == []


def test_delivered_then_ack_of_committed_entry_deletes_it(index):
    """Regression: the staged delivered flag was mistaken for a fresh publish and the ack dropped."""
    index.publish(1, 1, 11, 0, 1)
    index.publish(1, 2, 12, 0, 1)
    index.commit()
    index.delivered(1, 1, 11, 0, 1)
    index.ack(1, 1)
    assert index.pending
    index.commit()
    assert seqs(index, 1) == [2]


def test_delivered_flag_persists(tmp_path):
    path = str(tmp_path / "index")
    index = QueueIndex(path, map_size=1 << 24)
    index.publish(1, 1, 11, 123, 4)
    index.publish(1, 2, 12, 0, 5)
    index.publish(1, 3, 13, 0, 6, delivered=True)
    index.commit()
    index.delivered(1, 2, 12, 0, 5)
    index.commit()
    index.sync()
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    assert list(index.entries(1)) == [
        IndexEntry(1, 11, 123, 4, False),
        IndexEntry(2, 12, 0, 5, True),
        IndexEntry(3, 13, 0, 6, True),
    ]
    index.close()


def test_a_delivery_count_of_any_size_is_kept_and_goes_with_its_entry(tmp_path):
    """The flags held six bits of count: 63 at most, so a count past it came back from a reopen as 63.  Counts
    past 63 are kept apart, read back as they were written, staged or committed, and go with their entries
    (acked, removed, taken, their queue deleted, or counting less again); an entry an earlier version saturated
    at 63 reads 63."""
    path = str(tmp_path / "index")
    index = QueueIndex(path, map_size=1 << 24)
    for seq, returns in enumerate([0, 5, 62, 63, 64, 300, 2 ** 40, 70, 80, 90]):
        index.publish(1, seq, 10 + seq, 0, 4, returns=returns)
    index.delivered(2, 0, 99, 0, 4, returns=1000)
    index.publish(2, 1, 98, 0, 4)
    assert index.peek(1, 5) == IndexEntry(5, 15, 0, 4, False, False, 300)
    index.commit()
    index.mark_returned(2, 1, 77)
    index.commit()
    index.publish(1, 10, 20, 0, 4, returns=index_module.MAX_RETURNS)  # (as an earlier version saturated one)
    index.commit()
    index.sync()
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    assert [entry.returns for entry in index.entries(1)] == [0, 5, 62, 63, 64, 300, 2 ** 40, 70, 80, 90, 63]
    assert [entry.returns for entry in index.read(1, 4, 3)] == [64, 300, 2 ** 40]
    assert [getattr(index.get(2, seq), "returns", None) for seq in (0, 1)] == [1000, 77]
    index.ack(1, 4)
    assert getattr(index.remove(1, 5), "returns", None) == 300
    index.mark_returned(1, 6, 3)  # (less than 63 again: in the flags)
    index.take(1, 7, 9, 10)  # 7 and 8
    index.delete_queue(2)
    index.commit()
    assert [(entry.seq, entry.returns) for entry in index.entries(1)] == [
        (0, 0), (1, 5), (2, 62), (3, 63), (6, 3), (9, 90), (10, 63)]
    assert list(index._counts) == [index_module.KEY.pack(1, 9)]
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    assert list(index._counts) == [index_module.KEY.pack(1, 9)]  # (on disk too: the others' went)
    assert index_module.COUNTS not in index.queue_ids()
    index.close()


def test_delete_queue_drops_committed_and_staged(index):
    for seq in range(1, 4):
        index.publish(1, seq, seq, 0, 1)
        index.publish(2, seq, seq, 0, 1)
    index.commit()
    index.publish(1, 10, 10, 0, 1)  # staged
    index.ack(1, 1)  # staged delete
    index.publish(2, 10, 10, 0, 1)
    index.delete_queue(1)
    index.commit()
    assert seqs(index, 1) == []
    assert seqs(index, 2) == [1, 2, 3, 10]
    assert index.queue_ids() == {2}
    index.delete_queue(7)  # unknown queue: harmless
    index.delete_queue(2)
    assert index.queue_ids() == set()


def test_a_streams_runs_are_kept_beside_its_entries_and_go_with_it(index):
    index.put_mark(5, 0, 0, 1000, 10, 1)
    index.put_mark(5, 1, 4, 2000, 0, 0)
    index.put_mark(6, 0, 0, 3000, 7, 3)  # another stream's
    index.put_mark(5, 1, 4, 2000, 30, 2)  # the run's bytes, final
    index.commit()
    assert index.marks(5) == [(0, 0, 1000, 10, 1), (1, 4, 2000, 30, 2)]
    index.put_mark(5, 2, 9, 4000, 0, 1)  # staged, then the queue is deleted
    index.delete_queue(5)
    index.commit()
    assert index.marks(5) == [] and index.marks(6) == [(0, 0, 3000, 7, 3)]


def test_drop_marks_name_ranges_until_forgotten_and_go_with_their_queue(tmp_path):
    """A purge's drop marks: numbered on from those already on disk after a reopen (a number is never given
    twice to one queue), listed per queue, forgotten one by one, gone with their queue; a queue with drop
    marks and no entry left is still a queue id, so recovery finds it an orphan once it is deleted."""
    path = str(tmp_path / "index")
    index = QueueIndex(path, map_size=1 << 24)
    first = index.mark_dropped(5, 10, 20)
    index.mark_dropped(6, 0, 2 ** 64)  # another queue's, its end capped at the key space
    index.put_mark(5, 0, 0, 1000, 10, 1)  # a stream's run and a replica's position sort after drop marks
    index.set_position(7, 2, 9)
    index.commit()
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    try:
        second = index.mark_dropped(5, 30, 40)
        assert second > first + 1
        assert index.dropped(5) == [(first, 10, 20), (second, 30, 40)]
        assert index.dropped(6) == [(first + 1, 0, 2 ** 64 - 1)]
        assert index.queue_ids() == {5, 6}
        index.forget_dropped(5, [first])
        assert index.dropped(5) == [(second, 30, 40)]
        index.delete_queue(5)
        index.commit()
        assert index.dropped(5) == [] and index.queue_ids() == {6}
    finally:
        index.close()


def test_queue_ids(index):
    assert index.queue_ids() == set()
    for queue_id in (1, 2, 255, 256, 70000, 0xFFFFFFFA):
        index.publish(queue_id, 1, 1, 0, 1)
        index.publish(queue_id, 2, 2, 0, 1)
    index.publish(3, 1, 1, 0, 1)
    index.set_position(2, 7, 9)  # kept under the reserved ids, which name no queue
    index.put_mark(2, 0, 1, 1000, 2, 1)
    index.set_enqueuers(2, {1 << 62: 5})
    index.commit()
    assert index.queue_ids() == {1, 2, 3, 255, 256, 70000, 0xFFFFFFFA}
    index.ack(3, 1)
    index.commit()
    assert 3 not in index.queue_ids()


def test_a_replicas_position_commits_with_its_entries(tmp_path):
    path = str(tmp_path / "index")
    index = QueueIndex(path, map_size=1 << 24)
    assert index.position(5) == (0, 0)
    index.publish(5, 1, 11, 0, 3)
    index.set_position(5, 2, 40)
    assert index.position(5) == (2, 40)  # a read commits what is staged
    index.set_position(5, 2, 41)
    index.commit()
    index.sync()
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    assert index.position(5) == (2, 41) and kept_totals(index, 5).count == 1
    index.forget_position(5)
    assert index.position(5) == (0, 0)
    index.close()


def test_a_replicas_position_on_disk_leaves_its_entries_totals_counted_in_one_go(index, monkeypatch):
    """A replica stages its position with every batch: written over in place, it does not turn the commit's
    entries into one put and one count each (as a put of a key on disk would)."""
    index.set_position(5, 2, 40)
    index.commit()
    counted: list[int] = []
    account = index_module._account

    def counting(changes: dict[bytes, list[int]], keys: list[bytes], values: list[bytes], sign: int) -> None:
        counted.append(len(keys))
        account(changes, keys, values, sign)

    monkeypatch.setattr(index_module, "_account", counting)
    for seq in range(1, 41):
        index.publish(5, seq, seq, 0, 3)
    index.set_position(5, 2, 80)
    index.commit()
    assert counted == [40]
    assert index.position(5) == (2, 80) and kept_totals(index, 5) == Totals(40, 120, 0, 0)
    index.forget_position(5)
    index.set_position(5, 3, 1)  # (forgotten and set again in one batch: set)
    assert index.position(5) == (3, 1)


def test_a_replicas_enqueuers_commit_with_its_entries_and_only_changes_are_written(tmp_path):
    path = str(tmp_path / "index")
    index = QueueIndex(path, map_size=1 << 24)
    assert index.enqueuers(5) == {}
    index.publish(5, 1, 11, 0, 3)
    index.set_enqueuers(5, {7: 1, (1 << 63) - 1: 4, 9: 2})
    index.set_enqueuers(6, {7: 10})  # (another queue's, apart)
    index.commit()
    index.set_enqueuers(5, {(1 << 63) - 1: 4, 9: 3, 8: 1})  # 7 goes, 9 moves on, 8 takes 7's slot
    assert len(index._updates) == 2 and len(index._deletes) == 1
    index.publish(5, 2, 12, 0, 3)
    index.commit()
    index.sync()
    index.set_enqueuers(5, {9: 4})  # staged, never committed: a restart reads the committed ones
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    assert index.enqueuers(5) == {(1 << 63) - 1: 4, 9: 3, 8: 1} and index.enqueuers(6) == {7: 10}
    assert kept_totals(index, 5).count == 2
    index.forget_position(5)
    index.commit()
    index.delete_queue(6)
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    assert index.enqueuers(5) == {} and index.enqueuers(6) == {}
    index.close()


def test_remove_and_mark_delivered_find_staged_and_committed_entries(index):
    index.publish(1, 1, 11, 0, 3)
    index.publish(1, 2, 12, 0, 4)
    index.commit()
    index.publish(1, 3, 13, 0, 5)  # staged only
    index.mark_delivered(1, 1)
    index.mark_delivered(1, 3)
    assert index.remove(1, 3).msg_id == 13  # staged: never written
    assert index.remove(1, 2).msg_id == 12
    assert index.remove(1, 2) is None and index.remove(1, 9) is None
    index.commit()
    assert [(e.seq, e.msg_id, e.delivered) for e in index.entries(1)] == [(1, 11, True)]
    assert index.totals(1).count == 1 and index.totals(1).bytes == 3


def test_relink_names_another_record_keeping_flags_and_totals_staged_or_committed(index):
    """A quorum queue's entry whose message a modified outcome rewrote names the new record, with its flags,
    returns and totals as they were; ``peek`` reads it without committing, and a later reflag still finds it."""
    index.publish(1, 1, 11, 0, 3, delivered=True, returns=2)
    index.commit()
    index.publish(1, 2, 12, 0, 4, delivered=True)  # staged only
    index.relink(1, 1, 21)
    index.relink(1, 2, 22)
    index.relink(1, 9, 29)  # (none there: nothing)
    assert (index.peek(1, 1).msg_id, index.peek(1, 2).msg_id, index.peek(1, 9)) == (21, 22, None)
    assert index.pending
    index.mark_returned(1, 1, 3)
    index.commit()
    assert [(e.seq, e.msg_id, e.delivered, e.returns) for e in index.entries(1)] == [(1, 21, False, 3),
                                                                                     (2, 22, True, 0)]
    assert index.totals(1).count == 2 and index.totals(1).bytes == 7


def test_reopen_keeps_committed_and_synced_entries(tmp_path):
    path = str(tmp_path / "index")
    index = QueueIndex(path, map_size=1 << 24)
    for seq in range(1, 101):
        index.publish(seq % 3, seq, seq * 10, 0, seq)
    index.commit()
    for seq in range(1, 101, 2):
        index.ack(seq % 3, seq)
    index.commit()
    index.sync()
    index.publish(9, 1, 1, 0, 1)  # staged, never committed: lost at close
    index.close()
    index = QueueIndex(path, map_size=1 << 24)
    assert index.queue_ids() == {0, 1, 2}
    for queue_id in range(3):
        want = [s for s in range(2, 101, 2) if s % 3 == queue_id]
        entries = list(index.entries(queue_id))
        assert [e.seq for e in entries] == want
        assert all(e.msg_id == e.seq * 10 and e.size == e.seq for e in entries)
    assert seqs(index, 9) == []
    index.close()


def test_entries_model_randomized(index):
    rng = random.Random(11)
    model: dict[tuple[int, int], tuple[int, bool]] = {}  # committed state
    staged: dict[tuple[int, int], tuple[int, bool] | None] = {}
    next_seq = {q: 1 for q in range(4)}
    for _ in range(600):
        op = rng.random()
        queue_id = rng.randrange(4)
        view = {**model, **staged}
        live = [k for k, v in view.items() if v is not None and k[0] == queue_id]
        if op < 0.4:
            seq = next_seq[queue_id]
            next_seq[queue_id] += 1
            index.publish(queue_id, seq, seq + 100, 0, 1)
            staged[(queue_id, seq)] = (seq + 100, False)
        elif op < 0.55 and live:
            key = rng.choice(live)
            index.delivered(key[0], key[1], key[1] + 100, 0, 1)
            staged[key] = (key[1] + 100, True)
        elif op < 0.8 and live:
            key = rng.choice(live)
            index.ack(*key)
            staged[key] = None
        elif op < 0.95:
            index.commit()
            for key, value in staged.items():
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value
            staged.clear()
            for q in range(4):
                assert [(e.seq, e.msg_id, e.delivered) for e in index.entries(q)] == sorted(
                    (s, m, d) for (qq, s), (m, d) in model.items() if qq == q)
                count = sum(1 for qq, _ in model if qq == q)
                assert (index.totals(q) or Totals()) == Totals(count, count, 0, 0)  # kept, never recounted
        else:
            index.delete_queue(queue_id)
            for key in [k for k in model if k[0] == queue_id]:
                del model[key]
            for key in [k for k in staged if k[0] == queue_id]:
                del staged[key]
        assert index.queue_ids() == {q for q, _ in model}


# -- expiry heap ---------------------------------------------------------------------------------


def test_expiry_heap_pop_due_ordering_and_next_deadline():
    heap = ExpiryHeap()
    assert len(heap) == 0
    assert heap.next_deadline() is None
    assert heap.pop_due(10**12) == []
    for expiry, seq in [(500, 1), (100, 2), (300, 3), (100, 4), (900, 5), (300, 0)]:
        heap.push(expiry, seq)
    assert len(heap) == 6
    assert heap.next_deadline() == 100
    assert heap.pop_due(99) == []
    assert heap.pop_due(100) == [2, 4]  # at the deadline counts; ties by seq
    assert heap.next_deadline() == 300
    assert heap.pop_due(600) == [0, 3, 1]  # expiry order, not push order
    assert heap.next_deadline() == 900
    assert len(heap) == 1
    heap.push(50, 9)  # a later push with an earlier deadline comes first
    assert heap.next_deadline() == 50
    assert heap.pop_due(1000) == [9, 5]
    assert heap.next_deadline() is None
    heap.push(1, 1)
    heap.clear()
    assert len(heap) == 0 and heap.next_deadline() is None


def test_expiry_heap_randomized():
    rng = random.Random(5)
    heap = ExpiryHeap()
    items = [(rng.randrange(1000), seq) for seq in range(500)]
    for expiry, seq in items:
        heap.push(expiry, seq)
    popped = []
    for now in range(0, 1100, 37):
        due = heap.pop_due(now)
        popped.extend(due)
        deadline = heap.next_deadline()
        assert deadline is None or deadline > now
    assert popped == [seq for _, seq in sorted(items)]


def test_file_shrinks_at_open_after_a_backlog_was_acked(tmp_path):
    directory = str(tmp_path / "index")
    index = QueueIndex(directory, map_size=1 << 28)
    for seq in range(200_000):
        index.publish(1, seq, msg_id=seq, expiry=0, size=100)
    index.commit()
    for seq in range(1, 200_000):
        index.ack(1, seq)
    index.commit()
    index.sync()
    index.close()
    path = tmp_path / "index" / "data.mdb"
    grown = path.stat().st_size
    assert grown > 8 << 20
    index = QueueIndex(directory, map_size=1 << 28)
    try:
        assert path.stat().st_size < grown // 20
        assert [e.seq for e in index.entries(1)] == [0]  # what was still there survives the rewrite
    finally:
        index.close()
    assert not (tmp_path / "index" / "compact.tmp").exists()


def test_totals_follow_puts_replacements_and_deletes(index):
    index.publish(5, 1, 10, expiry=0, size=100)
    index.publish(5, 2, 11, expiry=123, size=50, transient=True)
    index.publish(5, 3, 12, expiry=0, size=7)
    index.commit()
    assert index.totals(5) == Totals(3, 157, 1, 1)
    index.delivered(5, 2, 11, 123, 50, transient=True)  # a replacement: counted once
    index.ack(5, 3)
    index.ack(5, 3)  # a second ack of the same entry changes nothing
    index.commit()
    assert index.totals(5) == Totals(2, 150, 1, 1)
    assert index.last_seq(5) == 2 and index.last_seq(4) is None and index.last_seq(6) is None
    assert [e.seq for e in index.read(5, 2, 10)] == [2] and index.get(5, 2).transient and index.get(5, 2).delivered
    index.publish(5, 9, 13, 0, 1)  # staged: read and get commit first
    assert [e.seq for e in index.read(5, 0, 2)] == [1, 2] and index.get(5, 9).msg_id == 13
    assert index.recount(5) == index.totals(5) == Totals(3, 151, 1, 1)
    index.delete_queue(5)
    assert index.totals(5) is None and index.queue_ids() == set()


def test_columns_match_entries_across_batches_and_queue_boundaries(index):
    for queue_id in (1, 2, 3):
        for seq in range(0, 50, queue_id):
            index.publish(queue_id, seq, seq * 10 + queue_id, expiry=seq % 4, size=seq, transient=seq % 5 == 0)
    index.commit()
    for queue_id in (1, 2, 3, 4):
        for batch in (1, 7, 1000):
            got = [(int(seq), int(v["msg_id"]), int(v["expiry"]), int(v["size"]), bool(v["flags"] & 2))
                   for seqs, values in index.columns(queue_id, batch) for seq, v in zip(seqs, values)]
            assert got == [(e.seq, e.msg_id, e.expiry, e.size, e.transient) for e in index.entries(queue_id)]



def test_tally_counts_a_range_batch_by_batch_staged_entries_included(index):
    for queue_id in (1, 2):
        for seq in range(0, 60, 3):  # gaps, as acks leave them
            index.publish(queue_id, seq, seq, expiry=0, size=seq + 1)
    index.commit()
    index.publish(1, 61, 61, expiry=0, size=100)  # staged: counted too
    for start, end in ((0, 30), (4, 62), (0, 2 ** 64), (40, 41)):
        for batch in (1, 4, 1000):
            total, size, at, steps = 0, 0, start, 0
            while at is not None:
                counted, counted_size, at = index.tally(1, at, end, batch)
                total, size, steps = total + counted, size + counted_size, steps + 1
            wanted = [seq for seq in [*range(0, 60, 3), 61] if start <= seq < end]
            assert (total, size) == (len(wanted), sum(wanted) + len(wanted) + 38 * (61 in wanted))
            assert steps == len(wanted) // batch + 1
@pytest.mark.parametrize("n", [10, 500])  # a few are counted in Python, a batch as arrays
def test_totals_of_a_commit_counted_either_way(index, n):
    for queue_id in (7, 8):
        for seq in range(n):
            index.publish(queue_id, seq, seq, expiry=seq % 3, size=seq, transient=seq % 4 == 0)
    index.commit()
    want = Totals(n, sum(range(n)), sum(1 for s in range(n) if s % 3), sum(1 for s in range(n) if s % 4 == 0))
    assert index.totals(7) == index.totals(8) == want
    for seq in range(0, n, 2):
        index.ack(7, seq)
    index.commit()
    odd = range(1, n, 2)
    assert index.totals(7) == Totals(len(odd), sum(odd), sum(1 for s in odd if s % 3), 0)
    assert index.totals(8) == want


@pytest.mark.parametrize("off_by", [0, -7, 5, 1000])
def test_values_trust_the_totals_but_never_stray_from_the_queue(index, off_by, caplog):
    for queue_id in (1, 2, 3):
        for seq in range(40):
            index.publish(queue_id, seq, queue_id * 100 + seq, 0, 1)
    index.commit()
    count = index.totals(2).count + off_by  # as if the totals had gone wrong
    got = [int(m) for values in index.values(2, count, batch=8) for m in values["msg_id"]]
    assert got == [200 + seq for seq in range(40)]
    assert ("do not match" in caplog.text) == (off_by != 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sets(st.integers(0, 80), max_size=60), min_size=3, max_size=3), st.integers(0, 90),
       st.integers(0, 70), st.booleans())
def test_reads_match_the_entries_with_or_without_gaps(index, queues, start, limit, marked):
    """A read of ``limit`` entries from ``start``: the keys of entries with every seq made, not walked; with a gap
    walked.  Either way exactly the entries there, never one of the next queue, a drop mark or a stream's run."""
    for queue_id in (1, 2, 3):
        index.delete_queue(queue_id)
    for queue_id, seqs in enumerate(queues, 1):
        for seq in seqs:
            index.publish(queue_id, seq, seq * 10 + queue_id, expiry=0, size=seq + 1)
    if marked:
        index.mark_dropped(2, 0, 5)
        index.put_mark(3, 0, 0, 1000, 10, 1)
    index.commit()
    for queue_id, seqs in enumerate(queues, 1):
        wanted = sorted(seq for seq in seqs if seq >= start)[:limit]
        got = index.read(queue_id, start, limit)
        assert [(e.seq, e.msg_id, e.size) for e in got] == [(seq, seq * 10 + queue_id, seq + 1) for seq in wanted]


def test_an_index_lmdb_cannot_read_is_moved_aside_and_the_node_starts_without_it(tmp_path, caplog):
    """Its meta pages damaged (zeroed by a power loss, say), LMDB refuses the file: the index raised at every
    start, so the node could never start again.  The file is kept aside for an operator, the index starts empty,
    and the loss is logged."""
    path = tmp_path / "index"
    index = QueueIndex(str(path), map_size=1 << 24)
    index.publish(1, 1, 10, 0, 1)
    index.commit()
    index.sync()
    index.close()
    with open(path / "data.mdb", "r+b") as handle:
        handle.write(bytes(8192))
    with caplog.at_level(logging.CRITICAL, logger="warren.queue_index"):
        index = QueueIndex(str(path), map_size=1 << 24)
    try:
        assert seqs(index, 1) == []
        index.publish(1, 2, 20, 0, 1)
        index.commit()
        assert seqs(index, 1) == [2]
    finally:
        index.close()
    [aside] = tmp_path.glob("index.damaged-*")
    assert (aside / "data.mdb").stat().st_size > 8192
    assert any("unreadable" in record.getMessage() for record in caplog.records)
