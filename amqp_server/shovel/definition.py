"""A dynamic shovel's definition: the ``shovel`` runtime parameter's value, validated as RabbitMQ's
``rabbit_shovel_parameters`` validates it (its keys, its checks, its error texts) and read into a
:class:`Definition` the worker runs.

Only ``amqp091`` is served on either side: ``amqp10`` (RabbitMQ's other protocol) is refused as a value
``src-protocol``/``dest-protocol`` may not take here: the node serves AMQP 1.0 to clients, but the shovel has no
AMQP 1.0 client of its own yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..links.validation import (Check, binary as _binary, boolean as _boolean, enum as _enum,
                                    number as _number, prefetch_count, proplist, terms as _terms,
                                    uri as _uri)
from ..framing import codec, properties
from ..queues.policy import erlang_term

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp091",)
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5  # seconds (rabbit_shovel.hrl's ?DEFAULT_RECONNECT_DELAY)
# dest-publish-properties: RabbitMQ's P_basic field names -> framing.properties.Properties attributes
PUBLISH_PROPERTIES: dict[str, tuple[str, type]] = {
    "content_type": ("content_type", str), "content_encoding": ("content_encoding", str),
    "delivery_mode": ("delivery_mode", int), "priority": ("priority", int), "correlation_id": ("correlation_id", str),
    "reply_to": ("reply_to", str), "expiration": ("expiration", str), "message_id": ("message_id", str),
    "timestamp": ("timestamp", int), "type": ("message_type", str), "user_id": ("user_id", str),
    "app_id": ("app_id", str), "cluster_id": ("cluster_id", str)}

PROPERTY_RANGES = {"delivery_mode": (1, 2), "priority": (0, 255), "timestamp": (0, 2**63 - 1)}


def _delete_after(key: str, value: Any) -> str | None:
    if value in ("never", "queue-length") or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    return f"{key} should be number, \"never\" or \"queue-length\", actually was {erlang_term(value)}"


def _queue_name(key: str, value: Any) -> str | None:
    """rabbit_parameter_validation:amqp091_queue_name: a name a queue can have (a shortstr)."""
    if not isinstance(value, str):
        return _binary(key, value)
    try:
        codec.shortstr(value)
    except ValueError:
        return f"{key} should be less than 255 bytes, actually was {len(value.encode())}"
    return None


def _queue_args(key: str, value: Any) -> str | None:
    return None if isinstance(value, dict) else f"{key} not a list {erlang_term(value)}"


def _properties(key: str, value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"{key} not a list {erlang_term(value)}"
    unknown = [(k, v) for k, v in value.items() if k not in PUBLISH_PROPERTIES]
    if unknown:
        return f"Unrecognised terms {_terms(unknown)} in {key}"
    for name, item in value.items():
        problem = (_number if PUBLISH_PROPERTIES[name][1] is int else _binary)(name, item)
        if problem:
            return problem
        low, high = PROPERTY_RANGES.get(name, (0, 0))
        if high and not (isinstance(item, int) and low <= item <= high):  # (what a content header can carry)
            return f"{name} should be an integer from {low} to {high}, actually was {erlang_term(item)}"
        if isinstance(item, str) and len(item.encode()) > 255:
            return f"{name} should be at most 255 bytes"
    return None


# (key, check, mandatory), amqp091 on both sides, in rabbit_shovel_parameters' order
VALIDATION: tuple[tuple[str, Check, bool], ...] = (
    ("reconnect-delay", _number, False),
    ("ack-mode", _enum(ACK_MODES), False),
    ("src-protocol", _enum(PROTOCOLS), False),
    ("dest-protocol", _enum(PROTOCOLS), False),
    ("src-uri", _uri, True),
    ("src-exchange", _binary, False),
    ("src-exchange-key", _binary, False),
    ("src-queue", _binary, False),
    ("src-queue-args", _queue_args, False),
    ("prefetch-count", prefetch_count, False),
    ("src-prefetch-count", prefetch_count, False),
    ("delete-after", _delete_after, False),
    ("src-delete-after", _delete_after, False),
    ("dest-uri", _uri, True),
    ("dest-exchange", _binary, False),
    ("dest-exchange-key", _binary, False),
    ("dest-queue", _queue_name, False),
    ("dest-queue-args", _queue_args, False),
    ("add-forward-headers", _boolean, False),
    ("add-timestamp-header", _boolean, False),
    ("dest-add-forward-headers", _boolean, False),
    ("dest-add-timestamp-header", _boolean, False),
    ("publish-properties", _properties, False),
    ("dest-publish-properties", _properties, False),
)

def validate(name: str, value: Any) -> list[str]:
    """RabbitMQ's validation errors for a shovel named ``name`` (none: valid)."""
    if not isinstance(value, dict):
        return [f"{name} not a list {erlang_term(value)}"]
    errors: list[str] = []
    if ("src-exchange" in value) == ("src-queue" in value):
        errors.append("Cannot specify 'src-exchange' and 'src-queue'" if "src-queue" in value
                      else "Must specify 'src-exchange' or 'src-queue'")
    delete_after = value.get("src-delete-after", value.get("delete-after"))
    if isinstance(delete_after, int) and not isinstance(delete_after, bool) and value.get("ack-mode") == "no-ack":
        errors.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    if "dest-exchange" in value and "dest-queue" in value:
        errors.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    return errors + proplist(name, VALIDATION, value)


def uris(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value]


@dataclass(frozen=True)
class Definition:
    """What a worker does, read from a valid value (defaults as RabbitMQ's ``parse/3``)."""

    src_uris: list[str]
    dest_uris: list[str]
    src_queue: str | None
    src_exchange: str | None
    src_exchange_key: str
    src_queue_args: dict[str, Any]
    dest_queue: str | None
    dest_exchange: str | None
    dest_exchange_key: str | None
    dest_queue_args: dict[str, Any]
    prefetch: int
    ack_mode: str
    delete_after: str | int
    reconnect_delay: float
    add_forward_headers: bool
    add_timestamp_header: bool
    publish_properties: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: dict[str, Any]) -> "Definition":
        return cls(
            src_uris=uris(value["src-uri"]), dest_uris=uris(value["dest-uri"]),
            src_queue=value.get("src-queue"), src_exchange=value.get("src-exchange"),
            src_exchange_key=value.get("src-exchange-key", ""), src_queue_args=value.get("src-queue-args", {}),
            dest_queue=value.get("dest-queue"), dest_exchange=value.get("dest-exchange"),
            dest_exchange_key=value.get("dest-exchange-key"), dest_queue_args=value.get("dest-queue-args", {}),
            prefetch=int(value.get("src-prefetch-count", value.get("prefetch-count", DEFAULT_PREFETCH))),
            ack_mode=value.get("ack-mode", "on-confirm"),
            delete_after=value.get("src-delete-after", value.get("delete-after", "never")),
            reconnect_delay=value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY),
            add_forward_headers=value.get("dest-add-forward-headers", value.get("add-forward-headers", False)),
            add_timestamp_header=value.get("dest-add-timestamp-header", value.get("add-timestamp-header", False)),
            publish_properties=value.get("dest-publish-properties", value.get("publish-properties", {})))

    def destination(self, exchange: str, routing_key: str) -> tuple[str, str]:
        """Where a message delivered from ``exchange`` with ``routing_key`` is published (RabbitMQ's PubFun)."""
        if self.dest_queue is not None:
            return "", self.dest_queue
        if self.dest_exchange is not None:
            exchange = self.dest_exchange
        if self.dest_exchange_key is not None:
            routing_key = self.dest_exchange_key
        return exchange, routing_key

    @property
    def restart_delay(self) -> int:
        """Seconds before a failed shovel starts again; 0: it stays terminated.  rabbit_shovel_dyn_worker_sup
        restarts the worker only for a whole reconnect-delay above 0 (0.5 and -1 leave it ``temporary``)."""
        delay = self.reconnect_delay
        return delay if isinstance(delay, int) and not isinstance(delay, bool) and delay > 0 else 0

    @property
    def changes_properties(self) -> bool:
        return self.add_forward_headers or self.add_timestamp_header or bool(self.publish_properties)

    def endpoints(self) -> dict[str, str]:
        """The status fields naming the source and destination (rabbit_shovel_behaviour's endpoints)."""
        fields: dict[str, str] = {}
        if self.src_queue is not None:
            fields["src_queue"] = self.src_queue
        else:
            fields.update(src_exchange=self.src_exchange or "", src_exchange_key=self.src_exchange_key)
        for key, item in (("dest_exchange", self.dest_exchange), ("dest_exchange_key", self.dest_exchange_key),
                          ("dest_queue", self.dest_queue)):
            if item is not None:
                fields[key] = item
        return fields

    def set_properties(self, header: bytes) -> bytes:
        """The content header with the publish-properties set (RabbitMQ's set_properties), the rest as it was."""
        for key, item in self.publish_properties.items():
            header = properties.with_value(header, PUBLISH_PROPERTIES[key][0], item)
        return header
