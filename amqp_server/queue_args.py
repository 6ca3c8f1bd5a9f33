"""Queue and consumer arguments that change behaviour, validated as RabbitMQ does.

Queue: type, TTL, expiry, limits, dead-lettering, priorities, single active consumer, consumer timeout, a
quorum queue's delivery limit, dead-letter strategy and group size, and a stream's retention.
Consumer (basic.consume): ``x-priority``, ``x-cancel-on-ha-failover``, a stream's ``x-stream-offset``.
"""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from . import errors, field_types
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
# Consumer arguments RabbitMQ checks, and the queue types that take each (its types' consumer_arguments)
CONSUMER_ARGS = {"x-priority": ("classic", "quorum"), "x-cancel-on-ha-failover": ("classic",),
                 "x-stream-offset": ("stream",)}
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


def parse(arguments: dict[str, Any], queue: str, vhost: str) -> QueueArgs:
    where = _where(queue, vhost)

    def integer(name: str, minimum: int) -> int | None:
        return _integer(arguments, name, where, minimum)

    def string(name: str) -> str | None:
        if name not in arguments:
            return None
        value = arguments[name]
        if isinstance(value, bytes):
            value = value.decode()
        if not isinstance(value, str):
            raise errors.precondition_failed(
                f"invalid arg '{name}' {where}: {{unacceptable_type,{field_types.name(value)}}}")
        return value

    dlx = arguments.get("x-dead-letter-exchange")
    if "x-dead-letter-exchange" in arguments and not isinstance(dlx, (str, bytes)):  # rabbit_channel: before the rest
        raise errors.precondition_failed(f"invalid type '{field_types.name(dlx)}' for arg 'x-dead-letter-exchange' in "
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
    if "x-single-active-consumer" in arguments and not isinstance(sac, bool):
        raise errors.precondition_failed(
            f"invalid arg 'x-single-active-consumer' {where}: {{unacceptable_type,{field_types.name(sac)}}}")
    return QueueArgs(message_ttl=integer("x-message-ttl", 0), expires=integer("x-expires", 1),
                     max_length=integer("x-max-length", 0), max_length_bytes=integer("x-max-length-bytes", 0),
                     overflow=overflow, dead_letter_exchange=dlx, dead_letter_routing_key=dlrk,
                     max_priority=max_priority, single_active_consumer=bool(sac),
                     consumer_timeout=_consumer_timeout(arguments.get("x-consumer-timeout")), queue_type=queue_type,
                     delivery_limit=_whole(arguments.get("x-delivery-limit")),
                     dead_letter_strategy=strategy or "at-most-once", group_size=group_size,
                     max_age=_max_age(arguments, where),
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
                   arguments: dict[str, Any]) -> int:
    """basic.consume's arguments checked, and its priority (``x-priority``, any integer; 0 when absent).

    First what every queue checks (``x-priority`` an integer, ``x-cancel-on-ha-failover`` a bool), then what
    the queue's type refuses, as rabbit_quorum_queue and rabbit_stream_queue do (by type, so that a proxy of
    another node's queue refuses the same): a quorum queue, a global prefetch; a stream, no per-consumer
    prefetch, automatic acks, or an x-stream-offset that is none (RabbitMQ fails on that with 541); any type,
    a consumer argument it does not take."""
    where = _where(queue, vhost)
    priority = _integer(arguments, "x-priority", where) or 0
    if "x-cancel-on-ha-failover" in arguments and not isinstance(arguments["x-cancel-on-ha-failover"], bool):
        kind = field_types.name(arguments["x-cancel-on-ha-failover"])
        raise errors.precondition_failed(f"invalid arg 'x-cancel-on-ha-failover' {where}: {{unacceptable_type,{kind}}}")
    what = errors.resource_name("queue", queue, vhost)
    if args.queue_type == "quorum" and global_prefetch:
        raise errors.ConnectionError(errors.NOT_IMPLEMENTED, f"{what} does not support global qos")
    if args.queue_type == "stream":
        if not prefetch:
            raise errors.precondition_failed(f"consumer prefetch count is not set for '{what}'")
        if no_ack:
            raise errors.ConnectionError(errors.NOT_IMPLEMENTED,
                                         f"automatic acknowledgement not supported by stream queues {what}")
    for name, types in CONSUMER_ARGS.items():
        if name in arguments and args.queue_type not in types:
            raise errors.precondition_failed(
                f"invalid arg '{name}' for {what} of queue type rabbit_{args.queue_type}_queue")
    offset = arguments.get("x-stream-offset")
    if args.queue_type == "stream" and "x-stream-offset" in arguments and not _stream_offset(offset):
        raise errors.precondition_failed(f"invalid arg 'x-stream-offset' for {what}: {offset!r}")
    return priority


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
