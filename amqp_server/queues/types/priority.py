"""The priority queue: a classic queue declared with ``x-max-priority`` (RabbitMQ's too is a classic queue), whose
ready list keeps one deque per priority level (``priority_queue.PriorityReadyList``), and whose rows a durable one
keys by level (``priority_queue.RankedRows``).  To everything but the store of its ready entries it is a classic
queue: its class, name, arguments, policies and HTTP fields are those of :mod:`classic`."""
from __future__ import annotations

from typing import Any

from ..priority_queue import PriorityReadyList
from ..ready import Entry
from ..queue_type import NodeStorage
from ..ready_list import ReadyList, ReadyOwner
from .classic import Classic


class Priority(Classic):
    def chosen_by(self, arguments: dict[str, Any]) -> bool:
        return "x-max-priority" in arguments

    def ready_list(self, queue: ReadyOwner, expiring: dict[int, Entry]) -> ReadyList:
        return PriorityReadyList(queue, expiring, queue.args.max_priority or 0)

    def stored(self, queue: Any, storage: NodeStorage) -> None:
        queue.rows = storage.ranked_rows


TYPE = Priority()
