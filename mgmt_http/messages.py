"""Messages in and out of the HTTP API: publish bodies to broker messages, queue entries to JSON."""
from __future__ import annotations

import base64
import binascii
import datetime
from typing import Any

from pamqp import commands

from amqp_server.message import Message, make_message
from amqp_server.queues.queue import Entry

from .http import bad_request, get_str, get_table, jsonable, key_missing

# RabbitMQ's JSON property names -> pamqp's Basic.Properties attributes
PROPERTIES = {
    "content_type": "content_type", "content_encoding": "content_encoding", "headers": "headers",
    "delivery_mode": "delivery_mode", "priority": "priority", "correlation_id": "correlation_id",
    "reply_to": "reply_to", "expiration": "expiration", "message_id": "message_id", "timestamp": "timestamp",
    "type": "message_type", "user_id": "user_id", "app_id": "app_id", "cluster_id": "cluster_id",
}
_INT_PROPERTIES = ("delivery_mode", "priority", "timestamp")


def properties_from_json(raw: dict[str, Any]) -> commands.Basic.Properties:
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        attr = PROPERTIES.get(key)
        if attr is None or value is None:  # RabbitMQ ignores a property it does not know
            continue
        if key in _INT_PROPERTIES:
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad_request(["not_int", key])
            if key == "timestamp":
                value = datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
            elif key == "delivery_mode" and value not in (1, 2):
                raise bad_request("delivery_mode must be 1 or 2")
            elif not 0 <= value <= 255:
                raise bad_request(f"property {key} out of range")
        elif key == "headers":
            if not isinstance(value, dict):
                raise bad_request("headers must be a JSON object")
        elif not isinstance(value, str):
            raise bad_request(["not_string", key])
        kwargs[attr] = value
    try:
        return commands.Basic.Properties(**kwargs)
    except (TypeError, ValueError) as exc:
        raise bad_request(f"invalid properties: {exc}") from None


def message_from_json(exchange: str, body: dict[str, Any]) -> Message:
    """RabbitMQ's publish body: routing_key, payload, payload_encoding (string|base64), properties — all required,
    as RabbitMQ requires them."""
    routing_key = get_str(body, "routing_key")
    payload = get_str(body, "payload")
    encoding = get_str(body, "payload_encoding")
    if "properties" not in body:
        raise key_missing("properties")
    if encoding == "string":
        data = payload.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise bad_request(["not_base64", payload]) from None
    else:
        raise bad_request(["unsupported_encoding", encoding])
    if len(routing_key.encode()) > 255:
        raise bad_request("routing_key is longer than 255 bytes")
    return make_message(exchange, routing_key, properties_from_json(get_table(body, "properties")), data)


def properties_to_json(message: Message) -> dict[str, Any]:
    props = message.properties
    result: dict[str, Any] = {}
    for key, attr in PROPERTIES.items():
        value = getattr(props, attr, None)
        if value is not None and not (key == "cluster_id" and value == ""):  # pamqp's default, not a set value
            result[key] = jsonable(value)
    return result


def encode_payload(body: bytes, encoding: str, truncate: int | None) -> tuple[str, str]:
    """(payload, payload_encoding): ``auto`` gives a string when the body is UTF-8, else base64."""
    if truncate is not None:
        body = body[:truncate]
    if encoding == "auto":
        try:
            return body.decode(), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode(), "base64"


def entry_to_json(entry: Entry, encoding: str, truncate: int | None, body: bytes | None = None) -> dict[str, Any]:
    """``body``: the message's (its first ``truncate`` bytes will do) where the message does not hold it."""
    message = entry.message
    payload, payload_encoding = encode_payload((message.body or b"") if body is None else body, encoding, truncate)
    return {"payload_bytes": message.body_size, "redelivered": entry.redelivered, "exchange": message.exchange,
            "routing_key": message.routing_key, "properties": properties_to_json(message),
            "payload": payload, "payload_encoding": payload_encoding}
