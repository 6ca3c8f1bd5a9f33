"""The priority queue: a classic queue declared with ``x-max-priority`` (RabbitMQ's too is a classic queue), its
ready list one per priority level (``priority_queue.PriorityQueue``).  To everything but the class that holds its
messages it is a classic queue: its name, arguments, policies and HTTP fields are those of :mod:`classic`."""
from __future__ import annotations

from typing import Any

from ..priority_queue import PriorityQueue
from .classic import Classic


class Priority(Classic):
    queue_class = PriorityQueue

    def chosen_by(self, arguments: dict[str, Any]) -> bool:
        return "x-max-priority" in arguments


TYPE = Priority()
