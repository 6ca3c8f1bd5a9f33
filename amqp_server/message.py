"""A published message as the broker keeps it.

The content header arrives as bytes and goes out again as the same bytes, so
routing and delivery never decode properties.  One is read or replaced on the
bytes when something needs it (user-id validation, TTL, direct reply-to,
dead-lettering); all are decoded (:mod:`framing.properties`) only for the headers
exchange and the management API.
"""
from __future__ import annotations

import re
import struct
from typing import Any

from pamqp import commands
from pamqp.header import ContentHeader

from .framing import codec, header_table, properties
from . import payload as payload_codec
from .framing.properties import Properties

_LONG = struct.Struct(">I")
_FLAGS = struct.Struct(">H")
_CHECKED = codec.FLAG_USER_ID | codec.FLAG_EXPIRATION | codec.FLAG_REPLY_TO | codec.FLAG_HEADERS
_LEADING_INTEGER = re.compile(r"[+-]?[0-9]+")
MAX_EXPIRY = 315_360_000_000  # ten years in ms: rabbit_misc:check_expiry
# a stored body at least this large is not held in memory by a queue's entry nor by an unacked delivery: it is sent
# from the store's file (``amqp091.channel``), or read back when needed (a requeue to another protocol's consumer,
# a dead-lettering)
RELEASE_FROM = 256 * 1024


def expiration_error(value: str) -> str | None:
    """Why RabbitMQ refuses an ``expiration`` (string:to_integer, then check_expiry), in its terms; None if fine."""
    match = _LEADING_INTEGER.match(value)
    if match is None:
        return "no_integer"
    if match.end() < len(value):
        return f'{{leftover_string,"{value[match.end():]}"}}'
    ttl = int(match.group())
    if ttl < 0:
        return f"{{value_negative,{ttl}}}"
    if ttl > MAX_EXPIRY:
        return f"{{value_too_large,{ttl}}}"
    return None


class Message:
    """One message, shared by every queue it was routed to."""

    __slots__ = ("exchange", "routing_key", "route", "header", "body", "body_size", "msg_id", "transient_id",
                 "logged", "_properties", "_flags", "bcc_keys", "amqp10", "__weakref__")
    bcc_keys: tuple[str, ...]  # a message published with BCC: its BCC keys, stripped from its headers (sender_selected)
    # a message published over AMQP 1.0: its sections before the body as they came (``header`` is what a 0-9-1
    # reader gets), so an AMQP 1.0 reader gets them back (stream_log.amqp10.record_parts); None for others
    amqp10: bytes | None

    def __init__(self, exchange: str, routing_key: str, route: bytes, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.route = route  # exchange + routing key, AMQP short strings, as published
        self.header = header  # content header payload: class, weight, size, flags, properties
        self.body = body
        self.body_size = len(body)
        self.msg_id = 0  # set once written to the persistent store
        self.transient_id = 0  # a message paged in from the transient store: its record there (to load it)
        self.logged = False  # stored apart from this object (a stream's log, a quorum queue's copy of a transient one)
        self.bcc_keys = ()
        self.amqp10 = None
        self._properties: Properties | None = None
        self._flags = struct.unpack_from(">H", header, 12)[0] if len(header) >= 14 else 0

    @property
    def awaits_commit(self) -> bool:
        """A queue it went to stored it (in the store, a stream's log, a copy of its own): its publish is confirmed
        once the group commit being staged is durable."""
        return bool(self.msg_id) or self.logged

    @classmethod
    def stored(cls, msg_id: int, body_size: int, transient_id: int = 0) -> "Message":
        """A message read back from a queue index (after a restart, or paged in) whose content stays in the
        persistent store (``msg_id``) or the transient one (``transient_id``) until it is needed."""
        message = cls.__new__(cls)
        message.msg_id = msg_id
        message.transient_id = transient_id
        message.logged = False
        message.bcc_keys = ()
        message.amqp10 = None
        message.body_size = body_size
        message.body = None  # type: ignore[assignment]  # until load_body: typed bytes for the hot path's readers
        message.header = None  # type: ignore[assignment]  # (as the body)
        message._properties = None
        return message

    def copy(self) -> "Message":
        """The same content in an object of its own (references, no bytes copied): a queue that stores a
        transient message, which the other queues it went to keep in memory only, holds its own.  A body left in
        its store stays there (None, of the same size)."""
        other = Message(self.exchange, self.routing_key, self.route, self.header, self.body or b"")
        other.body, other.body_size = self.body, self.body_size
        other.bcc_keys = self.bcc_keys
        other.amqp10 = self.amqp10
        return other

    def without_body(self) -> "Message":
        """The message as a consumer's unacked delivery keeps it once sent: everything but the body, which the
        store gives back if it is needed again (a requeue, a dead-lettering); other holders keep theirs."""
        other = self.copy()
        other.body = None  # type: ignore[assignment]  # as Message.stored's: load_body fills it
        other.msg_id = self.msg_id
        return other

    def payload(self) -> tuple[bytes, ...]:
        """What a store keeps of the message, in parts (never concatenated here): lengths, route, header, body."""
        return payload_codec.encode(self.route, self.header, self.body, self.amqp10)

    def fill_from(self, payload: bytes, routes: dict[bytes, tuple[bytes, str, str]] | None = None,
                  headers: dict[bytes, bytes] | None = None) -> None:
        """Route, header and body back from a store's ``payload()`` record.  ``routes`` and ``headers``: what
        the messages of one batch share (a few routes and headers: each is then one object in memory)."""
        route, header, body, self.amqp10 = payload_codec.decode(payload)
        decoded = routes.get(route) if routes is not None else None
        if decoded is None:
            decoded = (route, *payload_codec.route_names(route))
            if routes is not None:
                routes[route] = decoded
        if headers is not None:
            header = headers.setdefault(header, header)
        self.route, self.exchange, self.routing_key = decoded
        self.header = header
        self.body = body
        self._flags = _FLAGS.unpack_from(header, 12)[0] if len(header) >= 14 else 0

    def fill_head_from(self, head: bytes) -> None:
        """Route and header back from a store's record without its body (``MessageStore.read_head``): the body
        stays in the store, as ``stored`` left it."""
        self.fill_from(head)
        self.body = None  # type: ignore[assignment]  # (as Message.stored's)

    def property_str(self, flag: int) -> str | None:
        """One shortstr property (``codec.FLAG_*``), read from the bytes without decoding the others."""
        return properties.read_str(self.header, flag) if self._flags & flag else None

    def header_value(self, name: str) -> Any:
        """One header's value; an integer or string one is read from the header bytes, without pamqp."""
        try:
            return header_table.read(self.header, self._flags, name)
        except header_table.NotInTable:
            return (self.headers or {}).get(name)

    def set_int_header(self, name: str, value: int) -> None:
        """Set an integer header (a delayed exchange negates ``x-delay``), before anything stored the message."""
        self.header = header_table.with_int_set(self.header, name, value)
        self._properties = None
        self._flags = struct.unpack_from(">H", self.header, 12)[0]

    @property
    def properties(self) -> Properties:
        if self._properties is None:
            self._properties = properties.decode(self.header)
        return self._properties

    @property
    def headers(self) -> dict | None:
        if not self._flags & codec.FLAG_HEADERS:
            return None
        return self.properties.headers

    @property
    def has_headers(self) -> bool:
        return bool(self._flags & codec.FLAG_HEADERS)

    def typed_headers(self) -> dict[str, header_table.Field]:
        """The headers table with each value's wire type (for re-encoding it without changing them)."""
        return header_table.headers(self.header, self._flags)

    def replace_headers(self, fields: dict[str, header_table.Field]) -> None:
        """Rewrite the headers table in the content header bytes (BCC removed), before routing stores it."""
        self.header = header_table.with_headers(self.header, self._flags, fields)
        self._properties = None
        self._flags = struct.unpack_from(">H", self.header, 12)[0]

    @property
    def has_expiration(self) -> bool:
        return bool(self._flags & codec.FLAG_EXPIRATION)

    @property
    def expiration_ms(self) -> int | None:
        """The per-message TTL; ValueError if it is not a non-negative integer, as RabbitMQ requires."""
        value = properties.read_str(self.header, codec.FLAG_EXPIRATION)
        if value is None:
            return None
        ttl = int(value)
        if ttl < 0:
            raise ValueError(value)
        return ttl

    @property
    def needs_checks(self) -> bool:
        """user_id, expiration, reply_to or headers (CC/BCC) is set: one test lets the publish path skip them all."""
        return bool(self._flags & _CHECKED)

    @property
    def persistent(self) -> bool:
        """delivery_mode == 2, read straight from the header bytes."""
        return self._octet(codec.FLAG_DELIVERY_MODE, "delivery_mode") == 2

    @property
    def priority(self) -> int:
        """The priority property (0 when unset), read straight from the header bytes."""
        return self._octet(codec.FLAG_PRIORITY, "priority") or 0

    def _octet(self, flag: int, name: str) -> int | None:
        """delivery_mode or priority: the octet properties after content type, encoding and headers."""
        flags = self._flags
        if not flags & flag:
            return None
        header = self.header
        pos = codec.table_pos(header, flags)
        if flags & codec.FLAG_HEADERS:
            pos += 4 + _LONG.unpack_from(header, pos)[0]
        if flag == codec.FLAG_PRIORITY and flags & codec.FLAG_DELIVERY_MODE:
            pos += 1
        return header[pos]

def encode_route(exchange: str, routing_key: str) -> bytes:
    return codec.shortstr(exchange) + codec.shortstr(routing_key)


def build_header(props: commands.Basic.Properties, body_size: int) -> bytes:
    """Content header payload for a message the broker makes itself (HTTP publish, the aliveness test)."""
    return ContentHeader(0, body_size, props).marshal()


def make_message(exchange: str, routing_key: str, props: commands.Basic.Properties,
                 body: bytes) -> Message:
    return Message(exchange, routing_key, encode_route(exchange, routing_key),
                   build_header(props, len(body)), body)
