"""A quorum queue's log ops, as ``rabbit_fifo``'s command records, and their codec: what the leader ships to
its followers (``forwarder.quorum.oplog``) and each copy applies to its state (:mod:`quorum_machine`).

On the wire an op is a kind byte, then its fields in network order; an Enqueue's message goes as the record a
message store keeps (the leader's ``Message.payload()``), and comes back as a slice of the frame.  Kinds are
below 20: a frame's snapshot rows and markers (``quorum_log``) take the bytes from there.  Encoding and decoding
are tables, by op type and by kind byte: a new op is a dataclass, a kind and one row in each.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Final, Mapping

REASONS = ("expired", "maxlen", "rejected", "delivery_limit")  # dead-letter reasons, by code on the wire


@dataclass(slots=True)
class Enqueue:
    """A published message joins the back as ``seq``; ``message`` is opaque here (what ``Store`` writes).
    ``enqueuer`` (0: none) and ``publish``: the window it came from and its seq there; one that state has seen
    (sent again to a new leader) changes nothing, as ``rabbit_fifo``'s enqueuers' seqs.  ``expiry`` (epoch ms, 0
    for none) and ``size`` are the entry's, which the state keeps as ``rabbit_fifo`` keeps a message's header."""

    seq: int
    expiry: int
    message: Any
    enqueuer: int = 0
    publish: int = 0
    size: int = 0  # the body's bytes (the byte limit's)


@dataclass(slots=True)
class Checkout:
    """The ready entry ``seq`` goes to a consumer (or basic.get); ``settled``: no-ack, it leaves at once.
    ``term``: the leader's that checks it out.  Only that leader gives out ``seq`` in that term, so the pair
    names one message in every copy that has the op, where a seq alone may name another message in a copy
    that never had the entry a deposed leader gave out (``QuorumQueue.adopt``)."""

    seq: int
    settled: bool = False
    term: int = 0


@dataclass(slots=True)
class Settle:
    """Checked-out entries were acked."""

    seqs: list[int]


@dataclass(slots=True)
class Return:
    """Checked-out entries came back (nack or reject with requeue, a consumer gone): each counts one more
    return and goes to the back, the first under seq ``first`` and the next ones after it, unless it passed
    the delivery limit (then it is dead-lettered).  Not ``counted`` (AMQP 1.0's ``released``, RabbitMQ 4.x's
    return without a delivery failure): each goes to the back with the count it had.  ``front``: served before
    every other ready entry, in the order they came back (``rabbit_fifo``'s ``returns``: a return under a
    delivery limit, and every one of a consumer gone; without a limit ``rabbit_fifo``'s leader turns a nack's
    return into a ``requeue`` at the back).  ``annotations`` (AMQP
    1.0's ``modified`` outcome, an encoded map of ``x-opt-`` keys): set on the messages first, as ``rabbit_fifo``'s
    ``modify`` sets them in a message's header, so that whichever copy leads later delivers them."""

    seqs: list[int]
    first: int
    counted: bool = True
    annotations: bytes = b""
    front: bool = False


@dataclass(slots=True)
class Expire:
    """Ready entries whose time ran out: dead-lettered (expired)."""

    seqs: list[int]


@dataclass(slots=True)
class DeadLetter:
    """Entries leave for the dead-letter exchange: ready ones a full queue drops (maxlen), checked-out ones a
    consumer rejected (rejected).  ``annotations``: as a Return's (a modified outcome that dead-letters)."""

    seqs: list[int]
    reason: str
    annotations: bytes = b""


@dataclass(slots=True)
class DeadLettered:
    """At least once: queues took these dead letters; they leave."""

    seqs: list[int]


@dataclass(slots=True)
class Purge:
    """Every ready entry with a seq below ``below`` leaves (queue.purge; the Spark bridge's commit)."""

    below: int


@dataclass(slots=True)
class Recover:
    """A restart: what consumers held is back in its place, counted as returned, as when a consumer goes.
    ``seqs``: only those of them (a new leader's: what no consumer took back within its grace period).  Waiting
    dead letters stay waiting (``QuorumQueue._keep_dead``)."""

    seqs: list[int] | None = None


@dataclass(slots=True)
class Configure:
    """The arguments ops depend on (set when the leader's change: a policy)."""

    delivery_limit: int | None
    at_least_once: bool


LogOp = Enqueue | Checkout | Settle | Return | Expire | DeadLetter | DeadLettered | Purge | Recover | Configure


# -- the codec ------------------------------------------------------------------------------------

(ENQUEUE_OP, CHECKOUT_OP, CHECKOUT_SETTLED_OP, SETTLE_OP, RETURN_OP, EXPIRE_OP, DEAD_LETTER_OP, DEAD_LETTERED_OP,
 PURGE_OP, RECOVER_OP, CONFIGURE_OP, RECOVER_SOME_OP, ENQUEUE_FROM_OP, RELEASE_OP, MODIFIED_RETURN_OP,
 MODIFIED_DEAD_LETTER_OP, CHECKOUT_IN_OP, RETURN_FRONT_OP, RELEASE_FRONT_OP) = range(1, 20)
# seq, expiry, record length, the body's size (a copy need not read it from the record); then the record (the
# message as a store keeps it)
ENQUEUE = struct.Struct(">BQQII")
ENQUEUE_FROM = struct.Struct(">BQQIIQQ")  # from a window of publishes: ENQUEUE's fields, its enqueuer, its seq there
SEQ = struct.Struct(">BQ")  # a settled checkout of a seq (and one of no term, before terms); purge below a seq
CHECKOUT = struct.Struct(">BQQ")  # a checkout of a seq, in a term
SEQS = struct.Struct(">BI")  # settle, expire, dead-lettered, recover some: a count, then that many seqs
RETURN = struct.Struct(">BQI")  # the first new seq, a count, then the seqs
DEAD_LETTER = struct.Struct(">BBI")  # a reason (REASONS), a count, then the seqs
CONFIGURE = struct.Struct(">BqB")  # delivery limit (-1: none), at least once
# a Return or DeadLetter with annotations (kinds of their own: the older ones decode as they did): RETURN's or
# DEAD_LETTER's fields (a return's flags before its count: ``counted``, 1, and ``front``, 2), the annotations'
# length; the seqs, the annotations.  A return served first has kinds of its own too (RETURN_FRONT, RELEASE_FRONT),
# with RETURN's fields
RETURN_COUNTED, RETURN_FRONT = 1, 2
MODIFIED_RETURN = struct.Struct(">BQBII")
MODIFIED_DEAD_LETTER = struct.Struct(">BBII")


def encode(op: LogOp) -> bytes:
    """An op as it goes on the wire."""
    encoder = _ENCODERS.get(type(op))
    if encoder is None:
        raise TypeError(f"{op} is not shipped")
    return encoder(op)


def decode(data: memoryview, pos: int) -> tuple[LogOp, int]:
    """The op encoded at ``pos`` (an Enqueue's message: its store record, a slice of ``data``), and where it
    ends."""
    decoder = _DECODERS.get(data[pos])
    if decoder is None:
        raise ValueError(f"unknown op {data[pos]}")
    return decoder(data, pos)


def _seqs(seqs: list[int]) -> bytes:
    return struct.pack(f">{len(seqs)}Q", *seqs)


def _read_seqs(data: memoryview, pos: int, count: int) -> tuple[list[int], int]:
    return list(struct.unpack_from(f">{count}Q", data, pos)), pos + 8 * count


def _encode_enqueue(op: Enqueue) -> bytes:
    head, route, header, body = op.message.payload()
    size = len(head) + len(route) + len(header) + len(body)
    if op.enqueuer:
        return b"".join((ENQUEUE_FROM.pack(ENQUEUE_FROM_OP, op.seq, op.expiry, size, op.size, op.enqueuer,
                                           op.publish), head, route, header, body))
    return b"".join((ENQUEUE.pack(ENQUEUE_OP, op.seq, op.expiry, size, op.size), head, route, header, body))


def _decode_enqueue(data: memoryview, pos: int) -> tuple[LogOp, int]:
    seq, expiry, start, end, size, enqueuer, publish = enqueue_fields(data, pos)
    return Enqueue(seq, expiry, data[start:end], enqueuer, publish, size), end


def enqueue_fields(data: memoryview, pos: int) -> tuple[int, int, int, int, int, int, int]:
    """The fields of the Enqueue at ``pos`` (either kind), with no op made: ``(seq, expiry, where its record starts
    and ends in data, the body's size, enqueuer, publish)`` (a follower's hot path: ``oplog.apply``)."""
    if data[pos] == ENQUEUE_FROM_OP:
        _, seq, expiry, length, size, enqueuer, publish = ENQUEUE_FROM.unpack_from(data, pos)
        pos += ENQUEUE_FROM.size
        return seq, expiry, pos, pos + length, size, enqueuer, publish
    _, seq, expiry, length, size = ENQUEUE.unpack_from(data, pos)
    pos += ENQUEUE.size
    return seq, expiry, pos, pos + length, size, 0, 0


def _encode_checkout(op: Checkout) -> bytes:
    if op.settled:
        return SEQ.pack(CHECKOUT_SETTLED_OP, op.seq)
    return CHECKOUT.pack(CHECKOUT_IN_OP, op.seq, op.term)


def _decode_checkout(data: memoryview, pos: int) -> tuple[LogOp, int]:
    kind, seq = SEQ.unpack_from(data, pos)
    if kind == CHECKOUT_IN_OP:
        _, seq, term = CHECKOUT.unpack_from(data, pos)
        return Checkout(seq, False, term), pos + CHECKOUT.size
    return Checkout(seq, kind == CHECKOUT_SETTLED_OP), pos + SEQ.size


def _list_codec(kind: int, make: Callable[[list[int]], LogOp]) -> tuple[Callable[[Any], bytes], Callable[
        [memoryview, int], tuple[LogOp, int]]]:
    """The codec of an op that is a list of seqs (``op.seqs``), ``kind`` on the wire."""
    def encode_seqs(op: Any) -> bytes:
        return SEQS.pack(kind, len(op.seqs)) + _seqs(op.seqs)

    def decode_seqs(data: memoryview, pos: int) -> tuple[LogOp, int]:
        seqs, end = _read_seqs(data, pos + SEQS.size, SEQS.unpack_from(data, pos)[1])
        return make(seqs), end
    return encode_seqs, decode_seqs


_RETURN_KINDS: Final = {(True, False): RETURN_OP, (False, False): RELEASE_OP, (True, True): RETURN_FRONT_OP,
                        (False, True): RELEASE_FRONT_OP}  # by (counted, front)


def _encode_return(op: Return) -> bytes:
    if op.annotations:
        flags = (RETURN_COUNTED if op.counted else 0) | (RETURN_FRONT if op.front else 0)
        return b"".join((MODIFIED_RETURN.pack(MODIFIED_RETURN_OP, op.first, flags, len(op.seqs),
                                              len(op.annotations)), _seqs(op.seqs), op.annotations))
    return RETURN.pack(_RETURN_KINDS[op.counted, op.front], op.first, len(op.seqs)) + _seqs(op.seqs)


def _decode_return(data: memoryview, pos: int) -> tuple[LogOp, int]:
    kind, first, count = RETURN.unpack_from(data, pos)
    seqs, pos = _read_seqs(data, pos + RETURN.size, count)
    return Return(seqs, first, kind in (RETURN_OP, RETURN_FRONT_OP), front=kind >= RETURN_FRONT_OP), pos


def _decode_modified_return(data: memoryview, pos: int) -> tuple[LogOp, int]:
    _, first, flags, count, size = MODIFIED_RETURN.unpack_from(data, pos)
    seqs, pos = _read_seqs(data, pos + MODIFIED_RETURN.size, count)
    annotations = bytes(data[pos:pos + size])
    return Return(seqs, first, bool(flags & RETURN_COUNTED), annotations, bool(flags & RETURN_FRONT)), pos + size


def _encode_dead_letter(op: DeadLetter) -> bytes:
    reason = REASONS.index(op.reason)
    if op.annotations:
        return b"".join((MODIFIED_DEAD_LETTER.pack(MODIFIED_DEAD_LETTER_OP, reason, len(op.seqs),
                                                   len(op.annotations)), _seqs(op.seqs), op.annotations))
    return DEAD_LETTER.pack(DEAD_LETTER_OP, reason, len(op.seqs)) + _seqs(op.seqs)


def _decode_dead_letter(data: memoryview, pos: int) -> tuple[LogOp, int]:
    _, reason, count = DEAD_LETTER.unpack_from(data, pos)
    seqs, pos = _read_seqs(data, pos + DEAD_LETTER.size, count)
    return DeadLetter(seqs, REASONS[reason]), pos


def _decode_modified_dead_letter(data: memoryview, pos: int) -> tuple[LogOp, int]:
    _, reason, count, size = MODIFIED_DEAD_LETTER.unpack_from(data, pos)
    seqs, pos = _read_seqs(data, pos + MODIFIED_DEAD_LETTER.size, count)
    return DeadLetter(seqs, REASONS[reason], bytes(data[pos:pos + size])), pos + size


def _encode_purge(op: Purge) -> bytes:
    return SEQ.pack(PURGE_OP, op.below)


def _decode_purge(data: memoryview, pos: int) -> tuple[LogOp, int]:
    return Purge(SEQ.unpack_from(data, pos)[1]), pos + SEQ.size


_SETTLE, _EXPIRE, _DEAD_LETTERED, _RECOVER_SOME = (
    _list_codec(SETTLE_OP, Settle), _list_codec(EXPIRE_OP, Expire), _list_codec(DEAD_LETTERED_OP, DeadLettered),
    _list_codec(RECOVER_SOME_OP, Recover))


def _encode_recover(op: Recover) -> bytes:
    return bytes((RECOVER_OP,)) if op.seqs is None else _RECOVER_SOME[0](op)


def _decode_recover(data: memoryview, pos: int) -> tuple[LogOp, int]:
    return Recover(), pos + 1


def _encode_configure(op: Configure) -> bytes:
    return CONFIGURE.pack(CONFIGURE_OP, -1 if op.delivery_limit is None else op.delivery_limit, op.at_least_once)


def _decode_configure(data: memoryview, pos: int) -> tuple[LogOp, int]:
    _, limit, at_least_once = CONFIGURE.unpack_from(data, pos)
    return Configure(None if limit < 0 else limit, bool(at_least_once)), pos + CONFIGURE.size


_ENCODERS: Final[Mapping[type, Callable[[Any], bytes]]] = MappingProxyType({
    Enqueue: _encode_enqueue, Checkout: _encode_checkout, Settle: _SETTLE[0], Return: _encode_return,
    Expire: _EXPIRE[0], DeadLetter: _encode_dead_letter, DeadLettered: _DEAD_LETTERED[0], Purge: _encode_purge,
    Recover: _encode_recover, Configure: _encode_configure})
_DECODERS: Final[Mapping[int, Callable[[memoryview, int], tuple[LogOp, int]]]] = MappingProxyType({
    ENQUEUE_OP: _decode_enqueue, ENQUEUE_FROM_OP: _decode_enqueue, CHECKOUT_OP: _decode_checkout,
    CHECKOUT_SETTLED_OP: _decode_checkout, CHECKOUT_IN_OP: _decode_checkout, SETTLE_OP: _SETTLE[1],
    RETURN_OP: _decode_return, RELEASE_OP: _decode_return, RETURN_FRONT_OP: _decode_return,
    RELEASE_FRONT_OP: _decode_return, MODIFIED_RETURN_OP: _decode_modified_return,
    EXPIRE_OP: _EXPIRE[1], DEAD_LETTER_OP: _decode_dead_letter, MODIFIED_DEAD_LETTER_OP: _decode_modified_dead_letter,
    DEAD_LETTERED_OP: _DEAD_LETTERED[1], PURGE_OP: _decode_purge,
    RECOVER_OP: _decode_recover, RECOVER_SOME_OP: _RECOVER_SOME[1], CONFIGURE_OP: _decode_configure})
