"""``k=v`` options of ``warrenctl`` (queue arguments, message properties, headers) to JSON values."""
from __future__ import annotations

import argparse
import json
from typing import Any, Iterable

# AMQP basic properties the management API accepts in "properties", and which of them are integers.
MESSAGE_PROPERTIES = {"content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                      "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
                      "cluster_id"}
INTEGER_PROPERTIES = {"delivery_mode", "priority", "timestamp"}


def guess(text: str) -> Any:
    """``10`` → 10, ``1.5`` → 1.5, ``true`` → True, JSON objects/lists/strings as JSON, else the text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text[:1] in ("{", "[", '"'):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def pair(item: str) -> tuple[str, str]:
    """argparse ``type=`` for ``k=v`` options."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {item!r}")
    return key, value


def json_object(text: str) -> dict[str, Any]:
    """argparse ``type=`` for a JSON object option (a policy definition)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def arguments(pairs: Iterable[tuple[str, str]] | None) -> dict[str, Any]:
    """``--arg x-max-length=10`` → {"x-max-length": 10}."""
    return {key: guess(value) for key, value in pairs or ()}


def properties(pairs: Iterable[tuple[str, str]] | None, headers: Iterable[tuple[str, str]] | None,
               persistent: bool = False) -> dict[str, Any]:
    """Message properties for /publish; ``delivery_mode=persistent`` and ``=2`` both work."""
    result: dict[str, Any] = {}
    for key, value in pairs or ():
        key = key.replace("-", "_")
        if key not in MESSAGE_PROPERTIES:
            raise ValueError(f"unknown message property {key!r} (one of: {', '.join(sorted(MESSAGE_PROPERTIES))})")
        if key == "delivery_mode" and value in ("persistent", "transient"):
            result[key] = 2 if value == "persistent" else 1
        elif key in INTEGER_PROPERTIES:
            try:
                result[key] = int(value)
            except ValueError:
                raise ValueError(f"message property {key} must be an integer, got {value!r}") from None
        else:
            result[key] = value
    if persistent:
        result["delivery_mode"] = 2
    header_table = arguments(headers)
    if header_table:
        result["headers"] = header_table
    return result
