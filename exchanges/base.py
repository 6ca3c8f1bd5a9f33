"""Binding value type and the abstract exchange every exchange type derives from.

An exchange owns its bindings and answers one question per published message:
which destinations receive it.  Destinations are opaque hashable objects (queues
or exchanges) supplied by the caller; nothing here inspects them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar

NO_DESTINATIONS: frozenset = frozenset()
_BY_KEY = itemgetter(0)


def _freeze(value: Any) -> Any:
    """Make an AMQP field value hashable: tables become frozensets of pairs, arrays tuples.

    Distinct container types keep a table and an array of pairs from comparing equal,
    which lets `_thaw` restore the original shape unambiguously.
    """
    if isinstance(value, Mapping):
        return frozenset((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, bytearray):
        return _FrozenByteArray(value)
    if isinstance(value, (bool, float)):
        return _Typed(value, type(value))
    return value


class _FrozenByteArray(bytes):
    """A byte array ('x') frozen: hashable, equal to the same bytes, and a byte array again once thawed."""
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class _Typed:
    """A bool or a float frozen apart from the int Python finds it equal to (``True == 1``, ``1.0 == 1``): as
    RabbitMQ's typed argument tables, ``{f: true}`` and ``{f: 1}`` are two bindings."""
    value: Any
    kind: type


def _thaw(value: Any) -> Any:
    if isinstance(value, frozenset):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, _FrozenByteArray):
        return bytearray(value)
    if isinstance(value, _Typed):
        return value.value
    return value


def freeze_arguments(arguments: Mapping[str, Any] | None) -> tuple:
    """Canonical, order-independent form of a binding's argument table (its identity)."""
    if not arguments:
        return ()
    return tuple(sorted(((k, _freeze(v)) for k, v in arguments.items()), key=_BY_KEY))


@dataclass(frozen=True, slots=True)
class Binding:
    """One binding.  Identity is the full (source, destination, key, arguments) tuple,
    as in RabbitMQ: the same key with different arguments is a distinct binding."""

    source: str
    destination: object
    routing_key: str
    arguments: tuple

    def args_dict(self) -> dict[str, Any]:
        """The argument table as a plain dict (nested tables/arrays as dicts/lists)."""
        return {k: _thaw(v) for k, v in self.arguments}


class Exchange(ABC):
    """Binding bookkeeping shared by all types; subclasses index bindings for routing.

    Subclasses implement `_add` (called before a new binding is recorded, so it may
    reject it by raising), `_remove`, and `route`.
    """

    __slots__ = ("name", "durable", "auto_delete", "internal", "arguments", "alternate", "policy",
                 "operator_policy", "publish_in", "publish_out", "_by_destination", "_count")

    type_name: ClassVar[str]

    @property
    def routes_each_key(self) -> bool:
        """Whether a message with several routing keys (CC, BCC) is routed by each of them and the destinations
        joined (direct, topic: their route/2 match every key), or once for the whole message (the others: fanout
        and headers ignore keys, RabbitMQ's random exchanges pick one queue, the consistent hash hashes the first
        key only)."""
        return False

    def __init__(self, name: str, durable: bool = False, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = dict(arguments) if arguments else {}
        # The alternate exchange in effect: the argument, else a policy's (set by the broker's policies).
        self.alternate: Any = self.arguments.get("alternate-exchange")
        self.policy: Any = None  # the user / operator policy applied (opaque here)
        self.operator_policy: Any = None
        self.publish_in = 0  # messages published to this exchange, and those it routed to some queue
        self.publish_out = 0
        # Indexed by destination so deleting a queue costs O(its bindings), not O(all).
        self._by_destination: dict[object, dict[Binding, None]] = {}
        self._count = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} bindings={self._count}>"

    def __len__(self) -> int:
        return self._count

    @property
    def has_bindings(self) -> bool:
        return self._count > 0

    def bindings(self) -> list[Binding]:
        return [b for group in self._by_destination.values() for b in group]

    def destinations(self) -> list[object]:
        """Every queue or exchange this one has a binding to."""
        return list(self._by_destination)

    def binds_to(self, destination: object) -> bool:
        return destination in self._by_destination

    def bind(self, destination: object, routing_key: str,
             arguments: Mapping[str, Any] | None = None) -> bool:
        """Add a binding; True if it is new.  May raise ValueError for invalid arguments."""
        binding = Binding(self.name, destination, routing_key, freeze_arguments(arguments))
        group = self._by_destination.get(destination)
        if group is not None and binding in group:
            return False
        self._add(binding)
        if group is None:
            group = self._by_destination[destination] = {}
        group[binding] = None
        self._count += 1
        return True

    def unbind(self, destination: object, routing_key: str,
               arguments: Mapping[str, Any] | None = None) -> bool:
        """Remove a binding; True if it existed."""
        binding = Binding(self.name, destination, routing_key, freeze_arguments(arguments))
        group = self._by_destination.get(destination)
        if group is None or binding not in group:
            return False
        del group[binding]
        if not group:
            del self._by_destination[destination]
        self._count -= 1
        self._remove(binding)
        return True

    def remove_destination(self, destination: object) -> list[Binding]:
        """Drop every binding to `destination` (queue/exchange deleted); return them."""
        group = self._by_destination.pop(destination, None)
        if not group:
            return []
        self._count -= len(group)
        for binding in group:
            self._remove(binding)
        return list(group)

    @abstractmethod
    def route(self, routing_key: str, message: Any) -> Collection[object]:
        """Destinations for a message, without duplicates.  Callers must not mutate it."""

    @abstractmethod
    def _add(self, binding: Binding) -> None: ...

    @abstractmethod
    def _remove(self, binding: Binding) -> None: ...


class DestinationSet:
    """Reference-counted destinations with a lazily rebuilt frozenset snapshot.

    Several bindings (differing only in arguments) may target one destination, so
    counts decide membership.  The snapshot is what routing hands out: immutable, so
    callers can iterate it across awaits while bindings change, and rebuilt at most
    once per change burst rather than on every bind.
    """

    __slots__ = ("_counts", "_snapshot")

    def __init__(self) -> None:
        self._counts: dict[object, int] = {}
        self._snapshot: frozenset | None = NO_DESTINATIONS

    def __bool__(self) -> bool:
        return bool(self._counts)

    def add(self, destination: object) -> None:
        counts = self._counts
        n = counts.get(destination, 0)
        counts[destination] = n + 1
        if not n:
            self._snapshot = None

    def discard(self, destination: object) -> None:
        counts = self._counts
        n = counts[destination] - 1
        if n:
            counts[destination] = n
        else:
            del counts[destination]
            self._snapshot = None

    @property
    def members(self) -> frozenset:
        snapshot = self._snapshot
        if snapshot is None:
            snapshot = self._snapshot = frozenset(self._counts)
        return snapshot
