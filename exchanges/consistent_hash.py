"""Consistent-hash exchange, as RabbitMQ's rabbitmq_consistent_hash_exchange plugin routes.

Each destination owns as many buckets on the ring as its binding key says (an
integer weight, at least 1); a message goes to the owner of the bucket that
jump consistent hashing picks for its routing key — or, with the exchange
argument ``hash-header``, a header's value, or with ``hash-property`` one of
``message_id``, ``correlation_id``, ``timestamp``.  The same value always lands
on the same destination while the bindings stay; adding a destination moves
only the keys its new buckets take.  As in the plugin, a destination is on the
ring once, with the weight of the binding that put it there; removing any of its
bindings takes it off the ring (remove_binding/1 drops every bucket of the
destination), and a binding added later puts it back at the end of the ring.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from datetime import datetime
from typing import Any, Collection

from .base import NO_DESTINATIONS, Binding, Exchange

HASH_PROPERTIES = ("correlation_id", "message_id", "timestamp")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_MASK64 = (1 << 64) - 1


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: a bucket in [0, buckets)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK64
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def _hash_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, datetime):
        return str(int(value.timestamp())).encode()
    return str(value).encode() if value is not None else b""


def parse_weight(routing_key: str) -> int:
    """A binding key's weight; ValueError (a 406) with the plugin's text if it is not a positive integer."""
    if not _INTEGER.fullmatch(routing_key):
        raise ValueError(f'The binding key must be an integer: <<"{routing_key}">>')
    weight = int(routing_key)
    if weight < 1:
        raise ValueError("The binding key must be greater than 0")
    return weight


class ConsistentHashExchange(Exchange):
    """Buckets are numbered in binding order; routing is one hash, one jump hash, one bisect."""

    __slots__ = ("_header", "_property", "_owners", "_ring", "_ends")

    type_name = "x-consistent-hash"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header: str | None = self.arguments.get("hash-header")
        self._property: str | None = self.arguments.get("hash-property")
        if self._header is not None and self._property is not None:
            raise ValueError("hash-header and hash-property are mutually exclusive")
        if self._property is not None and self._property not in HASH_PROPERTIES:
            raise ValueError(f"Unsupported property: {self._property}")
        # the destinations on the ring, in the order they were put there -> their weight
        self._owners: dict[object, int] = {}
        self._ring: list[object] = []
        self._ends: list[int] = []  # cumulative bucket counts, parallel to _ring

    def route(self, routing_key: str, message: Any) -> Collection[object]:
        if not self._ends:
            return NO_DESTINATIONS
        digest = hashlib.blake2b(_hash_bytes(self._value(routing_key, message)), digest_size=8).digest()
        bucket = jump_hash(int.from_bytes(digest, "big"), self._ends[-1])
        return (self._ring[bisect_right(self._ends, bucket)],)

    def _value(self, routing_key: str, message: Any) -> Any:
        if self._header is not None:
            return message.header_value(self._header)
        if self._property is not None:
            return getattr(message.properties, self._property)
        return routing_key

    def _add(self, binding: Binding) -> None:
        weight = parse_weight(binding.routing_key)
        if binding.destination not in self._owners:  # (add_binding/3: not when it has buckets already)
            self._owners[binding.destination] = weight
            self._rebuild()

    def _remove(self, binding: Binding) -> None:
        if self._owners.pop(binding.destination, None) is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        self._ring, self._ends, total = [], [], 0
        for destination, weight in self._owners.items():
            total += weight
            self._ring.append(destination)
            self._ends.append(total)
