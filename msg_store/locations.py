"""The store's index, msg_id → (segment, offset, size, refs), in compact arrays.

Message ids are handed out in increasing order and die roughly in that order, so
the index is a set of chunks of ``CHUNK`` consecutive ids, each four machine
arrays (16 bytes per id) instead of an object and a dict slot per message.  A
chunk goes when its last live id does.  A chunk holding few live ids among many
dead ones costs its full size: the price of this layout, paid only by ids kept
far longer than their neighbours.

The whole table can be written to a file and read back in one go (a clean
shutdown's snapshot), so a restart needs no scan of the segment files.
"""
from __future__ import annotations

import os
import struct
from array import array
from typing import Iterator, Literal, NamedTuple, Union, overload

import numpy as np

CHUNK_BITS = 12
CHUNK = 1 << CHUNK_BITS
_SLOT = CHUNK - 1
ABSENT = -1  # refs of an id with no record
_CHUNK_HEAD = struct.Struct(">QI")  # chunk number, live ids


class Location(NamedTuple):
    segment: int
    offset: int
    size: int
    refs: int


class _Chunk:
    __slots__ = ("segment", "offset", "size", "refs", "live")

    def __init__(self) -> None:
        self.segment = array("I", bytes(4 * CHUNK))
        self.offset = array("I", bytes(4 * CHUNK))
        self.size = array("I", bytes(4 * CHUNK))
        self.refs = array("i", [ABSENT]) * CHUNK
        self.live = 0


class Locations:
    def __init__(self) -> None:
        self._chunks: dict[int, _Chunk] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, msg_id: int) -> bool:
        chunk = self._chunks.get(msg_id >> CHUNK_BITS)
        return chunk is not None and chunk.refs[msg_id & _SLOT] != ABSENT

    def get(self, msg_id: int) -> Location | None:
        chunk = self._chunks.get(msg_id >> CHUNK_BITS)
        if chunk is None:
            return None
        i = msg_id & _SLOT
        refs = chunk.refs[i]
        if refs == ABSENT:
            return None
        return Location(chunk.segment[i], chunk.offset[i], chunk.size[i], refs)

    def find(self, msg_id: int) -> tuple[int, int, int] | None:
        """(segment, offset, size) of ``msg_id``'s payload: ``get`` without its refs, for the read path."""
        chunk = self._chunks.get(msg_id >> CHUNK_BITS)
        if chunk is None:
            return None
        i = msg_id & _SLOT
        if chunk.refs[i] == ABSENT:
            return None
        return chunk.segment[i], chunk.offset[i], chunk.size[i]

    def find_many(self, ids: "np.ndarray") -> tuple["np.ndarray", "np.ndarray", "np.ndarray", "np.ndarray"]:
        """``find`` for an array of ids: (found, segment, offset, size) arrays, a slice per chunk."""
        found = np.zeros(len(ids), dtype=bool)
        segments = np.zeros(len(ids), dtype=np.uint32)
        offsets = np.zeros(len(ids), dtype=np.uint32)
        sizes = np.zeros(len(ids), dtype=np.uint32)
        for number, rows, slots in _by_chunk(ids, runs=True):
            chunk = self._chunks.get(number)
            if chunk is None:
                continue
            if chunk.live < CHUNK:  # else every slot has a record: nothing to check
                here = _view(chunk.refs)[slots] != ABSENT
                if not here.all():
                    rows, slots = np.arange(len(ids))[rows][here], np.arange(CHUNK)[slots][here]
            found[rows] = True
            segments[rows] = _view(chunk.segment)[slots]
            offsets[rows] = _view(chunk.offset)[slots]
            sizes[rows] = _view(chunk.size)[slots]
        return found, segments, offsets, sizes

    def __getitem__(self, msg_id: int) -> Location:
        location = self.get(msg_id)
        if location is None:
            raise KeyError(msg_id)
        return location

    def put(self, msg_id: int, segment: int, offset: int, size: int, refs: int) -> None:
        """Record (or move) ``msg_id``'s payload."""
        number, i = msg_id >> CHUNK_BITS, msg_id & _SLOT
        chunk = self._chunks.get(number)
        if chunk is None:
            chunk = self._chunks[number] = _Chunk()
        if chunk.refs[i] == ABSENT:
            chunk.live += 1
            self._count += 1
        chunk.segment[i] = segment
        chunk.offset[i] = offset
        chunk.size[i] = size
        chunk.refs[i] = refs

    def put_run(self, msg_ids: range, segment: int, offsets: "np.ndarray", sizes: "np.ndarray", refs: int) -> None:
        """``put`` of consecutive ids in one segment (records written at once), a chunk's slice at a time."""
        done = 0
        while done < len(msg_ids):
            number, slot = msg_ids[done] >> CHUNK_BITS, msg_ids[done] & _SLOT
            count = min(len(msg_ids) - done, CHUNK - slot)
            chunk = self._chunks.get(number)
            if chunk is None:
                chunk = self._chunks[number] = _Chunk()
            here = slice(slot, slot + count)
            refs_here = _view(chunk.refs)
            new = int(np.count_nonzero(refs_here[here] == ABSENT))
            chunk.live += new
            self._count += new
            _view(chunk.segment)[here] = segment
            _view(chunk.offset)[here] = offsets[done:done + count]
            _view(chunk.size)[here] = sizes[done:done + count]
            refs_here[here] = refs
            done += count

    def put_records(self, segment: int, records: bytes) -> tuple[list[tuple[int, int]], int, int]:
        """Recovery: a segment's records from its sidecar ((msg_id, offset, size) as machine u64s), refs 0,
        a chunk at a time.  Returns the (segment, size) of the locations this replaced (records copied by a
        compaction), how many records there were and the highest id."""
        table = np.frombuffer(records, dtype=np.uint64).reshape(-1, 3)
        replaced: list[tuple[int, int]] = []
        for number, rows, slots in _by_chunk(table[:, 0]):
            chunk = self._chunks.get(number)
            if chunk is None:
                chunk = self._chunks[number] = _Chunk()
            refs, segments, sizes_here = _view(chunk.refs), _view(chunk.segment), _view(chunk.size)
            present = refs[slots] != ABSENT
            replaced.extend(zip(segments[slots[present]].tolist(), sizes_here[slots[present]].tolist()))
            added = len(slots) - int(present.sum())
            chunk.live += added
            self._count += added
            segments[slots] = segment
            _view(chunk.offset)[slots] = table[rows, 1]
            sizes_here[slots] = table[rows, 2]
            refs[slots] = 0
        return replaced, len(table), int(table[:, 0].max()) if len(table) else 0

    def claim_many(self, ids: "np.ndarray", count: bool = True) -> "np.ndarray":
        """Recovery: ``claim`` for an array of ids (``count`` False only checks they are here); which were."""
        found = np.zeros(len(ids), dtype=bool)
        for number, rows, slots in _by_chunk(ids):
            chunk = self._chunks.get(number)
            if chunk is None:
                continue
            refs = _view(chunk.refs)
            here = refs[slots] != ABSENT
            if count:
                np.add.at(refs, slots[here], 1)  # add.at: an id twice in the batch counts twice
            found[rows[here]] = True
        return found

    def claim(self, msg_id: int) -> bool:
        """Recovery: one more holder of ``msg_id``; False if it is not here."""
        chunk = self._chunks.get(msg_id // CHUNK)
        if chunk is None:
            return False
        i = msg_id % CHUNK
        refs = chunk.refs[i]
        if refs == ABSENT:
            return False
        chunk.refs[i] = refs + 1
        return True

    def unclaimed(self) -> list[int]:
        """Recovery: the ids no holder claimed (refs 0)."""
        found: list[int] = []
        for number, chunk in self._chunks.items():
            if chunk.refs.count(0):
                base = number * CHUNK
                found.extend(base + i for i, refs in enumerate(chunk.refs) if refs == 0)
        return found

    def add_refs(self, msg_id: int, count: int) -> int:
        """Change ``msg_id``'s reference count by ``count``; returns the new count (KeyError if absent)."""
        chunk = self._chunks.get(msg_id // CHUNK)
        i = msg_id % CHUNK
        if chunk is None or chunk.refs[i] == ABSENT:
            raise KeyError(msg_id)
        refs = chunk.refs[i] + count
        chunk.refs[i] = refs
        return refs

    def release(self, msg_id: int, count: int) -> tuple[int, int] | None:
        """Drop ``count`` references; the (segment, size) it had if that was the last (the id is gone then),
        else None (None too for an id that is not here).  Releasing none frees an id no one claimed."""
        number, i = msg_id >> CHUNK_BITS, msg_id & _SLOT
        chunk = self._chunks.get(number)
        if chunk is None:
            return None
        refs = chunk.refs[i]
        if refs == ABSENT:
            return None
        refs -= count
        if refs > 0:
            chunk.refs[i] = refs
            return None
        chunk.refs[i] = ABSENT
        chunk.live -= 1
        self._count -= 1
        if not chunk.live:
            del self._chunks[number]
        return chunk.segment[i], chunk.size[i]

    def release_many(self, ids: "np.ndarray") -> tuple["np.ndarray", "np.ndarray", "np.ndarray"]:
        """``release`` of one reference for each of ``ids`` (an id may come more than once), as arrays: the
        ids that lost their last reference (gone now), and the segment and size each had."""
        freed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for number, _rows, slots in _by_chunk(ids):
            chunk = self._chunks.get(number)
            if chunk is None:
                continue
            refs = _view(chunk.refs)
            slots = slots[refs[slots] != ABSENT]
            np.subtract.at(refs, slots, 1)
            gone = np.unique(slots[refs[slots] <= 0])
            if not len(gone):
                continue
            refs[gone] = ABSENT
            chunk.live -= len(gone)
            self._count -= len(gone)
            freed.append((number * CHUNK + gone, _view(chunk.segment)[gone], _view(chunk.size)[gone]))
            if not chunk.live:
                del self._chunks[number]
        if not freed:
            return np.zeros(0, np.int64), np.zeros(0, np.uint32), np.zeros(0, np.uint32)
        ids, segments, sizes = (np.concatenate(column) for column in zip(*freed))
        return ids, segments, sizes

    def items(self) -> Iterator[tuple[int, Location]]:
        """Every (msg_id, location), in id order; safe to ``pop`` what was returned while iterating."""
        for number in sorted(self._chunks):
            chunk = self._chunks.get(number)
            if chunk is None:
                continue
            base = number * CHUNK
            refs = chunk.refs
            for i in range(CHUNK):
                if refs[i] != ABSENT:
                    yield base + i, Location(chunk.segment[i], chunk.offset[i], chunk.size[i], refs[i])

    def __iter__(self) -> Iterator[int]:
        return (msg_id for msg_id, _location in self.items())

    def values(self) -> Iterator[Location]:
        return (location for _msg_id, location in self.items())

    # -- snapshot -----------------------------------------------------------------------------

    def dump(self, handle) -> None:
        """Write the table to a binary file (see ``load``)."""
        handle.write(len(self._chunks).to_bytes(8, "big"))
        for number, chunk in sorted(self._chunks.items()):
            handle.write(_CHUNK_HEAD.pack(number, chunk.live))
            for column in (chunk.segment, chunk.offset, chunk.size, chunk.refs):
                column.tofile(handle)

    @classmethod
    def load(cls, handle) -> "Locations":
        table = cls()
        for _ in range(int.from_bytes(_read(handle, 8), "big")):
            number, live = _CHUNK_HEAD.unpack(_read(handle, _CHUNK_HEAD.size))
            chunk = _Chunk.__new__(_Chunk)
            chunk.segment, chunk.offset, chunk.size, chunk.refs = (
                _column(typecode, handle) for typecode in ("I", "I", "I", "i"))
            chunk.live = live
            table._chunks[number] = chunk
            table._count += live
        return table

    def memory(self) -> int:
        """Bytes the arrays hold (for /metrics and tests)."""
        return len(self._chunks) * 16 * CHUNK


@overload
def _by_chunk(ids: np.ndarray, runs: Literal[False] = False) -> Iterator[tuple[int, np.ndarray, np.ndarray]]: ...


@overload
def _by_chunk(ids: np.ndarray, runs: bool) -> Iterator[tuple[int, _Part, _Part]]: ...


def _by_chunk(ids: np.ndarray, runs: bool = False) -> Iterator[tuple[int, _Part, _Part]]:
    """(chunk number, positions in ``ids``, slots in the chunk) for each chunk the ids fall in: one sort
    (unless they are in order), then a part per chunk.  With ``runs``, slices instead of arrays where the ids
    are consecutive and in order (a backlog's), so the caller copies blocks rather than element by element."""
    if len(ids) < 2 or np.all(ids[1:] > ids[:-1]):
        order, ordered = None, ids
    else:
        order = np.argsort(ids, kind="stable")
        ordered = ids[order]
    if not len(ids):
        return
    low, high = int(ordered[0]) >> CHUNK_BITS, int(ordered[-1]) >> CHUNK_BITS
    if high - low < len(ids):  # no more chunks than ids (a backlog's): where each begins, by bisection
        numbers = range(low, high + 1)
        bounds = np.searchsorted(ordered, np.arange(low + 1, high + 1, dtype=np.int64) << CHUNK_BITS).tolist()
    else:
        chunk_of = ordered >> CHUNK_BITS
        bounds = (np.flatnonzero(np.diff(chunk_of)) + 1).tolist()
        numbers = chunk_of[[0] + bounds].tolist()
    for number, start, end in zip(numbers, [0] + bounds, bounds + [len(ids)]):
        if start >= end:
            continue
        first, last = int(ordered[start]), int(ordered[end - 1])
        if runs and order is None and last - first == end - 1 - start:
            yield number, slice(start, end), slice(first & _SLOT, (last & _SLOT) + 1)
        else:
            rows = order[start:end] if order is not None else np.arange(start, end)
            yield number, rows, (ordered[start:end] & _SLOT).astype(np.intp)


_Part = Union["np.ndarray", slice]


def _view(column: array) -> "np.ndarray":
    """A numpy view of a chunk's column (no copy: writes go to the array)."""
    return np.frombuffer(column, dtype=np.int32 if column.typecode == "i" else np.uint32)


def _column(typecode: str, handle) -> array:
    column = array(typecode)
    column.frombytes(_read(handle, 4 * CHUNK))
    return column


def _read(handle, size: int) -> bytes:
    data = handle.read(size)
    if len(data) != size:
        raise EOFError(f"snapshot cut short ({len(data)} of {size} bytes)")
    return data


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
