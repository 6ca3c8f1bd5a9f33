"""Segment files: append-only, one record after another.

A record is ``length (u32) | crc (u32) | msg_id (u64) | payload``, where
``length`` counts the msg_id and payload and the CRC covers them too, so a torn
write at the tail of a segment is found at recovery and cut off.  The CRC is
CRC-32C, which the CPU computes (``CRC32C`` set in ``length``; about 0.06 ms a
MiB against zlib's CRC-32 at 0.4); records written before it carry zlib's and
are read as they are.  A record's CRC-32C starts from its segment's number
(``SEEDED``): a segment file is recycled under a new number (see
``MessageStore.unlink``), and the records of its former life that its new ones
have not yet overwritten then fail their CRC, so recovery never takes them for
records of this one.
"""
from __future__ import annotations

import ctypes
import logging
import os
import struct
import zlib
from array import array
from dataclasses import dataclass
from typing import Callable, Iterator

from crc32c import crc32c

log = logging.getLogger("warren.msg_store")

RECORD_HEAD = struct.Struct(">IIQ")
HEAD_SIZE = RECORD_HEAD.size
CRC32C = 0x8000_0000  # in a record's length: its CRC is CRC-32C (clear: zlib's CRC-32, an older record)
SEEDED = 0x4000_0000  # in a record's length: its CRC-32C starts from its segment's number (clear: from 0, older)
FLAGS = CRC32C | SEEDED
SUFFIX = ".seg"
SIDECAR_SUFFIX = ".idx"
SPARE_SUFFIX = ".spare"  # a deleted segment's file kept to be written again as a new segment
_SIDECAR_HEAD = struct.Struct(">4sIQI")  # magic, records, segment size, crc32 of the columns
_SIDECAR_MAGIC = b"WIX1"


_FALLOC_FL_KEEP_SIZE = 1
_fallocate: Callable[[int, int, int, int], int] | None
try:
    _fallocate = ctypes.CDLL(None).fallocate
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
except (AttributeError, OSError):  # (no such call where this runs: appends allocate as they go)
    _fallocate = None


def preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes of disk for a new segment file without changing its length
    (``FALLOC_FL_KEEP_SIZE``): appends then land in blocks already allocated, which costs the file system
    about a quarter less CPU per byte than allocating them at each write (ext4's delayed allocation), and
    recovery still sees the file end where its records do.  Best effort: where the file system cannot
    (or the disk is full), appends allocate as before."""
    if _fallocate is not None:
        _fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, size)  # (its failure is no error: see above)


def segment_path(directory: str, number: int) -> str:
    return os.path.join(directory, f"{number:08d}{SUFFIX}")


def sidecar_path(directory: str, number: int) -> str:
    return os.path.join(directory, f"{number:08d}{SIDECAR_SUFFIX}")


def spare_path(directory: str, number: int) -> str:
    return os.path.join(directory, f"{number:08d}{SPARE_SUFFIX}")


def list_sidecars(directory: str) -> list[int]:
    return sorted(int(name[:-len(SIDECAR_SUFFIX)]) for name in os.listdir(directory)
                  if name.endswith(SIDECAR_SUFFIX) and name[:-len(SIDECAR_SUFFIX)].isdigit())


def list_segments(directory: str) -> list[int]:
    return sorted(int(name[:-len(SUFFIX)]) for name in os.listdir(directory)
                  if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit())


def encode_head(msg_id: int, payload_parts: tuple[bytes | bytearray | memoryview, ...], number: int) -> bytes:
    """Record head, for segment ``number``, of a payload given in parts (so a body is never concatenated just to be
    hashed)."""
    return head_of(msg_id, *started_crc(msg_id, payload_parts, number))


def started_crc(msg_id: int, payload_parts: tuple[bytes | bytearray | memoryview, ...], number: int) -> tuple[int, int]:
    """A record's CRC and length over its msg_id and the first parts of its payload, for segment ``number``: a
    writer that has the rest only a slice at a time goes on with ``crc32c`` (``MessageStore.write_from``)."""
    crc = crc32c(msg_id.to_bytes(8, "big"), number)
    size = 8
    for part in payload_parts:
        crc = crc32c(part, crc)
        size += len(part)
    return crc, size


def head_of(msg_id: int, crc: int, size: int) -> bytes:
    """Record head of a record whose CRC and length (its msg_id's 8 octets included) are known."""
    return RECORD_HEAD.pack(size | FLAGS, crc, msg_id)


@dataclass(slots=True)
class Segment:
    """What the store knows of one segment file: its size and how much of it is dead."""

    number: int
    fd: int
    size: int = 0
    live: int = 0
    dead_bytes: int = 0
    touched: float = 0.0  # time.monotonic() of the last removal of one of its records
    extent: int = 0  # the file's length, where a former life of the file (recycled) left it beyond ``size``
    recyclable: bool = False  # its file may be written again once deleted: opened by this run, never read by a loan
    spare: bool = False  # deleted, its file kept under a spare's name (``MessageStore.unlink``)
    lent: int = 0  # descriptors of it ``MessageStore.open_payload`` lent and not given back

    def read_through(self) -> None:
        """A lent descriptor reads the file (``framing.file_out.Loan``): a reader may hold a mapping of it longer
        than the descriptor, so it is never written again."""
        self.recyclable = False

    def given_back(self) -> None:
        self.lent -= 1

    @property
    def dead_fraction(self) -> float:
        return self.dead_bytes / self.size if self.size else 0.0


def scan(path: str, number: int, repair: bool = True) -> Iterator[tuple[int, int, int]]:
    """Yield (msg_id, payload offset, payload size) of every intact record of segment ``number``; cut a torn tail,
    or what a former life of the file left after its records, if ``repair``.  A damaged record whose length is
    sound is passed over, as RabbitMQ's ``rabbit_msg_file:scanner`` passes over one without its write marker: the
    intact records after it are kept (only records of this segment's own form: seeded with its number)."""
    with open(path, "r+b" if repair else "rb") as handle:
        data = handle.read()
        view = memoryview(data)  # CRCs over slices of the file without copying them
        pos = good = 0  # where the next record starts; where the last intact one ends
        end = len(data)
        while pos + HEAD_SIZE <= end:
            length, crc, msg_id = RECORD_HEAD.unpack_from(data, pos)
            flags = length & FLAGS
            length &= ~FLAGS
            stop = pos + 8 + length
            if length < 8 or stop > end:
                break
            record = view[pos + 8:stop]
            if flags == FLAGS:
                found = crc32c(record, number)
            elif flags == CRC32C and pos == good:
                found = crc32c(record)
            elif flags == 0 and pos == good:
                found = zlib.crc32(record)
            else:
                break
            if found == crc:
                if pos != good:
                    log.warning("segment %s: %d bytes of damaged records at offset %d passed over", path,
                                pos - good, good)
                yield msg_id, pos + HEAD_SIZE, length - 8
                good = stop
            pos = stop
        view.release()
        if good != end and repair:
            log.warning("segment %s: %d bytes of torn or corrupt records after offset %d cut off",
                        path, end - good, good)
            handle.truncate(good)
            handle.flush()
            os.fsync(handle.fileno())


def new_records() -> array:
    """The (msg_id, offset, size) of every record written to a segment, in file order, interleaved in one
    machine array; when the segment is full and synced it becomes its sidecar file, which a restart after a
    crash reads instead of the segment (only the segments written since the last sync are scanned)."""
    return array("Q")


def write_sidecar(directory: str, number: int, segment_size: int, records: array) -> None:
    """Write and fsync the sidecar of a segment whose records are synced."""
    column = records.tobytes()
    path = sidecar_path(directory, number)
    with open(path + ".tmp", "wb") as handle:
        handle.write(_SIDECAR_HEAD.pack(_SIDECAR_MAGIC, len(records) // 3, segment_size, zlib.crc32(column)))
        handle.write(column)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)


def read_sidecar(directory: str, number: int, segment_size: int) -> bytes | None:
    """The records of a segment's sidecar (``new_records``' bytes), or None if it has none or one that does
    not match the segment file."""
    try:
        with open(sidecar_path(directory, number), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    if len(data) < _SIDECAR_HEAD.size:
        return None
    magic, count, size, crc = _SIDECAR_HEAD.unpack_from(data)
    body = data[_SIDECAR_HEAD.size:]
    if magic != _SIDECAR_MAGIC or size != segment_size or len(body) != 24 * count or zlib.crc32(body) != crc:
        log.warning("sidecar of segment %d does not match it: scanning the segment", number)
        return None
    return body
