"""What the broker's services share: the definitions they make durable and the cluster's (``Definitions``), what
the cluster is to them (``ClusterHooks``), and the checks every service makes.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from .. import errors
from ..framing import field_types
from ..queues import queue_args
from ..access_control import Principal
from ..definition_store import DefinitionStore, StoreFull
from ..errors import ChannelError, resource_name
from ..message import Message
from ..queues.queue import AnyQueue, Queue
from ..records import Record

if TYPE_CHECKING:
    from ..ports import ConfirmSink, ExclusiveOwner


class QuorumHooks(Protocol):
    """The replicated queues' groups (``forwarder.quorum.groups.QuorumGroups``), as the forwarder's links and the HTTP
    API reach them through the broker."""

    def peer_up(self, name: str) -> None: ...

    def peer_down(self, name: str, silent: bool = False) -> None: ...

    def replicate(self, session: Any, payload: bytes) -> None:
        """A leader's ops arrived on ``session`` (a ``forwarder.peers.owner_side.PeerSession``, which the core cannot
        name)."""

    def replicated(self, peer_name: str, payload: bytes) -> None: ...

    def leader_of(self, key: str) -> tuple[str, int]:
        """The leader of a queue (its key: vhost, NUL, name) as known here, and its term (("", 0): none)."""

    def lag(self) -> dict[str, dict[str, int]]: ...

    def critical(self) -> list[tuple[str, str]]:
        """(vhost, name) of the queues this node's shutdown would leave without a majority of running members."""

    async def change_members(self, vhost: str, name: str, add: str = "", remove: str = "") -> None: ...

    def change_here(self, vhost: str, name: str, add: str = "", remove: str = "") -> None:
        """``change_members`` at the queue's leader (this node), which another node's asked for."""

    async def grow(self, node: str, strategy: str, vhost_pattern: str = ".*", queue_pattern: str = ".*") -> int: ...


class PeerHooks(Protocol):
    """Another node (``forwarder.peers.peer.Peer``), as the HTTP API reaches it."""

    @property
    def http(self) -> tuple[str, int] | None:
        """Its management API, if it serves one."""

    @property
    def alarms(self) -> set[str]:
        """The resources alarmed on it (``publisher_flow.MEMORY``, ``DISK``), as it last said."""


class ClusterHooks(Protocol):
    """What the broker tells the cluster (``forwarder``): definition changes made on this node; and what the
    front ends and the forwarder's own parts reach through the broker (``quorum``, ``peers``)."""

    @property
    def quorum(self) -> QuorumHooks: ...

    @property
    def peers(self) -> Mapping[str, PeerHooks]: ...

    def defined(self, kind: str, key: str, record: dict[str, Any]) -> None: ...

    def undefined(self, kind: str, key: str) -> None: ...

    async def written(self) -> None: ...

    async def reached(self, revision: int) -> bool:
        """Another node made a change of definitions: waits (bounded) until this node's have it; whether they do."""

    def nodes(self) -> list[tuple[str, bool]]: ...

    async def forget(self, name: str) -> None: ...

    async def agree(self, record: Record) -> None: ...

    async def look_up(self, kind: str, key: str) -> None: ...

    @property
    def current(self) -> bool:
        """This node's definitions are known to be the cluster's (not before its first full read of etcd, nor
        while its watch of them is broken): routing nowhere by them may be trusted."""

    async def caught_up(self) -> bool:
        """Waits (bounded) until ``current``; whether it is."""

    def stream_address(self, node: str) -> tuple[str, int] | None:
        """Where another node serves the stream protocol (host, port), if it does and is up."""


class Destination(Protocol):
    """What a message is routed to: a queue, or a direct reply-to consumer (``direct_reply.ReplyConsumer``)."""

    name: str

    def enqueue(self, message: Message, confirm: ConfirmSink | None = None) -> bool | None: ...


def _flag(value: bool) -> str:
    return "true" if value else "false"


def storable(arguments: dict[str, Any] | None, what: str, queue: bool = False) -> None:
    """Arguments Warren could not keep (in LMDB, etcd, an export) or list are refused before anything is made, on
    every path that makes a definition (a client's declaration over AMQP, the stream protocol or HTTP, an import, a
    definition another node agreed): tables nested deeper than ``field_types.MAX_DEPTH``, integers outside AMQP's
    signed 64 bits, and a ``queue``'s values beyond RabbitMQ's caps (``queue_args.check_caps``): 406, RabbitMQ's
    code for arguments it refuses."""
    if queue and arguments:
        queue_args.check_caps(arguments)
    try:
        field_types.to_json(arguments or {})
    except (TypeError, ValueError) as exc:
        raise errors.precondition_failed(f"invalid arguments for {what}: {exc}") from None


def exclusive_locked(queue: AnyQueue) -> ChannelError:
    """405 for another connection's exclusive queue, in RabbitMQ's words."""
    return errors.resource_locked(
        f"cannot obtain exclusive access to locked {resource_name('queue', queue.name, queue.vhost)}. "
        "It could be originally declared on another connection or the exclusive property value does not "
        "match that of the original declaration.")


def shown(value: Any) -> str:
    """A value in an inequivalence error, as RabbitMQ prints it (booleans lower case)."""
    return _flag(value) if isinstance(value, bool) else str(value)


def shown_arg(value: Any) -> str:
    """rabbit_misc:val/1 for a table entry: its value and AMQP field type (``none`` when absent)."""
    if value is None:
        return "none"
    return f"the value '{shown(value)}' of type '{field_types.name(value)}'"


def check_exclusive(queue: AnyQueue, connection: "ExclusiveOwner[Queue] | None") -> None:
    """Another connection's exclusive queue is locked (405) to every operation on it."""
    if queue.exclusive_owner is not None and queue.exclusive_owner is not connection:
        raise exclusive_locked(queue)


class Definitions:
    """Definitions made here (exchanges, queues, bindings): kept in LMDB if durable and, in cluster mode, made the
    cluster's.  The cluster (the forwarder) joins after the broker is built, so the services that make
    definitions reach it here (``cluster``) rather than being handed it."""

    def __init__(self, store: DefinitionStore) -> None:
        self.store = store
        self.cluster: ClusterHooks | None = None  # set by the forwarder in cluster mode

    def define(self, record: Record, durable: bool) -> None:
        """A definition made here: kept in LMDB if durable, and (cluster mode) made the cluster's."""
        raw = record.to_json()
        if durable:
            self.store.put(record.kind, record.key, raw)
        if self.cluster is not None:
            self.cluster.defined(record.kind, record.key, raw)

    def undefine(self, record: Record, durable: bool) -> None:
        if durable:
            self.store.delete(record.kind, record.key)
        if self.cluster is not None:
            self.cluster.undefined(record.kind, record.key)

    def check_room(self, what: str, arguments: Any, who: Principal | None) -> None:
        """A client's new durable definition is refused (406) before anything is made when it would take the
        definition store past ``--definitions-max-size``; administrators' imports and the cluster's definitions
        (``who`` None) are not limited, as they are not by vhost limits."""
        if who is None:
            return
        try:
            self.store.room(len(json.dumps(field_types.to_json(arguments or {}))))
        except StoreFull as exc:
            raise errors.precondition_failed(f"cannot declare {what}: {exc}") from None

    async def agreed(self) -> None:
        """Cluster mode: the definition changes made on this node so far are the cluster's (in etcd), so that a
        change answered to a client survives this node's crash, as RabbitMQ answers once Mnesia has it."""
        if self.cluster is not None:
            await self.cluster.written()
