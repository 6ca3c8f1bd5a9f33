"""Queue arguments that change behaviour (TTL, expiry, limits, dead-lettering), validated as RabbitMQ does."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import errors

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")


@dataclass(frozen=True, slots=True)
class QueueArgs:
    message_ttl: int | None = None  # ms
    expires: int | None = None  # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    return type(value).__name__


def parse(arguments: dict[str, Any], queue: str, vhost: str) -> QueueArgs:
    where = f"for {errors.resource_name('queue', queue, vhost)}"

    def integer(name: str, minimum: int) -> int | None:
        value = arguments.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{unacceptable_type,{_type_name(value)}}}")
        if value < minimum:
            kind = "value_negative" if value < 0 else "value_zero"
            raise errors.precondition_failed(f"invalid arg '{name}' {where}: {{{kind},{value}}}")
        return value

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
    return QueueArgs(message_ttl=integer("x-message-ttl", 0), expires=integer("x-expires", 1),
                     max_length=integer("x-max-length", 0), max_length_bytes=integer("x-max-length-bytes", 0),
                     overflow=overflow, dead_letter_exchange=dlx, dead_letter_routing_key=dlrk)
