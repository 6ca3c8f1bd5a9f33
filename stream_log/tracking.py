"""Consumers' stored offsets of one stream (``store_offset``, ``query_offset``), kept per reference and written
incrementally: each group commit appends, off the loop, the references stored since the one before, as osiris's
tracking entries (``<<1:8, IdSize:8, Id, Offset:64>>``); the file is rewritten whole, off the loop too, once it
holds more than twice what is live.  A stream keeps at most ``MAX_OFFSETS`` references: the one stored least
recently is forgotten first (its consumer starts again from its own default), as osiris forgets writers.
"""
from __future__ import annotations

import logging
import os
import struct

from amqp_server.logs import Throttle

log = logging.getLogger("warren.stream")
_forgetting = Throttle(log, burst=1, interval=60.0)

OFFSETS = "offsets"  # the file, in the stream's directory
MAX_OFFSETS = 4096  # references a stream keeps
MAX_REFERENCE = 255  # bytes of a reference (osiris's writer takes no longer one)
COMPACT_FROM = 64 << 10  # bytes of the file below which it is never rewritten
_ENTRY = struct.Struct(">BB")  # type (1: an offset), the reference's size
_OFFSET = struct.Struct(">Q")
_TYPE_OFFSET = 1


def _size(reference: str) -> int:
    return _ENTRY.size + len(reference.encode()) + _OFFSET.size


class Offsets:
    """One stream's stored offsets; ``take`` (on the loop, at a commit) hands what is to be written to a
    :class:`OffsetsWrite` that runs off it."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, OFFSETS)
        self.values: dict[str, int] = {}  # by reference, least recently stored first
        self._pending: dict[str, int] = {}
        self._live = 0  # bytes the live references take in the file
        self._file = 0  # bytes of the file

    def get(self, reference: str) -> int | None:
        return self.values.get(reference)

    def store(self, reference: str, offset: int) -> None:
        values = self.values
        if values.pop(reference, None) is None:
            self._live += _size(reference)
            if len(values) >= MAX_OFFSETS:
                forgotten = next(iter(values))
                del values[forgotten]
                self._pending.pop(forgotten, None)
                self._live -= _size(forgotten)
                _forgetting.warning("stream %s: more than %d stored offsets: the least recently stored ones are "
                                    "forgotten", os.path.dirname(self.path), MAX_OFFSETS)
        values[reference] = offset
        self._pending[reference] = offset

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def take(self) -> "OffsetsWrite | None":
        """What the commit writes: the references stored since the last, or every one (the file rewritten)."""
        if not self._pending:
            return None
        appended = sum(_size(reference) for reference in self._pending)  # (``MAX_OFFSETS`` at most)
        whole = self._file + appended > 2 * self._live + COMPACT_FROM
        entries = dict(self.values) if whole else self._pending
        self._pending = {}
        self._file = self._live if whole else self._file + appended
        return OffsetsWrite(self.path, entries, whole)

    def recover(self) -> None:
        """The offsets as the file has them (a torn last entry, a crash's, left out)."""
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        pos = 0
        values: dict[str, int] = {}
        while pos + _ENTRY.size <= len(data):
            kind, size = _ENTRY.unpack_from(data, pos)
            end = pos + _ENTRY.size + size + _OFFSET.size
            if kind != _TYPE_OFFSET or end > len(data):
                break
            reference = data[pos + _ENTRY.size:end - _OFFSET.size].decode(errors="replace")
            values.pop(reference, None)
            values[reference] = _OFFSET.unpack_from(data, end - _OFFSET.size)[0]
            pos = end
        if pos < len(data):
            os.truncate(self.path, pos)  # (what follows is appended after the last whole entry)
        while len(values) > MAX_OFFSETS:
            del values[next(iter(values))]
        self.values = values
        self._live = sum(_size(reference) for reference in values)
        self._file = pos


class OffsetsWrite:
    """Off the loop: entries appended to the offsets file and made durable, or the file replaced by them."""

    __slots__ = ("path", "entries", "whole")

    def __init__(self, path: str, entries: dict[str, int], whole: bool) -> None:
        self.path = path
        self.entries = entries
        self.whole = whole

    def run(self) -> bool:
        """Done; True if the file was created or replaced (its directory is to be synced)."""
        data = b"".join(_ENTRY.pack(_TYPE_OFFSET, len(raw)) + raw + _OFFSET.pack(offset)
                        for raw, offset in ((reference.encode(), offset) for reference, offset in
                                            self.entries.items()))
        if self.whole:
            temporary = self.path + ".tmp"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
            return True
        created = not os.path.exists(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        return created


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
