"""Frame encoding for the hot path, without pamqp objects.

pamqp marshals and unmarshals every method; these helpers cover only what runs
once per message (publish parsing, deliver / get-ok / return encoding, the
confirm ack) by writing bytes with :mod:`struct`.  Everything else goes
through :func:`method_frame`, which uses pamqp.
"""
from __future__ import annotations

import re
import struct

from pamqp import constants as _pamqp_constants
from pamqp import frame as pamqp_frame
from pamqp.base import Frame

from . import field_types
from .file_out import FileRange

# RabbitMQ takes any UTF-8 queue / exchange name (up to 255 bytes); pamqp's stricter name pattern
# would make marshalling a reply that names one (queue.declare-ok for 'a[1]') fail.
for _domain in ("queue-name", "exchange-name"):
    _pamqp_constants.DOMAIN_REGEX[_domain] = re.compile(r"(?s).*")
field_types.install()  # refusals name the integer and float types a client sent, as RabbitMQ's do

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = b"\xce"
FRAME_END_BYTE = 0xCE
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

FRAME_HEAD = struct.Struct(">BHI")
METHOD_HEAD = struct.Struct(">BHIHH")
DELIVERY_TAG = struct.Struct(">QB")
BODY_SIZE = struct.Struct(">Q")
SHORT = struct.Struct(">H")

# Property flags of the basic class content header, in wire order.
FLAG_CONTENT_TYPE = 0x8000
FLAG_CONTENT_ENCODING = 0x4000
FLAG_HEADERS = 0x2000
FLAG_DELIVERY_MODE = 0x1000
FLAG_PRIORITY = 0x0800
FLAG_REPLY_TO = 0x0200
FLAG_EXPIRATION = 0x0100
FLAG_USER_ID = 0x0010


def table_pos(header: bytes, flags: int) -> int:
    """Offset of a content header's headers table (its length prefix), or of where it would go: after
    content_type and content_encoding.  Every walk to a property starts here (the property block was
    checked on publish, see :mod:`properties`)."""
    pos = 14
    if flags & FLAG_CONTENT_TYPE:
        pos += 1 + header[pos]
    if flags & FLAG_CONTENT_ENCODING:
        pos += 1 + header[pos]
    return pos


def method_frame(channel: int, method: Frame) -> bytes:
    """Any method, marshalled by pamqp (for everything off the hot path)."""
    return pamqp_frame.marshal(method, channel)


def text(value: object) -> str:
    """A name or credential from a field table: longstr bytes decoded as UTF-8 (U+FFFD for bad bytes)."""
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


def shortstr(value: str) -> bytes:
    data = value.encode()
    if len(data) > 255:
        raise ValueError("short string longer than 255 bytes")
    return bytes((len(data),)) + data


# A delivery, a get or a return counts one against its connection's per-turn budget
# (``--deliveries-per-flush``), plus one per 2 KiB of content: with the defaults, a turn writes at most
# 2,000 small messages or 4 MiB (``--write-buffer-high``) of bodies, and one large message at a time.
CONTENT_UNIT_BITS = 11


def content_cost(size: int) -> int:
    """What ``size`` bytes of content (body and header) take of a connection's delivery budget."""
    return 1 + (size >> CONTENT_UNIT_BITS)


# A body at least this large is written from its own buffer (see ``gather``), not copied into the output.
ZERO_COPY_FROM = 32 * 1024


def gather(parts: list) -> tuple[list, int]:
    """What one ``writelines`` takes of the output ``parts``, and its size: each run of small parts joined into
    one, and the large ones (bodies) left as they are, so that the transport sends them uncopied."""
    gathered: list = []
    run: list = []
    size = 0
    for part in parts:
        length = len(part)
        size += length
        if length >= ZERO_COPY_FROM:
            if run:
                gathered.append(b"".join(run))
                run = []
            gathered.append(part)
        else:
            run.append(part)
    if run:
        gathered.append(b"".join(run))
    return gathered, size


def content_frames(out: list, channel: int, header: bytes, body: bytes | FileRange, frame_max: int) -> bool:
    """Append the content header frame and body frames of a message to ``out``; True if the body is large
    enough for the output to be ``gather``ed.  A body in a file (a ``FileRange``) is appended as ranges of it
    between the body frames' heads and ends, for the connection to send from the file (``framing.file_out``)."""
    out.append(FRAME_HEAD.pack(FRAME_HEADER, channel, len(header)))
    out.append(header)
    if isinstance(body, FileRange):
        end = FRAME_END
        for piece in body.pieces(frame_max - 8):
            out.append(end + FRAME_HEAD.pack(FRAME_BODY, channel, piece.size))
            out.append(piece)
        out.append(FRAME_END)
        return False
    size = len(body)
    limit = frame_max - 8
    if size <= limit:
        if size:
            out.append(FRAME_END + FRAME_HEAD.pack(FRAME_BODY, channel, size))
            out.append(body)
        out.append(FRAME_END)
        return size >= ZERO_COPY_FROM
    out.append(FRAME_END)
    view = memoryview(body)
    for start in range(0, size, limit):
        chunk = view[start:start + limit]
        out.append(FRAME_HEAD.pack(FRAME_BODY, channel, len(chunk)))
        out.append(chunk)
        out.append(FRAME_END)
    return limit >= ZERO_COPY_FROM


def deliver_prefix(consumer_tag: str) -> bytes:
    """Basic.Deliver's class/method ids and consumer tag, cached per consumer."""
    return b"\x00\x3c\x00\x3c" + shortstr(consumer_tag)


def append_deliver(out: list, channel: int, prefix: bytes, delivery_tag: int, redelivered: bool,
                   route: bytes, header: bytes, body: bytes | FileRange, frame_max: int) -> bool:
    """Basic.Deliver + content, reusing the publish's encoded exchange and routing key."""
    out.append(FRAME_HEAD.pack(FRAME_METHOD, channel, len(prefix) + 9 + len(route)))
    out.append(prefix)
    out.append(DELIVERY_TAG.pack(delivery_tag, redelivered))
    out.append(route)
    out.append(FRAME_END)
    return content_frames(out, channel, header, body, frame_max)


def append_get_ok(out: list, channel: int, delivery_tag: int, redelivered: bool, route: bytes,
                  message_count: int, header: bytes, body: bytes | FileRange, frame_max: int) -> bool:
    out.append(FRAME_HEAD.pack(FRAME_METHOD, channel, 4 + 9 + len(route) + 4))
    out.append(b"\x00\x3c\x00\x47")
    out.append(DELIVERY_TAG.pack(delivery_tag, redelivered))
    out.append(route)
    out.append(struct.pack(">I", message_count))
    out.append(FRAME_END)
    return content_frames(out, channel, header, body, frame_max)


def append_return(out: list, channel: int, reply_code: int, reply_text: str, route: bytes,
                  header: bytes, body: bytes, frame_max: int) -> bool:
    text = shortstr(reply_text)
    out.append(FRAME_HEAD.pack(FRAME_METHOD, channel, 6 + len(text) + len(route)))
    out.append(b"\x00\x3c\x00\x32" + SHORT.pack(reply_code) + text)
    out.append(route)
    out.append(FRAME_END)
    return content_frames(out, channel, header, body, frame_max)


_ACK = struct.Struct(">BHIHHQB")



def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, multiple) + FRAME_END


def basic_nack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Basic.Nack with requeue=false (bit 1) as a publisher confirm nack."""
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 120, delivery_tag, multiple) + FRAME_END
