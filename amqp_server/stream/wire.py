"""The stream protocol's frames (RabbitMQ's rabbit_stream_core): command keys, response codes, and reading and
writing the fields of a frame.

A frame is a uint32 size, then a uint16 key (the top bit set on a response), a uint16 version and the command's
fields: big-endian integers, strings (int16 length, -1 for null), bytes (int32 length) and arrays (int32 count).
Reading never trusts a length: a field that runs past the frame is :class:`Malformed`.
"""
from __future__ import annotations

import struct
from typing import Iterable

# command keys (RabbitMQ 3.10)
DECLARE_PUBLISHER = 0x01
PUBLISH = 0x02
PUBLISH_CONFIRM = 0x03
PUBLISH_ERROR = 0x04
QUERY_PUBLISHER_SEQUENCE = 0x05
DELETE_PUBLISHER = 0x06
SUBSCRIBE = 0x07
DELIVER = 0x08
CREDIT = 0x09
STORE_OFFSET = 0x0A
QUERY_OFFSET = 0x0B
UNSUBSCRIBE = 0x0C
CREATE = 0x0D
DELETE = 0x0E
METADATA = 0x0F
METADATA_UPDATE = 0x10
PEER_PROPERTIES = 0x11
SASL_HANDSHAKE = 0x12
SASL_AUTHENTICATE = 0x13
TUNE = 0x14
OPEN = 0x15
CLOSE = 0x16
HEARTBEAT = 0x17
ROUTE = 0x18
PARTITIONS = 0x19
RESPONSE = 0x8000

# response codes
OK = 0x01
STREAM_DOES_NOT_EXIST = 0x02
SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
STREAM_ALREADY_EXISTS = 0x05
STREAM_NOT_AVAILABLE = 0x06
SASL_MECHANISM_NOT_SUPPORTED = 0x07
AUTHENTICATION_FAILURE = 0x08
SASL_ERROR = 0x09
SASL_CHALLENGE = 0x0A
SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
VHOST_ACCESS_FAILURE = 0x0C
UNKNOWN_FRAME = 0x0D
FRAME_TOO_LARGE = 0x0E
INTERNAL_ERROR = 0x0F
ACCESS_REFUSED = 0x10
PRECONDITION_FAILED = 0x11
PUBLISHER_DOES_NOT_EXIST = 0x12
NO_OFFSET = 0x13

# offset specifications of subscribe
OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT, OFFSET_OFFSET, OFFSET_TIMESTAMP = 1, 2, 3, 4, 5

SIZE = struct.Struct(">I")
HEAD = struct.Struct(">HH")  # key, version
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_RESPONSE = struct.Struct(">HHIH")  # key, version, correlation id, response code
MAX_REFERENCE = 255  # bytes of publisher and consumer references (osiris's writer takes no longer one)


class MalformedFrame(Exception):
    """A frame whose fields do not parse: RabbitMQ answers with close, UNKNOWN_FRAME."""


class Fields:
    """Reads one frame's fields in order, each bounded by the frame."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def _take(self, unpacker: struct.Struct) -> int:
        pos = self.pos
        if pos + unpacker.size > self.end:
            raise MalformedFrame("frame too short")
        self.pos = pos + unpacker.size
        return unpacker.unpack_from(self.buf, pos)[0]

    def u8(self) -> int:
        return self._take(_U8)

    def u16(self) -> int:
        return self._take(_U16)

    def u32(self) -> int:
        return self._take(_U32)

    def i32(self) -> int:
        return self._take(_I32)

    def u64(self) -> int:
        return self._take(_U64)

    def i64(self) -> int:
        return self._take(_I64)

    def raw(self, size: int) -> bytes:
        pos = self.pos
        if size < 0 or pos + size > self.end:
            raise MalformedFrame("field runs past the frame")
        self.pos = pos + size
        return bytes(self.buf[pos:pos + size])

    def string(self) -> str:
        size = self._take(_I16)
        if size == -1:
            return ""
        try:
            return self.raw(size).decode()
        except UnicodeDecodeError:
            raise MalformedFrame("string is not UTF-8") from None

    def bytes_(self) -> bytes:
        size = self.i32()
        return b"" if size == -1 else self.raw(size)

    def count(self, least_each: int) -> int:
        """An array's length, refused if the frame cannot hold that many items of ``least_each`` bytes."""
        count = self.i32()
        if count < 0 or count * least_each > self.end - self.pos:
            raise MalformedFrame("array longer than the frame")
        return count

    def strings(self) -> list[str]:
        return [self.string() for _ in range(self.count(2))]

    def properties(self) -> dict[str, str]:
        return {self.string(): self.string() for _ in range(self.count(4))}

    def done(self) -> None:
        if self.pos != self.end:
            raise MalformedFrame("bytes left over in the frame")


def string(value: str) -> bytes:
    raw = value.encode()
    return _I16.pack(len(raw)) + raw


def bytes_(value: bytes) -> bytes:
    return _I32.pack(len(value)) + value


def properties(values: dict[str, str]) -> bytes:
    return _I32.pack(len(values)) + b"".join(string(k) + string(v) for k, v in values.items())


def strings(values: Iterable[str]) -> bytes:
    items = list(values)
    return _I32.pack(len(items)) + b"".join(string(v) for v in items)


def frame(key: int, body: bytes = b"", version: int = 1) -> bytes:
    return SIZE.pack(4 + len(body)) + HEAD.pack(key, version) + body


def response(key: int, correlation: int, code: int, body: bytes = b"", version: int = 1) -> bytes:
    return SIZE.pack(_RESPONSE.size + len(body)) + _RESPONSE.pack(key | RESPONSE, version, correlation, code) + body


def u8(value: int) -> bytes:
    return _U8.pack(value)


def u16(value: int) -> bytes:
    return _U16.pack(value)


def u32(value: int) -> bytes:
    return _U32.pack(value)


def u64(value: int) -> bytes:
    return _U64.pack(value)
