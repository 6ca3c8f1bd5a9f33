"""Dead-lettering (RabbitMQ's rabbit_dead_letter): the message a DLX receives.

The copy keeps the original properties byte for byte, loses ``expiration`` (kept as
``original-expiration`` in its x-death entry), and gains RabbitMQ's ``x-death`` history: one
table per (queue, reason) with a count, newest first, plus ``x-first-death-*``, typed as RabbitMQ
types them (count ``l``, time ``T``, strings ``S``); every other header keeps its wire type. Its routing keys
include the CC ones (sender_selected); without a dead-letter routing key it is routed by them and the
BCC ones again, as RabbitMQ does.
"""
from __future__ import annotations

import struct
import time

from stream_log import amqp10

from ..framing import codec, header_table, properties
from ..framing.header_table import Field
from ..message import Message, encode_route
from .sender_selected import header_keys

CYCLE_SAFE_REASON = "rejected"


def _death(message: Message, queue: str, reason: str, cc_keys: list[str]) -> Field:
    """A new x-death entry, typed as rabbit_dead_letter writes it."""
    entry = {"count": Field("l", 1), "reason": Field("S", reason), "queue": Field("S", queue),
             "time": Field("T", int(time.time())), "exchange": Field("S", message.exchange),
             "routing-keys": Field("A", [Field("S", key) for key in [message.routing_key, *cc_keys]])}
    expiration = message.property_str(codec.FLAG_EXPIRATION)
    if expiration is not None:
        entry["original-expiration"] = Field("S", expiration)
    return Field("F", entry)


def dead_letter_message(message: Message, queue: str, reason: str, exchange: str, routing_key: str | None) -> Message:
    fields = message.typed_headers()
    old = fields.get("x-death")
    deaths = list(old.value) if old is not None and old.kind == "A" else []
    for i, death in enumerate(deaths):
        info = death.value if death.kind == "F" else {}
        if _text(info.get("queue")) == queue and _text(info.get("reason")) == reason:
            count = info.get("count")
            number = count.value if count is not None and isinstance(count.value, int) else 1
            deaths.insert(0, Field("F", header_table.sort_table({**info, "count": Field("l", number + 1)})))  # (its
            # first time kept)
            del deaths[i + 1]
            break
    else:
        deaths.insert(0, _death(message, queue, reason, header_keys(message.headers or {}, "CC")))
    if old is None:  # the first death (by the header's say): rabbit_dead_letter sets these then, and only then
        for name, value in (("reason", reason), ("queue", queue), ("exchange", message.exchange)):
            fields[f"x-first-death-{name}"] = Field("S", value)
    if routing_key is not None:
        fields.pop("CC", None)  # as RabbitMQ: the dead-letter routing key replaces the CC keys too
    fields = header_table.set_value(fields, "x-death", Field("A", deaths))  # (the table sorted, as RabbitMQ's)
    header = properties.replace(message.header, codec.FLAG_EXPIRATION, None)
    header = header_table.with_headers(header, struct.unpack_from(">H", header, 12)[0], fields)
    key = routing_key if routing_key is not None else message.routing_key
    dead = Message(exchange, key, encode_route(exchange, key), header, message.body)
    if message.amqp10 is not None:  # (published over AMQP 1.0: an AMQP 1.0 reader gets x-opt-deaths)
        try:
            dead.amqp10 = amqp10.dead_lettered(
                message.amqp10, queue, reason, message.exchange, [message.routing_key, *header_keys(
                    message.headers or {}, "CC")], message.property_str(codec.FLAG_EXPIRATION),
                int(time.time() * 1000))
        except amqp10.TooLarge:  # (its history past the values one record may hold: its sections kept as they were)
            dead.amqp10 = message.amqp10
    if routing_key is None:
        dead.bcc_keys = message.bcc_keys
    return dead


def _text(field: Field | None) -> str | None:
    return field.value if field is not None and field.kind == "S" else None


def cycle_detected(message: Message, target_queue: str) -> bool:
    """RabbitMQ drops a dead letter that would return to a queue it already died in, unless a rejection
    is part of the cycle (then a client is making progress)."""
    deaths = (message.headers or {}).get("x-death") or []
    for i, death in enumerate(deaths):  # newest first: the cycle is everything up to the last death there
        if isinstance(death, dict) and death.get("queue") == target_queue:
            return all(isinstance(d, dict) and d.get("reason") != CYCLE_SAFE_REASON for d in deaths[:i + 1])
    return False
