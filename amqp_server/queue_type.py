"""Which queue class a declaration makes (RabbitMQ's rabbit_queue_type): classic, priority, quorum or stream."""
from __future__ import annotations

from .priority_queue import PriorityQueue
from .queue import Queue
from .queue_args import QueueArgs
from .quorum_queue import QuorumQueue
from .stream_queue import StreamQueue


def queue_class(args: QueueArgs) -> type[Queue]:
    """The class for a queue declared with these arguments."""
    if args.queue_type == "quorum":
        return QuorumQueue
    if args.queue_type == "stream":
        return StreamQueue
    return Queue if args.max_priority is None else PriorityQueue
