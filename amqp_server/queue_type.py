"""Which queue class a declaration makes (RabbitMQ's rabbit_queue_type): classic, priority or quorum."""
from __future__ import annotations

from .priority_queue import PriorityQueue
from .queue import Queue
from .queue_args import QueueArgs
from .quorum_queue import QuorumQueue


def queue_class(args: QueueArgs) -> type[Queue]:
    """The class for a queue declared with these arguments."""
    if args.queue_type == "quorum":
        return QuorumQueue
    return Queue if args.max_priority is None else PriorityQueue
