"""Osiris chunks, as they are stored and as the stream protocol's deliver frame carries them.

A chunk is a 48-byte header (magic and version, type, entry and record counts, timestamp, epoch, first offset,
CRC-32 of the data, data and trailer lengths, 4 reserved bytes), its entries, then a trailer readers are not sent.
A simple entry is a uint32 size (top bit clear) and the record; a sub-batch entry (top bit set: a type byte with
the compression in bits 4-6, a uint16 record count, uint32 uncompressed and stored sizes) carries several
records, possibly compressed, exactly as a publish frame brought it.

The trailer holds tracking entries as osiris's does (``<<Type:8, IdSize:8, Id, Value:64>>``): each named
publisher that wrote to the chunk with its last publishing id (type 0, what deduplication recovers from), and for
a chunk of AMQP 0-9-1 publishes the bytes of its messages' bodies (``TRK_BODY``, Warren's: its records are AMQP
1.0 conversions, larger than the bodies that retention and the HTTP API count).
"""
from __future__ import annotations

import struct
import zlib
from typing import Callable, Iterator, NamedTuple

HEADER = struct.Struct(">BBHIqQQIIII")
MAGIC_VERSION = 0x50  # osiris: magic 5, chunk format 0
USER_CHUNK = 0
EPOCH = 1  # the epoch of a stream that never changed leader
MAX_ENTRIES = 0xFFFF  # the header counts entries in 16 bits
ENTRY = struct.Struct(">I")
SUB_BATCH = struct.Struct(">BHII")  # type byte, records, uncompressed size, stored size
COMPRESSION_NONE, COMPRESSION_GZIP = 0, 1
TRK_SEQUENCE, TRK_BODY = 0, 0x80
_TRACKED = struct.Struct(">BB")
_VALUE = struct.Struct(">Q")


MAX_INFLATED = 32 << 20  # bytes a chunk's gzip sub-batches may inflate to, together
READ_AHEAD = 128 << 10  # bytes of a chunk ``file_records`` reads at a time


class UnsupportedCompression(Exception):
    """A sub-batch this node cannot split into records (a compression other than none or gzip)."""


def writer_trailer(reference: bytes, publishing_id: int) -> bytes:
    """A named publisher's last publishing id in a chunk it wrote."""
    return _TRACKED.pack(TRK_SEQUENCE, len(reference)) + reference + _VALUE.pack(publishing_id)


def body_trailer(body: int) -> bytes:
    return _TRACKED.pack(TRK_BODY, 0) + _VALUE.pack(body)


def read_trailer(trailer: bytes) -> Iterator[tuple[str, int]]:
    """The writers' (reference, last publishing id) a trailer holds; ("", bytes) for its body count."""
    pos = 0
    while pos + _TRACKED.size <= len(trailer):
        kind, size = _TRACKED.unpack_from(trailer, pos)
        pos += _TRACKED.size
        if pos + size + _VALUE.size > len(trailer):
            return
        reference = trailer[pos:pos + size].decode(errors="replace")
        value = _VALUE.unpack_from(trailer, pos + size)[0]
        pos += size + _VALUE.size
        if kind == TRK_SEQUENCE and reference:
            yield reference, value
        elif kind == TRK_BODY:
            yield "", value


def body_bytes(data: bytes, entries: int, trailer: bytes) -> int:
    """What a chunk's messages count for retention: its trailer's body count, else its records' sizes."""
    for reference, value in read_trailer(trailer):
        if not reference:
            return value
    total = pos = 0
    for _ in range(entries):
        if pos + 4 > len(data):
            break
        if data[pos] & 0x80:
            size = SUB_BATCH.unpack_from(data, pos)[3] if pos + SUB_BATCH.size <= len(data) else 0
            pos += SUB_BATCH.size + size
        else:
            size = ENTRY.unpack_from(data, pos)[0]
            pos += 4 + size
        total += size
    return total


def records(data: bytes | memoryview, entries: int, refused: list[str] | None = None) -> Iterator[bytes | None]:
    """A chunk's records in offset order (its data: what follows the header, up to the trailer).  A sub-batch
    this node cannot read, or one that would inflate the chunk's records past ``MAX_INFLATED``, yields None for
    each of its records (they keep their offsets); why is added to ``refused``."""
    pos = 0
    room = [MAX_INFLATED]
    for _ in range(entries):
        if data[pos] & 0x80:
            type_byte, count, uncompressed, size = SUB_BATCH.unpack_from(data, pos)
            pos += SUB_BATCH.size
            yield from _sub_batch(type_byte, count, uncompressed, bytes(data[pos:pos + size]), room, refused)
            pos += size
        else:
            size = ENTRY.unpack_from(data, pos)[0]
            pos += 4
            yield bytes(data[pos:pos + size])
            pos += size


class Left(NamedTuple):
    """A record ``file_records`` left in the segment file: where it lies there, its size and its first bytes."""

    pos: int
    size: int
    head: bytes


def _record(read: Callable[[int, int], bytes], buf: bytes, at: int, pos: int, size: int, large: int,
            head: int) -> bytes | Left:
    """The record of ``size`` bytes at ``at`` of ``buf``, ``pos`` of the file: read from ``buf`` or the file, or
    left in the file but its first ``head`` bytes if it has ``large`` bytes or more."""
    if size >= large:
        return Left(pos, size, buf[at:at + head] if at + head <= len(buf) else read(pos, head))
    return buf[at:at + size] if at + size <= len(buf) else read(pos, size)


def file_records(read: Callable[[int, int], bytes], pos: int, sent: int, large: int, head: int,
                 refused: list[str] | None = None) -> Iterator[bytes | Left | None]:
    """``records`` of the chunk at ``pos`` of a segment file (``sent``: its header's and data's bytes there),
    which ``read(pos, size)`` reads, ``READ_AHEAD`` bytes at a time: a record of ``large`` bytes or more, a simple
    entry or in an uncompressed sub-batch, is not read but its first ``head`` bytes (no more than ``large``: its
    sections before the body, for a record whose body ends it), so that its body can be sent from the file."""
    end = pos + sent
    buf = read(pos, min(READ_AHEAD, sent))
    entries = HEADER.unpack_from(buf)[2]
    at, at_buf = HEADER.size, pos  # (the next entry's place in ``buf``, and the file's position of ``buf``)
    room = [MAX_INFLATED]
    for _ in range(entries):
        if at + SUB_BATCH.size > len(buf):
            at_buf += at
            buf, at = read(at_buf, min(READ_AHEAD, end - at_buf)), 0
        if buf[at] & 0x80:
            type_byte, count, uncompressed, size = SUB_BATCH.unpack_from(buf, at)
            at += SUB_BATCH.size
            if size >= large and (type_byte & 0x70) >> 4 == COMPRESSION_NONE:
                yield from _sub_batch_in_file(read, at_buf + at, min(at_buf + at + size, end), count, uncompressed,
                                              large, head, room, refused)
            else:
                data = buf[at:at + size] if at + size <= len(buf) else read(at_buf + at, size)
                yield from _sub_batch(type_byte, count, uncompressed, data, room, refused)
        else:  # (``_record``, inline: a call a record cost a chunk of 100-byte records 60 ns of 210 a record)
            size = ENTRY.unpack_from(buf, at)[0]
            at += 4
            if size >= large:
                yield Left(at_buf + at, size, buf[at:at + head] if at + head <= len(buf) else read(at_buf + at, head))
            else:
                yield buf[at:at + size] if at + size <= len(buf) else read(at_buf + at, size)
        at += size


def _sub_batch_in_file(read: Callable[[int, int], bytes], pos: int, end: int, count: int, uncompressed: int,
                       large: int, head: int, room: list[int],
                       refused: list[str] | None) -> list[bytes | Left] | list[None]:
    """``_sub_batch`` of an uncompressed sub-batch from ``pos`` to ``end`` of the file, read as ``file_records``
    reads a chunk: its records of ``large`` bytes or more are left in the file as a simple entry's."""
    found: list[bytes | Left] = []
    buf, at, at_buf = b"", 0, pos
    for _ in range(count):
        if at_buf + at + ENTRY.size > end:
            return _refused(count, "sub-batch shorter than its records", refused)
        if at + ENTRY.size > len(buf):
            at_buf += at
            buf, at = read(at_buf, min(READ_AHEAD, end - at_buf)), 0
        size = ENTRY.unpack_from(buf, at)[0]
        at += ENTRY.size
        if at_buf + at + size > end:
            return _refused(count, "sub-batch record runs past it", refused)
        found.append(_record(read, buf, at, at_buf + at, size, large, head))
        at += size
    room[0] -= uncompressed
    return found


def _refused(count: int, why: str, refused: list[str] | None) -> list[None]:
    """A None for each record of a sub-batch this node cannot read, why added to ``refused``."""
    if refused is not None:
        refused.append(why)
    return [None] * count


def _sub_batch(type_byte: int, count: int, uncompressed: int, data: bytes, room: list[int],
               refused: list[str] | None) -> list[bytes] | list[None]:
    """A sub-batch's records (``room``: what the chunk's may still inflate to, less this one's after), or a None
    for each, why added to ``refused``."""
    try:
        found = sub_batch_records(type_byte, count, uncompressed, data, room[0])
    except (ValueError, UnsupportedCompression) as exc:
        return _refused(count, str(exc), refused)
    room[0] -= uncompressed
    return found


def sub_batch_records(type_byte: int, count: int, uncompressed: int, data: bytes,
                      room: int = MAX_INFLATED) -> list[bytes]:
    """The records of a sub-batch entry; ValueError for one that does not inflate to the size it says, or
    whose size is above ``room``: inflating stops there, never past it."""
    compression = (type_byte & 0x70) >> 4
    if compression == COMPRESSION_GZIP:
        if uncompressed > room:
            raise ValueError(f"gzip sub-batch of {uncompressed} bytes inflated, above the {room} left of the "
                             f"{MAX_INFLATED} a chunk may inflate to")
        data = _gunzip(data, uncompressed)
    elif compression != COMPRESSION_NONE:
        raise UnsupportedCompression(f"sub-batch compression {compression}")
    found = []
    pos = 0
    for _ in range(count):
        if pos + 4 > len(data):
            raise ValueError("sub-batch shorter than its records")
        size = ENTRY.unpack_from(data, pos)[0]
        pos += 4
        if pos + size > len(data):
            raise ValueError("sub-batch record runs past it")
        found.append(data[pos:pos + size])
        pos += size
    return found


def _gunzip(data: bytes, uncompressed: int) -> bytes:
    """One gzip member inflated to exactly ``uncompressed`` bytes (never more are made)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, uncompressed + 1)
    except zlib.error as exc:
        raise ValueError(f"bad gzip sub-batch: {exc}") from None
    if len(out) != uncompressed or not inflater.eof:
        raise ValueError("gzip sub-batch does not inflate to the size it says")
    return out
