"""The classic queue (RabbitMQ's rabbit_classic_queue): a FIFO on this node (``queue.Queue``), durable or not."""
from __future__ import annotations

from typing import Any, ClassVar

from ...framing import properties
from ..queue import LocalQueue, Queue
from ..queue_type import EXCLUSIVE_CONSUME, GLOBAL_QOS, NACK, PAGING, TRANSIENT, UNREPLICATED, HttpView, QueueType


class Classic(QueueType):
    name = "classic"
    memory_category = "queue_procs"
    apply_to = "classic_queues"
    # Quorum and stream arguments RabbitMQ refuses on a classic queue (rabbit_classic_queue's capabilities lack
    # them).  x-queue-leader-locator is not among them: classic queues take it from RabbitMQ 3.12 on, and cluster
    # mode uses it.
    refused_arguments = ("x-delivery-limit", "x-dead-letter-strategy", "x-max-in-memory-length",
                         "x-max-in-memory-bytes", "x-quorum-initial-group-size", "x-max-age", "x-initial-cluster-size",
                         "x-stream-max-segment-size-bytes")
    consumer_arguments = ("x-priority", "x-cancel-on-ha-failover")
    unsupported_policies = frozenset({"max-age", "stream-max-segment-size-bytes", "queue-leader-locator",
                                      "initial-cluster-size", "delivery-limit", "dead-letter-strategy"})
    capabilities = frozenset({TRANSIENT, GLOBAL_QOS, NACK, PAGING, UNREPLICATED, EXCLUSIVE_CONSUME})
    queue_class: ClassVar[type[LocalQueue]] = Queue  # (mypy checks it provides the protocol)

    def chosen_by(self, arguments: dict[str, Any]) -> bool:
        return "x-max-priority" not in arguments

    def describe(self, queue: Any, view: HttpView, info: dict[str, Any]) -> None:
        """An owner's figures: bytes, the head message's timestamp, idle_since, where its messages are."""
        if queue.remote:
            return
        info.update(byte_fields(queue))
        info.update(head_message_timestamp=head_timestamp(queue))
        idle = view.idle_since(queue)
        if idle is not None:
            info["idle_since"] = idle
        info.update(memory_fields(queue))


TYPE = Classic()


def byte_fields(queue: Queue) -> dict[str, int]:
    """Bytes of message bodies ready and unacked, and the persistent messages: those of a durable queue's index,
    as its committed totals count them (a quorum queue keeps every message; a non-durable queue none).  A
    transient message a durable queue paged out is not counted, though its bytes are."""
    unacked = queue.unacked_bytes
    total = queue.ready_bytes + unacked
    if queue.persists_all:
        persistent, persistent_bytes = queue.message_count + queue.unacked, total
    elif queue.persistence is not None and queue.index_id:
        totals = queue.persistence.index.totals(queue.index_id)
        persistent, persistent_bytes = (totals.count - totals.transient, totals.bytes) if totals else (0, 0)
    else:
        persistent = persistent_bytes = 0
    return {"message_bytes": total, "message_bytes_unacknowledged": unacked, "messages_persistent": persistent,
            "message_bytes_persistent": persistent_bytes}


def head_timestamp(queue: Queue) -> int | None:
    """The timestamp property of the next message, if it has one and is in memory (as RabbitMQ's)."""
    head = next((entry for entry in queue.ready if not entry.gone), None)
    if head is None or not head.message.header:  # (a message paged in has its header once it is read)
        return None
    return properties.decode(head.message.header).timestamp


def memory_fields(queue: Queue) -> dict[str, int]:
    """Where a queue's ready messages are: in memory or paged out (an owner's figures); the bytes in memory are
    bodies memory holds, as RabbitMQ's ``message_bytes_ram`` (not those a durable queue left in its store)."""
    in_ram = queue.message_count - queue.paged
    return {"messages_ram": in_ram + queue.unacked, "messages_ready_ram": in_ram,
            "messages_unacknowledged_ram": queue.unacked, "messages_paged_out": queue.paged,
            "message_bytes_ram": queue.held_bytes, "message_bytes_paged_out": queue.paged_bytes}
