"""Queue arguments that change behaviour, their values validated as RabbitMQ does: type, TTL, expiry, limits,
dead-lettering, priorities, single active consumer, consumer timeout, a quorum queue's delivery limit, dead-letter
strategy and group size, and a stream's retention.

Which of them a queue's type refuses, and what it asks of consumers, each type declares (:mod:`queue_type`,
:mod:`types`); ``parse`` checks the values in RabbitMQ's order, the type's refusals among them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Collection, Protocol

from .. import errors
from ..framing import field_types
from ..message import MAX_EXPIRY

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")  # accepted; Warren pages to disk by memory pressure either way
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
MAX_SUPPORTED_PRIORITY = 255
# RabbitMQ's cap on a stream's segments (rabbit_stream_queue's ?MAX_STREAM_MAX_SEGMENT_SIZE, refused as
# "Exceeded max value for ..."), and the floor its log segments at: a stream keeps at most one segment file per MB
# of its data however it is published (RabbitMQ takes any size, as Warren does, but a size of 1 opens a file per
# chunk there)
MIN_SEGMENT_BYTES = 1_000_000
MAX_SEGMENT_BYTES = 3_000_000_000
INTERVAL = re.compile(r"^(\d+)([YMDhms])$")
UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}


def interval_ms(value: str) -> int | None:
    """``7D``, ``12h``, ``30m``… (a stream's x-max-age, an x-stream-offset interval) in ms; None if not one."""
    found = INTERVAL.match(value)
    return int(found.group(1)) * UNIT_MS[found.group(2)] if found else None


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
    consumer_timeout: int | None = None  # ms, x-consumer-timeout: overrides the node's consumer_timeout
    delivery_limit: int | None = None  # x-delivery-limit (quorum): returns allowed before a message is dropped
    dead_letter_strategy: str = "at-most-once"  # x-dead-letter-strategy (quorum)
    group_size: int | None = None  # x-quorum-initial-group-size
    max_age: int | None = None  # ms, x-max-age (stream): segments older go
    segment_bytes: int | None = None  # x-stream-max-segment-size-bytes (stream)

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


class Refusals(Protocol):
    """A queue type as ``parse`` sees it: its name (rabbit_NAME_queue in RabbitMQ's texts) and the arguments it
    refuses."""

    @property
    def name(self) -> str: ...

    @property
    def refused_arguments(self) -> Collection[str]: ...


def check_caps(arguments: dict[str, Any]) -> None:
    """406 for a stream's segment size beyond RabbitMQ's cap (a negative or non-integer one is :func:`parse`'s to
    refuse, in RabbitMQ's words).  One below ``MIN_SEGMENT_BYTES`` is taken, as RabbitMQ takes it, and the log
    segments at that floor (``StreamQueue``): a segment file per chunk would be a client's way to fill the disk
    with files."""
    value = arguments.get("x-stream-max-segment-size-bytes")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return
    if value > MAX_SEGMENT_BYTES:
        raise errors.precondition_failed("Exceeded max value for x-stream-max-segment-size-bytes")


def where(queue: str, vhost: str) -> str:
    return f"for {errors.resource_name('queue', queue, vhost)}"


def checked_integer(arguments: dict[str, Any], name: str, where: str, minimum: int | None = None) -> int | None:
    """An integer argument; a void (None) one is there, and refused, as in RabbitMQ."""
    if name not in arguments:
        return None
    value = arguments[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.precondition_failed(
            f"invalid arg '{name}' {where}: \"expected integer, got {field_types.name(value)}\"")
    if minimum is not None and value < minimum:
        kind = "value_negative" if value < 0 else "value_zero"
        raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{{kind},{value}}}")
    if name in ("x-message-ttl", "x-expires") and value > MAX_EXPIRY:
        raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{value_too_large,{value}}}")
    return value


def parse(arguments: dict[str, Any], queue: str, vhost: str, kind: Refusals | None = None,
          types: Collection[str] | None = None) -> QueueArgs:
    """The arguments' values checked in RabbitMQ's order: ``x-queue-type`` among ``types`` (a declaration's; a
    queue's own arguments again need no such check), and none that ``kind`` refuses."""
    at = where(queue, vhost)

    def integer(name: str, minimum: int) -> int | None:
        return checked_integer(arguments, name, at, minimum)

    def string(name: str) -> str | None:
        if name not in arguments:
            return None
        value = arguments[name]
        if isinstance(value, bytes):
            value = value.decode()
        if not isinstance(value, str):
            raise errors.precondition_failed(
                f"invalid arg '{name}' {at}: {{unacceptable_type,{field_types.name(value)}}}")
        return value

    dlx = arguments.get("x-dead-letter-exchange")
    if "x-dead-letter-exchange" in arguments and not isinstance(dlx, (str, bytes)):  # rabbit_channel: before the rest
        raise errors.precondition_failed(f"invalid type '{field_types.name(dlx)}' for arg 'x-dead-letter-exchange' in "
                                         f"{errors.resource_name('queue', queue, vhost)}")
    overflow = string("x-overflow") or "drop-head"
    if overflow not in OVERFLOW_MODES:
        raise errors.precondition_failed(f"invalid arg 'x-overflow' {at}: invalid_overflow")
    for name, what, allowed in (("x-queue-mode", "mode", QUEUE_MODES), ("x-queue-type", "type", types)):
        value = string(name)
        if value is not None and allowed is not None and value not in allowed:
            raise errors.precondition_failed(f"invalid arg '{name}' {at}: \"unsupported queue {what} '{value}'\"")
    strategy = string("x-dead-letter-strategy")
    if strategy is not None and strategy not in DEAD_LETTER_STRATEGIES:
        raise errors.precondition_failed(f"invalid arg 'x-dead-letter-strategy' {at}: invalid_dlx_strategy")
    group_size = integer("x-quorum-initial-group-size", 1)
    refused = next((name for name in kind.refused_arguments if name in arguments), None) if kind is not None else None
    if kind is not None and refused is not None:
        raise errors.precondition_failed(f"invalid arg '{refused}' {at} of queue type rabbit_{kind.name}_queue")
    dlx = string("x-dead-letter-exchange")
    dlrk = string("x-dead-letter-routing-key")
    if dlrk is not None and len(dlrk.encode()) > 255:  # RabbitMQ stores it, then fails every dead letter (541)
        raise errors.precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key' {at}: {{value_too_long,{len(dlrk.encode())}}}")
    if dlrk is not None and dlx is None:
        raise errors.precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key' {at}: routing_key_but_no_dlx_defined")
    max_priority = integer("x-max-priority", 0)
    if max_priority is not None and max_priority > MAX_SUPPORTED_PRIORITY:
        raise errors.precondition_failed(f"invalid arg 'x-max-priority' {at}: {{max_value_exceeded,{max_priority}}}")
    sac = arguments.get("x-single-active-consumer")
    if "x-single-active-consumer" in arguments and not isinstance(sac, bool):
        raise errors.precondition_failed(
            f"invalid arg 'x-single-active-consumer' {at}: {{unacceptable_type,{field_types.name(sac)}}}")
    return QueueArgs(message_ttl=integer("x-message-ttl", 0), expires=integer("x-expires", 1),
                     max_length=integer("x-max-length", 0), max_length_bytes=integer("x-max-length-bytes", 0),
                     overflow=overflow, dead_letter_exchange=dlx, dead_letter_routing_key=dlrk,
                     max_priority=max_priority, single_active_consumer=bool(sac),
                     consumer_timeout=_consumer_timeout(arguments.get("x-consumer-timeout")),
                     delivery_limit=_whole(arguments.get("x-delivery-limit")),
                     dead_letter_strategy=strategy or "at-most-once", group_size=group_size,
                     max_age=_max_age(arguments, at),
                     segment_bytes=integer("x-stream-max-segment-size-bytes", 0))


def _max_age(arguments: dict[str, Any], where: str) -> int | None:
    """A stream's x-max-age: a positive whole number and a unit (Y, M, D, h, m, s).  (RabbitMQ fails a string
    it cannot read with 541 INTERNAL_ERROR; it is refused here as a zero is.)"""
    if "x-max-age" not in arguments:
        return None
    value = arguments["x-max-age"]
    if not isinstance(value, (str, bytes)):
        raise errors.precondition_failed(
            f"invalid arg 'x-max-age' {where}: {{unacceptable_type,{field_types.name(value)}}}")
    ms = interval_ms(value.decode(errors="replace") if isinstance(value, bytes) else value)
    if not ms:
        raise errors.precondition_failed(f"invalid arg 'x-max-age' {where}: invalid_max_age")
    return ms


def _whole(value: Any) -> int | None:
    """An argument RabbitMQ 3.10 takes whatever its type (x-delivery-limit): an integer counts (a delivery
    limit of 0 or less drops at the first return), anything else is as if absent."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _consumer_timeout(value: Any) -> int | None:
    """x-consumer-timeout (RabbitMQ 3.12's; 3.10 takes any value and ignores it): ms, if a whole number >= 0."""
    timeout = _whole(value)
    return timeout if timeout is not None and timeout >= 0 else None
