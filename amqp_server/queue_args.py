"""Queue and consumer arguments that change behaviour, validated as RabbitMQ does.

Queue: type, TTL, expiry, limits, dead-lettering, priorities, single active consumer, consumer timeout, a
quorum queue's delivery limit, dead-letter strategy and group size, and a stream's retention.
Consumer (basic.consume): ``x-priority``.
"""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from . import errors
from .message import MAX_EXPIRY

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")  # accepted; Warren pages to disk by memory pressure either way
QUEUE_TYPES = ("classic", "quorum", "stream")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
# Quorum/stream arguments RabbitMQ refuses on a classic queue (rabbit_classic_queue's capabilities lack them).
# x-queue-leader-locator is not among them: classic queues take it from RabbitMQ 3.12 on, and cluster mode uses it.
NOT_CLASSIC = ("x-delivery-limit", "x-dead-letter-strategy", "x-max-in-memory-length", "x-max-in-memory-bytes",
               "x-quorum-initial-group-size", "x-max-age", "x-initial-cluster-size",
               "x-stream-max-segment-size-bytes")
# Arguments RabbitMQ 3.10 refuses on a quorum queue (rabbit_quorum_queue's capabilities lack them).
NOT_QUORUM = ("x-max-priority", "x-queue-mode", "x-queue-version", "x-max-age", "x-initial-cluster-size",
              "x-stream-max-segment-size-bytes")
# Arguments RabbitMQ 3.10 refuses on a stream (rabbit_stream_queue's capabilities lack them).
NOT_STREAM = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
              "x-dead-letter-strategy", "x-max-length", "x-max-in-memory-length", "x-max-in-memory-bytes",
              "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
              "x-quorum-initial-group-size", "x-delivery-limit")
MAX_SUPPORTED_PRIORITY = 255
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
    queue_type: str = "classic"  # x-queue-type: "classic", "quorum" or "stream"
    delivery_limit: int | None = None  # x-delivery-limit (quorum): returns allowed before a message is dropped
    dead_letter_strategy: str = "at-most-once"  # x-dead-letter-strategy (quorum)
    group_size: int | None = None  # x-quorum-initial-group-size
    max_age: int | None = None  # ms, x-max-age (stream): segments older go
    segment_bytes: int | None = None  # x-stream-max-segment-size-bytes (stream)

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


def _where(queue: str, vhost: str) -> str:
    return f"for {errors.resource_name('queue', queue, vhost)}"


def _integer(arguments: dict[str, Any], name: str, where: str, minimum: int | None = None) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.precondition_failed(f"invalid arg '{name}' {where}: \"expected integer, got {errors.field_type(value)}\"")
    if minimum is not None and value < minimum:
        kind = "value_negative" if value < 0 else "value_zero"
        raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{{kind},{value}}}")
    if name in ("x-message-ttl", "x-expires") and value > MAX_EXPIRY:
        raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{value_too_large,{value}}}")
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
            raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{unacceptable_type,{errors.field_type(value)}}}")
        return value

    dlx = arguments.get("x-dead-letter-exchange")
    if dlx is not None and not isinstance(dlx, (str, bytes)):  # rabbit_channel checks it before the rest
        raise errors.precondition_failed(f"invalid type '{errors.field_type(dlx)}' for arg 'x-dead-letter-exchange' in "
                                         f"{errors.resource_name('queue', queue, vhost)}")
    overflow = string("x-overflow") or "drop-head"
    if overflow not in OVERFLOW_MODES:
        raise errors.precondition_failed(f"invalid arg 'x-overflow' {where}: invalid_overflow")
    for name, what, allowed in (("x-queue-mode", "mode", QUEUE_MODES), ("x-queue-type", "type", QUEUE_TYPES)):
        value = string(name)
        if value is not None and value not in allowed:
            raise errors.precondition_failed(f"invalid arg '{name}' {where}: \"unsupported queue {what} '{value}'\"")
    queue_type = string("x-queue-type") or "classic"
    strategy = string("x-dead-letter-strategy")
    if strategy is not None and strategy not in DEAD_LETTER_STRATEGIES:
        raise errors.precondition_failed(f"invalid arg 'x-dead-letter-strategy' {where}: invalid_dlx_strategy")
    group_size = integer("x-quorum-initial-group-size", 1)
    refused = {"classic": NOT_CLASSIC, "quorum": NOT_QUORUM, "stream": NOT_STREAM}[queue_type]
    for name in refused:
        if name in arguments:
            raise errors.precondition_failed(f"invalid arg '{name}' {where} of queue type rabbit_{queue_type}_queue")
    dlx = string("x-dead-letter-exchange")
    dlrk = string("x-dead-letter-routing-key")
    if dlrk is not None and len(dlrk.encode()) > 255:  # RabbitMQ stores it, then fails every dead letter (541)
        raise errors.precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key' {where}: {{value_too_long,{len(dlrk.encode())}}}")
    if dlrk is not None and dlx is None:
        raise errors.precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key' {where}: routing_key_but_no_dlx_defined")
    max_priority = integer("x-max-priority", 0)
    if max_priority is not None and max_priority > MAX_SUPPORTED_PRIORITY:
        raise errors.precondition_failed(f"invalid arg 'x-max-priority' {where}: {{max_value_exceeded,{max_priority}}}")
    sac = arguments.get("x-single-active-consumer")
    if sac is not None and not isinstance(sac, bool):
        raise errors.precondition_failed(
            f"invalid arg 'x-single-active-consumer' {where}: {{unacceptable_type,{errors.field_type(sac)}}}")
    return QueueArgs(message_ttl=integer("x-message-ttl", 0), expires=integer("x-expires", 1),
                     max_length=integer("x-max-length", 0), max_length_bytes=integer("x-max-length-bytes", 0),
                     overflow=overflow, dead_letter_exchange=dlx, dead_letter_routing_key=dlrk,
                     max_priority=max_priority, single_active_consumer=bool(sac),
                     consumer_timeout=integer("x-consumer-timeout", 0), queue_type=queue_type,
                     delivery_limit=_delivery_limit(arguments.get("x-delivery-limit")),
                     dead_letter_strategy=strategy or "at-most-once", group_size=group_size,
                     max_age=_max_age(arguments.get("x-max-age"), where),
                     segment_bytes=integer("x-stream-max-segment-size-bytes", 0))


def _max_age(value: Any, where: str) -> int | None:
    """A stream's x-max-age: a positive whole number and a unit (Y, M, D, h, m, s).  (RabbitMQ fails a string
    it cannot read with 541 INTERNAL_ERROR; it is refused here as a zero is.)"""
    if value is None:
        return None
    if not isinstance(value, (str, bytes)):
        raise errors.precondition_failed(
            f"invalid arg 'x-max-age' {where}: {{unacceptable_type,{errors.field_type(value)}}}")
    ms = interval_ms(value.decode(errors="replace") if isinstance(value, bytes) else value)
    if not ms:
        raise errors.precondition_failed(f"invalid arg 'x-max-age' {where}: invalid_max_age")
    return ms


def _delivery_limit(value: Any) -> int | None:
    """RabbitMQ 3.10 takes any x-delivery-limit: an integer limits (0 or less drops at the first return),
    anything else does not."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_properties(args: QueueArgs, queue: str, vhost: str, durable: bool, exclusive: bool,
                     auto_delete: bool) -> None:
    """A quorum queue or a stream is durable, shared and kept: RabbitMQ refuses the other properties, in this
    order."""
    if args.queue_type == "classic":
        return
    for refused, name in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
        if refused:
            raise errors.precondition_failed(f"invalid property '{name}' {_where(queue, vhost)}")


def check_consumer(args: QueueArgs, queue: str, vhost: str, no_ack: bool, prefetch: int, global_prefetch: int,
                   arguments: dict[str, Any]) -> None:
    """What a queue's type refuses of a consumer, as rabbit_quorum_queue and rabbit_stream_queue do (checked by
    type, so that a proxy of another node's queue refuses the same): a quorum queue, a global prefetch; a
    stream, no per-consumer prefetch, automatic acks, x-priority, or an x-stream-offset that is none (RabbitMQ
    fails on that with 541)."""
    what = errors.resource_name("queue", queue, vhost)
    if args.queue_type == "quorum" and global_prefetch:
        raise errors.ConnectionError(errors.NOT_IMPLEMENTED, f"{what} does not support global qos")
    if args.queue_type != "stream":
        return
    if not prefetch:
        raise errors.precondition_failed(f"consumer prefetch count is not set for '{what}'")
    if no_ack:
        raise errors.ConnectionError(errors.NOT_IMPLEMENTED,
                                     f"automatic acknowledgement not supported by stream queues {what}")
    if "x-priority" in arguments:
        raise errors.precondition_failed(f"invalid arg 'x-priority' for {what} of queue type rabbit_stream_queue")
    offset = arguments.get("x-stream-offset")
    if offset is not None and not _stream_offset(offset):
        raise errors.precondition_failed(f"invalid arg 'x-stream-offset' for {what}: {offset!r}")


def _stream_offset(value: Any) -> bool:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        return value in ("first", "last", "next") or interval_ms(value) is not None
    return isinstance(value, (int, datetime.datetime)) and not isinstance(value, bool)


def check_nack(args: QueueArgs, queue: str, vhost: str) -> None:
    """basic.nack and basic.reject: a stream refuses them."""
    if args.queue_type == "stream":
        raise errors.ConnectionError(errors.NOT_IMPLEMENTED, "basic.nack and basic.reject not supported by stream "
                                     f"queues {errors.resource_name('queue', queue, vhost)}")


def consumer_priority(arguments: dict[str, Any], queue: str, vhost: str) -> int:
    """basic.consume's ``x-priority`` (any integer; 0 when absent)."""
    return _integer(arguments, "x-priority", _where(queue, vhost)) or 0
