"""A stream's tracking in-process: consumers' stored offsets kept per reference and appended at each commit (no
write of their own, nothing rewritten whole on the loop), bounded per stream as osiris bounds its writers; named
publishers bounded likewise, their snapshot made off the loop."""
from __future__ import annotations

import os
import time

from stream_log import log as stream_log, tracking
from stream_log.log import MAX_WRITERS, StreamLogs


def committed(logs: StreamLogs) -> None:
    logs.commit()
    logs.sync()


def test_stored_offsets_are_appended_at_the_commit_and_recovered(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.store_offset("a", 5)
    log.store_offset("b", 7)
    log.store_offset("a", 9)
    assert not (tmp_path / "1" / tracking.OFFSETS).exists()  # nothing written by the store itself
    committed(logs)
    size = (tmp_path / "1" / tracking.OFFSETS).stat().st_size
    log.store_offset("c", 1)
    committed(logs)
    assert (tmp_path / "1" / tracking.OFFSETS).stat().st_size == size + 2 + 1 + 8  # only "c" appended
    again = StreamLogs(str(tmp_path), lambda: None).open(1)
    assert again.offsets.values == {"b": 7, "a": 9, "c": 1}


def test_a_torn_last_entry_is_cut_and_later_ones_follow_the_last_whole_one(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.append(b"\x00\x00\x00\x01x", 1, 1, 1)
    log.store_offset("a", 5)
    committed(logs)
    with open(tmp_path / "1" / tracking.OFFSETS, "ab") as file:
        file.write(b"\x01\x05abc")  # a crash in the middle of an append
    again_logs = StreamLogs(str(tmp_path), lambda: None)
    again = again_logs.open(1)
    assert again.offsets.values == {"a": 5}
    again.store_offset("b", 6)
    committed(again_logs)
    assert StreamLogs(str(tmp_path), lambda: None).open(1).offsets.values == {"a": 5, "b": 6}


def test_a_burst_of_ten_thousand_references_is_bounded_and_costs_little_on_the_loop(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    started = time.perf_counter()
    for k in range(10_000):
        log.store_offset(f"{k:0255d}", k)
    logs.commit()  # on the loop: takes the work
    on_loop = time.perf_counter() - started
    logs.sync()  # off it
    assert len(log.offsets.values) == tracking.MAX_OFFSETS
    assert log.offsets.get(f"{9_999:0255d}") == 9_999 and log.offsets.get(f"{0:0255d}") is None
    assert on_loop < 1.0
    assert StreamLogs(str(tmp_path), lambda: None).open(1).offsets.values == log.offsets.values


def test_the_offsets_file_is_rewritten_once_it_holds_twice_what_is_live(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    for turn in range(2000):
        log.store_offset("same", turn)
        committed(logs)
    assert (tmp_path / "1" / tracking.OFFSETS).stat().st_size <= 2 * 15 + tracking.COMPACT_FROM + 15
    assert StreamLogs(str(tmp_path), lambda: None).open(1).offsets.values == {"same": 1999}


def test_named_publishers_are_bounded_the_least_recent_forgotten(tmp_path, monkeypatch):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.append(b"\x00\x00\x00\x01x", 1, 1, 1)
    for k in range(MAX_WRITERS + 100):
        log.wrote(f"p{k}", k)
        if k == MAX_WRITERS + 50:
            log.wrote("p0", 1000)  # written again: among the most recent
    assert len(log.writers) == MAX_WRITERS
    assert log.writers["p0"] == 1000 and "p1" not in log.writers and log.writers[f"p{MAX_WRITERS + 99}"] == 354
    monkeypatch.setattr(stream_log, "WRITERS_EVERY", 0.0)
    committed(logs)
    again = StreamLogs(str(tmp_path), lambda: None).open(1)
    assert again.writers == log.writers


def test_the_writers_snapshot_is_made_off_the_loop(tmp_path, monkeypatch):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.append(b"\x00\x00\x00\x01x", 1, 1, 1)
    for k in range(MAX_WRITERS):
        log.wrote(f"p{k}", k)
    dumped: list[int] = []
    real = stream_log.json.dumps
    def counted(value):
        dumped.append(1)
        return real(value)

    monkeypatch.setattr(stream_log.json, "dumps", counted)
    logs.closing = True  # (a snapshot is due)
    logs.commit()
    assert not dumped  # nothing serialised on the loop
    logs.sync()
    assert dumped and os.path.exists(tmp_path / "1" / stream_log.WRITERS)
