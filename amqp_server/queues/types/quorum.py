"""The quorum queue (RabbitMQ's rabbit_quorum_queue): replicated on a group of nodes in cluster mode
(``forwarder.quorum.groups``), its messages in ``quorum_queue.QuorumQueue`` on the node that leads it."""
from __future__ import annotations

from typing import Any, ClassVar

from ... import errors

from ..queue_type import (ARGUMENT_WINS, DELIVERY_HEADER, LOWER_WINS, NACK, PAGING, REPLICATED, STORES_ALL, HttpView,
                          NodeStorage, QueueType)
from ..queue import LocalQueue
from ..quorum_queue import QuorumQueue
from ..ready import Entry
from ..ready_list import ReadyList, ReadyOwner
from .classic import byte_fields, memory_fields


class Quorum(QueueType):
    name = "quorum"
    memory_category = "quorum_queue_procs"
    apply_to = "quorum_queues"
    # Arguments RabbitMQ 3.10 refuses on a quorum queue (rabbit_quorum_queue's capabilities lack them).
    refused_arguments = ("x-max-priority", "x-queue-mode", "x-queue-version", "x-max-age", "x-initial-cluster-size",
                         "x-stream-max-segment-size-bytes")
    consumer_arguments = ("x-priority",)
    equivalent_arguments = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
                            "x-expires", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
                            "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer", "x-queue-type",
                            "x-quorum-initial-group-size", "x-delivery-limit", "x-message-ttl",
                            "x-queue-leader-locator")  # rabbit_quorum_queue's queue_arguments
    policy_lower_wins = LOWER_WINS + ("delivery-limit",)
    policy_argument_wins = ARGUMENT_WINS + ("dead-letter-strategy",)
    unsupported_policies = frozenset({"max-priority", "queue-mode", "single-active-consumer", "ha-mode", "ha-params",
                                      "ha-sync-mode", "ha-promote-on-shutdown", "ha-promote-on-failure",
                                      "queue-master-locator", "max-age", "stream-max-segment-size-bytes",
                                      "initial-cluster-size"})
    # not GLOBAL_QOS, as RabbitMQ 3.10; as RabbitMQ's, every message on disk and a delivery count on deliveries
    capabilities = frozenset({NACK, PAGING, REPLICATED, STORES_ALL, DELIVERY_HEADER})
    queue_class: ClassVar[type[LocalQueue]] = QuorumQueue  # (mypy checks it provides the protocol)

    def delete_checks(self, name: str, vhost: str, if_unused: bool, if_empty: bool) -> bool:
        """rabbit_quorum_queue:delete refuses both conditions, if-unused first, with a protocol error: 540 closes
        the connection."""
        for flag, given in (("if-unused", if_unused), ("if-empty", if_empty)):
            if given:
                raise errors.ConnectionError(
                    errors.NOT_IMPLEMENTED, f"cannot delete {errors.resource_name('queue', name, vhost)}. queue.delete "
                    f"operations with {flag} flag set are not supported by quorum queues", 50, 40)
        return True

    def ready_list(self, queue: ReadyOwner, expiring: dict[int, Entry]) -> ReadyList:
        """The messages of the entries the state machine holds ready: which leaves, and when, is the machine's
        (no expiry map of its own); a commit's entries on disk leave at once, as the op that drops them is
        carried out."""
        return ReadyList(queue, None, drops_later=False)

    def attached(self, queue: Any, storage: NodeStorage, durable: bool) -> None:
        queue.members = [storage.node_name]  # a group of one until the cluster replicates it
        super().attached(queue, storage, durable)

    def stored(self, queue: Any, storage: NodeStorage) -> None:
        """Its entries written as a classic queue's; what its machine decides of its rows beyond that, and its
        state read back at a restart, by the quorum queues' copies (this node's leader is one)."""
        super().stored(queue, storage)
        queue.replicas = storage.replicas

    def describe(self, queue: Any, view: HttpView, info: dict[str, Any]) -> None:
        """Its group as RabbitMQ shows it: its leader (also ``node``), members and those running; an owner's
        figures too, its at-least-once dead letters waiting for a queue to take them among them."""
        owner = not queue.remote
        if owner:
            info.update(byte_fields(queue))
        leader = queue.node if not owner else view.node
        members = list(queue.members or [leader])
        info.update(leader=leader, node=leader, members=members,
                    online=[name for name in members if view.node_running(name)])
        info.update(single_active_consumer_ctag=info["single_active_consumer_tag"], open_files={info["node"]: 0})
        if owner:
            info.update(messages_dlx=queue.dlx_count, message_bytes_dlx=queue.dlx_bytes)
            info["messages"] += queue.dlx_count
            info.update(memory_fields(queue))


TYPE = Quorum()
