"""What a queue type is (RabbitMQ's rabbit_queue_type): everything the rest of the node asks of a type, so that
it asks the type rather than branching on it.

A type declares its name (``x-queue-type``, the HTTP API's ``type``), the queue arguments it refuses and the
consumer arguments it takes, the policy keys that apply to it and its ``apply-to`` name, its capabilities, the
fields it adds to the HTTP API, and the class that holds its messages.  Each type is a module of
:mod:`types`, which also picks the type of a declaration.

Where a queue lives is not its type: a queue of this node is its type's ``queue_class``; a queue of another node
is a proxy (``forwarder.peers.remote_queue``) holding a reference to the same type.  Both answer ``type``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Collection, Protocol

from .. import errors
from ..framing import field_types
from . import queue_args
from .queue_args import QueueArgs
from .ready import Entry
from .ready_list import ReadyList, ReadyOwner, TransientPages

if TYPE_CHECKING:
    from .persistence import Persistence
    from .priority_queue import RankedRows
    from .replica_store import ReplicaStore
    from stream_log.log import StreamLogs

# What a type can do, as code outside the types asks it (RabbitMQ's capabilities, and what its types refuse):
TRANSIENT = "transient"  # declared non-durable, exclusive or auto-delete
GLOBAL_QOS = "global_qos"  # consumed by a channel with a global prefetch
NACK = "nack"  # basic.nack and basic.reject
PAGING = "paging"  # a durable queue keeps a window in memory, its tail on disk
REPLICATED = "replicated"  # a group of nodes holds it (cluster mode: placed with members)
LOG = "log"  # an append-only log read from offsets: what RabbitMQ's stream protocol serves
DELIVERY_HEADER = "delivery_header"  # each delivery carries a header of the queue's (x-delivery-count, x-stream-offset)
UNREPLICATED = "unreplicated"  # held by one node alone (RabbitMQ's classic queues): what x-local-random picks from
STORES_ALL = "stores_all"  # every message is on disk, whatever its delivery mode (a durable queue's transient ones too)
EXCLUSIVE_CONSUME = "exclusive_consume"  # an exclusive consumer has the queue alone (rabbit_amqqueue_process's; a
# quorum queue or stream records the flag and refuses no one, as rabbit_fifo and rabbit_stream_queue)
# Policy keys whose value and the queue's own argument both count: the lower applies (every type that takes them)
LOWER_WINS = ("expires", "message-ttl", "max-length", "max-length-bytes", "consumer-timeout")
# Policy keys where the queue's own argument, when set, overrides the policy
ARGUMENT_WINS = ("dead-letter-exchange", "dead-letter-routing-key", "overflow")


class HttpView(Protocol):
    """What a type's HTTP fields need of the management plugin."""

    @property
    def node(self) -> str: ...

    def node_running(self, name: str) -> bool: ...

    def idle_since(self, queue: Any) -> str | None: ...


class NodeStorage(Protocol):
    """This node's storage, as the types hand it to their queues (``broker.queues.Storage``, built with the
    broker): the pager, the persistence every durable queue shares, and what one type keeps apart."""

    node_name: str
    queue_window: int  # ready entries a durable queue that pages keeps in memory
    persistence: Persistence
    ranked_rows: RankedRows  # priority queues' rows, keyed by level
    replicas: ReplicaStore  # the quorum queues' copies
    stream_logs: StreamLogs  # the streams' logs

    @property
    def pager(self) -> TransientPages:
        """Where a queue's ready entries page out to when memory runs short."""


class QueueType:
    """A queue type: subclassed once per type, in a module of its own (:mod:`types`)."""

    name: ClassVar[str]  # x-queue-type, the HTTP API's type, rabbit_NAME_queue in RabbitMQ's texts
    apply_to: ClassVar[str]  # the policies' apply-to value that names this type's queues
    refused_arguments: ClassVar[tuple[str, ...]] = ()  # queue arguments refused (RabbitMQ 3.10's texts name them)
    consumer_arguments: ClassVar[tuple[str, ...]] = ()  # basic.consume arguments taken (others: refused)
    # the arguments a declaration of an existing queue of this type must repeat, in the order the first that
    # differs is named (RabbitMQ 3.10's queue_arguments, which rabbit_amqqueue:assert_args_equivalence checks):
    # rabbit_classic_queue's
    equivalent_arguments: ClassVar[tuple[str, ...]] = (
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
        "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
        "x-single-active-consumer", "x-queue-type", "x-queue-master-locator")
    policy_lower_wins: ClassVar[tuple[str, ...]] = LOWER_WINS  # policy keys as LOWER_WINS says, for this type
    policy_argument_wins: ClassVar[tuple[str, ...]] = ARGUMENT_WINS  # and as ARGUMENT_WINS says
    # policy keys that make a policy not apply to this type's queues (RabbitMQ 3.10's unsupported_policies)
    unsupported_policies: ClassVar[frozenset[str]] = frozenset()
    capabilities: ClassVar[frozenset[str]] = frozenset()
    queue_class: ClassVar[Callable[..., Any]]  # the class that holds its messages on the node it lives on
    memory_category: ClassVar[str]  # rabbit_vm:memory/0's category of its queues (the HTTP API's node memory)

    def delete_checks(self, name: str, vhost: str, if_unused: bool, if_empty: bool) -> bool:
        """Whether queue.delete's if-unused and if-empty are checked on a queue of this type (and its delete-ok
        counts the ready messages); a type that does not serve them refuses them here."""
        return True

    def __repr__(self) -> str:
        return f"<queue type {type(self).__name__}>"

    def is_policy_applicable(self, definition: Collection[str]) -> bool:
        """Whether a policy of these keys may apply to this type's queues: not if it has one of the type's
        ``unsupported_policies`` (rabbit_queue_type:is_policy_applicable/2), and the next by priority does."""
        return self.unsupported_policies.isdisjoint(definition)

    def chosen_by(self, arguments: dict[str, Any]) -> bool:
        """Among the types of one name, whether a declaration with these arguments is of this one (a classic
        queue with ``x-max-priority`` is a priority queue)."""
        return True

    def parse(self, arguments: dict[str, Any], queue: str, vhost: str,
              types: Collection[str] | None = None) -> QueueArgs:
        """The arguments' values checked, those this type refuses among them (``types``: see queue_args.parse)."""
        return queue_args.parse(arguments, queue, vhost, self, types)

    def new(self, name: str, vhost: str, durable: bool, exclusive_owner: Any, auto_delete: bool,
            arguments: dict[str, Any], args: QueueArgs, host: Any) -> Any:
        """A queue of this type on this node."""
        return self.queue_class(name, vhost, durable, exclusive_owner, auto_delete, arguments, args, host,
                                queue_type=self)

    def ready_list(self, queue: ReadyOwner, expiring: dict[int, Entry]) -> ReadyList:
        """The store of a queue's ready entries (``expiring``: its expiry's map of those that may expire), as the
        type keeps them: one deque, whose tail pages out if the type pages (a priority queue's: one per level)."""
        return ReadyList(queue, expiring, PAGING in self.capabilities)

    def check_properties(self, queue: str, vhost: str, durable: bool, exclusive: bool, auto_delete: bool) -> None:
        """A type without TRANSIENT is durable, shared and kept: RabbitMQ refuses the other properties, in this
        order."""
        if TRANSIENT in self.capabilities:
            return
        for refused, name in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                              (not durable, "non-durable")):
            if refused:
                raise errors.QueuePropertyRefused(f"invalid property '{name}' {queue_args.where(queue, vhost)}")

    def check_consumer(self, queue: str, vhost: str, no_ack: bool, prefetch: int, global_prefetch: int,
                       arguments: dict[str, Any]) -> int:
        """basic.consume's arguments checked, and its priority (``x-priority``, any integer; 0 when absent).

        First what every queue checks (``x-priority`` an integer, ``x-cancel-on-ha-failover`` a bool), then what
        the type refuses (``refuse_consumer``), then a consumer argument it does not take, then the values of
        those it takes (``check_consumer_arguments``), as rabbit_quorum_queue and rabbit_stream_queue do."""
        at = queue_args.where(queue, vhost)
        priority = queue_args.checked_integer(arguments, "x-priority", at) or 0
        if "x-cancel-on-ha-failover" in arguments and not isinstance(arguments["x-cancel-on-ha-failover"], bool):
            kind = field_types.name(arguments["x-cancel-on-ha-failover"])
            raise errors.precondition_failed(
                f"invalid arg 'x-cancel-on-ha-failover' {at}: {{unacceptable_type,{kind}}}")
        what = errors.resource_name("queue", queue, vhost)
        self.refuse_consumer(what, no_ack, prefetch, global_prefetch)
        for name in CONSUMER_ARGUMENTS:
            if name in arguments and name not in self.consumer_arguments:
                raise errors.precondition_failed(
                    f"invalid arg '{name}' for {what} of queue type rabbit_{self.name}_queue")
        self.check_consumer_arguments(what, arguments)
        return priority

    def refuse_consumer(self, what: str, no_ack: bool, prefetch: int, global_prefetch: int) -> None:
        """What this type refuses of a consumer beyond its arguments (``what``: the queue, as texts name it): a
        channel-wide prefetch (basic.qos global) if the type takes none (rabbit_quorum_queue's first check)."""
        self.refuse_global_qos(what, global_prefetch)

    def refuse_global_qos(self, what: str, global_prefetch: int) -> None:
        if global_prefetch and GLOBAL_QOS not in self.capabilities:
            raise errors.ConnectionError(errors.NOT_IMPLEMENTED, f"{what} does not support global qos")

    def check_consumer_arguments(self, what: str, arguments: dict[str, Any]) -> None:
        """The values of the consumer arguments this type takes, beyond those every queue checks."""

    def check_nack(self, queue: str, vhost: str) -> None:
        """basic.nack and basic.reject: refused by a type without NACK."""
        if NACK not in self.capabilities:
            raise errors.ConnectionError(errors.NOT_IMPLEMENTED, f"basic.nack and basic.reject not supported by "
                                         f"{self.name} queues {errors.resource_name('queue', queue, vhost)}")

    def attached(self, queue: Any, storage: NodeStorage, durable: bool) -> None:
        """A queue of this type is given its storage on this node: the pager, and for a durable one the persistent
        store, its type's storage (``stored``) and, if the type pages, a bounded window in memory (a transient
        queue pages only when memory runs short)."""
        queue.pager = storage.pager
        if durable:
            queue.persistence = storage.persistence
            self.stored(queue, storage)
            if PAGING in self.capabilities:
                queue.window = storage.queue_window

    def stored(self, queue: Any, storage: NodeStorage) -> None:
        """A durable queue of this type is given its type's storage on this node: its entries indexed by seq in
        the shared persistence (a type that keys or keeps its messages otherwise hands it its own)."""
        queue.rows = storage.persistence

    def held_bytes(self, queue: Any) -> int:
        """Bytes of message bodies ``queue`` holds in this node's memory (a proxy of another node's holds none)."""
        return 0 if queue.remote else queue.held_bytes

    def describe(self, queue: Any, view: HttpView, info: dict[str, Any]) -> None:
        """The fields this type adds to the HTTP API's view of ``queue`` (of this node, or a proxy of another
        node's, which knows none of its owner's figures), written into ``info``."""


# The consumer arguments RabbitMQ checks: each type takes some (its consumer_arguments) and refuses the others.
CONSUMER_ARGUMENTS = ("x-priority", "x-cancel-on-ha-failover", "x-stream-offset")

