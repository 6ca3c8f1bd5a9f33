"""AMQP 1.0 frames and performatives (OASIS AMQP 1.0, part 2), read and written with the one AMQP 1.0 type codec
(``stream.amqp10``), and the error conditions RabbitMQ 4.x answers with."""
from __future__ import annotations

import struct
from typing import Any

from stream_log import amqp10
from stream_log.amqp10 import NULL, Value, boolean, described, encode_list, symbol, uint, utf8

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
FRAME_HEAD = struct.Struct(">IBBH")
AMQP_FRAME, SASL_FRAME = 0, 1
MIN_MAX_FRAME = 512  # the spec's MIN-MAX-FRAME-SIZE
EMPTY_FRAME = FRAME_HEAD.pack(8, 2, AMQP_FRAME, 0)  # a heartbeat

# performatives
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
ERROR = 0x1D
RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = range(0x23, 0x28)
SOURCE, TARGET = 0x28, 0x29
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)
NAMES = {OPEN: "open", BEGIN: "begin", ATTACH: "attach", FLOW: "flow", TRANSFER: "transfer",
         DISPOSITION: "disposition", DETACH: "detach", END: "end", CLOSE: "close"}

# settle modes
SETTLED = 1  # sender-settle-mode settled: pre-settled (at most once)

# error conditions
DECODE_ERROR = "amqp:decode-error"
FRAMING_ERROR = "amqp:connection:framing-error"
CONNECTION_FORCED = "amqp:connection:forced"
FRAME_SIZE_TOO_SMALL = "amqp:frame-size-too-small"
INTERNAL_ERROR = "amqp:internal-error"
INVALID_FIELD = "amqp:invalid-field"
NOT_ALLOWED = "amqp:not-allowed"
NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
PRECONDITION_FAILED = "amqp:precondition-failed"
RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
RESOURCE_LOCKED = "amqp:resource-locked"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
UNATTACHED_HANDLE = "amqp:session:unattached-handle"
HANDLE_IN_USE = "amqp:session:handle-in-use"
WINDOW_VIOLATION = "amqp:session:window-violation"
TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
DETACH_FORCED = "amqp:link:detach-forced"
RESOURCE_DELETED = "amqp:resource-deleted"


class Amqp10Error(Exception):
    """A protocol error: the connection closes (or, raised as ``SessionError``/``LinkError``, the session ends or
    the link detaches) with ``condition`` and ``description``."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


class SessionError(Amqp10Error):
    """The session ends with this error; the connection goes on."""


class LinkError(Amqp10Error):
    """The link detaches (closed) with this error; the session goes on."""

    def __init__(self, condition: str, description: str, handle: int) -> None:
        super().__init__(condition, description)
        self.handle = handle


def frame(channel: int, body: bytes, kind: int = AMQP_FRAME) -> bytes:
    return FRAME_HEAD.pack(8 + len(body), 2, kind, channel) + body


def performative(code: int, *fields: bytes) -> bytes:
    """A performative's bytes: its fields as a described list, trailing nulls left out."""
    items = list(fields)
    while items and items[-1] == NULL:
        items.pop()
    return described(code, encode_list(items))


def error(condition: str, description: str) -> bytes:
    """An error; with no description (``""``) the condition alone, as RabbitMQ sends some."""
    if not description:
        return described(ERROR, encode_list([symbol(condition)]))
    return described(ERROR, encode_list([symbol(condition), utf8(description[:4096])]))


def optional(encoder: Any, value: Any) -> bytes:
    return NULL if value is None else encoder(value)


def parse(body: bytes | bytearray | memoryview) -> tuple[int, list[Value], int]:
    """(performative code, fields, where its payload starts) of a frame body; ``Amqp10Error`` (decode-error) if it
    is not one."""
    data = bytes(body) if not isinstance(body, bytes) else body
    try:
        value, end = amqp10.value_at(data, 0)
    except (amqp10.Invalid, amqp10.TooLarge) as exc:
        raise Amqp10Error(DECODE_ERROR, f"cannot decode frame body: {exc}") from None
    if value.kind != "described" or not isinstance(value.value[0], int):
        raise Amqp10Error(DECODE_ERROR, "frame body is not a performative")
    code, fields = value.value
    if fields.kind != "list":
        raise Amqp10Error(DECODE_ERROR, f"performative 0x{code:02x} is not a list")
    return code, fields.value, end


def field(fields: list[Value], index: int, default: Any = None) -> Any:
    """A field's plain value (None or ``default`` when absent or null)."""
    if index >= len(fields) or fields[index].kind == "null":
        return default
    return fields[index].value


def typed(fields: list[Value], index: int, kinds: tuple[str, ...], name: str, default: Any = None) -> Any:
    """A field of one of ``kinds``, or ``default`` when absent; any other type is a decode error."""
    if index >= len(fields) or fields[index].kind == "null":
        return default
    value = fields[index]
    if value.kind not in kinds:
        raise Amqp10Error(DECODE_ERROR, f"field {name} of type {value.kind}, expected {'/'.join(kinds)}")
    return value.value


def composite(fields: list[Value], index: int, code: int) -> list[Value] | None:
    """A source, target or outcome field: its fields, or None when absent (another descriptor: decode error)."""
    if index >= len(fields) or fields[index].kind == "null":
        return None
    value = fields[index]
    if value.kind != "described" or value.value[0] != code or value.value[1].kind != "list":
        raise Amqp10Error(DECODE_ERROR, f"expected described type 0x{code:02x}")
    return list(value.value[1].value)


def outcome(fields: list[Value], index: int) -> tuple[int, list[Value]] | None:
    """A delivery state field: (its descriptor, its fields), or None."""
    if index >= len(fields) or fields[index].kind == "null":
        return None
    value = fields[index]
    if value.kind != "described" or not isinstance(value.value[0], int) or value.value[1].kind != "list":
        raise Amqp10Error(DECODE_ERROR, "delivery state is not a described list")
    return value.value[0], list(value.value[1].value)


ACCEPTED_STATE = described(ACCEPTED, b"\x45")
RELEASED_STATE = described(RELEASED, b"\x45")
REJECTED_STATE = described(REJECTED, b"\x45")


def rejected(condition: str, description: str) -> bytes:
    return described(REJECTED, encode_list([error(condition, description)]))


def disposition(first: int, last: int, state: bytes) -> bytes:
    """The node, as receiver, settles deliveries ``first``..``last`` with ``state``."""
    return performative(DISPOSITION, boolean(True), uint(first), uint(last) if last != first else NULL,
                        boolean(True), state)


_CONDITIONS = {404: NOT_FOUND, 403: UNAUTHORIZED_ACCESS, 406: PRECONDITION_FAILED, 405: RESOURCE_LOCKED,
               540: NOT_IMPLEMENTED, 530: NOT_ALLOWED, 506: RESOURCE_LIMIT_EXCEEDED}


def condition_of(code: int) -> str:
    """The AMQP 1.0 condition for an AMQP 0-9-1 reply code that a broker operation raised."""
    return _CONDITIONS.get(code, INTERNAL_ERROR)


TransferHead = tuple[int, int | None, bool, bool, int]
"""What the node reads of a transfer on the publish path: handle, delivery-id, settled, more, where the payload
starts."""

_U32 = struct.Struct(">I")
_LIST32 = struct.Struct(">II")


def transfer_at(buf: bytearray, pos: int, end: int) -> TransferHead | None:
    """A transfer performative at ``pos`` read in place, when it has the encodings clients send: a list8 or
    list32 of at most six fields, uints in any of their three encodings, a short binary tag, booleans as
    constants; else None, for the general decoder (``transfer_of``)."""
    found = _transfer_at(buf, pos, end)
    return None if found is None else found[:5]


def _transfer_at(buf: bytearray, pos: int, end: int) -> tuple[int, int | None, bool, bool, int, int, int] | None:
    """``transfer_at``'s, and where a ``Transfers`` layout would have the delivery-id's value (a uint32) start
    and the tag's bytes (a binary8) end: -1 for a field of another encoding.  The fields are read in line, with no
    value objects and no loop."""
    id_at = tag_end = -1
    try:
        if buf[pos + 2] != TRANSFER or buf[pos + 1] != 0x53 or buf[pos]:
            return None
        code = buf[pos + 3]
        if code == 0xC0:
            stop = pos + 5 + buf[pos + 4]
            count = buf[pos + 5]
            at = pos + 6
        elif code == 0xD0:
            size, count = _LIST32.unpack_from(buf, pos + 4)
            stop = pos + 8 + size
            at = pos + 12
        else:
            return None
        if count < 2 or count > 6 or stop > end:
            return None
        kind = buf[at]  # handle
        if kind == 0x52:
            handle = buf[at + 1]
            at += 2
        elif kind == 0x43:
            handle = 0
            at += 1
        elif kind == 0x70:
            handle = _U32.unpack_from(buf, at + 1)[0]
            at += 5
        else:
            return None
        kind = buf[at]  # delivery-id
        delivery_id: int | None
        if kind == 0x70:
            delivery_id = _U32.unpack_from(buf, at + 1)[0]
            id_at = at + 1
            at += 5
        elif kind == 0x52:
            delivery_id = buf[at + 1]
            at += 2
        elif kind == 0x43:
            delivery_id = 0
            at += 1
        elif kind == 0x40:
            delivery_id = None
            at += 1
        else:
            return None
        settled = more = False
        if count > 2:
            kind = buf[at]  # delivery-tag
            if kind == 0xA0:
                at += 2 + buf[at + 1]
                tag_end = at
            elif kind == 0x40:
                at += 1
            else:
                return None
        if count > 3:
            at += _UINT_SIZES[buf[at]]  # message-format (KeyError: another type)
        if count > 4:
            settled = _BOOLS[buf[at]]
            at += 1
        if count > 5:
            more = _BOOLS[buf[at]]
            at += 1
    except (IndexError, KeyError, struct.error):
        return None
    if at != stop:
        return None
    return handle, delivery_id, settled, more, stop, id_at, tag_end


_UINT_SIZES = {0x43: 1, 0x52: 2, 0x70: 5, 0x40: 1}
_BOOLS = {0x41: True, 0x42: False, 0x40: False}
_ID_AND_TAG = struct.Struct(">IH")  # a delivery-id's uint32, then the tag's binary8 constructor and size


TransferFrame = tuple[int, int, int, bool, bool, int, int]
"""A transfer frame read whole in place: channel, handle, delivery-id, settled, more, where its payload starts, where
the frame ends."""


class Transfers:
    """The transfer frames of one connection read in place, their performative as ``transfer_at`` reads it.  A
    client sends its transfers alike but for the frame's size (its message's), the delivery-id and the tag's
    bytes, so the layout of the last one read is kept: a frame like it (``like_the_last``) costs two comparisons
    and two unpacks, its header and fields read one by one by no one.  A layout is kept of a frame with the usual
    data offset (2), a delivery-id in four bytes (0x70) and a binary8 tag, whose sizes no longer change."""

    __slots__ = ("head", "tag", "tail", "tail_at", "size", "channel", "handle", "settled", "more")

    def __init__(self) -> None:
        # the frame from its data offset (type, channel) to its delivery-id's value: descriptor, list size and
        # count, handle
        self.head = b""
        self.tag = 0  # the tag's constructor and size (0xA0, n)
        self.tail = b""  # what follows the tag's bytes: message-format, settled, more
        self.tail_at = 0  # where the tail starts, from the frame's start
        self.size = 1 << 32  # the frame header's and the performative's size: where the payload starts (none yet)
        self.channel = self.handle = 0
        self.settled = self.more = False

    def like_the_last(self, buf: bytearray, pos: int, n: int, frame_max: int) -> TransferFrame | None:
        """The transfer frame at ``pos`` if it is laid out as the last one ``read`` kept, and whole before ``n``
        within ``frame_max``; else None (the frame is read the general way)."""
        head = self.head
        if buf.startswith(head, pos + 4):
            size = _U32.unpack_from(buf, pos)[0]
            end = pos + size
            if self.size <= size <= frame_max and end <= n:
                delivery_id, tag = _ID_AND_TAG.unpack_from(buf, pos + 4 + len(head))
                if tag == self.tag and buf.startswith(self.tail, pos + self.tail_at):
                    return self.channel, self.handle, delivery_id, self.settled, self.more, pos + self.size, end
        return None

    def read(self, buf: bytearray, frame_at: int, pos: int, end: int, channel: int) -> TransferHead | None:
        """The transfer performative at ``pos`` of the frame at ``frame_at`` on ``channel`` (``transfer_at``),
        whose layout is kept if it may be."""
        found = _transfer_at(buf, pos, end)
        if found is None:
            return None
        handle, delivery_id, settled, more, stop, id_at, tag_end = found
        if id_at >= 0 and tag_end >= 0 and pos == frame_at + 8:  # (then the tag follows the delivery-id)
            self.head = bytes(buf[frame_at + 4:id_at])
            self.tag = 0xA000 | buf[id_at + 5]
            self.tail = bytes(buf[tag_end:stop])
            self.tail_at = tag_end - frame_at
            self.size = stop - frame_at
            self.channel, self.handle, self.settled, self.more = channel, handle, settled, more
        return handle, delivery_id, settled, more, stop


def transfer_of(fields: list[Value]) -> tuple[int | None, int | None, bool, bool, bool]:
    """A transfer decoded the general way: handle, delivery-id, settled, more, aborted."""
    return (typed(fields, 0, ("uint",), "handle"), typed(fields, 1, ("uint",), "delivery-id"),
            field(fields, 4) is True, field(fields, 5) is True, field(fields, 9) is True)
