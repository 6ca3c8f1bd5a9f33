"""A stream consumer's filters, read from its source's filter-set as RabbitMQ 4.1+ reads them
(rabbit_amqp_session, rabbit_amqp_filter_prop):

- ``rabbitmq:stream-offset-spec``: where it starts (``x-stream-offset``: first, last, next, an offset, a timestamp);
- ``rabbitmq:stream-filter`` (a string or a list of them) with ``rabbitmq:stream-match-unfiltered``: a message
  whose ``x-stream-filter-value`` annotation is one of the values, or (match-unfiltered) that has none;
- ``amqp:properties-filter`` and ``amqp:application-properties-filter`` (AMQP Filter Expressions, property
  filter expressions): every field named has the value given, a string value ``&p:x`` any string starting with
  ``x``, ``&s:x`` any ending with it, ``&&x`` the string ``&x``.

RabbitMQ reads stream-filter values through a chunk's Bloom filter and may deliver a message whose value is not
asked for; Warren reads each message's value, so delivers exactly those.  A properties filter reads the properties
section an AMQP 1.0 publish had (``amqp10.PROPERTIES_HEADER``), else those an AMQP 0-9-1 message has
(message-id, user-id, reply-to, correlation-id, content-type, content-encoding); it may name any of the 13
fields.  Filters a queue other than a stream is given are ignored, as RabbitMQ ignores them.
"""
from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from stream_log.amqp10 import PROPERTIES_HEADER, Value, kept_properties
from . import frames
from .frames import Amqp10Error

if TYPE_CHECKING:
    from ..message import Message

STREAM_OFFSET_SPEC = "rabbitmq:stream-offset-spec"
STREAM_FILTER = "rabbitmq:stream-filter"
MATCH_UNFILTERED = "rabbitmq:stream-match-unfiltered"
PROPERTIES_FILTER = ("amqp:properties-filter", 0x173)
APPLICATION_PROPERTIES_FILTER = ("amqp:application-properties-filter", 0x174)
FILTER_VALUE = "x-stream-filter-value"  # the message annotation (a header once stored) stream filters read
MAX_FIELDS = 64  # fields one property filter may name
PROPERTY_FIELDS = ("message-id", "user-id", "to", "subject", "reply-to", "correlation-id", "content-type",
                   "content-encoding", "absolute-expiry-time", "creation-time", "group-id", "group-sequence",
                   "reply-to-group-id")
# the properties an AMQP 0-9-1 message has, and how a properties filter reads each
_091_PROPERTIES: dict[str, Callable[[Any], Any]] = {
    "message-id": lambda props: props.message_id,
    "user-id": lambda props: props.user_id.encode() if props.user_id is not None else None,
    "reply-to": lambda props: props.reply_to,
    "correlation-id": lambda props: props.correlation_id,
    "content-type": lambda props: props.content_type,
    "content-encoding": lambda props: props.content_encoding,
}

Accepts = Callable[["Message"], bool]


class Filters(NamedTuple):
    arguments: dict[str, Any]  # the consumer's arguments (x-stream-offset)
    accepts: Accepts | None  # the messages it takes; None: all


def read(source: list[Value] | None) -> Filters:
    """The filters of a source (its eighth field, a map of filter names to described values)."""
    filter_set = source[7] if source is not None and len(source) > 7 else None
    if filter_set is None or filter_set.kind != "map":
        return Filters({}, None)
    arguments: dict[str, Any] = {}
    tests: list[Accepts] = []
    values: list[str] | None = None
    match_unfiltered = False
    for _, described in filter_set.value:
        if described.kind != "described":
            continue
        descriptor, value = described.value
        if descriptor == STREAM_OFFSET_SPEC:
            arguments["x-stream-offset"] = _offset(value)
        elif descriptor == STREAM_FILTER:
            values = _filter_values(value)
        elif descriptor == MATCH_UNFILTERED:
            match_unfiltered = value.value is True
        elif descriptor in PROPERTIES_FILTER:
            tests.append(_properties(value))
        elif descriptor in APPLICATION_PROPERTIES_FILTER:
            tests.append(_application_properties(value))
    if values is not None:
        tests.append(_stream_filter(values, match_unfiltered))
    if not tests:
        return Filters(arguments, None)
    if len(tests) == 1:
        return Filters(arguments, tests[0])
    return Filters(arguments, lambda message: all(test(message) for test in tests))


def _offset(spec: Value) -> Any:
    if spec.kind in ("string", "symbol"):
        return spec.value
    if spec.kind == "timestamp":
        return datetime.datetime.fromtimestamp(spec.value / 1000, datetime.timezone.utc)
    if isinstance(spec.value, int) and not isinstance(spec.value, bool):
        return spec.value
    raise Amqp10Error(frames.INVALID_FIELD, f"bad {STREAM_OFFSET_SPEC} of type {spec.kind}")


def _filter_values(value: Value) -> list[str]:
    items = [value] if value.kind in ("string", "symbol") else value.value if value.kind in ("list", "array") else None
    if items is None or not all(isinstance(item, Value) and item.kind in ("string", "symbol") for item in items):
        raise Amqp10Error(frames.INVALID_FIELD, f"{STREAM_FILTER} must be a string or a list of strings")
    return [item.value for item in items]


def _stream_filter(values: list[str], match_unfiltered: bool) -> Accepts:
    wanted = frozenset(values)

    def accepts(message: Message) -> bool:
        value = message.header_value(FILTER_VALUE)
        return match_unfiltered if value is None else value in wanted
    return accepts


def _fields(value: Value, name: str) -> list[tuple[Value, Value]]:
    if value.kind != "map":
        raise Amqp10Error(frames.INVALID_FIELD, f"{name} must be a map")
    if len(value.value) > MAX_FIELDS:
        raise Amqp10Error(frames.INVALID_FIELD, f"{name} names more than {MAX_FIELDS} fields")
    return value.value


def _properties(value: Value) -> Accepts:
    name = PROPERTIES_FILTER[0]
    checks: list[tuple[int, Callable[[Any], Any] | None, Callable[[Any], bool]]] = []
    for key, expected in _fields(value, name):
        field = key.value if key.kind == "symbol" else None
        if field not in PROPERTY_FIELDS:
            raise Amqp10Error(frames.INVALID_FIELD, f"{name} names {field!r}, not a field of properties")
        checks.append((PROPERTY_FIELDS.index(field), _091_PROPERTIES.get(field), _matcher(expected)))

    def accepts(message: Message) -> bool:
        kept = message.header_value(PROPERTIES_HEADER)
        fields = kept_properties(kept) if isinstance(kept, (bytes, bytearray)) else None
        if fields is not None:
            return all(matches(fields[i].value if i < len(fields) else None) for i, _, matches in checks)
        props = message.properties
        return all(read is not None and matches(read(props)) for _, read, matches in checks)
    return accepts


def _application_properties(value: Value) -> Accepts:
    name = APPLICATION_PROPERTIES_FILTER[0]
    checks: list[tuple[str, Callable[[Any], bool]]] = []
    for key, expected in _fields(value, name):
        if key.kind != "string":
            raise Amqp10Error(frames.INVALID_FIELD, f"{name} keys must be strings")
        checks.append((key.value, _matcher(expected)))

    def accepts(message: Message) -> bool:
        return all(matches(message.header_value(key)) for key, matches in checks)
    return accepts


def _matcher(expected: Value) -> Callable[[Any], bool]:
    """How a field's value is tested: a string by its ``&p:``/``&s:``/``&&`` form, another value by equality
    (numbers across their types, as Erlang's ``==``); a field that is absent matches nothing."""
    if expected.kind in ("string", "symbol"):
        text: str = expected.value
        if text.startswith("&p:"):
            prefix = text[3:]
            return lambda actual: isinstance(actual, str) and actual.startswith(prefix)
        if text.startswith("&s:"):
            suffix = text[3:]
            return lambda actual: isinstance(actual, str) and actual.endswith(suffix)
        if text.startswith("&&"):
            text = text[1:]
        return lambda actual: isinstance(actual, str) and actual == text
    if expected.kind == "null":
        return lambda actual: False
    wanted = expected.value
    return lambda actual: actual is not None and actual == wanted
