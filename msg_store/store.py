"""The shared message store (RabbitMQ's rabbit_msg_store), one per kind (persistent, transient).

A message is written once, however many queues hold it, and reference
counted.  ``write`` appends to an in-memory tail that ``flush`` hands to the
current segment file and ``sync`` makes durable; the caller batches many
writes per ``sync`` (group commit).  ``remove`` only drops a reference: bytes
become dead in their segment's summary, a segment with no live record left is
deleted, and one whose dead fraction passes the threshold is compacted — its
live records moved to the tail a slice at a time by ``compact_step``.  A deleted
segment's file is kept (a few at a time) to be written again as a new segment:
its blocks and page cache are reused rather than freed and allocated again.

The index (msg_id → segment, offset, size, refs) is compact arrays
(:mod:`locations`).  A clean ``close`` saves it whole; after a crash it is
rebuilt from the full segments' sidecars and a scan of the rest.  Payloads
read one by one are kept in an LRU cache; a batch a queue brings back into
memory is read a run of records at a time (``read_many``).
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from array import array

import numpy as np
from cachetools import LRUCache
from crc32c import crc32c

from .locations import Locations, fsync_dir
from .segment import (HEAD_SIZE, SPARE_SUFFIX, Segment, encode_head, head_of, list_segments, list_sidecars,
                      new_records, preallocate, read_sidecar, scan, segment_path, sidecar_path, spare_path,
                      started_crc, write_sidecar)

log = logging.getLogger("warren.msg_store")

_SNAPSHOT_HEAD = struct.Struct(">QI")  # next id, segments
_SEGMENT_SUMMARY = struct.Struct(">IQQQ")  # number, size, live records, dead bytes

DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
COMPACT_SLICE = 4 * 1024 * 1024
COPY_SLICE = 1024 * 1024  # what ``write_from`` holds of a body it copies from one record to another
READ_GAP = 64 * 1024  # dead bytes between two wanted records that read_many reads through rather than seek
WRITE_THROUGH = 64 * 1024  # a record whose body is this large goes to its file from its own buffers, not via the tail
SPARES = 4  # deleted segments' files kept to be written again (see ``unlink``)
SPARE_LIFE = 1.0  # seconds a spare waits to be written again before its file goes (its disk given back)
ID_FILE = "next_id"
ID_BLOCK = 1 << 20
SNAPSHOT = "clean_shutdown"  # the index as a clean close left it; removed as soon as it is read


@dataclass
class StoreStats:
    messages: int
    segments: int
    disk_bytes: int
    dead_bytes: int
    compactions: int
    writes: int  # records appended (compaction's copies included)
    reads: int  # records read from a segment file (cache hits excluded, compaction's included)
    read_bytes: int  # what those reads took from the files into memory (a body sent by ``sendfile`` is not read)

    @property
    def dead_fraction(self) -> float:
        return self.dead_bytes / self.disk_bytes if self.disk_bytes else 0.0


class MessageStore:
    def __init__(self, directory: str, segment_size: int = DEFAULT_SEGMENT_SIZE,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, compaction_threshold: float = 0.5,
                 wipe: bool = False, compaction_quiet: float = 0.0, sidecars: bool = False) -> None:
        """``compaction_quiet``: seconds a segment must go without a removal before it is compacted, so a
        segment a consumer is still emptying dies whole instead of being copied.  ``sidecars``: keep each
        full segment's record list beside it (see ``take_sealed``), so a restart after a crash reads those
        instead of scanning every segment."""
        self.directory = directory
        self.segment_size = segment_size
        self.compaction_threshold = compaction_threshold
        self.compaction_quiet = compaction_quiet
        if wipe and os.path.isdir(directory):
            shutil.rmtree(directory)
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):  # spare files a crash left: nothing in them is wanted
            if name.endswith(SPARE_SUFFIX):
                os.unlink(os.path.join(directory, name))
        self._directory_fd = os.open(directory, os.O_RDONLY)  # fsynced after a spare is renamed into use
        self._renamed = False  # a spare became a segment since the last dirty_fds
        self.index = Locations()
        self.clean = False  # recovered from a clean shutdown's snapshot: refs are known, claims only check
        self.segments: dict[int, Segment] = {}
        self.cache: LRUCache = LRUCache(maxsize=cache_bytes, getsizeof=len)
        self._tail = bytearray()  # written but not yet flushed to the current segment
        self._tail_ids: dict[int, tuple[int, int]] = {}  # msg_id -> (tail offset, size) for unflushed reads
        self._to_compact: list[int] = []
        self._compacting: tuple[int, list[int]] | None = None
        self._dirty: set[int] = set()  # segments written since the last sync
        self.compactions = 0
        self.writes = self.reads = self.read_bytes = 0
        self.next_id = 1
        self._reserved = 0  # ids below this are on record as handed out (see _reserve)
        self.current: Segment | None = None
        self._records: array | None = new_records() if sidecars else None  # the current segment's
        self._sealed: list[tuple[int, int, array]] = []  # full segments whose sidecar is not written
        self._doomed: list[Segment] = []  # deleted segments: their files go (or become spares) at the next sync
        self._spares: deque[Segment] = deque()  # deleted segments whose files wait to be written again

    @property
    def buffered_bytes(self) -> int:
        """Bodies it holds in memory: read back and cached, or written and not flushed to a segment yet."""
        return int(self.cache.currsize) + len(self._tail)

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> float:
        """Rebuild the index: from a clean shutdown's snapshot if there is one (refs included), else by
        scanning every segment (refs 0: queues then claim theirs with ``claim``)."""
        started = time.monotonic()
        self._recover_next_id()
        if not self._load_snapshot():
            self._scan_segments()
        return time.monotonic() - started

    def _scan_segments(self) -> None:
        """Index every record: from a segment's sidecar where it has one, else by reading the segment."""
        index = self.index
        numbers = list_segments(self.directory)
        for orphan in set(list_sidecars(self.directory)) - set(numbers):
            os.unlink(sidecar_path(self.directory, orphan))
        for number in numbers:
            path = segment_path(self.directory, number)
            size = os.path.getsize(path)
            records_bytes = read_sidecar(self.directory, number, size)
            if records_bytes is None:  # no sidecar: the segment itself, read into the sidecar's form
                records_bytes = array("Q", itertools.chain.from_iterable(scan(path, number=number))).tobytes()
            replaced, count, highest = index.put_records(number, records_bytes)
            segment = Segment(number, os.open(path, os.O_RDWR), os.path.getsize(path))
            self.segments[number] = segment
            for old_segment, old_size in replaced:  # a compaction copied these; the later copy wins
                self.segments[old_segment].live -= 1
                self.segments[old_segment].dead_bytes += old_size + HEAD_SIZE
            segment.live += count
            self.next_id = max(self.next_id, highest + 1)

    def claim(self, msg_id: int) -> bool:
        """A recovered queue holds this message; False if the store lost it."""
        if self.clean:
            return msg_id in self.index
        return self.index.claim(msg_id)

    def claim_many(self, msg_ids: "np.ndarray") -> "np.ndarray":
        """``claim`` for an array of ids; which the store has."""
        return self.index.claim_many(msg_ids, count=not self.clean)

    def finish_recovery(self) -> int:
        """Records no queue claimed are dead; returns how many."""
        unclaimed = [] if self.clean else self.index.unclaimed()
        for msg_id in unclaimed:
            freed = self.index.release(msg_id, 0)
            if freed is not None:  # (an unclaimed id is there, with no reference: always)
                self._kill(*freed)
        self._open_new_segment()
        for number in list(self.segments):
            self._reclaim(number)
        return len(unclaimed)

    # -- the clean shutdown's snapshot --------------------------------------------------------

    def _save_snapshot(self) -> None:
        """After the final sync: the index and segment summaries, so the next start reads no segment."""
        path = os.path.join(self.directory, SNAPSHOT)
        with open(path + ".tmp", "wb") as handle:
            handle.write(_SNAPSHOT_HEAD.pack(self.next_id, len(self.segments)))
            for segment in self.segments.values():
                handle.write(_SEGMENT_SUMMARY.pack(segment.number, segment.size, segment.live, segment.dead_bytes))
            self.index.dump(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".tmp", path)
        fsync_dir(self.directory)

    def _load_snapshot(self) -> bool:
        """Use the snapshot if it matches the segment files; remove it either way (durably) before any
        write, so that a crash later can never bring back an index older than the files."""
        path = os.path.join(self.directory, SNAPSHOT)
        if not os.path.exists(path):
            return False
        try:
            with open(path, "rb") as handle:
                next_id, count = _SNAPSHOT_HEAD.unpack(handle.read(_SNAPSHOT_HEAD.size))
                summaries = [_SEGMENT_SUMMARY.unpack(handle.read(_SEGMENT_SUMMARY.size)) for _ in range(count)]
                index = Locations.load(handle)
            numbers = list_segments(self.directory)
            if sorted(summary[0] for summary in summaries) != numbers or any(
                    os.path.getsize(segment_path(self.directory, number)) != size
                    for number, size, _live, _dead in summaries):
                raise ValueError("segment files differ from the snapshot")
        except (OSError, ValueError, EOFError, struct.error) as exc:
            log.warning("store snapshot %s not used (%s): scanning the segments", path, exc)
            return False
        finally:
            os.unlink(path)
            fsync_dir(self.directory)
        for number, size, live, dead in summaries:
            self.segments[number] = Segment(number, os.open(segment_path(self.directory, number), os.O_RDWR),
                                            size, live, dead)
        self.index = index
        self.next_id = max(self.next_id, next_id)
        self.clean = True
        return True

    def start(self) -> None:
        """A fresh store with nothing to recover."""
        self.finish_recovery()

    # -- writing ------------------------------------------------------------------------------

    def new_id(self) -> int:
        msg_id = self.next_id
        self.next_id += 1
        if msg_id >= self._reserved:
            self._reserve()
        return msg_id

    def new_ids(self, count: int) -> range:
        """``count`` ids in a row, as ``new_id`` hands them out one by one (``write_many``'s)."""
        first = self.next_id
        self.next_id += count
        if self.next_id > self._reserved:
            self._reserve()
        return range(first, self.next_id)

    def _reserve(self) -> None:
        """Record, durably, a block of ids as handed out, so no id is reused after a restart.

        The records of the highest ids may be gone from disk while a queue index entry
        still names one; reusing it would hand that entry a different message.
        """
        self._reserved = self.next_id + ID_BLOCK
        path = os.path.join(self.directory, ID_FILE)
        with open(path + ".tmp", "w") as handle:
            handle.write(str(self._reserved))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".tmp", path)

    def _recover_next_id(self) -> None:
        try:
            with open(os.path.join(self.directory, ID_FILE)) as handle:
                self.next_id = max(self.next_id, int(handle.read().strip() or 0))
        except (FileNotFoundError, ValueError):
            pass

    def write(self, msg_id: int, parts: tuple[bytes | bytearray | memoryview, ...], refs: int) -> None:
        """Append a record for ``msg_id`` whose payload is the concatenation of ``parts``.

        A small record joins the tail (many go to the file in one write at the next ``flush``); a large one
        is written at once, with the tail before it, by one ``pwritev`` from the parts themselves, so that its
        body is never copied in this process."""
        current = self.current
        assert current is not None  # opened by finish_recovery, before any write
        head = encode_head(msg_id, parts, current.number)
        self.writes += 1
        tail = self._tail
        record_at = current.size + len(tail)
        if len(parts[-1]) >= WRITE_THROUGH:  # (the body, last)
            size = sum(map(len, parts))
            self._write_through(current, [tail, head, *parts])
        else:
            tail += head
            payload_at = len(tail)
            for part in parts:
                tail += part
            size = len(tail) - payload_at
            self._tail_ids[msg_id] = (payload_at, size)
        self._placed(msg_id, current, record_at, size, refs)

    def _placed(self, msg_id: int, current: Segment, record_at: int, size: int, refs: int) -> None:
        """A record of ``size`` payload bytes was appended at ``record_at`` of the current segment: the index
        finds it, and the segment rolls over once full."""
        self.index.put(msg_id, current.number, record_at + HEAD_SIZE, size, refs)
        if self._records is not None:
            self._records.extend((msg_id, record_at + HEAD_SIZE, size))
        current.live += 1
        if current.size + len(self._tail) >= self.segment_size:
            self.flush()
            self._open_new_segment()

    def write_from(self, msg_id: int, parts: tuple[bytes, ...], source: int, tail: int, refs: int) -> None:
        """Append a record for ``msg_id`` whose payload is ``parts`` and then the last ``tail`` bytes of
        ``source``'s payload (a stored body under a new head: ``ReplicaStore.annotated``), copied from file to
        file ``COPY_SLICE`` at a time, so that the body is never whole in memory.  The slices go to their place
        as they are hashed, then the record's head before them (a crash between leaves a torn record, cut at
        recovery as any).  KeyError if ``source`` is gone."""
        found_at = self.index.find(source)
        if found_at is None:
            raise KeyError(source)
        self.flush()  # (the source's record and the tail before this one in their files)
        current = self.current
        assert current is not None  # opened by finish_recovery, before any write
        number, offset, size = found_at
        source_fd, record_at = self.segments[number].fd, current.size
        crc, length = started_crc(msg_id, parts, current.number)
        at, to = offset + size - tail, record_at + HEAD_SIZE + length - 8  # (``length`` counts the msg_id)
        for start in range(0, tail, COPY_SLICE):
            want = min(COPY_SLICE, tail - start)
            piece = os.pread(source_fd, want, at + start)
            self.read_bytes += len(piece)
            if len(piece) != want:
                raise IOError(f"message {source}: short read from segment {number}")
            crc = crc32c(piece, crc)
            written = 0
            while written < len(piece):
                written += os.pwrite(current.fd, piece[written:], to + start + written)
        self.reads += 1
        self.writes += 1
        self._write_through(current, [head_of(msg_id, crc, length + tail), *parts])
        current.size += tail
        self._placed(msg_id, current, record_at, length - 8 + tail, refs)

    def write_many(self, msg_ids: range, records: Sequence[bytes | memoryview], refs: int) -> None:
        """``write`` of each record as its own payload, under the id of the same place in ``msg_ids``: the same
        bytes and locations as those writes one by one, the small records of a segment joining the tail at once
        (a follower's snapshot rows, a frame's in one call)."""
        i, count = 0, len(records)
        while i < count:
            if len(records[i]) >= WRITE_THROUGH:  # (a large one: ``write``'s way, from its own buffer)
                self.write(msg_ids[i], (records[i],), refs)
                i += 1
                continue
            current = self.current
            assert current is not None  # opened by finish_recovery, before any write
            room = self.segment_size - current.size - len(self._tail)
            end, used = i, 0  # the run the segment takes: up to the record that fills it, as ``write`` would
            while end < count and used < room and len(records[end]) < WRITE_THROUGH:
                used += HEAD_SIZE + len(records[end])
                end += 1
            self._append_run(current, msg_ids[i:end], records[i:end], refs)
            if current.size + len(self._tail) >= self.segment_size:
                self.flush()
                self._open_new_segment()
            i = end

    def _append_run(self, segment: Segment, msg_ids: range, records: Sequence[bytes | memoryview], refs: int) -> None:
        """Small records, heads before them, joining the tail in one append; their locations a run of arrays."""
        number, tail = segment.number, self._tail
        sizes = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
        at = len(tail) + np.cumsum(sizes + HEAD_SIZE) - sizes  # each payload's place in the tail, after its head
        heads = [encode_head(msg_id, (record,), number) for msg_id, record in zip(msg_ids, records)]
        tail += b"".join(itertools.chain.from_iterable(zip(heads, records)))
        self._tail_ids.update(zip(msg_ids, zip(at.tolist(), sizes.tolist())))
        offsets = at + segment.size
        self.index.put_run(msg_ids, number, offsets, sizes, refs)
        if self._records is not None:
            ids = np.arange(msg_ids.start, msg_ids.stop, dtype=np.uint64)
            self._records.frombytes(np.column_stack((ids, offsets, sizes)).astype(np.uint64).tobytes())
        segment.live += len(records)
        self.writes += len(records)

    def add_ref(self, msg_id: int, count: int = 1) -> None:
        self.index.add_refs(msg_id, count)

    def refs(self, msg_id: int) -> int:
        """How many holders ``msg_id`` has (0 if it is gone)."""
        location = self.index.get(msg_id)
        return location.refs if location is not None else 0

    def _write_through(self, segment: Segment, buffers: list) -> None:
        """The tail and a large record after it, handed to the operating system in one call (short writes,
        which a full disk can make, go on from where they stopped)."""
        total = sum(map(len, buffers))
        written = os.pwritev(segment.fd, buffers, segment.size)
        if written < total:  # (rare)
            rest = memoryview(b"".join(buffers))
            while written < total:
                written += os.pwrite(segment.fd, rest[written:], segment.size + written)
        segment.size += total
        self._dirty.add(segment.number)
        self._tail = bytearray()
        self._tail_ids.clear()

    def flush(self) -> None:
        """Hand the tail to the operating system (no fsync).  A full disk may take part of it and refuse the rest:
        the rest is written on until then, and an error leaves the tail whole, to be written again."""
        if not self._tail:
            return
        current = self.current
        assert current is not None  # a tail was written to it
        tail, written = memoryview(self._tail), 0
        while written < len(tail):
            written += os.pwrite(current.fd, tail[written:], current.size + written)
        tail.release()
        current.size += len(self._tail)
        self._dirty.add(current.number)
        self._tail = bytearray()
        self._tail_ids.clear()

    def dirty_fds(self) -> list[int]:
        """File descriptors a ``sync`` must fsync; the caller may fsync them off the event loop.  The directory's
        is among them after a spare file was renamed into use: records written to it are durable only once the
        name is (a crash could otherwise leave them under the spare's old number, whose CRCs they fail)."""
        fds = [self.segments[n].fd for n in self._dirty if n in self.segments]
        self._dirty.clear()
        if self._renamed:
            self._renamed = False
            fds.append(self._directory_fd)
        return fds

    def take_sealed(self) -> list[tuple[int, int, array]]:
        """Full segments (number, size, records) whose sidecars may be written once the fds of the
        ``dirty_fds`` taken with them are fsynced (``write_sidecars``, off the event loop if need be)."""
        sealed, self._sealed = self._sealed, []
        return sealed

    def write_sidecars(self, sealed: list[tuple[int, int, array]]) -> None:
        for number, size, records in sealed:
            if os.path.exists(segment_path(self.directory, number)):  # not deleted meanwhile
                write_sidecar(self.directory, number, size, records)

    def sync(self) -> None:
        doomed = self.take_doomed()
        self.sync_writes()
        self.unlink(doomed)

    def sync_writes(self) -> None:
        """Make what was written durable, leaving deleted segments' files to the next ``sync`` (or the caller's
        group commit, which removes them once the removals that deleted them are durable, on its own thread: a
        file closed here could be one that thread is fsyncing, its descriptor number meanwhile another file's)."""
        self.flush()
        sealed = self.take_sealed()
        for fd in self.dirty_fds():
            os.fsync(fd)
        self.write_sidecars(sealed)

    # -- reading ------------------------------------------------------------------------------

    def read(self, msg_id: int) -> bytes:
        cached = self.cache.get(msg_id)
        if cached is not None:
            return cached
        pending = self._tail_ids.get(msg_id)
        if pending is not None:
            start, size = pending
            return bytes(self._tail[start:start + size])
        found_at = self.index.find(msg_id)
        if found_at is None:
            raise KeyError(msg_id)
        number, offset, size = found_at
        data = os.pread(self.segments[number].fd, size, offset)
        self.reads += 1
        self.read_bytes += len(data)
        if len(data) != size:
            raise IOError(f"message {msg_id}: short read from segment {number}")
        self.cache[msg_id] = data
        return data

    def read_head(self, msg_id: int, tail: int) -> bytes:
        """``msg_id``'s payload but its last ``tail`` bytes (a message's body, which ends its payload): what a
        reader that sends the body from the file needs of the rest, without reading the body into memory.  The
        read cache is neither consulted nor filled."""
        return self._read_part(msg_id, tail, False)

    def read_tail(self, msg_id: int, tail: int, size: int | None = None) -> bytes:
        """``msg_id``'s last ``tail`` bytes (a message's body) alone, or their first ``size`` (a body's head), as
        ``read_head`` reads the rest: a large body read back is neither a copy of a record's slice nor kept in the
        read cache."""
        return self._read_part(msg_id, tail, True, tail if size is None else min(size, tail))

    def _read_part(self, msg_id: int, tail: int, last: bool, size: int = 0) -> bytes:
        """``size`` bytes from where the last ``tail`` bytes of ``msg_id``'s payload start (``last``), or what
        comes before them."""
        pending = self._tail_ids.get(msg_id)
        if pending is not None:
            start, length = pending
            cut = start + length - tail
            return bytes(self._tail[cut:cut + size] if last else self._tail[start:cut])
        found_at = self.index.find(msg_id)
        if found_at is None:
            raise KeyError(msg_id)
        number, offset, length = found_at
        want, at = (size, offset + length - tail) if last else (length - tail, offset)
        data = os.pread(self.segments[number].fd, want, at)
        self.reads += 1
        self.read_bytes += len(data)
        if len(data) != want:
            raise IOError(f"message {msg_id}: short read from segment {number}")
        return data

    def read_many(self, msg_ids: list[int], budget: int) -> list[bytes | None]:
        """Payloads of several messages, with one pread per run of neighbouring records (a queue bringing its
        next entries into memory reads them this way, usually one run); None for an id the store lacks or
        beyond ``budget`` bytes read from files.  The read cache is neither consulted nor filled: these
        payloads go straight into their messages."""
        found: list[bytes | None] = [None] * len(msg_ids)
        wanted: list[tuple[int, int, int, int]] = []  # segment, offset, size, position
        spent = 0
        index, tail_ids = self.index, self._tail_ids
        for position, msg_id in enumerate(msg_ids):
            pending = tail_ids.get(msg_id)
            if pending is not None:
                start, size = pending
                found[position] = bytes(self._tail[start:start + size])
                continue
            found_at = index.find(msg_id)
            if found_at is None or spent + found_at[2] > budget:
                continue
            spent += found_at[2]
            wanted.append((*found_at, position))
        wanted.sort()
        i = 0
        while i < len(wanted):
            number, first, size, _position = wanted[i]
            end = first + size
            j = i + 1
            while j < len(wanted) and wanted[j][0] == number and wanted[j][1] - end <= READ_GAP:
                end = max(end, wanted[j][1] + wanted[j][2])
                j += 1
            data = os.pread(self.segments[number].fd, end - first, first)
            self.read_bytes += len(data)
            if len(data) != end - first:
                raise IOError(f"short read of {end - first} bytes from segment {number}")
            view = memoryview(data)
            for _number, offset, size, position in wanted[i:j]:
                found[position] = bytes(view[offset - first:offset - first + size])
            view.release()
            i = j
        self.reads += len(wanted)
        return found

    def locate(self, msg_ids: "np.ndarray") -> tuple["np.ndarray", "np.ndarray", "np.ndarray", "np.ndarray"]:
        """Where the payloads of ``msg_ids`` lie in the segment files, for a reader in another process:
        (found, segment, offset, size) arrays, the tail flushed first so every record is in its file.  The
        files' descriptors (``segment_fd``) stay readable after a compaction or deletion unlinks them."""
        self.flush()
        return self.index.find_many(msg_ids)

    def open_payload(self, msg_id: int) -> tuple[int, int, int, Segment] | None:
        """Where ``msg_id``'s payload lies, for a reader that sends it from the file (``sendfile``): a descriptor
        of the caller's own on its segment file (the caller closes it), the payload's offset and size; None if
        the record still waits in the tail or is gone.  Until closed, the descriptor reads those bytes whatever
        the store does meanwhile: records are never rewritten in place, and a compacted or deleted segment's
        file, unlinked, lives on while a descriptor is open.  The segment comes with it, as the loan the reader
        tells when it reads the file through the descriptor and when it closes it (``Segment.read_through``,
        ``given_back``): a file read through one, or with one still open, is not recycled (``unlink``)."""
        if msg_id in self._tail_ids:
            return None
        found_at = self.index.find(msg_id)
        if found_at is None:
            return None
        number, offset, size = found_at
        segment = self.segments[number]
        segment.lent += 1
        return os.dup(segment.fd), offset, size, segment

    def segment_fd(self, number: int) -> int:
        """The segment's descriptor, for a reader that duplicates it: the file is never recycled."""
        segment = self.segments[number]
        segment.recyclable = False
        return segment.fd

    def __contains__(self, msg_id: int) -> bool:
        return msg_id in self.index

    # -- removal and compaction ---------------------------------------------------------------

    def remove(self, msg_id: int, count: int = 1) -> None:
        freed = self.index.release(msg_id, count)
        if freed is None:
            return
        self.cache.pop(msg_id, None)
        self._kill(*freed)
        self._reclaim(freed[0])
        self._retire_if_dead()

    def remove_many(self, msg_ids: "np.ndarray") -> None:
        """``remove`` of one reference for each of ``msg_ids``, as arrays (a purge, a commit, a deletion: a
        batch of a deep queue's entries at a time)."""
        if not len(msg_ids):
            return
        ids, segments, sizes = self.index.release_many(msg_ids.astype(np.int64, copy=False))
        cache = self.cache
        if len(cache) < len(ids):  # whichever is fewer: the cached ids, or the freed ones
            cached = np.fromiter(cache.keys(), np.int64, len(cache))
            ids = cached[np.isin(cached, ids)]
        for msg_id in ids.tolist():
            cache.pop(msg_id, None)
        numbers, which = np.unique(segments, return_inverse=True)
        counts = np.bincount(which, minlength=len(numbers))
        sizes_of = np.bincount(which, sizes.astype(np.int64), minlength=len(numbers))
        for number, size, count in zip(numbers.tolist(), sizes_of.tolist(), counts.tolist()):
            self._kill(number, int(size), count)
        for number in numbers.tolist():
            self._reclaim(number)
        self._retire_if_dead()

    def _retire_if_dead(self) -> None:
        current = self.current
        assert current is not None  # open since finish_recovery
        if current.live == 0 and current.size + len(self._tail) >= self.segment_size // 4:
            self._retire_current()

    def _retire_current(self) -> None:
        """The current segment holds nothing live but is large: start a new one so it can be deleted."""
        self._tail = bytearray()
        self._tail_ids.clear()
        if self._records is not None:
            self._records = new_records()  # all dead: its sidecar lists nothing
        self._open_new_segment()

    def _kill(self, number: int, size: int, count: int = 1) -> None:
        """``count`` records of ``size`` bytes in all died in segment ``number``."""
        segment = self.segments[number]
        segment.touched = time.monotonic()
        segment.live -= count
        segment.dead_bytes += size + count * HEAD_SIZE

    def _reclaim(self, number: int) -> None:
        segment = self.segments.get(number)
        if segment is None or segment is self.current:
            return
        if self._compacting is not None and self._compacting[0] == number:
            return  # compact_step deletes it once its copies are synced
        if segment.live <= 0:
            self._delete_segment(segment)
        elif segment.dead_fraction >= self.compaction_threshold and number not in self._to_compact \
                and (self._compacting is None or self._compacting[0] != number):
            self._to_compact.append(number)

    def _delete_segment(self, segment: Segment) -> None:
        del self.segments[segment.number]
        self._dirty.discard(segment.number)
        if segment.number in self._to_compact:
            self._to_compact.remove(segment.number)
        self._sealed = [sealed for sealed in self._sealed if sealed[0] != segment.number]
        self._doomed.append(segment)

    def take_doomed(self) -> list[Segment]:
        """Deleted segments whose files ``unlink`` removes or keeps as spares, off the event loop if need be:
        freeing a large file's blocks takes milliseconds; with them, spares kept longer than ``SPARE_LIFE``,
        whose files it removes.  (No number is reused meanwhile: the newest segment is never deleted, and a new
        one is numbered after it.)"""
        doomed, self._doomed = self._doomed, []
        spares, cutoff = self._spares, time.monotonic() - SPARE_LIFE
        while spares and spares[0].touched < cutoff:  # (the oldest first; only this thread takes from the left)
            doomed.append(spares.popleft())
        return doomed

    @property
    def has_spares(self) -> bool:
        """Spare files are kept: a later ``take_doomed`` gives them up if no new segment takes them."""
        return bool(self._spares)

    def unlink(self, doomed: list[Segment]) -> None:
        """Remove deleted segments' files, or keep up to ``SPARES`` of them under a spare's name, to be written
        again by a new segment (``_open_new_segment``): overwriting a file's blocks, still in the page cache,
        costs the file system about half the CPU of allocating new ones, and freeing the old file's blocks and
        pages is saved as well.  Only a file this run created (so that every record in it has a CRC
        seeded with its number) is kept, and only if no reader may still read it: none of the descriptors
        ``open_payload`` lent is open or read the file, and ``segment_fd`` was never asked for it.  The caller calls
        this once the deletions' removals are durable (the queue index's included): a spare's records are then
        wanted by no one, whatever a crash leaves of the spare's overwriting.  (A deleted segment is lent no
        more descriptors: ``lent`` only falls.)"""
        for segment in doomed:
            if segment.spare:  # one kept too long
                os.close(segment.fd)
                os.unlink(spare_path(self.directory, segment.number))
                continue
            try:
                os.unlink(sidecar_path(self.directory, segment.number))
            except FileNotFoundError:
                pass
            path = segment_path(self.directory, segment.number)
            if segment.recyclable and not segment.lent and len(self._spares) < SPARES:
                os.rename(path, spare_path(self.directory, segment.number))
                segment.spare = True
                segment.touched = time.monotonic()
                self._spares.append(segment)  # (taken by the event loop's thread: deque's ends are thread-safe)
            else:
                os.close(segment.fd)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    @property
    def needs_compaction(self) -> bool:
        return bool(self._to_compact) or self._compacting is not None

    def compact_step(self, budget: int = COMPACT_SLICE) -> bool:
        """Move up to ``budget`` bytes of live records out of a mostly-dead segment.

        Returns True while work remains.  The moved copies are written to the
        tail like new messages; the old segment is deleted once empty, and its
        deletion waits for the next sync of the copies (``sync`` before the
        caller's next step keeps this crash-safe: see ``Durability``).
        """
        if self._compacting is None:
            quiet_since = time.monotonic() - self.compaction_quiet
            for number in list(self._to_compact):
                segment = self.segments.get(number)
                if segment is None or segment is self.current or segment.live <= 0:
                    self._to_compact.remove(number)
                elif segment.touched <= quiet_since:
                    self._to_compact.remove(number)
                    index = self.index
                    path = segment_path(self.directory, number)
                    ids = [msg_id for msg_id, offset, _size in scan(path, number=number, repair=False)
                           if (location := index.get(msg_id)) is not None and location.segment == number
                           and location.offset == offset]
                    self._compacting = (number, ids)
                    break
            else:
                return bool(self._to_compact)  # the rest are still being emptied: later
        number, ids = self._compacting
        segment = self.segments[number]
        moved = 0
        while ids and moved < budget:
            msg_id = ids.pop()
            location = self.index.get(msg_id)
            if location is None or location.segment != number:
                continue
            data = os.pread(segment.fd, location.size, location.offset)
            self.reads += 1
            self.read_bytes += len(data)
            refs = location.refs
            segment.live -= 1
            segment.dead_bytes += location.size + HEAD_SIZE
            self.write(msg_id, (data,), refs)
            moved += len(data) + HEAD_SIZE
        if not ids:
            self._compacting = None
            self.compactions += 1
            self.sync_writes()  # the copies are durable before the original goes
            if segment.number in self.segments and segment.live <= 0:
                self._delete_segment(segment)
        return self.needs_compaction

    # -- housekeeping -------------------------------------------------------------------------

    def _open_new_segment(self) -> None:
        """A new segment to write: a spare file renamed (its former records left to be overwritten), else a new
        file."""
        number = max(self.segments, default=0) + 1
        path = segment_path(self.directory, number)
        if os.path.exists(sidecar_path(self.directory, number)):  # a leftover must never describe this file
            os.unlink(sidecar_path(self.directory, number))
        try:
            spare = self._spares.popleft()
        except IndexError:
            segment = Segment(number, os.open(path, os.O_RDWR | os.O_CREAT, 0o644), 0, recyclable=True)
            preallocate(segment.fd, self.segment_size)
        else:
            os.rename(spare_path(self.directory, spare.number), path)
            self._renamed = True
            segment = Segment(number, spare.fd, 0, extent=max(spare.size, spare.extent), recyclable=True)
        self.segments[number] = segment
        previous, self.current = self.current, segment
        if previous is not None:
            self._cut_extent(previous)  # (it is dirty: the commit that syncs its records syncs its length)
            if self._records is not None:
                self._sealed.append((previous.number, previous.size, self._records))
                self._records = new_records()
            self._reclaim(previous.number)

    def _cut_extent(self, segment: Segment) -> None:
        """A segment written in full (or at a clean close): what a former life of its file left after its records
        is cut off, so that the file ends where its records do (as a sidecar and the snapshot expect)."""
        if segment.extent > segment.size:
            os.ftruncate(segment.fd, segment.size)
            self._dirty.add(segment.number)
        segment.extent = 0

    def stats(self) -> StoreStats:
        disk = sum(max(s.size, s.extent) for s in self.segments.values()) + len(self._tail)
        dead = sum(s.dead_bytes for s in self.segments.values())
        return StoreStats(len(self.index), len(self.segments), disk, dead, self.compactions, self.writes, self.reads,
                          self.read_bytes)

    def close(self, snapshot: bool = True) -> None:
        """Sync and close; ``snapshot`` (a clean shutdown) saves the index so the next start need not scan."""
        if self.current is not None:
            self.flush()
            self._cut_extent(self.current)
        self.sync()
        if snapshot and self.current is not None:
            self._save_snapshot()
        for segment in self.segments.values():
            os.close(segment.fd)
        self.segments.clear()
        while self._spares:
            spare = self._spares.popleft()
            os.close(spare.fd)
            os.unlink(spare_path(self.directory, spare.number))
        os.close(self._directory_fd)
