"""File descriptors of stream logs, in-process: one write descriptor a stream and a small shared set for readers,
however small the segments; a node out of descriptors refuses new work and says so once in a while, and nothing
it logs, nor an error once it runs, takes it down or passes for a failure to start."""
from __future__ import annotations

import errno
import logging
import os
import struct

import pytest

from amqp_server import logs as node_logs
from amqp_server.node import server
from stream_log import log as stream_log
from stream_log.log import READ_FDS, StreamLogs


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def entry(record: bytes) -> bytes:
    return struct.pack(">I", len(record)) + record


def test_one_byte_segments_hold_no_descriptor_each_written_or_read(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.segment_bytes = 1  # every chunk rolls a new segment
    before = open_fds()
    for k in range(2000):
        log.append(entry(b"m%d" % k), 1, 1, 2)
        if k % 10 == 0:
            logs.commit()
            logs.sync()
    logs.commit()
    logs.sync()
    assert len(log.segments) == 2000
    assert open_fds() - before <= 2  # the segment being written and its index
    for segment, i in log.chunks(0):
        assert log.chunk_bytes(segment, i).endswith(b"m%d" % segment.first)
    assert open_fds() - before <= 2 + READ_FDS
    logs.close()
    assert open_fds() <= before


def test_out_of_descriptors_a_stream_writes_on_in_its_segment_and_a_new_one_is_refused(tmp_path, monkeypatch,
                                                                                      caplog):
    logs = StreamLogs(str(tmp_path), lambda: None)
    written = logs.open(1)
    written.segment_bytes = 1
    written.append(entry(b"first"), 1, 1, 5)
    real_open = os.open

    def emfile(path, *args, **kwargs):
        if str(path).endswith((".segment", ".index")):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(stream_log.os, "open", emfile)
    stream_log._throttled._window = 0.0  # (a fresh window: the first line of it is logged)
    with caplog.at_level(logging.WARNING, "warren.stream"):
        for _ in range(50):
            written.append(entry(b"more"), 1, 1, 4)  # the segment was full: it grows instead
        fresh = logs.open(2)
        assert not fresh.writable()
        assert not fresh.writable()
    assert written.next == 51 and len(written.segments) == 1
    said = [record for record in caplog.records if "Too many open files" in record.getMessage()]
    assert 1 <= len(said) <= 2  # once in a while, not once per write
    monkeypatch.setattr(stream_log.os, "open", real_open)
    written.append(entry(b"later"), 1, 1, 5)
    assert len(written.segments) == 2 and fresh.writable()
    logs.close()


def test_a_log_line_whose_rendering_fails_is_written_plainly_and_raises_nothing(capsys, monkeypatch):
    handler = node_logs.Handler(rich_tracebacks=True, show_path=False)

    def out_of_descriptors(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(handler, "render", out_of_descriptors)
    try:
        raise OSError(errno.EMFILE, "Too many open files")
    except OSError:
        import sys
        record = logging.LogRecord("warren", logging.ERROR, __file__, 1, "internal error on %s", ("c1",),
                                   exc_info=sys.exc_info())
    handler.handle(record)  # raises nothing
    assert "internal error on c1" in capsys.readouterr().err


def test_an_error_once_the_node_runs_is_not_reported_as_a_failure_to_start(tmp_path, monkeypatch, caplog):
    async def runs_then_fails(config) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(server, "serve", runs_then_fails)
    monkeypatch.setattr(node_logs, "setup", lambda level: None)
    with caplog.at_level(logging.ERROR):
        assert server.main(["--data-dir", str(tmp_path), "--amqp-port", "0"]) == 1
    text = caplog.text
    assert "cannot start" not in text and "Too many open files" in text


@pytest.mark.parametrize("size", [1, 5])
def test_the_shared_read_descriptors_are_bounded_across_streams(tmp_path, size):
    logs = StreamLogs(str(tmp_path), lambda: None)
    logs.read_fds.size = size
    streams = [logs.open(k) for k in range(1, 4)]
    for log in streams:
        log.segment_bytes = 1
        for _ in range(10):
            log.append(entry(b"x"), 1, 1, 1)
    logs.commit()
    logs.sync()
    for log in streams:
        for segment, i in log.chunks(0):
            log.chunk_bytes(segment, i)
            assert len(logs.read_fds) <= size
    logs.close()


def test_segments_begun_between_two_commits_are_bounded_the_segment_grows_meanwhile(tmp_path):
    logs = StreamLogs(str(tmp_path), lambda: None)
    log = logs.open(1)
    log.segment_bytes = 1
    for _ in range(100):
        log.append(entry(b"x"), 1, 1, 1)
    assert len(log.segments) == stream_log.ROLLS_PER_COMMIT
    assert log.segments[-1].count == 100 - stream_log.ROLLS_PER_COMMIT + 1
    logs.commit()
    logs.sync()
    log.append(entry(b"y"), 1, 1, 1)
    assert len(log.segments) == stream_log.ROLLS_PER_COMMIT + 1
    logs.close()
