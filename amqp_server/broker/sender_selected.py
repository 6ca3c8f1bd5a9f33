"""Sender-selected distribution (RabbitMQ's CC and BCC headers): a publisher names extra routing keys.

A message is routed with its routing key plus every string in its ``CC`` and ``BCC`` header arrays (other
element types are ignored, as RabbitMQ does); ``BCC`` is removed from the message before it is stored,
delivered or returned, so consumers do not see it (its keys stay on the message in memory, for
dead-lettering). Each key is checked as the routing key is: at most 255 bytes, and against the publisher's topic
permission on a topic exchange (``Broker.check_message``). Only messages whose raw header mentions ``CC`` pay for
decoding their properties; the publish path asks only when the headers flag is set.
"""
from __future__ import annotations

from .. import errors
from ..framing import field_types
from ..message import Message

ROUTING_HEADERS = ("CC", "BCC")
MAX_KEY_BYTES = 255  # a routing key is a short string
# Distinct keys one message may name in CC and BCC together.  Each costs a route (about 9 us of CPU through a
# topic exchange of 1,000 bindings, and a place in its route cache); a 128 KiB header frame holds some 21,000
# one-byte keys, about 0.2 s of routing for one message.  RabbitMQ caps none (rabbit_basic:header_routes).
MAX_KEYS = 1024


def _headers(message: Message) -> dict | None:
    """The headers table if it may hold CC or BCC (a substring test on the raw header avoids decoding)."""
    if b"CC" not in message.header:
        return None
    return message.headers


def check(message: Message) -> list[str]:
    """The CC and BCC keys, checked: each header must be an array (RabbitMQ refuses the publish, 406, otherwise),
    and each key at most 255 bytes, as the routing key is (a short string): a key's cost to route grows with its
    words, so a longer one is refused (406 ``{value_too_long,"CC",N}``) where RabbitMQ would route it; and at most
    ``MAX_KEYS`` distinct keys (406), where RabbitMQ routes every one."""
    headers = _headers(message)
    if not headers:
        return []
    keys: dict[str, None] = {}
    for name in ROUTING_HEADERS:
        if name not in headers:
            continue
        if not isinstance(headers[name], list):
            kind = field_types.name(headers[name])
            raise errors.precondition_failed(f'invalid message: {{unacceptable_type_in_header,"{name}",{kind}}}')
        for key in header_keys(headers, name):
            size = len(key.encode())
            if size > MAX_KEY_BYTES:
                raise errors.precondition_failed(f'invalid message: {{value_too_long,"{name}",{size}}}')
            keys[key] = None
        if len(keys) > MAX_KEYS:
            raise errors.precondition_failed(
                f"invalid message: more than {MAX_KEYS} distinct routing keys in its CC and BCC headers")
    return list(keys)


def header_keys(headers: dict, name: str) -> list[str]:
    """The string elements of the ``name`` (CC or BCC) array."""
    value = headers.get(name)
    return [key for key in value if isinstance(key, str)] if isinstance(value, list) else []


def routing_keys(message: Message) -> list[str]:
    """The extra routing keys from CC and BCC; strips BCC from the message (the other headers
    keep their wire types) and keeps its keys in ``bcc_keys``, which a dead letter is routed by again."""
    kept = list(message.bcc_keys)
    headers = _headers(message)
    if not headers:
        return kept
    keys = header_keys(headers, "CC") + kept
    if "BCC" in headers:
        message.bcc_keys = tuple(dict.fromkeys(header_keys(headers, "BCC")))
        keys += message.bcc_keys
        fields = message.typed_headers()
        del fields["BCC"]
        message.replace_headers(fields)
    return list(dict.fromkeys(keys))  # each key routed once, however often it is named
