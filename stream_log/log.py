"""A stream's messages on disk in the layout of RabbitMQ's osiris: segment files of chunks, and beside each an index
of where its chunks lie.

A chunk (``chunk.HEADER``: osiris's format 0) is what one loop turn of AMQP 0-9-1 publishes brought, or a part of a
publish frame cut as osiris's writer cuts it (``StreamLog.batches``): its entries back to back, then a trailer that
readers are never sent.  The chunks of a frame are written with one write, readable at once, and made durable by
the group commit's fdatasync of their segment file; a stream-protocol subscriber gets a chunk from the segment file
by ``sendfile``.

Files, in ``<data>/streams/<the queue's index id>/``:

- ``<first chunk id, 20 digits>.segment``: ``SEGMENT_HEADER`` (osiris's), then chunks.  A new segment begins when
  the bodies of the current one reach the stream's ``stream-max-segment-size-bytes`` (or ``MAX_SEGMENT_CHUNKS``),
  at most ``ROLLS_PER_COMMIT`` times between two group commits (each costs files made on the loop, synced off it);
  retention removes whole segments, never the one being written.
- ``<same>.index``: ``INDEX_HEADER`` with the number of rows known to name durable chunks (``_Marked``), then a
  ``ROW`` per chunk, written beside the chunk: chunk id, timestamp, position, records, the bytes a reader is sent
  (header and data), the chunk's size with its trailer, and its messages' body bytes (what retention and the
  HTTP API count).  The index is a cache of the segment: it is fsynced once, when its segment is sealed.
- ``writers``: named publishers' last publishing ids as of an offset (``MAX_WRITERS`` at most, the least recent
  forgotten first), rewritten (atomically, off the loop) at most once a second; each chunk a named publisher wrote
  carries that publisher's id in its trailer, as osiris's does, so deduplication survives ``kill -9`` exactly as
  far as the messages it confirmed.
- ``offsets``: consumers' stored offsets, appended at each commit (``tracking``).

Recovery trusts the index rows the header marks durable, checks those after them (contiguous ids and positions,
and the chunk's CRC), scans the segment for chunks past the last good row, and cuts what follows a torn chunk
(with any later segment).  A stream that restarts reads a few rows; it never reads its messages.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import struct
import time
import zlib
from bisect import bisect_right
from collections import OrderedDict
from typing import Callable, Iterable, Iterator

import numpy as np

from amqp_server.clock import now_ms
from amqp_server.logs import Throttle
from . import chunk
from .tracking import Offsets, OffsetsWrite

log = logging.getLogger("warren.stream")
_throttled = Throttle(log, burst=1, interval=10.0)  # the node out of descriptors: said once in a while

SEGMENT_HEADER = b"OSIL\x00\x00\x00\x01"  # osiris's log magic and version
INDEX_HEADER = struct.Struct("<4sIQ")  # magic, version, rows known durable
INDEX_MAGIC, INDEX_VERSION = b"WSIX", 1
ROW = np.dtype([("id", "<u8"), ("ts", "<i8"), ("pos", "<u8"), ("records", "<u4"), ("sent", "<u4"),
                ("size", "<u4"), ("body", "<u4")])
MAX_SEGMENT_CHUNKS = 256_000  # osiris's default too
DEFAULT_SEGMENT_BYTES = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
LOADED_SEGMENTS = 4  # sealed segments whose rows stay in memory (the rest are read again when a reader needs them)
WRITERS_EVERY = 1.0  # seconds between two saves of the writers' snapshot
WRITERS = "writers"
MAX_WRITERS = 255  # named publishers a stream remembers (osiris's tracking keeps as many): the least recent go
MIN_BATCH, MAX_BATCH = 32, 8192  # gen_batch_server's batch sizes, which osiris's writer keeps (``batches``)
IOV_MAX = 1024  # buffers one pwritev takes at most
READ_FDS = 64  # sealed segments' files open for readers at once, across all streams (``ReadFds``)
ROLLS_PER_COMMIT = 16  # new segments begun between two group commits, all streams together (then they grow)


def _name(first: int) -> str:
    return f"{first:020d}"


class StreamSegment:
    """One segment file and its index.  ``rows`` holds its index rows while it is written or was read lately
    (None otherwise: ``StreamLog.rows`` reads them again)."""

    __slots__ = ("first", "path", "fd", "index_fd", "rows", "count", "size", "body", "first_ts", "sealed")

    def __init__(self, first: int, path: str) -> None:
        self.first = first
        self.path = path  # without its suffix
        self.fd = -1  # the segment file, open while the segment is written (readers of a sealed one: ``ReadFds``)
        self.index_fd = -1  # the index file, open while the segment is written
        self.rows: np.ndarray | None = None
        self.count = 0  # chunks
        self.size = len(SEGMENT_HEADER)  # bytes of the file
        self.body = 0  # bytes of its messages' bodies
        self.first_ts = 0
        self.sealed = False  # full: nothing more is written to it


class StreamLog:
    """One stream's chunks.  Offsets run from ``first`` (the first chunk's id) to ``next``; ``body`` is the bytes of
    the messages' bodies there, ``writers`` each named publisher's last publishing id."""

    def __init__(self, directory: str, logs: "StreamLogs") -> None:
        self.directory = directory
        self.logs = logs
        self.segments: list[StreamSegment] = []
        self._firsts: list[int] = []  # each segment's first chunk id, for bisect
        self.first = 0
        self.next = 0
        self.body = 0
        self.last_chunk = 0  # the id of the newest chunk (``next`` when there is none)
        self.writers: dict[str, int] = {}  # least recently written first
        self.offsets = Offsets(directory)  # consumers' stored offsets
        self.segment_bytes = DEFAULT_SEGMENT_BYTES  # stream-max-segment-size-bytes, and the retention limits:
        self.max_bytes: int | None = None  # max-length-bytes
        self.max_age_ms: int | None = None  # max-age
        self._loaded: OrderedDict[StreamSegment, None] = OrderedDict()  # sealed segments with rows in memory
        self._unsynced: list[StreamSegment] = []  # segments written since the last commit, still written
        self._sealed: list[tuple[str, int]] = []  # segments sealed since the last commit: (path, chunks)
        self._dir_dirty = False  # files were created or renamed here since the last commit
        self._writers_saved = 0.0  # when the writers were last saved (monotonic)
        self._writers_dirty = False
        self.deleted = False
        self._dir_made = False  # (the directory is known to be there)
        self._batch = MIN_BATCH  # the entries the next chunk of a frame takes at most (``batches``)

    # -- writing ------------------------------------------------------------------------------

    def batches(self, count: int) -> list[int]:
        """How many of ``count`` entries that came together (a publish frame's) each chunk takes, as osiris's
        writer cuts them: a gen_batch_server that takes at most its batch size of the writes waiting for it into
        a chunk, the batch size starting at ``MIN_BATCH``, doubled (up to ``MAX_BATCH``) after a full batch and
        halved (down to ``MIN_BATCH``) after one that took all that was waiting.  RabbitMQ 3.10 writes a
        frame's 4,999 messages to an idle stream as chunks of 32, 64, ... 2,048 and 935: ``last`` starts at the
        935th from the end."""
        sizes = []
        size = self._batch
        while count >= size:
            sizes.append(size)
            count -= size
            size = min(MAX_BATCH, 2 * size)
        if count:
            sizes.append(count)
            size = max(MIN_BATCH, size // 2)
        self._batch = size
        return sizes

    def append(self, data: bytes, entries: int, records: int, body: int, trailer: bytes = b"",
               timestamp: int = 0) -> int:
        """Write one chunk of ``entries`` entries holding ``records`` records, published now (or at ``timestamp``);
        its id (the first record's offset)."""
        return self.append_chunks([(data, entries, records, body, trailer)], timestamp)

    def append_chunks(self, chunks: list[tuple[bytes | memoryview, int, int, int, bytes]], timestamp: int = 0) -> int:
        """Write chunks, each (data, entries, records, body bytes, trailer), published now (or at ``timestamp``),
        with one write to the segment and one of their index rows; the first one's id.  When they begin a
        segment, retention runs (as osiris's does when a segment rolls); they all go to that segment."""
        segment = self.segments[-1] if self.segments else None
        rolled = segment is None or segment.count >= MAX_SEGMENT_CHUNKS or (
            segment.body >= self.segment_bytes and self.logs.rolls < ROLLS_PER_COMMIT)
        if rolled:
            try:
                segment = self._new_segment(self.next)
            except OSError as exc:  # (out of descriptors, say): the segment being written grows meanwhile
                if segment is None or segment.count + len(chunks) > MAX_SEGMENT_CHUNKS:
                    raise
                _throttled.warning("stream %s: no new segment (%s): the current one grows past its size",
                                   self.directory, exc)
                rolled = False
            else:
                self.logs.rolls += 1
        assert segment is not None
        first_id = chunk_id = self.next
        timestamp = timestamp or now_ms()
        count = first_count = segment.count
        rows = segment.rows
        assert rows is not None
        if count + len(chunks) > len(rows):
            rows = segment.rows = np.resize(rows, max(64, 2 * (count + len(chunks))))
        pos = start = segment.size
        parts: list[bytes | memoryview] = []
        added = 0
        pack, crc32 = chunk.HEADER.pack, zlib.crc32
        for data, entries, records, body, trailer in chunks:
            header = pack(chunk.MAGIC_VERSION, chunk.USER_CHUNK, entries, records, timestamp, chunk.EPOCH, chunk_id,
                          crc32(data), len(data), len(trailer), 0)
            sent = len(header) + len(data)
            size = sent + len(trailer)
            parts += (header, data, trailer) if trailer else (header, data)
            rows[count] = (chunk_id, timestamp, pos, records, sent, size, body)
            last = chunk_id
            count += 1
            pos += size
            added += body
            chunk_id += records
        _write_all(segment.fd, parts, start)
        _write_all(segment.index_fd, [rows[first_count:count].tobytes()],
                   INDEX_HEADER.size + first_count * ROW.itemsize)
        if not first_count:
            segment.first_ts = timestamp
        segment.count = count
        segment.size = pos
        segment.body += added
        self.body += added
        self.last_chunk = last
        self.next = chunk_id
        if not self._unsynced or self._unsynced[-1] is not segment:
            self._unsynced.append(segment)
        self.logs.changed(self)
        if rolled:
            self.retain()
        return first_id

    def writable(self) -> bool:
        """Whether chunks can be written: a segment is open (one is opened now if there is none; False if that
        fails, the node out of descriptors, say, which is logged once in a while)."""
        if self.segments:
            return True
        try:
            self._new_segment(self.next)
        except OSError as exc:
            _throttled.warning("stream %s: cannot open a segment: %s", self.directory, exc)
            return False
        self.logs.changed(self)
        return True

    def wrote(self, reference: str, publishing_id: int) -> None:
        """A named publisher's last publishing id (its chunk's trailer holds it too); beyond ``MAX_WRITERS``
        the one that wrote least recently is forgotten, as osiris forgets it."""
        writers = self.writers
        if writers.pop(reference, None) is None and len(writers) >= MAX_WRITERS:
            del writers[next(iter(writers))]
        writers[reference] = publishing_id
        self._writers_dirty = True

    def store_offset(self, reference: str, offset: int) -> None:
        """A consumer's offset, by reference: durable at the next commit (``tracking``)."""
        self._made()
        self.offsets.store(reference, offset)
        self.logs.changed(self)

    def _made(self) -> None:
        """The stream's directory is there (made now if it was not)."""
        if not self._dir_made:
            if not os.path.isdir(self.directory):
                os.makedirs(self.directory)
                self.logs.dir_changed()
            self._dir_made = True

    def _new_segment(self, first: int) -> StreamSegment:
        """A new segment's files, then the one before sealed (OSError, the node out of descriptors or disk:
        nothing changed)."""
        self._made()
        segment = StreamSegment(first, os.path.join(self.directory, _name(first)))
        try:
            segment.fd = os.open(segment.path + ".segment", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            segment.index_fd = os.open(segment.path + ".index", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(segment.fd, SEGMENT_HEADER)
            os.write(segment.index_fd, INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, 0))
        except OSError:
            self._close(segment)
            for suffix in (".segment", ".index"):
                _unlink(segment.path + suffix)
            raise
        if self.segments:
            self._seal(self.segments[-1])
        segment.rows = np.zeros(64, ROW)
        self.segments.append(segment)
        self._firsts.append(first)
        if len(self.segments) == 1:
            self.first = first
        self._dir_dirty = True
        return segment

    def _seal(self, segment: StreamSegment) -> None:
        """The segment is full: its rows trimmed, its files closed (one write descriptor a stream, however small
        its segments); the next commit opens them again to make them durable, its index marked whole."""
        segment.sealed = True
        if segment.rows is not None:
            segment.rows = segment.rows[:segment.count].copy()
            self._loaded[segment] = None
            self._trim_loaded()
        self._close(segment)
        self._sealed.append((segment.path, segment.count))
        self._dir_dirty = True

    # -- retention ----------------------------------------------------------------------------

    def retain(self) -> None:
        """Remove whole segments, oldest first, while the stream holds more than ``max_bytes`` of bodies or the
        next segment began more than ``max_age_ms`` ago (so every message of the removed one is older); never the
        segment being written."""
        max_bytes, max_age_ms = self.max_bytes, self.max_age_ms
        if max_bytes is None and max_age_ms is None:
            return
        oldest = now_ms() - max_age_ms if max_age_ms is not None else None
        while len(self.segments) > 1:
            following = self.segments[1]
            if not ((max_bytes is not None and self.body > max_bytes)
                    or (oldest is not None and following.count and following.first_ts < oldest)):
                break
            self._remove_segment(self.segments[0])

    def _remove_segment(self, segment: StreamSegment) -> None:
        self.segments.pop(0)
        self._firsts.pop(0)
        self._loaded.pop(segment, None)
        self.body -= segment.body
        self.first = self.segments[0].first if self.segments else self.next
        self._close(segment)
        for suffix in (".segment", ".index"):
            _unlink(segment.path + suffix)
        self._dir_dirty = True
        self.logs.changed(self)

    def _close(self, segment: StreamSegment) -> None:
        for fd in (segment.fd, segment.index_fd):
            if fd >= 0:
                os.close(fd)
        segment.fd = segment.index_fd = -1
        self.logs.read_fds.drop(segment)
        if segment in self._unsynced:
            self._unsynced.remove(segment)

    # -- reading ------------------------------------------------------------------------------

    def find(self, offset: int) -> tuple[StreamSegment, int] | None:
        """The chunk holding ``offset`` (the first chunk for an offset below the stream): its segment and row;
        None at or past ``next``."""
        if offset >= self.next or not self.segments:
            return None
        k = bisect_right(self._firsts, offset) - 1
        if k < 0:
            return self.segments[0], 0
        segment = self.segments[k]
        rows = self.rows(segment)
        i = int(np.searchsorted(rows["id"][:segment.count], offset, "right")) - 1
        return segment, max(i, 0)

    def after(self, segment: StreamSegment, i: int) -> tuple[StreamSegment, int] | None:
        """The chunk after row ``i`` of ``segment``, if there is one."""
        if i + 1 < segment.count:
            return segment, i + 1
        k = bisect_right(self._firsts, segment.first)
        if k < len(self.segments) and self.segments[k - 1] is segment:
            following = self.segments[k]
            return (following, 0) if following.count else None
        return None

    def rows(self, segment: StreamSegment) -> np.ndarray:
        """The segment's index rows (read from its index file if they are not in memory)."""
        rows = segment.rows
        if rows is None:
            with open(segment.path + ".index", "rb") as file:
                file.seek(INDEX_HEADER.size)
                rows = segment.rows = np.fromfile(file, ROW, segment.count)
            self._loaded[segment] = None
            self._trim_loaded()
        elif segment.sealed:
            self._loaded.move_to_end(segment)
        return rows

    def _trim_loaded(self) -> None:
        while len(self._loaded) > LOADED_SEGMENTS:
            segment, _ = self._loaded.popitem(last=False)
            segment.rows = None

    def fd(self, segment: StreamSegment) -> int:
        """The segment file, open for reading until another is opened (the one being written: while it is)."""
        return segment.fd if segment.fd >= 0 else self.logs.read_fds.get(segment)

    def chunk_bytes(self, segment: StreamSegment, i: int) -> bytes:
        """Row ``i``'s chunk as readers get it: header and data (never the trailer)."""
        row = self.rows(segment)[i]
        return os.pread(self.fd(segment), int(row["sent"]), int(row["pos"]))

    def chunks(self, start: int) -> Iterator[tuple[StreamSegment, int]]:
        """Every chunk from the one holding ``start`` on, as (segment, row)."""
        at = self.find(start)
        while at is not None:
            yield at
            at = self.after(*at)

    def span(self, start: int, end: int, records: int, max_bytes: int) -> ChunkSpan:
        """The chunks from the one holding ``start`` on, below ``end``, until they hold ``records`` records from
        ``start`` on or ``max_bytes`` bytes (one chunk at least): a few array operations a segment."""
        span = ChunkSpan(start, end)
        parts: list[np.ndarray] = []
        counted = taken = 0
        found = self.find(start)
        while found is not None and counted < records and taken < max_bytes:
            segment, i = found
            rows = self.rows(segment)[i:segment.count]
            rows = rows[rows["id"] < end]
            if not len(rows):
                break
            adds = rows["records"].astype(np.int64)
            adds[0] -= max(start - int(rows["id"][0]), 0)  # (the first chunk may hold offsets below start)
            held = counted + np.cumsum(adds)
            sent = taken + np.cumsum(rows["sent"].astype(np.int64))
            before = (np.concatenate(([counted], held[:-1])) < records) & (
                np.concatenate(([taken], sent[:-1])) < max_bytes)
            keep = int(np.count_nonzero(before))  # a prefix: both sums only grow
            parts.append(np.full(keep, len(span.fds), np.uint32))
            parts.append(rows[:keep])
            span.fds.append(os.dup(self.fd(segment)))
            counted, taken = int(held[keep - 1]), int(sent[keep - 1])
            if keep < len(rows):
                break
            found = self.after(segment, i + keep - 1)
        if parts:
            rows = np.concatenate(parts[1::2])
            span.files = np.concatenate(parts[0::2])
            span.positions = rows["pos"].astype(np.uint64)
            span.sizes = rows["sent"].astype(np.uint32)
            span.ids = rows["id"].astype(np.uint64)
        return span

    def at_time(self, ms: int) -> int:
        """The first chunk published at or after ``ms`` (osiris's timestamp offset), or ``next``."""
        if not self.segments:
            return self.next
        firsts = [segment.first_ts for segment in self.segments]
        k = max(bisect_right(firsts, ms) - 1, 0)
        for segment in self.segments[k:]:
            timestamps = self.rows(segment)["ts"][:segment.count]
            found = np.flatnonzero(timestamps >= ms)
            if len(found):
                return int(self.rows(segment)["id"][found[0]])
        return self.next

    # -- the group commit ---------------------------------------------------------------------

    def sync_job(self) -> "SyncJob":
        """What the next group commit makes durable here (taken on the loop: the descriptors are duplicates, the
        job's own)."""
        job = SyncJob()
        job.sealed, self._sealed = self._sealed, []
        for segment in self._unsynced:
            job.data.append(os.dup(segment.fd))
            job.marks.append(_Marked(os.dup(segment.index_fd), segment.count))
        self._unsynced = []
        if self._dir_dirty:
            job.dirs.append(self.directory)
            self._dir_dirty = False
        job.offsets = self.offsets.take()
        if self._writers_dirty and (time.monotonic() - self._writers_saved >= WRITERS_EVERY or self.logs.closing):
            job.writers = (os.path.join(self.directory, WRITERS), self.next, dict(self.writers))
            self._writers_dirty = False
            self._writers_saved = time.monotonic()
        return job

    @property
    def writers_pending(self) -> bool:
        """The writers changed since their snapshot was last taken."""
        return self._writers_dirty

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> None:
        """Open what is on disk: segments in order, each checked past what its index marks durable, a torn tail
        cut; then the writers as of their snapshot, and from the trailers since."""
        names = sorted(name[:-len(".segment")] for name in os.listdir(self.directory) if name.endswith(".segment"))
        expected: int | None = None
        for position, name in enumerate(names):
            segment = StreamSegment(int(name), os.path.join(self.directory, name))
            if expected is not None and segment.first != expected:  # after a cut, or a gap: nothing here counts
                log.warning("stream %s: segment %s dropped (expected one at %d)", self.directory, name, expected)
                for suffix in (".segment", ".index"):
                    _unlink(segment.path + suffix)
                continue
            complete = _recover_segment(segment, last=position == len(names) - 1)
            if not segment.count and position < len(names) - 1:
                for suffix in (".segment", ".index"):
                    _unlink(segment.path + suffix)
                continue
            self.segments.append(segment)
            self._firsts.append(segment.first)
            self.body += segment.body
            rows = segment.rows
            assert rows is not None
            expected = segment.first + int(rows["records"][:segment.count].sum())
            if segment.count:
                self.last_chunk = int(rows["id"][segment.count - 1])
            self.next = expected
            if not complete:
                expected = -1  # a torn chunk was cut: the segments after it go
        if self.segments:
            self.first = self.segments[0].first
            if not self.segments[0].count:
                self.first = self.next
            last = self.segments[-1]
            last.fd = os.open(last.path + ".segment", os.O_RDWR)
            last.index_fd = os.open(last.path + ".index", os.O_RDWR)
            for segment in self.segments[:-1]:
                segment.sealed = True
                segment.rows = None  # read again when a reader needs them
        if not self.segments or self.segments[-1].count == 0:
            self.last_chunk = self.next
        self._recover_writers()
        self.offsets.recover()

    def _recover_writers(self) -> None:
        upto = 0
        try:
            with open(os.path.join(self.directory, WRITERS), "rb") as file:
                saved = json.loads(file.read())
            for reference, value in saved["writers"].items():
                self.wrote(str(reference), int(value))
            upto = int(saved["upto"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("stream %s: writers' snapshot unreadable (%s): trailers from the start are read",
                        self.directory, exc)
            self.writers = {}
        for segment, i in self.chunks(max(upto, self.first)):
            row = self.rows(segment)[i]
            if row["id"] < upto or row["size"] == row["sent"]:
                continue
            trailer = os.pread(self.fd(segment), int(row["size"] - row["sent"]), int(row["pos"] + row["sent"]))
            for reference, value in chunk.read_trailer(trailer):
                if reference:
                    self.wrote(reference, value)

    def close(self) -> None:
        for segment in self.segments:
            self._close(segment)

    def delete(self) -> None:
        """The stream is gone: its files go with the next group commit (``StreamLogs.doom``), never on the loop,
        where a sync may be writing its offsets or its writers' snapshot there meanwhile."""
        self.deleted = True
        self._dir_made = False
        self.close()
        self.segments.clear()
        self._firsts.clear()
        self._loaded.clear()
        self._unsynced = []
        self.logs.doom(self.directory)


class ChunkSpan:
    """Where the chunks holding offsets ``start`` to ``end`` lie (``StreamLog.span``), for a reader in another
    process: chunk ``i`` (first offset ``ids[i]``) is the ``sizes[i]`` bytes (header and data) at ``positions[i]``
    of the segment file open as ``fds[files[i]]``.  The descriptors are duplicates, the holder's to close: they
    stay that file whatever retention does meanwhile."""

    __slots__ = ("fds", "files", "positions", "sizes", "ids", "start", "end")

    def __init__(self, start: int, end: int) -> None:
        self.fds: list[int] = []
        self.files = np.zeros(0, np.uint32)
        self.positions = np.zeros(0, np.uint64)
        self.sizes = np.zeros(0, np.uint32)
        self.ids = np.zeros(0, np.uint64)
        self.start = start
        self.end = end

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class _Marked:
    """An index file whose header is to say that ``rows`` rows name durable chunks, once the data is synced."""

    __slots__ = ("fd", "rows")

    def __init__(self, fd: int, rows: int) -> None:
        self.fd = fd
        self.rows = rows


class SyncJob:
    """What one group commit makes durable (``StreamLogs.sync`` runs it off the loop)."""

    __slots__ = ("data", "marks", "sealed", "dirs", "writers", "offsets", "removed")

    def __init__(self) -> None:
        self.data: list[int] = []  # segment files written
        self.marks: list[_Marked] = []
        self.sealed: list[tuple[str, int]] = []  # segments now full (closed): (path, chunks)
        self.dirs: list[str] = []  # directories where files came or went
        self.writers: tuple[str, int, dict[str, int]] | None = None  # the snapshot's path, upto, writers
        self.offsets: OffsetsWrite | None = None
        self.removed: list[str] = []  # deleted streams' directories (``StreamLogs.doom``)

    def run(self) -> None:
        try:
            for path, rows in self.sealed:
                _sync_sealed(path, rows)
            for fd in self.data:
                os.fdatasync(fd)
            for marked in self.marks:  # only now: the rows it marks name chunks on disk
                os.pwrite(marked.fd, struct.pack("<Q", marked.rows), 8)
            if self.offsets is not None and self.offsets.run():
                self.dirs.append(os.path.dirname(self.offsets.path))
            if self.writers is not None:
                path, upto, writers = self.writers
                _replace(path, json.dumps({"upto": upto, "writers": writers}).encode())
                self.dirs.append(os.path.dirname(path))
            for directory in self.removed:
                _remove_dir(directory)
            for directory in dict.fromkeys(self.dirs):
                _sync_dir(directory)
        finally:
            for fd in self.data:
                os.close(fd)
            for marked in self.marks:
                os.close(marked.fd)


class ReadFds:
    """Sealed segments' files open for readers, shared by every stream: at most ``size``, the least recently
    read closed first, so that descriptors stay few however many segments readers touch.  A file that cannot be
    opened for want of descriptors is opened again once the others are closed."""

    def __init__(self, size: int = READ_FDS) -> None:
        self.size = size
        self._open: OrderedDict[StreamSegment, int] = OrderedDict()

    def get(self, segment: StreamSegment) -> int:
        fd = self._open.get(segment)
        if fd is not None:
            self._open.move_to_end(segment)
            return fd
        while len(self._open) >= self.size:
            self._close_oldest()
        try:
            fd = os.open(segment.path + ".segment", os.O_RDONLY)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._open:
                raise
            while self._open:
                self._close_oldest()
            fd = os.open(segment.path + ".segment", os.O_RDONLY)
        self._open[segment] = fd
        return fd

    def _close_oldest(self) -> None:
        _, fd = self._open.popitem(last=False)
        os.close(fd)

    def drop(self, segment: StreamSegment) -> None:
        fd = self._open.pop(segment, None)
        if fd is not None:
            os.close(fd)

    def __len__(self) -> int:
        return len(self._open)


class StreamLogs:
    """Every stream's log on this node, under ``<data>/streams``: opened by their queue's index id, written on the
    loop, made durable in the group commit (``commit`` on the loop, then ``sync`` off it: ``persistence``)."""

    def __init__(self, directory: str, changed: Callable[[], None]) -> None:
        self.directory = directory
        self._changed = changed  # the group commit has work (persistence.stage)
        self.logs: dict[int, StreamLog] = {}
        self._dirty: dict[StreamLog, None] = {}
        self._root_dirty = False
        self._doomed: list[str] = []  # deleted streams' directories, removed by the next commit's sync
        self._job: list[SyncJob] = []
        self.closing = False
        self._committing = False  # (what ``commit`` writes is in the commit under way: no other is asked for)
        self._buffered: dict[Callable[[], None], None] = {}  # what writes a buffered chunk (a stream queue's turn)
        self.read_fds = ReadFds()
        self.rolls = 0  # segments begun since the last commit (``ROLLS_PER_COMMIT``)

    def open(self, index_id: int) -> StreamLog:
        """The log of the stream whose queue has ``index_id``: recovered from disk if it is there."""
        found = self.logs.get(index_id)
        if found is not None:
            return found
        stream_log = self.logs[index_id] = StreamLog(os.path.join(self.directory, str(index_id)), self)
        if os.path.isdir(stream_log.directory):
            started = time.monotonic()
            stream_log.recover()
            log.info("stream log %d: %d offsets (%d to %d) in %d segments, recovered in %.3fs", index_id,
                     stream_log.next - stream_log.first, stream_log.first, stream_log.next, len(stream_log.segments),
                     time.monotonic() - started)
        return stream_log

    def forget(self, index_id: int) -> None:
        stream_log = self.logs.pop(index_id, None)
        if stream_log is not None:
            self._dirty.pop(stream_log, None)
            stream_log.delete()

    def drop_orphans(self, known: Iterable[int]) -> None:
        """Logs of queues that no longer exist (deleted while the node was down, or before their files went)."""
        if not os.path.isdir(self.directory):
            return
        keep = {str(index_id) for index_id in known}
        for name in os.listdir(self.directory):
            if name not in keep:
                path = os.path.join(self.directory, name)
                log.info("stream log %s: no such stream, removed", name)
                _remove_dir(path)

    def buffered(self, flush: Callable[[], None]) -> None:
        """``flush`` writes a chunk being gathered: the next commit, asked for now, calls it first if the loop has
        not yet."""
        self._buffered[flush] = None
        self._changed()

    def changed(self, stream_log: StreamLog) -> None:
        if stream_log not in self._dirty:
            self._dirty[stream_log] = None
        if not self._committing:
            self._changed()

    def doom(self, directory: str) -> None:
        """A deleted stream's directory goes in the next commit's sync, after the writes there of the commit being
        synced (the group commit runs one sync at a time), so nothing writes there while it goes."""
        self._doomed.append(directory)
        self.dir_changed()

    def dir_changed(self) -> None:
        self._root_dirty = True
        if not self._committing:
            self._changed()

    def commit(self) -> None:
        """On the loop, at the start of a group commit: buffered chunks are written, and what the commit is to make
        durable is taken."""
        self.rolls = 0
        self._committing = True
        try:
            while self._buffered:  # one the disk refuses raises: it and those after it stay for the commit's retry
                flush = next(iter(self._buffered))
                flush()
                del self._buffered[flush]
        finally:
            self._committing = False
        jobs = [stream_log.sync_job() for stream_log in self._dirty if not stream_log.deleted]
        # a writers' snapshot not due yet is taken by a later commit
        self._dirty = {stream_log: None for stream_log in self._dirty if stream_log.writers_pending}
        if self._root_dirty:
            root = SyncJob()
            root.removed, self._doomed = self._doomed, []
            root.dirs.append(self.directory)
            jobs.append(root)
            self._root_dirty = False
        self._job = jobs

    def sync(self) -> None:
        """Off the loop: the taken writes become durable."""
        jobs, self._job = self._job, []
        for job in jobs:
            job.run()

    def close(self) -> None:
        """At shutdown: what is written becomes durable (the writers' snapshots too), then the files close."""
        self.closing = True
        self.commit()
        self.sync()
        for stream_log in self.logs.values():
            stream_log.close()


def _recover_segment(segment: StreamSegment, last: bool) -> bool:
    """Read a segment's index; check the rows past its durable mark and scan for chunks past its last good row.
    The segment ends at its last sound chunk; False if something after it was cut off (what followed is lost)."""
    path = segment.path
    try:
        with open(path + ".index", "rb") as file:
            head = file.read(INDEX_HEADER.size)
            raw = file.read()
        magic, version, marked = INDEX_HEADER.unpack(head)
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            raise ValueError("not a stream index")
    except (OSError, ValueError, struct.error) as exc:
        log.warning("%s.index: unreadable (%s): rebuilt from the segment", path, exc)
        raw, marked = b"", -1
    on_file = np.frombuffer(raw[:len(raw) // ROW.itemsize * ROW.itemsize], ROW)
    fd = os.open(path + ".segment", os.O_RDWR)
    try:
        file_size = os.fstat(fd).st_size
        if os.pread(fd, len(SEGMENT_HEADER), 0) != SEGMENT_HEADER:
            log.warning("%s.segment: no segment header: emptied", path)
            os.ftruncate(fd, 0)
            os.pwrite(fd, SEGMENT_HEADER, 0)
            file_size, on_file = len(SEGMENT_HEADER), on_file[:0]
        good = _good_rows(fd, on_file, segment.first, max(marked, 0), file_size)
        rows = on_file[:good]
        if good:
            pos, expected = int(rows[-1]["pos"] + rows[-1]["size"]), int(rows[-1]["id"] + rows[-1]["records"])
        else:
            pos, expected = len(SEGMENT_HEADER), segment.first
        scanned, end = _scan(fd, pos, expected, file_size)
        if scanned:
            rows = np.concatenate([rows, np.array(scanned, ROW)])
        if end < file_size:
            log.warning("%s.segment: cut at %d, %d bytes after it (a chunk a crash tore)", path, end, file_size - end)
            os.ftruncate(fd, end)
            os.fsync(fd)
        if marked != len(rows) or len(on_file) != len(rows) or len(raw) % ROW.itemsize:
            _replace(path + ".index", INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, len(rows)) + rows.tobytes())
    finally:
        os.close(fd)
    segment.size = end
    segment.count = len(rows)
    segment.body = int(rows["body"].sum())
    segment.first_ts = int(rows["ts"][0]) if len(rows) else 0
    segment.rows = np.concatenate([rows, np.zeros(max(64, len(rows)), ROW)]) if last else rows.copy()
    return end == file_size


def _good_rows(fd: int, rows: np.ndarray, first: int, marked: int, file_size: int) -> int:
    """How many of ``rows`` hold: ids and positions follow on from ``first`` without a gap, every chunk lies in the
    file, and those past the first ``marked`` have a chunk whose header and CRC agree."""
    if not len(rows):
        return 0
    ids, records = rows["id"].astype(np.int64), rows["records"].astype(np.int64)
    pos, size = rows["pos"].astype(np.int64), rows["size"].astype(np.int64)
    expected_ids = first + np.concatenate(([0], np.cumsum(records)[:-1]))
    expected_pos = len(SEGMENT_HEADER) + np.concatenate(([0], np.cumsum(size)[:-1]))
    ok = (ids == expected_ids) & (pos == expected_pos) & (pos + size <= file_size) & (records > 0)
    good = len(rows) if ok.all() else int(np.argmin(ok))
    for i in range(min(marked, good), good):
        row = rows[i]
        found = _read_chunk(fd, int(row["pos"]), int(row["id"]), file_size)
        if found is None or found[1] != int(row["size"]):
            return i
    return good


def _read_chunk(fd: int, pos: int, chunk_id: int, file_size: int) -> tuple[tuple, int, bytes] | None:
    """The chunk at ``pos`` if it is whole and sound (its header, its size, its data): (header fields, size, data)."""
    if pos + chunk.HEADER.size > file_size:
        return None
    raw = os.pread(fd, chunk.HEADER.size, pos)
    fields = chunk.HEADER.unpack(raw)
    magic, kind, entries, records, _ts, _epoch, found_id, crc, data_len, trailer_len, _reserved = fields
    size = chunk.HEADER.size + data_len + trailer_len
    if magic != chunk.MAGIC_VERSION or kind != chunk.USER_CHUNK or found_id != chunk_id or not records \
            or pos + size > file_size:
        return None
    data = os.pread(fd, data_len + trailer_len, pos + chunk.HEADER.size)
    if len(data) != data_len + trailer_len or zlib.crc32(data[:data_len]) != crc:
        return None
    return fields, size, data


def _scan(fd: int, pos: int, chunk_id: int, file_size: int) -> tuple[list[tuple], int]:
    """Chunks from ``pos`` on, while they are sound: their rows, and where the last ends."""
    rows = []
    while pos < file_size:
        found = _read_chunk(fd, pos, chunk_id, file_size)
        if found is None:
            break
        fields, size, data = found
        _magic, _kind, entries, records, timestamp, _epoch, _id, _crc, data_len, _trailer_len, _r = fields
        body = chunk.body_bytes(data[:data_len], entries, data[data_len:])
        rows.append((chunk_id, timestamp, pos, records, chunk.HEADER.size + data_len, size, body))
        pos += size
        chunk_id += records
    return rows, pos


def _write_all(fd: int, parts: list[bytes | memoryview], pos: int) -> None:
    """Write ``parts`` at ``pos`` (the file's end); on failure the file is cut back to ``pos`` before raising."""
    at = pos
    try:
        for first in range(0, len(parts), IOV_MAX):
            group = parts[first:first + IOV_MAX]
            total = sum(len(part) for part in group)
            written = os.pwritev(fd, group, at)
            while written < total:  # (a regular file takes it all but for an error: then this raises)
                rest = b"".join(group)[written:]
                written += os.pwrite(fd, rest, at + written)
            at += total
    except OSError:
        os.ftruncate(fd, pos)
        raise


def _replace(path: str, data: bytes) -> None:
    """Write a file whole and durable under its name (a crash leaves the old one or the new one)."""
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _sync_sealed(path: str, rows: int) -> None:
    """A full segment made durable, then its index marked whole and made durable (gone meanwhile: nothing)."""
    try:
        fd = os.open(path + ".segment", os.O_RDONLY)
    except FileNotFoundError:  # (retention removed it)
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    try:
        fd = os.open(path + ".index", os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        os.pwrite(fd, struct.pack("<Q", rows), 8)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _remove_dir(path: str) -> None:
    """A deleted stream's directory and its files (gone already: nothing).  One that stays is logged, not raised:
    it holds nothing a client was promised, and the next start removes it (``drop_orphans``)."""
    try:
        for name in os.listdir(path):
            _unlink(os.path.join(path, name))
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("stream log %s: not removed (%s): removed at the next start", path, exc)


def _sync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:  # (deleted meanwhile)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
