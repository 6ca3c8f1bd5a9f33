"""Queue and consumer arguments that change behaviour, validated as RabbitMQ does.

Queue: TTL, expiry, limits, dead-lettering, priorities, single active consumer.
Consumer (basic.consume): ``x-priority``.
"""
from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass
from typing import Any

from . import errors

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
MAX_SUPPORTED_PRIORITY = 255


@dataclass(frozen=True, slots=True)
class QueueArgs:
    message_ttl: int | None = None  # ms
    expires: int | None = None  # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None  # x-max-priority: a priority queue with levels 0..max_priority
    single_active_consumer: bool = False

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


def _type_name(value: Any) -> str:
    """The AMQP field type RabbitMQ names in ``unacceptable_type`` errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    return _FIELD_TYPES.get(type(value), type(value).__name__)


_FIELD_TYPES = {decimal.Decimal: "decimal", dict: "table", list: "array", datetime.datetime: "timestamp"}


def _where(queue: str, vhost: str) -> str:
    return f"for {errors.resource_name('queue', queue, vhost)}"


def _integer(arguments: dict[str, Any], name: str, where: str, minimum: int | None = None) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{unacceptable_type,{_type_name(value)}}}")
    if minimum is not None and value < minimum:
        kind = "value_negative" if value < 0 else "value_zero"
        raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{{kind},{value}}}")
    return value


def parse(arguments: dict[str, Any], queue: str, vhost: str) -> QueueArgs:
    where = _where(queue, vhost)

    def integer(name: str, minimum: int) -> int | None:
        return _integer(arguments, name, where, minimum)

    def string(name: str) -> str | None:
        value = arguments.get(name)
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode()
        if not isinstance(value, str):
            raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{unacceptable_type,{_type_name(value)}}}")
        return value

    overflow = string("x-overflow") or "drop-head"
    if overflow not in OVERFLOW_MODES:
        raise errors.precondition_failed(f"invalid arg 'x-overflow' {where}: {{unknown_overflow_type,<<\"{overflow}\">>}}")
    dlx = string("x-dead-letter-exchange")
    dlrk = string("x-dead-letter-routing-key")
    if dlrk is not None and dlx is None:
        raise errors.precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key' {where}: Key x-dead-letter-exchange should be present")
    max_priority = integer("x-max-priority", 0)
    if max_priority is not None and max_priority > MAX_SUPPORTED_PRIORITY:
        raise errors.precondition_failed(f"invalid arg 'x-max-priority' {where}: {{max_value_exceeded,{max_priority}}}")
    sac = arguments.get("x-single-active-consumer")
    if sac is not None and not isinstance(sac, bool):
        raise errors.precondition_failed(
            f"invalid arg 'x-single-active-consumer' {where}: {{unacceptable_type,{_type_name(sac)}}}")
    return QueueArgs(message_ttl=integer("x-message-ttl", 0), expires=integer("x-expires", 1),
                     max_length=integer("x-max-length", 0), max_length_bytes=integer("x-max-length-bytes", 0),
                     overflow=overflow, dead_letter_exchange=dlx, dead_letter_routing_key=dlrk,
                     max_priority=max_priority, single_active_consumer=bool(sac))


def consumer_priority(arguments: dict[str, Any], queue: str, vhost: str) -> int:
    """basic.consume's ``x-priority`` (any integer; 0 when absent)."""
    return _integer(arguments, "x-priority", _where(queue, vhost)) or 0
