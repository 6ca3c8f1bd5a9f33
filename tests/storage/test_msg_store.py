"""Unit tests of msg_store: segments, refcounts, deletion, compaction, recovery, torn tails."""
from __future__ import annotations

import logging
import os
import random
import zlib

from crc32c import crc32c

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from msg_store import MessageStore, store as store_module
from msg_store.segment import CRC32C, HEAD_SIZE, RECORD_HEAD, SEEDED, Segment, list_segments, segment_path


def new_store(path, **kw) -> MessageStore:
    store = MessageStore(str(path), **kw)
    store.start()
    return store


def reopen(path, claims: dict[int, int] | None = None, **kw) -> tuple[MessageStore, int]:
    """A store recovered from ``path``; ``claims`` maps msg_id -> how many queues claim it."""
    store = MessageStore(str(path), **kw)
    store.recover()
    for msg_id, refs in (claims or {}).items():
        for _ in range(refs):
            assert store.claim(msg_id)
    dead = store.finish_recovery()
    return store, dead


def writing(store: MessageStore) -> Segment:
    """The segment being written, which a started or recovered store always has."""
    segment = store.current
    assert segment is not None
    return segment


def put(store: MessageStore, payload: bytes, refs: int = 1) -> int:
    msg_id = store.new_id()
    store.write(msg_id, (payload,), refs)
    return msg_id


def crash(store: MessageStore) -> None:
    """Leave ``store`` as a killed process would: its tail handed to the operating system, nothing synced, renamed
    or removed, no snapshot; only its descriptors closed (the test's process goes on)."""
    store.flush()
    for segment in [*store.segments.values(), *store._doomed, *store._spares]:
        os.close(segment.fd)
    os.close(store._directory_fd)


def seg_files(path) -> list[int]:
    return list_segments(str(path))


# -- round trip and reads ------------------------------------------------------------------------


def test_round_trip_parts_before_and_after_flush_sync_and_cache_clear(tmp_path):
    store = new_store(tmp_path)
    parts = (b"\x00\x05", b"route", b"", b"header-bytes", b"B" * 1000)
    whole = b"".join(parts)
    msg_id = store.new_id()
    store.write(msg_id, parts, 1)
    assert msg_id in store
    assert store.read(msg_id) == whole  # unflushed, from the tail
    store.flush()
    store.cache.clear()
    assert store.read(msg_id) == whole  # from the file (no fsync yet)
    store.sync()
    store.cache.clear()
    assert store.read(msg_id) == whole
    assert store.read(msg_id) == whole  # now from the cache
    assert msg_id in store.cache
    store.close()


def test_a_record_written_from_another_s_body_is_the_one_written_from_memory_and_survives_a_crash(tmp_path,
                                                                                                    monkeypatch):
    """``write_from``: a new head and the body of another record (in its file, or still in the tail), copied a
    slice at a time, make the record ``write`` would have made of them; the records before and after it are
    untouched, and after a crash recovery finds it whole (its CRC the record's)."""
    monkeypatch.setattr(store_module, "COPY_SLICE", 1000)
    store = new_store(tmp_path, segment_size=64 * 1024)
    rng = random.Random(7)
    expected: dict[int, bytes] = {}
    for size in (0, 999, 1000, 2500, 100_000):
        body = rng.randbytes(size)
        source = put(store, b"old head" + body)
        before = put(store, b"small")  # (in the tail as ``write_from`` begins)
        msg_id = store.new_id()
        store.write_from(msg_id, (b"new", b" head"), source, size, 1)
        after = put(store, b"after")
        expected |= {source: b"old head" + body, before: b"small", msg_id: b"new head" + body, after: b"after"}
    with pytest.raises(KeyError):
        store.write_from(store.new_id(), (b"h",), 1 << 40, 1, 1)
    store.cache.clear()
    assert {msg_id: store.read(msg_id) for msg_id in expected} == expected
    crash(store)
    store, dead = reopen(tmp_path, {msg_id: 1 for msg_id in expected})
    assert dead == 0
    assert {msg_id: store.read(msg_id) for msg_id in expected} == expected
    store.close()


def test_many_messages_distinct_payloads(tmp_path):
    store = new_store(tmp_path, segment_size=4096)
    rng = random.Random(1)
    payloads = {}
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 300))
        payloads[put(store, data)] = data
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.sync()
    store.cache.clear()
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.close()


def test_write_many_is_the_same_as_writes_one_by_one(tmp_path):
    """A follower writes a snapshot's frame of rows at once: the segment files, the locations, the sidecars and the
    ids handed out are those of the same records written one by one (small ones and large ones, across
    segments and chunks of ids)."""
    rng = random.Random(3)
    records = [rng.randbytes(rng.choice((0, 40, 100, 300, 70_000))) for _ in range(120)]
    records += [rng.randbytes(20) for _ in range(4200)]  # (ids across a chunk of the locations)
    stores = []
    for way in ("one by one", "many"):
        store = new_store(tmp_path / way, segment_size=20_000, sidecars=True)
        put(store, b"before")
        if way == "many":
            for start in range(0, len(records), 1000):
                run = records[start:start + 1000]
                store.write_many(store.new_ids(len(run)), run, 1)
        else:
            for record in records:
                put(store, record)
        put(store, b"after")
        store.sync()
        stores.append(store)
    one, many = stores
    assert one.next_id == many.next_id and one.writes == many.writes
    assert seg_files(tmp_path / "one by one") == seg_files(tmp_path / "many")
    for number in seg_files(tmp_path / "many"):
        with open(segment_path(str(tmp_path / "one by one"), number), "rb") as a, \
                open(segment_path(str(tmp_path / "many"), number), "rb") as b:
            assert a.read() == b.read()
    for msg_id in range(one.next_id):
        assert one.index.get(msg_id) == many.index.get(msg_id)
    assert one.take_sealed() == many.take_sealed()
    many.cache.clear()
    assert [many.read(msg_id) for msg_id in range(2, 2 + len(records))] == records
    one.close()
    many.close()


# -- refcounts -----------------------------------------------------------------------------------


def test_refcount_survives_until_last_remove(tmp_path):
    store = new_store(tmp_path)
    msg_id = put(store, b"shared", refs=3)
    store.sync()
    store.remove(msg_id)
    store.remove(msg_id)
    assert msg_id in store
    store.cache.clear()
    assert store.read(msg_id) == b"shared"
    store.remove(msg_id)
    assert msg_id not in store
    store.cache.clear()
    with pytest.raises(KeyError):
        store.read(msg_id)
    store.remove(msg_id)  # removing an unknown id is harmless
    store.close()


def test_add_ref_and_remove_count(tmp_path):
    store = new_store(tmp_path)
    msg_id = put(store, b"x", refs=1)
    store.add_ref(msg_id, 2)
    store.remove(msg_id, count=2)
    assert msg_id in store
    store.remove(msg_id)
    assert msg_id not in store
    store.close()


# -- segments and deletion -----------------------------------------------------------------------


def test_segment_rollover_at_segment_size(tmp_path):
    store = new_store(tmp_path, segment_size=1000)
    ids = [put(store, bytes([i]) * 100) for i in range(30)]
    store.sync()
    segments = {store.index[m].segment for m in ids}
    assert len(segments) >= 3
    numbers = seg_files(tmp_path)
    assert set(numbers) == set(store.segments)
    for number in numbers[:-1]:  # every full segment reached the size, and not by much more than a record
        size = os.path.getsize(segment_path(str(tmp_path), number))
        assert 1000 <= size < 1000 + 100 + HEAD_SIZE
    store.cache.clear()
    for i, msg_id in enumerate(ids):
        assert store.read(msg_id) == bytes([i]) * 100
    store.close()


def test_segment_all_removed_is_deleted_but_never_current(tmp_path):
    store = new_store(tmp_path, segment_size=1000)
    ids = [put(store, bytes([i]) * 100) for i in range(25)]
    store.sync()
    first = [m for m in ids if store.index[m].segment == 1]
    assert writing(store).number != 1
    for msg_id in first:
        assert os.path.exists(segment_path(str(tmp_path), 1))
        store.remove(msg_id)
    assert 1 not in store.segments
    # its files go with the next sync (off the event loop in a broker: freeing a large file's blocks takes time)
    assert os.path.exists(segment_path(str(tmp_path), 1))
    store.sync()
    assert not os.path.exists(segment_path(str(tmp_path), 1))
    # the segment being written is never deleted under the writer: once it is large and holds
    # nothing live, writing moves on to a fresh segment and the old one goes
    current = writing(store).number
    for msg_id in [m for m in ids if m in store and store.index[m].segment == current]:
        store.remove(msg_id)
    store.sync()
    assert writing(store).number != current
    assert not os.path.exists(segment_path(str(tmp_path), current))
    assert os.path.exists(segment_path(str(tmp_path), writing(store).number))
    # the others are still readable
    store.cache.clear()
    for msg_id in ids:
        if msg_id in store:
            assert store.read(msg_id) == bytes([ids.index(msg_id)]) * 100
    store.close()


def test_a_deleted_segments_file_is_written_again_as_a_new_segment(tmp_path):
    """Once its removals are synced, a deleted segment's file is kept as a spare and the next new segment is that
    file renamed (its blocks and cached pages overwritten rather than freed and allocated again); what the new
    segment holds reads back byte-exact, from the store and after a clean restart."""
    store = new_store(tmp_path, segment_size=1000)
    first = [put(store, bytes([i]) * 100) for i in range(9)]
    assert {store.index[m].segment for m in first} == {1}
    inode = os.fstat(store.segments[1].fd).st_ino
    for msg_id in first:
        store.remove(msg_id)
    store.sync()
    assert not os.path.exists(segment_path(str(tmp_path), 1)) and len(store._spares) == 1
    later = {put(store, bytes([i]) * 60): bytes([i]) * 60 for i in range(40)}
    reused = [n for n, segment in store.segments.items() if os.fstat(segment.fd).st_ino == inode]
    assert len(reused) == 1 and reused[0] > 1 and not store._spares
    store.sync()
    store.cache.clear()
    assert {msg_id: store.read(msg_id) for msg_id in later} == later
    store.close()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".spare")]
    for number in seg_files(tmp_path):  # every file ends where its records do (the snapshot is used)
        assert os.path.getsize(segment_path(str(tmp_path), number)) <= 1000 + 60 + HEAD_SIZE
    recovered, dead = reopen(tmp_path)
    assert recovered.clean and dead == 0
    assert {msg_id: recovered.read(msg_id) for msg_id in later} == later
    recovered.close()


@pytest.mark.parametrize("loan", ["still out", "read", "given back unread"])
def test_a_segment_lent_to_a_reader_is_recycled_only_if_the_reader_gave_back_the_file_unread(tmp_path, loan):
    """``open_payload`` lends a descriptor with the segment as its loan: while one is out, or if one read the file
    (a transport may still hold a mapping of it), the deleted segment's file is removed, not written again."""
    store = new_store(tmp_path, segment_size=1000)
    first = [put(store, bytes([i]) * 100) for i in range(9)]
    opened = store.open_payload(first[0])
    assert opened is not None
    fd, offset, size, segment = opened
    assert os.pread(fd, size, offset) == bytes([0]) * 100
    if loan == "read":
        segment.read_through()
    if loan != "still out":
        os.close(fd)
        segment.given_back()
    for msg_id in first:
        store.remove(msg_id)
    store.sync()
    assert [spare.number for spare in store._spares] == ([1] if loan == "given back unread" else [])
    assert not os.path.exists(segment_path(str(tmp_path), 1))
    if loan == "still out":
        os.close(fd)
    store.close()


def test_a_recycled_segment_never_gives_back_its_former_records_after_a_crash(tmp_path):
    """A crash while a recycled file is written leaves its former life's records after the new ones (the same
    sizes here, so that they start where the new ones end).  Recovery takes only the new ones, byte-exact: the
    former records fail their CRC, seeded with another segment number, and are cut off."""
    store = new_store(tmp_path, segment_size=1000)
    former = [put(store, bytes([i]) * 100) for i in range(9)]  # segment 1, full
    for msg_id in former:
        store.remove(msg_id)
    store.sync()
    bodies = {put(store, bytes([100 + i]) * 100): bytes([100 + i]) * 100 for i in range(12)}  # 2, then 1's file
    current = writing(store)
    assert current.number == 3 and current.extent > current.size  # the spare's file, former records after
    crash(store)
    path = segment_path(str(tmp_path), current.number)
    assert os.path.getsize(path) > (100 + HEAD_SIZE) * 3
    recovered = MessageStore(str(tmp_path))
    recovered.recover()
    assert not any(recovered.claim(msg_id) for msg_id in former)
    assert all(recovered.claim(msg_id) for msg_id in bodies)
    assert recovered.finish_recovery() == 0
    assert os.path.getsize(path) == (100 + HEAD_SIZE) * 3
    assert {msg_id: recovered.read(msg_id) for msg_id in bodies} == bodies
    recovered.close()


# -- compaction ----------------------------------------------------------------------------------


def _fill(store: MessageStore, count: int, size: int = 100) -> dict[int, bytes]:
    payloads = {}
    for i in range(count):
        data = i.to_bytes(4, "big") * (size // 4)
        payloads[put(store, data)] = data
    store.sync()
    return payloads


def test_compaction_moves_live_records_and_deletes_old_file(tmp_path):
    store = new_store(tmp_path, segment_size=2000, compaction_threshold=0.5)
    payloads = _fill(store, 60)
    in_first = sorted((m for m in payloads if store.index[m].segment == 1), key=lambda m: store.index[m].offset)
    assert len(in_first) >= 10
    before = store.stats()
    assert before.dead_fraction == 0
    removed = in_first[: int(len(in_first) * 0.7)]  # > threshold
    kept = in_first[len(removed):]
    for msg_id in removed:
        store.remove(msg_id)
        del payloads[msg_id]
    dirty = store.stats()
    assert dirty.dead_fraction > 0
    assert store.needs_compaction
    steps = 0
    while store.compact_step(budget=150):  # several slices
        steps += 1
        assert steps < 1000
    assert steps >= 1
    assert not store.needs_compaction
    store.sync()
    assert not os.path.exists(segment_path(str(tmp_path), 1))
    assert 1 not in store.segments
    for msg_id in kept:
        assert store.index[msg_id].segment != 1
    after = store.stats()
    assert after.compactions == 1
    assert after.dead_fraction < dirty.dead_fraction
    assert after.messages == len(payloads)
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.cache.clear()
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.close()
    # the compacted layout recovers too
    store, dead = reopen(tmp_path, {m: 1 for m in payloads}, segment_size=2000)
    assert dead == 0
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.close()


def test_a_compaction_leaves_the_files_of_deleted_segments_to_the_next_sync(tmp_path):
    """A compaction makes its copies durable, but removes no deleted segment's file: that is the group commit's,
    on its own thread, once the removals that deleted the segment are durable (the queue index's too); closed by
    a compaction on the event loop, a descriptor that thread was fsyncing could be another file's by then."""
    store = new_store(tmp_path, segment_size=2000, compaction_threshold=0.5)
    payloads = _fill(store, 60)
    segments = sorted({store.index[m].segment for m in payloads})
    assert len(segments) >= 3
    for msg_id in [m for m in payloads if store.index[m].segment == 2]:  # segment 2 emptied: deleted
        store.remove(msg_id)
    in_first = [m for m in payloads if m in store.index and store.index[m].segment == 1]
    for msg_id in in_first[: int(len(in_first) * 0.7)]:  # segment 1 mostly dead: compacted
        store.remove(msg_id)
    while store.compact_step():
        pass
    assert store.compactions == 1
    assert os.path.exists(segment_path(str(tmp_path), 2))
    store.sync()
    assert not os.path.exists(segment_path(str(tmp_path), 2)) and not os.path.exists(segment_path(str(tmp_path), 1))
    store.close()


def test_a_payload_opened_for_sending_reads_the_same_bytes_after_its_segment_is_compacted_and_deleted(tmp_path):
    """``open_payload``'s descriptor is the reader's own: the segment compacted away (its file unlinked and the
    store's descriptor closed) and new segments opened meanwhile (which may take the closed descriptor's number),
    it still reads the payload's bytes."""
    store = new_store(tmp_path, segment_size=2000, compaction_threshold=0.5)
    payloads = _fill(store, 60)
    in_first = sorted((m for m in payloads if store.index[m].segment == 1), key=lambda m: store.index[m].offset)
    kept = in_first[-1]
    opened = store.open_payload(kept)
    assert opened is not None
    fd, offset, size, loan = opened
    assert os.pread(fd, size, offset) == payloads[kept]
    loan.read_through()
    for msg_id in in_first[:-1]:
        store.remove(msg_id)
    while store.compact_step():
        pass
    store.sync()  # the old segment's file unlinked, the store's descriptor of it closed
    assert not os.path.exists(segment_path(str(tmp_path), 1))
    _fill(store, 60)
    try:
        assert os.pread(fd, size, offset) == payloads[kept]
    finally:
        os.close(fd)
    pending = store.new_id()
    store.write(pending, (b"not yet in its file",), 1)
    assert store.open_payload(pending) is None  # (in the tail: read it from memory)
    store.remove(kept)
    assert store.open_payload(kept) is None
    store.close()


def test_compaction_keeps_refcounts(tmp_path):
    store = new_store(tmp_path, segment_size=1000)
    shared = put(store, b"s" * 100, refs=2)
    others = [put(store, b"o" * 100) for _ in range(20)]
    store.sync()
    assert store.index[shared].segment == 1
    for msg_id in others:
        if store.index[msg_id].segment == 1:
            store.remove(msg_id)
    while store.compact_step():
        pass
    assert store.index[shared].segment != 1
    store.remove(shared)
    assert store.read(shared) == b"s" * 100
    store.remove(shared)
    assert shared not in store
    store.close()


def test_removal_of_rest_during_sliced_compaction(tmp_path):
    """Regression: the segment being compacted lost its last live record between slices (KeyError)."""
    store = new_store(tmp_path, segment_size=1000, compaction_threshold=0.3)
    ids = [put(store, bytes([i]) * 100) for i in range(12)]
    store.sync()
    first = [m for m in ids if store.index[m].segment == 1]
    for msg_id in first[:4]:
        store.remove(msg_id)
    assert store.compact_step(budget=1)  # one record moved, more to go
    for msg_id in first[4:]:
        if store.index[msg_id].segment == 1:
            store.remove(msg_id)
    while store.compact_step(budget=1):
        pass
    assert 1 not in store.segments
    store.sync()
    assert not os.path.exists(segment_path(str(tmp_path), 1))
    for msg_id in ids:
        if msg_id in store:
            assert store.read(msg_id) == bytes([ids.index(msg_id)]) * 100
    store.close()


def test_disk_use_back_near_zero_after_backlog_consumed(tmp_path):
    segment_size = 8192
    store = new_store(tmp_path, segment_size=segment_size)
    rng = random.Random(7)
    payloads = {}
    for _ in range(2000):
        data = rng.randbytes(rng.randrange(50, 500))
        payloads[put(store, data)] = data
    store.sync()
    peak = store.stats().disk_bytes
    assert peak > 50 * segment_size
    order = list(payloads)
    rng.shuffle(order)  # consumed out of order, as with several queues
    for i, msg_id in enumerate(order):
        store.remove(msg_id)
        if i % 100 == 0:
            while store.compact_step(budget=4096):
                pass
    while store.compact_step():
        pass
    store.sync()
    stats = store.stats()
    assert stats.messages == 0
    assert stats.segments == 1  # only the current segment is left
    on_disk = sum(os.path.getsize(segment_path(str(tmp_path), n)) for n in seg_files(tmp_path))
    assert on_disk == stats.disk_bytes
    assert on_disk < segment_size + 500 + HEAD_SIZE
    assert on_disk < peak / 50
    store.close()


# -- recovery ------------------------------------------------------------------------------------


def test_recovery_claims_and_unclaimed(tmp_path):
    store = new_store(tmp_path, segment_size=1000)
    payloads = _fill(store, 30)
    gone = list(payloads)[5]
    store.remove(gone)
    del payloads[gone]
    last_id = store.next_id - 1
    store.close(snapshot=False)

    ids = list(payloads)
    claimed = {m: 1 + (m % 2) for m in ids[::2]}
    store = MessageStore(str(tmp_path), segment_size=1000)
    store.recover()
    assert store.next_id > last_id
    for msg_id, refs in claimed.items():
        for _ in range(refs):
            assert store.claim(msg_id)
    assert not store.claim(10_000)  # never written
    dead = store.finish_recovery()
    # the removed record may or may not still be on disk; the unclaimed live ones surely are
    unclaimed = len(ids) - len(claimed)
    assert dead in (unclaimed, unclaimed + 1)
    assert store.stats().messages == len(claimed)
    store.cache.clear()
    for msg_id in claimed:
        assert store.read(msg_id) == payloads[msg_id]
    for msg_id in ids:
        if msg_id not in claimed:
            assert msg_id not in store
    fresh = store.new_id()
    assert fresh > last_id
    store.write(fresh, (b"new",), 1)
    assert store.read(fresh) == b"new"
    for msg_id, refs in claimed.items():  # recovered refcounts hold
        for _ in range(refs - 1):
            store.remove(msg_id)
        assert msg_id in store
        store.remove(msg_id)
        assert msg_id not in store
    store.close()


def test_clean_close_reopens_from_the_snapshot_without_reading_a_segment(tmp_path, monkeypatch):
    store = new_store(tmp_path, segment_size=1000)
    payloads = _fill(store, 40)
    shared = next(iter(payloads))
    store.add_ref(shared, 2)
    store.remove(list(payloads)[7])
    del payloads[list(payloads)[7]]
    before = {m: store.index[m] for m in payloads}
    stats = store.stats()
    store.close()
    assert os.path.exists(tmp_path / "clean_shutdown")

    import msg_store.store as store_module

    def no_scan(*_args, **_kwargs):
        raise AssertionError("a clean restart read a segment")

    monkeypatch.setattr(store_module, "scan", no_scan)
    store = MessageStore(str(tmp_path), segment_size=1000)
    store.recover()
    assert not os.path.exists(tmp_path / "clean_shutdown")  # a later crash must scan
    assert all(store.claim(m) for m in payloads)  # claims only check: refs are known
    assert store.finish_recovery() == 0
    assert {m: store.index[m] for m in payloads} == before
    assert store.stats().dead_bytes == stats.dead_bytes and store.stats().messages == stats.messages
    store.cache.clear()
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.remove(shared, 3)
    assert shared not in store
    monkeypatch.undo()
    fresh = put(store, b"after")
    store.close(snapshot=False)

    claims = {m: 1 for m in payloads if m != shared} | {fresh: 1}
    store, _dead = reopen(tmp_path, claims, segment_size=1000)  # the removed records, if still on disk, are dead
    assert store.stats().messages == len(claims)
    assert store.read(fresh) == b"after"
    store.close()


def test_after_a_crash_full_segments_are_read_from_their_sidecars(tmp_path, monkeypatch, caplog):
    store = new_store(tmp_path, segment_size=1000, sidecars=True)
    payloads = _fill(store, 60)  # several full segments; _fill syncs, which writes their sidecars
    ids = list(payloads)
    for msg_id in ids[:5]:
        store.remove(msg_id)
        del payloads[msg_id]
    assert len(seg_files(tmp_path)) > 3 and os.path.exists(tmp_path / "00000001.idx")
    last = seg_files(tmp_path)[-1]
    store.close(snapshot=False)  # a crash

    import msg_store.store as store_module

    scanned: list[str] = []
    real_scan = store_module.scan

    def scan(path, **kw):
        scanned.append(path)
        return real_scan(path, **kw)

    monkeypatch.setattr(store_module, "scan", scan)
    store, dead = reopen(tmp_path, {m: 1 for m in payloads}, segment_size=1000, sidecars=True)
    assert scanned == [segment_path(str(tmp_path), last)]  # only the segment that was not full
    store.cache.clear()
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.close(snapshot=False)

    with open(tmp_path / "00000002.idx", "r+b") as handle:  # a damaged sidecar: its segment is scanned
        handle.seek(30)
        handle.write(b"\xff")
    scanned.clear()
    with caplog.at_level(logging.WARNING, logger="warren.msg_store"):
        store, _dead = reopen(tmp_path, {m: 1 for m in payloads}, segment_size=1000, sidecars=True)
    assert segment_path(str(tmp_path), 2) in scanned and "sidecar" in caplog.text
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.close()


def test_snapshot_that_does_not_match_the_files_is_ignored(tmp_path, caplog):
    store = new_store(tmp_path, segment_size=1 << 20)
    payloads = _fill(store, 5)
    store.close()
    with open(_last_segment(tmp_path), "ab") as handle:  # the files moved on without a new snapshot
        handle.write(b"\x00" * 3)
    with caplog.at_level(logging.WARNING, logger="warren.msg_store"):
        store, dead = reopen(tmp_path, {m: 1 for m in payloads}, segment_size=1 << 20)
    assert "snapshot" in caplog.text and dead == 0
    assert not os.path.exists(tmp_path / "clean_shutdown")
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.close()


def test_recovery_of_empty_directory(tmp_path):
    store, dead = reopen(tmp_path)
    assert dead == 0
    msg_id = put(store, b"a")
    assert msg_id == 1
    store.close()


def test_recovery_twice_and_new_writes_go_to_new_segment(tmp_path):
    store = new_store(tmp_path)
    a = put(store, b"a" * 10)
    store.close(snapshot=False)
    store, _ = reopen(tmp_path, {a: 1})
    b = put(store, b"b" * 10)
    assert store.index[b].segment != store.index[a].segment
    store.close(snapshot=False)
    store, dead = reopen(tmp_path, {a: 1, b: 1})
    assert dead == 0
    assert store.read(a) == b"a" * 10 and store.read(b) == b"b" * 10
    assert store.next_id > b
    store.close()


def _last_segment(path) -> str:
    return segment_path(str(path), seg_files(path)[-1])


@pytest.mark.parametrize("damage", ["garbage", "truncate", "short-garbage"])
def test_torn_tail_cut_at_recovery(tmp_path, caplog, damage):
    store = new_store(tmp_path, segment_size=1 << 20)
    payloads = _fill(store, 10)
    last = max(payloads)
    store.close(snapshot=False)  # a crash: no snapshot
    path = _last_segment(tmp_path)
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        if damage == "garbage":
            handle.seek(0, os.SEEK_END)
            handle.write(b"\x00\x00\x01\x00" + os.urandom(60))
            expected_size, survivors = size, payloads
        elif damage == "short-garbage":
            handle.seek(0, os.SEEK_END)
            handle.write(b"\xff" * 5)
            expected_size, survivors = size, payloads
        else:
            handle.truncate(size - 30)  # mid-way through the last record
            expected_size = size - len(payloads[last]) - HEAD_SIZE
            survivors = {m: d for m, d in payloads.items() if m != last}
    with caplog.at_level(logging.WARNING, logger="warren.msg_store"):
        store = MessageStore(str(tmp_path), segment_size=1 << 20)
        store.recover()
    assert any("cut off" in r.getMessage() for r in caplog.records)
    assert os.path.getsize(path) == expected_size
    for msg_id in survivors:
        assert store.claim(msg_id)
    if damage == "truncate":
        assert not store.claim(last)
    assert store.finish_recovery() == 0
    store.cache.clear()
    for msg_id, data in survivors.items():
        assert store.read(msg_id) == data
    msg_id = put(store, b"after")
    store.sync()
    store.close()
    store, dead = reopen(tmp_path, {**{m: 1 for m in survivors}, msg_id: 1})
    assert dead == 0
    assert store.read(msg_id) == b"after"
    store.close()


def test_flipped_byte_in_last_record_detected_by_crc(tmp_path, caplog):
    store = new_store(tmp_path)
    payloads = _fill(store, 5)
    last = max(payloads)
    store.close(snapshot=False)  # a crash: no snapshot
    path = _last_segment(tmp_path)
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(size - 10)
        byte = handle.read(1)
        handle.seek(size - 10)
        handle.write(bytes([byte[0] ^ 0x40]))
    with caplog.at_level(logging.WARNING, logger="warren.msg_store"):
        store = MessageStore(str(tmp_path))
        store.recover()
    assert any("cut off" in r.getMessage() for r in caplog.records)
    assert last not in store
    assert os.path.getsize(path) == size - len(payloads[last]) - HEAD_SIZE
    for msg_id in payloads:
        if msg_id != last:
            assert store.claim(msg_id)
    assert store.finish_recovery() == 0
    for msg_id, data in payloads.items():
        if msg_id != last:
            assert store.read(msg_id) == data
    store.close()


def test_a_damaged_record_mid_segment_loses_only_itself(tmp_path, caplog):
    """A record whose bytes rotted in the middle of a segment (its length intact): the records after it were cut
    off with it, and the file truncated there, though every byte of theirs was sound.  As RabbitMQ's scanner
    passes over a record without its write marker, only the damaged one goes; the file keeps the rest."""
    store = new_store(tmp_path)
    payloads = _fill(store, 5)
    damaged = sorted(payloads)[1]
    offset = store.index[damaged].offset
    store.close(snapshot=False)  # a crash: no snapshot
    path = _last_segment(tmp_path)
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(offset + 10)
        byte = handle.read(1)
        handle.seek(offset + 10)
        handle.write(bytes([byte[0] ^ 0x40]))
    with caplog.at_level(logging.WARNING, logger="warren.msg_store"):
        store = MessageStore(str(tmp_path))
        store.recover()
    assert damaged not in store
    assert os.path.getsize(path) == size
    for msg_id in payloads:
        if msg_id != damaged:
            assert store.claim(msg_id)
    assert store.finish_recovery() == 0
    for msg_id, data in payloads.items():
        if msg_id != damaged:
            assert store.read(msg_id) == data
    store.close()
    assert any("passed over" in r.getMessage() for r in caplog.records)


def test_records_carry_crc32c_and_older_zlib_crc32_records_still_recover(tmp_path):
    """New records are checksummed with CRC-32C seeded with their segment's number (flagged in their length);
    a segment of records written with zlib's CRC-32 or an unseeded CRC-32C, as earlier versions wrote them, is
    read back as it is, and a damaged one is still cut off."""
    store = new_store(tmp_path)
    msg_id = put(store, b"new" * 100)
    number = writing(store).number
    store.close(snapshot=False)
    with open(_last_segment(tmp_path), "rb") as handle:
        length, crc, found = RECORD_HEAD.unpack(handle.read(HEAD_SIZE))
    assert found == msg_id and length == CRC32C | SEEDED | (8 + 300)
    record = msg_id.to_bytes(8, "big") + b"new" * 100
    assert crc == crc32c(record, number) != crc32c(record)
    old = tmp_path / "old"
    old.mkdir()
    bodies = {7: b"seven" * 40, 8: b"eight" * 3, 10: b"ten" * 9}
    with open(segment_path(str(old), 1), "wb") as handle:
        for old_id, body in bodies.items():
            record = old_id.to_bytes(8, "big") + body
            if old_id == 10:  # (an unseeded CRC-32C)
                handle.write(RECORD_HEAD.pack(CRC32C | len(record), crc32c(record), old_id) + body)
            else:
                handle.write(RECORD_HEAD.pack(len(record), zlib.crc32(record), old_id) + body)
        record = (9).to_bytes(8, "big") + b"torn"
        handle.write(RECORD_HEAD.pack(len(record), zlib.crc32(record) ^ 1, 9) + b"torn")
    recovered, dead = reopen(old, {7: 1, 8: 1, 10: 1})
    assert dead == 0 and 9 not in recovered
    assert {old_id: recovered.read(old_id) for old_id in bodies} == bodies
    recovered.close()


def test_duplicate_copies_after_interrupted_compaction_later_wins(tmp_path):
    """A crash between a compaction's copies and the old segment's deletion leaves two copies."""
    store = new_store(tmp_path, segment_size=1000)
    payloads = _fill(store, 20)
    in_first = [m for m in payloads if m in store.index and store.index[m].segment == 1]
    for msg_id in in_first[:-2]:
        store.remove(msg_id)
        del payloads[msg_id]
    assert store.compact_step(budget=1)  # one copy made, old segment still there
    store.close(snapshot=False)
    assert 1 in seg_files(tmp_path)
    store, dead = reopen(tmp_path, {m: 1 for m in payloads}, segment_size=1000)
    assert dead >= len(in_first) - 2
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    while store.compact_step():
        pass
    store.cache.clear()
    for msg_id, data in payloads.items():
        assert store.read(msg_id) == data
    store.close()


# -- randomized model check ----------------------------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    """Writes, removes, compaction slices, flushes and reopens against a dict model."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="warren-store-sm-")
        self.kw = dict(segment_size=600, compaction_threshold=0.4, cache_bytes=2000, sidecars=True)
        self.store = new_store(self.dir, **self.kw)
        self.model: dict[int, tuple[bytes, int]] = {}

    def teardown(self) -> None:
        import shutil

        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(data=st.binary(max_size=200), refs=st.integers(1, 3), parts=st.integers(1, 3))
    def write(self, data, refs, parts):
        msg_id = self.store.new_id()
        # beyond every id the store holds (ids whose records are all gone may be reused after a restart)
        assert msg_id > max(self.model, default=0)
        cut = [len(data) * i // parts for i in range(parts + 1)]
        self.store.write(msg_id, tuple(data[cut[i]:cut[i + 1]] for i in range(parts)), refs)
        self.model[msg_id] = (data, refs)

    @precondition(lambda self: self.model)
    @rule(pick=st.integers(0, 10_000), count=st.integers(1, 2))
    def remove(self, pick, count):
        msg_id = sorted(self.model)[pick % len(self.model)]
        data, refs = self.model[msg_id]
        count = min(count, refs)
        self.store.remove(msg_id, count)
        if refs - count:
            self.model[msg_id] = (data, refs - count)
        else:
            del self.model[msg_id]

    @precondition(lambda self: self.model)
    @rule(picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=12))
    def remove_many(self, picks):
        """A batch of references at once (a purge's), an id more than once while it has references left."""
        ids = sorted(self.model)
        batch = []
        left = {msg_id: refs for msg_id, (_, refs) in self.model.items()}
        for pick in picks:
            msg_id = ids[pick % len(ids)]
            if left[msg_id]:
                left[msg_id] -= 1
                batch.append(msg_id)
        self.store.remove_many(np.array(batch, np.int64))
        for msg_id, refs in left.items():
            if refs:
                self.model[msg_id] = (self.model[msg_id][0], refs)
            else:
                del self.model[msg_id]

    @rule(budget=st.sampled_from([1, 100, 10_000]))
    def compact_slice(self, budget):
        self.store.compact_step(budget)

    @rule()
    def compact_all(self):
        steps = 0
        while self.store.compact_step():
            steps += 1
            assert steps < 10_000
        assert not self.store.needs_compaction

    @rule()
    def flush(self):
        self.store.flush()

    @rule()
    def sync(self):
        self.store.sync()

    @rule()
    def clear_cache(self):
        self.store.cache.clear()

    @rule(clean=st.booleans())
    def reopen(self, clean):
        """A clean close (the snapshot: no scan, claims only check) or a crash-like one (scan, then claims)."""
        self.store.close(snapshot=clean)
        self.store, _ = reopen(self.dir, {m: refs for m, (_, refs) in self.model.items()}, **self.kw)
        assert self.store.next_id > max(self.model, default=0)

    @rule()
    def crash(self):
        """The process dies: what it handed the operating system stays, nothing else is done; a recycled segment's
        file then holds its former records after its new ones, which recovery must never take for messages."""
        crash(self.store)
        self.store, _ = reopen(self.dir, {m: refs for m, (_, refs) in self.model.items()}, **self.kw)
        assert self.store.next_id > max(self.model, default=0)

    @invariant()
    def matches_model(self):
        store = self.store
        assert set(store.index) == set(self.model)
        for msg_id, (data, refs) in self.model.items():
            assert store.index[msg_id].refs == refs
            assert store.read(msg_id) == data

    @invariant()
    def files_match_segments(self):
        store = self.store
        doomed = {segment.number for segment in store._doomed}  # deleted: their files go at the next sync
        assert set(list_segments(self.dir)) == set(store.segments) | doomed and not doomed & set(store.segments)
        assert writing(store).number in store.segments
        for number, segment in store.segments.items():
            assert segment.live >= 0
            assert 0 <= segment.dead_bytes <= segment.size + (len(store._tail) if segment is store.current else 0)
            live = sum(1 for loc in store.index.values() if loc.segment == number)
            assert segment.live == live
        stats = store.stats()
        assert 0.0 <= stats.dead_fraction <= 1.0


TestStoreMachine = pytest.mark.long(pytest.mark.timeout(600)(StoreMachine.TestCase))  # (minutes when loaded)
TestStoreMachine.settings = settings(max_examples=150, stateful_step_count=50, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


def test_read_many_reads_runs_of_records_within_a_budget(tmp_path):
    store = new_store(tmp_path, segment_size=1500)
    payloads = _fill(store, 30)  # several segments
    ids = list(payloads)
    store.remove(ids[3])
    unflushed = put(store, b"still in the tail")
    reads = store.reads
    got = store.read_many(ids + [unflushed, 10_000], budget=1 << 20)
    assert got[3] is None and got[-1] is None  # removed; never written
    assert got[-2] == b"still in the tail"
    assert [g for i, g in enumerate(got[:-2]) if i != 3] == [payloads[m] for i, m in enumerate(ids) if i != 3]
    assert store.reads - reads == len(ids) - 1  # records counted, though read a run at a time
    partial = store.read_many(ids[:10], budget=250)  # 100-byte payloads: two fit
    assert partial[:2] == [payloads[ids[0]], payloads[ids[1]]] and partial[2:] == [None] * 8
    store.close()


def test_find_many_and_release_many_agree_with_one_id_at_a_time():
    """Locations.find_many (slices for consecutive ids in order, gathers otherwise) and release_many give
    what find and release give one id at a time: for runs, gaps, shuffles, repeats, absent ids and chunks."""
    from msg_store.locations import CHUNK, Locations

    rng = np.random.default_rng(3)
    for case in range(120):
        ours, theirs = Locations(), Locations()
        held = rng.choice(3 * CHUNK, size=int(rng.integers(1, 2 * CHUNK)), replace=False)
        for msg_id in held.tolist():
            for table in (ours, theirs):
                table.put(msg_id, msg_id % 7, msg_id * 3 % 65536, msg_id % 100 + 1, 1 + msg_id % 2)
        first = int(rng.integers(0, 3 * CHUNK))
        kind = case % 4
        if kind == 0:
            ids = np.arange(first, first + int(rng.integers(1, 2 * CHUNK)))  # a run, across chunks
        elif kind == 1:
            ids = np.sort(rng.choice(4 * CHUNK, size=int(rng.integers(1, CHUNK)), replace=False))  # gaps
        elif kind == 2:
            ids = rng.permutation(np.arange(first, first + int(rng.integers(1, CHUNK))))  # shuffled
        else:
            ids = rng.integers(0, 4 * CHUNK, size=int(rng.integers(1, CHUNK)))  # repeats
        ids = ids.astype(np.int64)
        if case < 4:  # in order across a chunk's end but not consecutive; consecutive but out of order
            ids = np.array([[1, 3, 4], [0, 2, 1, 3], [5, 6, 6, 7], [CHUNK - 1, CHUNK]][case], np.int64)
        found, segments, offsets, sizes = ours.find_many(ids)
        for i, msg_id in enumerate(ids.tolist()):
            expected = theirs.find(msg_id)
            assert bool(found[i]) == (expected is not None)
            if expected is not None:
                assert (int(segments[i]), int(offsets[i]), int(sizes[i])) == expected
        freed, freed_segments, freed_sizes = ours.release_many(ids)
        gone = {}
        for msg_id in ids.tolist():
            result = theirs.release(msg_id, 1)
            if result is not None:
                gone[msg_id] = result
        assert dict(zip(freed.tolist(), zip(freed_segments.tolist(), freed_sizes.tolist()))) == gone
        assert len(ours) == len(theirs)
        assert all(ours.get(m) == theirs.get(m) for m in range(4 * CHUNK))
