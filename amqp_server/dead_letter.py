"""Dead-lettering (RabbitMQ's rabbit_dead_letter): the message a DLX receives.

The copy keeps the original properties, loses ``expiration`` (kept as
``original-expiration`` in its x-death entry), and gains RabbitMQ's ``x-death`` history: one
table per (queue, reason) with a count, newest first, plus ``x-first-death-*``. Its routing keys
include the CC ones (sender_selected); without a dead-letter routing key it is routed by them and the
BCC ones again, as RabbitMQ does.
"""
from __future__ import annotations

import copy
import datetime
from typing import Any

from .message import Message, make_message
from .sender_selected import header_keys

CYCLE_SAFE_REASON = "rejected"


def dead_letter_message(message: Message, queue: str, reason: str, exchange: str, routing_key: str | None) -> Message:
    props = copy.copy(message.properties)
    headers: dict[str, Any] = dict(props.headers or {})
    deaths: list[dict[str, Any]] = list(headers.get("x-death") or [])
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    for i, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            death = dict(death, count=int(death.get("count", 1)) + 1)  # RabbitMQ keeps the first time
            del deaths[i]
            deaths.insert(0, death)
            break
    else:
        death = {"count": 1, "reason": reason, "queue": queue, "time": now, "exchange": message.exchange,
                 "routing-keys": [message.routing_key, *header_keys(headers, "CC")]}
        if props.expiration is not None:
            death["original-expiration"] = props.expiration
        deaths.insert(0, death)
    headers["x-death"] = deaths
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue)
    headers.setdefault("x-first-death-exchange", message.exchange)
    if routing_key is not None:
        headers.pop("CC", None)  # as RabbitMQ: the dead-letter routing key replaces the CC keys too
    props.headers = headers
    props.expiration = None
    dead = make_message(exchange, routing_key if routing_key is not None else message.routing_key, props,
                        message.body)
    if routing_key is None and hasattr(message, "bcc_keys"):
        dead.bcc_keys = message.bcc_keys
    return dead


def cycle_detected(message: Message, target_queue: str) -> bool:
    """RabbitMQ drops a dead letter that would return to a queue it already died in, unless a rejection
    is part of the cycle (then a client is making progress)."""
    deaths = (message.headers or {}).get("x-death") or []
    for i, death in enumerate(deaths):  # newest first: the cycle is everything up to the last death there
        if isinstance(death, dict) and death.get("queue") == target_queue:
            return all(isinstance(d, dict) and d.get("reason") != CYCLE_SAFE_REASON for d in deaths[:i + 1])
    return False
