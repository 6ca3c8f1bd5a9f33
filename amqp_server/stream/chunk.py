"""Osiris chunks, as the stream protocol's deliver frame carries them, and the entries a publish frame brings.

A chunk is a 48-byte header (magic and version, type, entry and record counts, timestamp, epoch, first offset,
CRC-32 of the data, data and trailer lengths), then its entries: a simple entry is a uint32 size (top bit clear)
and the record; a sub-batch entry (top bit set) carries several records, possibly compressed.
"""
from __future__ import annotations

import gzip
import struct
import zlib
from typing import Iterable

HEADER = struct.Struct(">BBHIqQQIIII")
MAGIC_VERSION = 0x50  # osiris: magic 5, chunk format 0
USER_CHUNK = 0
EPOCH = 1  # the epoch of a stream that never changed leader
_ENTRY = struct.Struct(">I")
SUB_BATCH = struct.Struct(">BHII")  # a publish frame's sub-batch: type byte, records, uncompressed size, size
COMPRESSION_NONE, COMPRESSION_GZIP = 0, 1
MAX_RECORD = (1 << 31) - 1


class Unsupported(Exception):
    """A sub-batch this node cannot split into records (a compression other than none or gzip)."""


def encode(first_offset: int, timestamp: int, records: Iterable[bytes]) -> bytes:
    """One chunk of simple entries, one a record."""
    parts: list[bytes] = []
    pack = _ENTRY.pack
    count = 0
    for record in records:
        parts.append(pack(len(record)))
        parts.append(record)
        count += 1
    data = b"".join(parts)
    return HEADER.pack(MAGIC_VERSION, USER_CHUNK, count, count, timestamp, EPOCH, first_offset,
                       zlib.crc32(data), len(data), 0, 0) + data


def sub_batch_records(type_byte: int, count: int, uncompressed: int, data: bytes) -> list[bytes]:
    """The records of a sub-batch entry (publish frames carry one after its publishing id)."""
    compression = (type_byte & 0x70) >> 4
    if compression == COMPRESSION_GZIP:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"bad gzip sub-batch: {exc}") from None
    elif compression != COMPRESSION_NONE:
        raise Unsupported(f"sub-batch compression {compression}")
    if len(data) != uncompressed and compression == COMPRESSION_GZIP:
        raise ValueError("sub-batch size does not match")
    records = []
    pos = 0
    for _ in range(count):
        if pos + 4 > len(data):
            raise ValueError("sub-batch shorter than its records")
        size = _ENTRY.unpack_from(data, pos)[0]
        pos += 4
        if pos + size > len(data):
            raise ValueError("sub-batch record runs past it")
        records.append(data[pos:pos + size])
        pos += size
    return records

