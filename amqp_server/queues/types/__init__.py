"""The queue types, one module each (RabbitMQ's rabbit_classic_queue, rabbit_quorum_queue, rabbit_stream_queue):
each declares a :class:`queue_type.QueueType` as ``TYPE``.  Adding a type is a module here, listed in ``TYPES``.

This module picks a declaration's type: by ``x-queue-type`` (classic when it names none), then among the types of
that name the first its arguments choose (a classic queue with ``x-max-priority`` is a priority queue).
"""
from __future__ import annotations

from typing import Any

from ..queue_args import QueueArgs
from ..queue_type import QueueType
from . import classic, priority, quorum, stream

TYPES: tuple[QueueType, ...] = (classic.TYPE, priority.TYPE, quorum.TYPE, stream.TYPE)
NAMES = tuple(dict.fromkeys(kind.name for kind in TYPES))  # what x-queue-type and default_queue_type may name
DEFAULT = classic.TYPE


def of(arguments: dict[str, Any]) -> QueueType:
    """The type of a queue declared with these arguments (the default for a name that is none: ``declared``
    refuses it)."""
    name = arguments.get("x-queue-type", DEFAULT.name)
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return next((kind for kind in TYPES if kind.name == name and kind.chosen_by(arguments)), DEFAULT)


def declared(arguments: dict[str, Any], queue: str, vhost: str) -> tuple[QueueType, QueueArgs]:
    """A declaration's type and its arguments, checked as RabbitMQ checks them (``x-queue-type`` naming a type)."""
    kind = of(arguments)
    return kind, kind.parse(arguments, queue, vhost, NAMES)


def with_default(arguments: dict[str, Any], default: str | None) -> None:
    """A vhost's ``default_queue_type`` written into a declaration's arguments that name no type (RabbitMQ 3.10:
    for a durable, shared, kept queue, which the caller knows)."""
    if "x-queue-type" not in arguments and default not in (None, DEFAULT.name):
        arguments["x-queue-type"] = default
