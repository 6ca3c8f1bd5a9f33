"""Sender-selected distribution (RabbitMQ's CC and BCC headers): a publisher names extra routing keys.

A message is routed with its routing key plus every string in its ``CC`` and ``BCC`` header arrays (other
element types are ignored, as RabbitMQ does); ``BCC`` is removed from the message before it is stored,
delivered or returned, so consumers do not see it (its keys stay on the message in memory, for
dead-lettering). Only messages whose raw header mentions ``CC`` pay for decoding their properties;
the publish path asks only when the headers flag is set.
"""
from __future__ import annotations

from . import errors, field_types
from .message import Message

ROUTING_HEADERS = ("CC", "BCC")


def _headers(message: Message) -> dict | None:
    """The headers table if it may hold CC or BCC (a substring test on the raw header avoids decoding)."""
    if b"CC" not in message.header:
        return None
    return message.headers


def check(message: Message) -> None:
    """CC and BCC must be arrays: RabbitMQ refuses the publish (406) otherwise."""
    headers = _headers(message)
    if not headers:
        return
    for name in ROUTING_HEADERS:
        if name in headers and not isinstance(headers[name], list):
            kind = field_types.name(headers[name])
            raise errors.precondition_failed(f'invalid message: {{unacceptable_type_in_header,"{name}",{kind}}}')


def header_keys(headers: dict, name: str) -> list[str]:
    """The string elements of the ``name`` (CC or BCC) array."""
    value = headers.get(name)
    return [key for key in value if isinstance(key, str)] if isinstance(value, list) else []


def routing_keys(message: Message) -> list[str]:
    """The extra routing keys from CC and BCC; strips BCC from the message (the other headers
    keep their wire types) and keeps its keys in ``bcc_keys``, which a dead letter is routed by again."""
    kept = list(getattr(message, "bcc_keys", ()))
    headers = _headers(message)
    if not headers:
        return kept
    keys = header_keys(headers, "CC") + kept
    if "BCC" in headers:
        message.bcc_keys = tuple(header_keys(headers, "BCC"))
        keys += message.bcc_keys
        fields = message.typed_headers()
        del fields["BCC"]
        message.replace_headers(fields)
    return keys
