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
from typing import Iterator

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
    room = MAX_INFLATED
    for _ in range(entries):
        if data[pos] & 0x80:
            type_byte, count, uncompressed, size = SUB_BATCH.unpack_from(data, pos)
            pos += SUB_BATCH.size
            try:
                found = sub_batch_records(type_byte, count, uncompressed, bytes(data[pos:pos + size]), room)
                room -= uncompressed
                yield from found
            except (ValueError, UnsupportedCompression) as exc:
                if refused is not None:
                    refused.append(str(exc))
                yield from (None for _ in range(count))
            pos += size
        else:
            size = ENTRY.unpack_from(data, pos)[0]
            pos += 4
            yield bytes(data[pos:pos + size])
            pos += size


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
