"""Durable definitions of exchanges, queues and bindings as typed records.

One record class per kind, shared by the broker (which makes and recovers them), the LMDB definition
store and the cluster's metadata in etcd (both of which keep ``to_json()``).  ``key`` is the record's
name in either store; ``from_json`` ignores fields another store added.  Arguments keep their AMQP field types
in JSON (``field_types.to_json``); a binding's key hashes them by value, as its exchange matches them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from .framing import field_types

R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    kind: ClassVar[str]

    @property
    def key(self) -> str:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The record as JSON; ``arguments`` keep every field type (``field_types.to_json``), so a timestamp, a
        decimal, a byte array or a byte-wide integer comes back as it was declared."""
        raw = asdict(self)
        if "arguments" in raw:
            raw["arguments"] = field_types.to_json(raw["arguments"])
        return raw

    @classmethod
    def from_json(cls: type[R], raw: dict[str, Any]) -> R:
        values = {f.name: raw[f.name] for f in fields(cls) if f.name in raw}
        if "arguments" in values:
            values["arguments"] = field_types.from_json(values["arguments"])
        return cls(**values)


def name_key(vhost: str, name: str) -> str:
    """The key of an exchange or queue: its vhost and name."""
    return json.dumps([vhost, name])


@dataclass(frozen=True)
class ExchangeRecord(Record):
    kind: ClassVar[str] = "exchange"
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return name_key(self.vhost, self.name)


@dataclass(frozen=True)
class QueueRecord(Record):
    """A queue.  ``index_id`` names its queue index (a durable queue on its node); ``node`` is its owner in
    cluster mode ('' until placed), for a quorum queue its first leader.  An ``exclusive`` queue is the cluster's
    too (cluster mode), as RabbitMQ's are in its metadata with their owner: other nodes route to it and lock other
    connections out of it; ``run`` is the run of its node (``Cluster.run``) whose connection owns it, so that a
    record left by an earlier run is known as stale."""

    kind: ClassVar[str] = "queue"
    vhost: str
    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    index_id: int = 0
    node: str = ""
    members: list[str] = field(default_factory=list)  # a quorum queue's group in cluster mode, leader first
    exclusive: bool = False
    run: str = ""

    @property
    def key(self) -> str:
        return name_key(self.vhost, self.name)


@dataclass(frozen=True)
class BindingRecord(Record):
    """A binding; ``created`` (ns) orders recovery, since a consistent-hash ring is laid out in binding order."""

    kind: ClassVar[str] = "binding"
    vhost: str
    source: str
    destination: str
    destination_type: str  # "queue" or "exchange"
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    created: int = 0

    @property
    def key(self) -> str:
        raw = json.dumps([self.vhost, self.source, self.destination_type, self.destination, self.routing_key,
                          self.arguments], sort_keys=True, default=str)
        return hashlib.sha1(raw.encode()).hexdigest()
